"""The add-on servers' one process helper: a server that dies is reported with its exit code and
log, a wait for it ends at once, and stop ends even a process that ignores SIGTERM (no cluster:
the "network namespace" here is the test's own)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from kvgate_e2e.polling import poll_until
from kvgate_e2e.server_process import ServerProcess

# A deadline: a toy server (python -c) started here and its line in the log; seconds at most.
SERVER_DEADLINE = 60
# Derived from it: a wait the guard ended (the server exited) ends well before the deadline.
GUARD_BOUND = SERVER_DEADLINE / 2


class ServerError(RuntimeError):
    pass


class _HereCluster:
    """popen_in_netns without a namespace (only what ServerProcess calls)."""

    def popen_in_netns(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> subprocess.Popen[Any]:
        return subprocess.Popen(list(argv), env=env, **kwargs)


def _server(tmp_path: Path, stop_seconds: float = 5.0) -> ServerProcess:
    return ServerProcess(
        "toy-server", tmp_path / "toy.log", error=ServerError, stop_seconds=stop_seconds
    )


def test_a_server_that_dies_ends_the_wait_naming_its_exit_code_and_log(tmp_path: Path) -> None:
    server = _server(tmp_path)
    code = "import sys; print('cannot bind 198.18.0.1:9090', flush=True); sys.exit(3)"
    server.start(_HereCluster(), [sys.executable, "-c", code], cwd=tmp_path)  # type: ignore[arg-type]
    started = time.monotonic()
    with pytest.raises(ServerError) as err:
        poll_until("toy-server ready", lambda: False, SERVER_DEADLINE, guard=server.check_running)
    # the guard, not SERVER_DEADLINE, ended the wait
    assert time.monotonic() - started < GUARD_BOUND
    assert "toy-server exited 3" in str(err.value)
    assert "cannot bind 198.18.0.1:9090" in str(err.value)
    server.stop()


def test_stop_kills_a_server_that_ignores_sigterm_after_its_grace(tmp_path: Path) -> None:
    server = _server(tmp_path, stop_seconds=0.5)
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\n"
        "time.sleep(600)\n"
    )
    server.start(_HereCluster(), [sys.executable, "-c", code], cwd=tmp_path)  # type: ignore[arg-type]
    poll_until("the server up", lambda: "up" in server.log_path.read_text(), SERVER_DEADLINE)
    proc = server.proc
    assert proc is not None
    server.stop()
    assert proc.returncode == -9  # SIGKILL after the SIGTERM grace
    assert server.proc is None
    server.check_running()  # stopped: nothing to report


def test_the_log_tail_names_the_server_and_keeps_the_last_lines(tmp_path: Path) -> None:
    server = _server(tmp_path)
    assert server.log_tail() == "(no toy-server log)"
    server.log_path.write_text("".join(f"line {i}\n" for i in range(100)))
    tail = server.log_tail(3)
    assert tail == "--- toy-server log (tail) ---\nline 97\nline 98\nline 99"
