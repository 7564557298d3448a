"""The ``pods/status`` patch the loopback kubelet writes for one pod (pure): phase, the
kubelet-owned conditions, IPs and container statuses. Readiness-gate conditions are read from the
pod, never written."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from kvgate_e2e.kubelet.readiness import (
    INITIALIZED,
    POD_READY_TO_START_CONTAINERS,
    Condition,
    containers_ready_condition,
    initialized_condition,
    merge_conditions,
    pod_ready_condition,
)
from kvgate_e2e.kubelet.status import ContainerRecord, container_status, pod_phase


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pod_status_patch(
    pod: Mapping[str, Any],
    *,
    records: Sequence[ContainerRecord],
    init_records: Sequence[ContainerRecord],
    sidecars: Sequence[ContainerRecord],
    initialized: bool,
    pod_ip: str | None,
    host_ip: str,
    start_time: str | None,
    now: str,
) -> dict[str, Any]:
    """The strategic-merge patch for ``pods/status``: kubelet-owned fields only.

    ``pod_ip`` is None until the pod's sandbox (its address) exists; a hostNetwork pod has the
    node's. ``sidecars``: the records of the restartable init containers, in spec order."""
    spec = pod["spec"]
    policy = spec.get("restartPolicy", "Always")
    phase = pod_phase(policy, list(records), initialized=initialized, sidecars=list(sidecars))
    # Init containers' statuses first, then the regular ones (generateAPIPodStatus).
    init_statuses = [container_status(r) for r in init_records]
    statuses = [container_status(r) for r in records]
    everything = init_statuses + statuses
    current = (pod.get("status") or {}).get("conditions") or []
    wanted = [
        Condition(POD_READY_TO_START_CONTAINERS, "True" if pod_ip is not None else "False"),
        initialized_condition(spec, everything, phase)
        if init_records
        else Condition(INITIALIZED, "True"),
        containers_ready_condition(spec, everything, phase),
        pod_ready_condition(spec, list(current), everything, phase),
    ]
    generation = pod["metadata"].get("generation")
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": merge_conditions(current, wanted, now, generation),
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "containerStatuses": statuses,
    }
    if generation is not None:
        status["observedGeneration"] = generation
    if start_time:
        status["startTime"] = start_time
    if pod_ip is not None:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    if init_records:
        status["initContainerStatuses"] = init_statuses
    return {"metadata": {"uid": pod["metadata"]["uid"]}, "status": status}
