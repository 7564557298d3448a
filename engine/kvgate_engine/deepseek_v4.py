"""DeepSeek-V4's KV pools as each SGLang release sizes them. Pure arithmetic, no SGLang import.

SGLang 0.5.19 to 0.5.23 give ``DeepseekV4ForCausalLM`` its own configurator
(model_executor/pool_configurator.py ``DSV4PoolConfigurator``): every layer keeps a paged
sliding-window (SWA) cache of ``swa_full_tokens_ratio`` × the full pool, each compress-ratio-4
layer a cache of a quarter of the full tokens plus an fp8 indexer row, each ratio-128 layer one
row per 128 tokens; the ratio-4 compress state rides on the SWA pages, and the ratio-128
compress state is a fixed block per request slot, taken first. The page is 256 on CUDA
(arg_groups/model_overrides/deepseek_v4.py) and ``auto`` runs as fp8_e4m3
(arg_groups/overrides.py ``_deepseek_v4_kv_cache_dtype``). What changes per release:

- the bytes of one latent row: ``nope + 2 × rope + 8`` = 584 in 0.5.19 and 0.5.20; from 0.5.21
  the row of the V4 page layout (kernels/ops/attention/dsv4/kv_layout.py ``KVLayout.V4``: 584
  bytes, each page padded to a multiple of 576 bytes), per cache page: 585 bytes a token in the
  256-token SWA page and the 64-token ratio-4 page, 864 in the 2-token ratio-128 page;
- the layout itself (mem_cache/deepseek_v4_memory_pool.py ``select_dsv4_kv_layout``):
  ``SGLANG_DSV4_KV_LAYOUT`` defaults to ``v4`` in 0.5.21 to 0.5.23, so the GPU's SM version
  plays no part unless that variable or ``--dsv4-attn-backend`` asks for another layout, which
  :func:`deepseek_v4_unsized` refuses;
- the SWA share: ``--swa-full-tokens-ratio``, else 0.1, the model's override; 0.5.19 also
  replaces a given 0.8 (its ServerArgs default, which it cannot tell from an unset flag). From
  0.5.21 the configurator sizes the SWA pool from the request cap instead unless the ratio
  counts as set; the releases' argument resolution counts the override's 0.1 as set, so
  DeepSeek-V4 (unlike V4.1, which has no override) stays on the ratio;
- the SWA floor (``validate_swa_pool_size``, from 0.5.20): the SWA pool must exceed one window
  plus one page, or the engine refuses to start;
- the ratio-4 state's pages: ``swa_tokens // window × 8`` rows in 0.5.19 and 0.5.20,
  ``swa_tokens // page × 8`` from 0.5.21.

Everything else comes from SGLang's argument resolution: ``--max-running-requests`` defaults to
256 (arg_groups/deepseek_v4_hook.py), a decode engine adds its extra request slots
(pd_disaggregation_hook.py). tests/conformance/dsv4_pools_probe.py runs each release's own
resolution and configurator on the shapes of tests/fixtures/sglang_pools/deepseek_v4.json;
tests/conformance/test_sglang_pools.py requires the estimate to equal them token for token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgate_engine.flag_reader import last_uses
from kvgate_engine.sglang_choices import SUPPORTED_RELEASES

DEEPSEEK_V4_ARCHITECTURE = "DeepseekV4ForCausalLM"
DEEPSEEK_V4_MODEL_TYPE = "deepseek_v4"
# The page SGLang forces for DeepSeek-V4 on CUDA (model_overrides/deepseek_v4.py).
DSV4_PAGE = 256
DSV4_KV_CACHE_DTYPES = ("auto", "fp8_e4m3")
# model_overrides/deepseek_v4.py: the SWA share SGLang gives DeepSeek-V4 when none is set; 0.5.19
# also replaces its ServerArgs default (0.8), as it cannot tell it from an unset flag.
DSV4_SWA_RATIO = 0.1
SERVER_ARGS_SWA_RATIO_0_5_19 = 0.8
# arg_groups/deepseek_v4_hook.py apply_deepseek_v4_defaults fills --max-running-requests.
DSV4_MAX_RUNNING_REQUESTS = 256
# pd_disaggregation_hook.py: a decode worker running at most this many requests reserves twice
# as many extra request slots (unless --disaggregation-decode-extra-slots says otherwise).
DECODE_EXTRA_SLOTS_UP_TO = 32
# mem_cache/deepseek_v4_memory_pool.py get_compress_state_ring_size, without speculative decoding.
C4_RING = 8
C128_RING = 128
# environ.py SGLANG_DSV4_COMPRESS_STATE_DTYPE defaults to float32.
COMPRESS_STATE_BYTES = 4
INDEXER_QUANT_BLOCK = 128  # get_dsv4_indexer_bytes_per_token: fp8 plus a 4-byte scale per 128
# kv_layout.py KVLayout.V4: 576 data + 8 scale bytes a token, pages padded to 576 bytes.
V4_ROW_BYTES = 584
V4_PAGE_ALIGN = 576
# The releases whose sizer prices the paged V4 rows.
PAGED_ROW_RELEASES = frozenset({"0.5.21", "0.5.22", "0.5.23"})
SWA_FLOOR_RELEASES = frozenset({"0.5.20", "0.5.21", "0.5.22", "0.5.23"})
# Engine variables that change the layout, the compress-state dtype or the rings (environ.py:
# SGLANG_DSV4_KV_LAYOUT, SGLANG_DSV4_COMPRESSED_KV_LAYOUT, SGLANG_DSV4_COMPRESS_STATE_DTYPE, online
# c128 compression): with any of them set, the pools are not estimated. Every SGLANG_DSV4_*
# variable is taken as one, known to size or not.
DSV4_ENV_PREFIXES = ("SGLANG_DSV4_",)
DSV4_ENV_NAMES = frozenset(
    {"SGLANG_OPT_USE_ONLINE_COMPRESS", "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP"}
)
# Flags only DeepSeek-V4 sizing reads (their aliases are SGLang's own spellings).
DSV4_FLAGS: Mapping[str, str] = {
    "--dsv4-attn-backend": "--dsv4-attn-backend",
    "--disaggregation-decode-extra-slots": "--disaggregation-decode-extra-slots",
    "--dp-size": "--dp-size",
    "--data-parallel-size": "--dp-size",
}


def _flag_values(engine_args: Sequence[str]) -> dict[str, str | None]:
    """The DSV4_FLAGS the engine args set (aliases under SGLang's main spelling), last wins."""
    return {DSV4_FLAGS[flag]: use.value for flag, use in last_uses(engine_args, DSV4_FLAGS).items()}


def _digits(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


class DeepseekV4Unsized(ValueError):
    """The pools cannot be estimated exactly; the message names the input and the way out."""

    def __init__(self, message: str, parameter: str) -> None:
        super().__init__(message)
        self.parameter = parameter


@dataclass(frozen=True)
class DeepseekV4Model:
    """What the sizer reads from config.json (configs/model_config.py, DeepSeek-V4 branch)."""

    nope: int  # head_dim − qk_rope_head_dim
    rope: int
    index_head_dim: int
    window: int  # sliding_window
    ratios: tuple[int, ...]  # compress_ratios of the num_hidden_layers target layers

    @property
    def head_dim(self) -> int:
        return self.nope + self.rope

    def layers(self, ratio: int) -> int:
        return sum(1 for r in self.ratios if r == ratio)


@dataclass(frozen=True)
class DeepseekV4Request:
    """The engine inputs the sizer reads besides the model."""

    release: str
    available_bytes: int  # the KV budget of one GPU rank
    swa_ratio: float | None  # --swa-full-tokens-ratio as given, None when not
    max_running_requests: int | None  # as given
    attention_dp: int
    role: str | None  # "prefill", "decode" or None
    engine_args: Sequence[str]  # for the flags only this sizer reads (DSV4_FLAGS)
    max_total_tokens: int | None


@dataclass(frozen=True)
class DeepseekV4Pools:
    """DSV4PoolConfigurator's answer for one GPU rank."""

    full_tokens: int
    swa_tokens: int
    c4_tokens: int
    c128_tokens: int
    c4_state_rows: int  # ratio-4 compress state rows (per SWA page)
    c128_state_bytes: int  # the per-request-slot ratio-128 state taken before the pools
    request_slots: int
    bytes_per_full_token: float
    swa_ratio: float
    window: int
    page: int = DSV4_PAGE

    @property
    def swa_floor_broken(self) -> bool:
        """SGLang (from 0.5.20) refuses an SWA pool at or below one window plus one page."""
        return self.window + self.page >= self.swa_tokens


def is_deepseek_v4(config: Mapping[str, Any]) -> bool:
    architectures = config.get("architectures")
    return isinstance(architectures, list) and DEEPSEEK_V4_ARCHITECTURE in architectures[:1]


def _positive(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise DeepseekV4Unsized(
            f"config.json has no positive integer {key}, which SGLang sizes DeepSeek-V4's KV "
            "pools from; fix the config or verify a live engine",
            "config",
        )
    return value


def deepseek_v4_model(config: Mapping[str, Any]) -> DeepseekV4Model:
    """The config fields the sizer reads; the published DeepSeek-V4 configs list one compress
    ratio per layer plus the MTP layer's, and the target takes the first num_hidden_layers."""
    if config.get("model_type") != DEEPSEEK_V4_MODEL_TYPE:
        raise DeepseekV4Unsized(
            f"model_type {config.get('model_type')!r} with {DEEPSEEK_V4_ARCHITECTURE}: SGLang "
            f"sizes the V4.1 family (deepseek_v41) with request windows and a request-capped "
            f"SWA pool kvgate does not model; verify a live engine",
            "config",
        )
    layers = _positive(config, "num_hidden_layers")
    rope = _positive(config, "qk_rope_head_dim")
    ratios = config.get("compress_ratios")
    if (
        not isinstance(ratios, list)
        or len(ratios) < layers
        or any(r not in (0, 4, 128) for r in ratios[:layers])
    ):
        raise DeepseekV4Unsized(
            f"config.json compress_ratios must give each of the {layers} layers 0, 4 or 128 "
            "(the ratios DeepSeek-V4 uses); kvgate does not size other ratios, verify a live "
            "engine",
            "config",
        )
    if config.get("kv_source_layer_ids"):
        raise DeepseekV4Unsized(
            "config.json kv_source_layer_ids: shared-KV source layers are sized in ways kvgate "
            "does not model; verify a live engine",
            "config",
        )
    return DeepseekV4Model(
        nope=_positive(config, "head_dim") - rope,
        rope=rope,
        index_head_dim=_positive(config, "index_head_dim"),
        window=_positive(config, "sliding_window"),
        ratios=tuple(ratios[:layers]),
    )


def deepseek_v4_unsized(
    release: str | None,
    kv_cache_dtype: str,
    engine_args: Sequence[str],
    engine_env: Mapping[str, str],
) -> DeepseekV4Unsized | None:
    """Why the pools of this engine cannot be estimated exactly, or None."""
    if release not in SUPPORTED_RELEASES:
        return DeepseekV4Unsized(
            f"SGLang's DeepSeek-V4 sizer differs from release to release and the engine's release "
            f"is {'not known' if release is None else release}; kvgate sizes it for "
            f"{', '.join(SUPPORTED_RELEASES)}: run an image whose tag names one of them (e.g. "
            f"lmsysorg/sglang:v{SUPPORTED_RELEASES[-1]})",
            "release",
        )
    if kv_cache_dtype not in DSV4_KV_CACHE_DTYPES:
        return DeepseekV4Unsized(
            f"{kv_cache_dtype!r}: kvgate sizes DeepSeek-V4 with kvCacheDtype auto (SGLang runs "
            "it as fp8_e4m3 on CUDA) or fp8_e4m3",
            "kv_cache_dtype",
        )
    flags = _flag_values(engine_args)
    backend = flags.get("--dsv4-attn-backend", "auto")
    if backend != "auto":
        return DeepseekV4Unsized(
            f"--dsv4-attn-backend {backend}: other DeepSeek-V4 attention backends change "
            "the KV layout (trtllm: uniform fp8 rows, SM100 only), which kvgate does not model; "
            "leave it unset (auto) or verify a live engine",
            "engine_args",
        )
    variables = sorted(
        name for name in engine_env if name in DSV4_ENV_NAMES or name.startswith(DSV4_ENV_PREFIXES)
    )
    if variables:
        return DeepseekV4Unsized(
            f"engine env {', '.join(variables)} changes how SGLang lays out or sizes "
            "DeepSeek-V4's KV pools (a KV layout picked from the GPU's SM version, the "
            "compress-state dtype, online compression), which kvgate does not model; remove it "
            "or verify a live engine",
            "engine_env",
        )
    return None


def _swa_ratio(request: DeepseekV4Request) -> float:
    """The SWA share the release's configurator uses."""
    given = request.swa_ratio
    if given is not None and not 0 < given <= 1:
        raise DeepseekV4Unsized(
            f"--swa-full-tokens-ratio {given:g} must be in (0, 1] (SGLang refuses to start)",
            "engine_args",
        )
    if given is None or (request.release == "0.5.19" and given == SERVER_ARGS_SWA_RATIO_0_5_19):
        return DSV4_SWA_RATIO
    return given


def _requests_per_worker(request: DeepseekV4Request) -> int:
    """--max-running-requests (SGLang fills 256 for DeepSeek-V4) per attention-DP worker."""
    total = request.max_running_requests or DSV4_MAX_RUNNING_REQUESTS
    per_worker = total // max(request.attention_dp, 1)
    return max(1, per_worker) if request.release == "0.5.23" else per_worker


def _request_slots(request: DeepseekV4Request, per_worker: int) -> int:
    """Request slots (DSV4PoolConfigurator._get_num_req_slots): the running requests and one
    padding slot, plus the decode engine's extra slots for requests still in transfer."""
    if request.role != "decode":
        return per_worker + 1
    values = _flag_values(request.engine_args)
    extra = _digits(values.get("--disaggregation-decode-extra-slots"))
    if extra is not None:
        return per_worker + extra + 1
    # pd_disaggregation_hook.py counts the requests per DP rank, replicas included.
    dp = _digits(values.get("--dp-size"))
    ranks = max(request.attention_dp, 1 if dp is None else dp)
    if (
        request.max_running_requests or DSV4_MAX_RUNNING_REQUESTS
    ) // ranks <= DECODE_EXTRA_SLOTS_UP_TO:
        raise DeepseekV4Unsized(
            f"a decode engine running {per_worker} requests per worker reserves extra "
            "request slots whose number depends on the order SGLang resolves its "
            "arguments; set --disaggregation-decode-extra-slots or more than "
            f"{DECODE_EXTRA_SLOTS_UP_TO} --max-running-requests per worker",
            "engine_args",
        )
    return per_worker + 1


def _c128_state_bytes(model: DeepseekV4Model, slots: int) -> int:
    """The ratio-128 compress state: a ring of 128 rows per slot plus one ring and a row,
    padded to 128 rows, of (kv, score) in float32 (_get_c128_state_fixed_bytes)."""
    layers = model.layers(128)
    if layers == 0:
        return 0
    rows = -(-(slots * C128_RING + C128_RING + 1) // 128) * 128
    return rows * 2 * model.head_dim * COMPRESS_STATE_BYTES * layers


def _paged_row_bytes(page_tokens: int) -> float:
    """Bytes a token costs in one page of the V4 layout (KVLayout.page_bytes / page)."""
    page_bytes = -(-(page_tokens * V4_ROW_BYTES) // V4_PAGE_ALIGN) * V4_PAGE_ALIGN
    return page_bytes / page_tokens


def _flat_bytes_per_full_token(model: DeepseekV4Model, ratio: float) -> float:
    """0.5.19 and 0.5.20 (_get_bytes_per_full_token), term by term in SGLang's order."""
    kv = model.nope + model.rope * 2 + 8
    indexer = model.index_head_dim + model.index_head_dim // INDEXER_QUANT_BLOCK * 4
    c4_state = 2 * 2 * model.head_dim * COMPRESS_STATE_BYTES
    c4_indexer_state = 2 * 2 * model.index_head_dim * COMPRESS_STATE_BYTES
    c4_state_ratio = C4_RING / model.window
    total, c4, c128 = len(model.ratios), model.layers(4), model.layers(128)
    return (
        ratio * kv * total
        + 1 / 4 * kv * c4
        + 1 / 128 * kv * c128
        + 1 / 4 * indexer * c4
        + ratio * c4_state_ratio * c4_state * c4
        + 0 * c128
        + ratio * c4_state_ratio * c4_indexer_state * c4
    )


def _paged_bytes_per_full_token(model: DeepseekV4Model, ratio: float) -> float:
    """0.5.21 to 0.5.23: the SWA slot (paged rows of every layer and the ratio-4 state riding
    on its page) times the ratio, plus each compressed cache's paged rows."""
    indexer = model.index_head_dim + model.index_head_dim // INDEXER_QUANT_BLOCK * 4
    c4_state = 2 * 2 * model.head_dim * COMPRESS_STATE_BYTES
    c4_indexer_state = 2 * 2 * model.index_head_dim * COMPRESS_STATE_BYTES
    c4, c128 = model.layers(4), model.layers(128)
    c4_state_ratio = (C4_RING if c4 else 0) / DSV4_PAGE
    swa_slot = _paged_row_bytes(DSV4_PAGE) * len(model.ratios) + (
        c4_state_ratio * (c4_state + c4_indexer_state) * c4
    )
    compressed: float = 0
    if c4:
        compressed += (1 / 4 * _paged_row_bytes(DSV4_PAGE // 4) + 1 / 4 * indexer) * c4
    if c128:
        compressed += 1 / 128 * _paged_row_bytes(DSV4_PAGE // 128) * c128
    return ratio * swa_slot + compressed


def deepseek_v4_pools(model: DeepseekV4Model, request: DeepseekV4Request) -> DeepseekV4Pools:
    """DSV4PoolConfigurator.calculate_pool_sizes for ``request.release`` on one GPU rank, then
    --max-total-tokens, which only lowers the full pool (calculate_pool_sizes_from_max_tokens)."""
    ratio = _swa_ratio(request)
    paged = request.release in PAGED_ROW_RELEASES
    per_token = (_paged_bytes_per_full_token if paged else _flat_bytes_per_full_token)(model, ratio)
    slots = _request_slots(request, _requests_per_worker(request))
    state = _c128_state_bytes(model, slots)
    for_tokens = max(request.available_bytes - state, 0)
    full = int(for_tokens / per_token)
    if request.release == "0.5.23":
        # The page-padding loop: it removes pages while the full pool overdraws the budget.
        full = full // DSV4_PAGE * DSV4_PAGE
        while full > 0 and full * per_token > for_tokens:
            full -= DSV4_PAGE
    if request.max_total_tokens is not None and request.max_total_tokens < full:
        full = request.max_total_tokens
    full = full // DSV4_PAGE * DSV4_PAGE
    swa = int(full * ratio) // DSV4_PAGE * DSV4_PAGE
    state_page = DSV4_PAGE if paged else model.window
    return DeepseekV4Pools(
        full_tokens=full,
        swa_tokens=swa,
        c4_tokens=full // 4,
        c128_tokens=full // 128,
        c4_state_rows=swa // state_page * C4_RING if model.layers(4) else 0,
        c128_state_bytes=state,
        request_slots=slots,
        bytes_per_full_token=per_token,
        swa_ratio=ratio,
        window=model.window,
    )


def checks_swa_floor(release: str) -> bool:
    return release in SWA_FLOOR_RELEASES


def bytes_per_token_shown(pools: DeepseekV4Pools) -> int:
    return math.ceil(pools.bytes_per_full_token)
