"""Admission checks of spec.model.source and what the weights need around it (pure).

Denied: a model.path outside ``/models`` (where the source is mounted, so the engine would find
nothing there), and a download emptyDir smaller than the weights (the pod would be evicted
mid-download). Warned: a hub revision that is not a commit (two pods may load two models), a
token sent over plain http, a hostPath (outside the baseline Pod Security level), a /dev/shm at
or above a role's memory limit, and a download that may not finish within
rollout.verifyTimeoutSeconds. Without a source: a model.path under ``/models`` (nothing mounts
it: kvgate mounts only a source there and no extraVolumeMount may, so only the engine image
could hold the weights), and a hub id (the engine downloads it itself at start, unpinned and
unchecked). A path elsewhere is the user's own choice (an image that carries the weights, or
their extraVolumeMounts) and is not second-guessed.
"""

from __future__ import annotations

import posixpath
import re

from kvgate_engine.estimator import estimate_weights_gib

from kvgate.admission.policy import ClusterPolicy
from kvgate.admission.result import Problem
from kvgate.api.models import (
    MODEL_MOUNT_PATH,
    QUANTITY_PATTERN,
    DownloadSource,
    ModelDeploymentSpec,
)

SOURCE = "spec.model.source"
DOWNLOAD = f"{SOURCE}.download"
# The download rate admission assumes when it compares a download with the verification
# deadline: 100 MiB/s (~0.84 Gbit/s), what one pod sustains from a hub's CDN on a good day.
ASSUMED_DOWNLOAD_MIB_PER_SECOND = 100.0
# The share of rollout.verifyTimeoutSeconds a download may take before admission warns: the rest
# is scheduling, image pulls, reading the weights into GPU memory, CUDA graphs and warm-up.
DOWNLOAD_SHARE_OF_DEADLINE = 0.5
# Room above the weights a download emptyDir should have (tokenizer, config, partial files).
DOWNLOAD_MARGIN = 1.1
COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SUFFIXES = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}
GIB = 2**30


def quantity_bytes(text: str) -> float | None:
    """A Kubernetes quantity as kvgate accepts it for sizes (``16Gi``, ``40G``) in bytes; None
    for anything else (a memory limit may be written in other forms the API server accepts)."""
    if not isinstance(text, str) or not re.fullmatch(QUANTITY_PATTERN, text):
        return None
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)", text)
    if match is None:
        return None
    return float(match.group(1)) * _SUFFIXES[match.group(2)]


def _gib(value: float) -> str:
    return f"{value:,.3g}" if value < 100 else f"{value:,.0f}"


def weights_gib(spec: ModelDeploymentSpec) -> tuple[float, str] | None:
    """The weights' size of one replica and where it comes from (weightsGiB, else the estimate
    from model.config); None when neither gives it."""
    if spec.model.weights_gi_b is not None:
        return spec.model.weights_gi_b, "spec.model.weightsGiB"
    if spec.model.config is None:
        return None
    try:
        estimated = estimate_weights_gib(spec.model.config)
    except Exception:  # a user's config.json can hold anything
        return None
    if estimated is None:
        return None
    return estimated, "estimated from spec.model.config"


def _path_problem(spec: ModelDeploymentSpec) -> Problem | None:
    path = spec.model.path
    inside = path == MODEL_MOUNT_PATH or path.startswith(MODEL_MOUNT_PATH + "/")
    parts = path.split("/")
    if inside and ".." not in parts and "." not in parts and posixpath.normpath(path) == path:
        return None
    name = posixpath.basename(path.rstrip("/")) or "model"
    if ".." in parts or "." in parts:
        example = f"{MODEL_MOUNT_PATH}/{name}" if name not in (".", "..") else MODEL_MOUNT_PATH
        why = "holds '.' or '..' segments"
    elif inside:
        example = posixpath.normpath(path)
        why = "is not in normal form (a doubled or trailing '/')"
    else:
        example = f"{MODEL_MOUNT_PATH}/{name}"
        why = f"is outside {MODEL_MOUNT_PATH}"
    return Problem(
        "spec.model.path",
        f"{path} {why}: spec.model.source is mounted at {MODEL_MOUNT_PATH} in the engine "
        f"container, so the engine would not find the weights there; set spec.model.path to "
        f"{MODEL_MOUNT_PATH} or a directory under it, e.g. {example}",
    )


def _download_storage_problem(
    download: DownloadSource, weights: tuple[float, str] | None
) -> Problem | None:
    empty_dir = download.storage.empty_dir
    if empty_dir is None or empty_dir.size_limit is None or weights is None:
        return None
    limit = quantity_bytes(empty_dir.size_limit)
    size, origin = weights
    if limit is None or limit >= size * GIB:
        return None
    need = size * DOWNLOAD_MARGIN
    return Problem(
        f"{DOWNLOAD}.storage.emptyDir.sizeLimit",
        f"{empty_dir.size_limit} ({_gib(limit / GIB)} GiB) < the weights' {_gib(size)} GiB "
        f"({origin}): the kubelet evicts the pod when the download passes it; raise sizeLimit "
        f"to at least {int(need) + 1}Gi, or download to a persistentVolumeClaim",
    )


def _deadline_warning(
    spec: ModelDeploymentSpec, weights: tuple[float, str] | None
) -> Problem | None:
    if weights is None:
        return None
    size, origin = weights
    seconds = size * 1024 / ASSUMED_DOWNLOAD_MIB_PER_SECOND
    deadline = spec.rollout.verify_timeout_seconds
    if seconds <= deadline * DOWNLOAD_SHARE_OF_DEADLINE:
        return None
    enough = int(seconds / DOWNLOAD_SHARE_OF_DEADLINE) + 1
    return Problem(
        "spec.rollout.verifyTimeoutSeconds",
        f"{deadline:,} s may be too short for {DOWNLOAD}: downloading {_gib(size)} GiB "
        f"({origin}) takes {seconds:,.0f} s at {ASSUMED_DOWNLOAD_MIB_PER_SECOND:g} MiB/s, "
        f"more than {DOWNLOAD_SHARE_OF_DEADLINE:.0%} of the deadline, before the engine loads "
        "them; a revision not verified in time is refused. Raise rollout.verifyTimeoutSeconds "
        f"to at least {enough:,} s, or put the weights on a persistentVolumeClaim",
    )


def _download_warnings(download: DownloadSource) -> list[Problem]:
    warnings = []
    if not COMMIT.fullmatch(download.revision):
        warnings.append(
            Problem(
                f"{DOWNLOAD}.revision",
                f"{download.revision} is not a commit: pods that start at different times (a "
                "restart, a scale-up) may download different weights for the same revision; "
                "pin the commit (40 hex digits, the hub's `sha`)",
            )
        )
    if download.token_secret_ref is not None and download.endpoint.startswith("http://"):
        warnings.append(
            Problem(
                f"{DOWNLOAD}.endpoint",
                f"{download.endpoint} is plain http: the token from Secret "
                f"{download.token_secret_ref.name} travels unencrypted; use https",
            )
        )
    return warnings


def _shm_warnings(spec: ModelDeploymentSpec) -> list[Problem]:
    shm = spec.engine.transfer.shm_size
    shm_bytes = quantity_bytes(shm)
    warnings = []
    for role, role_spec in (("prefill", spec.prefill), ("decode", spec.decode)):
        limit = role_spec.resources.limits.get("memory")
        limit_bytes = quantity_bytes(limit) if isinstance(limit, str) else None
        if shm_bytes is None or limit_bytes is None or shm_bytes < limit_bytes:
            continue
        warnings.append(
            Problem(
                "spec.engine.transfer.shmSize",
                f"{shm} ≥ spec.{role}.resources.limits.memory {limit}: /dev/shm is memory "
                "charged to the pod, so a full /dev/shm leaves the engine nothing before it is "
                f"OOM-killed; raise {role}.resources.limits.memory above shmSize plus the "
                "engine's own host memory, or lower shmSize",
            )
        )
    return warnings


def _source_kinds(policy: ClusterPolicy) -> str:
    """The sources a spec could set on this cluster (hostPath only under an allowed prefix)."""
    prefixes = policy.host_paths.model_prefixes
    kinds = ["persistentVolumeClaim (a claim holding the weights)"]
    if prefixes:
        kinds.append(f"hostPath (a node directory under {', '.join(prefixes)})")
    kinds += [
        "image (an OCI image of the weights)",
        "download (from the hub at pod start, pinned to a commit and hash-checked)",
    ]
    return ", ".join(kinds[:-1]) + " or " + kinds[-1]


def _unmounted_path_warning(spec: ModelDeploymentSpec, policy: ClusterPolicy) -> Problem | None:
    """Without a source: a model.path nothing will fill, or one the engine downloads itself."""
    path = spec.model.path
    deadline = f"rollout.verifyTimeoutSeconds ({spec.rollout.verify_timeout_seconds:,} s)"
    if path == MODEL_MOUNT_PATH or path.startswith(MODEL_MOUNT_PATH + "/"):
        return Problem(
            "spec.model.path",
            f"{path} is under {MODEL_MOUNT_PATH}, where kvgate mounts the weights, but "
            f"spec.model.source is not set: nothing is mounted there (a role's "
            f"extraVolumeMounts may not mount at {MODEL_MOUNT_PATH}), so the engine finds "
            f"weights only if its image {spec.engine.image} holds them; if it does not, no "
            f"engine starts and the revision is refused after {deadline}. Set "
            f"spec.model.source: {_source_kinds(policy)}",
        )
    if path.startswith("/"):
        return None
    name = posixpath.basename(path.rstrip("/")) or "model"
    return Problem(
        "spec.model.path",
        f"{path} is a hub id (not an absolute path) and spec.model.source is not set: every "
        "engine downloads it itself when it starts, inside "
        f"{deadline}, not pinned to a commit (pods started at different times may load "
        "different weights), with no hash check, and needs egress to the hub (and a token for "
        "a gated model) from every engine pod. Set spec.model.source.download (repo: "
        f"{path}, revision: the commit) and spec.model.path to {MODEL_MOUNT_PATH}/{name}",
    )


def check_model_source(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """spec.model.source against model.path, the weights' size and the verification deadline
    (without a source: a model.path nothing fills); /dev/shm against each role's memory
    limit."""
    denials: list[Problem] = []
    warnings: list[Problem] = _shm_warnings(spec)
    source = spec.model.source
    if source is None:
        unmounted = _unmounted_path_warning(spec, policy)
        if unmounted is not None:
            warnings.append(unmounted)
        return denials, warnings
    path = _path_problem(spec)
    if path is not None:
        denials.append(path)
    if source.host_path is not None:
        warnings.append(
            Problem(
                f"{SOURCE}.hostPath",
                "hostPath volumes are outside the baseline Pod Security level: the engine pods "
                "are rejected in a namespace enforcing baseline or restricted (label it "
                "pod-security.kubernetes.io/enforce=privileged), and every node that may run an "
                "engine must hold the same weights; a persistentVolumeClaim or an image avoids "
                "both",
            )
        )
    download = source.download
    if download is not None:
        weights = weights_gib(spec)
        storage = _download_storage_problem(download, weights)
        if storage is not None:
            denials.append(storage)
        deadline = _deadline_warning(spec, weights)
        if deadline is not None:
            warnings.append(deadline)
        warnings += _download_warnings(download)
    return denials, warnings
