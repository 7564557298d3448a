"""Which node directories a ModelDeployment may mount (pure): the cluster admin's allow-lists.

A hostPath puts the node's own files in the engine container, and anyone who may ``exec`` into
the pod (the namespace's editors) reads them; an RDMA hostPath runs the engine privileged besides.
Pod Security would refuse both only where a namespace is labelled for it, so kvgate decides
itself, from the chart's ``hostPaths`` values:

- ``spec.model.source.hostPath.path`` must lie in a directory of ``hostPaths.modelPrefixes``
  (empty by default: no hostPath source until the admin names the node's weights cache);
- ``spec.engine.transfer.rdma.hostPath`` must be one of ``hostPaths.rdmaDevices`` (by default
  only ``/dev/infiniband``, the InfiniBand device directory).

Paths are compared as written, in normal form only (no ``.`` or ``..`` segments, no doubled
``/``): the kubelet mounts the path it is given, so ``<prefix>/../etc`` must never pass as
``<prefix>``.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass

from kvgate.admission.result import Problem
from kvgate.api.models import ModelDeploymentSpec

MODEL_PREFIXES_SETTING = "hostPaths.modelPrefixes"  # the chart value
MODEL_PREFIXES_ENV = "KVGATE_MODEL_HOST_PATH_PREFIXES"  # a JSON list, from the chart value
RDMA_DEVICES_SETTING = "hostPaths.rdmaDevices"  # the chart value
RDMA_DEVICES_ENV = "KVGATE_RDMA_HOST_PATHS"  # a JSON list, from the chart value
INFINIBAND_DIRECTORY = "/dev/infiniband"
MAX_ENTRIES = 64  # a longer allow-list is a mistake, not a policy
MODEL_FIELD = "spec.model.source.hostPath.path"
RDMA_FIELD = "spec.engine.transfer.rdma.hostPath"
_WAY_OUT = "or use a persistentVolumeClaim, an image or a download source"


def normal_form_problem(path: str) -> str | None:
    """Why ``path`` is not an absolute path in normal form, or None when it is one."""
    if not path.startswith("/"):
        return "is not absolute"
    parts = path.split("/")[1:]
    if ".." in parts or "." in parts:
        return "holds '.' or '..' segments"
    if posixpath.normpath(path) != path:
        return "is not in normal form (a doubled or trailing '/')"
    return None


def under(path: str, prefix: str) -> bool:
    """``path`` is ``prefix`` or lies inside it (both in normal form)."""
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def _check_entries(setting: str, env: str, entries: tuple[str, ...]) -> None:
    if len(entries) > MAX_ENTRIES:
        raise ValueError(
            f"{env} (the chart value {setting}): {len(entries)} entries, at most {MAX_ENTRIES}"
        )
    for entry in entries:
        why = normal_form_problem(entry)
        if why is None and entry == "/":
            why = "is the node's root: every path would be allowed"
        if why is not None:
            raise ValueError(
                f"{env} (the chart value {setting}): {entry!r} {why}; list absolute directories "
                "in normal form, e.g. /mnt/models"
            )


@dataclass(frozen=True)
class HostPathPolicy:
    """The node directories the cluster admin allows: model weights under ``model_prefixes``,
    RDMA devices from exactly ``rdma_devices``."""

    model_prefixes: tuple[str, ...] = ()
    rdma_devices: tuple[str, ...] = (INFINIBAND_DIRECTORY,)

    def __post_init__(self) -> None:
        _check_entries(MODEL_PREFIXES_SETTING, MODEL_PREFIXES_ENV, self.model_prefixes)
        _check_entries(RDMA_DEVICES_SETTING, RDMA_DEVICES_ENV, self.rdma_devices)


def parse_path_list(raw: str | None, setting: str, env: str) -> tuple[str, ...] | None:
    """A JSON list of paths from ``env`` (None when unset); ValueError naming the chart value."""
    if raw is None or raw.strip() == "":
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(
            f"{env}={raw!r} (the chart value {setting}): must be a JSON list of directories, "
            'e.g. ["/mnt/models"]'
        )
    return tuple(value)


def host_path_policy(model_prefixes: str | None, rdma_devices: str | None) -> HostPathPolicy:
    """The policy from KVGATE_MODEL_HOST_PATH_PREFIXES and KVGATE_RDMA_HOST_PATHS (unset: the
    defaults); ValueError naming the chart value."""
    prefixes = parse_path_list(model_prefixes, MODEL_PREFIXES_SETTING, MODEL_PREFIXES_ENV)
    devices = parse_path_list(rdma_devices, RDMA_DEVICES_SETTING, RDMA_DEVICES_ENV)
    defaults = HostPathPolicy()
    return HostPathPolicy(
        model_prefixes=defaults.model_prefixes if prefixes is None else prefixes,
        rdma_devices=defaults.rdma_devices if devices is None else devices,
    )


def _listed(entries: tuple[str, ...]) -> str:
    return ", ".join(entries) if entries else "empty"


def model_host_path_problem(path: str, policy: HostPathPolicy) -> Problem | None:
    """The denial of a model hostPath outside the allowed prefixes, or None."""
    why = normal_form_problem(path)
    if why is not None:
        return Problem(
            MODEL_FIELD,
            f"{path} {why}: kvgate allows a hostPath by the directories it names, so it must "
            "name the directory itself, as an absolute path without '.' or '..' segments or a "
            "doubled '/'",
        )
    if any(under(path, prefix) for prefix in policy.model_prefixes):
        return None
    if policy.model_prefixes:
        allowed = f"the directories the cluster admin allows ({_listed(policy.model_prefixes)})"
        ask = (
            "move the weights under one of them, or ask the cluster admin to add their "
            f"directory to the chart value {MODEL_PREFIXES_SETTING}"
        )
    else:
        allowed = (
            f"a directory the cluster admin allows (the chart value {MODEL_PREFIXES_SETTING} is "
            "empty, so no hostPath source is allowed)"
        )
        ask = (
            f"ask the cluster admin to list the nodes' weights directory (e.g. /mnt/models) in "
            f"the chart value {MODEL_PREFIXES_SETTING}"
        )
    return Problem(
        MODEL_FIELD,
        f"{path} is not under {allowed}: a hostPath puts the node's files in the engine "
        f"container, where anyone who may exec into the pod reads them; {ask}, {_WAY_OUT}",
    )


def rdma_host_path_problem(path: str, policy: HostPathPolicy) -> Problem | None:
    """The denial of an RDMA hostPath that is not an allowed device directory, or None."""
    if path in policy.rdma_devices:
        return None
    return Problem(
        RDMA_FIELD,
        f"{path} is not an RDMA device directory the cluster admin allows "
        f"({_listed(policy.rdma_devices)}; the chart value {RDMA_DEVICES_SETTING}): the engine "
        "container runs privileged with it, so any other node directory would be the "
        f"privileged engine's to read and write; set it to {INFINIBAND_DIRECTORY} (or a "
        f"directory listed in {RDMA_DEVICES_SETTING}), or use transfer.rdma.resourceName with "
        "an RDMA device plugin",
    )


def check_host_paths(spec: ModelDeploymentSpec, policy: HostPathPolicy) -> list[Problem]:
    """The denials of the spec's node directories under the cluster's ``policy``."""
    denials: list[Problem] = []
    source = spec.model.source
    if source is not None and source.host_path is not None:
        problem = model_host_path_problem(source.host_path.path, policy)
        if problem is not None:
            denials.append(problem)
    rdma = spec.engine.transfer.rdma
    if rdma is not None and rdma.host_path is not None:
        problem = rdma_host_path_problem(rdma.host_path, policy)
        if problem is not None:
            denials.append(problem)
    for role in ("prefill", "decode"):
        volumes = getattr(spec, role).extra_volumes
        denials += [
            Problem(
                f"spec.{role}.extraVolumes[{index}].hostPath",
                "a node directory is not an extra volume kvgate adds: the cluster admin allows "
                f"node directories only as the model's weights ({MODEL_PREFIXES_SETTING}) and "
                f"the RDMA devices ({RDMA_DEVICES_SETTING}); use model.source.hostPath, a "
                "persistentVolumeClaim, a configMap or a secret",
            )
            for index, volume in enumerate(volumes)
            if "hostPath" in volume
        ]
    return denials
