"""An engine pod is verified only when its controller chain ends at its ModelDeployment."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kvgate.api import labels
from kvgate.verify.pod_identity import EngineIdentity, Unproven, identify

MD_UID = "md-uid"
REV = "a1b2c3d4e5"
DEP = f"llama-{REV}-decode"


def _labels() -> dict[str, str]:
    return {
        labels.DEPLOYMENT: "llama",
        labels.REVISION: REV,
        labels.ROLE: "decode",
        labels.COMPONENT: "engine",
        labels.MANAGED_BY: "kvgate",
    }


def _ref(kind: str, name: str, uid: str, api: str = "apps/v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True}


def chain() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    pod = {
        "metadata": {
            "name": f"{DEP}-7f-x",
            "uid": "pod-uid",
            "labels": _labels(),
            "ownerReferences": [_ref("ReplicaSet", f"{DEP}-7f", "rs-uid")],
        }
    }
    rs = {
        "metadata": {
            "name": f"{DEP}-7f",
            "uid": "rs-uid",
            "ownerReferences": [_ref("Deployment", DEP, "dep-uid")],
        }
    }
    dep = {
        "metadata": {
            "name": DEP,
            "uid": "dep-uid",
            "labels": _labels(),
            "ownerReferences": [_ref("ModelDeployment", "llama", MD_UID, "kvgate.io/v1alpha1")],
        }
    }
    return pod, rs, dep


def test_a_pod_of_a_kvgate_revision_deployment_is_identified_from_the_deployment() -> None:
    assert identify(*chain(), MD_UID) == EngineIdentity("llama", REV, "decode", DEP)


def _broken(case: str) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]:
    pod, rs, dep = copy.deepcopy(chain())
    if case == "bare pod":
        pod["metadata"]["ownerReferences"] = []
    elif case == "pod owned by a Job":
        pod["metadata"]["ownerReferences"] = [_ref("Job", "j", "rs-uid", "batch/v1")]
    elif case == "non-controller owner":
        pod["metadata"]["ownerReferences"][0]["controller"] = False
    elif case == "replica set missing":
        return pod, None, dep
    elif case == "replica set replaced (uid differs)":
        rs["metadata"]["uid"] = "other"
    elif case == "tenant replica set without a Deployment":
        rs["metadata"]["ownerReferences"] = []
    elif case == "deployment replaced (uid differs)":
        dep["metadata"]["uid"] = "other"
    elif case == "tenant deployment (no owner)":
        dep["metadata"]["ownerReferences"] = []
    elif case == "deployment of another ModelDeployment":
        dep["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    elif case == "owner of another kind with the same uid":
        dep["metadata"]["ownerReferences"][0]["kind"] = "ConfigMap"
    elif case == "router deployment":
        dep["metadata"]["labels"][labels.ROLE] = "router"
    elif case == "deployment name does not match its labels":
        dep["metadata"]["labels"][labels.REVISION] = "ffffffffff"
    elif case == "pod relabelled to another revision":
        pod["metadata"]["labels"][labels.REVISION] = "ffffffffff"
    elif case == "pod relabelled to the other role":
        pod["metadata"]["labels"][labels.ROLE] = "prefill"
    return pod, rs, dep


@pytest.mark.parametrize(
    "case",
    [
        "bare pod",
        "pod owned by a Job",
        "non-controller owner",
        "replica set missing",
        "replica set replaced (uid differs)",
        "tenant replica set without a Deployment",
        "deployment replaced (uid differs)",
        "tenant deployment (no owner)",
        "deployment of another ModelDeployment",
        "owner of another kind with the same uid",
        "router deployment",
        "deployment name does not match its labels",
        "pod relabelled to another revision",
        "pod relabelled to the other role",
    ],
)
def test_a_pod_whose_chain_does_not_end_at_the_model_deployment_is_not_identified(
    case: str,
) -> None:
    result = identify(*_broken(case), MD_UID)
    assert isinstance(result, Unproven), case
    assert "pod " in result.message


def test_no_model_deployment_uid_identifies_nothing() -> None:
    assert isinstance(identify(*chain(), None), Unproven)


def _router_chain() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    pod, rs, dep = copy.deepcopy(chain())
    router = f"llama-{REV}-router"
    for obj in (pod, dep):
        obj["metadata"]["labels"][labels.ROLE] = "router"
        obj["metadata"]["labels"][labels.COMPONENT] = "router"
    dep["metadata"]["name"] = router
    rs["metadata"]["ownerReferences"][0]["name"] = router
    return pod, rs, dep


def test_a_router_pod_is_identified_only_when_routers_are_asked_for() -> None:
    from kvgate.verify.pod_identity import ROUTER_ROLES

    router = f"llama-{REV}-router"
    assert identify(*_router_chain(), MD_UID, ROUTER_ROLES) == EngineIdentity(
        "llama", REV, "router", router
    )
    # A router is never taken for an engine pod, nor an engine pod for a router.
    assert isinstance(identify(*_router_chain(), MD_UID), Unproven)
    assert isinstance(identify(*chain(), MD_UID, ROUTER_ROLES), Unproven)
