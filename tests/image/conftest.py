"""The shipped image: operator/image/build.py loaded as a module (it is a script, not part of
the kvgate package), and a private containerd for the tests that run the image."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "operator" / "image" / "build.py"
UV_VERSION_LINE = "UV_VERSION := "


def load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvgate_image_build", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def image_build() -> ModuleType:
    return load_build()


def kvgate_cache() -> Path:
    """The Makefile's $(KVGATE_CACHE): where uv, the image's caches and the runtime live."""
    return Path(os.environ.get("KVGATE_CACHE", Path.home() / ".cache" / "kvgate"))


def image_cache() -> Path:
    """What `make image` caches (packages, wheels, archives), as build.py's --cache default."""
    return kvgate_cache() / "image"


def makefile_uv() -> Path:
    """The uv the Makefile installs (its version pinned there), as `make image` uses it."""
    version = next(
        line.split(":=", 1)[1].strip()
        for line in (REPO / "Makefile").read_text().splitlines()
        if line.startswith(UV_VERSION_LINE)
    )
    return kvgate_cache() / "tools" / f"uv-{version}" / "bin" / "uv"


def runtime_bin() -> Path:
    """containerd, its runc shim, ctr and runc, as `make container-runtime` unpacks them from
    Debian's packages (never installed system-wide, never a system service)."""
    default = kvgate_cache() / "container-runtime" / "bin"
    return Path(os.environ.get("KVGATE_CONTAINER_RUNTIME", default))


RUNTIME_TOOLS = ("containerd", "containerd-shim-runc-v2", "ctr", "runc")


def require_image_tools() -> None:
    """Skip (or, under KVGATE_REQUIRE_IMAGE=1, as `make test` sets it, fail) without root and
    the tools: the build needs mmdebstrap and chroot, the runs a containerd and runc."""
    missing = [] if shutil.which("mmdebstrap") else ["mmdebstrap (make system-packages)"]
    missing += [
        f"{runtime_bin() / tool} (make container-runtime)"
        for tool in RUNTIME_TOOLS
        if not (runtime_bin() / tool).is_file()
    ]
    reason = ""
    if os.geteuid() != 0:
        reason = "needs root (mmdebstrap --mode=root, chroot, containerd)"
    elif missing:
        reason = f"needs {', '.join(missing)}"
    elif not makefile_uv().exists():
        reason = f"needs uv at {makefile_uv()} (make venv installs it)"
    if reason:
        if os.environ.get("KVGATE_REQUIRE_IMAGE") == "1":
            pytest.fail(f"KVGATE_REQUIRE_IMAGE=1 but the image tests cannot run: {reason}")
        pytest.skip(reason)


@dataclass(frozen=True)
class Containerd:
    """A containerd of the test's own: its root, state and socket in a temporary directory."""

    address: str
    namespace: str

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        # 600 s: the deadline of one ctr call (an image import of ~80 MiB, a container run);
        # a run that needs longer is stuck, not slow.
        return subprocess.run(
            [
                str(runtime_bin() / "ctr"),
                "--address",
                self.address,
                "--namespace",
                self.namespace,
                *args,
            ],
            check=check,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    @contextlib.contextmanager
    def background(self, name: str, *run_args: str) -> Iterator[subprocess.Popen[str]]:
        """`ctr run --rm <run_args>` as container `name`, left running; on exit killed, its
        output printed, the container deleted."""
        proc = subprocess.Popen(
            [
                str(runtime_bin() / "ctr"),
                "--address",
                self.address,
                "--namespace",
                self.namespace,
                "run",
                "--rm",
                *run_args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            yield proc
        finally:
            self.ctr("tasks", "kill", "-s", "SIGKILL", name, check=False, timeout=30)
            try:
                out, _ = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            print(f"container {name} output:\n{out[-3000:]}")
            self.ctr("containers", "delete", name, check=False, timeout=30)


CONTAINERD_START_DEADLINE_S = 60.0  # a containerd that has not opened its socket by then is broken
STATE_PREFIX = "kvgate-ctrd-"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/<pid>/stat): with the pid, it
    names one process, never a later one that reuses the pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


# containerd 1.6 keeps its fifos, shim sockets and runc's state under this fixed path, whatever
# its --state says.
FIXED_STATE = Path("/run/containerd")


def _remove_fixed_state(namespace: str, fixed: Path = FIXED_STATE) -> None:
    """What containerd left under its fixed path for this run's namespace, and the path itself
    once nothing else uses it (no other containerd runs, every folder empty)."""
    shutil.rmtree(fixed / "runc" / namespace, ignore_errors=True)
    others = subprocess.run(["pgrep", "-x", "containerd"], capture_output=True, text=True)
    if others.stdout.strip():
        return
    for folder in (fixed / "runc", fixed / "fifo", fixed / "s", fixed):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty


def _remove(base: Path) -> None:
    """Everything a containerd of these tests left under ``base``: its processes and the shims
    it started (each names ``base`` on its command line), the overlay mounts of its snapshots,
    the directory."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(base).encode() in cmdline.read_bytes():
                os.kill(int(cmdline.parent.name), 9)
        except (OSError, ValueError):
            continue
    mounts = Path("/proc/mounts").read_text().splitlines()
    for line in reversed(mounts):
        fields = line.split()
        if len(fields) > 1 and fields[1].startswith(str(base)):
            subprocess.run(["umount", "-l", fields[1]], check=False)
    shutil.rmtree(base, ignore_errors=True)
    _remove_fixed_state(namespace=base.name)


def reap_stale_containerds(root: Path = Path("/tmp")) -> list[Path]:
    """The state of runs that died without their teardown (a killed pytest): removed, unless
    its owner still lives (a concurrent run)."""
    reaped = []
    for base in sorted(root.glob(f"{STATE_PREFIX}*")):
        try:
            pid, started = (base / "owner").read_text().split()
        except (OSError, ValueError):
            pid, started = "0", ""
        if _start_time(int(pid)) == started:
            continue
        _remove(base)
        reaped.append(base)
    return reaped


@contextlib.contextmanager
def running_containerd() -> Iterator[Containerd]:
    """A containerd of its own, stopped and removed on exit (with its shims and mounts)."""
    for stale in reap_stale_containerds():
        print(f"reaped the containerd state of a dead run: {stale}")
    base = Path(f"/tmp/{STATE_PREFIX}{os.getpid()}")
    base.mkdir(mode=0o700)
    (base / "owner").write_text(f"{os.getpid()} {_start_time(os.getpid())}")
    address = str(base / "c.sock")  # a short path: a socket's path has at most 107 bytes
    config = base / "config.toml"
    # The CRI plugin is off: these tests run containers through containerd's own API (ctr),
    # with no kubelet and no CNI.
    config.write_text(
        "version = 2\n"
        f'root = "{base / "root"}"\n'
        f'state = "{base / "state"}"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{address}"\n'
        f'[ttrpc]\n  address = "{address}.ttrpc"\n'
        '[metrics]\n  address = ""\n'
    )
    log = (base / "containerd.log").open("w")
    proc = subprocess.Popen(
        [str(runtime_bin() / "containerd"), "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        # containerd finds its shim, and the shim runc, on PATH: the unpacked ones first.
        env={**os.environ, "PATH": f"{runtime_bin()}:{os.environ.get('PATH', '')}"},
    )
    # The run's containerd namespace is named as its state directory: runc's state for it, under
    # containerd's fixed path, is then this run's alone.
    ctrd = Containerd(address=address, namespace=base.name)
    try:
        deadline = time.monotonic() + CONTAINERD_START_DEADLINE_S
        while ctrd.ctr("version", check=False, timeout=10).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"containerd did not start: {(base / 'containerd.log').read_text()[-2000:]}"
                )
            time.sleep(0.2)
        yield ctrd
    finally:
        for task in ctrd.ctr("tasks", "list", "-q", check=False, timeout=30).stdout.split():
            ctrd.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False, timeout=30)
        for container in ctrd.ctr(
            "containers", "list", "-q", check=False, timeout=30
        ).stdout.split():
            ctrd.ctr("tasks", "delete", "-f", container, check=False, timeout=30)
            ctrd.ctr("containers", "delete", container, check=False, timeout=30)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        _remove(base)  # the shims, the snapshots' mounts, the directory


@pytest.fixture(scope="session")
def containerd() -> Iterator[Containerd]:
    require_image_tools()
    with running_containerd() as ctrd:
        yield ctrd
