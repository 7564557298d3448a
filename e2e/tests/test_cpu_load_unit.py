"""``make test-loaded``'s burners: they slow a CPU-bound loop by the factor asked, and the run
stops every one of them whether the command passes, fails or is interrupted (no cluster)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from kvgate_e2e import cpu_load


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it no longer runs.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"


def test_calibration_slows_the_probe_loop_by_the_factor_asked() -> None:
    burners = cpu_load.Burners()
    try:
        iterations = cpu_load.probe_iterations(target_seconds=0.05)
        cal = cpu_load.calibrate(burners, 2.0, iterations, max_burners=4 * (os.cpu_count() or 1))
        assert cal.slowdown >= 2.0 * 0.95, cal
        assert len(burners) == cal.burners >= 1
    finally:
        burners.stop()
    assert len(burners) == 0


@pytest.mark.parametrize("exit_code", [0, 3])
def test_a_run_returns_the_commands_exit_code_and_leaves_no_burner(
    exit_code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[int] = []
    real_add = cpu_load.Burners.add

    def add(self: cpu_load.Burners) -> None:
        real_add(self)
        started.append(self.processes[-1].pid)

    monkeypatch.setattr(cpu_load.Burners, "add", add)
    code = cpu_load.run_loaded(
        [sys.executable, "-c", f"raise SystemExit({exit_code})"], 2.0, 30, 0.05
    )
    assert code == exit_code
    assert started
    assert not [pid for pid in started if _alive(pid)]


def test_an_interrupted_run_stops_its_burners_and_its_command() -> None:
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvgate_e2e.cpu_load",
            "--probe-seconds",
            "0.05",
            "--",
            "sleep",
            "600",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert run.stdout is not None
    line = run.stdout.readline()  # printed once the burners run and before the command starts
    assert "burners" in line and "slowdown" in line, line
    burner_pids = [
        int(pid)
        for pid in subprocess.run(
            ["pgrep", "-P", str(run.pid)], capture_output=True, text=True
        ).stdout.split()
    ]
    assert burner_pids
    run.send_signal(signal.SIGTERM)
    # The burners end on SIGTERM at once; the bound is the 5 s Burners.stop allows each, doubled.
    assert run.wait(timeout=10) == 130
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in burner_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in burner_pids if _alive(pid)]
    assert "burners stopped" in run.stdout.read()
