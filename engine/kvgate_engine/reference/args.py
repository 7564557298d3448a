"""The ``sglang.launch_server`` command line, as far as the reference engine understands it.

Every flag kvgate's launcher emits is here with SGLang's name, type and default, plus the common
flags operators add by hand. A flag SGLang has but this engine does not know is an error (exit 2,
like argparse in SGLang itself), never silently ignored: a test that passes a flag expects it to
mean something.

The flags whose value comes from a fixed set (--kv-cache-dtype, --disaggregation-transfer-backend,
--disaggregation-mode, --kv-canary) take their choices from ``kvgate_engine.sglang_choices`` for
the SGLang version the engine emulates (``KVGATE_ENGINE_VERSION``, default 0.5.23): a value that
release refuses exits 2, as SGLang does.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from packaging.version import InvalidVersion, Version

from kvgate_engine.sglang_choices import (
    DISAGGREGATION_MODE,
    KV_CACHE_DTYPE,
    KV_CANARY,
    NEWEST_CHECKED,
    OLDEST_CHECKED,
    TRANSFER_BACKEND,
    accepted_values,
)

DEFAULT_VERSION = "0.5.23"
LOAD_FORMATS = (
    "auto",
    "pt",
    "safetensors",
    "npcache",
    "dummy",
    "sharded_state",
    "gguf",
    "bitsandbytes",
    "layered",
    "remote",
)
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage()
        self.exit(
            2,
            f"{self.prog}: error: {message}\n"
            f"The kvgate reference engine accepts the sglang.launch_server flags listed by "
            f"`python -m kvgate_engine.reference --help`; remove the flag or add it to "
            f"kvgate_engine/reference/args.py.\n",
        )


def choices_for(flag: str, version: str) -> tuple[str, ...]:
    """``flag``'s choices in SGLang ``version``; a version older than the table's oldest row
    takes that row, one that is not a version the newest."""
    values = accepted_values(flag, version)
    if values is not None:
        return values
    try:
        Version(version)
    except InvalidVersion:
        fallback = NEWEST_CHECKED
    else:
        fallback = OLDEST_CHECKED
    found = accepted_values(flag, fallback)
    assert found is not None
    return found


def build_parser(version: str = DEFAULT_VERSION) -> argparse.ArgumentParser:
    """The argument parser: SGLang's flag names, types and defaults, with the choices of SGLang
    ``version``."""
    parser = _Parser(
        prog="python -m kvgate_engine.reference",
        description=(
            "kvgate CPU reference engine: a small numpy engine with a paged KV pool that "
            "speaks the SGLang HTTP API and sglang.launch_server flags. Simulated GPU memory "
            "per GPU comes from KVGATE_GPU_MEMORY_GIB (default 80)."
        ),
        allow_abbrev=False,
    )
    add = parser.add_argument
    add("--model-path", "--model", dest="model_path", required=True)
    add("--tokenizer-path", default=None)
    add("--served-model-name", default=None)
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--context-length", type=int, default=None)
    add("--mem-fraction-static", type=float, default=None)
    add("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    add("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    add("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    add("--page-size", type=int, default=1)
    add("--kv-cache-dtype", choices=choices_for(KV_CACHE_DTYPE, version), default="auto")
    add("--dtype", default="auto")
    add("--max-total-tokens", type=int, default=None)
    add("--max-running-requests", type=int, default=None)
    add("--chunked-prefill-size", type=int, default=None)
    add("--max-prefill-tokens", type=int, default=16384)
    add("--disaggregation-mode", choices=choices_for(DISAGGREGATION_MODE, version), default="null")
    add(
        "--disaggregation-transfer-backend",
        choices=choices_for(TRANSFER_BACKEND, version),
        default="mooncake",
    )
    add("--disaggregation-bootstrap-port", type=int, default=8998)
    add("--disaggregation-ib-device", default=None)
    add("--disaggregation-enable-kv-checksum", action="store_true")
    # SGLang's default is "none"; None here tells "not given" apart (the same: no canary).
    add("--kv-canary", choices=choices_for(KV_CANARY, version), default=None)
    add("--enable-metrics", action="store_true")
    add("--load-format", choices=LOAD_FORMATS, default="auto")
    add("--skip-tokenizer-init", action="store_true")
    add("--trust-remote-code", action="store_true")
    add("--skip-server-warmup", action="store_true")
    add("--allow-auto-truncate", action="store_true")
    add("--log-level", choices=LOG_LEVELS, default="info")
    add("--log-requests", action="store_true")  # kvgate_engine.reference.request_log
    add("--log-requests-level", type=int, choices=(0, 1, 2, 3), default=2)
    add("--random-seed", type=int, default=None)
    add("--device", default="cpu")
    add("--disable-cuda-graph", action="store_true")
    add("--disable-radix-cache", action="store_true")
    add("--watchdog-timeout", type=float, default=300.0)
    # Secrets, as SGLang takes them (sglang/srt/arg_groups/fields/serving.py): /server_info
    # reports them back, in their fields and in launch_command (server.py), as SGLang does.
    # --api-key guards every route but /health*, /ready* and /metrics (server.auth_middleware).
    # SGLang refuses --ssl-keyfile-password without --ssl-certfile and --ssl-keyfile; this engine
    # serves no TLS, takes the password alone and only reports it.
    add("--api-key", default=None)
    add("--admin-api-key", default=None)
    add("--ssl-keyfile-password", default=None)
    # Multi-node engines (kvgate_engine.reference.ranks): rank 0 serves, ranks >= 1 join it.
    add("--nnodes", type=int, default=1)
    add("--node-rank", type=int, default=0)
    add("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=None)
    return parser


@dataclass(frozen=True)
class LaunchArgs:
    """Parsed flags (SGLang field names) and the command line they came from."""

    values: dict[str, Any]
    argv: tuple[str, ...]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


def parse_launch_args(argv: Sequence[str], version: str = DEFAULT_VERSION) -> LaunchArgs:
    """Parse sglang.launch_server flags as SGLang ``version`` does; an unknown flag or a value
    that release refuses exits 2 with a message."""
    parser = build_parser(version)
    namespace, unknown = parser.parse_known_args(list(argv))
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    values = vars(namespace)
    for flag, minimum in (("tp_size", 1), ("dp_size", 1), ("pp_size", 1), ("page_size", 1)):
        if values[flag] < minimum:
            parser.error(f"--{flag.replace('_', '-')} {values[flag]} must be >= {minimum}")
    if not 0 < values["port"] < 65536:
        parser.error(f"--port {values['port']} must be between 1 and 65,535")
    nnodes, rank = values["nnodes"], values["node_rank"]
    if nnodes < 1 or not 0 <= rank < nnodes:
        parser.error(f"--node-rank {rank} must be one of 0..{nnodes - 1} (--nnodes {nnodes})")
    if nnodes > 1 and not values["dist_init_addr"]:
        parser.error(f"--nnodes {nnodes} needs --dist-init-addr (rank 0's host:port)")
    if (values["tp_size"] * values["pp_size"]) % nnodes:
        # SGLang's own check (sglang/srt/arg_groups/validation_hook.py)
        parser.error("tp_size must be divisible by number of nodes")
    mfs = values["mem_fraction_static"]
    if mfs is not None and not 0 < mfs < 1:
        parser.error(f"--mem-fraction-static {mfs} must be between 0 and 1 (exclusive)")
    return LaunchArgs(values=values, argv=tuple(argv))
