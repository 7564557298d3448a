"""An image test killed mid-run leaves a containerd, its shims and its mounts behind; the next
run removes them, and leaves a live run's alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .conftest import STATE_PREFIX, _start_time, reap_stale_containerds


def test_a_dead_runs_containerd_state_and_processes_are_reaped(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    stale = tmp_path / f"{STATE_PREFIX}{dead.stdout.strip()}"
    stale.mkdir()
    (stale / "owner").write_text(f"{dead.stdout.strip()} 12345")
    # Stands for the containerd and the shims: a process naming the state dir on its command line.
    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", str(stale / "c.sock")]
    )
    live = tmp_path / f"{STATE_PREFIX}{os.getpid()}-live"
    live.mkdir()
    (live / "owner").write_text(f"{os.getpid()} {_start_time(os.getpid())}")
    try:
        assert reap_stale_containerds(tmp_path) == [stale]
        assert leftover.wait(timeout=10) == -9
        assert not stale.exists()
        assert live.exists(), "a live run's state is never touched"
    finally:
        leftover.kill()
        leftover.wait()


def test_a_runs_state_under_containerds_fixed_path_goes_with_it(tmp_path: Path) -> None:
    """containerd 1.6 keeps runc's state per namespace under /run/containerd whatever its
    --state says; the run's own namespace goes, and the shared folders once empty and unused."""
    from .conftest import _remove_fixed_state

    fixed = tmp_path / "run-containerd"
    (fixed / "runc" / "kvgate-ctrd-1" / "task").mkdir(parents=True)
    (fixed / "runc" / "another-run").mkdir(parents=True)
    (fixed / "fifo").mkdir()
    _remove_fixed_state("kvgate-ctrd-1", fixed)
    assert not (fixed / "runc" / "kvgate-ctrd-1").exists()
    assert (fixed / "runc" / "another-run").exists(), "another namespace's state stays"
    (fixed / "runc" / "another-run").rmdir()
    other = subprocess.run(["pgrep", "-x", "containerd"], capture_output=True, text=True)
    _remove_fixed_state("kvgate-ctrd-1", fixed)
    assert fixed.exists() == bool(other.stdout.strip())
