"""What `spec.engine.args` may not carry, and whether `spec.engine.transfer` can work. Pure.

kvgate appends `engine.args` after its own flags, and SGLang's parser (argparse,
sglang/srt/server_args.py `prepare_server_args`) keeps the last value of a flag, accepts any
unique prefix of it (`allow_abbrev=True`) and `--flag=value`. So every flag kvgate passes with a
value is denied in `engine.args`, under every spelling SGLang reads as it (exact, an abbreviation,
`=`, SGLang's own aliases), naming the spec field that sets it; so are flags kvgate cannot verify
(data parallelism, the role switch, plain-text keys) and `--config`, whose YAML file would bring
any of them back out of admission's sight. The arguments are read by
:mod:`kvgate_engine.flag_reader`, the way argparse reads them; a prefix of a denied flag is denied
(SGLang reads it as that flag, or refuses to start on an ambiguous one).
tests/conformance/test_engine_args_spellings.py asks each supported SGLang release's own parser
about every spelling of every option: each one it reads as a denied flag is denied here, no
other option is, and each table flag (with all its aliases) is an option of the release. A `--`
is denied too: nothing after it is a flag to argparse, and SGLang, which takes no positional
argument, would refuse to start with it.

Switches kvgate passes are allowed: a store_true flag cannot be turned off by repeating it, and
none of them has a `--no-` form (the conformance test checks both):

- `--enable-metrics`: kvgate always passes it; repeating it changes nothing.
- `--disaggregation-enable-kv-checksum`: kvgate passes it when `spec.safety.kvChecksum` is on
  (the default) and the release has it (>= 0.5.21). In `engine.args` it can only turn the
  checksums on, never off: it adds a check on KV transfers rather than removing one (on a release
  without the flag the engine exits 2 at start-up, naming it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvgate_engine.flag_reader import END_OF_OPTIONS, FlagUse, read_flags

from kvgate.admission.policy import ClusterPolicy
from kvgate.admission.result import Problem
from kvgate.api.models import ModelDeploymentSpec, Role, TransferBackend


@dataclass(frozen=True)
class DeniedFlag:
    """Why an engine flag is denied in engine.args, and what to do instead."""

    why: str  # continues "SGLang reads it as --flag, "
    instead: str
    switch: bool = False  # takes no value
    secret: bool = False  # its value is never repeated in a message


def _kvgate_sets(
    field: str, consequence: str, instead: str | None = None, sets: str | None = None
) -> DeniedFlag:
    return DeniedFlag(
        f"which kvgate sets {sets or 'from ' + field} ({consequence}); kvgate appends engine.args "
        "after its own flags and SGLang keeps the last value, so this one would replace kvgate's",
        instead or f"remove it and set {field}",
    )


_MODEL_PATH = _kvgate_sets(
    "spec.model.path", "the model the engines load, whose config admission sizes the pool from"
)
_SERVED_NAME = _kvgate_sets(
    "spec.model.name", "the name the gateway routes by and kvgate's probe asks the engine for"
)
_HOST = _kvgate_sets(
    "spec.engine.port",
    "the engine listens on all of the pod's addresses, where kvgate's probe and guard, the "
    "Service and the gateway reach it",
    "remove it; spec.engine.port sets the port",
    sets="to 0.0.0.0",
)
_PORT = _kvgate_sets(
    "spec.engine.port", "the port kvgate's probe and guard, the Service and the gateway use"
)
_CONTEXT = _kvgate_sets(
    "spec.model.contextLength",
    "the window every engine's KV pool is verified against; another value here would let the "
    "engines accept prompts longer than their verified pools hold",
)
_MAX_TOTAL = _kvgate_sets(
    "spec.prefill.maxTotalTokens / spec.decode.maxTotalTokens",
    "a cap on the KV pool, passed when the field is set and checked by admission against the "
    "context; one here would be out of the admission estimate's sight",
)
_MEM_FRACTION = _kvgate_sets(
    "spec.prefill.memFractionStatic / spec.decode.memFractionStatic",
    "the share of GPU memory the admission estimate sizes the KV pool from",
)
_TP = _kvgate_sets(
    "spec.prefill.tensorParallel / spec.decode.tensorParallel",
    "each pod requests that many nvidia.com/gpu and the admission estimate splits the weights "
    "over them",
)
_PAGE_SIZE = _kvgate_sets("spec.engine.pageSize", "the admission estimate rounds the pool to it")
_KV_DTYPE = _kvgate_sets(
    "spec.engine.kvCacheDtype",
    "the admission estimate sizes each token's KV from it, and admission checks the value "
    "against the image's SGLang release",
)
_KV_CANARY = _kvgate_sets("spec.safety.kvCanary", "SGLang's KV canary, on as `log` when set")
_BOOTSTRAP_PORT = _kvgate_sets(
    "spec.engine.bootstrapPort",
    "the prefill pods' KV bootstrap port, which the gateway learns from the pod's annotation",
)
_TRANSFER = "spec.engine.transfer also decides the pod's devices, capabilities and /dev/shm"
_TRANSFER_BACKEND = _kvgate_sets("spec.engine.transfer.backend", _TRANSFER)
_IB_DEVICE = _kvgate_sets("spec.engine.transfer.ibDevices", _TRANSFER)
_ROLE = _kvgate_sets(
    "spec.prefill / spec.decode",
    "each role has its own Deployment",
    "remove it; size spec.prefill.replicas and spec.decode.replicas",
    sets="from the pod's role",
)
_TOPOLOGY = DeniedFlag(
    "which is kvgate's to set: it derives --nnodes, --node-rank and --dist-init-addr from "
    "spec.<role>.nodes and each engine's LeaderWorkerSet group (a value here would make a rank "
    "join the wrong engine)",
    "remove it and set spec.prefill.nodes / spec.decode.nodes",
)
_DP = DeniedFlag(
    "which runs data-parallel engine replicas in one pod (sglang/srt/runtime_context.py "
    "num_dp_ranks_of: dp_size × attn_dp_size schedulers), which kvgate does not size: the pod "
    "requests {tp} nvidia.com/gpu (spec.<role>.tensorParallel) while --dp-size N needs N × that, "
    "and the admission estimate assumes one KV pool per engine",
    "remove it; scale with spec.prefill.replicas and spec.decode.replicas (one engine per pod)",
)
_DP_ATTENTION = (
    "which runs attention data parallelism (SGLang 0.5.23 turns --dp-size N "
    "--enable-dp-attention into attn_dp_size N, sglang/srt/arg_groups/parallel_hook.py), which "
    "kvgate does not support yet: the admission estimate ignores how it splits KV heads per rank",
    "remove it (tensor parallelism: spec.<role>.tensorParallel)",
)
_ROLE_SWITCH = DeniedFlag(
    "which lets POST /pd_role_switch flip a running engine between prefill and decode while its "
    "pod keeps its role label, so the gateway would pair it as the wrong role",
    "remove it; kvgate pins each pod's role: size spec.prefill.replicas and spec.decode.replicas",
    switch=True,
)
_API_KEY = DeniedFlag(
    "which would put the key in plain text in the Deployment, and kvgate's probe, guard and "
    "gateway would not have it (every verdict would be 'cannot tell', no engine would take "
    "traffic)",
    "put the key in a Secret and set spec.engine.apiKeySecretRef {name, key}",
    secret=True,
)
_ADMIN_KEY = DeniedFlag(
    "which, with a literal value, puts the key in plain text in the Deployment",
    "put the key in a Secret, add it to spec.engine.env with valueFrom.secretKeyRef and pass "
    "--admin-api-key $(THAT_VARIABLE)",
    secret=True,
)
_CONFIG = DeniedFlag(
    "which reads more flags from a YAML file in the container, out of admission's sight: any "
    "flag denied here, or a cap on the KV pool, could come back through it",
    "put the flags in spec.engine.args, where admission checks them",
)

# flag -> why it is denied (SGLang 0.5.19–0.5.23 `python3 -m sglang.launch_server`, every alias of
# each denied flag included: the conformance test fails on one left out).
DENIED_ENGINE_FLAGS: Mapping[str, DeniedFlag] = {
    # Set by kvgate's launcher (kvgate_engine.launcher.engine_argv).
    "--model-path": _MODEL_PATH,
    "--model": _MODEL_PATH,
    "--served-model-name": _SERVED_NAME,
    "--host": _HOST,
    "--port": _PORT,
    "--context-length": _CONTEXT,
    "--max-total-tokens": _MAX_TOTAL,
    "--mem-fraction-static": _MEM_FRACTION,
    "--tp-size": _TP,
    "--tensor-parallel-size": _TP,
    "--page-size": _PAGE_SIZE,
    "--kv-cache-dtype": _KV_DTYPE,
    "--kv-canary": _KV_CANARY,
    "--disaggregation-mode": _ROLE,
    "--disaggregation-transfer-backend": _TRANSFER_BACKEND,
    "--disaggregation-ib-device": _IB_DEVICE,
    "--disaggregation-bootstrap-port": _BOOTSTRAP_PORT,
    "--api-key": _API_KEY,
    "--nnodes": _TOPOLOGY,
    "--node-rank": _TOPOLOGY,
    "--dist-init-addr": _TOPOLOGY,
    "--nccl-init-addr": _TOPOLOGY,
    # What kvgate cannot verify or size.
    "--dp-size": _DP,
    "--data-parallel-size": _DP,
    "--attn-dp-size": DeniedFlag(*_DP_ATTENTION),
    "--attention-data-parallel-size": DeniedFlag(*_DP_ATTENTION),
    "--enable-dp-attention": DeniedFlag(*_DP_ATTENTION, switch=True),
    "--enable-pd-role-switch": _ROLE_SWITCH,
    "--admin-api-key": _ADMIN_KEY,
    "--config": _CONFIG,
}
# SGLang's other names of denied flags: alias -> the flag (the conformance test checks each one).
SGLANG_ALIASES: Mapping[str, str] = {
    "--model": "--model-path",
    "--tensor-parallel-size": "--tp-size",
    "--nccl-init-addr": "--dist-init-addr",
    "--data-parallel-size": "--dp-size",
    "--attention-data-parallel-size": "--attn-dp-size",
}
DENIED_SWITCHES = frozenset(flag for flag, denied in DENIED_ENGINE_FLAGS.items() if denied.switch)
# The switches kvgate passes, which engine.args may repeat (see the module docstring).
KVGATE_SWITCHES = ("--enable-metrics", "--disaggregation-enable-kv-checksum")


def denied_uses(args: list[str]) -> list[FlagUse]:
    """Every item of engine.args that SGLang would read as a denied flag (exactly, abbreviated,
    or as a prefix of several), before an admin key given as a `$(VAR)` reference is let go."""
    return read_flags(args, DENIED_ENGINE_FLAGS, DENIED_SWITCHES)


def _is_reference(value: str | None) -> bool:
    """`$(VAR)`: Kubernetes expands it from the container's environment."""
    return value is not None and value.startswith("$(") and value.endswith(")")


def _as_read(use: FlagUse) -> str:
    """How SGLang reads what was written, e.g. `--context-length (its parser accepts ...)`."""
    if use.ambiguous:
        return (
            f"{use.flag} or {', '.join(use.flags[1:])} (a prefix of each: SGLang's parser reads "
            "a prefix of one flag as that flag and refuses to start on a prefix of several)"
        )
    notes = []
    if use.abbreviated:
        notes.append("SGLang's parser accepts any unique prefix of a flag")
    if use.flag in SGLANG_ALIASES:
        notes.append(f"SGLang's alias of {SGLANG_ALIASES[use.flag]}")
    return f"{use.flag} ({'; '.join(notes)})" if notes else use.flag


def _written(use: FlagUse) -> str:
    """What was written; never the value of a flag that holds a secret (or may: an ambiguous
    prefix of one)."""
    if use.value is None or any(DENIED_ENGINE_FLAGS[flag].secret for flag in use.flags):
        return use.written
    return f"{use.written}={use.value}" if use.explicit else f"{use.written} {use.value}"


# SGLang reports these in /server_info (their fields and launch_command; upstream
# sgl-project/sglang#37457), which an engine without --api-key serves to anyone who reaches it:
# an admin key alone guards only SGLang's admin routes, and smg forwards GET /get_server_info
# from its clients to a worker.
SECRETS_ONLY_WITH_API_KEY = ("--admin-api-key", "--ssl-keyfile-password")
# Exact SGLang flags that are a prefix of one of them (argparse reads an exact flag first).
_PLAIN_PREFIXES = frozenset({"--ssl-keyfile"})


def check_secrets_need_api_key(spec: ModelDeploymentSpec) -> list[Problem]:
    """A secret in engine.args without spec.engine.apiKeySecretRef: the engine would hand it to
    anyone who asks its /server_info, through the router too."""
    if spec.engine.api_key_secret_ref is not None:
        return []
    denials = []
    for index, item in enumerate(spec.engine.args):
        flag = item.partition("=")[0]
        if len(flag) <= 2 or not flag.startswith("--") or flag in _PLAIN_PREFIXES:
            continue
        named = [secret for secret in SECRETS_ONLY_WITH_API_KEY if secret.startswith(flag)]
        if not named:
            continue
        denials.append(
            Problem(
                f"spec.engine.args[{index}]",
                f"{flag}: SGLang reports {' or '.join(named)} in /server_info (its value and the "
                "command line, sgl-project/sglang#37457), and an engine without an API key "
                "answers /server_info to anyone who reaches it, the router's GET "
                "/get_server_info included; set spec.engine.apiKeySecretRef {name, key} too "
                "(the engine then answers only with that key, and kvgate, its guard and the "
                "router send it), or remove the flag",
            )
        )
    return denials


def check_engine_args(spec: ModelDeploymentSpec) -> list[Problem]:
    """Denials for engine.args flags that kvgate sets itself or cannot verify."""
    denials = []
    tp = f"{spec.prefill.tensor_parallel} (prefill) / {spec.decode.tensor_parallel} (decode)"
    for use in denied_uses(spec.engine.args):
        if use.flag == "--admin-api-key" and not use.ambiguous and _is_reference(use.value):
            continue
        denied = DENIED_ENGINE_FLAGS[use.flag]
        denials.append(
            Problem(
                f"spec.engine.args[{use.index}]",
                f"{_written(use)}: SGLang reads it as {_as_read(use)}, "
                f"{denied.why.format(tp=tp)}; {denied.instead}",
            )
        )
    if END_OF_OPTIONS in spec.engine.args:
        index = spec.engine.args.index(END_OF_OPTIONS)
        denials.append(
            Problem(
                f"spec.engine.args[{index}]",
                "-- ends SGLang's options, and SGLang takes no positional argument: the engine "
                f"would refuse to start with it and the {len(spec.engine.args) - index - 1} "
                "argument(s) after it (exit 2); remove it",
            )
        )
    return denials


def check_transfer(spec: ModelDeploymentSpec) -> tuple[list[Problem], list[Problem]]:
    """spec.engine.transfer: combinations that cannot work are denied; an RDMA backend without a
    device, or a device only a privileged container can use, is a warning."""
    denials = [*_transfer_denials(spec), *_rdma_resource_denials(spec)]
    return denials, _transfer_warnings(spec)


def _transfer_denials(spec: ModelDeploymentSpec) -> list[Problem]:
    """A TCP backend given RDMA devices, or devices the pod does not get."""
    transfer = spec.engine.transfer
    backend = transfer.backend
    denials: list[Problem] = []
    if backend is TransferBackend.MOONCAKE_TCP and transfer.rdma is not None:
        denials.append(
            Problem(
                "spec.engine.transfer.rdma",
                "backend mooncake_tcp moves KV over TCP and never uses an RDMA device (SGLang "
                "sets MC_FORCE_TCP=1, sglang/srt/arg_groups/pd_disaggregation_hook.py); remove "
                "transfer.rdma, or set transfer.backend mooncake to use RDMA",
            )
        )
    if transfer.ib_devices and backend is TransferBackend.MOONCAKE_TCP:
        denials.append(
            Problem(
                "spec.engine.transfer.ibDevices",
                f"{len(transfer.ib_devices)} device(s) given, but backend mooncake_tcp drops "
                "--disaggregation-ib-device (TCP only); remove transfer.ibDevices, or set "
                "transfer.backend mooncake",
            )
        )
    elif transfer.ib_devices and transfer.rdma is None:
        denials.append(
            Problem(
                "spec.engine.transfer.ibDevices",
                f"names {len(transfer.ib_devices)} RDMA device(s) "
                f"({', '.join(transfer.ib_devices)}), but the pod gets none; set "
                "transfer.rdma.resourceName (a device plugin resource such as "
                "rdma/hca_shared_devices_a) or transfer.rdma.hostPath (/dev/infiniband)",
            )
        )
    return denials


def _transfer_warnings(spec: ModelDeploymentSpec) -> list[Problem]:
    """An RDMA backend asked for by name without a device, or a device from the node's path."""
    transfer = spec.engine.transfer
    warnings: list[Problem] = []
    # Only when asked for by name in the deprecated engine.transferBackend: the API server fills
    # transfer.backend with its default (mooncake) on every ModelDeployment, so a warning on it
    # would greet every apply; the default also serves clusters whose engines never leave one
    # RDMA-less node.
    explicit = spec.engine.transfer_backend is not None
    if transfer.backend is TransferBackend.MOONCAKE and transfer.rdma is None and explicit:
        warnings.append(
            Problem(
                "spec.engine.transfer",
                "backend mooncake moves KV over RDMA, but transfer.rdma is not set, so the "
                "engine pods get no RDMA device and no IPC_LOCK; on RDMA nodes set "
                "transfer.rdma and transfer.ibDevices, elsewhere use transfer.backend "
                "mooncake_tcp",
            )
        )
    if transfer.rdma is not None and transfer.rdma.host_path is not None:
        warnings.append(
            Problem(
                "spec.engine.transfer.rdma.hostPath",
                f"{transfer.rdma.host_path} from the node works only in a privileged engine "
                "container (the device cgroup admits no hostPath device otherwise), so the "
                "engine runs privileged; use transfer.rdma.resourceName with an RDMA device "
                "plugin to keep it unprivileged",
            )
        )
    return warnings


def _rdma_resource_denials(spec: ModelDeploymentSpec) -> list[Problem]:
    """A role's resources setting the RDMA device resource kvgate sets from transfer.rdma."""
    rdma = spec.engine.transfer.rdma
    if rdma is None or rdma.resource_name is None:
        return []
    denials: list[Problem] = []
    for role in (Role.PREFILL, Role.DECODE):
        role_spec = spec.prefill if role is Role.PREFILL else spec.decode
        for kind, given in (
            ("limits", role_spec.resources.limits),
            ("requests", role_spec.resources.requests),
        ):
            if rdma.resource_name in given:
                denials.append(
                    Problem(
                        f"spec.{role.value}.resources.{kind}",
                        f"sets {rdma.resource_name} ({given[rdma.resource_name]}), which "
                        f"kvgate sets from spec.engine.transfer.rdma.count ({rdma.count}); "
                        "remove it there",
                    )
                )
    return denials


def check_engine(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """engine.args flags and the engine.transfer section (an admission Check)."""
    denials, warnings = check_transfer(spec)
    flags = check_engine_args(spec)
    denied = {problem.field for problem in flags}  # a literal admin key is denied once
    secrets = [p for p in check_secrets_need_api_key(spec) if p.field not in denied]
    return flags + secrets + denials, warnings
