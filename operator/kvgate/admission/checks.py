"""The admission checks: a raw ModelDeployment document in, a decision out. Pure; never raises.

Used by the validating webhook and by `kvgate validate`. Each check names the field, the numbers
and the way out. What admission cannot know (no config, no GPU size, an unversioned image tag)
becomes a warning: the live verification of every engine still applies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvgate_engine.estimator import (
    Estimate,
    EstimateError,
    NoRoomForKvCache,
    SlidingWindowPoolTooSmall,
    check_sizes,
    derive_context_length,
    estimate_pool,
    estimate_weights_gib,
    fitting_tensor_parallel,
    kv_cache_dtype_problem,
    tensor_parallel_mismatch,
)
from kvgate_engine.launcher import image_version
from kvgate_engine.sglang_choices import NEWEST_CHECKED
from kvgate_engine.verdict import required_pool_tokens as _required_pool_tokens
from packaging.version import InvalidVersion, Version

from kvgate.admission.engine_args import check_engine
from kvgate.admission.engine_flags import check_engine_flag_values
from kvgate.admission.gpu_reserve import GpuReserve, resolve_reserve, with_reserve
from kvgate.admission.host_paths import check_host_paths
from kvgate.admission.limits import size_message
from kvgate.admission.model_source import check_model_source
from kvgate.admission.plan_hint import pool_hint
from kvgate.admission.pod_fit import check_pod_fit
from kvgate.admission.policy import FLOOR_SETTING, ClusterPolicy
from kvgate.admission.result import AdmissionResult, Problem
from kvgate.admission.router_args import denial_message, denied_flag
from kvgate.admission.schema import parse_model, show_value
from kvgate.admission.shape import check_group_names, check_shape
from kvgate.api.autoscaling import ratio_conflict
from kvgate.api.models import (
    API_VERSION,
    DEFAULT_GPU_RESERVED_GIB,
    DEFAULT_MIN_ENGINE_VERSION,
    KIND,
    MAX_GPUS_PER_NODE,
    KvCacheDtype,
    ModelDeploymentSpec,
    Role,
    RoleSpec,
)
from kvgate.objects import names

ALLOW_LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
MARGIN_WARNING = 0.10  # warn when the estimated pool is less than 10 % above the requirement

Check = Callable[[ModelDeploymentSpec, ClusterPolicy], tuple[list[Problem], list[Problem]]]


def _n(value: int) -> str:
    return f"{value:,}"


def _gib(value: float) -> str:
    return f"{value:g}"


def required_pool_tokens(spec: ModelDeploymentSpec) -> int | None:
    """ceil(contextLength × headroom), or None when the product is not a finite number."""
    return _required_pool_tokens(spec.model.context_length, spec.safety.headroom)


def _requirement_text(spec: ModelDeploymentSpec) -> str:
    return f"contextLength {_n(spec.model.context_length)} × headroom {spec.safety.headroom!r}"


def check_identity(document: Mapping[str, Any]) -> list[Problem]:
    """apiVersion and kind: this webhook and `kvgate validate` check ModelDeployments only."""
    problems = []
    for key, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
        value = document.get(key)
        if value is None:
            problems.append(Problem(key, f"required; add `{key}: {expected}`"))
        elif value != expected:
            problems.append(
                Problem(
                    key,
                    f"must be {expected} (got {show_value(value)}); kvgate checks "
                    f"{API_VERSION} {KIND} objects only",
                )
            )
    return problems


def check_metadata(document: Mapping[str, Any]) -> list[Problem]:
    """metadata.name: a DNS-1035 label short enough for every name kvgate derives from it (the
    API server accepts any DNS-1123 subdomain for a ModelDeployment, but not for its Service)."""
    metadata = document.get("metadata")
    if not isinstance(metadata, Mapping):
        return []  # absent, or the schema check reports it
    name = metadata.get("name")
    if name is None:
        return []
    if not isinstance(name, str) or not names.DNS_1035_LABEL.fullmatch(name):
        suggestion = names.suggest_name(name) if isinstance(name, str) else None
        example = suggestion if suggestion and suggestion != name else "llama-3-1-8b"
        return [
            Problem(
                "metadata.name",
                f"must be a DNS-1035 label (got {show_value(name)}): lowercase letters, digits "
                "and '-', starting with a letter and ending with a letter or digit, because "
                f"kvgate names the Service after it; rename it, e.g. {example}",
            )
        ]
    longest = names.max_name_length()
    too_long = names.binding_names(name)
    if too_long:
        which = " and ".join(
            f"the {d.what} {d.name if d.name != name else '<name>'} (at most {d.max_length})"
            for d in too_long
        )
        return [
            Problem(
                "metadata.name",
                f"{len(name):,} characters > {longest}: kvgate derives {which} from it; use a "
                f"shorter name, at most {longest} characters",
            )
        ]
    return []


def check_size(document: Mapping[str, Any]) -> list[Problem]:
    """The spec must fit where Kubernetes keeps copies of it (see kvgate.admission.limits)."""
    spec = document.get("spec")
    if not isinstance(spec, Mapping):
        return []
    try:
        message = size_message(spec)
    except (TypeError, ValueError, RecursionError):
        return []  # not JSON: the schema check says so
    return [Problem("spec", message)] if message else []


def check_router_args(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """router.args must not add workers, change discovery or auth, or move the listener."""
    denials = []
    for index, arg in enumerate(spec.router.args):
        flag = denied_flag(arg)
        if flag is not None:
            denials.append(Problem(f"spec.router.args[{index}]", denial_message(arg, flag)))
    return denials, []


def check_finite(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """Numbers the schema lets through as infinity (YAML `.inf`) but no GPU can honour."""
    fields: list[tuple[str, float | None]] = [
        ("spec.safety.headroom", spec.safety.headroom),
        ("spec.model.weightsGiB", spec.model.weights_gi_b),
        ("spec.prefill.gpuMemoryGiB", spec.prefill.gpu_memory_gi_b),
        ("spec.decode.gpuMemoryGiB", spec.decode.gpu_memory_gi_b),
    ]
    denials = [
        Problem(path, f"must be a finite number (got {value!r}); write a number")
        for path, value in fields
        if value is not None and not math.isfinite(value)
    ]
    if not denials and required_pool_tokens(spec) is None:
        denials.append(
            Problem(
                "spec.safety.headroom",
                f"{_requirement_text(spec)} is too large to compute; lower contextLength or "
                "headroom",
            )
        )
    if not denials:
        denials += _role_size_problems(spec, policy)
    return denials, []


# estimate_pool's parameters as a role's spec fields.
_ROLE_FIELDS = {
    "gpu_memory_gib": "gpuMemoryGiB",
    "gpu_reserved_gib": "gpuReservedGiB",
    "tp": "tensorParallel",
    "mem_fraction_static": "memFractionStatic",
    "max_total_tokens": "maxTotalTokens",
}


def _role_size_problems(spec: ModelDeploymentSpec, policy: ClusterPolicy) -> list[Problem]:
    """The estimator's rules for each role's sizes (kvgate_engine.estimator.check_sizes, which
    `kvgate estimate` and `kvgate plan` apply too): what the schema cannot bound, such as a GPU
    larger than any, or a reserve that takes the whole GPU."""
    problems = []
    for role, role_spec in _roles(spec):
        if role_spec.gpu_memory_gi_b is None:
            continue
        reserve = role_reserve(role, role_spec, policy)
        try:
            check_sizes(
                gpu_memory_gib=role_spec.gpu_memory_gi_b,
                tp=role_spec.tensor_parallel,
                mem_fraction_static=role_spec.mem_fraction_static,
                page_size=spec.engine.page_size,
                gpu_reserved_gib=reserve.gib,
                weights_gib=spec.model.weights_gi_b,
                max_total_tokens=role_spec.max_total_tokens,
            )
        except EstimateError as error:
            if error.parameter in _ROLE_FIELDS:
                field = f"spec.{role}.{_ROLE_FIELDS[error.parameter]}"
            else:
                field = {"page_size": "spec.engine.pageSize"}.get(
                    error.parameter, "spec.model.weightsGiB"
                )
            message = str(error)
            if error.parameter == "gpu_reserved_gib":
                message += f" ({reserve.describe()})"
            problems.append(Problem(field, message))
    return problems


def check_tensor_parallel_heads(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """Each role's tensorParallel is one the model's attention heads allow: SGLang asserts it at
    start-up (the estimator's rule, kvgate_engine.estimator.tensor_parallel_mismatch)."""
    config = spec.model.config
    if config is None:
        return [], []
    node_gpus = policy.gpus_per_node or MAX_GPUS_PER_NODE
    denials = []
    for role, role_spec in _roles(spec):
        try:
            mismatch = tensor_parallel_mismatch(config, role_spec.tensor_parallel)
            if mismatch is None:
                continue
            way = fitting_tensor_parallel(
                config, node_gpus * role_spec.nodes, multiple_of=role_spec.nodes
            )
        except Exception:  # a user's config.json can hold anything; the engine still verifies
            continue
        denials.append(
            Problem(
                f"spec.{role}.tensorParallel",
                f"{mismatch.explain('spec.model.config ')}; set {role}.tensorParallel to {way}",
            )
        )
    return denials, []


def _check_cluster_floor(spec: ModelDeploymentSpec, policy: ClusterPolicy) -> list[Problem]:
    cluster = policy.floor
    if cluster is None:
        return []
    try:
        spec_floor = Version(spec.safety.min_engine_version)
    except InvalidVersion:
        return []  # reported by check_engine_version
    if spec_floor >= cluster:
        return []
    omitted = (
        f"; an omitted minEngineVersion is {DEFAULT_MIN_ENGINE_VERSION}, also below it"
        if Version(DEFAULT_MIN_ENGINE_VERSION) < cluster
        else ""
    )
    return [
        Problem(
            "spec.safety.minEngineVersion",
            f"{spec_floor} < the cluster's engine version floor {cluster} (chart value "
            f"{FLOOR_SETTING}, set by the cluster admin{omitted}); set "
            f"spec.safety.minEngineVersion to {cluster} or later",
        )
    ]


def check_engine_version(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """safety.minEngineVersion at or above the cluster floor; the image tag's version at or
    above both."""
    try:
        spec_floor = Version(spec.safety.min_engine_version)
    except InvalidVersion:
        return [
            Problem(
                "spec.safety.minEngineVersion",
                f"not a version (got {show_value(spec.safety.min_engine_version)}); "
                "set a version such as 0.5.22",
            )
        ], []
    denials = _check_cluster_floor(spec, policy)
    cluster = policy.floor
    if cluster is not None and cluster > spec_floor:
        floor, floor_text = cluster, f"the cluster's engine version floor {cluster}"
    else:
        floor, floor_text = spec_floor, f"safety.minEngineVersion {spec_floor}"
    image = spec.engine.image
    tagged = image_version(image)
    unchecked = (
        f"admission cannot check it against {floor_text} (the live engine still is); pin a "
        "tag such as v0.5.23"
    )
    if tagged is None:
        return denials, [Problem("spec.engine.image", f"{image} names no version, so {unchecked}")]
    try:
        version = Version(tagged)
    except InvalidVersion:
        return denials, [
            Problem(
                "spec.engine.image", f"{image}: tag version {tagged!r} is unreadable; {unchecked}"
            )
        ]
    if version < floor:
        denials.append(
            Problem(
                "spec.engine.image",
                f"{image} is SGLang {version} < {floor_text} (earlier disaggregated SGLang can "
                f"hand stale KV pages to decode); use an image at {floor} or later, e.g. "
                "lmsysorg/sglang:v0.5.23",
            )
        )
    return denials, []


def check_max_total_tokens(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """A role's --max-total-tokens cap must leave room for the whole context."""
    required = required_pool_tokens(spec)
    denials = []
    for role, role_spec in _roles(spec):
        cap = role_spec.max_total_tokens
        if required is not None and cap is not None and cap < required:
            denials.append(
                Problem(
                    f"spec.{role}.maxTotalTokens",
                    f"{_n(cap)} < {_requirement_text(spec)} = {_n(required)}; raise "
                    f"{role}.maxTotalTokens to at least {_n(required)} or remove it",
                )
            )
    return denials, []


def _allows_longer_context(spec: ModelDeploymentSpec) -> bool:
    """Every role's engines run with the variable set: engine.env, then the role's extraEnv."""

    def allowed(role_spec: RoleSpec) -> bool:
        env = _engine_env(spec, role_spec)
        return env.get(ALLOW_LONGER_CONTEXT_ENV, "").lower() in ("1", "true")

    return all(allowed(role_spec) for _, role_spec in _roles(spec))


def _engine_env(spec: ModelDeploymentSpec, role_spec: RoleSpec) -> dict[str, str]:
    """A role's engine environment: spec.engine.env, then the role's extraEnv (the later wins,
    as in the pod); a variable with no value is empty."""
    return {e.name: e.value or "" for e in [*spec.engine.env, *role_spec.extra_env]}


def check_context_length(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """contextLength above the model config's own limit: SGLang refuses to start."""
    config = spec.model.config
    if config is None:
        return [], []
    release = image_version(spec.engine.image) or NEWEST_CHECKED
    try:
        derived = derive_context_length(config, release)
    except Exception as error:  # a user's config.json can hold anything
        return [], [
            Problem(
                "spec.model.config",
                f"cannot derive the model's context length: {error}; contextLength "
                f"{_n(spec.model.context_length)} is not checked against it",
            )
        ]
    requested = spec.model.context_length
    if requested <= derived:
        return [], []
    if _allows_longer_context(spec):
        return [], [
            Problem(
                "spec.model.contextLength",
                f"{_n(requested)} > {_n(derived)}, the context the model's config supports; "
                f"allowed because engine env sets {ALLOW_LONGER_CONTEXT_ENV}=1, but output "
                f"beyond {_n(derived)} tokens may degrade",
            )
        ]
    return [
        Problem(
            "spec.model.contextLength",
            f"{_n(requested)} > {_n(derived)}, the context the model's config supports "
            f"as SGLang {release} derives it (it refuses to start); lower contextLength to at most "
            f"{_n(derived)}, or set engine env {ALLOW_LONGER_CONTEXT_ENV}=1",
        )
    ], []


def _roles(spec: ModelDeploymentSpec) -> list[tuple[str, RoleSpec]]:
    return [(Role.PREFILL.value, spec.prefill), (Role.DECODE.value, spec.decode)]


def role_reserve(role: str, role_spec: RoleSpec, policy: ClusterPolicy) -> GpuReserve:
    """The GPU reserve the role's estimate takes, and where it came from."""
    return resolve_reserve(role, role_spec, policy.gpu_reserved_gib_by_product)


def _estimate_inputs(
    spec: ModelDeploymentSpec,
) -> tuple[dict[str, Any] | None, float | None, list[Problem]]:
    """The model config and weights the estimate needs (the weights computed from the config
    when the spec leaves them out), and a warning naming each input that is not set."""
    config = spec.model.config
    weights_gib = spec.model.weights_gi_b
    missing: list[str] = []
    if config is None:
        missing.append("spec.model.config")
    elif weights_gib is None:
        try:
            weights_gib = estimate_weights_gib(config)
        except Exception:  # a user's config.json can hold anything
            weights_gib = None
        if weights_gib is None:
            missing.append("spec.model.weightsGiB (the config does not give it)")
    missing += [
        f"spec.{role}.gpuMemoryGiB" for role, r in _roles(spec) if r.gpu_memory_gi_b is None
    ]
    if not missing:
        return config, weights_gib, []
    warning = Problem(
        "spec",
        f"cannot estimate the KV pool, not set: {', '.join(missing)}; set them for an "
        "admission-time estimate (the live engines are verified either way)",
    )
    return config, weights_gib, [warning]


def _estimate_role(
    spec: ModelDeploymentSpec,
    role: str,
    role_spec: RoleSpec,
    config: dict[str, Any],
    gpu_memory_gib: float,
    weights_gib: float,
) -> Estimate:
    """The estimator's answer for one role's engines (prefill or decode)."""
    return estimate_pool(
        config,
        gpu_memory_gib=gpu_memory_gib,
        tp=role_spec.tensor_parallel,
        mem_fraction_static=role_spec.mem_fraction_static,
        kv_cache_dtype=spec.engine.kv_cache_dtype.value,
        page_size=spec.engine.page_size,
        weights_gib=weights_gib,
        max_total_tokens=role_spec.max_total_tokens,
        gpu_reserved_gib=(
            DEFAULT_GPU_RESERVED_GIB
            if role_spec.gpu_reserved_gi_b is None
            else role_spec.gpu_reserved_gi_b
        ),
        engine_args=spec.engine.args,
        role=role,
        release=image_version(spec.engine.image),
        engine_env=_engine_env(spec, role_spec),
    )


def _no_room_denial(
    spec: ModelDeploymentSpec,
    role: str,
    role_spec: RoleSpec,
    gpu_memory_gib: float,
    weights_gib: float,
    reserve: GpuReserve,
) -> Problem:
    """The weights alone fill the role's KV budget: the arithmetic, and what to raise."""
    reserved = reserve.gib
    budget = (gpu_memory_gib - reserved) * role_spec.mem_fraction_static
    return Problem(
        f"spec.{role}",
        f"the weights leave no room for a KV pool: (gpuMemoryGiB "
        f"{_gib(gpu_memory_gib)} − gpuReservedGiB {_gib(reserved)}, from {reserve.source}) × "
        f"memFractionStatic "
        f"{role_spec.mem_fraction_static:g} = {budget:,.2f} GiB per GPU, weights "
        f"{_gib(weights_gib)} GiB / tensorParallel {role_spec.tensor_parallel} = "
        f"{weights_gib / role_spec.tensor_parallel:,.2f} GiB per GPU; raise "
        f"{role}.tensorParallel, {role}.memFractionStatic or {role}.gpuMemoryGiB"
        + pool_hint(spec, role, role_spec, weights_gib),
    )


def _sliding_window_denial(
    spec: ModelDeploymentSpec,
    role: str,
    role_spec: RoleSpec,
    error: SlidingWindowPoolTooSmall,
    weights_gib: float,
) -> Problem:
    """The weights fit, but the sliding-window (or chunked) pool is at or below one window and
    a page, which SGLang refuses to start with: the numbers, and the fields that enlarge it."""
    return Problem(
        f"spec.{role}",
        f"{role} engines would not start: the estimated sliding-window pool "
        f"{_n(error.swa_pool_tokens)} tokens (swa-full-tokens-ratio {error.ratio:g} of the "
        f"full pool) is at or below {error.window_name} {_n(error.window)} + page "
        f"{_n(error.page)} = {_n(error.window + error.page)} tokens, and SGLang refuses to "
        f"start an engine whose pool cannot hold one request's window; raise "
        f"{role}.memFractionStatic, {role}.gpuMemoryGiB or {role}.tensorParallel, or pass a "
        f"higher --swa-full-tokens-ratio in spec.engine.args"
        + pool_hint(spec, role, role_spec, weights_gib),
    )


def _pool_too_small_denial(
    spec: ModelDeploymentSpec,
    role: str,
    role_spec: RoleSpec,
    pool: int,
    required: int,
    weights_gib: float,
    reserve: GpuReserve,
    resolved_dtype: str = "",
) -> Problem:
    """The estimated pool is below contextLength × headroom: the ways to enlarge it (fp8 only
    where the engine does not run fp8 already: ``resolved_dtype`` is the estimate's)."""
    ways = [f"raise {role}.gpuMemoryGiB or {role}.memFractionStatic"]
    if spec.engine.kv_cache_dtype in (
        KvCacheDtype.AUTO,
        KvCacheDtype.BFLOAT16,
        KvCacheDtype.BF16,
        KvCacheDtype.FLOAT16,
    ) and not resolved_dtype.startswith("fp8"):
        ways.append("use kvCacheDtype fp8_e4m3")
    ways.append("or lower contextLength")
    needed = _requirement_text(spec)
    if spec.safety.headroom != 1.0:
        needed += f" = {_n(required)}"
    return Problem(
        f"spec.{role}",
        f"estimated KV pool {_n(pool)} tokens < {needed} (estimated with {reserve.describe()}); "
        + ", ".join(ways)
        + pool_hint(spec, role, role_spec, weights_gib),
    )


def _thin_margin_warning(spec: ModelDeploymentSpec, role: str, pool: int, required: int) -> Problem:
    """The estimated pool holds the requirement by less than MARGIN_WARNING."""
    margin = (pool - required) / required * 100
    return Problem(
        f"spec.{role}",
        f"estimated KV pool {_n(pool)} tokens is only {margin:.1f}% above "
        f"{_requirement_text(spec)}; the live pool may come out smaller — leave a "
        f"10% margin (raise {role}.gpuMemoryGiB or {role}.memFractionStatic)",
    )


def check_estimated_pool(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """The estimator's KV pool per role against contextLength × headroom."""
    required = required_pool_tokens(spec)
    if required is None:
        return [], []
    config, weights_gib, warnings = _estimate_inputs(spec)
    denials: list[Problem] = []
    if config is None or weights_gib is None:
        return denials, warnings
    # A role whose maxTotalTokens cap is already denied is not estimated again.
    capped = {p.field for p in check_max_total_tokens(spec, policy)[0]}
    notes: set[str] = set()
    for role, given in _roles(spec):
        gpu_memory_gib = given.gpu_memory_gi_b
        if gpu_memory_gib is None or f"spec.{role}.maxTotalTokens" in capped:
            continue
        reserve = role_reserve(role, given, policy)
        role_spec = with_reserve(given, reserve)
        try:
            estimate = _estimate_role(spec, role, role_spec, config, gpu_memory_gib, weights_gib)
            pool = estimate.kv_pool_tokens
            notes.update(estimate.notes)
        except SlidingWindowPoolTooSmall as error:
            denials.append(_sliding_window_denial(spec, role, role_spec, error, weights_gib))
            continue
        except NoRoomForKvCache as error:
            if error.parameter == "engine_args":  # a state the engine flags size fills the GPU
                denials.append(Problem("spec.engine.args", f"{role} engines: {error}"))
            else:
                denials.append(
                    _no_room_denial(spec, role, role_spec, gpu_memory_gib, weights_gib, reserve)
                )
            continue
        except Exception as error:  # EstimateError, or a config the estimator chokes on
            if not _denied_elsewhere(spec, role_spec, error):
                warnings.append(_not_estimated_warning(role, error))
            continue
        if pool < required:
            denials.append(
                _pool_too_small_denial(
                    spec,
                    role,
                    role_spec,
                    pool,
                    required,
                    weights_gib,
                    reserve,
                    estimate.kv_cache_dtype,
                )
            )
        elif pool < required * (1 + MARGIN_WARNING):
            warnings.append(_thin_margin_warning(spec, role, pool, required))
    warnings += [
        Problem("spec.model.config", f"{note}; the live engines are verified either way")
        for note in sorted(notes)
    ]
    return denials, warnings


# The spec field behind an estimate_pool input that admission does not take from the role.
_ESTIMATE_INPUT_FIELDS = {
    "release": "spec.engine.image",
    "engine_args": "spec.engine.args",
    "engine_env": "spec.engine.env or spec.{role}.extraEnv",
}


def _not_estimated_warning(role: str, error: Exception) -> Problem:
    """Why a role's pool is not estimated, on the field at fault: the input the estimator names
    (the image's release, the engine args or env), else the role."""
    parameter = error.parameter if isinstance(error, EstimateError) else ""
    field = _ESTIMATE_INPUT_FIELDS.get(parameter, "spec.{role}").format(role=role)
    who = "" if field == f"spec.{role}" else f"{role} engines: "
    return Problem(field, f"{who}cannot estimate the KV pool: {error}")


def _denied_elsewhere(spec: ModelDeploymentSpec, role_spec: RoleSpec, error: Exception) -> bool:
    """The estimator refused what another check denies (a TP the heads do not allow, a KV dtype
    no release accepts): the denial is the whole answer, with no estimate warning beside it."""
    if not isinstance(error, EstimateError) or spec.model.config is None:
        return False
    if error.parameter == "tp":
        return tensor_parallel_mismatch(spec.model.config, role_spec.tensor_parallel) is not None
    if error.parameter == "kv_cache_dtype":
        return kv_cache_dtype_problem(spec.engine.kv_cache_dtype.value) is not None
    return False


@dataclass(frozen=True)
class RoleEstimate:
    """What the estimator predicts for one role of an admitted spec (`kvgate validate`)."""

    role: str
    kv_pool_tokens: int
    required_pool_tokens: int
    context_length: int
    headroom: float
    gpu_memory_gib: float
    tensor_parallel: int
    kv_cache_dtype: str  # as SGLang resolves it
    mem_fraction_static: float
    weights_gib: float
    reserve: GpuReserve

    def describe(self) -> str:
        margin = (self.kv_pool_tokens / self.required_pool_tokens - 1) * 100
        return (
            f"{self.role} KV pool {self.kv_pool_tokens:,} tokens per engine ≥ "
            f"{self.required_pool_tokens:,} required (contextLength {self.context_length:,} × "
            f"headroom {self.headroom!r}), margin {margin:+.1f}%; {self.gpu_memory_gib:g} GiB × "
            f"TP {self.tensor_parallel}, {self.kv_cache_dtype}, memFractionStatic "
            f"{self.mem_fraction_static:g}, weights {self.weights_gib:.4g} GiB, "
            f"{self.reserve.describe()} (an estimate: every live engine is verified)"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "role": self.role,
            "kv_pool_tokens": self.kv_pool_tokens,
            "required_pool_tokens": self.required_pool_tokens,
            "gpu_memory_gib": self.gpu_memory_gib,
            "tensor_parallel": self.tensor_parallel,
            "kv_cache_dtype": self.kv_cache_dtype,
            "mem_fraction_static": self.mem_fraction_static,
            "weights_gib": self.weights_gib,
            "gpu_reserved_gib": self.reserve.gib,
            "gpu_reserved_gib_source": self.reserve.source,
        }


def role_estimates(document: object, policy: ClusterPolicy | None = None) -> list[RoleEstimate]:
    """The estimate behind an allowed document's pool check, per role that has one (none when
    the spec lacks what the estimate needs; the warnings say which). Never raises."""
    policy = policy if policy is not None else ClusterPolicy()
    try:
        if not isinstance(document, Mapping):
            return []
        model, _ = parse_model(document)
        if model is None:
            return []
        spec = model.spec
        required = required_pool_tokens(spec)
        config, weights_gib, _ = _estimate_inputs(spec)
        if required is None or config is None or weights_gib is None:
            return []
        found = []
        for role, given in _roles(spec):
            gpu_memory_gib = given.gpu_memory_gi_b
            if gpu_memory_gib is None:
                continue
            reserve = role_reserve(role, given, policy)
            role_spec = with_reserve(given, reserve)
            estimate = _estimate_role(spec, role, role_spec, config, gpu_memory_gib, weights_gib)
            found.append(
                RoleEstimate(
                    role=role,
                    kv_pool_tokens=estimate.kv_pool_tokens,
                    required_pool_tokens=required,
                    context_length=spec.model.context_length,
                    headroom=spec.safety.headroom,
                    gpu_memory_gib=gpu_memory_gib,
                    tensor_parallel=role_spec.tensor_parallel,
                    kv_cache_dtype=estimate.kv_cache_dtype,
                    mem_fraction_static=role_spec.mem_fraction_static,
                    weights_gib=estimate.weights_gib,
                    reserve=reserve,
                )
            )
        return found
    except Exception:  # a spec the estimator cannot size was warned about by the checks
        return []


def estimated_role_pool(
    spec: ModelDeploymentSpec, role: str, policy: ClusterPolicy
) -> tuple[Estimate, GpuReserve] | None:
    """The estimate admission judges ``role`` by, with the reserve it took; None when the spec
    lacks an input (config, weights, gpuMemoryGiB) or the estimator cannot size it. Never
    raises."""
    given = spec.prefill if role == Role.PREFILL.value else spec.decode
    gpu_memory_gib = given.gpu_memory_gi_b
    config, weights_gib, _ = _estimate_inputs(spec)
    if gpu_memory_gib is None or config is None or weights_gib is None:
        return None
    reserve = role_reserve(role, given, policy)
    try:
        estimate = _estimate_role(
            spec, role, with_reserve(given, reserve), config, gpu_memory_gib, weights_gib
        )
    except Exception:  # a spec the estimator cannot size was warned about at admission
        return None
    return estimate, reserve


def check_autoscaling(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """Autoscaling bounds a count can meet: min <= max, replicas within them, single-node roles
    only, and ratio bounds that some pair of counts satisfies."""
    denials: list[Problem] = []
    for role, role_spec in _roles(spec):
        bounds = role_spec.autoscaling
        if bounds is None:
            continue
        where = f"spec.{role}.autoscaling"
        if bounds.min_replicas > bounds.max_replicas:
            denials.append(
                Problem(
                    f"{where}.minReplicas",
                    f"{bounds.min_replicas} is above maxReplicas {bounds.max_replicas}; lower "
                    "minReplicas or raise maxReplicas",
                )
            )
        elif not bounds.min_replicas <= role_spec.replicas <= bounds.max_replicas:
            denials.append(
                Problem(
                    f"spec.{role}.replicas",
                    f"{role_spec.replicas} is outside {where} {bounds.min_replicas}.."
                    f"{bounds.max_replicas} (replicas is the count its RoleScale starts at); "
                    f"set replicas within {bounds.min_replicas}..{bounds.max_replicas}",
                )
            )
        if role_spec.nodes > 1:
            denials.append(
                Problem(
                    where,
                    f"a multi-node role (nodes {role_spec.nodes}: each engine is a "
                    "LeaderWorkerSet group) cannot be autoscaled: kvgate drains and removes "
                    "single pods only; remove autoscaling and set replicas, or use nodes: 1",
                )
            )
    ratio = spec.prefill_per_decode
    if ratio is not None:
        if spec.prefill.autoscaling is None or spec.decode.autoscaling is None:
            denials.append(
                Problem(
                    "spec.prefillPerDecode",
                    "bounds the ratio of two autoscaled roles, but "
                    + " and ".join(
                        f"spec.{r}.autoscaling" for r, rs in _roles(spec) if rs.autoscaling is None
                    )
                    + " is not set; set autoscaling on both roles or remove prefillPerDecode",
                )
            )
        elif ratio.min > ratio.max:
            denials.append(
                Problem(
                    "spec.prefillPerDecode.min",
                    f"{ratio.min:g} is above prefillPerDecode.max {ratio.max:g}; swap them",
                )
            )
        elif not denials and (conflict := ratio_conflict(spec)) is not None:
            denials.append(Problem("spec.prefillPerDecode", conflict))
    return denials, []


def check_host_paths_allowed(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """The node directories the spec mounts against the cluster admin's allow-lists."""
    return check_host_paths(spec, policy.host_paths), []


CHECKS: tuple[Check, ...] = (
    check_finite,
    check_shape,
    check_tensor_parallel_heads,
    check_engine_version,
    check_engine_flag_values,
    check_max_total_tokens,
    check_context_length,
    check_estimated_pool,
    check_router_args,
    check_engine,
    check_model_source,
    check_host_paths_allowed,
    check_autoscaling,
    check_pod_fit,
)


def _check(document: object, policy: ClusterPolicy) -> AdmissionResult:
    if not isinstance(document, Mapping):
        return AdmissionResult(
            denials=(Problem("", f"must be a {KIND} object (got {show_value(document)})"),)
        )
    identity = check_identity(document) + check_metadata(document)
    too_large = check_size(document)
    if too_large:  # said once, before parsing what is too large to keep
        return AdmissionResult(denials=tuple(identity + too_large))
    model, schema_problems = parse_model(document)
    if identity or model is None:
        return AdmissionResult(denials=tuple(identity + schema_problems))
    metadata = document.get("metadata")
    denials: list[Problem] = check_group_names(
        metadata.get("name") if isinstance(metadata, Mapping) else None, model.spec
    )
    warnings: list[Problem] = []
    for check in CHECKS:
        found_denials, found_warnings = check(model.spec, policy)
        denials += found_denials
        warnings += found_warnings
        if check is check_finite and found_denials:
            break  # the later checks compute with these numbers
    return AdmissionResult(denials=tuple(denials), warnings=tuple(warnings))


def _internal_error(error: Exception) -> AdmissionResult:
    return AdmissionResult(
        denials=(
            Problem(
                "",
                f"kvgate could not check this document ({type(error).__name__}: {error}); "
                "this is a kvgate bug, please report it with the document",
            ),
        )
    )


def check_document(document: object, policy: ClusterPolicy | None = None) -> AdmissionResult:
    """Every admission check on one raw ModelDeployment document, under the cluster's `policy`.
    Never raises; a failure inside a check denies (an unchecked document is never allowed by
    accident)."""
    try:
        return _check(document, policy if policy is not None else ClusterPolicy())
    except RecursionError:
        return AdmissionResult(
            denials=(Problem("", "the document is nested too deeply to check; flatten it"),)
        )
    except Exception as error:
        return _internal_error(error)


def _spec_unchanged(new: Mapping[str, Any], old: object) -> bool:
    return isinstance(old, Mapping) and old.get("spec") == new.get("spec")


def _being_deleted(new: Mapping[str, Any]) -> bool:
    metadata = new.get("metadata")
    return isinstance(metadata, Mapping) and metadata.get("deletionTimestamp") is not None


def check_update(new: object, old: object, policy: ClusterPolicy | None = None) -> AdmissionResult:
    """An UPDATE is checked like a CREATE, except that a change that leaves the spec as it was
    (finalizers, labels, annotations) or touches an object being deleted is never blocked: a spec
    admitted under older rules must stay deletable and manageable. Its problems become warnings."""
    result = check_document(new, policy)
    if result.allowed or not isinstance(new, Mapping):
        return result
    try:
        if not (_spec_unchanged(new, old) or _being_deleted(new)):
            return result
    except Exception as error:
        return _internal_error(error)
    kept = tuple(
        Problem(p.field, f"{p.message} (not enforced: the spec is unchanged)")
        for p in result.denials
    )
    return AdmissionResult(denials=(), warnings=kept + result.warnings)
