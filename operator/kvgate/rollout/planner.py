"""The rollout planner: observed cluster state -> the next RolloutStep (pure, no I/O, no clock).

Everything it needs lives in the cluster, so an operator restarted mid-rollout resumes from
cluster state alone. The durable record is the ModelDeployment's status, which only the operator
writes (a tenant who may edit the spec cannot write ``modeldeployments/status``); the derived
objects are evidence that may be lost or replaced by anyone who may edit the namespace:
- the serving revision is ``status.servingRevision`` while that revision still runs; if the
  status does not name a running revision (status lost, or its revision gone), the non-target
  revision the Service ``<md>`` selects; if neither does, a non-target revision whose engines
  and router prove they can serve (both roles verified, router Ready). The target serves only
  by kvgate's record or by passing the switch rule on this pass;
- a target revision's verification start time and refusal are ``status.rollout`` (for
  ``status.targetRevision``) and annotations on its Deployments; the status wins while any of
  the revision's Deployments exists. Deleting all of them retries the revision from scratch;
- each pod's verification is its ``kvgate.io/engine-verified`` condition.

Rules (mission invariants 1-3): a target revision serves only when, for BOTH roles, at least
ceil(minVerifiedPercent% × replicas) (≥ 1) of its pods are verified and its router is Ready. A
target pod with an unsafe verdict, or no switch within verifyTimeoutSeconds, refuses the revision:
the serving revision is left untouched. Revisions are deleted only when neither serving, target,
nor selected by the Service (it still sends them requests until its new selector lands); while
the serving revision is unknown (no status record, no Service), nothing is deleted until the
target serves. A lost Service is recreated, and a lost selector restored, for the serving
revision; a lost Deployment of the serving revision is recreated (a non-target revision's engines
cannot be: their spec is no longer in the ModelDeployment; only its router is rebuilt).

Seam for progressive rollouts: the serving revision is one revision and ``service_revision`` one
selector; a traffic set would replace both, with the same protection rule (never delete a
revision in the recorded traffic set unless a verified successor carries its share).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum

from kvgate.api import labels
from kvgate.api.models import ModelDeploymentSpec, Role, RolloutStrategy
from kvgate.rollout import pod_creation
from kvgate.rollout.pod_creation import CreationFailure
from kvgate.rollout.progressive import (
    EngineFailures,
    RouterCounters,
    StepCheck,
    check_step,
    share_percent,
    split_routers,
)
from kvgate.verify import gate
from kvgate.verify.content_probe import REASON_FAILED, ContentCheck

ENGINE_ROLES: tuple[Role, ...] = (Role.PREFILL, Role.DECODE)
ROUTER = labels.ROLE_ROUTER

REFUSED_UNSAFE = "EngineUnsafe"
REFUSED_TIMEOUT = "VerificationTimeout"
REFUSED_STEP_CHECK = "StepCheckFailed"
REFUSED_CONTENT = REASON_FAILED  # ContentCheckFailed


class Evidence(StrEnum):
    """Where the serving revision was read from, most durable first."""

    STATUS = "Status"  # status.servingRevision, written only by kvgate
    SERVICE = "Service"  # the selector of the Service <md>
    VERIFIED_ENGINES = "VerifiedEngines"  # able to serve; status and Service both lost


@dataclass(frozen=True)
class PodState:
    """One engine pod as the planner sees it."""

    name: str
    revision: str
    role: str
    verified: bool
    gate_reason: str | None = None
    gate_message: str | None = None
    ready: bool = False
    terminating: bool = False
    kv_pool_tokens: int | None = None
    # Scale-down (kvgate.rollout.scaling): out of traffic since; drained and marked for removal.
    draining_since: datetime | None = None
    drained: bool = False
    created: datetime | None = None


@dataclass(frozen=True)
class WorkloadState:
    """One existing Deployment (prefill, decode or router) of one revision."""

    revision: str
    component: str
    replicas: int
    ready_replicas: int = 0
    verify_started_at: datetime | None = None
    refused_reason: str | None = None
    refused_message: str | None = None
    # Its ReplicaSet cannot create pods (the Deployment's ReplicaFailure condition).
    creation_failure: CreationFailure | None = None


@dataclass(frozen=True)
class Refusal:
    revision: str
    reason: str
    message: str


@dataclass(frozen=True)
class StepRecord:
    """The progressive step in progress, as kvgate recorded it in status.rollout.step."""

    index: int  # into spec.rollout.steps
    started_at: datetime
    # The target's routers' counters when the step began (the step check counts from here).
    baseline: tuple[RouterCounters, ...] = ()
    # The serving revision's router replicas before the split (restored when it ends).
    serving_router_replicas: int = 1
    weight: int = 0  # the step's share of requests (percent), as configured when it began
    # The target's engine pods' failure counters when the step began.
    engine_baseline: tuple[EngineFailures, ...] = ()


@dataclass(frozen=True)
class RolloutRecord:
    """The rollout as kvgate last wrote it to the ModelDeployment's status.

    Only the operator writes status, so this outlives the Service, the Deployments and their
    annotations. All None when the status was never written or is lost (CR re-created).
    """

    target_revision: str | None = None
    serving_revision: str | None = None
    verify_started_at: datetime | None = None  # of target_revision
    refusal: Refusal | None = None  # of target_revision
    step: StepRecord | None = None  # of target_revision (progressive strategy)

    @property
    def known(self) -> bool:
        """kvgate wrote this status (it always writes targetRevision)."""
        return self.target_revision is not None


@dataclass(frozen=True)
class ObservedState:
    spec: ModelDeploymentSpec
    target_revision: str
    workloads: tuple[WorkloadState, ...]
    pods: tuple[PodState, ...]
    service_revision: str | None  # the revision the Service selects; None: no Service/selector
    now: datetime
    recorded: RolloutRecord = field(default_factory=RolloutRecord)
    service_exists: bool | None = None  # None: the Service exists iff service_revision is set
    # A Service named <md> that the ModelDeployment does not control: its selector is no
    # evidence, and kvgate never writes it (the handler reports an ownership conflict).
    service_foreign: bool = False
    # The Service selects every router of the ModelDeployment (a progressive step's split).
    service_split: bool = False
    # The target's router pods' response counters (progressive step check); None: not read.
    target_router_counters: tuple[RouterCounters, ...] | None = None
    # The target's engine pods' failure counters (progressive step check); None: an engine of
    # the target did not answer its /metrics (the check then decides nothing).
    target_engine_failures: tuple[EngineFailures, ...] | None = ()
    # Content checks at maximum length as kvgate recorded them (status.contentChecks).
    content_checks: tuple[ContentCheck, ...] = ()
    # Autoscaled roles: the count each runs (kvgate.rollout.scaling: its RoleScale's count within
    # the bounds), which replaces spec.<role>.replicas for every revision that runs engines.
    scaled: Mapping[str, int] = field(default_factory=dict)

    @property
    def has_service(self) -> bool:
        if self.service_exists is None:
            return self.service_revision is not None
        return self.service_exists


@dataclass(frozen=True)
class WorkloadIntent:
    """Make this Deployment exist with these replicas (create it if missing)."""

    revision: str
    component: str
    replicas: int  # what it runs after this pass
    # The count a scale-down of a revision taking traffic heads for: ``replicas`` stays above it
    # until the engines picked to leave have drained (kvgate.rollout.scaling marks them).
    scale_down_to: int | None = None


@dataclass(frozen=True)
class ServiceRepair:
    """The Service was lost or repointed by someone else; kvgate puts it back."""

    recreated: bool  # True: the Service was missing; False: its selector named another revision
    revision: str  # the revision it selects now
    was: str | None  # the revision it selected (None: missing, or no revision in its selector)
    evidence: Evidence  # why this revision


@dataclass(frozen=True)
class RoleProgress:
    replicas: int
    needed: int
    verified: int
    ready: int
    min_verified_kv_pool_tokens: int | None = None


@dataclass(frozen=True)
class RolloutStep:
    target_revision: str
    serving_revision: str | None  # after this step
    previous_serving_revision: str | None
    workloads: tuple[WorkloadIntent, ...]
    delete_revisions: tuple[str, ...]
    service_revision: str | None  # the selector to write; None: leave / create no Service
    refusal: Refusal | None  # the target's refusal (new or standing)
    new_refusal: bool  # True the step the refusal is decided (annotate, count, warn)
    verify_started_at: datetime  # of the target revision
    progress: dict[str, RoleProgress] = field(default_factory=dict)  # target, per engine role
    serving_problems: tuple[PodState, ...] = ()  # serving pods that lost verification
    target_problems: tuple[PodState, ...] = ()  # target pods whose gate is False
    # Deployments whose pods the API server refuses: the target's, and the serving revision's.
    target_creation_failures: tuple[CreationFailure, ...] = ()
    serving_creation_failures: tuple[CreationFailure, ...] = ()
    target_router_ready: bool = False
    serving_evidence: Evidence | None = None  # where the serving revision (before) was read
    service_repair: ServiceRepair | None = None
    # Deployments of the serving revision (before this step) that were missing and are recreated.
    recreated_serving_components: tuple[str, ...] = ()
    # Progressive strategy: write a Service selecting the routers of both the serving and the
    # target revision (service_revision still names the serving one), the step to record, the
    # step check so far, each revision's share of ready routers, and why the step waits.
    service_split: bool = False
    step_record: StepRecord | None = None
    step_check: StepCheck | None = None
    traffic: tuple[tuple[str, int], ...] = ()
    step_waiting: str = ""
    # The target is able to serve but its content check has not run: run it, then plan again.
    content_check_due: bool = False

    @property
    def switched(self) -> bool:
        return self.serving_revision != self.previous_serving_revision


def needed_verified(replicas: int, min_verified_percent: int) -> int:
    """ceil(percent × replicas), at least one pod per role with replicas."""
    if replicas <= 0:
        return 0
    return max(1, math.ceil(replicas * min_verified_percent / 100))


def role_replicas(spec: ModelDeploymentSpec, role: Role) -> int:
    return spec.prefill.replicas if role is Role.PREFILL else spec.decode.replicas


def _count(observed: ObservedState, role: Role) -> int:
    """The engines a role runs: its RoleScale's count when autoscaled, else spec.replicas."""
    scaled = observed.scaled.get(role.value)
    return scaled if scaled is not None else role_replicas(observed.spec, role)


def _live_pods(pods: tuple[PodState, ...], revision: str, role: str) -> list[PodState]:
    return [p for p in pods if p.revision == revision and p.role == role and not p.terminating]


def role_progress(observed: ObservedState, revision: str, role: Role) -> RoleProgress:
    pods = _live_pods(observed.pods, revision, role.value)
    verified = [p for p in pods if p.verified]
    pools = [p.kv_pool_tokens for p in verified if p.kv_pool_tokens is not None]
    replicas = _count(observed, role)
    return RoleProgress(
        replicas=replicas,
        needed=needed_verified(replicas, observed.spec.rollout.min_verified_percent),
        verified=len(verified),
        ready=sum(1 for p in pods if p.ready),
        min_verified_kv_pool_tokens=min(pools) if pools else None,
    )


def _ready_routers(observed: ObservedState, revision: str) -> int:
    return sum(
        w.ready_replicas
        for w in observed.workloads
        if w.revision == revision and w.component == ROUTER
    )


def _router_ready(observed: ObservedState, revision: str) -> bool:
    return _ready_routers(observed, revision) > 0


def _workloads_of(observed: ObservedState, revision: str) -> list[WorkloadState]:
    return [w for w in observed.workloads if w.revision == revision]


def _runs(observed: ObservedState, revision: str | None) -> bool:
    """The revision still has a Deployment or a live engine pod (or is the target: rebuilt)."""
    if revision is None:
        return False
    return (
        revision == observed.target_revision
        or bool(_workloads_of(observed, revision))
        or any(p.revision == revision and not p.terminating for p in observed.pods)
    )


def _able_to_serve(observed: ObservedState, revision: str) -> bool:
    """Both roles have enough verified pods and the router is Ready (the switch rule)."""
    progress = [role_progress(observed, revision, role) for role in ENGINE_ROLES]
    return all(p.verified >= p.needed for p in progress) and _router_ready(observed, revision)


def content_verified(observed: ObservedState, revision: str) -> bool:
    """The revision passed its content check at maximum length (kvgate.verify.content_probe), or the
    spec turns the check off. A revision takes traffic only when this holds."""
    if not observed.spec.safety.content_probe.enabled:
        return True
    return any(c.revision == revision and c.passed for c in observed.content_checks)


def _content_failure(observed: ObservedState, revision: str) -> ContentCheck | None:
    for check in observed.content_checks:
        if check.revision == revision and not check.passed:
            return check
    return None


def _latest_start(observed: ObservedState, revision: str) -> datetime:
    starts = [w.verify_started_at for w in _workloads_of(observed, revision) if w.verify_started_at]
    return max(starts) if starts else datetime.min.replace(tzinfo=observed.now.tzinfo)


def serving_revision(observed: ObservedState) -> tuple[str | None, Evidence | None]:
    """The revision taking traffic, from the most durable evidence that names a running one."""
    recorded = observed.recorded
    if _runs(observed, recorded.serving_revision):
        return recorded.serving_revision, Evidence.STATUS
    if recorded.known and recorded.serving_revision is None:
        # kvgate recorded that nothing served yet: a Service selecting a revision is not
        # evidence that it passed verification (if kvgate switched it and its status write was
        # lost, the revision passes again on this pass).
        return None, None
    selected = observed.service_revision
    # Only kvgate's record makes the target serve without passing the switch rule now: a
    # Service selecting it (edited, or kvgate's status write lost) proves nothing about it.
    if selected != observed.target_revision and _runs(observed, selected):
        return selected, Evidence.SERVICE
    # Status and Service both lost (or name revisions that are gone): a revision that proves it
    # can serve is as safe to serve as a target that just passed verification.
    able = [
        r
        for r in {w.revision for w in observed.workloads}
        if r != observed.target_revision and _able_to_serve(observed, r)
    ]
    if not able:
        return None, None
    return max(able, key=lambda r: (_latest_start(observed, r), r)), Evidence.VERIFIED_ENGINES


def _recorded_attempt_applies(observed: ObservedState) -> bool:
    """status.rollout describes the target's current attempt (not an earlier, retried one)."""
    recorded, target = observed.recorded, observed.target_revision
    mine = _workloads_of(observed, target)
    if recorded.target_revision != target or not mine:
        return False  # another revision's record, or every Deployment deleted: a retry
    starts = [w.verify_started_at for w in mine if w.verify_started_at]
    # Every annotated start later than the record: a retry whose status write was lost.
    return not (
        recorded.verify_started_at is not None
        and starts
        and min(starts) > recorded.verify_started_at
    )


def _verify_started_at(observed: ObservedState, *, recorded: bool) -> datetime:
    if recorded and observed.recorded.verify_started_at is not None:
        return observed.recorded.verify_started_at
    starts = [
        w.verify_started_at
        for w in _workloads_of(observed, observed.target_revision)
        if w.verify_started_at
    ]
    return min(starts) if starts else observed.now


def _standing_refusal(observed: ObservedState, *, recorded: bool) -> Refusal | None:
    if recorded and observed.recorded.refusal is not None:
        return observed.recorded.refusal
    for w in _workloads_of(observed, observed.target_revision):
        if w.refused_reason:
            return Refusal(w.revision, w.refused_reason, w.refused_message or "")
    return None


def _gate_failures(observed: ObservedState, revision: str | None) -> tuple[PodState, ...]:
    """Live pods of a revision whose gate condition is set and not True."""
    return tuple(
        p
        for p in observed.pods
        if revision is not None
        and p.revision == revision
        and not p.terminating
        and not p.verified
        and p.gate_reason
        and p.gate_reason != gate.SCALING_DOWN  # taken out of traffic on purpose
    )


def creation_failures(observed: ObservedState, revision: str | None) -> tuple[CreationFailure, ...]:
    """The revision's Deployments whose ReplicaSets cannot create pods."""
    return tuple(
        w.creation_failure
        for w in observed.workloads
        if revision is not None and w.revision == revision and w.creation_failure is not None
    )


def _first_failure_text(observed: ObservedState, revision: str) -> str:
    """``; <the first failing pod's gate message>`` (what a timed-out revision's refusal names:
    e.g. an engine whose report kvgate cannot read), else the first Deployment that cannot
    create its pods, or nothing when no pod has failed yet."""
    failures = _gate_failures(observed, revision)
    if not failures:
        return pod_creation.first_note(creation_failures(observed, revision))
    first = failures[0]
    more = f" (and {len(failures) - 1:,} more pods not verified)" if len(failures) > 1 else ""
    return f"; {first.gate_message or first.gate_reason}{more}"


def _progress_text(progress: dict[str, RoleProgress]) -> str:
    return ", ".join(f"{role} {p.verified}/{p.needed} verified" for role, p in progress.items())


def _unsafe_pod(observed: ObservedState, revision: str) -> PodState | None:
    for pod in observed.pods:
        if (
            pod.revision == revision
            and not pod.terminating
            and gate.is_unsafe_reason(pod.gate_reason)
        ):
            return pod
    return None


def _target_intents(
    observed: ObservedState, *, engines_up: bool, routers: int | None = None
) -> list[WorkloadIntent]:
    """The target's Deployments; ``routers`` overrides its router replicas (a split step)."""
    spec = observed.spec
    rev = observed.target_revision
    intents = [
        WorkloadIntent(rev, role.value, _count(observed, role) if engines_up else 0)
        for role in ENGINE_ROLES
    ]
    if routers is None:
        routers = spec.router.replicas if engines_up else 0
    intents.append(WorkloadIntent(rev, ROUTER, routers))
    return intents


def _progressive(observed: ObservedState) -> bool:
    return observed.spec.rollout.strategy is RolloutStrategy.PROGRESSIVE


def _refused_router_replicas(observed: ObservedState) -> int | None:
    """A refused target's routers: none under the progressive strategy (a Service left
    selecting every router must not reach them), else the target's usual count."""
    return 0 if _progressive(observed) else None


def _restored_serving_router(
    observed: ObservedState, serving: str | None, recorded_step: StepRecord | None
) -> list[WorkloadIntent]:
    """After a split, the serving revision's routers go back to their count before it."""
    if serving is None or serving == observed.target_revision or recorded_step is None:
        return []
    if not any(w.component == ROUTER for w in _workloads_of(observed, serving)):
        return []  # rebuilt by _serving_router_intent
    return [WorkloadIntent(serving, ROUTER, recorded_step.serving_router_replicas)]


def _serving_router_intent(observed: ObservedState, serving: str | None) -> list[WorkloadIntent]:
    """A lost router Deployment of a serving revision that is not the target: rebuilt from the
    current spec (its engines cannot be: their spec is gone; the router only discovers its own
    revision's verified pods, so it never pairs revisions)."""
    if serving is None or serving == observed.target_revision:
        return []
    if any(w.component == ROUTER for w in _workloads_of(observed, serving)):
        return []
    return [WorkloadIntent(serving, ROUTER, observed.spec.router.replicas)]


def _recreated(
    observed: ObservedState, serving: str | None, intents: tuple[WorkloadIntent, ...]
) -> tuple[str, ...]:
    """Components of the serving revision this step creates because their Deployment is gone."""
    if serving is None:
        return ()
    have = {w.component for w in _workloads_of(observed, serving)}
    return tuple(w.component for w in intents if w.revision == serving and w.component not in have)


def _service_repair(
    observed: ObservedState, selects: str | None, evidence: Evidence | None, *, switched: bool
) -> ServiceRepair | None:
    if selects is None or evidence is None or switched or observed.service_foreign:
        return None
    if not observed.has_service:
        return ServiceRepair(True, selects, None, evidence)
    if observed.service_split:
        return None  # kvgate's own split selector: entering or leaving it is a planned write
    if observed.service_revision != selects:
        return ServiceRepair(False, selects, observed.service_revision, evidence)
    return None


def _protected(observed: ObservedState, serving: str | None) -> set[str | None]:
    """Revisions never deleted: what serves, the target, and what the Service still sends
    requests to (until its new selector lands, a later pass)."""
    protected = {observed.target_revision, serving, observed.service_revision}
    if observed.service_split:
        # A split Service still sends requests to the recorded target's routers (e.g. the spec
        # moved on mid-step) until its new selector lands.
        protected.add(observed.recorded.target_revision)
    return protected


@dataclass(frozen=True)
class _Pass:
    """What one planning pass reads before it picks a step, and the step builder every branch
    uses (the fields every step shares are filled in here, once)."""

    observed: ObservedState
    serving: str | None  # the serving revision before this step
    evidence: Evidence | None  # where it was read
    progress: dict[str, RoleProgress]  # the target's, per engine role
    recorded_attempt: bool  # status.rollout describes the target's current attempt
    started: datetime  # the target's verification start
    recorded_step: StepRecord | None  # the progressive step in progress (current attempt)
    serving_router: tuple[WorkloadIntent, ...]  # the serving router, rebuilt or restored
    present: tuple[str, ...]  # revisions with a Deployment, sorted
    unprotected: tuple[str, ...]  # present revisions nothing serves from or sends requests to
    # The revisions this pass may delete: the unprotected ones, once kvgate's status record or
    # the Service says which revision served (while nothing does, none).
    others: tuple[str, ...]

    @property
    def target(self) -> str:
        return self.observed.target_revision

    @property
    def target_up(self) -> tuple[WorkloadIntent, ...]:
        """The target's Deployments at the spec's replicas."""
        return tuple(_target_intents(self.observed, engines_up=True))

    @property
    def serving_problems(self) -> tuple[PodState, ...]:
        return _gate_failures(self.observed, self.serving)

    def step(
        self,
        workloads: Iterable[WorkloadIntent],
        delete_revisions: tuple[str, ...],
        *,
        target_serves: bool = False,
        refusal: Refusal | None = None,
        new_refusal: bool = False,
        serving_problems: tuple[PodState, ...] = (),
        service_split: bool = False,
        step_record: StepRecord | None = None,
        step_check: StepCheck | None = None,
        traffic: tuple[tuple[str, int], ...] = (),
        step_waiting: str = "",
        content_check_due: bool = False,
    ) -> RolloutStep:
        """A step; ``target_serves``: the target serves after it and the Service selects it
        (else the serving revision keeps both)."""
        observed, target = self.observed, self.target
        serving = target if target_serves else self.serving
        intents = _drained_first(
            observed,
            (*workloads, *_scaled_serving_intents(observed, self.serving, workloads)),
            taking_traffic={r for r, share in traffic if share > 0}
            | {r for r in (serving, self.serving) if r},
        )
        return RolloutStep(
            target_revision=target,
            serving_revision=serving,
            previous_serving_revision=self.serving,
            workloads=intents,
            delete_revisions=delete_revisions,
            service_revision=serving,
            refusal=refusal,
            new_refusal=new_refusal,
            verify_started_at=self.started,
            progress=self.progress,
            serving_problems=serving_problems,
            target_problems=_gate_failures(observed, target),
            target_creation_failures=creation_failures(observed, target),
            serving_creation_failures=creation_failures(observed, serving),
            target_router_ready=_router_ready(observed, target),
            serving_evidence=self.evidence,
            service_repair=_service_repair(
                observed, serving, self.evidence, switched=serving != self.serving
            ),
            recreated_serving_components=_recreated(observed, self.serving, intents),
            service_split=service_split,
            step_record=step_record,
            step_check=step_check,
            traffic=traffic,
            step_waiting=step_waiting,
            content_check_due=content_check_due,
        )


def _scaled_serving_intents(
    observed: ObservedState, serving: str | None, planned: Iterable[WorkloadIntent]
) -> list[WorkloadIntent]:
    """During a rollout the autoscaler acts on what serves: the serving revision's engines of an
    autoscaled role follow its count too (without autoscaling they keep the count they had)."""
    if serving is None or serving == observed.target_revision:
        return []
    have = {(w.revision, w.component) for w in planned}
    present = {w.component for w in _workloads_of(observed, serving)}
    return [
        WorkloadIntent(serving, role.value, count)
        for role in ENGINE_ROLES
        if (count := observed.scaled.get(role.value)) is not None
        and role.value in present
        and (serving, role.value) not in have
    ]


# -- scale-down of a revision taking traffic: engines drain before they go ---------------------


def engine_pods_of(observed: ObservedState, revision: str, role: str) -> list[PodState]:
    """The revision's engine pods of the role that are not being deleted."""
    return [
        p for p in observed.pods if p.revision == revision and p.role == role and not p.terminating
    ]


def drain_candidates(pods: list[PodState], have: int) -> list[PodState]:
    """The pods a scale-down may pick: all but those its ReplicaSet is already removing (marked
    drained, and the replicas already lowered past them)."""
    surplus = max(0, len(pods) - have)
    leaving = sorted((p for p in pods if p.drained), key=lambda p: p.name)[:surplus]
    return [p for p in pods if p not in leaving]


def drain_floor(spec: ModelDeploymentSpec, role: Role, goal: int) -> int:
    """The verified engines a scale-down to ``goal`` keeps serving: minReplicas when autoscaled."""
    bounds = (spec.prefill if role is Role.PREFILL else spec.decode).autoscaling
    return min(bounds.min_replicas if bounds is not None else 0, goal)


def pick_removals(candidates: list[PodState], need: int, floor: int) -> list[PodState]:
    """The pods to remove: those already draining, then those serving nothing (not verified, not
    Ready), then the newest verified ones, while at least ``floor`` verified engines stay."""
    order = sorted(
        candidates,
        key=lambda p: (
            p.draining_since is None and not p.drained,
            p.verified or p.ready,
            -(p.created.timestamp() if p.created else 0.0),
            p.name,
        ),
    )
    verified = sum(
        1 for p in candidates if p.verified and p.draining_since is None and not p.drained
    )
    chosen: list[PodState] = []
    for pod in order:
        if len(chosen) == need:
            break
        takes_traffic = (
            pod.draining_since is None and not pod.drained and (pod.verified or pod.ready)
        )
        if takes_traffic and pod.verified:
            if verified - 1 < floor:
                continue
            verified -= 1
        chosen.append(pod)
    return chosen


def _drained_first(
    observed: ObservedState, intents: tuple[WorkloadIntent, ...], *, taking_traffic: set[str]
) -> tuple[WorkloadIntent, ...]:
    """A lower engine count for a revision taking traffic never just lowers its replicas (its
    ReplicaSet would kill any pod, requests in flight and all): it runs one fewer only for each
    pod picked to leave that is already marked drained (kvgate.rollout.scaling)."""
    current = {(w.revision, w.component): w.replicas for w in observed.workloads}
    out = []
    for intent in intents:
        have = current.get((intent.revision, intent.component))
        engine = intent.component in (Role.PREFILL.value, Role.DECODE.value)
        if not engine or have is None or intent.revision not in taking_traffic:
            out.append(intent)
            continue
        if intent.replicas >= have:
            out.append(intent)
            continue
        chosen = pick_removals(
            drain_candidates(engine_pods_of(observed, intent.revision, intent.component), have),
            have - intent.replicas,
            drain_floor(observed.spec, Role(intent.component), intent.replicas),
        )
        removable = sum(1 for p in chosen if p.drained)
        out.append(replace(intent, replicas=have - removable, scale_down_to=intent.replicas))
    return tuple(out)


def _read_pass(observed: ObservedState) -> _Pass:
    """The serving revision, the target's attempt and progress, and what may be deleted."""
    target = observed.target_revision
    serving, evidence = serving_revision(observed)
    present = tuple(sorted({w.revision for w in observed.workloads}))
    recorded_attempt = _recorded_attempt_applies(observed)
    recorded_step = observed.recorded.step if recorded_attempt else None
    protected = _protected(observed, serving)
    unprotected = tuple(r for r in present if r not in protected)
    history_known = observed.recorded.known or evidence is Evidence.SERVICE
    return _Pass(
        observed=observed,
        serving=serving,
        evidence=evidence,
        progress={role.value: role_progress(observed, target, role) for role in ENGINE_ROLES},
        recorded_attempt=recorded_attempt,
        started=_verify_started_at(observed, recorded=recorded_attempt),
        recorded_step=recorded_step,
        serving_router=(
            *_serving_router_intent(observed, serving),
            *_restored_serving_router(observed, serving, recorded_step),
        ),
        present=present,
        unprotected=unprotected,
        others=unprotected if history_known else (),
    )


def plan(observed: ObservedState) -> RolloutStep:
    """The next rollout step for one ModelDeployment."""
    seen = _read_pass(observed)
    target = seen.target
    if seen.serving == target:
        # Steady state (or scaling): keep the target at spec, remove every other revision, and
        # report serving pods that lost verification (the gate already took them out).
        return seen.step(
            seen.target_up,
            seen.unprotected,
            target_serves=True,
            serving_problems=seen.serving_problems,
        )
    standing = _standing_refusal(observed, recorded=seen.recorded_attempt)
    if standing is not None:
        return _refused_step(seen, standing, new=False)
    refusal = _new_refusal(seen)
    if refusal is not None:
        return _refused_step(seen, refusal, new=True)
    if not _able_to_serve(observed, target):
        return _verifying_step(seen)
    if not content_verified(observed, target):
        # Verified engines, router Ready: the content check runs now (the handler sends the
        # probes through the target's router, records the answer and plans again).
        return _verifying_step(seen, content_check_due=True)
    if _progressive(observed) and seen.serving is not None:
        return _progressive_step(seen, seen.serving)
    return _switch_step(seen)


def _verifying_step(seen: _Pass, *, content_check_due: bool = False) -> RolloutStep:
    """The target comes up beside the serving revision, which keeps all traffic."""
    return seen.step(
        (*seen.target_up, *seen.serving_router),
        seen.others,
        serving_problems=seen.serving_problems,
        content_check_due=content_check_due,
    )


def _switch_step(seen: _Pass, check: StepCheck | None = None) -> RolloutStep:
    """All traffic to the target; the old revision is deleted on a later pass, once the
    Service's new selector has landed and the status records the target as serving."""
    return seen.step(seen.target_up, seen.others, target_serves=True, step_check=check)


def _new_refusal(seen: _Pass) -> Refusal | None:
    """The target refused on this pass: an unsafe pod, a failed content check, or no switch
    within verifyTimeoutSeconds."""
    observed, target = seen.observed, seen.target
    spec = observed.spec
    unsafe = _unsafe_pod(observed, target)
    if unsafe is not None:
        return Refusal(target, REFUSED_UNSAFE, unsafe.gate_message or unsafe.gate_reason or "")
    if spec.safety.content_probe.enabled:
        content_failure = _content_failure(observed, target)
        if content_failure is not None:
            return Refusal(target, REFUSED_CONTENT, content_failure.message)
    # Verification ends when a progressive split begins; its pauses run past the timeout.
    timeout = timedelta(seconds=spec.rollout.verify_timeout_seconds)
    if seen.recorded_step is None and observed.now - seen.started >= timeout:
        return Refusal(
            target,
            REFUSED_TIMEOUT,
            f"revision {target} not verified within rollout.verifyTimeoutSeconds="
            f"{spec.rollout.verify_timeout_seconds:,} s ({_progress_text(seen.progress)}; router "
            f"{'ready' if _router_ready(observed, target) else 'not ready'})"
            f"{_first_failure_text(observed, target)}; raise the timeout or fix the engines, "
            "then change the spec or delete the revision's Deployments to retry",
        )
    return None


def _refused_target_intents(observed: ObservedState) -> list[WorkloadIntent]:
    """A refused target's Deployments: engines scaled to zero if rollout.scaleDownRefused, and
    its routers per _refused_router_replicas."""
    return _target_intents(
        observed,
        engines_up=not observed.spec.rollout.scale_down_refused,
        routers=_refused_router_replicas(observed),
    )


def _refused_step(seen: _Pass, refusal: Refusal, *, new: bool) -> RolloutStep:
    """The serving revision keeps all traffic; ``new``: the refusal is decided on this pass."""
    return seen.step(
        (*_refused_target_intents(seen.observed), *seen.serving_router),
        seen.others,
        refusal=refusal,
        new_refusal=new,
        serving_problems=seen.serving_problems,
    )


def _progressive_step(seen: _Pass, serving: str) -> RolloutStep:
    """The target is verified and content-checked, and another revision serves: hold its share
    for each step's pause while the step check watches its routers, then switch."""
    observed, recorded = seen.observed, seen.recorded_step
    rollout = observed.spec.rollout
    if recorded is None or recorded.index >= len(rollout.steps):
        strays = [r for r in seen.present if r not in (serving, seen.target)]
        if strays:
            # A Service selecting every router of this ModelDeployment would reach theirs too.
            return seen.step(
                seen.target_up,
                seen.others,
                step_waiting=f"waiting for revisions {', '.join(strays)} to be removed before "
                "the traffic split",
            )
        return _start_split(seen, serving, 0, None)
    counters, engines = observed.target_router_counters, observed.target_engine_failures
    if counters is None or engines is None:
        what = "router" if counters is None else "engine"
        return _split_step(
            seen, serving, recorded, None, f"the target's {what} metrics are unreadable"
        )
    check = check_step(
        recorded.baseline,
        counters,
        max_error_percent=rollout.step_check.max_error_percent,
        max_rejected_percent=rollout.step_check.max_rejected_percent,
        engine_baseline=recorded.engine_baseline,
        engines=engines,
    )
    if check.failure is not None:
        return _step_check_refusal(seen, serving, recorded, check)
    return _step_holding(seen, serving, recorded, check)


def _split_step(
    seen: _Pass, serving: str, record: StepRecord, check: StepCheck | None, waiting: str
) -> RolloutStep:
    """Both revisions' routers behind the Service, in the proportion of the step's weight."""
    observed, target = seen.observed, seen.target
    rollout = observed.spec.rollout
    weight = rollout.steps[record.index].weight
    serving_routers, target_routers = split_routers(weight, rollout.max_split_routers)
    share = share_percent(_ready_routers(observed, serving), _ready_routers(observed, target))
    return seen.step(
        (
            *_target_intents(observed, engines_up=True, routers=target_routers),
            WorkloadIntent(serving, ROUTER, serving_routers),
        ),
        seen.others,
        service_split=True,
        step_record=record,
        step_check=check,
        traffic=((serving, 100 - share), (target, share)),
        step_waiting=waiting,
    )


def _start_split(seen: _Pass, serving: str, index: int, check: StepCheck | None) -> RolloutStep:
    """Begin step ``index``: record its start, the router counters the check counts from, and
    the serving revision's router replicas before any split (restored when it ends)."""
    observed, recorded = seen.observed, seen.recorded_step
    steps = observed.spec.rollout.steps
    before = (
        recorded.serving_router_replicas
        if recorded is not None
        else _router_replicas_of(observed, serving) or observed.spec.router.replicas
    )
    counters = observed.target_router_counters or ()
    # Engines unread now count from zero at the check: failures before the step would count
    # against it, never failures during it be missed.
    engines = observed.target_engine_failures or ()
    record = StepRecord(index, observed.now, counters, before, steps[index].weight, engines)
    return _split_step(seen, serving, record, check, f"step {index + 1}/{len(steps)} started")


def _step_check_refusal(
    seen: _Pass, serving: str, recorded: StepRecord, check: StepCheck
) -> RolloutStep:
    """The step check failed: refuse the target and give the serving revision all traffic."""
    observed = seen.observed
    steps = observed.spec.rollout.steps
    index = recorded.index
    return seen.step(
        (
            *_refused_target_intents(observed),
            *_restored_serving_router(observed, serving, recorded),
        ),
        seen.others,
        refusal=Refusal(
            seen.target,
            REFUSED_STEP_CHECK,
            f"step {index + 1}/{len(steps)} ({steps[index].weight} % of requests): "
            f"{check.failure}; all traffic went back to revision {serving}",
        ),
        new_refusal=True,
        step_check=check,
    )


def _step_holding(seen: _Pass, serving: str, recorded: StepRecord, check: StepCheck) -> RolloutStep:
    """The step check holds so far: wait out the step's pause and minimum requests, then start
    the next step or, after the last, switch (every step held)."""
    observed = seen.observed
    rollout = observed.spec.rollout
    index = recorded.index
    pause = rollout.steps[index].pause_seconds
    elapsed = (observed.now - recorded.started_at).total_seconds()
    if elapsed < pause:
        return _split_step(seen, serving, recorded, check, f"pause {elapsed:.0f}/{pause:,} s")
    if check.answered < rollout.step_check.min_requests:
        # Refusals are no evidence that the target serves (kvgate.rollout.progressive).
        return _split_step(
            seen,
            serving,
            recorded,
            check,
            f"waiting for {rollout.step_check.min_requests:,} answered requests "
            f"(rollout.stepCheck.minRequests), {check.answered:,} so far"
            f"{check.not_counted('do not count')}",
        )
    if index + 1 < len(rollout.steps):
        return _start_split(seen, serving, index + 1, check)
    return _switch_step(seen, check)


def _router_replicas_of(observed: ObservedState, revision: str) -> int | None:
    for w in observed.workloads:
        if w.revision == revision and w.component == ROUTER:
            return w.replicas
    return None
