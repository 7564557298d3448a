"""Whether an engine pod's model download is failing, and how to say it (pure).

``spec.model.source.download`` fills the model volume with the init container
``kvgate-fetch-model`` before the engine starts. When it fails (a wrong token, a repository or
revision that does not exist, a full volume, a hub that keeps answering 5xx) the pod waits in its
init phase, restarted with the kubelet's back-off, and its engine never starts; verification
counts alone ("prefill 0/1 verified") would not say why. The download's own log says what went
wrong (kvgate.cmd.fetch_model); the ModelDeployment's conditions quote that line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.objects.model_source import FETCH_CONTAINER

REASON = "ModelDownloadFailing"
MAX_LINE_CHARS = 600  # the fetcher's lines name the cause and the fix: keep both


@dataclass(frozen=True)
class DownloadFailure:
    """The failed attempt of one pod's download: its exit code, how often the kubelet restarted
    the init container, and whether a retry runs now (then the failed attempt's log is the
    previous one)."""

    exit_code: int | None
    restarts: int
    retrying: bool

    @property
    def key(self) -> tuple[int, int | None]:
        """What identifies this attempt (a later failure is another one)."""
        return self.restarts, self.exit_code


def fetch_status(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if isinstance(status, Mapping) and status.get("name") == FETCH_CONTAINER:
            return status
    return None


def _exit_code(state: Any) -> int | None:
    terminated = (state or {}).get("terminated") if isinstance(state, Mapping) else None
    if not isinstance(terminated, Mapping):
        return None
    code = terminated.get("exitCode")
    return code if isinstance(code, int) else None


def failure_of(pod: Mapping[str, Any]) -> DownloadFailure | None:
    """The pod's failing download, or None (no download, done, or no attempt failed yet)."""
    status = fetch_status(pod)
    if status is None:
        return None
    restarts = status.get("restartCount")
    restarts = restarts if isinstance(restarts, int) else 0
    now = _exit_code(status.get("state"))
    if now == 0:
        return None  # downloaded
    if now is not None:
        return DownloadFailure(now, restarts, retrying=False)
    last = _exit_code(status.get("lastState"))
    if last is not None and last != 0:
        return DownloadFailure(last, restarts, retrying=True)
    return None


def clip(line: str) -> str:
    flat = " ".join(line.split())
    return flat if len(flat) <= MAX_LINE_CHARS else flat[: MAX_LINE_CHARS - 1] + "…"


def last_line(text: str) -> str | None:
    """The last non-empty line of a log tail, without the pods/log timestamp kvgate never asks
    for, clipped."""
    lines = [line for line in text.splitlines() if line.strip()]
    return clip(lines[-1]) if lines else None


def describe(
    role: str, pod: str, namespace: str, failure: DownloadFailure, line: str | None
) -> str:
    """``decode pod P: the model download failed (init container kvgate-fetch-model exited 1,
    restarted 3 times; retrying): <its last log line>`` and where to read the rest."""
    code = "with no exit code" if failure.exit_code is None else f"exited {failure.exit_code}"
    times = "once" if failure.restarts == 1 else f"{failure.restarts} times"
    attempt = f"restarted {times}" if failure.restarts else "not restarted yet"
    state = "; retrying with the kubelet's back-off" if failure.retrying else ""
    said = f": {line}" if line else ""
    logs = f"kubectl logs -n {namespace} {pod} -c {FETCH_CONTAINER}"
    if failure.retrying:
        logs += " --previous"
    return (
        f"{role} pod {pod}: the model download failed (init container {FETCH_CONTAINER} {code}, "
        f"{attempt}{state}){said}; the engine starts once it succeeds ({logs}; "
        "spec.model.source.download)"
    )
