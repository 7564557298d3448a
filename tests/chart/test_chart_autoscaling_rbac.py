"""What the chart grants around RoleScales (one per autoscaled role of a ModelDeployment), as
`helm template` renders it: namespace editors may scale them (kubectl scale, the HPAs and KEDA
ScaledObjects they create) and delete them, viewers may read them, and nobody but kvgate creates
them. The HPA controller (kube-controller-manager's system:controller:horizontal-pod-autoscaler)
and KEDA's operator (its v2.18 chart's default rbac.scaledRefKinds) already hold */scale on every
API group, so the chart grants them nothing."""

from __future__ import annotations

from typing import Any

import pytest
from helm_runner import Helm, Rendered

PREFIX = "kvgate-kvgate-system"  # kvgate.clusterName
EDIT = f"{PREFIX}-autoscaling-edit"
VIEW = f"{PREFIX}-autoscaling-view"


@pytest.fixture(scope="module")
def default(helm: Helm) -> Rendered:
    return helm.template()


def allows(role: dict[str, Any], resource: str, verb: str) -> bool:
    return any(
        "kvgate.io" in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
        for rule in role["rules"]
    )


def test_editors_may_scale_and_delete_role_scales_but_not_create_them(default: Rendered) -> None:
    """Delete is the way out of a Conflict over a RoleScale kvgate does not own (kvgate never
    adopts it); what an editor may change on the object is the admission policy's to say."""
    edit = default.one("ClusterRole", EDIT)
    labels = edit["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    for resource in ("rolescales", "rolescales/scale"):
        for verb in ("get", "list", "watch", "update", "patch"):
            assert allows(edit, resource, verb), (resource, verb)
    assert allows(edit, "rolescales", "delete")
    for verb in ("create", "deletecollection"):
        assert not allows(edit, "rolescales", verb), verb  # kvgate creates them
    assert not allows(edit, "rolescales/scale", "delete")
    assert not allows(edit, "rolescales/status", "update")  # status is kvgate's count


def test_viewers_may_read_role_scales_and_their_scale(default: Rendered) -> None:
    view = default.one("ClusterRole", VIEW)
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    for resource in ("rolescales", "rolescales/scale", "rolescales/status"):
        for verb in ("get", "list", "watch"):
            assert allows(view, resource, verb), (resource, verb)
    assert {verb for rule in view["rules"] for verb in rule["verbs"]} == {"get", "list", "watch"}


def test_autoscaling_rbac_off_renders_no_role_scale_roles(helm: Helm) -> None:
    rendered = helm.template("autoscaling.rbac.enabled=false")
    names = {role["metadata"]["name"] for role in rendered.all("ClusterRole")}
    assert not {EDIT, VIEW} & names
    assert f"{PREFIX}-edit" in names  # the ModelDeployment roles do not depend on it


def test_a_non_boolean_switch_fails_and_names_the_field(helm: Helm) -> None:
    result = helm.template_result("autoscaling.rbac.enabled=yes")
    assert result.returncode != 0
    assert "'/autoscaling/rbac/enabled'" in result.stderr
