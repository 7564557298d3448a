"""The machine-wide state a real node's kubelet and containerd touch, and how it is undone.

Everything else of a real node lives in the world's network namespace, a mount namespace of its
own and the world's run dir, and goes with them. Three things do not:

* **cgroups**: the kubelet's ``cgroupRoot`` is ``/kvgate-<world>`` in every hierarchy; the
  containers' processes live there (in pod network namespaces, so deleting the world's network
  namespace does not reach them). Undone by killing what is left in it and removing the tree.
* **kernel sysctls** (not namespaced): the kubelet sets ``vm.overcommit_memory``,
  ``kernel.panic`` and four more to its values. The values from before the first real node are
  kept in ``/run/kvgate-e2e/kubelet-sysctls.json`` and written back when the last one stops.
* **processes** of the node's mount namespace (containerd's shims) are killed by its id;
* **mount points** the machine lacked (``/run/containerd``, ``/var/lib/kubelet``,
  ``/var/log/containers``), made for the node's private tmpfs, are removed.

``reap_run_dir`` undoes it all for a world whose owner died (``kvgate_e2e.netns``'s stale-world
reaper calls it), from the record ``record_node`` wrote into the run dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_MOUNTS = Path("/sys/fs/cgroup")
OWNER_DIR = Path("/run/kvgate-e2e")
SYSCTLS_FILE = OWNER_DIR / "kubelet-sysctls.json"
NODE_RECORD_PREFIX = "realnode-"
RECORD_NAME = "realnode-machine.json"
# What the kubelet sets (k8s.io/kubernetes pkg/kubelet/cm/container_manager_linux.go,
# setupKernelTunables) unless protectKernelDefaults is on.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


def process_start_time(pid: int) -> str | None:
    """Start time (clock ticks since boot) of ``pid``, to tell it apart from a reused id."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


# ---------------------------------------------------------------------------- cgroups
def cgroup_hierarchies(mountinfo: str | None = None) -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers and the unified one) under /sys/fs/cgroup."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    found: list[Path] = []
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        fstype = line.split(" - ", 1)[1].split()[0]
        point = Path(fields[4])
        if fstype in ("cgroup", "cgroup2") and point.parent == CGROUP_MOUNTS:
            found.append(point)
    return sorted(set(found))


def create_cgroup_root(name: str) -> None:
    """``/<name>`` in every hierarchy (the kubelet wants its cgroupRoot to exist), with the
    parent's CPUs and memory nodes in cpuset (a v1 cpuset takes no task without them)."""
    for hierarchy in cgroup_hierarchies():
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            parent = hierarchy / knob
            if parent.is_file() and not (path / knob).read_text().strip():
                (path / knob).write_text(parent.read_text())


def cgroup_pids(name: str) -> set[int]:
    """Every process in the ``/<name>`` subtree of any hierarchy."""
    pids: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / name
        if not root.is_dir():
            continue
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def kill_cgroup(name: str, timeout: float = 10.0) -> set[int]:
    """SIGKILL every process in the subtree until none is left; returns the survivors."""
    deadline = time.monotonic() + timeout
    pids = cgroup_pids(name)
    while pids and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
        pids = cgroup_pids(name)
    return pids


def remove_cgroup_root(name: str) -> list[Path]:
    """Remove the ``/<name>`` subtree, deepest first; returns what could not be removed."""
    left: list[Path] = []
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / name
        if not root.is_dir():
            continue
        dirs = sorted((d for d in root.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
        for d in [*dirs, root]:
            try:
                d.rmdir()
            except OSError:
                left.append(d)
    return left


# ---------------------------------------------------------------------------- processes
def mount_namespace(pid: int) -> str | None:
    """The mount namespace of ``pid`` (``mnt:[inode]``)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def kill_mount_namespace(namespace: str, timeout: float = 10.0) -> list[int]:
    """SIGKILL every process whose mount namespace is ``namespace``; returns the survivors."""

    def members() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            pid = int(entry.name) if entry.name.isdigit() else os.getpid()
            if pid != os.getpid() and mount_namespace(pid) == namespace:
                found.append(pid)
        return found

    deadline = time.monotonic() + timeout
    pids = members()
    while pids and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
        pids = members()
    return pids


# ---------------------------------------------------------------------------- sysctls
def read_sysctls(names: tuple[str, ...] = KUBELET_SYSCTLS) -> dict[str, str]:
    return {name: (Path("/proc/sys") / name).read_text().strip() for name in names}


def write_sysctls(values: dict[str, str]) -> None:
    for name, value in values.items():
        (Path("/proc/sys") / name).write_text(value)


def keep_sysctls_before_kubelet() -> None:
    """Note the machine's values before the first real node's kubelet changes them (a node
    started while another runs finds them noted already, and changed)."""
    OWNER_DIR.mkdir(parents=True, exist_ok=True)
    if not SYSCTLS_FILE.exists():
        tmp = SYSCTLS_FILE.with_suffix(".tmp")
        tmp.write_text(json.dumps(read_sysctls()))
        tmp.replace(SYSCTLS_FILE)


def restore_sysctls_if_last() -> bool:
    """Write the noted values back once no real node runs; True if they were."""
    if live_nodes() or not SYSCTLS_FILE.exists():
        return False
    write_sysctls(json.loads(SYSCTLS_FILE.read_text()))
    SYSCTLS_FILE.unlink()
    return True


# ---------------------------------------------------------------------------- records
@dataclass(frozen=True)
class NodeRecord:
    """What a real node changed outside its run dir, kept in the run dir for the reaper."""

    name: str
    cgroup_root: str
    mount_namespace: str
    # Mount points the machine lacked, made for the node's private tmpfs (removed if empty).
    created_dirs: tuple[str, ...] = ()


def record_node(run_dir: Path, record: NodeRecord) -> None:
    """Write the record into the run dir, and register this process as a real node's owner."""
    (run_dir / RECORD_NAME).write_text(json.dumps(record.__dict__))
    OWNER_DIR.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    owner = {"pid": pid, "start": process_start_time(pid), "run_dir": str(run_dir)}
    (OWNER_DIR / f"{NODE_RECORD_PREFIX}{record.name}.json").write_text(json.dumps(owner))


def forget_node(name: str) -> None:
    (OWNER_DIR / f"{NODE_RECORD_PREFIX}{name}.json").unlink(missing_ok=True)


def live_nodes() -> list[str]:
    """Real nodes whose owning process is still running."""
    live = []
    for path in OWNER_DIR.glob(f"{NODE_RECORD_PREFIX}*.json"):
        with contextlib.suppress(OSError, ValueError):
            owner = json.loads(path.read_text())
            pid = owner.get("pid")
            if isinstance(pid, int) and process_start_time(pid) == owner.get("start"):
                live.append(path.stem.removeprefix(NODE_RECORD_PREFIX))
    return sorted(live)


def undo(record: NodeRecord) -> list[str]:
    """Kill the node's processes and containers, remove its cgroups, restore the sysctls if it
    was the last real node. Returns what could not be undone (empty: all of it)."""
    problems: list[str] = []
    survivors = kill_mount_namespace(record.mount_namespace) if record.mount_namespace else []
    if survivors:
        problems.append(f"processes {survivors} of {record.mount_namespace} survived SIGKILL")
    left = kill_cgroup(record.cgroup_root)
    if left:
        problems.append(f"processes {sorted(left)} in cgroup /{record.cgroup_root} survived")
    stuck = remove_cgroup_root(record.cgroup_root)
    if stuck:
        problems.append(f"cgroups not removed: {', '.join(map(str, stuck[:5]))}")
    for created in reversed(record.created_dirs):
        with contextlib.suppress(OSError):
            Path(created).rmdir()
    forget_node(record.name)
    restore_sysctls_if_last()
    return problems


def reap_run_dir(run_dir: Path) -> list[str]:
    """``undo`` the real node recorded in a dead world's run dir, if it had one."""
    path = run_dir / RECORD_NAME
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    raw["created_dirs"] = tuple(raw.get("created_dirs") or ())
    return undo(NodeRecord(**raw))
