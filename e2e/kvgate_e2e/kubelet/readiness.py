"""Pod readiness exactly as the kubelet computes it (pure).

Port of ``pkg/kubelet/status/generate.go`` (GenerateContainersReadyCondition,
GeneratePodReadyCondition, GeneratePodInitializedCondition) from Kubernetes 1.37: the same
reasons, the same messages (Go's ``%s`` of a string slice prints ``[a b]``), the same order.
The loopback kubelet owns only the conditions in ``KUBELET_CONDITIONS``; a readiness-gate
condition (e.g. ``kvgate.io/engine-verified``) is read here and never written.

As in ``generateAPIPodStatus`` (``pkg/kubelet/kubelet_pods.go``), every function takes *all*
container statuses, init containers' first: a native sidecar (an init container with
``restartPolicy: Always``) counts toward ContainersReady and Ready like a regular container.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

READY = "Ready"
CONTAINERS_READY = "ContainersReady"
INITIALIZED = "Initialized"
POD_READY_TO_START_CONTAINERS = "PodReadyToStartContainers"
KUBELET_CONDITIONS = (POD_READY_TO_START_CONTAINERS, INITIALIZED, CONTAINERS_READY, READY)

UNKNOWN_CONTAINER_STATUSES = "UnknownContainerStatuses"
POD_COMPLETED = "PodCompleted"
POD_FAILED = "PodFailed"
CONTAINERS_NOT_READY = "ContainersNotReady"
CONTAINERS_NOT_INITIALIZED = "ContainersNotInitialized"
READINESS_GATES_NOT_READY = "ReadinessGatesNotReady"

SUCCEEDED = "Succeeded"
FAILED = "Failed"


@dataclass(frozen=True)
class Condition:
    """One pod condition as the kubelet computes it (no timestamps)."""

    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str = ""
    message: str = ""


def go_string_slice(names: Sequence[str]) -> str:
    """Format like Go's ``fmt.Sprintf("%s", []string{...})``: ``[a b c]``."""
    return "[" + " ".join(names) + "]"


def _is_restartable_init(container: Mapping[str, Any]) -> bool:
    return container.get("restartPolicy") == "Always"


def _status_by_name(statuses: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {str(s.get("name")): s for s in statuses}


def containers_ready_condition(
    spec: Mapping[str, Any],
    container_statuses: Sequence[Mapping[str, Any]] | None,
    phase: str,
) -> Condition:
    """GenerateContainersReadyCondition."""
    if container_statuses is None:
        return Condition(CONTAINERS_READY, "False", UNKNOWN_CONTAINER_STATUSES)
    by_name = _status_by_name(container_statuses)
    unknown: list[str] = []
    unready: list[str] = []
    candidates = [c for c in spec.get("initContainers") or [] if _is_restartable_init(c)]
    candidates += list(spec.get("containers") or [])
    for container in candidates:
        name = str(container.get("name"))
        status = by_name.get(name)
        if status is None:
            unknown.append(name)
        elif not status.get("ready"):
            unready.append(name)
    if phase == SUCCEEDED and not unknown:
        return Condition(CONTAINERS_READY, "False", POD_COMPLETED)
    if phase == FAILED:
        return Condition(CONTAINERS_READY, "False", POD_FAILED)
    messages: list[str] = []
    if unknown:
        messages.append(f"containers with unknown status: {go_string_slice(unknown)}")
    if unready:
        messages.append(f"containers with unready status: {go_string_slice(unready)}")
    if messages:
        return Condition(CONTAINERS_READY, "False", CONTAINERS_NOT_READY, ", ".join(messages))
    return Condition(CONTAINERS_READY, "True")


def pod_ready_condition(
    spec: Mapping[str, Any],
    conditions: Sequence[Mapping[str, Any]],
    container_statuses: Sequence[Mapping[str, Any]] | None,
    phase: str,
) -> Condition:
    """GeneratePodReadyCondition: container readiness AND every ``spec.readinessGates`` condition
    as found in ``conditions`` (the pod's current status conditions, set by someone else)."""
    containers_ready = containers_ready_condition(spec, container_statuses, phase)
    if containers_ready.status != "True":
        return Condition(
            READY, containers_ready.status, containers_ready.reason, containers_ready.message
        )
    by_type = {str(c.get("type")): c for c in conditions}
    messages: list[str] = []
    for gate in spec.get("readinessGates") or []:
        gate_type = str(gate.get("conditionType"))
        found = by_type.get(gate_type)
        if found is None:
            messages.append(
                f'corresponding condition of pod readiness gate "{gate_type}" does not exist.'
            )
        elif found.get("status") != "True":
            messages.append(
                f'the status of pod readiness gate "{gate_type}" is not "True", '
                f"but {found.get('status')}"
            )
    if messages:
        return Condition(READY, "False", READINESS_GATES_NOT_READY, ", ".join(messages))
    return Condition(READY, "True")


def any_regular_container_started(
    spec: Mapping[str, Any], statuses: Sequence[Mapping[str, Any]]
) -> bool:
    """HasAnyRegularContainerStarted (``pkg/kubelet/container/helpers.go``): a container of
    ``spec.containers`` is running or has terminated, so the pod has been initialized."""
    regular = {str(c.get("name")) for c in spec.get("containers") or []}
    return any(
        str(s.get("name")) in regular
        and ("running" in (s.get("state") or {}) or "terminated" in (s.get("state") or {}))
        for s in statuses
    )


def initialized_condition(
    spec: Mapping[str, Any],
    container_statuses: Sequence[Mapping[str, Any]] | None,
    phase: str,
) -> Condition:
    """GeneratePodInitializedCondition, given every container status (init and regular, as the
    kubelet passes them): every regular init container ready (the kubelet marks one ready once
    it exited 0), every restartable one (sidecar) started; and once a regular container has
    started the pod stays initialized while a sidecar restarts."""
    init_containers = list(spec.get("initContainers") or [])
    if container_statuses is None and init_containers:
        return Condition(INITIALIZED, "False", UNKNOWN_CONTAINER_STATUSES)
    by_name = _status_by_name(container_statuses or [])
    unknown: list[str] = []
    incomplete: list[str] = []
    for container in init_containers:
        name = str(container.get("name"))
        status = by_name.get(name)
        if status is None:
            unknown.append(name)
            continue
        key = "started" if _is_restartable_init(container) else "ready"
        if not status.get(key):
            incomplete.append(name)
    if phase == SUCCEEDED and not unknown:
        return Condition(INITIALIZED, "True", POD_COMPLETED)
    if any_regular_container_started(spec, container_statuses or []):
        return Condition(INITIALIZED, "True")
    messages: list[str] = []
    if unknown:
        messages.append(f"containers with unknown status: {go_string_slice(unknown)}")
    if incomplete:
        messages.append(f"containers with incomplete status: {go_string_slice(incomplete)}")
    if messages:
        return Condition(INITIALIZED, "False", CONTAINERS_NOT_INITIALIZED, ", ".join(messages))
    return Condition(INITIALIZED, "True")


def merge_conditions(
    current: Sequence[Mapping[str, Any]],
    desired: Sequence[Condition],
    now: str,
    observed_generation: int | None = None,
) -> list[dict[str, Any]]:
    """The kubelet-owned conditions to write: ``lastTransitionTime`` moves to ``now`` only when a
    condition's status flips (or it is new); reason/message follow the desired value."""
    by_type = {str(c.get("type")): c for c in current}
    out: list[dict[str, Any]] = []
    for cond in desired:
        old = by_type.get(cond.type)
        transition = now
        if old is not None and old.get("status") == cond.status and old.get("lastTransitionTime"):
            transition = str(old["lastTransitionTime"])
        item: dict[str, Any] = {
            "type": cond.type,
            "status": cond.status,
            "lastProbeTime": None,
            "lastTransitionTime": transition,
        }
        if cond.reason:
            item["reason"] = cond.reason
        if cond.message:
            item["message"] = cond.message
        if observed_generation is not None:
            item["observedGeneration"] = observed_generation
        out.append(item)
    return out


def kubelet_conditions_differ(
    current: Sequence[Mapping[str, Any]], written: Sequence[Mapping[str, Any]]
) -> bool:
    """True if writing ``written`` would change any kubelet-owned condition's status, reason,
    message or transition time (so an unchanged view costs no API call)."""
    by_type = {str(c.get("type")): c for c in current}
    keys = ("status", "reason", "message", "lastTransitionTime")
    for cond in written:
        old = by_type.get(str(cond["type"]))
        if old is None:
            return True
        if any((old.get(k) or "") != (cond.get(k) or "") for k in keys):
            return True
    return False
