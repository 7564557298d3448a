"""A pod container's filesystem view on the loopback kubelet: bind mounts in a mount namespace.

Each container runs under ``unshare --mount`` with the pod's volumes bind-mounted at their
``mountPath``; mount points missing on the host are created (and removed by the last kubelet to
stop), and this checkout stays visible to the pod's processes even under a volume's mountPath.
A mount that is ``readOnly`` (or of a claim the pod mounts ``readOnly``) is remounted read-only
in the container's namespace, as the kubelet mounts it; where the kernel refuses, the container
still starts and its log says so.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvgate_e2e.kubelet.podspec import PodSpecError

_MOUNT_SCRIPT = (
    'while [ "$1" != "--" ]; do '
    '[ -e "$2" ] || mkdir -p "$2"; '
    'mount --bind "$1" "$2" || { echo "kvgate-kubelet: cannot mount $1 at $2" >&2; exit 127; }; '
    "shift 2; done; shift; "
    'while [ "$1" != "--" ]; do '
    'mount -o remount,bind,ro "$1" || echo "kvgate-kubelet: cannot make $1 read-only" >&2; '
    'shift; done; shift; exec "$@"'
)
# Where this checkout's packages and virtualenv live: pod processes run from them.
PROJECT_ROOT = Path(__file__).resolve().parents[3]  # e2e/kvgate_e2e/kubelet/ is 3 down
KEEP_STAGE = "/run/kvgate-e2e-keep"  # staging mount points, see keep_visible()

MountPair = tuple[str, str]  # (source on the host, mountPath in the container)


def _covers(dst: str, path: str) -> bool:
    return path == dst or path.startswith(dst.rstrip("/") + "/")


def order_mounts(pairs: Sequence[MountPair]) -> list[MountPair]:
    """Bind-mount order in which no mount hides a later mount's source: the pod's volume
    material lives under the run dir (often in /tmp), so an emptyDir at ``/tmp`` must be
    mounted after every volume whose source is below /tmp. Otherwise parents before children."""

    def shadows(pair: MountPair) -> bool:
        return any(_covers(pair[1], other[0]) for other in pairs if other is not pair)

    return sorted(pairs, key=lambda p: (shadows(p), p[1].count("/")))


def keep_visible(
    pairs: Sequence[MountPair], paths: Sequence[str], stage: str
) -> tuple[list[MountPair], list[MountPair]]:
    """Bind mounts (before, after the pod's own) that keep host paths visible under a volume.

    Pod processes run from this checkout and its virtualenv. If the checkout lives under a
    volume's mountPath (a clone in /tmp, an emptyDir at /tmp), that mount would hide it. So each
    hidden path is first bound to a staging directory ``<stage>/<n>`` (before the pod's mounts)
    and bound back from there afterwards. (Binding from ``/proc/<pid>/root`` instead does not
    work: mount(8) canonicalizes the path, and the kernel refuses a bind from another mount
    namespace.)"""
    hidden = [p for p in dict.fromkeys(paths) if any(_covers(dst, p) for _, dst in pairs)]
    outermost = [p for p in hidden if not any(q != p and _covers(q, p) for q in hidden)]
    before = [(path, f"{stage}/{i}") for i, path in enumerate(outermost)]
    return before, [(staged, path) for path, staged in before]


class MountPoints:
    """Creates missing mount-point directories on the host; the last kubelet to stop removes them.

    Directories are never removed while any loopback kubelet on this machine may still run pods:
    since Linux 3.18, ``rmdir`` of a directory that is a mount point in *another* mount namespace
    detaches that mount, which would pull a running pod's token out from under it. Kubelets
    register in ``registry`` (one file per kubelet, named by PID); created directories are listed
    in ``registry/created``; whoever leaves last (no live PID left) removes them.
    """

    def __init__(self, registry: Path = Path("/run/kvgate-e2e-kubelets")) -> None:
        self._registry = registry
        self._me = registry / f"kubelet-{os.getpid()}-{id(self)}"
        self._lock = threading.Lock()

    def ensure(self, path: Path) -> None:
        with self._lock:
            if not self._me.exists():
                self._registry.mkdir(parents=True, exist_ok=True)
                self._me.touch()
            missing: list[Path] = []
            probe = path
            while not probe.exists():
                missing.append(probe)
                probe = probe.parent
            with (self._registry / "created").open("a") as created:
                for item in reversed(missing):
                    item.mkdir(exist_ok=True)
                    created.write(f"{item}\n")

    def ensure_file(self, path: Path) -> None:
        """A missing file mount point (a file volume's mountPath), created and listed so that
        the last kubelet to leave removes it, as it removes the directories."""
        self.ensure(path.parent)
        with self._lock:
            if not path.exists():
                path.touch()
                with (self._registry / "created").open("a") as created:
                    created.write(f"{path}\n")

    def cleanup(self) -> None:
        with self._lock:
            if not self._me.exists():
                return
            self._me.unlink()
            for other in self._registry.glob("kubelet-*"):
                pid = other.name.split("-")[1]
                if pid.isdigit() and Path(f"/proc/{pid}").exists():
                    return  # another kubelet still runs; it cleans up when it leaves
                other.unlink(missing_ok=True)
            created = self._registry / "created"
            paths = created.read_text().split() if created.exists() else []
            for item in sorted(set(paths), key=len, reverse=True):
                with contextlib.suppress(OSError):
                    if Path(item).is_dir():
                        Path(item).rmdir()
                    else:
                        Path(item).unlink()
            created.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self._registry.rmdir()


def container_mounts(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    volumes_dir: Path,
    mount_points: MountPoints,
) -> list[MountPair]:
    """The container's volumeMounts as bind mounts (in mounting order), mount points created:
    a hostPath volume from its path, any other from ``volumes_dir/<volume name>``."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    pairs: list[MountPair] = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            raise PodSpecError(f"volumeMount {mount['name']!r} names no volume of the pod")
        if "hostPath" in volume:
            src = Path(volume["hostPath"]["path"])
            kind = volume["hostPath"].get("type") or ""
            if kind == "DirectoryOrCreate" and not src.exists():
                mount_points.ensure(src)  # as the kubelet creates it (and removed at the end)
            elif kind == "Directory" and not src.is_dir():
                raise PodSpecError(
                    f"hostPath {src} is not a directory on the node (type Directory)"
                )
        else:
            src = volumes_dir / mount["name"]
        if mount.get("subPath"):
            src = src / mount["subPath"]
        dst = Path(os.path.realpath(mount["mountPath"]))
        if src.is_dir():
            mount_points.ensure(dst)
        else:
            mount_points.ensure_file(dst)
        pairs.append((str(src), str(dst)))
    return order_mounts(pairs)


def read_only_targets(pod: Mapping[str, Any], container: Mapping[str, Any]) -> list[str]:
    """The container's mount points that are read-only: ``readOnly`` on the mount, or a claim
    the pod's volume mounts ``readOnly``."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    targets = []
    for mount in container.get("volumeMounts") or []:
        claim = volumes.get(mount["name"], {}).get("persistentVolumeClaim") or {}
        if mount.get("readOnly") or claim.get("readOnly"):
            targets.append(os.path.realpath(mount["mountPath"]))
    return targets


def in_mount_namespace(
    argv: Sequence[str],
    mounts: Sequence[MountPair],
    venv_bin: str,
    mount_points: MountPoints,
    read_only: Sequence[str] = (),
) -> list[str]:
    """``argv`` run in a new mount namespace holding ``mounts`` (those at ``read_only``
    remounted read-only), this checkout and its virtualenv kept visible under them."""
    before, after = keep_visible(
        mounts, [str(PROJECT_ROOT), str(Path(venv_bin).parent)], stage=KEEP_STAGE
    )
    for _, staged in before:
        mount_points.ensure(Path(staged))
    flat = [path for pair in [*before, *mounts, *after] for path in pair]
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        _MOUNT_SCRIPT,
        "kvgate-pod",
        *flat,
        "--",
        *read_only,
        "--",
        *argv,
    ]
