"""ModelDeployment status from a RolloutStep (pure): conditions, counters, and the Events due.

Conditions follow metav1.Condition: CamelCase reasons, observedGeneration, and a
lastTransitionTime that changes only when the status flips.
- Ready: the current spec's revision serves, with enough verified prefill AND decode pods.
- EnginesVerified: every engine pod of the current spec's revision passed verification.
- Progressing: a new revision is being verified (False once it serves or is refused).
- Degraded: a rollout was refused, or serving pods lost verification.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvgate.gate import rfc3339
from kvgate.planner import PodState, RoleProgress, RolloutStep

READY = "Ready"
ENGINES_VERIFIED = "EnginesVerified"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
CONDITION_TYPES = (READY, ENGINES_VERIFIED, PROGRESSING, DEGRADED)

Status = dict[str, Any]


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class _Cond:
    status: str
    reason: str
    message: str


def _progress(progress: Mapping[str, RoleProgress]) -> str:
    return ", ".join(f"{role} {p.verified}/{p.needed} verified" for role, p in progress.items())


def _first_problem(pods: tuple[PodState, ...]) -> PodState | None:
    return pods[0] if pods else None


def _serving_note(step: RolloutStep) -> str:
    if step.serving_revision and step.serving_revision != step.target_revision:
        return f"revision {step.serving_revision} keeps serving"
    return "nothing serves"


def _enough(step: RolloutStep) -> bool:
    return all(p.verified >= p.needed for p in step.progress.values())


def _ready(step: RolloutStep) -> _Cond:
    rev = step.target_revision
    if step.refusal is not None:
        return _Cond(
            "False",
            "RolloutRefused",
            f"revision {rev} refused: {step.refusal.message}; {_serving_note(step)}",
        )
    if step.serving_revision == rev:
        if _enough(step) and step.target_router_ready:
            return _Cond(
                "True", "RevisionServing", f"revision {rev} serves: {_progress(step.progress)}"
            )
        router = "router ready" if step.target_router_ready else "router not ready"
        return _Cond(
            "False",
            "NotEnoughVerifiedEngines",
            f"revision {rev} serves with too few verified engines: {_progress(step.progress)}, "
            f"{router}",
        )
    return _Cond(
        "False",
        "RolloutInProgress" if step.serving_revision else "AwaitingVerification",
        f"revision {rev} verifying: {_progress(step.progress)}; {_serving_note(step)}",
    )


def _engines_verified(step: RolloutStep) -> _Cond:
    all_verified = all(p.verified >= p.replicas for p in step.progress.values())
    problem = _first_problem(step.target_problems)
    if problem is not None:
        return _Cond("False", problem.gate_reason or "NotVerified", problem.gate_message or "")
    if all_verified:
        return _Cond("True", "AllEnginesVerified", _progress_all(step))
    return _Cond("False", "VerificationPending", _progress_all(step))


def _progress_all(step: RolloutStep) -> str:
    return ", ".join(
        f"{role} {p.verified}/{p.replicas} verified" for role, p in step.progress.items()
    )


def _progressing(step: RolloutStep) -> _Cond:
    rev = step.target_revision
    if step.refusal is not None:
        return _Cond("False", "RolloutRefused", f"revision {rev} refused: {step.refusal.message}")
    if step.serving_revision == rev:
        return _Cond("False", "RolloutComplete", f"revision {rev} serves")
    return _Cond(
        "True", "RolloutInProgress", f"revision {rev} verifying: {_progress(step.progress)}"
    )


def _degraded(step: RolloutStep) -> _Cond:
    problem = _first_problem(step.serving_problems)
    if step.refusal is not None:
        return _Cond(
            "True",
            step.refusal.reason,
            f"revision {step.target_revision} refused: {step.refusal.message}; "
            f"{_serving_note(step)}",
        )
    if problem is not None:
        return _Cond(
            "True",
            "EngineVerificationLost",
            f"{problem.gate_message or problem.gate_reason}; the pod takes no traffic",
        )
    return _Cond("False", "AsExpected", "")


def _message(step: RolloutStep, ready: _Cond, degraded: _Cond) -> str:
    if degraded.status == "True":
        return degraded.message
    return ready.message


def _condition(
    kind: str, new: _Cond, previous: Mapping[str, Mapping[str, Any]], generation: int, now: datetime
) -> dict[str, Any]:
    old = previous.get(kind)
    transition = (
        str(old["lastTransitionTime"])
        if old is not None and old.get("status") == new.status and old.get("lastTransitionTime")
        else rfc3339(now)
    )
    return {
        "type": kind,
        "status": new.status,
        "observedGeneration": generation,
        "lastTransitionTime": transition,
        "reason": new.reason,
        "message": new.message,
    }


def _role_status(p: RoleProgress) -> dict[str, Any]:
    return {
        "replicas": p.replicas,
        "readyReplicas": p.ready,
        "verifiedReplicas": p.verified,
        "minVerifiedKvPoolTokens": p.min_verified_kv_pool_tokens,
    }


def compute_status(
    step: RolloutStep,
    *,
    generation: int,
    context_length: int,
    previous: Mapping[str, Any] | None,
    now: datetime,
) -> Status:
    """The full status to write (camelCase, as on the wire)."""
    previous = previous or {}
    old_conditions = {c.get("type"): c for c in previous.get("conditions", None) or []}
    ready = _ready(step)
    degraded = _degraded(step)
    built = {
        READY: ready,
        ENGINES_VERIFIED: _engines_verified(step),
        PROGRESSING: _progressing(step),
        DEGRADED: degraded,
    }
    if step.serving_revision == step.target_revision:
        serving_context: int | None = context_length
    elif step.serving_revision is not None and step.serving_revision == previous.get(
        "servingRevision"
    ):
        serving_context = previous.get("contextLength")
    else:
        serving_context = None
    refused = step.refusal.revision if step.refusal else previous.get("refusedRevision")
    return {
        "observedGeneration": generation,
        "conditions": [
            _condition(kind, built[kind], old_conditions, generation, now)
            for kind in CONDITION_TYPES
        ],
        "servingRevision": step.serving_revision,
        "targetRevision": step.target_revision,
        "refusedRevision": refused,
        "contextLength": serving_context,
        "prefill": _role_status(step.progress["prefill"]),
        "decode": _role_status(step.progress["decode"]),
        "message": _message(step, ready, degraded),
    }


def status_changed(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing ``new`` would change anything (no write when it would not)."""
    if previous is None:
        return True
    return any(previous.get(k) != v for k, v in new.items())


def events_for(step: RolloutStep, previous: Mapping[str, Any] | None) -> list[Event]:
    """Events on transitions only: a rollout starts, a revision starts serving, one is refused."""
    previous = previous or {}
    events: list[Event] = []
    if step.new_refusal and step.refusal is not None:
        events.append(
            Event(
                "Warning",
                "RolloutRefused",
                f"revision {step.target_revision} refused ({step.refusal.reason}): "
                f"{step.refusal.message}; {_serving_note(step)}",
            )
        )
    elif (
        previous.get("targetRevision") != step.target_revision
        and step.serving_revision != step.target_revision
    ):
        events.append(
            Event(
                "Normal",
                "RolloutStarted",
                f"revision {step.target_revision} created; it serves once "
                f"{_progress_needed(step)} pods are verified",
            )
        )
    if step.switched and step.serving_revision is not None:
        was = step.previous_serving_revision or "nothing"
        events.append(
            Event(
                "Normal",
                "RevisionServing",
                f"revision {step.serving_revision} now serves (was {was}): "
                f"{_progress(step.progress)}",
            )
        )
    return events


def _progress_needed(step: RolloutStep) -> str:
    return " and ".join(f"{p.needed} {role}" for role, p in step.progress.items())
