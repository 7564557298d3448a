"""The e2e tier in one world, or two at once (``make e2e``, hence ``make test``: one world unless
``E2E_WORLDS=2``).

``python -m kvgate_e2e.tier --workers 3 PATH...`` runs the e2e files of ``PATH...`` in two pytest
sessions side by side, each with a world of its own (its own network namespace, control plane,
kubelet and kvgate release):

* the **shared world**: every file but those below, ``--workers`` pytest-xdist workers attached
  to one world (``kvgate_e2e.shared_world``); its lone tests (``conftest.ALONE``) still take that
  world alone, one at a time;
* the **second world**: the files of ``SECOND_WORLD``, one test at a time in one process. Each
  stops or replaces something every test of a world uses (the operator, the API server, the
  Helm release, LeaderWorkerSet switched on), so in the shared world they ran alone while the
  other workers waited (92-312 s per file in a cold `make test`). Here they keep a world to
  themselves and the shared world never waits for them.

The second session's output goes to ``--second-log`` and is printed whole when both end (two
sessions writing one terminal interleave); the exit code is the first nonzero of the two.
Ctrl-C or SIGTERM interrupts both, and each tears its world down. ``--one-world`` (the
Makefile's default) runs every file in the shared world.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from kvgate_e2e.signals import interrupt_on_signals

# file -> what it does to its world that every other test would see (why it has one of its own).
SECOND_WORLD: dict[str, str] = {
    "test_chaos.py": "kills the leader and webhook pods, restarts kube-apiserver",
    "test_scenario_operator_down.py": "scales the operator to 0 and shrinks a node's GPU memory",
    "test_scenario_kv_canary.py": "scales the operator to 0 (one test)",
    "test_scenario_mass_deletion.py": (
        "deletes 100 ModelDeployments at once against a timing bound, scales the operator to 0"
    ),
    "test_helm_install.py": "upgrades, uninstalls and installs the kvgate release",
    "test_scenario_multinode.py": (
        "LeaderWorkerSet on and kvgate upgraded with it (the lws fixture) for most of the file"
    ),
    "test_attack_tenant_workloads.py": "LeaderWorkerSet on and kvgate upgraded with it (lws)",
}

# The flags of each session (the shared one adds its workers).
COMMON_ARGS = ("-q", "--durations=30")
SHARED_ARGS = ("--dist", "loadfile", "--no-loadscope-reorder")
# The second session runs beside the first: it must not race it for .pytest_cache.
SECOND_ARGS = ("-p", "no:cacheprovider")


def expand(paths: Sequence[str]) -> list[Path]:
    """The test files of ``paths`` (a directory gives its ``test_*.py``), in order, once each."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        found = sorted(path.glob("test_*.py")) if path.is_dir() else [path]
        files.extend(f for f in found if f not in files)
    return files


def split(files: Sequence[Path], one_world: bool = False) -> tuple[list[Path], list[Path]]:
    """(files of the shared world, files of the second world)."""
    if one_world:
        return list(files), []
    second = [f for f in files if f.name in SECOND_WORLD]
    return [f for f in files if f not in second], second


def commands(
    shared: Sequence[Path], second: Sequence[Path], workers: int, python: str = sys.executable
) -> tuple[list[str] | None, list[str] | None]:
    """The pytest command of each session (None: no files for it)."""
    pytest = [python, "-m", "pytest", *COMMON_ARGS]
    first = [*pytest, "-n", str(workers), *SHARED_ARGS, *map(str, shared)] if shared else None
    other = [*pytest, *SECOND_ARGS, *map(str, second)] if second else None
    return first, other


def first_failure(codes: Sequence[int | None]) -> int:
    """The tier's exit code: the first nonzero of the sessions' (0 if all passed)."""
    return next((code for code in codes if code), 0)


def run(shared_cmd: list[str] | None, second_cmd: list[str] | None, second_log: Path) -> int:
    """Run both sessions at once; print the second's log when both are done."""
    children: list[subprocess.Popen[bytes]] = []
    log = None
    started = time.monotonic()
    try:
        if second_cmd is not None:
            second_log.parent.mkdir(parents=True, exist_ok=True)
            log = open(second_log, "wb")  # noqa: SIM115 (closed in finally, after the child)
            print(
                f"e2e tier: the second world's files run beside the shared world's "
                f"(output in {second_log}, printed at the end): {' '.join(second_cmd[3:])}",
                flush=True,
            )
            children.append(subprocess.Popen(second_cmd, stdout=log, stderr=subprocess.STDOUT))
        if shared_cmd is not None:
            children.append(subprocess.Popen(shared_cmd))
        codes = [child.wait() for child in reversed(children)]
    except KeyboardInterrupt:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGINT)
        codes = [130]
    finally:
        for child in children:
            if child.poll() is None:
                child.wait()  # each session's own clean-up (its world's teardown) runs to its end
        if log is not None:
            log.close()
    if second_cmd is not None:
        second_code = children[0].returncode
        print(f"\n---- the second world's session (exit {second_code}) ----", flush=True)
        sys.stdout.write(second_log.read_text(errors="replace"))
        print(
            f"---- e2e tier: both sessions done in {time.monotonic() - started:.0f} s ----",
            flush=True,
        )
    return first_failure(codes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate_e2e.tier", description=__doc__)
    parser.add_argument("--workers", type=int, default=3, help="xdist workers of the shared world")
    parser.add_argument(
        "--second-log",
        type=Path,
        default=Path(".venv/e2e-second-world.log"),
        help="where the second world's session writes",
    )
    parser.add_argument(
        "--one-world", action="store_true", help="run every file in the shared world"
    )
    parser.add_argument("paths", nargs="+", help="e2e files or directories")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    interrupt_on_signals()
    shared, second = split(expand(args.paths), args.one_world)
    shared_cmd, second_cmd = commands(shared, second, args.workers)
    if shared_cmd is None:  # only second-world files: one session, in the foreground
        shared_cmd, second_cmd = second_cmd, None
    if shared_cmd is None:
        parser.error(f"no test files in {' '.join(args.paths)}")
    return run(shared_cmd, second_cmd, args.second_log)


if __name__ == "__main__":
    sys.exit(main())
