"""A command run beside CPU burners that slow the machine down by a measured factor.

``python -m kvgate_e2e.cpu_load --factor 2 -- CMD ...`` (``make test-loaded``) times a fixed
CPU-bound loop alone, then starts busy-loop processes at the tests' own priority, one more at a
time, until the same loop takes ``factor`` times as long; it prints both times, runs CMD, times the
loop every ``--sample-seconds`` while CMD runs (the machine as the tests saw it: burners and tests
together) and stops the burners when CMD ends, fails, or is interrupted. A burner also dies with
this process (``PR_SET_PDEATHSIG``), so a killed run leaves none behind.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvgate_e2e.signals import interrupt_on_signals

_PR_SET_PDEATHSIG = 1
_BURNER_CODE = "while True:\n    pass\n"
# One timing of the probe loop aims at this many seconds alone: long enough to span several
# scheduler time slices (a few ms each), so the share of a core it got is what it measures.
_PROBE_TARGET_SECONDS = 0.25


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _spin(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i * i
    return total


def probe_iterations(target_seconds: float = _PROBE_TARGET_SECONDS) -> int:
    """The loop length that takes about ``target_seconds`` on this machine now."""
    iterations = 100_000
    _spin(iterations)  # a first run warms the interpreter and lets the CPU clock up
    while True:
        took = probe_seconds(iterations, samples=3)
        if took >= target_seconds / 4:
            return max(1, int(iterations * target_seconds / took))
        iterations *= 4


def probe_seconds(iterations: int, samples: int = 5) -> float:
    """The median wall time of ``samples`` runs of the fixed loop (wall time: a burner takes CPU
    from the loop, so the loop's share of a core shows up as seconds)."""
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        _spin(iterations)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass
class Burners:
    """Busy-loop processes; ``stop`` ends every one (SIGTERM, then SIGKILL)."""

    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def add(self) -> None:
        self.processes.append(
            subprocess.Popen(
                [sys.executable, "-c", _BURNER_CODE],
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        )

    def __len__(self) -> int:
        return len(self.processes)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=5)  # a busy loop ends on SIGTERM at once; 5 s is slack
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()


@dataclass(frozen=True)
class Calibration:
    burners: int
    alone_seconds: float
    loaded_seconds: float

    @property
    def slowdown(self) -> float:
        return self.loaded_seconds / self.alone_seconds


def calibrate(burners: Burners, factor: float, iterations: int, max_burners: int) -> Calibration:
    """Add burners until the probe loop runs ``factor`` times slower than alone (or the cap)."""
    alone = probe_seconds(iterations)
    loaded = alone
    while len(burners) < max_burners:
        burners.add()
        time.sleep(0.5)  # let the new process start spinning before it is measured
        loaded = probe_seconds(iterations)
        if loaded / alone >= factor * 0.95:
            break
    return Calibration(len(burners), alone, loaded)


class Sampler(threading.Thread):
    """Times the probe loop every ``period`` seconds until stopped."""

    def __init__(self, iterations: int, period: float, alone_seconds: float) -> None:
        super().__init__(daemon=True)
        self.iterations = iterations
        self.alone_seconds = alone_seconds
        self.period = period
        self.seconds: list[float] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.period):
            self.seconds.append(probe_seconds(self.iterations, samples=1))

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def run_loaded(
    command: Sequence[str],
    factor: float,
    sample_seconds: float,
    probe_target_seconds: float = _PROBE_TARGET_SECONDS,
) -> int:
    """Run ``command`` beside burners that slow the probe loop by ``factor``; its exit code."""
    burners = Burners()
    child: subprocess.Popen[bytes] | None = None
    sampler: Sampler | None = None
    try:
        iterations = probe_iterations(probe_target_seconds)
        # More than 4 per core would mean the scheduler is not sharing CPU the way it should.
        cal = calibrate(burners, factor, iterations, max_burners=4 * (os.cpu_count() or 1))
        print(
            f"cpu_load: {cal.burners} burners; the probe loop took {cal.alone_seconds:.3f} s "
            f"alone and {cal.loaded_seconds:.3f} s beside them: slowdown {cal.slowdown:.2f}x "
            f"(target {factor:.2f}x)",
            flush=True,
        )
        sampler = Sampler(iterations, sample_seconds, cal.alone_seconds)
        sampler.start()
        child = subprocess.Popen(list(command))
        return child.wait()
    except KeyboardInterrupt:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGINT)
        return 130
    finally:
        if sampler is not None:
            sampler.stop()
        burners.stop()
        if child is not None and child.poll() is None:
            child.wait()  # the command's own clean-up (a world's teardown) runs to its end
        if sampler is not None and sampler.seconds:
            ratios = sorted(s / sampler.alone_seconds for s in sampler.seconds)
            print(
                f"cpu_load: during the run the probe loop ran {statistics.median(ratios):.2f}x "
                f"slower than alone (median of {len(ratios)} samples every {sample_seconds:.0f} s;"
                f" min {ratios[0]:.2f}x, max {ratios[-1]:.2f}x); burners stopped",
                flush=True,
            )
        else:
            print("cpu_load: burners stopped", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate_e2e.cpu_load", description=__doc__)
    parser.add_argument("--factor", type=float, default=2.0, help="slowdown to reach (2: half)")
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    parser.add_argument(
        "--probe-seconds", type=float, default=_PROBE_TARGET_SECONDS, help="one probe's length"
    )
    parser.add_argument("command", nargs="+", help="the command to run (after --)")
    args = parser.parse_args(argv)
    interrupt_on_signals()
    return run_loaded(args.command, args.factor, args.sample_seconds, args.probe_seconds)


if __name__ == "__main__":
    sys.exit(main())
