"""Which values each SGLang engine flag with a fixed set of values accepts, per release. Pure data.

The one source of truth for those sets: admission denies a ModelDeployment whose engine version
would refuse a value kvgate passes (``kvgate.admission.engine_flags``), and the reference engine
takes its ``choices`` from here for the version it emulates (``kvgate_engine.reference.args``).

Each row was read from the argument's ``choices`` in that release's own source, in the order
SGLang lists them: ``sglang/srt/server_args.py`` in 0.5.19; from 0.5.20 on
``sglang/srt/arg_groups/fields/model.py`` (``kv_cache_dtype``), ``arg_groups/choices.py``
(``DISAGG_TRANSFER_BACKEND_CHOICES``), ``arg_groups/fields/disagg.py`` (``disaggregation_mode``,
a ``Literal``) and ``arg_groups/fields/observability.py`` (``kv_canary``).
tests/conformance/test_engine_flag_values.py checks every row against every supported release's
parser, exactly: a value a release accepts that a row leaves out fails, and so does a value a row
lists that the release refuses.

A row applies from its ``since`` release up to the next row's. Releases newer than
``NEWEST_CHECKED`` take the newest row, an assumption until the conformance tier covers them;
releases older than ``OLDEST_CHECKED`` have no row (:func:`accepted_values` returns ``None``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

# The releases the conformance tier installs and checks (tests/conformance/setup_env.sh).
SUPPORTED_RELEASES: tuple[str, ...] = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
OLDEST_CHECKED = SUPPORTED_RELEASES[0]
NEWEST_CHECKED = SUPPORTED_RELEASES[-1]

KV_CACHE_DTYPE = "--kv-cache-dtype"
TRANSFER_BACKEND = "--disaggregation-transfer-backend"
DISAGGREGATION_MODE = "--disaggregation-mode"
KV_CANARY = "--kv-canary"


@dataclass(frozen=True)
class Since:
    """From release ``since`` on (until the next row), the flag accepts exactly ``values``."""

    since: str
    values: tuple[str, ...]


_KV_CACHE_DTYPES_0_5_19 = (
    "auto",
    "fp8_e5m2",
    "fp8_e4m3",
    "mxfp8",
    "bf16",
    "bfloat16",
    "nvfp4",
    "fp4_mx_block16",
    "fp4_e2m1",
)

# flag -> rows, oldest first. Only flags whose value comes from a fixed set.
FLAG_CHOICES: Mapping[str, tuple[Since, ...]] = {
    KV_CACHE_DTYPE: (
        Since("0.5.19", _KV_CACHE_DTYPES_0_5_19),
        # fp4_e2m1 is gone from the choices in 0.5.21.
        Since("0.5.21", tuple(v for v in _KV_CACHE_DTYPES_0_5_19 if v != "fp4_e2m1")),
    ),
    TRANSFER_BACKEND: (
        Since("0.5.19", ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")),
    ),
    DISAGGREGATION_MODE: (Since("0.5.19", ("null", "prefill", "decode")),),
    KV_CANARY: (Since("0.5.19", ("none", "log", "raise")),),
}


def _version(version: str) -> Version | None:
    try:
        return Version(version)
    except InvalidVersion:
        return None


def accepted_values(flag: str, version: str) -> tuple[str, ...] | None:
    """The values SGLang ``version`` accepts for ``flag``; ``None`` when the table does not
    know (a version older than the oldest checked release, or not a version)."""
    rows = FLAG_CHOICES[flag]
    parsed = _version(version)
    if parsed is None:
        return None
    found = None
    for row in rows:
        if parsed >= Version(row.since):
            found = row.values
    return found


def accepts(flag: str, version: str, value: str) -> bool | None:
    """Whether SGLang ``version`` accepts ``value`` for ``flag`` (``None``: unknown)."""
    values = accepted_values(flag, version)
    return None if values is None else value in values


def refusing_releases(flag: str, value: str) -> tuple[str, ...]:
    """The supported releases whose parser refuses ``value`` for ``flag``."""
    return tuple(v for v in SUPPORTED_RELEASES if not accepts(flag, v, value))
