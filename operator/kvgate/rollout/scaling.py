"""Autoscaling per role (pure): the count each role runs, its RoleScale object, and scale-down
that drains an engine before it removes it.

A role with ``spec.<role>.autoscaling`` has a RoleScale ``<md>-<role>`` (the scale subresource an
HPA, a KEDA ScaledObject or ``kubectl scale`` drives). Its ``spec.replicas`` is the count asked
for; kvgate writes it only when it creates the object (from the serving revision's current count,
so turning autoscaling on changes nothing), and copies the bounds from the ModelDeployment. The
count a role runs is that one within ``minReplicas..maxReplicas`` and, with both roles
autoscaled, within ``spec.prefillPerDecode``. It replaces ``spec.<role>.replicas`` for every
revision that runs engines: a new revision starts at the current counts, and during a rollout
the serving revision follows the autoscaler too (kvgate.rollout.planner).

Scale-down of a revision that takes traffic never just lowers a Deployment's replicas, which would
let its ReplicaSet kill any pod, requests in flight and all. kvgate picks the pods to remove (not
verified first: they serve nothing; then the newest), never draining a verified engine when
fewer than ``minReplicas`` verified would stay, and for each:

1. annotates it ``kvgate.io/draining-since``: its verifier turns its gate False (``ScalingDown``),
   the pod turns NotReady, smg drops the worker and sends it nothing new;
2. reads its engine's ``/metrics`` every pass until running, queued and every PD queue (KV
   transfers in flight, pre-allocations, bootstraps) are 0, at least DRAIN_SETTLE_SECONDS after
   the drain began (smg's watch of the pod may lag it), or ``drainTimeoutSeconds`` has passed;
3. annotates it ``kvgate.io/drained`` and ``controller.kubernetes.io/pod-deletion-cost``
   (the lowest), and only on a later pass, once the pod watch shows that, lowers the Deployment's
   replicas by the number of such pods: its ReplicaSet removes the pods that are NotReady and
   cost the least, which are exactly those.

A count raised again before a pod is removed takes it back: its annotations go, and it is
verified again before it takes traffic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from kvgate.api import labels
from kvgate.api.autoscaling import prefill_range, ratio_conflict
from kvgate.api.content_types import MERGE_PATCH
from kvgate.api.models import (
    API_VERSION,
    SCALE_KIND,
    ModelDeployment,
    ModelDeploymentSpec,
    Role,
    RoleAutoscaling,
)
from kvgate.api.ownership import OwnershipConflict, conflict_for
from kvgate.api.timestamps import rfc3339
from kvgate.objects.builders import owner_reference
from kvgate.rollout.planner import (
    ObservedState,
    PodState,
    RolloutStep,
    WorkloadIntent,
    drain_candidates,
    drain_floor,
    engine_pods_of,
    pick_removals,
    role_replicas,
    serving_revision,
)
from kvgate.rollout.workload_writes import Create, Delete, Patch, PlannedWrite
from kvgate.verify import gate

ENGINE_ROLES = (Role.PREFILL, Role.DECODE)
DRAIN_SETTLE_SECONDS = 2.0
DRAIN_RECHECK_SECONDS = (
    1.0  # a pass this often while an engine drains (a request's end is no event)
)
LOWEST_DELETION_COST = str(-(2**31))
DRAIN_STARTED = gate.SCALING_DOWN  # Event reason (the gate's reason too)
DRAINED = "EngineDrained"
DRAIN_TIMED_OUT = "DrainTimedOut"
SCALE_DOWN_CANCELLED = "ScaleDownCancelled"


def autoscaling_of(spec: ModelDeploymentSpec, role: Role) -> RoleAutoscaling | None:
    return (spec.prefill if role is Role.PREFILL else spec.decode).autoscaling


def scale_name(md_name: str, role: Role | str) -> str:
    return f"{md_name}-{Role(role).value}"


def scale_owner(name: str) -> str | None:
    """The ModelDeployment whose RoleScale is called ``name`` (scale_name's inverse); None for a
    name kvgate gives no RoleScale. A pass reads its RoleScales by name, so the name, which never
    changes, says whose a RoleScale is, whatever its labels."""
    md_name, _, role = name.rpartition("-")
    return md_name if md_name and role in {r.value for r in ENGINE_ROLES} else None


# -- the count each role runs ----------------------------------------------------------------


@dataclass(frozen=True)
class RoleCount:
    role: Role
    requested: int  # the RoleScale's spec.replicas (or the count it is created with)
    effective: int  # what kvgate runs
    why: str = ""  # which bound moved it, if one did


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def role_counts(spec: ModelDeploymentSpec, requested: Mapping[Role, int]) -> dict[Role, RoleCount]:
    """The count of every autoscaled role: the one asked for (``requested``, every autoscaled
    role's: requested_counts), within its bounds, then within the ratio."""
    counts: dict[Role, RoleCount] = {}
    for role in ENGINE_ROLES:
        bounds = autoscaling_of(spec, role)
        if bounds is None:
            continue
        asked = requested[role]
        effective = _clamp(asked, bounds.min_replicas, bounds.max_replicas)
        why = ""
        if effective != asked:
            which = "minReplicas" if effective > asked else "maxReplicas"
            why = f"spec.{role.value}.autoscaling.{which} {effective} bounds the count {asked}"
        counts[role] = RoleCount(role, asked, effective, why)
    if spec.prefill_per_decode is not None and len(counts) == 2 and not ratio_conflict(spec):
        counts = _within_ratio(spec, counts)
    return counts


def _within_ratio(
    spec: ModelDeploymentSpec, counts: dict[Role, RoleCount]
) -> dict[Role, RoleCount]:
    prefill_bounds, decode_bounds = spec.prefill.autoscaling, spec.decode.autoscaling
    assert prefill_bounds is not None and decode_bounds is not None
    prefill, decode = counts[Role.PREFILL], counts[Role.DECODE]
    d = decode.effective
    low, high = prefill_range(d, spec, prefill_bounds)
    if low > high:
        # The nearest decode count beside which some prefill count fits (one exists).
        fits = [
            n
            for n in range(decode_bounds.min_replicas, decode_bounds.max_replicas + 1)
            if (r := prefill_range(n, spec, prefill_bounds))[0] <= r[1]
        ]
        d = min(fits, key=lambda n: (abs(n - decode.effective), n))
    low, high = prefill_range(d, spec, prefill_bounds)
    p = _clamp(prefill.effective, low, high)
    ratio = spec.prefill_per_decode
    assert ratio is not None
    said = f"spec.prefillPerDecode (min {ratio.min:g}, max {ratio.max:g})"
    out = dict(counts)
    if d != decode.effective:
        out[Role.DECODE] = replace(decode, effective=d, why=f"{said} moves decode to {d}")
    if p != prefill.effective:
        out[Role.PREFILL] = replace(
            prefill, effective=p, why=f"{said} moves prefill to {p} beside {d} decode"
        )
    return out


# -- the RoleScale objects ------------------------------------------------------------------


def scale_object(md: ModelDeployment, role: Role, replicas: int) -> dict[str, Any]:
    """A new RoleScale for one role (``replicas``: what it starts at)."""
    bounds = autoscaling_of(md.spec, role)
    assert bounds is not None and md.metadata.name is not None
    return {
        "apiVersion": API_VERSION,
        "kind": SCALE_KIND,
        "metadata": {
            "name": scale_name(md.metadata.name, role),
            "namespace": md.metadata.namespace,
            "labels": {
                labels.DEPLOYMENT: md.metadata.name,
                labels.ROLE: role.value,
                labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
            },
            "ownerReferences": [owner_reference(md)],
        },
        "spec": {**_bounds(md.metadata.name, role, bounds), "replicas": replicas},
    }


def _bounds(md_name: str, role: Role, bounds: RoleAutoscaling) -> dict[str, Any]:
    return {
        "modelDeployment": md_name,
        "role": role.value,
        "minReplicas": bounds.min_replicas,
        "maxReplicas": bounds.max_replicas,
    }


def initial_replicas(observed: ObservedState, serving: str | None, role: Role) -> int:
    """A new RoleScale starts where the role is: the serving revision's Deployment's count, or
    spec.<role>.replicas, within the bounds."""
    bounds = autoscaling_of(observed.spec, role)
    assert bounds is not None
    current = [
        w.replicas
        for w in observed.workloads
        if w.revision == serving and w.component == role.value
    ]
    base = current[0] if current else role_replicas(observed.spec, role)
    return _clamp(base, bounds.min_replicas, bounds.max_replicas)


def bounds_patch(
    md_name: str, role: Role, bounds: RoleAutoscaling, spec: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The spec patch that puts the ModelDeployment's bounds back on its RoleScale (None: they
    are there). A count the new bounds exclude is moved to the nearest bound in the same write
    (the CEL rules would refuse the bounds alone): the only time kvgate changes it."""
    wanted = _bounds(md_name, role, bounds)
    patch = {k: v for k, v in wanted.items() if spec.get(k) != v}
    replicas = spec.get("replicas")
    if isinstance(replicas, int):
        clamped = _clamp(replicas, bounds.min_replicas, bounds.max_replicas)
        if clamped != replicas:
            patch["replicas"] = clamped
    return patch or None


def traffic_revisions(step: RolloutStep) -> tuple[str, ...]:
    """The revisions taking traffic after this step (the serving one, and a split's other)."""
    found = [r for r, share in step.traffic if share > 0]
    if step.serving_revision and step.serving_revision not in found:
        found.insert(0, step.serving_revision)
    return tuple(found)


def selector(md_name: str, role: Role, revisions: Iterable[str]) -> str:
    revs = sorted(set(revisions))
    text = f"{labels.DEPLOYMENT}={md_name},{labels.ROLE}={role.value}"
    if revs:
        text += f",{labels.REVISION} in ({','.join(revs)})"
    return text


def serving_engines(
    pods: Iterable[PodState], revisions: Iterable[str], role: Role
) -> list[PodState]:
    """Engines of the role in these revisions that take traffic: verified, Ready, not draining."""
    revs = set(revisions)
    return [
        p
        for p in pods
        if p.revision in revs
        and p.role == role.value
        and p.verified
        and p.ready
        and not p.terminating
        and p.draining_since is None
    ]


# -- scale-down drains first ----------------------------------------------------------------


@dataclass(frozen=True)
class EngineLoad:
    """What an engine reports in flight on its /metrics (every rank summed)."""

    running: int = 0
    queued: int = 0
    transfers: int = 0  # KV transfers, pre-allocations and bootstraps in the PD queues

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.queued == 0 and self.transfers == 0

    def describe(self) -> str:
        return (
            f"{self.running} running, {self.queued} queued, {self.transfers} in the KV "
            "transfer queues"
        )


RUNNING_METRICS = ("sglang:num_running_reqs",)
QUEUED_METRICS = ("sglang:num_queue_reqs",)
TRANSFER_METRICS = (
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
)


def load_from_metrics(text: str) -> EngineLoad | None:
    """An engine's requests in flight from its Prometheus text; None when it does not report
    running requests at all (then nothing proves it idle)."""
    sums = {"running": 0.0, "queued": 0.0, "transfers": 0.0}
    seen = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = (
            "running"
            if name in RUNNING_METRICS
            else "queued"
            if name in QUEUED_METRICS
            else "transfers"
            if name in TRANSFER_METRICS
            else None
        )
        if key is None:
            continue
        try:
            value = float(line.rsplit("}", 1)[-1].split()[0])
        except (IndexError, ValueError):
            return None  # a malformed sample proves nothing
        if math.isnan(value) or value < 0:
            return None
        sums[key] += value
        seen = seen or key == "running"
    if not seen:
        return None
    return EngineLoad(*(math.ceil(sums[k]) for k in ("running", "queued", "transfers")))


LOADS_PATH = "/v1/loads?include=core,disagg"
LOADS_QUEUES = (
    "prefill_bootstrap_queue_reqs",
    "prefill_inflight_queue_reqs",
    "decode_prealloc_queue_reqs",
    "decode_transfer_queue_reqs",
    "decode_retracted_queue_reqs",
)


def load_from_loads(document: object) -> EngineLoad | None:
    """An engine's requests in flight from SGLang's ``GET /v1/loads`` (JSON, every DP rank);
    None when the answer is not that. SGLang refreshes this snapshot every 50 ms even while its
    scheduler waits on a KV transfer with nothing to run, when its /metrics gauges go stale."""
    loads = document.get("loads") if isinstance(document, Mapping) else None
    if not isinstance(loads, list) or not loads:
        return None
    running = queued = transfers = 0
    for rank in loads:
        if not isinstance(rank, Mapping):
            return None
        core = [rank.get("num_running_reqs"), rank.get("num_waiting_reqs", 0)]
        disagg = rank.get("disaggregation") or {}
        if not isinstance(disagg, Mapping):
            return None
        queues = [disagg.get(name, 0) for name in LOADS_QUEUES]
        values = [*core, *queues]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            return None
        running += core[0]
        queued += core[1]
        transfers += sum(queues)
    return EngineLoad(running, queued, transfers)


@dataclass(frozen=True)
class PodPatch:
    """A merge patch of one engine pod's annotations (None removes one)."""

    name: str
    annotations: Mapping[str, str | None]


@dataclass(frozen=True)
class Removal:
    """An engine pod whose drain ended this pass (it is marked for removal)."""

    pod: str
    role: str
    seconds: float
    load: EngineLoad | None
    timed_out: bool


@dataclass
class DrainPlan:
    pod_patches: list[PodPatch] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # type, reason, message
    draining: dict[str, list[str]] = field(default_factory=dict)  # role -> pods out of traffic
    waiting: dict[str, str] = field(default_factory=dict)  # role -> why the count is not there
    removals: list[Removal] = field(default_factory=list)


def _release(pod: PodState) -> PodPatch:
    return PodPatch(
        pod.name,
        {labels.DRAINING_SINCE: None, labels.DRAINED: None, labels.POD_DELETION_COST: None},
    )


def _mark_removable(pod: PodState, now: datetime) -> PodPatch:
    return PodPatch(
        pod.name,
        {labels.DRAINED: rfc3339(now), labels.POD_DELETION_COST: LOWEST_DELETION_COST},
    )


def plan_drains(
    observed: ObservedState,
    step: RolloutStep,
    loads: Mapping[str, EngineLoad | None],
) -> DrainPlan:
    """The drains of the step's engine scale-downs of revisions that take traffic: which pods
    leave traffic, which are drained and marked for removal, which go back (the planner decided
    the counts: WorkloadIntent.scale_down_to)."""
    now = observed.now
    serving = set(traffic_revisions(step)) | {r for r in (step.previous_serving_revision,) if r}
    current = {(w.revision, w.component): w.replicas for w in observed.workloads}
    plan = DrainPlan()
    for intent in step.workloads:
        role = intent.component
        have = current.get((intent.revision, role))
        if role not in (Role.PREFILL.value, Role.DECODE.value) or have is None:
            continue
        if intent.revision not in serving:
            continue  # takes no traffic (a refused or retired revision): no drain
        pods = engine_pods_of(observed, intent.revision, role)
        _drain_role(plan, observed, intent, have, pods, loads, now)
    return plan


def _drain_role(
    plan: DrainPlan,
    observed: ObservedState,
    intent: WorkloadIntent,
    have: int,
    pods: list[PodState],
    loads: Mapping[str, EngineLoad | None],
    now: datetime,
) -> None:
    """One revision's role: the drain's pod writes and Events."""
    role = Role(intent.component)
    bounds = autoscaling_of(observed.spec, role)
    goal = intent.scale_down_to if intent.scale_down_to is not None else intent.replicas
    # Pods its ReplicaSet is already removing (marked, replicas lowered): left alone.
    candidates = drain_candidates(pods, have)
    need = have - goal
    if need <= 0:
        for pod in candidates:
            if pod.draining_since is not None or pod.drained:
                plan.pod_patches.append(_release(pod))
                plan.events.append(
                    (
                        "Normal",
                        SCALE_DOWN_CANCELLED,
                        f"{role.value} pod {pod.name} goes back to verification: the count "
                        f"rose to {goal} before it was removed",
                    )
                )
        return
    floor = drain_floor(observed.spec, role, goal)
    chosen = pick_removals(candidates, need, floor)
    for pod in candidates:
        if pod not in chosen and (pod.draining_since is not None or pod.drained):
            plan.pod_patches.append(_release(pod))
    timeout = bounds.drain_timeout_seconds if bounds is not None else 300
    for pod in chosen:
        if pod.drained:
            continue
        _advance(plan, pod, role, goal, have, loads.get(pod.name), now, timeout)
    if len(chosen) < need:
        plan.waiting[role.value] = (
            f"{role.value} {have} → {goal} waits: removing another verified engine "
            f"would leave fewer than {floor} verified (minReplicas)"
        )
    plan.draining.setdefault(role.value, []).extend(
        p.name for p in chosen if p.draining_since is not None or p.drained
    )


def _advance(
    plan: DrainPlan,
    pod: PodState,
    role: Role,
    goal: int,
    have: int,
    load: EngineLoad | None,
    now: datetime,
    timeout: int,
) -> None:
    """One chosen pod's next drain step."""
    where = f"{role.value} pod {pod.name}"
    if pod.draining_since is None:
        if not (pod.verified or pod.ready):
            plan.pod_patches.append(_mark_removable(pod, now))  # serves nothing: no drain
            return
        plan.pod_patches.append(PodPatch(pod.name, {labels.DRAINING_SINCE: rfc3339(now)}))
        plan.events.append(
            (
                "Normal",
                DRAIN_STARTED,
                f"{where} leaves traffic to scale {role.value} {have} → {goal}; it "
                "is removed once its engine has no request or KV transfer in flight",
            )
        )
        return
    elapsed = (now - pod.draining_since).total_seconds()
    if load is not None and load.idle and elapsed >= DRAIN_SETTLE_SECONDS and not pod.ready:
        plan.pod_patches.append(_mark_removable(pod, now))
        plan.removals.append(Removal(pod.name, role.value, elapsed, load, False))
        plan.events.append(
            (
                "Normal",
                DRAINED,
                f"{where} drained in {elapsed:.1f} s ({load.describe()}); removing it",
            )
        )
    elif elapsed >= timeout:
        said = load.describe() if load is not None else "its /metrics unreadable"
        plan.pod_patches.append(_mark_removable(pod, now))
        plan.removals.append(Removal(pod.name, role.value, elapsed, load, True))
        plan.events.append(
            (
                "Warning",
                DRAIN_TIMED_OUT,
                f"{where} still had {said} after drainTimeoutSeconds {timeout} "
                f"(spec.{role.value}.autoscaling); removing it anyway",
            )
        )
    else:
        said = load.describe() if load is not None else "its /metrics not read yet"
        plan.waiting.setdefault(
            role.value, f"draining {where}: {said}, {elapsed:.0f} s of {timeout} s"
        )


# -- the pass's scaling decisions ------------------------------------------------------------


def requested_counts(
    observed: ObservedState, scales: Mapping[Role, Mapping[str, Any] | None], uid: str | None
) -> dict[Role, int]:
    """Each autoscaled role's RoleScale count; without a RoleScale of its own yet, the count it
    will be created with (initial_replicas)."""
    spec = observed.spec
    out: dict[Role, int] = {}
    serving = serving_revision(observed)[0]
    for role in ENGINE_ROLES:
        if autoscaling_of(spec, role) is None:
            continue
        body = scales.get(role)
        replicas = ((body or {}).get("spec") or {}).get("replicas")
        own = body is not None and conflict_for(body, uid) is None
        if own and isinstance(replicas, int) and replicas >= 0:
            out[role] = replicas
        else:
            out[role] = initial_replicas(observed, serving, role)
    return out


@dataclass
class ScaleDecision:
    """The RoleScale writes of one pass, and what it could not manage."""

    writes: list[PlannedWrite] = field(default_factory=list)
    conflicts: list[OwnershipConflict] = field(default_factory=list)
    # role -> what a RoleScale status says (for the metrics too)
    statuses: dict[Role, dict[str, Any]] = field(default_factory=dict)


def _status_message(count: RoleCount, plan: DrainPlan, role: Role) -> str:
    parts = [p for p in (count.why, plan.waiting.get(role.value, "")) if p]
    return "; ".join(parts)


def decide_scales(
    md: ModelDeployment,
    observed: ObservedState,
    step: RolloutStep,
    scales: Mapping[Role, Mapping[str, Any] | None],
    counts: Mapping[Role, RoleCount],
    drains: DrainPlan,
) -> ScaleDecision:
    """Create each autoscaled role's RoleScale, keep its bounds, write its status; delete the
    RoleScale of a role no longer autoscaled."""
    name, uid = md.metadata.name or "", md.metadata.uid
    out = ScaleDecision()
    revisions = traffic_revisions(step)
    for role in ENGINE_ROLES:
        bounds = autoscaling_of(md.spec, role)
        body = scales.get(role)
        conflict = conflict_for(body, uid) if body is not None else None
        if conflict is not None:
            consequence = (
                f"kvgate runs spec.{role.value}.replicas within its autoscaling bounds until "
                "the RoleScale is its own; delete it and kvgate creates its own"
            )
            if bounds is not None:
                out.conflicts.append(replace(conflict, consequence=consequence))
            continue
        if bounds is None:
            if body is not None:
                out.writes.append(Delete(SCALE_KIND, scale_name(name, role)))
            continue
        count = counts[role]
        if body is None:
            out.writes.append(Create(scale_object(md, role, count.requested)))
            continue
        patch = bounds_patch(name, role, bounds, body.get("spec") or {})
        if patch is not None:
            out.writes.append(
                Patch(SCALE_KIND, scale_name(name, role), {"spec": patch}, MERGE_PATCH)
            )
        status = {
            "replicas": len(serving_engines(observed.pods, revisions, role)),
            "selector": selector(name, role, revisions),
            "effectiveReplicas": count.effective,
            "draining": sorted(drains.draining.get(role.value, [])),
            "message": _status_message(count, drains, role),
            "observedGeneration": (body.get("metadata") or {}).get("generation"),
        }
        out.statuses[role] = status
        current = body.get("status") or {}
        if any(current.get(k) != v for k, v in status.items()):
            out.writes.append(
                Patch(
                    SCALE_KIND,
                    scale_name(name, role),
                    {"status": status},
                    MERGE_PATCH,
                    subresource="status",
                )
            )
    return out


def pod_writes(plan: DrainPlan) -> list[PlannedWrite]:
    return [
        Patch("Pod", p.name, {"metadata": {"annotations": dict(p.annotations)}}, MERGE_PATCH)
        for p in plan.pod_patches
    ]
