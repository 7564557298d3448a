"""The `kvgate` command line. Stable subcommand names; tests and users call them.

Each subcommand's work lives in the module that owns it; this file parses arguments and, for the
one-shot commands, turns what goes wrong into a message and an exit code: an input the command
cannot use (:class:`~kvgate_engine.command_inputs.InputError`, argparse's own errors) is exit 2
naming the input; anything else is a kvgate bug, reported in one line as exit 3. Never a
traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import os
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import NoReturn

from kvgate_engine.command_inputs import InputError
from kvgate_engine.command_output import report_failure
from kvgate_engine.launcher import API_KEY_ENV
from kvgate_engine.sglang_choices import NEWEST_CHECKED, SUPPORTED_RELEASES
from kvgate_engine.verdict import DEFAULT_MIN_ENGINE_VERSION

# subcommand -> "module:function"; the function takes the parsed namespace, returns an exit code.
COMMANDS: dict[str, str] = {
    "crd": "kvgate.cmd.crd_command:main",
    "validate": "kvgate.admission.command:main",
    "estimate": "kvgate_engine.commands:estimate_main",
    "verify": "kvgate_engine.commands:verify_main",
    "plan": "kvgate.cmd.plan_command:main",
    "explain": "kvgate.cmd.cluster_commands:explain_main",
    "history": "kvgate.cmd.cluster_commands:history_main",
    "rollback": "kvgate.cmd.cluster_commands:rollback_main",
    "operator": "kvgate.controller.main:run",
    "webhook": "kvgate.webhook.webhook_command:main",
    "guard": "kvgate.cmd.guard:main",
    "fetch-model": "kvgate.cmd.fetch_model:main",
}
PLUGIN_PROG = "kubectl kvgate"  # the server-side commands (operator, webhook, ...) are not its
# The commands that run once and exit: their failures are messages and exit codes.
ONE_SHOT = frozenset(
    {"crd", "validate", "estimate", "verify", "plan", "explain", "history", "rollback"}
)
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a writer whose reader went away

INTERNAL = "3  internal error: a kvgate bug, reported in one line (please report it)"
CLUSTER_ERROR = (
    "2  an input or cluster error (named): a bad NAME or flag, an unusable kubeconfig, an API "
    "server that cannot be reached or refuses (the message names the server and the "
    "kubeconfig), no such ModelDeployment"
)
EXIT_CODES_HELP = {
    "crd": ("0  the CRD is printed", "2  a flag cannot be used (named)", INTERNAL),
    "validate": (
        "0  every document is allowed (warnings are printed)",
        "1  a document is denied (every problem printed, with its field and numbers)",
        "2  the file or a flag cannot be used: unreadable, binary, empty, over 1 MiB, not YAML, "
        "a YAML alias bomb, a bad --min-version-floor or --gpus-per-node",
        INTERNAL,
    ),
    "estimate": (
        "0  the estimate is printed",
        "1  the weights leave no room for a KV cache",
        "2  an input error (named): an unreadable or oversized --config, a number out of range, "
        "a TP the model's heads do not allow, a KV dtype SGLang refuses, a model kvgate cannot "
        "size",
        INTERNAL,
    ),
    "verify": (
        "0  SAFE: the engine holds the context",
        "1  UNSAFE: a check failed (each printed with its numbers)",
        "2  CANNOT TELL (never safe), or an input error (named): an unreadable --server-info or "
        "--models, a number out of range",
        INTERNAL,
    ),
    "plan": (
        "0  a shape holds the context (without --context-length: some shape has room); with -f, "
        "every role holds its contextLength",
        "1  nothing searched holds the context, or the weights fit nowhere; with -f, a role does "
        "not hold its contextLength (the fixes are printed)",
        "2  usage or input error (named): an unreadable file, a value out of range, a model the "
        "estimator cannot size, --plot unavailable",
        INTERNAL,
    ),
    "explain": (
        "0  the ModelDeployment is Ready",
        "1  it is not Ready (why, with the numbers and the smallest change that fixes it)",
        CLUSTER_ERROR,
        INTERNAL,
    ),
    "history": ("0  the revisions are printed", CLUSTER_ERROR, INTERNAL),
    "rollback": (
        "0  the operator was asked to roll back (annotation kvgate.io/rollback), or the "
        "revision asked for is already the spec's",
        "2  no such revision, or one that was refused or never served (nothing is written); "
        + CLUSTER_ERROR[3:],
        INTERNAL,
    ),
}


def _exit_codes(command: str) -> str:
    lines = [
        textwrap.fill(line, width=78, initial_indent="  ", subsequent_indent="     ")
        for line in EXIT_CODES_HELP[command]
    ]
    return "exit codes:\n" + "\n".join(lines)


def _input_named(message: str) -> str:
    """The flag an argparse message is about: ``argument --tp: invalid int value`` -> ``--tp``,
    ``the following arguments are required: --tp`` -> ``--tp``."""
    match = re.match(r"argument ([^:\s/]+)", message) or re.search(r"required: ([^,\s/]+)", message)
    return match.group(1) if match else ""


class _Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are a JSON object on stdout when --json was asked for."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if self.json_errors:
            report_failure(
                self.prog.split()[-1], EXIT_USAGE, _input_named(message), message, as_json=True
            )
            self.exit(EXIT_USAGE)
        super().error(message)


def _gpu_reserve_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpu-reserve",
        action="append",
        default=[],
        metavar="PRODUCT=GIB",
        help="the cluster's measured reserve per GPU for a nvidia.com/gpu.product (the chart "
        "value estimator.gpuReservedGiBByProduct; repeat): a role whose nodeSelector pins that "
        "product and sets no gpuReservedGiB is estimated with it",
    )


def _one_shot(
    sub: argparse._SubParsersAction[_Parser], name: str, help_text: str, description: str = ""
) -> _Parser:
    """A subcommand whose --help ends with its exit codes."""
    return sub.add_parser(
        name,
        help=help_text,
        description=description or help_text,
        epilog=_exit_codes(name),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _version() -> str:
    """The installed distribution's version (``pip install`` of the repository)."""
    try:
        return importlib.metadata.version("kvgate")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (kvgate is not installed: pip install the repository)"


def _cluster_command(
    sub: argparse._SubParsersAction[_Parser], name: str, help_text: str, description: str
) -> _Parser:
    """A command about one ModelDeployment in a cluster: NAME, -n, --kubeconfig, --context and
    --json, as kubectl takes them (``kubectl kvgate NAME ...`` passes them on)."""
    p = _one_shot(sub, name, help_text, description)
    p.add_argument("name", metavar="NAME", help="the ModelDeployment")
    p.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="its namespace (default: the kubeconfig context's, else default)",
    )
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)",
    )
    p.add_argument("--context", default=None, help="kubeconfig context (default: the current)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def build_parser(prog: str = "kvgate") -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description=(
            "Deploy SGLang prefill/decode engines and let no engine take traffic until its live "
            "KV pool is proven to hold the advertised context window."
        ),
    )
    parser.add_argument("--version", action="version", version=f"kvgate {_version()}")
    sub: argparse._SubParsersAction[_Parser] = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND"
    )

    crd = _one_shot(sub, "crd", "print a CRD generated from the API models")
    crd.add_argument(
        "--kind",
        choices=("ModelDeployment", "RoleScale"),
        default="ModelDeployment",
        help="which CRD (default ModelDeployment)",
    )

    p = _one_shot(sub, "validate", "run the admission webhook's checks offline")
    p.add_argument("file", help="ModelDeployment YAML or JSON file ('-' for stdin)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--min-version-floor",
        metavar="VERSION",
        default=None,
        help=(
            "the cluster's engine version floor (the chart value engineVersionFloor), to get "
            "the answers that cluster's webhook gives; default: the chart's default, 0.5.22; "
            "none: no cluster floor"
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
    p.add_argument(
        "--model-host-path-prefix",
        metavar="DIR",
        action="append",
        default=None,
        help=(
            "a node directory under which spec.model.source.hostPath may name the weights (an "
            "entry of the chart value hostPaths.modelPrefixes; repeat for each); default: none, "
            "as the chart's default, so every hostPath model source is denied"
        ),
    )
    _gpu_reserve_flag(p)

    p = _one_shot(
        sub,
        "estimate",
        "predict the KV pool of one engine before any GPU is spent",
        "Predict the KV pool of one engine before any GPU is spent, with admission's rules: a "
        "size admission denies is refused here too.",
    )
    p.add_argument("--config", required=True, help="the model's config.json")
    p.add_argument("--gpu-memory-gib", type=float, required=True, help="memory of one GPU, GiB")
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel size")
    p.add_argument(
        "--mem-fraction-static",
        type=float,
        default=0.85,
        help="the engine's --mem-fraction-static: the share of GPU memory for weights and KV "
        "pool (default 0.85)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="the engine's --kv-cache-dtype: auto (the model's dtype), bfloat16, fp8_e4m3, "
        "fp8_e5m2, mxfp8 (default auto)",
    )
    p.add_argument(
        "--page-size", type=int, default=1, help="the engine's --page-size, tokens (default 1)"
    )
    p.add_argument("--weights-gib", type=float, default=None, help="weights of one replica, GiB")
    p.add_argument(
        "--max-total-tokens",
        type=int,
        default=None,
        help="the engine's --max-total-tokens: a cap on the pool (default: none)",
    )
    p.add_argument(
        "--gpu-reserved-gib",
        type=float,
        default=1.0,
        help="GPU memory the engine never sees free (CUDA context, NCCL, other tenants), GiB; "
        "the default 1 is kvgate's assumption, not SGLang's (it subtracts no fixed reserve): "
        "measure yours from status.<role>.poolEstimate (docs/planning.md)",
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
    p.add_argument(
        "--sglang-release",
        default=NEWEST_CHECKED,
        help="the engine's SGLang release, for the families whose sizing differs per release "
        f"(DeepSeek-V4): one of {', '.join(SUPPORTED_RELEASES)} (default {NEWEST_CHECKED})",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = _one_shot(
        sub,
        "plan",
        "which context a GPU shape safely holds, and the fewest GPUs that hold a context",
        "Which context a GPU shape safely holds, and the shapes with the fewest GPUs that hold "
        "a context (ties: the larger margin, then the smaller GPU). Lists "
        "take commas or repeated values: --tp 1,2,4,8.",
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
        "(default 1: kvgate's assumption, not SGLang's; measure yours, docs/planning.md)",
    )
    _gpu_reserve_flag(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="draw the plan (needs matplotlib: pip install '.[plot]' in a clone)",
    )

    p = _one_shot(sub, "verify", "verify a live engine (or its saved /server_info)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="engine base URL, e.g. http://10.0.0.5:30000")
    src.add_argument("--server-info", help="a saved /server_info JSON file")
    p.add_argument("--models", help="a saved /v1/models JSON file (with --server-info)")
    p.add_argument(
        "--context-length", type=int, required=True, help="the context the engine must hold"
    )
    p.add_argument(
        "--headroom",
        type=float,
        default=1.0,
        help="pool tokens required per context token, >= 1 (default 1.0)",
    )
    p.add_argument(
        "--role",
        choices=["prefill", "decode"],
        default=None,
        help="the engine's disaggregation role, checked against what it reports (default: any)",
    )
    p.add_argument(
        "--min-version",
        default=DEFAULT_MIN_ENGINE_VERSION,
        help=f"the lowest engine version accepted, PEP 440 (default {DEFAULT_MIN_ENGINE_VERSION})",
    )
    p.add_argument("--timeout", type=float, default=5.0, help="per-request timeout, seconds")
    p.add_argument(
        "--api-key",
        default=None,
        help=f"the engine's --api-key, sent as Authorization: Bearer (default: ${API_KEY_ENV}; "
        "the variable keeps the key out of the process list)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = _cluster_command(
        sub,
        "explain",
        "why a ModelDeployment is or is not Ready, with the numbers and the fix",
        "Why a ModelDeployment is or is not Ready: its conditions, the live KV pool of each "
        "role against contextLength × headroom, each engine pod's gate, the smallest change "
        "that fixes it, and its recent Events. Reads the cluster as kubectl does.",
    )
    _gpu_reserve_flag(p)
    _cluster_command(
        sub,
        "history",
        "a ModelDeployment's revisions: when each served, its spec, refusals",
        "A ModelDeployment's revisions, oldest first: the ones that served (status.history, "
        "what a rollback can restore), the spec's own, and refused ones, each with its spec "
        "and the refusal's reason and numbers.",
    )
    p = _cluster_command(
        sub,
        "rollback",
        "ask the operator to roll back to a revision that served (kvgate.io/rollback)",
        "Ask the operator to roll back to a revision that served: writes the annotation "
        "kvgate.io/rollback=<revision>, nothing else. The operator restores that revision's "
        "recorded spec; its engines are verified before it takes traffic.",
    )
    p.add_argument(
        "--to-revision",
        metavar="REV",
        default=None,
        help="a revision, a unique prefix of one, or its row number in kvgate history "
        "(default: the newest that served before the spec's own)",
    )

    if prog == PLUGIN_PROG:
        return parser  # kubectl kvgate: the commands a user runs, not the pods' own
    p = sub.add_parser("operator", help="run the operator")
    p.add_argument("--namespace", action="append", default=[], help="watch only these")
    p.add_argument("--standalone", action="store_true", help="no kopf peering (one replica)")
    p.add_argument(
        "--metrics-port", type=int, default=8080, help="Prometheus /metrics (default 8080)"
    )
    p.add_argument("--health-port", type=int, default=8081, help="/healthz (default 8081)")
    p.add_argument(
        "--webhook-port",
        type=int,
        default=9443,
        help="HTTPS port of the webhook served in this process (default 9443)",
    )
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
    p.add_argument(
        "--context-length", type=int, required=True, help="the context the engine must hold"
    )
    p.add_argument(
        "--headroom", type=float, default=1.0, help="pool tokens per context token (default 1)"
    )
    p.add_argument("--role", choices=["prefill", "decode"], required=True, help="the engine's role")
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

    p = sub.add_parser(
        "fetch-model",
        help="download a model snapshot from a Hugging Face Hub into a directory (the init "
        "container of spec.model.source.download)",
    )
    importlib.import_module("kvgate.cmd.fetch_model").add_arguments(p)

    return parser


# The server-side commands' own dependencies: the `operator` extra (the image installs it). A
# plain `pip install` gives the command line without them.
OPERATOR_EXTRA = frozenset({"kopf", "kubernetes", "cryptography", "uvloop"})


def _resolve(target: str) -> Callable[[argparse.Namespace], int]:
    module_name, func_name = target.split(":")
    module = importlib.import_module(module_name)
    func: Callable[[argparse.Namespace], int] = getattr(module, func_name)
    return func


def _missing_extra(command: str, error: ModuleNotFoundError) -> int:
    """Exit 2 naming the missing module and the way out, for a command whose dependencies are in
    the `operator` extra; anything else missing is a broken install and is raised again."""
    missing = (error.name or "").split(".")[0]
    if missing not in OPERATOR_EXTRA:
        raise error
    print(
        f"kvgate {command}: needs the operator's dependencies (no module named {missing!r}); "
        "install them with pip install 'kvgate[operator]', or run the kvgate image",
        file=sys.stderr,
    )
    return EXIT_USAGE


def _escape_unencodable_output() -> None:
    """Messages quote file names and use ×, − and ≥: a terminal (or a file name from argv) that
    cannot be written as-is gets backslash escapes instead of an exception."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            # A closed or detached stream has nothing to protect.
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None, *, prog: str = "kvgate") -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    _escape_unencodable_output()
    _Parser.json_errors = "--json" in words
    try:
        args = build_parser(prog).parse_args(words)
    except SystemExit as stop:  # --help, or a usage error argparse has already printed
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    finally:
        _Parser.json_errors = False
    try:
        run = _resolve(COMMANDS[args.command])
    except ModuleNotFoundError as error:
        return _missing_extra(args.command, error)
    if args.command not in ONE_SHOT:
        return run(args)
    as_json = bool(getattr(args, "json", False))
    try:
        return run(args)
    except InputError as error:
        return report_failure(args.command, EXIT_USAGE, error.input, error.message, as_json=as_json)
    except KeyboardInterrupt:
        print(f"kvgate {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `kvgate plan ... | head`: the reader has what it wanted
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as error:  # the last resort: a bug, in one line, never a traceback
        detail = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        return report_failure(
            args.command,
            EXIT_INTERNAL,
            "",
            f"internal error ({detail[:300]}); this is a kvgate bug: please report it with the "
            "command line",
            as_json=as_json,
        )


def kubectl_plugin() -> int:
    """``kubectl kvgate ...``: kubectl runs ``kubectl-kvgate`` from PATH with the words after
    ``kvgate`` (flags included), and the environment (KUBECONFIG) as it has it."""
    return main(prog=PLUGIN_PROG)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
