"""The writes one rollout step needs (pure): the step, what kvgate builds and what exists in, a
list of planned API writes out. The ModelDeployment handler performs them and decides nothing.

Per revision Deployment: create it when missing (the target's with its verification start and
refusal notes); otherwise scale it, add a new refusal's notes, and replace a template that
differs from what this operator builds. The template is replaced whole (a JSON patch), in the
same write as its hash annotation, so a key a newer builder dropped is removed (a merge patch
only adds and changes keys) and the hash never claims a template the object does not have.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.api import labels, multinode
from kvgate.api.content_types import JSON_PATCH, MERGE_PATCH
from kvgate.api.models import ModelDeployment, Role
from kvgate.api.timestamps import rfc3339
from kvgate.objects import builders, lws_builders
from kvgate.rollout.planner import RolloutStep

Body = dict[str, Any]


@dataclass(frozen=True)
class Create:
    """Create this object. ``owned``: an existing one of that name must be the ModelDeployment's
    own (else it is reported as a conflict); the Service ``<md>`` is judged from its read."""

    body: Body
    owned: bool = True


@dataclass(frozen=True)
class Patch:
    kind: str
    name: str
    patch: Body | list[Body]
    content_type: str
    note: str | None = None  # why, when it restores what someone changed (logged)
    subresource: str | None = None  # e.g. "status"


@dataclass(frozen=True)
class Delete:
    kind: str
    name: str


PlannedWrite = Create | Patch | Delete


@dataclass(frozen=True)
class BuildInputs:
    """What kvgate builds a revision's Deployments from, besides the ModelDeployment."""

    router_key_fingerprint: str | None = None
    guard: builders.Guard | None = None
    # Whether the cluster serves LeaderWorkerSets to kvgate: without, a multi-node role's
    # engines are not built at all (kvgate.rollout.lws_availability reports why).
    leader_worker_sets: bool = True
    # The router key Secret is someone else's: every router at 0 replicas, since a router started
    # on it would take their key on its worker API (kvgate.verify.worker_audit.key_refusal).
    routers_blocked: bool = False


def refusal_notes(step: RolloutStep) -> dict[str, str]:
    """The annotations that record the target's refusal on its Deployments (none: no refusal)."""
    if step.refusal is None:
        return {}
    return {
        labels.REFUSED_REASON: step.refusal.reason,
        labels.REFUSED_MESSAGE: step.refusal.message,
    }


def _annotation_path(key: str) -> str:
    """A JSON pointer to one annotation (RFC 6901 escapes ``~`` and ``/``)."""
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def template_replacement(current: Body, desired: Body) -> list[Body] | None:
    """The JSON patch that makes ``current``'s pod template exactly ``desired``'s and records
    its hash in the same write; None when the recorded hash already matches."""
    desired_hash = desired["metadata"]["annotations"][labels.TEMPLATE_HASH]
    annotations = current.get("metadata", {}).get("annotations")
    if (annotations or {}).get(labels.TEMPLATE_HASH) == desired_hash:
        return None
    hash_op: Body = (
        {"op": "add", "path": _annotation_path(labels.TEMPLATE_HASH), "value": desired_hash}
        if isinstance(annotations, dict)
        else {
            "op": "add",
            "path": "/metadata/annotations",
            "value": {labels.TEMPLATE_HASH: desired_hash},
        }
    )
    # A LeaderWorkerSet's templates (leader, worker) and group shape live in one field.
    key = "leaderWorkerTemplate" if desired.get("kind") == multinode.LWS_KIND else "template"
    return [
        {"op": "replace", "path": f"/spec/{key}", "value": desired["spec"][key]},
        hash_op,
    ]


def deployment_writes(
    current: Body | None,
    desired: Body,
    *,
    create_annotations: Mapping[str, str],
    notes: Mapping[str, str],
    new_refusal: bool,
    retemplate: bool = True,
) -> list[PlannedWrite]:
    """One revision Deployment: ``desired`` is what this operator builds (no step annotations);
    ``create_annotations`` go on it only when it is created. ``retemplate`` False: only its
    replicas are kept (another revision's router, whose spec is not the current one)."""
    if current is None:
        body = {**desired, "metadata": dict(desired["metadata"])}
        body["metadata"]["annotations"] = {
            **desired["metadata"].get("annotations", {}),
            **create_annotations,
        }
        return [Create(body)]
    name = desired["metadata"]["name"]
    writes: list[PlannedWrite] = []
    merge: Body = {}
    replicas = desired["spec"]["replicas"]
    if int(current.get("spec", {}).get("replicas", 0) or 0) != replicas:
        merge["spec"] = {"replicas": replicas}
    annotations = current.get("metadata", {}).get("annotations") or {}
    missing = {k: v for k, v in notes.items() if annotations.get(k) != v}
    if missing and new_refusal:
        merge["metadata"] = {"annotations": missing}
    kind = str(desired.get("kind", "Deployment"))
    if merge:
        writes.append(Patch(kind, name, merge, MERGE_PATCH))
    replacement = template_replacement(current, desired) if retemplate else None
    if replacement is not None:
        writes.append(Patch(kind, name, replacement, JSON_PATCH))
    return writes


def service_writes(
    current: Body | None, desired: Body | None, *, foreign: bool
) -> list[PlannedWrite]:
    """The Service ``<md>``: created, or its selector re-pointed; never someone else's."""
    if foreign or desired is None:
        return []
    if current is None:
        return [Create(desired, owned=False)]
    selector = desired["spec"]["selector"]
    have = current.get("spec", {}).get("selector") or {}
    if have == selector:
        return []
    # A merge patch merges maps: a key the new selector drops (the revision, when a progressive
    # split selects every router) must be nulled, or it stays.
    patch = {**{key: None for key in have if key not in selector}, **selector}
    return [
        Patch("Service", desired["metadata"]["name"], {"spec": {"selector": patch}}, MERGE_PATCH)
    ]


def revision_writes(
    md: ModelDeployment,
    step: RolloutStep,
    existing: Mapping[str, Body],
    build: BuildInputs,
) -> list[PlannedWrite]:
    """Every Deployment write of the step: its workloads created, scaled or brought back to the
    built template, then the revisions it retires deleted."""
    name = md.metadata.name or ""
    notes = refusal_notes(step)
    writes: list[PlannedWrite] = []
    for intent in step.workloads:
        if intent.component == labels.ROLE_ROUTER:
            desired = builders.deployment(
                md,
                intent.revision,
                intent.component,
                replicas=0 if build.routers_blocked else intent.replicas,
                router_key_fingerprint=build.router_key_fingerprint,
                guard=build.guard,
            )
        else:
            # A LeaderWorkerSet when the role's engines span several nodes.
            desired = lws_builders.engine_workload(
                md,
                intent.revision,
                Role(intent.component),
                replicas=intent.replicas,
                guard=build.guard,
            )
            if desired["kind"] == multinode.LWS_KIND and not build.leader_worker_sets:
                continue
        target = intent.revision == step.target_revision
        create_annotations = (
            {labels.VERIFY_STARTED_AT: rfc3339(step.verify_started_at), **notes}
            if target
            else {}  # a serving revision's rebuilt router: the target's notes aren't its
        )
        writes += deployment_writes(
            existing.get(desired["metadata"]["name"]),
            desired,
            create_annotations=create_annotations,
            notes=notes if target else {},
            new_refusal=step.new_refusal,
            # The serving revision's routers (scaled for a progressive split): built from the
            # current spec, which is not theirs, so they keep their own template.
            retemplate=target,
        )
    for revision in step.delete_revisions:
        for component in builders.COMPONENTS:
            dname = builders.component_name(name, revision, component)
            if dname in existing:
                writes.append(Delete(str(existing[dname].get("kind", "Deployment")), dname))
    return writes
