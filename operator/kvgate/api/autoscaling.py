"""What ``spec.prefillPerDecode`` allows beside the roles' autoscaling bounds (pure): the prefill
counts a decode count admits, and whether any pair of counts meets them. Admission denies a spec
whose bounds no pair meets; kvgate.rollout.scaling keeps the counts it runs within them."""

from __future__ import annotations

import math

from kvgate.api.models import ModelDeploymentSpec, RoleAutoscaling


def prefill_range(
    decode: int, spec: ModelDeploymentSpec, prefill: RoleAutoscaling
) -> tuple[int, int]:
    """The prefill counts the ratio bounds and prefill's own bounds allow beside ``decode``."""
    ratio = spec.prefill_per_decode
    assert ratio is not None
    low = max(prefill.min_replicas, math.ceil(ratio.min * decode - 1e-9))
    high = min(prefill.max_replicas, math.floor(ratio.max * decode + 1e-9))
    return low, high


def ratio_conflict(spec: ModelDeploymentSpec) -> str | None:
    """Why no pair of counts within both roles' bounds satisfies spec.prefillPerDecode (None:
    some pair does, or there is nothing to satisfy)."""
    ratio, prefill, decode = (
        spec.prefill_per_decode,
        spec.prefill.autoscaling,
        spec.decode.autoscaling,
    )
    if ratio is None or prefill is None or decode is None:
        return None
    for d in range(decode.min_replicas, decode.max_replicas + 1):
        low, high = prefill_range(d, spec, prefill)
        if low <= high:
            return None
    return (
        f"spec.prefillPerDecode (min {ratio.min:g}, max {ratio.max:g}) allows no prefill count "
        f"in {prefill.min_replicas}..{prefill.max_replicas} (spec.prefill.autoscaling) beside "
        f"any decode count in {decode.min_replicas}..{decode.max_replicas} "
        "(spec.decode.autoscaling): widen the ratio bounds or the replica bounds"
    )
