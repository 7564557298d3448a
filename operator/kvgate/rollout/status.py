"""ModelDeployment status from a RolloutStep (pure): conditions, counters, and the Events due.

Conditions follow metav1.Condition: CamelCase reasons, observedGeneration, and a
lastTransitionTime that changes only when the status flips.
- Ready: the current spec's revision serves, with enough verified prefill AND decode pods.
- EnginesVerified: every engine pod of the current spec's revision passed verification.
- Progressing: a new revision is being verified (False once it serves or is refused).
- Degraded: a rollout was refused, or serving pods lost verification.

The status is also kvgate's durable rollout record (only the operator writes it):
``servingRevision``, ``targetRevision`` and ``rollout`` (the target's verification start and
refusal) are read back by ``rollout_record`` on the next pass, so a lost Service, Deployment or
annotation never loses the rollout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvgate.api.timestamps import parse_rfc3339, rfc3339
from kvgate.rollout import model_download, pod_creation
from kvgate.rollout.planner import (
    Evidence,
    PodState,
    Refusal,
    RoleProgress,
    RolloutRecord,
    RolloutStep,
    ServiceRepair,
    StepRecord,
)
from kvgate.rollout.progressive import EngineFailures, RouterCounters

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
            f"{router}{_creation_note(step)}",
        )
    if step.step_record is not None:
        return _Cond(
            "False",
            "RolloutInProgress",
            f"revision {rev} verified ({_progress(step.progress)}) and in progressive step "
            f"{step.step_record.index + 1} ({step.step_record.weight} % of requests); "
            f"{_serving_note(step)} with the rest",
        )
    return _Cond(
        "False",
        "RolloutInProgress" if step.serving_revision else "AwaitingVerification",
        f"revision {rev} verifying: {_progress(step.progress)}{_download_note(step)}"
        f"{_creation_note(step)}; {_serving_note(step)}",
    )


def _download_note(step: RolloutStep) -> str:
    """``; <the first target pod whose model download fails>``, or nothing."""
    failing = [p for p in step.target_problems if p.gate_reason == model_download.REASON]
    return f"; {failing[0].gate_message}" if failing else ""


def _creation_note(step: RolloutStep) -> str:
    """``; <the first target Deployment whose pods the API server refuses>``, or nothing."""
    return pod_creation.first_note(step.target_creation_failures)


def _engine_creation_failure(step: RolloutStep) -> pod_creation.CreationFailure | None:
    engines = [f for f in step.target_creation_failures if f.component in step.progress]
    return engines[0] if engines else None


def _engines_verified(step: RolloutStep) -> _Cond:
    all_verified = all(p.verified >= p.replicas for p in step.progress.values())
    problem = _first_problem(step.target_problems)
    if problem is not None:
        return _Cond("False", problem.gate_reason or "NotVerified", problem.gate_message or "")
    not_created = _engine_creation_failure(step)
    if not_created is not None:
        return _Cond("False", pod_creation.REASON, not_created.describe())
    if all_verified:
        return _Cond("True", "AllEnginesVerified", _progress_all(step))
    return _Cond("False", "VerificationPending", _progress_all(step))


def _progress_all(step: RolloutStep) -> str:
    return ", ".join(
        f"{role} {p.verified}/{p.replicas} verified" for role, p in step.progress.items()
    )


def _split_note(step: RolloutStep) -> str:
    """What a progressive step is doing, for the Progressing condition."""
    record = step.step_record
    if record is None:
        return ""
    shares = dict(step.traffic)
    target = shares.get(step.target_revision, 0)
    note = (
        f"progressive step {record.index + 1} ({record.weight} %): revision "
        f"{step.target_revision} takes {target} % of new connections (its share of ready "
        f"routers), revision "
        f"{step.serving_revision} the rest"
    )
    if step.step_waiting:
        note += f"; {step.step_waiting}"
    if step.step_check is not None:
        note += f"; step check: {step.step_check.summary()}"
    return note


def traffic_split(step: RolloutStep) -> str | None:
    """``<rev>=<percent>%`` per revision behind the Service (the printer column)."""
    if step.traffic:
        return ",".join(f"{rev}={share}%" for rev, share in step.traffic)
    if step.serving_revision is not None:
        return f"{step.serving_revision}=100%"
    return None


def _progressing(step: RolloutStep) -> _Cond:
    rev = step.target_revision
    if step.refusal is not None:
        return _Cond("False", "RolloutRefused", f"revision {rev} refused: {step.refusal.message}")
    if step.serving_revision == rev:
        return _Cond("False", "RolloutComplete", f"revision {rev} serves")
    if step.step_record is not None:
        return _Cond("True", "ProgressiveStep", _split_note(step))
    if step.step_waiting:
        return _Cond(
            "True",
            "RolloutInProgress",
            f"revision {rev} verified: {_progress(step.progress)}; {step.step_waiting}",
        )
    return _Cond(
        "True",
        "RolloutInProgress",
        f"revision {rev} verifying: {_progress(step.progress)}{_download_note(step)}"
        f"{_creation_note(step)}",
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
    not_created = pod_creation.first_note(step.serving_creation_failures)
    if not_created and step.serving_revision is not None:
        return _Cond(
            "True",
            pod_creation.REASON,
            f"serving revision {step.serving_revision}: {not_created.removeprefix('; ')}",
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
        "trafficSplit": traffic_split(step),
        "contextLength": serving_context,
        "rollout": _rollout_status(step),
        "prefill": _role_status(step.progress["prefill"]),
        "decode": _role_status(step.progress["decode"]),
        "message": _message(step, ready, degraded),
    }


def _rollout_status(step: RolloutStep) -> dict[str, Any]:
    refusal = step.refusal
    # None, not absent: the status is written with a merge patch, where only null removes a key.
    return {
        "verifyStartedAt": rfc3339(step.verify_started_at),
        "refusal": {"reason": refusal.reason, "message": refusal.message} if refusal else None,
        "step": _step_status(step),
    }


def _step_status(step: RolloutStep) -> dict[str, Any] | None:
    record = step.step_record
    if record is None:
        return None
    return {
        "index": record.index,
        "weight": record.weight,
        "startedAt": rfc3339(record.started_at),
        "servingRouterReplicas": record.serving_router_replicas,
        "baseline": [
            {"pod": c.pod, "requests": c.requests, "errors": c.errors, "rejected": c.rejected}
            for c in record.baseline
        ],
        "engineBaseline": [
            {"pod": f.pod, "role": f.role, "transfers": f.transfers, "bootstraps": f.bootstraps}
            for f in record.engine_baseline
        ],
        "check": step.step_check.summary() if step.step_check is not None else "",
    }


def _step_record(raw: object) -> StepRecord | None:
    if not isinstance(raw, Mapping):
        return None
    started = parse_rfc3339(raw.get("startedAt"))
    index = raw.get("index")
    if started is None or not isinstance(index, int) or index < 0:
        return None
    baseline = tuple(
        RouterCounters(
            str(c.get("pod") or ""),
            int(c.get("requests") or 0),
            int(c.get("errors") or 0),
            int(c.get("rejected") or 0),
        )
        for c in raw.get("baseline") or []
        if isinstance(c, Mapping)
    )
    engine_baseline = tuple(
        EngineFailures(
            str(f.get("pod") or ""),
            str(f.get("role") or ""),
            int(f.get("transfers") or 0),
            int(f.get("bootstraps") or 0),
        )
        for f in raw.get("engineBaseline") or []
        if isinstance(f, Mapping)
    )
    return StepRecord(
        index,
        started,
        baseline,
        int(raw.get("servingRouterReplicas") or 1),
        int(raw.get("weight") or 0),
        engine_baseline,
    )


def rollout_record(status: Mapping[str, Any] | None) -> RolloutRecord:
    """The rollout as a previous pass wrote it (``compute_status``); empty for no status."""
    status = status or {}
    target = status.get("targetRevision") or None
    rollout = status.get("rollout") or {}
    refusal = rollout.get("refusal") or {}
    return RolloutRecord(
        target_revision=target,
        serving_revision=status.get("servingRevision") or None,
        verify_started_at=parse_rfc3339(rollout.get("verifyStartedAt")),
        refusal=(
            Refusal(target, str(refusal["reason"]), str(refusal.get("message") or ""))
            if target and refusal.get("reason")
            else None
        ),
        step=_step_record(rollout.get("step")) if target else None,
    )


def refusal_is_new(step: RolloutStep, previous: Mapping[str, Any] | None) -> bool:
    """The step's refusal is not in the status a previous pass wrote: it is counted, logged and
    announced now. Decided from the written status, not from ``step.new_refusal``: the pass
    that decides a refusal writes the revision's Deployments before its status, so when that
    status write fails the next pass finds the refusal standing on the Deployments, and would
    otherwise never count or announce it."""
    if step.refusal is None:
        return False
    recorded = rollout_record(previous).refusal
    return recorded is None or recorded.revision != step.refusal.revision


def events_for(step: RolloutStep, previous: Mapping[str, Any] | None) -> list[Event]:
    """Events on transitions only: a rollout starts, a revision starts serving, one is refused."""
    new_refusal = refusal_is_new(step, previous)
    previous = previous or {}
    return [
        *_rollout_events(step, previous, new_refusal=new_refusal),
        *_engine_events(step, previous),
        *_traffic_events(step, previous),
        *_repair_events(step),
    ]


def _rollout_events(
    step: RolloutStep, previous: Mapping[str, Any], *, new_refusal: bool
) -> list[Event]:
    """The target revision refused, or its rollout started."""
    if step.refusal is not None and new_refusal:
        return [
            Event(
                "Warning",
                "RolloutRefused",
                f"revision {step.target_revision} refused ({step.refusal.reason}): "
                f"{step.refusal.message}; {_serving_note(step)}",
            )
        ]
    if (
        previous.get("targetRevision") != step.target_revision
        and step.serving_revision != step.target_revision
    ):
        return [
            Event(
                "Normal",
                "RolloutStarted",
                f"revision {step.target_revision} created; it serves once "
                f"{_progress_needed(step)} pods are verified",
            )
        ]
    return []


def _engine_events(step: RolloutStep, previous: Mapping[str, Any]) -> list[Event]:
    """Engines that cannot start: the model download fails, or pods cannot be created."""
    events: list[Event] = []
    engines = _engines_verified(step)
    was = _condition_reason(previous, "EnginesVerified")
    if engines.reason == model_download.REASON and was != model_download.REASON:
        events.append(Event("Warning", model_download.REASON, engines.message))
    not_created = pod_creation.first_note(
        (*step.target_creation_failures, *step.serving_creation_failures)
    )
    if not_created and not _said_not_created(previous):
        events.append(Event("Warning", pod_creation.REASON, not_created.removeprefix("; ")))
    return events


def _traffic_events(step: RolloutStep, previous: Mapping[str, Any]) -> list[Event]:
    """A progressive step began, or a revision started serving."""
    events: list[Event] = []
    if step.step_record is not None and _step_began(step, previous):
        record = step.step_record
        events.append(
            Event(
                "Normal",
                "TrafficStepStarted",
                f"progressive step {record.index + 1}: revision {step.target_revision} takes "
                f"{record.weight} % of requests (its share of the routers behind the Service), "
                f"revision {step.serving_revision} the rest; the step check watches its routers",
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


def _repair_events(step: RolloutStep) -> list[Event]:
    """The Service or the serving revision's Deployments put back."""
    events: list[Event] = []
    if step.service_repair is not None:
        events.append(_service_event(step, step.service_repair))
    if step.recreated_serving_components and step.serving_revision is not None:
        components = " and ".join(step.recreated_serving_components)
        many = len(step.recreated_serving_components) > 1
        events.append(
            Event(
                "Warning",
                "ServingDeploymentRecreated",
                f"the {components} Deployment{'s' if many else ''} of serving revision "
                f"{step.previous_serving_revision} {'were' if many else 'was'} missing: "
                "recreated; its traffic resumes once the new pods are Ready (the Service keeps "
                "selecting that revision)",
            )
        )
    return events


def _said_not_created(status: Mapping[str, Any]) -> bool:
    """The previous status already said that a Deployment cannot create its pods (the Event
    fires on the transition only)."""
    return any(
        isinstance(c, Mapping) and pod_creation.HEAD in str(c.get("message") or "")
        for c in status.get("conditions") or []
    )


def _condition_reason(status: Mapping[str, Any], kind: str) -> str | None:
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            reason = condition.get("reason")
            return str(reason) if reason is not None else None
    return None


def _step_began(step: RolloutStep, previous: Mapping[str, Any]) -> bool:
    before = (previous.get("rollout") or {}).get("step") or {}
    record = step.step_record
    return record is not None and (
        previous.get("targetRevision") != step.target_revision
        or before.get("index") != record.index
    )


_EVIDENCE = {
    Evidence.STATUS: "the last revision that served, recorded in status.servingRevision",
    Evidence.SERVICE: "the revision the Service selected; status.servingRevision named none "
    "that still runs",
    Evidence.VERIFIED_ENGINES: "status.servingRevision and the Service named no running "
    "revision; it is the revision whose engines are verified and whose router is Ready",
}


def _service_event(step: RolloutStep, repair: ServiceRepair) -> Event:
    why = _EVIDENCE[repair.evidence]
    if step.refusal is not None:
        target = f"; revision {step.target_revision} is refused and takes no traffic"
    elif step.target_revision != repair.revision:
        target = f"; revision {step.target_revision} takes traffic once verified"
    else:
        target = ""
    if repair.recreated:
        return Event(
            "Warning",
            "ServiceRecreated",
            f"the Service was missing: recreated it selecting revision {repair.revision}'s "
            f"routers ({why}){target}",
        )
    was = f"revision {repair.was}" if repair.was else "no revision"
    return Event(
        "Warning",
        "ServiceSelectorRestored",
        f"the Service selected {was}, not the serving revision: restored its selector to "
        f"revision {repair.revision} ({why}){target}",
    )


def _progress_needed(step: RolloutStep) -> str:
    return " and ".join(f"{p.needed} {role}" for role, p in step.progress.items())


def invalid_spec_status(
    previous: Mapping[str, Any] | None, problems: str, *, generation: int, now: datetime
) -> tuple[Status | None, Event | None]:
    """The status (and the Event) for a spec kvgate cannot parse; (None, None) when the previous
    status already says exactly this (no rewrite, no new lastTransitionTime, no Event)."""
    before: Mapping[str, Any] = next(
        (c for c in (previous or {}).get("conditions") or [] if c.get("type") == READY), {}
    )
    if (
        before.get("reason") == "InvalidSpec"
        and before.get("message") == problems
        and before.get("observedGeneration") == generation
    ):
        return None, None
    transition = (
        before["lastTransitionTime"]
        if before.get("status") == "False" and before.get("lastTransitionTime")
        else rfc3339(now)
    )
    status: Status = {
        "observedGeneration": generation,
        "message": f"invalid spec: {problems}",
        "conditions": [
            {
                "type": READY,
                "status": "False",
                "observedGeneration": generation,
                "lastTransitionTime": transition,
                "reason": "InvalidSpec",
                "message": problems,
            }
        ],
    }
    return status, Event("Warning", "InvalidSpec", f"invalid spec: {problems}")
