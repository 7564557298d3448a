"""A multi-node engine's leader pod is verified only when its controller chain (leader StatefulSet
-> LeaderWorkerSet -> ModelDeployment) ends at its ModelDeployment, and only as rank 0."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from kvgate.api import labels, multinode
from kvgate.verify.lws_identity import LeaderIdentity, identify_leader, statefulset_name
from kvgate.verify.pod_identity import EngineIdentity, Unproven

MD_UID = "md-uid"
REV = "a1b2c3d4e5"
LWS = f"llama-{REV}-decode"
Chain = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]


def _labels(component: str = "engine") -> dict[str, str]:
    return {
        labels.DEPLOYMENT: "llama",
        labels.REVISION: REV,
        labels.ROLE: "decode",
        labels.COMPONENT: component,
        labels.MANAGED_BY: "kvgate",
    }


def _ref(kind: str, name: str, uid: str, api: str = "apps/v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True}


def chain() -> Chain:
    pod = {
        "metadata": {
            "name": f"{LWS}-0",
            "uid": "pod-uid",
            "labels": {
                **_labels(),
                multinode.LWS_NAME_LABEL: LWS,
                multinode.GROUP_INDEX_LABEL: "0",
                multinode.WORKER_INDEX_LABEL: "0",
            },
            "ownerReferences": [_ref("StatefulSet", LWS, "sts-uid")],
        }
    }
    sts = {
        "metadata": {
            "name": LWS,
            "uid": "sts-uid",
            "ownerReferences": [
                _ref("LeaderWorkerSet", LWS, "lws-uid", "leaderworkerset.x-k8s.io/v1")
            ],
        }
    }
    lws = {
        "metadata": {
            "name": LWS,
            "uid": "lws-uid",
            "labels": _labels(),
            "ownerReferences": [_ref("ModelDeployment", "llama", MD_UID, "kvgate.io/v1alpha1")],
        },
        "spec": {"leaderWorkerTemplate": {"size": 2}},
    }
    return pod, sts, lws


def test_a_leader_of_a_kvgate_group_is_identified_from_its_leader_worker_set() -> None:
    pod, sts, lws = chain()
    assert statefulset_name(pod) == LWS
    assert identify_leader(pod, sts, lws, MD_UID) == LeaderIdentity(
        EngineIdentity("llama", REV, "decode", LWS), LWS, 2
    )


def _set(which: str, *keys: str | int, value: Any) -> Callable[[Chain], None]:
    def apply(objs: Chain) -> None:
        node: Any = objs[("pod", "sts", "lws").index(which)]
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return apply


# (case, mutation, words of the reason)
UNPROVEN: list[tuple[str, Callable[[Chain], None], str]] = [
    (
        "a worker is never verified itself",
        _set("pod", "metadata", "labels", multinode.WORKER_INDEX_LABEL, value="1"),
        "not the leader",
    ),
    (
        "no StatefulSet controls the pod",
        _set("pod", "metadata", "ownerReferences", value=[]),
        "not controlled by a StatefulSet",
    ),
    (
        "the StatefulSet was replaced",
        _set("sts", "metadata", "uid", value="other"),
        "does not exist",
    ),
    (
        "a StatefulSet of no LeaderWorkerSet",
        _set("sts", "metadata", "ownerReferences", value=[]),
        "not controlled by a LeaderWorkerSet",
    ),
    (
        "a look-alike LeaderWorkerSet kind in another API group",
        _set("sts", "metadata", "ownerReferences", 0, "apiVersion", value="evil.io/v1"),
        "not controlled by a LeaderWorkerSet",
    ),
    (
        "the LeaderWorkerSet was replaced",
        _set("lws", "metadata", "uid", value="other"),
        "does not exist",
    ),
    (
        "a tenant's LeaderWorkerSet",
        _set("lws", "metadata", "ownerReferences", value=[]),
        "not controlled by the ModelDeployment",
    ),
    (
        "a LeaderWorkerSet of a router",
        _set("lws", "metadata", "labels", labels.ROLE, value="router"),
        "not a kvgate engine group",
    ),
    (
        "a relabelled pod",
        _set("pod", "metadata", "labels", labels.REVISION, value="ffffffffff"),
        "was the pod relabelled",
    ),
    (
        "a worker labelled as the engine component",
        _set("pod", "metadata", "labels", labels.COMPONENT, value="engine-worker"),
        "differs",
    ),
    (
        "a group without a size",
        _set("lws", "spec", "leaderWorkerTemplate", "size", value=0),
        "no group size",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "words"), [u[1:] for u in UNPROVEN], ids=[u[0] for u in UNPROVEN]
)
def test_a_pod_whose_chain_does_not_end_at_the_model_deployment_is_unproven(
    mutate: Callable[[Chain], None], words: str
) -> None:
    objs = copy.deepcopy(chain())
    mutate(objs)
    result = identify_leader(*objs, MD_UID)
    assert isinstance(result, Unproven), result
    assert words in result.message, result.message


def test_missing_objects_and_another_model_deployment_are_unproven() -> None:
    pod, sts, lws = chain()
    assert isinstance(identify_leader(pod, None, lws, MD_UID), Unproven)
    assert isinstance(identify_leader(pod, sts, None, MD_UID), Unproven)
    assert isinstance(identify_leader(pod, sts, lws, "another-md"), Unproven)
