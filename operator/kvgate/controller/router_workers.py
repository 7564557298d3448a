"""Keep every router's worker set to the engine pods kvgate verified (I/O around worker_audit).

Each ModelDeployment's loop runs ``audit_loop`` beside its reconciler: every
``KVGATE_WORKER_AUDIT_SECONDS`` it reads ``GET /workers`` (with the router's control-plane key)
from each router pod whose controller chain proves it is the ModelDeployment's, and removes with
``DELETE /workers/{id}`` every worker that is not a verified engine pod of that router's revision:
an Event ``UnknownWorkerRemoved`` on the ModelDeployment, a log line and the counter
``kvgate_router_unknown_workers_removed_total`` say so. Router pods come from a watch (label
``kvgate.io/component=router``), so a new router is audited without waiting for a reconcile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvgate.api import labels
from kvgate.api.models import API_VERSION, KIND
from kvgate.controller.gateway_watch import UNREADABLE, read_workers, router_url
from kvgate.controller.identity import resolve_identity
from kvgate.controller.runtime import MdKey, Runtime
from kvgate.kube import metrics
from kvgate.objects import builders, router_auth
from kvgate.verify import gate, pod_identity, pod_view, worker_audit
from kvgate.verify.pod_identity import EngineIdentity
from kvgate.verify.worker_audit import KnownEngine

log = logging.getLogger("kvgate.router_workers")
Pod = dict[str, Any]
REMOVED = "UnknownWorkerRemoved"
KEY_REFUSED = "RouterKeyRefused"
DELETE_TIMEOUT_SECONDS = 2.0


@dataclass
class AuditMemory:
    """This module's state for one operator run (``Runtime.owned``), per router pod uid."""

    # the ids of the workers its last audit found unknown (removed when the next audit finds
    # them unknown again: see audit_md)
    suspects: dict[str, set[str]] = field(default_factory=dict)
    # the router pods that refused kvgate's control-plane key at their last audit
    key_refusals: set[str] = field(default_factory=set)

    def forget_router(self, uid: str) -> None:
        self.suspects.pop(uid, None)
        self.key_refusals.discard(uid)


def on_router_pod_event(rt: Runtime, event_type: str | None, pod: Pod) -> None:
    meta = pod.get("metadata", {})
    uid = meta.get("uid")
    if not uid:
        return
    if event_type == "DELETED":
        rt.routers.pop(uid, None)
        rt.identities.pop(uid, None)
        rt.owned(AuditMemory).forget_router(uid)
    else:
        rt.routers[uid] = pod_view.slim(pod)  # the fields kvgate reads (kvgate.verify.pod_view)
    rt.wake_md(meta.get("namespace"), meta.get("labels", {}).get(labels.DEPLOYMENT))


def known_engines(rt: Runtime, namespace: str, md_name: str, revision: str) -> list[KnownEngine]:
    """Verified engine pods of one revision, proven by their controller chain."""
    out = []
    for uid, pod in rt.pods.of_md(namespace, md_name):
        cached = rt.identities.get(uid)
        identity = cached[1] if cached else None
        if (
            not isinstance(identity, EngineIdentity)
            or pod.get("metadata", {}).get("namespace") != namespace
            or identity.md_name != md_name
            or identity.revision != revision
            or not gate.is_verified(pod)
            or pod.get("metadata", {}).get("deletionTimestamp")
        ):
            continue
        ip, port = pod.get("status", {}).get("podIP"), gate.engine_port(pod)
        if ip and port is not None:
            out.append(KnownEngine(uid, str(ip), port, identity.role))
    return out


async def _remove(base_url: str, worker_id: str, key: str) -> int | str:
    """DELETE one worker; the HTTP status, or why it could not be sent."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=DELETE_TIMEOUT_SECONDS)) as s,
            s.delete(
                f"{base_url}/workers/{worker_id}",
                headers=router_auth.bearer(key),
                allow_redirects=False,
            ) as response,
        ):
            return response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return type(exc).__name__


async def audit_md(rt: Runtime, namespace: str, md_name: str) -> int:
    """One audit of every router of one ModelDeployment; the number of workers removed."""
    md = rt.mds.get((namespace, md_name))
    key = rt.router_key(namespace, md_name)
    if md is None or key is None:
        log.debug("worker audit of %s/%s: ModelDeployment not known yet", namespace, md_name)
        return 0
    md_uid = md.get("metadata", {}).get("uid")
    removed = 0
    routers = [p for _, p in rt.routers.of_md(namespace, md_name)]
    for router in routers:
        url = router_url(router)
        if url is None:
            continue
        identity = await resolve_identity(rt, router, md_uid, pod_identity.ROUTER_ROLES)
        if not isinstance(identity, EngineIdentity):
            log.debug("worker audit skips %s: %s", gate.pod_name(router), identity.message)
            continue  # not kvgate's router: never send it the key
        name = gate.pod_name(router)
        await rt.audit_pacer().turn()  # the fleet's audit reads, paced (settings)
        answer = await read_workers(name, url, headers=router_auth.bearer(key))
        router_uid = str(router.get("metadata", {}).get("uid", ""))
        if answer.refused:
            await _refused_key(rt, md, router, key, identity.revision)
            continue
        rt.owned(AuditMemory).key_refusals.discard(router_uid)
        if answer.workers is None:
            log.debug("worker audit could not read %s: %s", name, answer.error)
            continue
        engines = known_engines(rt, namespace, md_name, identity.revision)
        log.debug(
            "worker audit of %s: %d workers, %d verified engines",
            name,
            len(answer.workers),
            len(engines),
        )
        unknown = worker_audit.unknown_workers(answer.workers, engines)
        # Removed only when the audit before found it unknown too: a leader that just took over
        # may audit before its pod watch has listed (and its verifiers identified) the verified
        # engines a router serves, and removing those would leave the revision without workers
        # (an injected worker goes one audit later). A URL in no form discovery writes cannot
        # be such an engine: it goes at once.
        suspects = rt.owned(AuditMemory).suspects
        previous = suspects.pop(router_uid, set())
        now_unknown = {str(w.get("id")) for w in unknown}
        if now_unknown:
            suspects[router_uid] = now_unknown
        for worker in unknown:
            if str(worker.get("id")) in previous or not worker_audit.in_discovery_form(worker):
                removed += await _remove_one(rt, md, router, url, worker, key, identity.revision)
    return removed


async def _refused_key(
    rt: Runtime, md: Mapping[str, Any], router: Pod, key: str, revision: str
) -> None:
    """A router refused kvgate's control-plane key: wake the pass (it restores kvgate's Secret,
    or reports whose it is and scales the routers to 0), and after a second refusal in a row
    delete the pod so it restarts on the Secret as it is then (worker_audit.key_refusal)."""
    meta, router_meta = md.get("metadata", {}), router.get("metadata", {})
    namespace, md_name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    uid, name = str(router_meta.get("uid", "")), gate.pod_name(router)
    refusals = rt.owned(AuditMemory).key_refusals
    refused_before = uid in refusals
    refusals.add(uid)
    fields = {"namespace": namespace, "deployment": md_name, "pod": name}
    action = worker_audit.key_refusal(
        refused_before=refused_before,
        pod_fingerprint=(router_meta.get("annotations") or {}).get(labels.ROUTER_KEY_FINGERPRINT),
        fingerprint=router_auth.key_fingerprint(key),
    )
    if action is worker_audit.KeyRefusal.OLDER_KEY:
        log.debug("router %s of an older key refuses the current one", name, extra=fields)
        return
    rt.wake_md(namespace, md_name)
    if action is worker_audit.KeyRefusal.WAIT:
        log.warning("router refuses kvgate's control-plane key", extra=fields)
        return
    secret = builders.router_control_secret_name(md_name)
    message = (
        f"router pod {name} (revision {revision}) refuses kvgate's control-plane key (HTTP 401 "
        f"on GET /workers): it started with a key from Secret {secret} that "
        "kvgate did not write, so whoever wrote it can add workers kvgate never verified, and "
        "kvgate cannot remove them. Deleted the pod; its replacement reads the Secret again. "
        "Only the kvgate operator may write that Secret: if the ModelDeployment reports it as "
        "not kvgate's, delete it and kvgate recreates it"
    )
    if not await rt.api.delete_pod(namespace, name, uid):
        return  # gone already or replaced
    refusals.discard(uid)
    metrics.ROUTER_PODS_REPLACED.labels(namespace, md_name).inc()
    log.warning("router replaced: %s", message, extra=fields)
    await _warn(rt, meta, KEY_REFUSED, message)


async def _remove_one(
    rt: Runtime,
    md: Mapping[str, Any],
    router: Pod,
    url: str,
    worker: Mapping[str, Any],
    key: str,
    revision: str,
) -> int:
    meta = md.get("metadata", {})
    namespace, md_name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    worker_id = worker.get("id")
    what = worker_audit.describe(worker)
    fields = {"namespace": namespace, "deployment": md_name, "pod": gate.pod_name(router)}
    if not isinstance(worker_id, str) or worker_id == UNREADABLE:
        log.warning(
            "router lists unknown %s without a usable id; cannot remove it", what, extra=fields
        )
        return 0
    status = await _remove(url, worker_id, key)
    if status not in (200, 202, 204, 404):
        log.warning("could not remove unknown %s: %s", what, status, extra=fields)
        return 0
    worker_type = str(worker.get("worker_type") or "unknown")
    metrics.ROUTER_UNKNOWN_WORKERS_REMOVED.labels(namespace, md_name, worker_type).inc()
    form = (
        ""
        if worker_audit.in_discovery_form(worker)
        else " (its URL is not http://<pod IP>:<port> as smg's discovery writes it, so kvgate "
        "and smg could read it as two different hosts)"
    )
    message = (
        f"router pod {gate.pod_name(router)} listed {what}, which is not a verified engine pod "
        f"of revision {revision}{form}; removed it (DELETE /workers/{worker_id}). Workers are "
        "added only by smg's discovery of verified pods; check who holds the router's "
        f"control-plane key (Secret {builders.router_control_secret_name(md_name)})"
    )
    log.warning("unknown worker removed: %s", message, extra=fields)
    await _warn(rt, meta, REMOVED, message)
    return 1


async def _warn(rt: Runtime, md_meta: Mapping[str, Any], reason: str, message: str) -> None:
    """A Warning Event on the ModelDeployment; best effort (the action it reports is what
    protects traffic)."""
    ref = {"apiVersion": API_VERSION, "kind": KIND, "metadata": md_meta}
    try:
        await rt.api.post_event(
            ref, type_="Warning", reason=reason, message=message, now=rt.clock()
        )
    except Exception as exc:
        log.warning("could not post event %s: %s", reason, exc)


async def audit_loop(rt: Runtime, key: MdKey, stopped: Callable[[], bool]) -> None:
    """Audit one ModelDeployment's routers every KVGATE_WORKER_AUDIT_SECONDS until stopped."""
    while not stopped():
        try:
            await audit_md(rt, *key)
        except Exception as exc:  # the loop must go on
            log.warning(
                "worker audit failed: %s", exc, extra={"namespace": key[0], "deployment": key[1]}
            )
        await asyncio.sleep(rt.settings.worker_audit_seconds)
