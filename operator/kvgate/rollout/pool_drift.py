"""How far the admission estimate was from the live pools (pure): per role, its verified engines'
live KV pools against the estimate for the role's shape, the worst drift, and whether the
estimate was optimistic (a live pool more than the threshold below it).

Admission allows a shape on the estimate; the gate judges each engine on its live pool. When the
estimate is optimistic, admission lets through shapes whose engines may come up short and be
refused only after their GPUs were spent. The usual cause is the reserve per GPU: SGLang sizes
from the free memory it measures (the CUDA context, NCCL buffers, the driver and other tenants
are not free), and kvgate's 1 GiB default is its own assumption. The status says which reserve
would have made the estimate equal the worst live pool, so the cluster can measure its GPUs
(chart value estimator.gpuReservedGiBByProduct, docs/planning.md).

Which revision is reported: the target's, once one of its engines of the role is verified;
before that (a target being verified, refused, or scaled to zero after a refusal) the serving
revision's, from its spec in status.history, so the engines that serve keep their drift
reported; the message names the revision either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvgate_engine.estimator import GIB, Estimate
from pydantic import ValidationError

from kvgate.admission.checks import estimated_role_pool
from kvgate.admission.gpu_reserve import GpuReserve
from kvgate.admission.policy import ClusterPolicy
from kvgate.api.models import ModelDeploymentSpec, RoleSpec
from kvgate.rollout.planner import PodState
from kvgate.rollout.rollback import history_in
from kvgate.rollout.status import Event

DEFAULT_OPTIMISTIC_DRIFT_PERCENT = 10.0
MAX_PODS_SHOWN = 16  # status.<role>.poolEstimate.pods (the worst first)
EVENT_REASON = "KvPoolEstimateOptimistic"
LINEAR_LAYOUTS = ("MHA", "MLA", "DSA")  # a pool proportional to the memory left after weights


@dataclass(frozen=True)
class EstimatePolicy:
    """The operator's settings for the comparison: the cluster's measured reserves per GPU
    product (as admission takes them) and the drift below which the estimate is optimistic."""

    reserves_by_product: Mapping[str, float] = field(default_factory=dict)
    optimistic_drift_percent: float = DEFAULT_OPTIMISTIC_DRIFT_PERCENT


@dataclass(frozen=True)
class PodDrift:
    pod: str
    live_tokens: int
    drift_percent: float  # (live − estimated) / estimated × 100


@dataclass(frozen=True)
class RoleDrift:
    """One role's estimate against its verified engines' live pools (worst first)."""

    role: str
    estimated_tokens: int
    reserve: GpuReserve
    pods: tuple[PodDrift, ...]
    threshold_percent: float
    implied_reserve_gib: float | None = None  # the reserve that makes estimate == worst live
    revision: str = ""  # the revision whose engines these are ("": not said)
    serving_note: str = ""  # why the serving revision's, not the target's

    @property
    def worst(self) -> PodDrift | None:
        return self.pods[0] if self.pods else None

    @property
    def optimistic(self) -> bool:
        worst = self.worst
        return worst is not None and worst.drift_percent < -self.threshold_percent

    def message(self) -> str:
        worst = self.worst
        named = f"revision {self.revision}{self.serving_note}: " if self.revision else ""
        head = (
            f"{named}{self.role}: estimated KV pool {self.estimated_tokens:,} tokens "
            f"({self.reserve.describe()})"
        )
        if worst is None:
            return f"{head}; no verified engine to compare with yet"
        text = (
            f"{head}; the smallest live pool is {worst.live_tokens:,} tokens (pod {worst.pod}), "
            f"{worst.drift_percent:+.1f}%"
        )
        if not self.optimistic:
            return f"{text}, within {self.threshold_percent:g}% of the estimate"
        text += (
            f", more than {self.threshold_percent:g}% below the estimate: admission's estimate "
            "for this shape is optimistic and may allow shapes whose engines come up short"
        )
        if self.implied_reserve_gib is not None:
            text += (
                f"; the reserve that makes the estimate equal this pool is about "
                f"{self.implied_reserve_gib:.2f} GiB per GPU: measure it and set it for the GPU "
                f"product (chart value estimator.gpuReservedGiBByProduct) or in "
                f"spec.{self.role}.gpuReservedGiB"
            )
        return text + f"; also check that spec.{self.role}.gpuMemoryGiB is the GPU's real memory"


def _implied_reserve(
    estimate: Estimate, reserve: GpuReserve, role_spec: RoleSpec, live_tokens: int
) -> float | None:
    """The reserve per GPU at which the estimate equals ``live_tokens``: the pool of a linear
    layout grows by one token per bytes_per_token of the budget, and the budget is
    (gpuMemoryGiB − reserve) × memFractionStatic. None where the pool is not linear (hybrid
    state, a sliding window, a maxTotalTokens cap)."""
    if (
        estimate.attention not in LINEAR_LAYOUTS
        or estimate.mamba_state_gib
        or estimate.swa_pool_tokens is not None
        or role_spec.max_total_tokens is not None
        or estimate.bytes_per_token <= 0
    ):
        return None
    missing_gib = (estimate.kv_pool_tokens - live_tokens) * estimate.bytes_per_token / GIB
    implied = reserve.gib + missing_gib / role_spec.mem_fraction_static
    return implied if implied >= 0 else None


def role_drift(
    spec: ModelDeploymentSpec,
    role: str,
    pods: Sequence[PodState],
    policy: EstimatePolicy,
) -> RoleDrift | None:
    """The role's drift over its verified pods of ``pods`` (None: the spec gives no estimate)."""
    found = estimated_role_pool(
        spec, role, ClusterPolicy(gpu_reserved_gib_by_product=policy.reserves_by_product)
    )
    if found is None or found[0].kv_pool_tokens <= 0:
        return None
    estimate, reserve = found
    estimated = estimate.kv_pool_tokens
    drifts = sorted(
        (
            PodDrift(p.name, p.kv_pool_tokens, (p.kv_pool_tokens - estimated) / estimated * 100)
            for p in pods
            if p.role == role and p.verified and not p.terminating and p.kv_pool_tokens is not None
        ),
        key=lambda d: (d.drift_percent, d.pod),
    )
    role_spec = spec.prefill if role == "prefill" else spec.decode
    implied = (
        _implied_reserve(estimate, reserve, role_spec, drifts[0].live_tokens) if drifts else None
    )
    return RoleDrift(
        role, estimated, reserve, tuple(drifts), policy.optimistic_drift_percent, implied
    )


def recorded_spec(
    previous: Mapping[str, Any] | None, revision: str | None
) -> ModelDeploymentSpec | None:
    """The spec status.history recorded for ``revision`` (None: not recorded, or it no longer
    parses)."""
    for entry in history_in(previous):
        if revision is not None and entry["revision"] == revision:
            try:
                return ModelDeploymentSpec.model_validate(entry["spec"])
            except ValidationError:
                return None
    return None


def reported_drift(
    role: str,
    pods: Sequence[PodState],
    policy: EstimatePolicy,
    *,
    target: str,
    target_spec: ModelDeploymentSpec,
    serving: str | None,
    serving_spec: ModelDeploymentSpec | None,
) -> RoleDrift | None:
    """The drift status.<role>.poolEstimate reports: the target revision's once one of its
    engines of the role is verified; else the serving revision's (its recorded spec, its
    engines) when it has one; else the target's with no engine to compare."""
    on_target = role_drift(target_spec, role, [p for p in pods if p.revision == target], policy)
    if on_target is not None and on_target.worst is not None:
        return replace(on_target, revision=target)
    if serving is not None and serving != target and serving_spec is not None:
        served = [p for p in pods if p.revision == serving]
        on_serving = role_drift(serving_spec, role, served, policy)
        if on_serving is not None and on_serving.worst is not None:
            note = f" (serving; target revision {target} has no verified {role} engine)"
            return replace(on_serving, revision=serving, serving_note=note)
    return None if on_target is None else replace(on_target, revision=target)


def drift_status(drift: RoleDrift | None, previously_optimistic: bool) -> dict[str, Any] | None:
    """status.<role>.poolEstimate (camelCase); None (removes it) without an estimate. With no
    verified pod to compare (engines restarting) the last judgement stands, so a restart does
    not turn the Warning off and on again."""
    if drift is None:
        return None
    worst = drift.worst
    optimistic = drift.optimistic if worst is not None else previously_optimistic
    return {
        "estimatedKvPoolTokens": drift.estimated_tokens,
        "gpuReservedGiB": drift.reserve.gib,
        "reserveSource": drift.reserve.source[:256],
        "driftPercent": round(worst.drift_percent, 1) if worst is not None else None,
        "optimistic": optimistic,
        "optimisticDriftPercent": drift.threshold_percent,
        "pods": [
            {
                "pod": d.pod,
                "liveKvPoolTokens": d.live_tokens,
                "driftPercent": round(d.drift_percent, 1),
            }
            for d in drift.pods[:MAX_PODS_SHOWN]
        ],
        "message": drift.message(),
    }


def was_optimistic(previous: Mapping[str, Any] | None, role: str) -> bool:
    """What the previous status said of the role (an Event marks the transition only)."""
    role_status = (previous or {}).get(role) or {}
    estimate = role_status.get("poolEstimate") or {}
    return bool(estimate.get("optimistic"))


def drift_events(
    status: Mapping[str, Any], previous: Mapping[str, Any] | None, target_revision: str
) -> list[Event]:
    """A Warning for each role whose estimate turned optimistic in this pass (the message names
    the revision it is about; one that does not is the target's)."""
    events = []
    for role in ("prefill", "decode"):
        estimate = (status.get(role) or {}).get("poolEstimate") or {}
        if estimate.get("optimistic") and not was_optimistic(previous, role):
            message = str(estimate.get("message", ""))
            if not message.startswith("revision "):
                message = f"revision {target_revision}: {message}"
            events.append(Event("Warning", EVENT_REASON, message))
    return events
