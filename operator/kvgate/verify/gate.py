"""The engine-verified readiness gate: pod + verdict -> the pod condition to write (pure).

A pod is Ready only when its containers are ready AND its ``kvgate.io/engine-verified``
condition is True. This module decides that condition's value; it never does I/O.

CANNOT_TELL (engine unreachable, report unreadable) gives status ``False``, never ``True`` nor
``Unknown``: the condition states "this pod's live engine was verified", and an engine that could
not be read was not. ``False`` also flips ``lastTransitionTime`` when a verified pod stops
answering, which is the moment an operator wants to see.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kvgate_engine.verdict import (
    CONTEXT_TOO_LONG,
    CONTEXT_TOO_SHORT,
    ENGINE_VERSION_TOO_OLD,
    KV_POOL_TOO_SMALL,
    MAX_INPUT_TOO_LONG,
    MAX_INPUT_TOO_SHORT,
    ROLE_MISMATCH,
    Outcome,
    Requirement,
    Verdict,
)

from kvgate.api import labels
from kvgate.api.timestamps import parse_rfc3339, rfc3339

Pod = Mapping[str, Any]
Condition = dict[str, str]

ENGINE_NOT_READY = "EngineNotReady"
REQUIREMENT_UNKNOWN = "RequirementUnknown"
NOT_OWNED = "NotOwnedByModelDeployment"
# Taken out of traffic on purpose to be removed by a scale-down (kvgate.rollout.scaling).
SCALING_DOWN = "ScalingDown"
# Reasons that are a verdict on the engine itself (refuse the revision), as opposed to "could not
# read it yet" (wait, time out).
UNSAFE_REASONS = frozenset(
    {
        KV_POOL_TOO_SMALL,
        CONTEXT_TOO_SHORT,
        CONTEXT_TOO_LONG,
        MAX_INPUT_TOO_SHORT,
        MAX_INPUT_TOO_LONG,
        ROLE_MISMATCH,
        ENGINE_VERSION_TOO_OLD,
    }
)
ENGINE_CONTAINER = "engine"


def pod_name(pod: Pod) -> str:
    return str(pod.get("metadata", {}).get("name", "?"))


def pod_role(pod: Pod) -> str:
    return str(pod.get("metadata", {}).get("labels", {}).get(labels.ROLE, "engine"))


def current_condition(pod: Pod) -> Condition | None:
    """The pod's engine-verified condition as it is now, if any."""
    for cond in pod.get("status", {}).get("conditions", None) or []:
        if cond.get("type") == labels.ENGINE_VERIFIED:
            return dict(cond)
    return None


def is_verified(pod: Pod) -> bool:
    cond = current_condition(pod)
    return cond is not None and cond.get("status") == "True"


def unverified_since(pod: Pod) -> datetime | None:
    """Since when the pod's gate has not been True: its lastTransitionTime when it is False (or
    Unknown), the pod's creation when none is written; None while it is True or when neither
    time can be read."""
    cond = current_condition(pod)
    if cond is not None and cond.get("status") == "True":
        return None
    raw = (cond or {}).get("lastTransitionTime") or pod.get("metadata", {}).get("creationTimestamp")
    return parse_rfc3339(raw)


def verified_since_engine_start(pod: Pod) -> bool:
    """Whether the pod's gate has been True since before or when its engine container last
    started (``lastTransitionTime`` ≥ ``state.running.startedAt``, both RFC 3339 UTC to the
    second, so they compare as text): an operator that starts (a new leader) re-reads such an
    engine after the ones that restarted or were never verified (kvgate.kube.probe_slots), which
    the replica before it did not get to see. Anything missing: False (read it first)."""
    cond = current_condition(pod)
    status = engine_container_status(pod) or {}
    started = ((status.get("state") or {}).get("running") or {}).get("startedAt")
    verified = (cond or {}).get("lastTransitionTime")
    if cond is None or cond.get("status") != "True" or not started or not verified:
        return False
    return bool(status.get("ready")) and str(verified) >= str(started)


def engine_container_status(pod: Pod) -> Mapping[str, Any] | None:
    for status in pod.get("status", {}).get("containerStatuses", None) or []:
        if status.get("name") == ENGINE_CONTAINER:
            return dict(status)
    return None


def engine_port(pod: Pod) -> int | None:
    for container in pod.get("spec", {}).get("containers", []):
        if container.get("name") == ENGINE_CONTAINER:
            for port in container.get("ports", []):
                if port.get("name") == "http":
                    return int(port["containerPort"])
    return None


def engine_url(pod: Pod) -> str | None:
    """``http://podIP:port`` once the pod has an IP and its engine container is ready."""
    ip = pod.get("status", {}).get("podIP")
    status = engine_container_status(pod)
    port = engine_port(pod)
    if not ip or status is None or not status.get("ready") or port is None:
        return None
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return None
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}"


def restart_count(pod: Pod) -> int:
    status = engine_container_status(pod)
    return int(status.get("restartCount", 0)) if status else 0


def _headroom(value: float) -> str:
    return f"{value:g}" if value != int(value) else f"{value:.1f}"


def verdict_message(pod: Pod, verdict: Verdict, requirement: Requirement) -> str:
    who = f"{pod_role(pod)} pod {pod_name(pod)}"
    if verdict.outcome is Outcome.SAFE:
        pool = verdict.report.kv_pool_tokens if verdict.report else None
        pool_text = f"KV pool {pool:,} tokens" if pool is not None else "KV pool"
        return (
            f"{who} reports {pool_text} ≥ context length {requirement.context_length:,} × "
            f"headroom {_headroom(requirement.headroom)}"
        )
    if verdict.outcome is Outcome.UNSAFE:
        return f"{who} reports {verdict.message}"
    return f"{who} could not be verified: {verdict.message}"


_PROVEN_POOL = re.compile(r" reports KV pool ([0-9,]+) tokens ≥ context length ")


def proven_pool_tokens(pod: Pod) -> int | None:
    """The KV pool (tokens) the pod's engine proved when its gate was last set True, read back
    from the condition's message (``verdict_message``'s words); None when the gate is not True
    or the message names no pool."""
    cond = current_condition(pod)
    if cond is None or cond.get("status") != "True":
        return None
    found = _PROVEN_POOL.search(str(cond.get("message") or ""))
    return int(found.group(1).replace(",", "")) if found else None


def _condition(pod: Pod, status: str, reason: str, message: str, now: datetime) -> Condition | None:
    """The new condition, or None when the pod already carries exactly this one."""
    previous = current_condition(pod)
    if previous is not None and (
        previous.get("status") == status
        and previous.get("reason") == reason
        and previous.get("message") == message
    ):
        return None
    if (
        previous is not None
        and previous.get("status") == status
        and previous.get("lastTransitionTime")
    ):
        transition = str(previous["lastTransitionTime"])
    else:
        transition = rfc3339(now)
    return {
        "type": labels.ENGINE_VERIFIED,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
    }


def condition_for_verdict(
    pod: Pod, verdict: Verdict, requirement: Requirement, now: datetime
) -> Condition | None:
    """The engine-verified condition after a probe; True only for a SAFE verdict."""
    status = "True" if verdict.outcome is Outcome.SAFE else "False"
    return _condition(pod, status, verdict.reason, verdict_message(pod, verdict, requirement), now)


def condition_for_engine_down(pod: Pod, now: datetime) -> Condition | None:
    """A verified pod whose engine container stopped being ready (restart, crash) loses the gate
    at once, so it cannot turn Ready again before its new engine is verified."""
    if not is_verified(pod):
        return None
    message = (
        f"{pod_role(pod)} pod {pod_name(pod)}: engine container is not ready (restarts: "
        f"{restart_count(pod)}); it is re-verified when it is ready again"
    )
    return _condition(pod, "False", ENGINE_NOT_READY, message, now)


def draining_since(pod: Pod) -> str | None:
    """When a scale-down took this pod out of traffic (its kvgate.io/draining-since), if it did."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(labels.DRAINING_SINCE)
    return str(value) if value else None


def condition_for_draining(pod: Pod, since: str, now: datetime) -> Condition | None:
    """False while a scale-down drains the pod: smg drops it (NotReady) and sends it nothing
    new; its requests in flight finish; then kvgate removes it."""
    message = (
        f"{pod_role(pod)} pod {pod_name(pod)}: taken out of traffic at {since} to scale down; "
        "it is removed once its engine reports no running or queued request and no KV "
        "transfer in flight"
    )
    return _condition(pod, "False", SCALING_DOWN, message, now)


def condition_for_unverifiable(
    pod: Pod, reason: str, message: str, now: datetime
) -> Condition | None:
    """False, because kvgate cannot tell what this pod's engine must prove: the pod is not
    provably one of its ModelDeployment's engine pods, or its revision's requirement is not
    recorded. (None when the pod already carries exactly this condition.)"""
    return _condition(pod, "False", reason, f"{pod_role(pod)} pod {pod_name(pod)}: {message}", now)


def is_unsafe_reason(reason: str | None) -> bool:
    return reason in UNSAFE_REASONS
