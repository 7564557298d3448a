"""Container statuses, pod phase and restart back-off as the kubelet reports them (pure).

Phase follows ``getPhase`` in ``pkg/kubelet/kubelet_pods.go``; the back-off follows the kubelet's
crash-loop back-off: the first restart is immediate, then 10 s doubling up to 5 min
(``pkg/kubelet/kuberuntime``), reset after a container ran for twice the maximum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

RUNNING = "running"
WAITING = "waiting"
TERMINATED = "terminated"


@dataclass
class ContainerRecord:
    """What the loopback runtime knows about one container (mutable, owned by its pod worker)."""

    name: str
    image: str
    state: str = WAITING
    waiting_reason: str = "ContainerCreating"
    waiting_message: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    terminated_reason: str = ""
    terminated_message: str = ""
    last_terminated: dict[str, Any] | None = None
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    pid: int | None = None

    @property
    def container_id(self) -> str | None:
        return f"loopback://{self.pid}" if self.pid is not None else None

    def terminated_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "exitCode": self.exit_code if self.exit_code is not None else 0,
            "reason": self.terminated_reason or ("Completed" if self.exit_code == 0 else "Error"),
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
        }
        if self.signal is not None:
            state["signal"] = self.signal
        if self.terminated_message:
            state["message"] = self.terminated_message
        if self.container_id:
            state["containerID"] = self.container_id
        return state


def container_status(record: ContainerRecord) -> dict[str, Any]:
    """One ``containerStatuses[]`` entry."""
    state: dict[str, Any]
    if record.state == RUNNING:
        state = {"running": {"startedAt": record.started_at}}
    elif record.state == TERMINATED:
        state = {"terminated": record.terminated_state()}
    else:
        waiting: dict[str, Any] = {"reason": record.waiting_reason}
        if record.waiting_message:
            waiting["message"] = record.waiting_message
        state = {"waiting": waiting}
    out: dict[str, Any] = {
        "name": record.name,
        "image": record.image,
        "imageID": f"loopback://{record.image}",
        "ready": record.ready,
        "started": record.started,
        "restartCount": record.restart_count,
        "state": state,
        "lastState": {"terminated": record.last_terminated} if record.last_terminated else {},
    }
    if record.container_id and record.state != WAITING:
        out["containerID"] = record.container_id
    return out


def pod_phase(
    restart_policy: str,
    records: list[ContainerRecord],
    *,
    initialized: bool = True,
    sidecars: Sequence[ContainerRecord] = (),
) -> str:
    """``getPhase``: Pending while initialising or any container has never run; Running while one
    runs (or will be restarted); Succeeded/Failed once all stopped for good. A running sidecar
    (restartable init container) counts as running; one that stopped (and will be restarted)
    does not count at all, as in the kubelet."""
    if not initialized:
        return "Pending"
    running = waiting = stopped = succeeded = 0
    for rec in sidecars:
        if rec.state == RUNNING:
            running += 1
        elif rec.state == WAITING and rec.last_terminated is None:
            waiting += 1
    for rec in records:
        if rec.state == RUNNING:
            running += 1
        elif rec.state == TERMINATED:
            stopped += 1
            if rec.exit_code == 0:
                succeeded += 1
        elif rec.last_terminated is not None:
            stopped += 1
            if rec.last_terminated.get("exitCode") == 0:
                succeeded += 1
        else:
            waiting += 1
    if waiting > 0:
        return "Pending"
    if running > 0:
        return "Running"
    if stopped > 0:
        if restart_policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        if restart_policy == "Never":
            return "Failed"
        return "Running"
    return "Pending"


def should_restart(restart_policy: str, exit_code: int) -> bool:
    """``restartPolicy`` for a container that exited with ``exit_code``."""
    if restart_policy == "Always":
        return True
    if restart_policy == "OnFailure":
        return exit_code != 0
    return False


def restart_delay(restart_number: int, initial: float = 10.0, maximum: float = 300.0) -> float:
    """Seconds to wait before restart ``restart_number`` (1-based): 0, then 10, 20, 40 … 300."""
    if restart_number <= 1:
        return 0.0
    return float(min(initial * (2 ** (restart_number - 2)), maximum))


def exit_code_of(returncode: int) -> tuple[int, int | None]:
    """``Popen.returncode`` → (exitCode as a container runtime reports it, signal or None)."""
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None
