"""Admission checks of what a platform team adds to kvgate's pods (pure).

A role's podLabels, podAnnotations, extraVolumes, extraVolumeMounts, extraEnv and resources, and
the router's resources, may adapt the pods to a cluster, never touch what the gate depends on:
kvgate's identity labels and annotations (and those smg's discovery and the Deployment and
LeaderWorkerSet controllers read), its volumes and mount paths, the engine's API key, and the
accelerator count each engine pod gets (tensorParallel / nodes of the role's
acceleratorResource). A value that would is denied naming the field; one Kubernetes would refuse
in a pod (a malformed label) is denied here rather than as pods that are never created.
"""

from __future__ import annotations

import re

from kvgate_engine.launcher import API_KEY_ENV

from kvgate.admission.policy import ClusterPolicy
from kvgate.admission.result import Problem
from kvgate.api import labels, multinode
from kvgate.api.models import ModelDeploymentSpec, Resources, Role, RoleSpec
from kvgate.objects.builders import KVGATE_MOUNT_PATHS, KVGATE_VOLUMES

# A Kubernetes qualified name (label and annotation keys): [<DNS subdomain>/]<name>.
_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
QUALIFIED_NAME = re.compile(rf"(?:(?P<prefix>{_PREFIX})/)?(?P<name>{_NAME})")
LABEL_VALUE = re.compile(rf"({_NAME})?")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# Accelerators as device plugins name them: a second kind beside acceleratorResource would give
# an engine GPUs the estimate does not size.
GPU_RESOURCE = re.compile(
    r"nvidia\.com/(gpu|mig-.+)|amd\.com/gpu|gpu\.intel\.com/.+|habana\.ai/gaudi"
)
_RESERVED_WAY_OUT = (
    "kvgate keeps kvgate.io, sglang.ai and leaderworkerset.sigs.k8s.io keys, "
    "app.kubernetes.io/managed-by, pod-template-hash and "
    "controller.kubernetes.io/pod-deletion-cost for itself (the gate, the routing and the "
    "pods' ownership depend on them); use another key, e.g. example.com/team"
)


def _key_problem(key: str) -> str | None:
    """Why Kubernetes refuses ``key`` as a label or annotation key, or None."""
    parsed = QUALIFIED_NAME.fullmatch(key)
    if parsed is None:
        return (
            "is not a Kubernetes label or annotation key: an optional DNS subdomain and '/', "
            "then a name of letters, digits, '-', '_' and '.' that starts and ends with a "
            "letter or digit, e.g. example.com/team"
        )
    if len(parsed["name"]) > 63 or len(parsed["prefix"] or "") > 253:
        return "is too long for a Kubernetes key (name at most 63, prefix at most 253 characters)"
    return None


def _metadata_problems(where: str, role_spec: RoleSpec) -> list[Problem]:
    problems = []
    for field, entries in (
        ("podLabels", role_spec.pod_labels),
        ("podAnnotations", role_spec.pod_annotations),
    ):
        for key, value in entries.items():
            path = f"{where}.{field}[{key}]"
            if labels.reserved_key(key):
                problems.append(Problem(path, f"{key} is kvgate's own key; {_RESERVED_WAY_OUT}"))
            elif (problem := _key_problem(key)) is not None:
                problems.append(Problem(path, f"{key!r} {problem}"))
            elif field == "podLabels" and not LABEL_VALUE.fullmatch(value):
                problems.append(
                    Problem(
                        path,
                        f"{value!r} is not a Kubernetes label value: at most 63 letters, "
                        "digits, '-', '_' and '.', starting and ending with a letter or digit "
                        "(or empty); put free text in podAnnotations",
                    )
                )
    return problems


def _same_quantity(given: int | str, count: int) -> bool:
    try:
        return float(str(given)) == count
    except ValueError:
        return False


def _resource_problems(where: str, role_spec: RoleSpec) -> list[Problem]:
    accelerator = role_spec.accelerator_resource
    count = multinode.gpus_per_pod(role_spec)
    shape = f"tensorParallel {role_spec.tensor_parallel}"
    if role_spec.nodes > 1:
        shape += f" / nodes {role_spec.nodes}"
    problems = []
    for part in ("limits", "requests"):
        for name, quantity in getattr(role_spec.resources, part).items():
            path = f"{where}.resources.{part}[{name}]"
            if name == accelerator and not _same_quantity(quantity, count):
                problems.append(
                    Problem(
                        path,
                        f"{quantity} conflicts with the {count} {accelerator} kvgate gives each "
                        f"engine pod ({shape}); remove it (kvgate sets it) or change "
                        f"{where.removeprefix('spec.')}.tensorParallel",
                    )
                )
            elif name != accelerator and GPU_RESOURCE.fullmatch(name):
                problems.append(
                    Problem(
                        path,
                        f"{name} is an accelerator, but this role's acceleratorResource is "
                        f"{accelerator} (kvgate requests {count} of it per pod); set "
                        f"{where.removeprefix('spec.')}.acceleratorResource: {name} and remove "
                        "it from resources",
                    )
                )
    return problems


def _volume_problems(where: str, role_spec: RoleSpec) -> list[Problem]:
    problems = []
    names: list[str] = []
    for index, volume in enumerate(role_spec.extra_volumes):
        path = f"{where}.extraVolumes[{index}]"
        name = volume.get("name")
        if not isinstance(name, str) or not DNS_LABEL.fullmatch(name) or len(name) > 63:
            problems.append(
                Problem(
                    f"{path}.name",
                    "every extra volume needs a name that is a DNS label (lowercase letters, "
                    "digits and '-', at most 63), e.g. ca-bundle",
                )
            )
            continue
        if name in KVGATE_VOLUMES:
            problems.append(
                Problem(
                    f"{path}.name",
                    f"{name} is the name of a volume kvgate builds ({', '.join(KVGATE_VOLUMES)});"
                    " pick another name",
                )
            )
        elif name in names:
            problems.append(Problem(f"{path}.name", f"{name} is named twice; rename one"))
        names.append(name)
    mounted: set[str] = set()
    for index, mount in enumerate(role_spec.extra_volume_mounts):
        path = f"{where}.extraVolumeMounts[{index}]"
        if mount.name not in names or mount.name in KVGATE_VOLUMES:
            problems.append(
                Problem(
                    f"{path}.name",
                    f"{mount.name} is not one of {where.removeprefix('spec.')}.extraVolumes "
                    f"({', '.join(names) or 'none'}); mount only the role's own extra volumes",
                )
            )
        clash = next((p for p in KVGATE_MOUNT_PATHS if _overlaps(mount.mount_path, p)), None)
        if clash is not None:
            problems.append(
                Problem(
                    f"{path}.mountPath",
                    f"{mount.mount_path} is at, inside or above {clash}, where kvgate mounts "
                    f"its own volume ({', '.join(KVGATE_MOUNT_PATHS)}); mount elsewhere, e.g. "
                    "/etc/ssl/custom",
                )
            )
        elif mount.mount_path in mounted:
            problems.append(
                Problem(f"{path}.mountPath", f"{mount.mount_path} is mounted twice; keep one")
            )
        mounted.add(mount.mount_path)
    return problems


def _overlaps(path: str, kvgate_path: str) -> bool:
    path = path.rstrip("/") or "/"
    return (
        path == kvgate_path
        or kvgate_path.startswith(path.rstrip("/") + "/")
        or (path.startswith(kvgate_path + "/"))
    )


def _env_problems(where: str, role_spec: RoleSpec) -> list[Problem]:
    return [
        Problem(
            f"{where}.extraEnv[{index}].name",
            f"{API_KEY_ENV} is kvgate's: it carries spec.engine.apiKeySecretRef to the engine; "
            "set the key there",
        )
        for index, env in enumerate(role_spec.extra_env)
        if env.name == API_KEY_ENV
    ]


def _router_problems(resources: Resources) -> list[Problem]:
    return [
        Problem(
            f"spec.router.resources.{part}[{name}]",
            f"{name} is an accelerator; the router (smg) runs on CPU: remove it",
        )
        for part in ("limits", "requests")
        for name in getattr(resources, part)
        if GPU_RESOURCE.fullmatch(name)
    ]


def _roles(spec: ModelDeploymentSpec) -> list[tuple[str, RoleSpec]]:
    return [
        (f"spec.{Role.PREFILL.value}", spec.prefill),
        (f"spec.{Role.DECODE.value}", spec.decode),
    ]


def check_pod_fit(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """Each role's pod customization and the router's resources against what kvgate keeps."""
    denials: list[Problem] = []
    for where, role_spec in _roles(spec):
        denials += _metadata_problems(where, role_spec)
        denials += _resource_problems(where, role_spec)
        denials += _volume_problems(where, role_spec)
        denials += _env_problems(where, role_spec)
        rdma = spec.engine.transfer.rdma
        if rdma is not None and rdma.resource_name == role_spec.accelerator_resource:
            denials.append(
                Problem(
                    "spec.engine.transfer.rdma.resourceName",
                    f"{rdma.resource_name} is also {where.removeprefix('spec.')}"
                    ".acceleratorResource: one resource cannot be both the GPUs and the RDMA "
                    "device; name the RDMA device plugin's resource",
                )
            )
    denials += _router_problems(spec.router.resources)
    return denials, []
