"""The rollout planner: observed cluster state -> the next RolloutStep (pure, no I/O, no clock).

Everything it needs lives in the cluster, so an operator restarted mid-rollout resumes from
cluster state alone:
- the serving revision is the one the Service ``<md>`` selects;
- a target revision's verification start time is an annotation on its Deployments;
- a refusal is an annotation on the refused revision's Deployments;
- each pod's verification is its ``kvgate.io/engine-verified`` condition.

Rules (mission invariants 1-3): a target revision serves only when, for BOTH roles, at least
ceil(minVerifiedPercent% × replicas) (≥ 1) of its pods are verified and its router is Ready. A
target pod with an unsafe verdict, or no switch within verifyTimeoutSeconds, refuses the revision:
the serving revision is left untouched. Revisions that are neither serving nor target are deleted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from kvgate import gate, labels
from kvgate.api import ModelDeploymentSpec, Role

ENGINE_ROLES: tuple[Role, ...] = (Role.PREFILL, Role.DECODE)
ROUTER = labels.ROLE_ROUTER

REFUSED_UNSAFE = "EngineUnsafe"
REFUSED_TIMEOUT = "VerificationTimeout"


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


@dataclass(frozen=True)
class ObservedState:
    spec: ModelDeploymentSpec
    target_revision: str
    workloads: tuple[WorkloadState, ...]
    pods: tuple[PodState, ...]
    service_revision: str | None  # the revision the Service selects; None: no Service yet
    now: datetime


@dataclass(frozen=True)
class WorkloadIntent:
    """Make this Deployment exist with these replicas (create it if missing)."""

    revision: str
    component: str
    replicas: int


@dataclass(frozen=True)
class Refusal:
    revision: str
    reason: str
    message: str


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
    target_router_ready: bool = False

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


def _live_pods(pods: tuple[PodState, ...], revision: str, role: str) -> list[PodState]:
    return [p for p in pods if p.revision == revision and p.role == role and not p.terminating]


def role_progress(observed: ObservedState, revision: str, role: Role) -> RoleProgress:
    pods = _live_pods(observed.pods, revision, role.value)
    verified = [p for p in pods if p.verified]
    pools = [p.kv_pool_tokens for p in verified if p.kv_pool_tokens is not None]
    replicas = role_replicas(observed.spec, role)
    return RoleProgress(
        replicas=replicas,
        needed=needed_verified(replicas, observed.spec.rollout.min_verified_percent),
        verified=len(verified),
        ready=sum(1 for p in pods if p.ready),
        min_verified_kv_pool_tokens=min(pools) if pools else None,
    )


def _router_ready(observed: ObservedState, revision: str) -> bool:
    return any(
        w.revision == revision and w.component == ROUTER and w.ready_replicas > 0
        for w in observed.workloads
    )


def _workloads_of(observed: ObservedState, revision: str) -> list[WorkloadState]:
    return [w for w in observed.workloads if w.revision == revision]


def _serving_revision(observed: ObservedState) -> str | None:
    """The Service's revision, if it still has workloads (or is the target, to be rebuilt)."""
    rev = observed.service_revision
    if rev is None:
        return None
    if rev == observed.target_revision or _workloads_of(observed, rev):
        return rev
    return None


def _standing_refusal(observed: ObservedState) -> Refusal | None:
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
    )


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


def _target_intents(observed: ObservedState, *, engines_up: bool) -> list[WorkloadIntent]:
    spec = observed.spec
    rev = observed.target_revision
    intents = [
        WorkloadIntent(rev, role.value, role_replicas(spec, role) if engines_up else 0)
        for role in ENGINE_ROLES
    ]
    intents.append(WorkloadIntent(rev, ROUTER, spec.router.replicas if engines_up else 0))
    return intents


def plan(observed: ObservedState) -> RolloutStep:
    """The next rollout step for one ModelDeployment."""
    spec = observed.spec
    target = observed.target_revision
    serving = _serving_revision(observed)
    present = sorted({w.revision for w in observed.workloads})
    progress = {role.value: role_progress(observed, target, role) for role in ENGINE_ROLES}
    starts = [w.verify_started_at for w in _workloads_of(observed, target) if w.verify_started_at]
    started = min(starts) if starts else observed.now

    def step(**kwargs: object) -> RolloutStep:
        base: dict[str, object] = {
            "target_revision": target,
            "serving_revision": serving,
            "previous_serving_revision": serving,
            "workloads": (),
            "delete_revisions": (),
            "service_revision": serving,
            "refusal": None,
            "new_refusal": False,
            "verify_started_at": started,
            "progress": progress,
            "serving_problems": (),
            "target_problems": _gate_failures(observed, target),
            "target_router_ready": _router_ready(observed, target),
        }
        base.update(kwargs)
        return RolloutStep(**base)  # type: ignore[arg-type]

    others = tuple(r for r in present if r not in (target, serving))

    if serving == target:
        # Steady state (or scaling): keep the target at spec, remove every other revision, and
        # report serving pods that lost verification (the gate already took them out).
        return step(
            workloads=tuple(_target_intents(observed, engines_up=True)),
            delete_revisions=tuple(r for r in present if r != target),
            service_revision=target,
            serving_problems=_gate_failures(observed, target),
        )

    serving_problems = _gate_failures(observed, serving)

    standing = _standing_refusal(observed)
    if standing is not None:
        return step(
            workloads=tuple(
                _target_intents(observed, engines_up=not spec.rollout.scale_down_refused)
            ),
            delete_revisions=others,
            refusal=standing,
            serving_problems=serving_problems,
        )

    unsafe = _unsafe_pod(observed, target)
    timed_out = observed.now - started >= timedelta(seconds=spec.rollout.verify_timeout_seconds)
    refusal: Refusal | None = None
    if unsafe is not None:
        refusal = Refusal(target, REFUSED_UNSAFE, unsafe.gate_message or unsafe.gate_reason or "")
    elif timed_out:
        refusal = Refusal(
            target,
            REFUSED_TIMEOUT,
            f"revision {target} not verified within rollout.verifyTimeoutSeconds="
            f"{spec.rollout.verify_timeout_seconds:,} s ({_progress_text(progress)}; router "
            f"{'ready' if _router_ready(observed, target) else 'not ready'}); raise the "
            "timeout or fix the engines, then change the spec or delete the revision's "
            "Deployments to retry",
        )
    if refusal is not None:
        return step(
            workloads=tuple(
                _target_intents(observed, engines_up=not spec.rollout.scale_down_refused)
            ),
            delete_revisions=others,
            refusal=refusal,
            new_refusal=True,
            serving_problems=serving_problems,
        )

    both_verified = all(p.verified >= p.needed for p in progress.values())
    if both_verified and _router_ready(observed, target):
        # Switch traffic; old revisions are deleted on the next step, once the Service write
        # has landed (serving == target then).
        return step(
            serving_revision=target,
            workloads=tuple(_target_intents(observed, engines_up=True)),
            delete_revisions=others,
            service_revision=target,
        )

    return step(
        workloads=tuple(_target_intents(observed, engines_up=True)),
        delete_revisions=others,
        serving_problems=serving_problems,
    )
