"""kvgate-managed Deployments and the other objects a ModelDeployment owns: any change (e.g. a
router turning Ready) wakes their MD. Deployments are the operator's own list-then-watch
(kvgate.kube.informer), kept slim in ``Runtime.deployments``, which a pass reads instead of listing
them once every reflector has listed (in the scale benchmark a label-selected list of
Deployments made the API server filter every Deployment of the namespace, ~800 times a
minute while 1,000 ModelDeployments started)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvgate.api import labels
from kvgate.controller.runtime import Runtime
from kvgate.kube.informer import Watched
from kvgate.rollout import pass_priority, scaling
from kvgate.verify import pod_view

MANAGED_SELECTOR = f"{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"


def wake_owner(rt: Runtime, body: dict[str, Any]) -> None:
    """Wake the pass of the ModelDeployment the object's kvgate.io/deployment label names."""
    meta = body.get("metadata", {})
    rt.wake_md(meta.get("namespace"), meta.get("labels", {}).get(labels.DEPLOYMENT))


@dataclass
class RoleScaleNames:
    """Every RoleScale the operator's watch of them has listed or seen created and not yet seen
    deleted, by (namespace, name): a pass reads the RoleScale of a role that is not autoscaled
    only when one is there, to delete it. Derived from the watch alone, so a restarted operator
    (whose watch lists them all) finds the RoleScale of a role that lost its autoscaling while
    it was down."""

    names: set[tuple[str, str]] = field(default_factory=set)

    def exists(self, namespace: str, name: str) -> bool:
        return (namespace, name) in self.names


def on_role_scale_event(rt: Runtime, body: dict[str, Any], event_type: str | None = None) -> None:
    """A RoleScale listed (``event_type`` None), added, changed or deleted: keep RoleScaleNames,
    then wake the ModelDeployment its name belongs to (``<md>-<role>``), when kvgate knows one
    by that name: the pass reads it by that name, never by its labels. A count kvgate has not
    acted on (``kubectl scale``, an autoscaler) asks for a pass that goes first
    (kvgate.rollout.pass_priority), kvgate's own status writes only wake it."""
    meta = body.get("metadata", {})
    namespace, name = meta.get("namespace"), str(meta.get("name") or "")
    if namespace and name:
        names = rt.owned(RoleScaleNames).names
        if event_type == "DELETED":
            names.discard((namespace, name))
        else:
            names.add((namespace, name))
    md_name = scaling.scale_owner(name)
    if not (namespace and md_name and (namespace, md_name) in rt.mds):
        return
    if pass_priority.scale_requested(body):
        rt.request_pass(namespace, md_name)
    else:
        rt.wake_md(namespace, md_name)


def on_deployment_event(rt: Runtime, event_type: str | None, body: dict[str, Any]) -> None:
    """A listed or watched kvgate Deployment: keep its projection, wake its MD."""
    uid = str(body.get("metadata", {}).get("uid") or "")
    if not uid:
        return
    if event_type == "DELETED":
        rt.deployments.pop(uid, None)
    else:
        rt.deployments[uid] = pod_view.slim_workload(body)
    if rt.leading:  # a standby keeps the store only: no loop runs to wake
        wake_owner(rt, body)


DEPLOYMENTS = Watched("Deployment", "apps/v1", "/apis/apps/v1/deployments", MANAGED_SELECTOR)


def start_reflectors(rt: Runtime) -> None:
    """Start the list-then-watch of kvgate's Deployments (label managed-by=kvgate, filtered on
    the server), one per watched namespace or one cluster-wide."""
    rt.reflect(
        DEPLOYMENTS,
        store=rt.deployments,
        on_event=lambda event_type, body: on_deployment_event(rt, event_type, body),
        into=rt.deployment_reflectors,
    )


def on_router_access_event(rt: Runtime, event_type: str | None, body: dict[str, Any]) -> None:
    """The router's ServiceAccount, Role or RoleBinding, or a NetworkPolicy, was edited or
    deleted: its next pass reads them again (kvgate.rollout.access_checks). ADDED is the echo of the
    pass that created it (whoever creates one under kvgate's name first, the pass that reads
    it finds out; one created after a deletion follows that deletion's event)."""
    meta = body.get("metadata", {})
    namespace, name = meta.get("namespace"), meta.get("labels", {}).get(labels.DEPLOYMENT)
    if namespace and name and event_type != "ADDED":
        rt.access_changed.add((namespace, name))
    wake_owner(rt, body)
