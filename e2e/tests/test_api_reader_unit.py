"""How ``World.get``/``World.list`` name resources without kubectl (``kvgate_e2e.api_reader``):
the names kubectl accepts, resolved from discovery with kubectl's priority, and list items as
kubectl prints them. Pure; no cluster."""

from __future__ import annotations

from typing import Any

import pytest
from kvgate_e2e.api_reader import Resource, as_listed, resource_names


def res(name: str, kind: str, namespaced: bool = True, **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": kind, "namespaced": namespaced, **extra}


# Discovery as the apiserver answers it, in kubectl's priority order: the core group first.
DISCOVERY = [
    (
        "",
        "v1",
        [
            res("pods", "Pod", singularName="pod", shortNames=["po"]),
            res("pods/status", "Pod"),
            res("events", "Event", singularName="event", shortNames=["ev"]),
            res("namespaces", "Namespace", False, singularName="namespace", shortNames=["ns"]),
            res("services", "Service", singularName="", shortNames=["svc"]),
        ],
    ),
    ("apps", "v1", [res("deployments", "Deployment", singularName="deployment")]),
    ("events.k8s.io", "v1", [res("events", "Event", singularName="event", shortNames=["ev"])]),
    (
        "apiextensions.k8s.io",
        "v1",
        [res("customresourcedefinitions", "CustomResourceDefinition", False, shortNames=["crd"])],
    ),
    (
        "kvgate.io",
        "v1alpha1",
        [
            res(
                "modeldeployments",
                "ModelDeployment",
                singularName="modeldeployment",
                shortNames=["kvmd"],
            )
        ],
    ),
]


@pytest.mark.parametrize(
    ("name", "prefix", "plural"),
    [
        ("pods", "/api/v1", "pods"),
        ("pod", "/api/v1", "pods"),
        ("po", "/api/v1", "pods"),
        ("events", "/api/v1", "events"),  # the core group wins an unqualified name
        ("events.events.k8s.io", "/apis/events.k8s.io/v1", "events"),
        ("service", "/api/v1", "services"),  # no singularName: the kind, lower-cased
        ("deployment", "/apis/apps/v1", "deployments"),
        ("deployments.apps", "/apis/apps/v1", "deployments"),
        ("crd", "/apis/apiextensions.k8s.io/v1", "customresourcedefinitions"),
        ("kvmd", "/apis/kvgate.io/v1alpha1", "modeldeployments"),
        ("modeldeployments.kvgate.io", "/apis/kvgate.io/v1alpha1", "modeldeployments"),
    ],
)
def test_every_name_kubectl_accepts_resolves_to_its_resource(
    name: str, prefix: str, plural: str
) -> None:
    found = resource_names(DISCOVERY)[name]
    assert (found.prefix, found.plural) == (prefix, plural)


def test_subresources_are_not_names() -> None:
    assert "pods/status" not in resource_names(DISCOVERY)


@pytest.mark.parametrize(
    ("namespaced", "namespace", "name", "path"),
    [
        (True, "t-a", "web", "/apis/apps/v1/namespaces/t-a/deployments/web"),
        (True, None, "web", "/apis/apps/v1/namespaces/default/deployments/web"),
        (True, "t-a", None, "/apis/apps/v1/namespaces/t-a/deployments"),
        (False, "t-a", "web", "/apis/apps/v1/deployments/web"),
    ],
)
def test_paths_name_the_namespace_only_for_namespaced_kinds(
    namespaced: bool, namespace: str | None, name: str | None, path: str
) -> None:
    deployments = Resource("/apis/apps/v1", "deployments", namespaced, "apps/v1", "Deployment")
    assert deployments.path(namespace, name) == path


def test_list_items_carry_api_version_and_kind_and_no_managed_fields_as_kubectl_prints_them() -> (
    None
):
    md = resource_names(DISCOVERY)["kvmd"]
    listed = [{"metadata": {"name": "m", "managedFields": [{"manager": "kubectl"}]}, "spec": {}}]
    assert as_listed(listed, md) == [
        {
            "apiVersion": "kvgate.io/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": "m"},
            "spec": {},
        }
    ]
    assert listed[0]["metadata"]["managedFields"]  # the answer itself is not changed
