"""The shipped image: operator/image/build.py loaded as a module (it is a script, not part of
the kvgate package), and a private containerd for the tests that run the image."""

from __future__ import annotations

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


def makefile_uv() -> Path:
    """The uv the Makefile installs (its version pinned there), as `make image` uses it."""
    version = next(
        line.split(":=", 1)[1].strip()
        for line in (REPO / "Makefile").read_text().splitlines()
        if line.startswith(UV_VERSION_LINE)
    )
    cache = Path(os.environ.get("KVGATE_CACHE", Path.home() / ".cache" / "kvgate"))
    return cache / "tools" / f"uv-{version}" / "bin" / "uv"


def require_image_tools() -> None:
    """Skip (or, under KVGATE_REQUIRE_IMAGE=1, as `make test` sets it, fail) without root and
    the tools: the build needs mmdebstrap and chroot, the runs a containerd and runc."""
    missing = [
        tool for tool in ("mmdebstrap", "containerd", "ctr", "runc") if not shutil.which(tool)
    ]
    reason = ""
    if os.geteuid() != 0:
        reason = "needs root (mmdebstrap --mode=root, chroot, containerd)"
    elif missing:
        reason = f"needs {', '.join(missing)} (make system-packages installs them)"
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
            ["ctr", "--address", self.address, "--namespace", self.namespace, *args],
            check=check,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


CONTAINERD_START_DEADLINE_S = 60.0  # a containerd that has not opened its socket by then is broken


@pytest.fixture(scope="session")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    require_image_tools()
    # A short path: the socket's path must stay under the kernel's 108-byte limit.
    base = Path(f"/tmp/kvgate-ctrd-{os.getpid()}")
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(mode=0o700)
    address = str(base / "c.sock")
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
        ["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    ctrd = Containerd(address=address, namespace="kvgate-image-test")
    try:
        deadline = time.monotonic() + CONTAINERD_START_DEADLINE_S
        while ctrd.ctr("version", check=False, timeout=10).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
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
        # containerd's snapshots are overlay mounts under its root: unmount before removing.
        mounts = Path("/proc/mounts").read_text().split("\n")
        for line in reversed(mounts):
            fields = line.split()
            if len(fields) > 1 and fields[1].startswith(str(base)):
                subprocess.run(["umount", "-l", fields[1]], check=False)
        shutil.rmtree(base, ignore_errors=True)
