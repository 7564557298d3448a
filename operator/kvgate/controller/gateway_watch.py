"""Delete an engine pod that a gateway keeps routing to after its verification gate turned False.

Driven by the pod's verifier loop (engine_pods.run_verifier): each pass calls
``GatewayWatch.step(pod)``, which returns how long until it wants to look again. While the pod's
gate is False and the pod is not being deleted, once the grace period is over it reads
``GET /workers`` from every router pod of the pod's revision (at most every ``check_seconds``) and
lets ``kvgate.verify.gateway.decide`` say keep or delete. The loop (and so this watch) ends with
the pod.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import aiohttp
from kvgate_engine.untrusted import BodyLimits, FetchError, MiB, Unauthorized, get_json

from kvgate.api import labels
from kvgate.api.timestamps import parse_rfc3339
from kvgate.controller.runtime import Runtime
from kvgate.kube import metrics
from kvgate.objects import router_auth
from kvgate.verify import gate
from kvgate.verify.gateway import (
    DEFAULT_GRACE_SECONDS,
    GATEWAY_UNREACHABLE,
    POD_UID_LABEL,
    Action,
    EnginePod,
    GatewayDecision,
    RouterWorkers,
    decide,
)

log = logging.getLogger("kvgate.verify.gateway")

DEFAULT_CHECK_SECONDS = 3.0
DEFAULT_READ_TIMEOUT_SECONDS = 2.0
ROUTER_CONTAINER = "router"
Pod = dict[str, Any]


# smg 1.13 lists a worker in ~0.8 KB (measured: 940 bytes for a router with one worker, labels
# included); 4 MiB holds ~5,000 workers, far more than one revision's engine pods.
WORKERS_LIMITS = BodyLimits.for_bytes(4 * MiB)
# The worker fields kvgate.verify.gateway reads, kept only as short printable text (they are quoted
# in
# Events); anything else becomes UNREADABLE, which matches no pod and routes like an unknown status.
UNREADABLE = "(unreadable)"
_URL = re.compile(r"[\x21-\x7e]{1,256}")
_STATUS = re.compile(r"[A-Za-z_-]{1,32}")
_UID = re.compile(r"[A-Za-z0-9-]{1,64}")
_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _text(value: object, pattern: re.Pattern[str]) -> object:
    if not value:
        return None  # absent, "" or null: as the router said nothing
    return value if isinstance(value, str) and pattern.fullmatch(value) else UNREADABLE


def _worker_fields(worker: Mapping[str, Any]) -> dict[str, Any]:
    kept: dict[str, Any] = {"url": _text(worker.get("url"), _URL)}
    kept["status"] = _text(worker.get("status"), _STATUS)
    kept["id"] = _text(worker.get("id"), _ID)
    kept["worker_type"] = _text(worker.get("worker_type"), _STATUS)
    worker_labels = worker.get("labels")
    if isinstance(worker_labels, Mapping) and worker_labels.get(POD_UID_LABEL):
        kept["labels"] = {POD_UID_LABEL: _text(worker_labels[POD_UID_LABEL], _UID)}
    return kept


def _workers_of(doc: object) -> object:
    """The listed workers, reduced to what kvgate.verify.gateway reads; None without a workers
    list."""
    workers = doc.get("workers") if isinstance(doc, Mapping) else None
    if not isinstance(workers, list):
        return None
    return tuple(_worker_fields(w) for w in workers if isinstance(w, Mapping))


async def read_workers(
    router: str,
    base_url: str,
    *,
    timeout: float = DEFAULT_READ_TIMEOUT_SECONDS,
    headers: Mapping[str, str] | None = None,
) -> RouterWorkers:
    """``GET <base_url>/workers`` of one smg router; never raises.

    Read like an engine (kvgate_engine.untrusted): no redirects, a 4 MiB body and value cap, one
    deadline; an error names what failed, never what the router sent.
    """
    url = f"{base_url}/workers"
    try:
        async with aiohttp.ClientSession() as session:
            workers = await get_json(
                session,
                url,
                timeout=timeout,
                limits=WORKERS_LIMITS,
                headers=headers,
                project=_workers_of,
            )
    except Unauthorized as exc:
        return RouterWorkers(router, error=str(exc), refused=True)
    except FetchError as exc:
        return RouterWorkers(router, error=str(exc))
    if not isinstance(workers, tuple):
        return RouterWorkers(router, error=f"GET {url} answered without a workers list")
    return RouterWorkers(router, workers=workers)


def engine_pod_of(pod: Pod) -> EnginePod | None:
    meta, ip, port = (
        pod.get("metadata", {}),
        pod.get("status", {}).get("podIP"),
        gate.engine_port(pod),
    )
    if not ip or port is None or not meta.get("uid"):
        return None
    return EnginePod(gate.pod_name(pod), str(meta["uid"]), str(ip), port, gate.pod_role(pod))


def gate_false_since(pod: Pod) -> datetime | None:
    """When the engine-verified condition turned False, if it is False now."""
    cond = gate.current_condition(pod)
    if cond is None or cond.get("status") != "False":
        return None
    return parse_rfc3339(cond.get("lastTransitionTime"))


def router_url(router_pod: Pod) -> str | None:
    """``http://podIP:port`` of a live router pod (port named http of its router container)."""
    ip = router_pod.get("status", {}).get("podIP")
    if not ip or router_pod.get("metadata", {}).get("deletionTimestamp"):
        return None
    for container in router_pod.get("spec", {}).get("containers", []):
        if container.get("name") == ROUTER_CONTAINER:
            for port in container.get("ports", []):
                if port.get("name") == "http":
                    host = f"[{ip}]" if ":" in ip else ip
                    return f"http://{host}:{int(port['containerPort'])}"
    return None


class GatewayWatch:
    """Per engine pod: keep asking its revision's routers whether they still route to it."""

    def __init__(
        self,
        rt: Runtime,
        *,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        check_seconds: float = DEFAULT_CHECK_SECONDS,
        read_timeout: float = DEFAULT_READ_TIMEOUT_SECONDS,
    ) -> None:
        self.rt, self.grace_seconds, self.check_seconds = rt, grace_seconds, check_seconds
        self.read_timeout = read_timeout
        self.next_check = float("-inf")  # time.monotonic()
        self.deleted = False
        self.last_decision: GatewayDecision | None = None

    async def step(self, pod: Pod) -> float:
        """Check the pod if it is due; seconds until the next check (inf: nothing to watch)."""
        since = gate_false_since(pod)
        target = engine_pod_of(pod)
        if (
            self.deleted
            or since is None
            or target is None
            or pod.get("metadata", {}).get("deletionTimestamp")
        ):
            return math.inf
        grace_left = self.grace_seconds - (self.rt.clock() - since).total_seconds()
        if grace_left > 0:
            return grace_left
        wait = self.next_check - time.monotonic()
        if wait > 0:
            return wait
        self.next_check = time.monotonic() + self.check_seconds
        try:
            routers = await self._read_routers(pod)
            decision = decide(
                target,
                gate_false_since=since,
                now=self.rt.clock(),
                routers=routers,
                grace_seconds=self.grace_seconds,
            )
            await self._act(pod, decision)
        except Exception as exc:  # the verifier loop must go on
            log.warning("gateway check of pod %s failed: %s", target.name, exc)
        return math.inf if self.deleted else self.check_seconds

    async def _read_routers(self, pod: Pod) -> list[RouterWorkers]:
        meta = pod.get("metadata", {})
        pod_labels = meta.get("labels", {})
        selector = {
            labels.DEPLOYMENT: pod_labels.get(labels.DEPLOYMENT, ""),
            labels.REVISION: pod_labels.get(labels.REVISION, ""),
            labels.COMPONENT: labels.COMPONENT_ROUTER,
        }
        namespace = meta.get("namespace", "")
        listed = await self.rt.api.list("Pod", namespace, selector)
        key = self.rt.router_key(namespace, selector[labels.DEPLOYMENT])
        headers = router_auth.bearer(key) if key else None
        reads = []
        for router_pod in listed:
            router_labels = router_pod.get("metadata", {}).get("labels", {})
            if any(router_labels.get(k) != v for k, v in selector.items()):
                continue  # the API server filters; a stale or odd answer must not widen it
            url = router_url(router_pod)
            name = gate.pod_name(router_pod)
            if url is None:
                continue  # no IP yet or terminating: it routes nothing
            reads.append(read_workers(name, url, timeout=self.read_timeout, headers=headers))
        return list(await asyncio.gather(*reads))

    async def _act(self, pod: Pod, decision: GatewayDecision) -> None:
        previous, self.last_decision = self.last_decision, decision
        meta = pod["metadata"]
        namespace, name, uid = meta.get("namespace", ""), meta["name"], meta["uid"]
        md_name = meta.get("labels", {}).get(labels.DEPLOYMENT, "")
        fields = {"namespace": namespace, "deployment": md_name, "pod": name}
        if decision.action is Action.KEEP:
            if decision.reason == GATEWAY_UNREACHABLE and (
                previous is None or previous.reason != decision.reason
            ):
                log.warning("gateway unreadable: %s", decision.message, extra=fields)
            return
        log.warning("gateway ignored NotReady: %s", decision.message, extra=fields)
        if not await self.rt.api.delete_pod(namespace, name, uid):
            self.deleted = True  # gone already or replaced: nothing left to protect
            return
        self.deleted = True
        metrics.GATEWAY_FORCED_DELETIONS.labels(namespace, md_name, gate.pod_role(pod)).inc()
        pod_ref = {"apiVersion": "v1", "kind": "Pod", "metadata": meta}
        md_ref = self.rt.md_ref(namespace, md_name)
        for ref in (pod_ref, md_ref):
            try:
                await self.rt.api.post_event(
                    ref,
                    type_="Warning",
                    reason=decision.reason,
                    message=decision.message,
                    now=self.rt.clock(),
                )
            except Exception as exc:  # best effort; the deletion is what protects traffic
                log.warning("could not post event %s: %s", decision.reason, exc)
