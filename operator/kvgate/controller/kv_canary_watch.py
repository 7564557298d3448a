"""Follow each verified engine's log for SGLang's KV canary (I/O around kvgate.verify.kv_canary).

With ``safety.kvCanary`` on, one follower per verified engine pod streams
``GET /api/v1/namespaces/<ns>/pods/<pod>/log?container=engine&follow=true&timestamps=true``:

- **one stream per pod**: followers are keyed by pod uid; a pod event never starts a second one;
- **bounded**: lines are cut at kv_canary.MAX_LINE_BYTES, chunks are read 64 KiB at a time and
  parsed before the next read, so nothing accumulates (TCP flow control is the backpressure: a
  slow operator slows the stream, it does not buffer it);
- **resumable**: a dropped stream (API server restart, timeout, kubelet hiccup) reconnects after a
  backoff with ``sinceTime`` = the last line's timestamp; a new operator process reads the log
  from the start, so a violation logged while it was down still trips the gate.

A multi-node engine's worker pods (``component=engine-worker``, node rank 1 and up) run only
SGLang schedulers, and each rank logs its own violations, so every worker is followed too, from
its engine's start (a worker has no gate of its own). Its violation trips the group's leader: the
leader is the pod that controls the worker's StatefulSet (the proof LeaderWorkerSet gives, as in
kvgate.verify.group_gate), and its gate carries the worker pod and its rank. A replaced worker
pod (a new uid) gets a follower of its own.

The first violation turns the pod's ``kvgate.io/engine-verified`` condition False with reason
``KvCanaryViolation`` (so it leaves the Service endpoints and smg drops the worker), posts a
Warning Event on the ModelDeployment, counts ``kvgate_kv_canary_violations_total`` and logs.
The verdict is sticky for the pod's lifetime: the verifier's next Safe verdict cannot turn the
gate True again (``override``), since the pool numbers say nothing about a corrupt cache.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import aiohttp
from pydantic import ValidationError

from kvgate.api import labels, multinode
from kvgate.api.models import API_VERSION, KIND, ModelDeploymentSpec
from kvgate.api.ownership import controller_of
from kvgate.controller.runtime import Runtime, spawn
from kvgate.kube import metrics
from kvgate.verify import gate, kv_canary
from kvgate.verify.kv_canary import CanaryViolation, LineSplitter
from kvgate.verify.lws_identity import statefulset_name

log = logging.getLogger("kvgate.verify.kv_canary")
Pod = dict[str, Any]
CHUNK_BYTES = 64 * 1024
RECONNECT_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)
_sleep = asyncio.sleep  # the reconnect wait (tests record it)

# pod uid -> the first violation seen (sticky until the pod is deleted)
_tripped: dict[str, CanaryViolation] = {}
# pod uid -> its follower task
_followers: dict[str, asyncio.Task[None]] = {}
# worker pod uid -> its latest body (multi-node workers are kopf's events, not rt.pods)
_workers: dict[str, Pod] = {}


def tripped(uid: str) -> CanaryViolation | None:
    return _tripped.get(uid)


def override(pod: Pod, condition: dict[str, str] | None, now: datetime) -> dict[str, str] | None:
    """The condition the verifier may write for this pod: a tripped canary keeps it False."""
    violation = _tripped.get(str(pod.get("metadata", {}).get("uid", "")))
    if violation is None:
        return condition
    return gate.condition_for_unverifiable(pod, kv_canary.REASON, kv_canary.message(violation), now)


def on_check(
    rt: Runtime, pod: Pod, condition: dict[str, str] | None, now: datetime
) -> dict[str, str] | None:
    """The verifier's hook, every pass: make sure a verified pod (and, for a multi-node leader,
    each of its group's workers) is followed, and keep a tripped pod's gate False."""
    on_pod_event(rt, None, pod)
    for worker in _group_workers(pod):
        on_worker_event(rt, None, worker)
    return override(pod, condition, now)


def _group_workers(leader: Pod) -> list[Pod]:
    """The workers seen with the leader's LeaderWorkerSet name and group index (a worker whose
    event came before its ModelDeployment was known is started on its leader's next pass)."""
    meta = leader.get("metadata", {})
    group = meta.get("labels") or {}
    key = (group.get(multinode.LWS_NAME_LABEL), group.get(multinode.GROUP_INDEX_LABEL))
    if key[0] is None or key[1] is None:
        return []
    return [
        w
        for w in list(_workers.values())
        if w.get("metadata", {}).get("namespace") == meta.get("namespace")
        and (
            (w.get("metadata", {}).get("labels") or {}).get(multinode.LWS_NAME_LABEL),
            (w.get("metadata", {}).get("labels") or {}).get(multinode.GROUP_INDEX_LABEL),
        )
        == key
    ]


def _canary_on(rt: Runtime, pod: Pod) -> bool:
    meta = pod.get("metadata", {})
    md = rt.mds.get((meta.get("namespace", ""), meta.get("labels", {}).get(labels.DEPLOYMENT, "")))
    if md is None:
        return False
    try:
        return ModelDeploymentSpec.model_validate(md.get("spec", {})).safety.kv_canary
    except ValidationError:
        return False


def on_pod_event(rt: Runtime, event_type: str | None, pod: Pod) -> None:
    """Start the pod's follower once it is verified (and its MD has safety.kvCanary); stop it
    when the pod is deleted."""
    uid = str(pod.get("metadata", {}).get("uid", ""))
    if not uid:
        return
    if event_type == "DELETED":
        task = _followers.pop(uid, None)
        if task is not None:
            task.cancel()
        _tripped.pop(uid, None)
        return
    running = _followers.get(uid)
    if running is not None and not running.done():
        return
    if uid in _tripped or not gate.is_verified(pod) or not _canary_on(rt, pod):
        return
    _followers[uid] = spawn(follow(rt, uid), name=f"canary-{gate.pod_name(pod)}")


def on_worker_event(rt: Runtime, event_type: str | None, pod: Pod) -> None:
    """A multi-node engine's worker pod: follow its engine's log once the container started (its
    MD has safety.kvCanary); stop when the pod is deleted."""
    meta = pod.get("metadata", {})
    uid = str(meta.get("uid", ""))
    if not uid:
        return
    if event_type == "DELETED":
        _workers.pop(uid, None)
        task = _followers.pop(uid, None)
        if task is not None:
            task.cancel()
        _tripped.pop(uid, None)
        metrics.forget_pod(  # its kvgate_kv_canary_violations_total goes with it
            str(meta.get("namespace", "")),
            (meta.get("labels") or {}).get(labels.DEPLOYMENT, ""),
            gate.pod_name(pod),
            gate.pod_role(pod),
        )
        return
    if (meta.get("labels") or {}).get(labels.MANAGED_BY) != labels.MANAGED_BY_VALUE:
        return
    _workers[uid] = pod
    running = _followers.get(uid)
    if running is not None and not running.done():
        return
    if uid in _tripped or not _engine_started(pod) or not _canary_on(rt, pod):
        return
    _followers[uid] = spawn(follow(rt, uid), name=f"canary-{gate.pod_name(pod)}")


def _engine_started(pod: Pod) -> bool:
    """The engine container has (or had) a log to read."""
    status = gate.engine_container_status(pod) or {}
    state = status.get("state") or {}
    return "running" in state or "terminated" in state or int(status.get("restartCount", 0)) > 0


def log_path(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata", {})
    return f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}/log"


async def follow(rt: Runtime, uid: str) -> None:
    """Stream the pod's engine log until it trips, the pod goes, or the task is cancelled.

    A stream that delivered lines is re-opened after the first back-off step; one that failed
    without a line (an error answer, a refused connection, an instance that had nothing more)
    waits one step longer each time, up to the last, so a pod whose log cannot be read costs one
    request every RECONNECT_SECONDS[-1], not two a second."""
    last_stamp: str | None = None
    attempt = 0
    while (pod := rt.pods.get(uid) or _workers.get(uid)) is not None and uid not in _tripped:
        params = {"container": gate.ENGINE_CONTAINER, "follow": "true", "timestamps": "true"}
        since = kv_canary.resume_from(last_stamp)
        if since is not None:
            params["sinceTime"] = since
        progressed = False
        try:
            stream = await _read_stream(rt, pod, params, last_stamp)
            last_stamp, found, progressed = stream.last_stamp, stream.violation, stream.lines > 0
            if found is not None:
                await (trip_group(rt, pod, found) if uid in _workers else trip(rt, pod, found))
                return
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.debug("log stream of %s dropped: %s", gate.pod_name(pod), exc)
        if progressed:
            attempt = 0
        delay = RECONNECT_SECONDS[min(attempt, len(RECONNECT_SECONDS) - 1)]
        attempt += 1
        await _sleep(delay)


@dataclass(frozen=True)
class _Stream:
    last_stamp: str | None  # the last timestamp read
    violation: CanaryViolation | None  # the first violation, if any
    lines: int  # lines read


async def _read_stream(
    rt: Runtime, pod: Pod, params: dict[str, str], last_stamp: str | None
) -> _Stream:
    """One pods/log stream, until it ends or shows a violation."""
    api = rt.api
    headers = {"Accept": "*/*"}
    token = api.credentials.bearer()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    splitter = LineSplitter()
    session = api._session_now()  # the operator's one client session (TLS, pool)
    lines = 0
    async with session.get(
        api.credentials.server + log_path(pod),
        params=params,
        headers=headers,
        # No total deadline (the stream is long-lived); a silent connection is re-opened.
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300),
    ) as response:
        if response.status != 200:
            log.debug("pods/log of %s answered HTTP %s", gate.pod_name(pod), response.status)
            return _Stream(last_stamp, None, 0)
        async for chunk in response.content.iter_chunked(CHUNK_BYTES):
            for line in splitter.feed(chunk):
                lines += 1
                stamp, _ = kv_canary.split_timestamp(line)
                last_stamp = stamp or last_stamp
                violation = kv_canary.parse_line(line)
                if violation is not None:
                    return _Stream(last_stamp, violation, lines)
    return _Stream(last_stamp, None, lines)


async def trip(rt: Runtime, pod: Pod, violation: CanaryViolation) -> None:
    """Gate False (KvCanaryViolation), Event, metric, log: once per pod."""
    meta = pod.get("metadata", {})
    uid = str(meta.get("uid", ""))
    if uid in _tripped:
        return
    _tripped[uid] = violation
    metrics.KV_CANARY_VIOLATIONS.labels(
        meta.get("namespace", ""),
        meta.get("labels", {}).get(labels.DEPLOYMENT, ""),
        gate.pod_name(pod),
        gate.pod_role(pod),
    ).inc()
    await _report(rt, pod, violation)


async def _report(rt: Runtime, pod: Pod, violation: CanaryViolation) -> None:
    """The tripped pod's gate False, the log line, the Warning Event, and a wake of its MD."""
    meta = pod.get("metadata", {})
    seen = time.monotonic()
    namespace, md_name = (
        meta.get("namespace", ""),
        meta.get("labels", {}).get(labels.DEPLOYMENT, ""),
    )
    condition = override(pod, None, rt.clock())
    if condition is not None:
        await rt.api.patch_pod_condition(
            namespace, meta.get("name", ""), str(meta.get("uid", "")), condition
        )
    text = f"{gate.pod_role(pod)} pod {gate.pod_name(pod)}: {kv_canary.message(violation)}"
    log.warning(
        "KV canary violation: %s (gate False %.3f s after the line was read)",
        text,
        time.monotonic() - seen,
        extra={"namespace": namespace, "deployment": md_name, "pod": gate.pod_name(pod)},
    )
    md = rt.mds.get((namespace, md_name)) or {}
    ref = {"apiVersion": API_VERSION, "kind": KIND, "metadata": md.get("metadata", {})}
    try:
        await rt.api.post_event(
            ref, type_="Warning", reason=kv_canary.REASON, message=text, now=rt.clock()
        )
    except Exception as exc:  # best effort: the gate is what protects traffic
        log.warning("could not post event %s: %s", kv_canary.REASON, exc)
    rt.wake_md(namespace, md_name)


async def trip_group(rt: Runtime, worker: Pod, violation: CanaryViolation) -> None:
    """A worker rank's violation: its group leader's gate False (KvCanaryViolation, naming the
    worker and its rank), Event, metric (on the worker's series), log: once per worker."""
    meta = worker.get("metadata", {})
    uid, namespace = str(meta.get("uid", "")), str(meta.get("namespace", ""))
    if uid in _tripped:
        return
    _tripped[uid] = violation
    leader_uid = await _leader_uid(rt, worker)
    leader = rt.pods.get(leader_uid) if leader_uid else None
    metrics.KV_CANARY_VIOLATIONS.labels(
        namespace,
        (meta.get("labels") or {}).get(labels.DEPLOYMENT, ""),
        gate.pod_name(worker),
        gate.pod_role(worker),
    ).inc()
    if leader_uid is None:
        log.warning(
            "KV canary violation on %s, whose group leader cannot be proven (its controller is "
            "not a StatefulSet controlled by a pod): %s",
            gate.pod_name(worker),
            kv_canary.message(violation),
        )
        return
    node_rank = str((meta.get("labels") or {}).get(multinode.WORKER_INDEX_LABEL, "?"))
    leader_name = gate.pod_name(leader) if leader is not None else "(not seen yet)"
    found = replace(
        violation, worker_pod=gate.pod_name(worker), node_rank=node_rank, leader_pod=leader_name
    )
    if leader_uid in _tripped:
        return  # the group is already out (an Event on transitions only)
    _tripped[leader_uid] = found  # kept False by ``override`` once the leader is seen
    if leader is not None:
        await _report(rt, leader, found)
        rt.pod_wake(leader_uid).set()


async def _leader_uid(rt: Runtime, worker: Pod) -> str | None:
    """The uid of the pod that controls the worker's StatefulSet (LeaderWorkerSet's group
    leader), read from the API server; None when the chain does not hold."""
    ref = controller_of(worker)
    name = statefulset_name(worker)
    if ref is None or name is None:
        return None
    namespace = str(worker.get("metadata", {}).get("namespace", ""))
    statefulset = await rt.api.get("StatefulSet", namespace, name)
    if statefulset is None or statefulset.get("metadata", {}).get("uid") != ref.get("uid"):
        return None
    owner = controller_of(statefulset)
    if owner is None or owner.get("kind") != "Pod" or not owner.get("uid"):
        return None
    return str(owner["uid"])
