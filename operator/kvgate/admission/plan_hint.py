"""What a denied pool would need: the planner's answer, appended to the admission denial."""

from __future__ import annotations

import inspect
from typing import Any

from kvgate_engine.estimator import estimate_pool
from kvgate_engine.plan import RoleFit, Shape, fit_role

from kvgate.api.models import DEFAULT_GPU_RESERVED_GIB, ModelDeploymentSpec, RoleSpec

# Spec values the admission estimate passes besides the shape, by estimate_pool parameter; only
# those this estimator takes are passed, so the planner judges a fix exactly as admission does.
_ACCEPTED = frozenset(inspect.signature(estimate_pool).parameters)


def estimator_options(
    spec: ModelDeploymentSpec, role_spec: RoleSpec, role: str | None = None
) -> dict[str, Any]:
    """What else admission gives the estimator for this role (GPU reserve, engine flags, and
    the role, which picks a DSA pool's fp8 layout). An unset reserve is kvgate's 1 GiB: admission
    passes the role with its resolved reserve (kvgate.admission.gpu_reserve)."""
    wanted: dict[str, Any] = {
        "gpu_reserved_gib": (
            DEFAULT_GPU_RESERVED_GIB
            if role_spec.gpu_reserved_gi_b is None
            else role_spec.gpu_reserved_gi_b
        ),
        "engine_args": tuple(spec.engine.args),
    }
    if role is not None:
        wanted["role"] = role
    return {name: value for name, value in wanted.items() if name in _ACCEPTED}


def fit_spec_role(
    spec: ModelDeploymentSpec, role_spec: RoleSpec, weights_gib: float, role: str | None = None
) -> RoleFit:
    """The planner's view of one role of a spec that has a config and gpuMemoryGiB."""
    assert spec.model.config is not None and role_spec.gpu_memory_gi_b is not None
    shape = Shape(
        role_spec.gpu_memory_gi_b,
        role_spec.tensor_parallel,
        spec.engine.kv_cache_dtype.value,
        role_spec.mem_fraction_static,
    )
    return fit_role(
        spec.model.config,
        shape,
        weights_gib=weights_gib,
        context_length=spec.model.context_length,
        headroom=spec.safety.headroom,
        page_size=spec.engine.page_size,
        max_total_tokens=role_spec.max_total_tokens,
        estimator_options=estimator_options(spec, role_spec, role),
    )


def pool_hint(spec: ModelDeploymentSpec, role: str, role_spec: RoleSpec, weights_gib: float) -> str:
    """`; this shape holds at most contextLength N; the smallest change that holds C: F V (...)`.

    Empty when the planner has nothing to add (or fails: admission never raises). Every change
    named is one the estimator says holds the context, so the advice passes admission.
    """
    if spec.model.config is None or role_spec.gpu_memory_gi_b is None:
        return ""
    context = spec.model.context_length
    try:
        fit = fit_spec_role(spec, role_spec, weights_gib, role)
    except Exception:  # a user's config.json can hold anything; the denial stands without it
        return ""
    hint = ""
    if fit.largest_safe_context > 0:
        hint += f"; this shape holds at most contextLength {fit.largest_safe_context:,}"
    if fit.fixes:
        hint += f"; the smallest change that holds {context:,}: {fit.fixes[0].describe(role)}"
    else:
        hint += f"; no single change to {role}'s GPUs, TP, memory fraction or KV dtype holds it"
    return hint
