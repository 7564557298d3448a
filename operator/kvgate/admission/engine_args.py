"""What `spec.engine.args` may not carry, and whether `spec.engine.transfer` can work. Pure.

kvgate appends `engine.args` after its own flags, and SGLang's parser (argparse, default
`allow_abbrev=True`, sglang/srt/server_args.py `prepare_server_args`) keeps the last value and
accepts any unique prefix of a flag, and `--flag=value`. So an argument is denied when the part
before `=` is a prefix of a denied flag. No flag SGLang 0.5.23 accepts is a strict prefix of a
denied one (checked against its parser), so nothing allowed is caught.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvgate.admission.policy import ClusterPolicy
from kvgate.admission.result import Problem
from kvgate.api import ModelDeploymentSpec, Role, TransferBackend

_DP = (
    "runs data-parallel engine replicas in one pod (sglang/srt/runtime_context.py "
    "num_dp_ranks_of: dp_size × attn_dp_size schedulers), which kvgate does not size: the pod "
    "requests {tp} nvidia.com/gpu (spec.<role>.tensorParallel) while --dp-size N needs N × that, "
    "and the admission estimate assumes one KV pool per engine",
    "remove it; scale with spec.prefill.replicas and spec.decode.replicas (one engine per pod)",
)
_DP_ATTENTION = (
    "runs attention data parallelism (SGLang 0.5.23 turns --dp-size N --enable-dp-attention into "
    "attn_dp_size N, sglang/srt/arg_groups/parallel_hook.py), which kvgate does not support yet: "
    "the admission estimate ignores how it splits KV heads per rank",
    "remove it (tensor parallelism: spec.<role>.tensorParallel)",
)
_ROLE_SWITCH = (
    "lets POST /pd_role_switch flip a running engine between prefill and decode while its pod "
    "keeps its role label, so the gateway would pair it as the wrong role",
    "remove it; kvgate pins each pod's role: size spec.prefill.replicas and spec.decode.replicas",
)
_API_KEY = (
    "would put the key in plain text in the Deployment, and kvgate's probe, guard and gateway "
    "would not have it (every verdict would be 'cannot tell', no engine would take traffic)",
    "put the key in a Secret and set spec.engine.apiKeySecretRef {name, key}",
)
_ADMIN_KEY = (
    "with a literal value puts the key in plain text in the Deployment",
    "put the key in a Secret, add it to spec.engine.env with valueFrom.secretKeyRef and pass "
    "--admin-api-key $(THAT_VARIABLE)",
)
_TRANSFER = (
    "is set by kvgate from spec.engine.transfer, which also decides the pod's devices, "
    "capabilities and /dev/shm",
    "set spec.engine.transfer.{field} instead",
)
_ROLE = (
    "is set by kvgate from the pod's role",
    "remove it; each role has its own Deployment (spec.prefill, spec.decode)",
)

# flag -> (why it is denied, what to do instead) (SGLang 0.5.23 `python3 -m sglang.launch_server`).
DENIED_ENGINE_FLAGS: Mapping[str, tuple[str, str]] = {
    "--dp-size": _DP,
    "--data-parallel-size": _DP,
    "--attn-dp-size": _DP_ATTENTION,
    "--attention-data-parallel-size": _DP_ATTENTION,
    "--enable-dp-attention": _DP_ATTENTION,
    "--enable-pd-role-switch": _ROLE_SWITCH,
    "--api-key": _API_KEY,
    "--admin-api-key": _ADMIN_KEY,
    "--disaggregation-transfer-backend": (_TRANSFER[0], _TRANSFER[1].format(field="backend")),
    "--disaggregation-ib-device": (_TRANSFER[0], _TRANSFER[1].format(field="ibDevices")),
    "--disaggregation-mode": _ROLE,
}


def denied_flag(arg: str) -> str | None:
    """The denied flag SGLang would read `arg` as (exactly or as an abbreviation), else None."""
    if not arg.startswith("--"):
        return None
    spelled = arg.split("=", 1)[0]
    if spelled == "--":
        return None
    if spelled in DENIED_ENGINE_FLAGS:
        return spelled
    return next((flag for flag in DENIED_ENGINE_FLAGS if flag.startswith(spelled)), None)


def _is_reference(value: str | None) -> bool:
    """`$(VAR)`: Kubernetes expands it from the container's environment."""
    return value is not None and value.startswith("$(") and value.endswith(")")


def _value(args: list[str], index: int) -> str | None:
    arg = args[index]
    if "=" in arg:
        return arg.split("=", 1)[1]
    return args[index + 1] if index + 1 < len(args) else None


def check_engine_args(spec: ModelDeploymentSpec) -> list[Problem]:
    """Denials for engine.args flags that kvgate owns or cannot verify."""
    denials = []
    tp = f"{spec.prefill.tensor_parallel} (prefill) / {spec.decode.tensor_parallel} (decode)"
    for index, arg in enumerate(spec.engine.args):
        flag = denied_flag(arg)
        if flag is None:
            continue
        value = _value(spec.engine.args, index)
        if flag == "--admin-api-key" and _is_reference(value):
            continue
        why, instead = DENIED_ENGINE_FLAGS[flag]
        spelled = arg.split("=", 1)[0]
        if spelled != flag:
            spelled += f" (a prefix of {flag}; SGLang's parser accepts any unique prefix)"
        shown = "" if flag in ("--api-key", "--admin-api-key") or value is None else f" {value}"
        if flag in ("--enable-dp-attention", "--enable-pd-role-switch"):
            shown = ""
        denials.append(
            Problem(
                f"spec.engine.args[{index}]",
                f"{spelled}{shown} {why.format(tp=tp)}; {instead}",
            )
        )
    return denials


def check_transfer(spec: ModelDeploymentSpec) -> tuple[list[Problem], list[Problem]]:
    """spec.engine.transfer: combinations that cannot work are denied; an RDMA backend without a
    device, or a device only a privileged container can use, is a warning."""
    transfer = spec.engine.transfer
    backend = transfer.backend
    denials: list[Problem] = []
    warnings: list[Problem] = []
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
    # Only when asked for by name in the deprecated engine.transferBackend: the API server fills
    # transfer.backend with its default (mooncake) on every ModelDeployment, so a warning on it
    # would greet every apply; the default also serves clusters whose engines never leave one
    # RDMA-less node.
    explicit = spec.engine.transfer_backend is not None
    if backend is TransferBackend.MOONCAKE and transfer.rdma is None and explicit:
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
    for role in (Role.PREFILL, Role.DECODE):
        role_spec = spec.prefill if role is Role.PREFILL else spec.decode
        rdma = transfer.rdma
        if rdma is not None and rdma.resource_name is not None:
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
    return denials, warnings


def check_engine(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """engine.args flags and the engine.transfer section (an admission Check)."""
    denials, warnings = check_transfer(spec)
    return check_engine_args(spec) + denials, warnings
