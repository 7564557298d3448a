"""One add-on server process of the e2e world (Prometheus, prometheus-adapter, the
LeaderWorkerSet controller): started in the world's network namespace in a session of its own,
its output appended to one log file, checked for an early exit while a test waits for it, and
stopped with SIGTERM, then SIGKILL."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from kvgate_e2e.cluster_like import ClusterLike

# After SIGKILL a process is gone as soon as the kernel reaps it; 5 s only bounds a stuck wait.
_KILL_WAIT_SECONDS = 5.0


class ServerProcess:
    """``start`` launches, ``check_running`` raises ``error`` with the log's tail if the process
    exited, ``stop`` ends it (``stop_seconds`` of SIGTERM grace) and closes the log."""

    def __init__(
        self,
        name: str,
        log_path: Path,
        *,
        error: Callable[[str], BaseException],
        stop_seconds: float,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self.error = error
        self.stop_seconds = stop_seconds
        self.proc: subprocess.Popen[Any] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} not started"
        return self.proc.pid

    def start(
        self,
        cluster: ClusterLike,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._log = self.log_path.open("ab")
        self.proc = cluster.popen_in_netns(
            list(argv),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )

    def exited(self) -> bool:
        """True once a started process has exited."""
        return self.proc is not None and self.proc.poll() is not None

    def check_running(self) -> None:
        """Raise ``error`` naming the exit code and the log's tail if the process exited (a
        ``poll_until`` guard: a wait for the server ends at once when it died)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise self.error(f"{self.name} exited {self.proc.returncode}\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return f"(no {self.name} log)"
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {self.name} log (tail) ---\n" + "\n".join(text)

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(self.stop_seconds)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(_KILL_WAIT_SECONDS)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
