"""One pass over a ModelDeployment, decided (pure): what the pass read in; the plan, every write,
the whole status and its Events out.

``decide`` composes small deciders, each a function of plain data: ``plan_step`` (the counts,
the planner's step and its drains, the RoleScales), then each of ``DECIDERS`` (router access,
RoleScales, the router key Secret, the workloads, the NetworkPolicies, the Service) returning
its part of the writes and conflicts, and the status.

The controller's pass reads everything first (``PassInputs``, with one ``now``), calls
``decide``, performs the decision's write waves in order (the writes of one wave are
independent of each other), and calls ``conclude`` with the conflicts only a write could reveal
(a create that found someone else's object of that name) for the status and Events to record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.api import requirements
from kvgate.api.models import SCALE_KIND, ModelDeployment, Role
from kvgate.api.ownership import OwnershipConflict, conflict_for
from kvgate.api.timestamps import rfc3339
from kvgate.objects import builders, network_policy, router_auth
from kvgate.objects.engine_defences import engine_defences
from kvgate.objects.network_policy import RouterEgress
from kvgate.rollout import (
    lws_availability,
    owned_objects,
    pool_drift,
    refusal_record,
    rollback,
    scaling,
    workload_writes,
)
from kvgate.rollout.access_checks import AccessCheck
from kvgate.rollout.conflict_status import conflict_events, with_conflicts
from kvgate.rollout.lws_availability import LwsAccess
from kvgate.rollout.planner import ObservedState, RolloutStep, plan
from kvgate.rollout.status import Event, compute_status, events_for
from kvgate.rollout.workload_writes import Delete, PlannedWrite
from kvgate.verify import content_probe
from kvgate.verify.content_probe import ContentCheck, ContentVerdict

Body = dict[str, Any]
Wave = tuple[PlannedWrite, ...]
ACCESS_KINDS = ("ServiceAccount", "Role", "RoleBinding")
POLICY_KIND = "NetworkPolicy"
SECRET_CONSEQUENCE = (
    "it holds the routers' control-plane key, so kvgate runs every router of this "
    "ModelDeployment at 0 replicas until the Secret is its own"
)


@dataclass(frozen=True)
class PolicyInputs:
    """The NetworkPolicy settings and what the pass read of the revisions' policies."""

    enabled: bool = False
    operator_namespace: str = ""
    operator_pod_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    router_egress: RouterEgress | None = None
    # name -> the policy as read this pass (None: not there); empty when not read this pass
    current: Mapping[str, Body | None] = dataclasses.field(default_factory=dict)
    read: bool = False


@dataclass(frozen=True)
class ContentOutcome:
    """The target's content check, finished by its own task and not yet in status."""

    verdict: ContentVerdict
    record: Mapping[str, Any]


@dataclass(frozen=True)
class PassInputs:
    """Everything one pass read, and the settings its writes are built from."""

    body: Mapping[str, Any]  # the ModelDeployment as read
    md: ModelDeployment
    observed: ObservedState  # the planner's input; its ``now`` is the pass's one clock read
    deployments: tuple[Body, ...]  # its own Deployments and LeaderWorkerSets
    service: Body | None  # the Service <md>, whoever's it is
    lws_access: LwsAccess
    router_key: str
    guard: builders.Guard | None
    # kind -> the router's ServiceAccount, Role, RoleBinding as read (None: not there);
    # None when this pass did not read them (the last check's findings still hold)
    access_current: Mapping[str, Body | None] | None
    secret_current: Body | None  # the router key Secret (read every pass)
    last_access: AccessCheck | None
    policies: PolicyInputs
    content: ContentOutcome | None = None
    # The cluster's measured GPU reserves and the optimistic-drift threshold (operator settings).
    estimates: pool_drift.EstimatePolicy = dataclasses.field(
        default_factory=pool_drift.EstimatePolicy
    )
    # Autoscaled roles' RoleScale objects as read (None: not there), and the /metrics of the
    # engine pods a scale-down drains (None: unreadable) (kvgate.rollout.scaling).
    scales: Mapping[Role, Body | None] = dataclasses.field(default_factory=dict)
    loads: Mapping[str, scaling.EngineLoad | None] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class PassDecision:
    step: RolloutStep
    waves: tuple[Wave, ...]
    conflicts: tuple[OwnershipConflict, ...]  # known from the reads, in report order
    status: dict[str, Any]  # before ownership conflicts and LeaderWorkerSet availability
    lws_message: str | None
    inputs: PassInputs
    drains: scaling.DrainPlan | None = None
    scales: scaling.ScaleDecision | None = None
    counts: Mapping[Role, scaling.RoleCount] = dataclasses.field(default_factory=dict)

    @property
    def previous(self) -> Mapping[str, Any] | None:
        return self.inputs.body.get("status") or None


@dataclass(frozen=True)
class PassOutcome:
    status: dict[str, Any]
    events: tuple[Event, ...]
    conflicts: tuple[OwnershipConflict, ...]
    access_conflicts: tuple[OwnershipConflict, ...]  # ServiceAccount, Role, RoleBinding
    policy_conflicts: tuple[OwnershipConflict, ...]


@dataclass(frozen=True)
class PlannedStep:
    """The pass's first decision, which every other one follows: the count of each autoscaled
    role, the planner's step with the drains of its scale-downs, and the RoleScale decisions."""

    observed: ObservedState  # as the planner saw it: counts and a just-finished content check in
    step: RolloutStep
    counts: Mapping[Role, scaling.RoleCount]
    drains: scaling.DrainPlan
    scales: scaling.ScaleDecision


@dataclass(frozen=True)
class Part:
    """One decider's share of the pass: writes for the first wave (independent of every other
    write), its own waves in order after that, and the ownership conflicts it found."""

    first: Wave = ()
    waves: tuple[Wave, ...] = ()
    conflicts: tuple[OwnershipConflict, ...] = ()


def plan_step(inputs: PassInputs) -> PlannedStep:
    """The counts autoscaled roles run (their RoleScales, within the bounds), the planner's
    step at those counts (with the count each Deployment runs while engines drain), the drains'
    pod marks and Events, and the RoleScales."""
    counts = scaling.role_counts(
        inputs.observed.spec,
        scaling.requested_counts(inputs.observed, inputs.scales, inputs.md.metadata.uid),
    )
    observed = dataclasses.replace(
        _with_content_check(inputs.observed, inputs.content),
        scaled={role.value: count.effective for role, count in counts.items()},
    )
    step = plan(observed)
    drains = scaling.plan_drains(observed, step, inputs.loads)
    scales = scaling.decide_scales(inputs.md, observed, step, inputs.scales, counts, drains)
    return PlannedStep(observed, step, counts, drains, scales)


def decide_router_access(inputs: PassInputs, _: PlannedStep) -> Part:
    """The router's ServiceAccount and Role, then its RoleBinding in a wave of its own: the API
    server resolves the roleRef when the binding is created (404 until the Role is there)."""
    if inputs.access_current is None:
        return Part()
    md, uid = inputs.md, inputs.md.metadata.uid
    desired = [
        builders.router_service_account(md),
        builders.router_role(md),
        builders.router_role_binding(md),
    ]
    ensured = [owned_objects.ensure(d, inputs.access_current.get(d["kind"]), uid) for d in desired]
    return Part(
        first=tuple(w for e in ensured[:2] for w in e.writes),
        waves=(ensured[2].writes,),
        conflicts=tuple(e.conflict for e in ensured if e.conflict is not None),
    )


def decide_role_scales(_: PassInputs, planned: PlannedStep) -> Part:
    """The drained engines' pod annotations and the RoleScales' writes, in one wave."""
    scales = planned.scales
    return Part(
        waves=((*scaling.pod_writes(planned.drains), *scales.writes),),
        conflicts=tuple(scales.conflicts),
    )


def _router_secret(inputs: PassInputs) -> owned_objects.Ensured:
    return owned_objects.ensure(
        builders.router_control_secret(inputs.md, inputs.router_key),
        inputs.secret_current,
        inputs.md.metadata.uid,
    )


def decide_router_secret(inputs: PassInputs, _: PlannedStep) -> Part:
    """The routers' control-plane key Secret kept as kvgate built it, or its conflict."""
    secret = _router_secret(inputs)
    conflict = secret.conflict
    return Part(
        first=tuple(secret.writes),
        conflicts=(_secret_conflict(conflict),) if conflict is not None else (),
    )


def decide_workloads(inputs: PassInputs, planned: PlannedStep) -> Part:
    """Each revision's Deployments (or LeaderWorkerSets) as the step wants them, one wave each;
    no router runs while the key Secret is someone else's."""
    build = workload_writes.BuildInputs(
        router_auth.key_fingerprint(inputs.router_key),
        inputs.guard,
        inputs.lws_access is LwsAccess.SERVED,
        routers_blocked=_router_secret(inputs).conflict is not None,
    )
    existing = {_name(d): d for d in inputs.deployments}
    writes = workload_writes.revision_writes(inputs.md, planned.step, existing, build)
    return Part(waves=tuple((w,) for w in writes))


def decide_network_policies(inputs: PassInputs, planned: PlannedStep) -> Part:
    waves, conflicts = _policy_writes(inputs, planned.step)
    return Part(waves=tuple(waves), conflicts=tuple(conflicts))


def _service_conflict(inputs: PassInputs) -> OwnershipConflict | None:
    service = inputs.service
    return conflict_for(service, inputs.md.metadata.uid) if service is not None else None


def decide_service(inputs: PassInputs, planned: PlannedStep) -> Part:
    """The Service <md> selecting the serving revision (or a split), never someone else's."""
    step, conflict = planned.step, _service_conflict(inputs)
    desired = (
        builders.service(inputs.md, step.service_revision, split=step.service_split)
        if step.service_revision
        else None
    )
    writes = workload_writes.service_writes(inputs.service, desired, foreign=conflict is not None)
    return Part(
        waves=tuple((w,) for w in writes),
        conflicts=(conflict,) if conflict is not None else (),
    )


Decider = Callable[[PassInputs, PlannedStep], Part]

# The pass's deciders, in the order of their write waves after the first (the first wave
# gathers every decider's independent writes) and of the conflicts they report.
DECIDERS: tuple[tuple[str, Decider], ...] = (
    ("router access", decide_router_access),
    ("role scales", decide_role_scales),
    ("router key secret", decide_router_secret),
    ("workloads", decide_workloads),
    ("network policies", decide_network_policies),
    ("service", decide_service),
)


def decide(inputs: PassInputs) -> PassDecision:
    """The step, the writes that carry it out and the status it leads to: the planned step,
    then each of DECIDERS' parts, composed."""
    planned = plan_step(inputs)
    parts = [decider(inputs, planned) for _, decider in DECIDERS]
    first = tuple(w for part in parts for w in part.first)
    waves = tuple(w for w in (first, *(w for part in parts for w in part.waves)) if w)
    step = planned.step
    service_url = _service_url(inputs, step, _service_conflict(inputs))
    return PassDecision(
        step=step,
        waves=waves,
        conflicts=tuple(c for part in parts for c in part.conflicts),
        status=_status(inputs, step, service_url=service_url),
        lws_message=lws_availability.unavailable_message(inputs.observed.spec, inputs.lws_access),
        inputs=inputs,
        drains=planned.drains,
        scales=planned.scales,
        counts=planned.counts,
    )


def conclude(decision: PassDecision, late: Sequence[OwnershipConflict]) -> PassOutcome:
    """The status to write and the Events to post, with every ownership conflict: those the
    reads showed and those the writes found (``late``)."""
    inputs, previous = decision.inputs, decision.previous
    known = decision.conflicts

    def of(kinds: Iterable[str], found: Iterable[OwnershipConflict]) -> list[OwnershipConflict]:
        return [c for c in found if c.kind in tuple(kinds)]

    access = (*of(ACCESS_KINDS, known), *of(ACCESS_KINDS, late))
    if inputs.access_current is None and inputs.last_access is not None:
        access = inputs.last_access.access_conflicts
    policies = (*of((POLICY_KIND,), known), *of((POLICY_KIND,), late))
    if not inputs.policies.read and inputs.last_access is not None:
        policies = inputs.last_access.policy_conflicts
    secret = [*of(("Secret",), known)] + [_secret_conflict(c) for c in of(("Secret",), late)]
    others = [c for c in late if c.kind not in (*ACCESS_KINDS, POLICY_KIND, "Secret")]
    service = of(("Service",), known)
    scales = of((SCALE_KIND,), known)
    conflicts = (*access, *secret, *scales, *others, *policies, *service)
    generation = int(inputs.body.get("metadata", {}).get("generation") or 0)
    now = inputs.observed.now
    status = with_conflicts(
        decision.status, conflicts, generation=generation, previous=previous, now=now
    )
    if of(("Service",), late):
        status = {**status, "url": None}  # the name is someone else's Service: not kvgate's URL
    status = lws_availability.with_lws_unavailable(
        status, decision.lws_message, generation=generation, previous=previous, now=now
    )
    events = [
        *events_for(decision.step, previous),
        *pool_drift.drift_events(status, previous, decision.step.target_revision),
        *conflict_events(conflicts, previous),
        *lws_availability.lws_events(decision.lws_message, previous),
    ]
    if decision.drains is not None:
        events += [Event(*e) for e in decision.drains.events]
    if inputs.content is not None:
        verdict = inputs.content.verdict
        kind = "Normal" if verdict.passed else "Warning"
        events.append(Event(kind, verdict.reason, verdict.message))
    return PassOutcome(status, tuple(events), conflicts, tuple(access), tuple(policies))


def _with_content_check(observed: ObservedState, content: ContentOutcome | None) -> ObservedState:
    """The recorded checks, with the target's just-finished one in front of them."""
    if content is None:
        return observed
    target = observed.target_revision
    decided = ContentCheck(target, content.verdict.passed, content.verdict.message)
    others = (c for c in observed.content_checks if c.revision != target)
    return dataclasses.replace(observed, content_checks=(decided, *others))


def _policy_writes(
    inputs: PassInputs, step: RolloutStep
) -> tuple[list[Wave], list[OwnershipConflict]]:
    """Each kept revision's NetworkPolicies created or restored (one wave), a deleted revision's
    own ones deleted; turned off, every own one read is deleted. Without a read this pass
    (nothing changed since the last check, which found them as built) a deleted revision's are
    deleted unless the last check found that name someone else's."""
    settings, name, uid = inputs.policies, inputs.md.metadata.name or "", inputs.md.metadata.uid
    kept = {i.revision for i in step.workloads} - set(step.delete_revisions)
    if not settings.enabled:
        doomed = [p for p, current in sorted(settings.current.items()) if _own(current, uid)]
        return [(Delete(POLICY_KIND, p),) for p in doomed], []
    waves: list[Wave] = []
    conflicts: list[OwnershipConflict] = []
    if settings.read:
        ensured = [
            owned_objects.ensure(d, settings.current.get(_name(d)), uid)
            for revision in sorted(kept)
            for d in network_policy.network_policies(
                inputs.md,
                revision,
                operator_namespace=settings.operator_namespace,
                operator_pod_labels=settings.operator_pod_labels,
                router_egress=settings.router_egress,
            )
        ]
        waves.append(tuple(w for e in ensured for w in e.writes))
        conflicts = [e.conflict for e in ensured if e.conflict is not None]
    last = inputs.last_access
    foreign = {c.name for c in last.policy_conflicts} if last is not None else set()
    for revision in sorted(step.delete_revisions):
        for policy in network_policy.policy_names(name, revision, router_egress=True):
            own = (
                _own(settings.current.get(policy), uid) if settings.read else policy not in foreign
            )
            if own:
                waves.append((Delete(POLICY_KIND, policy),))
    return waves, conflicts


def _own(current: Mapping[str, Any] | None, uid: str | None) -> bool:
    return current is not None and conflict_for(current, uid) is None


def _service_url(
    inputs: PassInputs, step: RolloutStep, conflict: OwnershipConflict | None
) -> str | None:
    """``status.url``: the Service's once this pass keeps one selecting a serving revision;
    never a Service kvgate does not own (a tenant's, under the same name)."""
    if step.service_revision is None or conflict is not None or inputs.observed.service_foreign:
        return None
    return builders.service_url(inputs.md)


def _status(inputs: PassInputs, step: RolloutStep, *, service_url: str | None) -> dict[str, Any]:
    """The rollout's status, each role's pool estimate and engine defences, the records of
    every revision still running, before ownership conflicts are added."""
    observed, body = inputs.observed, inputs.body
    status = compute_status(
        step,
        generation=int(body.get("metadata", {}).get("generation") or 0),
        context_length=observed.spec.model.context_length,
        previous=body.get("status") or None,
        now=observed.now,
    )
    # None, not absent: the status is written with a merge patch, where only null removes a key.
    status["url"] = service_url
    for role in ("prefill", "decode"):
        status[role].update(_role_status(inputs, step, role))
    return {**status, **_revision_records(inputs, step)}


def _role_status(inputs: PassInputs, step: RolloutStep, role: str) -> dict[str, Any]:
    """The estimate admission judged the role by, against its verified engines' live pools (the
    target's, else, none verified yet or refused, the serving revision's), and the engine's own
    defences."""
    observed, previous = inputs.observed, inputs.body.get("status") or None
    drift = pool_drift.reported_drift(
        role,
        observed.pods,
        inputs.estimates,
        target=observed.target_revision,
        target_spec=observed.spec,
        serving=step.serving_revision,
        serving_spec=pool_drift.recorded_spec(previous, step.serving_revision),
    )
    return {
        "poolEstimate": pool_drift.drift_status(drift, pool_drift.was_optimistic(previous, role)),
        "engineDefences": [
            {"name": d.name, "enabled": d.enabled, "message": d.message}
            for d in engine_defences(observed.spec)
        ],
    }


def _revision_records(inputs: PassInputs, step: RolloutStep) -> dict[str, Any]:
    """What status keeps of the revisions: requirements, served specs, refusals, content
    checks (status: tenants cannot write it)."""
    observed, body = inputs.observed, inputs.body
    spec, target, previous = observed.spec, observed.target_revision, body.get("status") or None
    running = {w.revision for w in observed.workloads}
    refusal = step.refusal
    refused = (
        None
        if refusal is None
        else refusal_record.RefusedRevision(
            refusal.revision, refusal.reason, refusal.message, rfc3339(observed.now)
        )
    )
    content = inputs.content.record if inputs.content is not None else None
    return {
        # The requirement of every revision still running, so its pods are verified against
        # what kvgate rolled out once the spec has moved on.
        "revisions": requirements.updated_records(
            previous,
            requirements.record_of(spec, target),
            keep=running | {step.serving_revision or ""},
        ),
        # The spec of every revision that served (the last revisionHistoryLimit), so
        # kvgate.io/rollback=<revision> never depends on its objects still running.
        "history": rollback.updated_history(
            previous,
            serving_revision=step.serving_revision,
            target_revision=target,
            spec=body.get("spec") or {},
            served_at=observed.now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            limit=spec.rollout.revision_history_limit,
        ),
        # Every refusal kvgate decided (the last ten), so kvgate history never needs an Event.
        "refusals": refusal_record.updated_refusals(previous, refused, new=step.new_refusal),
        # Each running revision's content check: a revision switches only after it passed.
        "contentChecks": content_probe.updated_records(previous, content, keep=running | {target}),
    }


def _secret_conflict(conflict: OwnershipConflict) -> OwnershipConflict:
    """Someone else wrote the router key Secret: a router started on it would take their key on
    its worker API (add engines kvgate never verified); none runs meanwhile."""
    return dataclasses.replace(conflict, consequence=SECRET_CONSEQUENCE, stops_serving=True)


def policy_names_to_read(md_name: str, revisions: Iterable[str]) -> list[str]:
    """Every NetworkPolicy name the running revisions can have (read when the check is due)."""
    return [
        policy
        for revision in sorted(set(revisions))
        for policy in network_policy.policy_names(md_name, revision, router_egress=True)
    ]


def _name(body: Mapping[str, Any]) -> str:
    return str(body.get("metadata", {}).get("name", ""))


__all__ = [
    "ContentOutcome",
    "PassDecision",
    "PassInputs",
    "PassOutcome",
    "PolicyInputs",
    "conclude",
    "decide",
    "policy_names_to_read",
]
