"""The `kvgate` command line. Stable subcommand names; tests and users call them.

Each subcommand's work lives in the module that owns it; this file only parses arguments.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from kvgate_engine.verdict import DEFAULT_MIN_ENGINE_VERSION

# subcommand -> "module:function"; the function takes the parsed namespace, returns an exit code.
COMMANDS: dict[str, str] = {
    "crd": "kvgate.cmd.crd_command:main",
    "validate": "kvgate.admission.command:main",
    "estimate": "kvgate_engine.commands:estimate_main",
    "verify": "kvgate_engine.commands:verify_main",
    "plan": "kvgate.cmd.plan_command:main",
    "operator": "kvgate.controller.main:run",
    "webhook": "kvgate.admission.webhook_command:main",
    "guard": "kvgate.cmd.guard:main",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate",
        description=(
            "Deploy SGLang prefill/decode engines and let no engine take traffic until its live "
            "KV pool is proven to hold the advertised context window."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("crd", help="print the ModelDeployment CRD generated from the API models")

    p = sub.add_parser("validate", help="run the admission webhook's checks offline")
    p.add_argument("file", help="ModelDeployment YAML or JSON file ('-' for stdin)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--min-version-floor",
        metavar="VERSION",
        default=None,
        help=(
            "the cluster's engine version floor (the chart value engineVersionFloor), to get "
            "the answers that cluster's webhook gives; default: no cluster floor"
        ),
    )
    p.add_argument(
        "--gpus-per-node",
        metavar="N",
        type=int,
        default=None,
        help=(
            "the GPUs each GPU node of the cluster has (the chart value gpusPerNode): an engine "
            "pod asking for more is denied; default: unknown (only the 16-GPU ceiling)"
        ),
    )

    p = sub.add_parser("estimate", help="predict the KV pool of one engine before any GPU is spent")
    p.add_argument("--config", required=True, help="the model's config.json")
    p.add_argument("--gpu-memory-gib", type=float, required=True, help="memory of one GPU, GiB")
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel size")
    p.add_argument("--mem-fraction-static", type=float, default=0.85)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--weights-gib", type=float, default=None, help="weights of one replica, GiB")
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument(
        "--gpu-reserved-gib",
        type=float,
        default=1.0,
        help="GPU memory the engine never sees free (CUDA context, NCCL, other tenants), GiB",
    )
    p.add_argument(
        "--gpu-arch",
        default=None,
        help="GPU SM version (sm90, sm100): picks SGLang's DSA KV dtype; unset = conservative",
    )
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        help="an extra sglang.launch_server flag that changes sizing (repeat; e.g. "
        "--engine-arg=--speculative-algorithm --engine-arg=NEXTN)",
    )
    p.add_argument("--json", action="store_true")

    p = sub.add_parser(
        "plan",
        help="which context a GPU shape safely holds, and the cheapest shape for a context",
        description="Exit 0: a shape holds the context; 1: nothing searched holds it (or the "
        "weights fit nowhere; with -f: a role does not hold its contextLength); 2: usage or "
        "input error. Lists take commas or repeated values: --tp 1,2,4,8.",
    )
    p.add_argument("-f", "--file", default=None, help="plan an existing ModelDeployment YAML")
    p.add_argument("--config", default=None, help="the model's config.json (a search)")
    p.add_argument("--weights-gib", type=float, default=None, help="weights of one replica, GiB")
    p.add_argument("--gpu-memory-gib", nargs="+", default=None, metavar="G", help="GPU sizes")
    p.add_argument("--tp", nargs="+", default=None, metavar="N", help="default 1,2,4,8")
    p.add_argument("--kv-cache-dtype", nargs="+", default=None, help="default auto,fp8_e4m3")
    p.add_argument("--mem-fraction-static", nargs="+", default=None, help="default 0.85")
    p.add_argument("--headroom", type=float, default=None, help="pool / context, default 1.0")
    p.add_argument("--context-length", type=int, default=None, help="the context to hold")
    p.add_argument("--page-size", type=int, default=None, help="default 1")
    p.add_argument(
        "--gpu-reserved-gib",
        type=float,
        default=None,
        help="GiB per GPU kept for the CUDA context and others, as admission's gpuReservedGiB "
        "(default 1)",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="draw the plan (needs [plot])")

    p = sub.add_parser("verify", help="verify a live engine (or its saved /server_info)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="engine base URL, e.g. http://10.0.0.5:30000")
    src.add_argument("--server-info", help="a saved /server_info JSON file")
    p.add_argument("--models", help="a saved /v1/models JSON file (with --server-info)")
    p.add_argument("--context-length", type=int, required=True)
    p.add_argument("--headroom", type=float, default=1.0)
    p.add_argument("--role", choices=["prefill", "decode"], default=None)
    p.add_argument("--min-version", default=DEFAULT_MIN_ENGINE_VERSION)
    p.add_argument("--timeout", type=float, default=5.0, help="per-request timeout, seconds")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("operator", help="run the operator")
    p.add_argument("--namespace", action="append", default=[], help="watch only these")
    p.add_argument("--standalone", action="store_true", help="no kopf peering (one replica)")
    p.add_argument("--metrics-port", type=int, default=8080)
    p.add_argument("--health-port", type=int, default=8081)
    p.add_argument("--webhook-port", type=int, default=9443)
    p.add_argument("--tls-dir", default=None, help="directory with tls.crt and tls.key")
    p.add_argument("--no-webhook", action="store_true", help="do not serve the webhook")
    p.add_argument(
        "--leader-elect",
        action="store_true",
        help="run several replicas: only the holder of a Lease reconciles (KVGATE_LEADER_*)",
    )

    p = sub.add_parser(
        "webhook",
        help="serve the validating webhook for ModelDeployments on its own (HTTPS, with "
        "/healthz, /readyz and /metrics)",
    )
    p.add_argument("--port", type=int, default=9443, help="HTTPS port of the webhook")
    p.add_argument("--health-port", type=int, default=8081, help="/healthz and /readyz")
    p.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics")
    p.add_argument("--tls-dir", required=True, help="directory with tls.crt and tls.key")
    p.add_argument(
        "--shutdown-delay-seconds",
        type=float,
        default=5.0,
        help="after SIGTERM, seconds to keep answering while /readyz fails (default 5)",
    )

    p = sub.add_parser(
        "guard",
        help="pod-local guard beside an engine: /ready answers 200 only while the engine meets "
        "the requirement given here (a native sidecar's readinessProbe)",
    )
    p.add_argument("--engine-host", default="127.0.0.1", help="the engine's address (localhost)")
    p.add_argument("--engine-port", type=int, required=True, help="the engine's HTTP port")
    p.add_argument("--context-length", type=int, required=True)
    p.add_argument("--headroom", type=float, default=1.0)
    p.add_argument("--role", choices=["prefill", "decode"], required=True)
    p.add_argument("--min-version", required=True, help="lowest engine version (PEP 440)")
    p.add_argument("--host", default="0.0.0.0", help="address /ready and /healthz listen on")
    p.add_argument("--port", type=int, default=8471, help="port of /ready and /healthz")
    p.add_argument("--period", type=float, default=2.0, help="seconds between engine reads")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="per-request deadline, s (default: period, >= 1)",
    )

    return parser


def _resolve(target: str) -> Callable[[argparse.Namespace], int]:
    module_name, func_name = target.split(":")
    module = importlib.import_module(module_name)
    func: Callable[[argparse.Namespace], int] = getattr(module, func_name)
    return func


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return _resolve(COMMANDS[args.command])(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
