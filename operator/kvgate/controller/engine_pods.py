"""Engine pods: verify each live engine and keep its readiness gate condition true to it.

One verifier loop per engine pod: an asyncio task started on the pod's first watch event and
cancelled on its deletion. (Not a kopf daemon: kopf puts a finalizer on every object with a
daemon, and engine pods must never wait for the operator to be deleted.) It probes when the
pod has an IP and a ready engine container, at once after a container restart or readiness
change, and every reverify interval; those periodic re-reads of unchanged engines take turns
within the fleet's budget (KVGATE_REVERIFY_READS_PER_SECOND), a read after a change never
waits for it. A verified pod whose engine stops being ready or fails
re-verification gets its gate condition set False at once: it leaves the Service endpoints and
smg drops the worker.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from kvgate_engine.verdict import ENGINE_UNAUTHORIZED, Outcome, Requirement, Verdict
from pydantic import ValidationError

from kvgate.api import labels, requirements
from kvgate.api.models import ModelDeploymentSpec, RolloutSpec
from kvgate.api.revision import revision_of
from kvgate.controller import group_verify, kv_canary_watch
from kvgate.controller.gateway_watch import GatewayWatch
from kvgate.controller.identity import resolve_identity
from kvgate.controller.runtime import (
    Runtime,
    VerifiedEngine,
    sleep_until_woken,
    spawn,
    stray_cancellation,
)
from kvgate.kube import metrics, probe_slots
from kvgate.kube.informer import Watched
from kvgate.verify import gate, pod_view
from kvgate.verify.pod_identity import Unproven

log = logging.getLogger("kvgate.engine_pods")

DEFAULT_REVERIFY_SECONDS = 30.0
DEFAULT_VERIFY_TIMEOUT_SECONDS = RolloutSpec.model_fields["verify_timeout_seconds"].default
REVERIFY_JITTER = 0.2  # a periodic re-verify comes 0-20 % before its interval (never after)
Pod = dict[str, Any]
Fingerprint = tuple[str | None, bool, int, bool, int, str | None]


def fingerprint(pod: Pod) -> Fingerprint:
    """What, when it changes, calls for an immediate re-check: IP, readiness, restarts, a
    scale-down's drain (and, for a multi-node engine's leader, any change of its group's
    workers)."""
    status = gate.engine_container_status(pod) or {}
    return (
        pod.get("status", {}).get("podIP"),
        bool(status.get("ready")),
        int(status.get("restartCount", 0)),
        bool(pod.get("metadata", {}).get("deletionTimestamp")),
        group_verify.worker_events(str(pod.get("metadata", {}).get("uid", ""))),
        gate.draining_since(pod),
    )


def _md_of(pod: Pod) -> tuple[str, str]:
    meta = pod.get("metadata", {})
    return meta.get("namespace", ""), meta.get("labels", {}).get(labels.DEPLOYMENT, "")


def on_pod_event(rt: Runtime, event_type: str | None, body: Pod) -> None:
    """Watch event on an engine pod: keep its latest body (the fields kvgate reads:
    kvgate.verify.pod_view), wake its verifier and its MD."""
    pod = pod_view.slim(body)
    uid = pod.get("metadata", {}).get("uid")
    if not uid:
        return
    if not rt.leading:  # a standby keeps its store current, and does nothing else
        if event_type == "DELETED":
            rt.pods.pop(uid, None)
        else:
            rt.pods[uid] = pod
        return
    previous = rt.pods.get(uid)
    if event_type != "DELETED" and previous is not None and older(pod, previous):
        return  # the answer to kvgate's own write got here first (on_own_write)
    namespace, md_name = _md_of(pod)
    kv_canary_watch.on_pod_event(rt, event_type, pod)  # safety.kvCanary: follow its log
    if event_type == "DELETED":
        metrics.forget_pod(*_series(pod))
        rt.forget_pod(uid)
        group_verify.forget(uid)
        rt.wake_md(namespace, md_name)
        return
    rt.pods[uid] = pod
    _track(rt, pod, first=previous is None)
    task = rt.verifiers.get(uid)
    if task is None or task.done():
        rt.verifiers[uid] = spawn(
            run_verifier(rt, uid, lambda: False), name=f"verify-{gate.pod_name(pod)}"
        )
    if previous is None or fingerprint(previous) != fingerprint(pod):
        rt.pod_wake(uid).set()
    if (
        previous is None
        or gate.current_condition(previous) != gate.current_condition(pod)
        or (fingerprint(previous) != fingerprint(pod))
    ):
        rt.wake_md(namespace, md_name)


def _resource_version(pod: Pod) -> int | None:
    try:
        return int(pod.get("metadata", {}).get("resourceVersion"))
    except (TypeError, ValueError):
        return None


def older(pod: Pod, than: Pod) -> bool:
    """Whether ``pod`` is an earlier version of ``than`` (resourceVersions compared as integers,
    as client-go's integer mutation cache does; never, when either is not an integer)."""
    mine, theirs = _resource_version(pod), _resource_version(than)
    return mine is not None and theirs is not None and mine < theirs


def on_own_write(rt: Runtime, body: Pod) -> None:
    """The API server's answer to kvgate's own write of an engine pod, taken as its watch event:
    the next pass reads what kvgate wrote even when it runs before the watch delivers it
    (otherwise a pass between a ``drained`` mark and its watch event reads the pod unmarked and
    posts its EngineDrained again). The watch's event of the same version changes nothing; an
    older one it still delivers is ignored (on_pod_event). Only a pod the watch already
    delivered: the store holds engine pods only."""
    uid = (body.get("metadata") or {}).get("uid")
    if rt.leading and uid in rt.pods:
        on_pod_event(rt, "MODIFIED", body)


def take_over(rt: Runtime) -> None:
    """This replica starts leading with the engine pods its standby store holds: each gets its
    verifier, as on a first watch event, except that an engine whose pod shows it proved itself
    since it last started (its gate True since the engine container's start, and the pool it
    proved in the gate's message) is not read again at first sight: the verifier starts from
    that proof (``rt.engines``, what a pass reports) and re-reads it when its periodic turn
    comes, spread over one re-verify interval. Every other engine (restarted, refused, never
    verified, changed) is read at once, and its verifier starts first."""
    proofs: dict[str, Fingerprint] = {}
    for uid, pod in rt.pods.items():
        pool = gate.proven_pool_tokens(pod)
        if (
            pool is not None
            and gate.verified_since_engine_start(pod)
            and not pod.get("metadata", {}).get("deletionTimestamp")
        ):
            proofs[uid] = fingerprint(pod)
            cond = gate.current_condition(pod) or {}
            rt.engines[uid] = VerifiedEngine(Outcome.SAFE.value, str(cond.get("reason")), pool)
    for uid in sorted(rt.pods, key=lambda uid: uid in proofs):  # the changed ones first
        pod = rt.pods[uid]
        kv_canary_watch.on_pod_event(rt, None, pod)
        _track(rt, pod, first=True)
        proof = proofs.get(uid)
        rt.verifiers[uid] = spawn(
            run_verifier(rt, uid, lambda: False, proven=proof),
            name=f"verify-{gate.pod_name(pod)}",
        )
    log.info(
        "took over %d engine pods: %d re-read now, %d from their last proof",
        len(rt.pods),
        len(rt.pods) - len(proofs),
        len(proofs),
    )


ENGINE_SELECTOR = f"{labels.COMPONENT}={labels.COMPONENT_ENGINE}"


ENGINE_PODS = Watched("Pod", "v1", "/api/v1/pods", ENGINE_SELECTOR)


def start_reflectors(rt: Runtime) -> None:
    """Start the operator's list-then-watch of engine pods (kvgate.kube.informer): one per watched
    namespace, or one cluster-wide. Each listed or watched pod goes to ``on_pod_event``; a
    stored pod that a complete list no longer holds is deleted."""
    rt.reflect(
        ENGINE_PODS,
        store=rt.pods,
        on_event=lambda event_type, body: on_pod_event(rt, event_type, body),
        into=rt.pod_reflectors,
    )


def _series(pod: Pod) -> tuple[str, str, str, str]:
    """The labels of the pod's series: namespace, deployment, pod, role."""
    namespace, md_name = _md_of(pod)
    return namespace, md_name, gate.pod_name(pod), gate.pod_role(pod)


def _track(rt: Runtime, pod: Pod, *, first: bool) -> None:
    """The series KvgateVerificationStale reads: whether the pod serves (its Ready condition,
    from the watch, so a stuck verifier cannot hide it) and, on first sight, a start for its
    last-verified age (the verification it came with is at least that old) and its interval."""
    series = _series(pod)
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions", None) or []
    )
    metrics.POD_READY.labels(*series).set(1 if ready else 0)
    metrics.GATE_VERIFIED.labels(*series).set(1 if gate.is_verified(pod) else 0)
    since = gate.unverified_since(pod)
    if since is None:
        metrics.UNVERIFIED_SINCE.labels(*series).unset()
    else:
        metrics.UNVERIFIED_SINCE.labels(*series).set(since.timestamp())
    metrics.VERIFY_TIMEOUT.labels(*series).set(verify_timeout_seconds(rt, pod))
    if first:
        metrics.LAST_VERIFIED.labels(*series).set(rt.clock().timestamp())
        metrics.REVERIFY_INTERVAL.labels(*series).set(reverify_seconds(rt, pod))


def reverify_seconds(rt: Runtime, pod: Pod) -> float:
    if rt.settings.reverify_seconds is not None:
        return rt.settings.reverify_seconds
    md = rt.mds.get(_md_of(pod))
    if md is not None:
        value = md.get("spec", {}).get("rollout", {}).get("reverifyIntervalSeconds")
        if isinstance(value, int | float) and value > 0:
            return float(value)
    return DEFAULT_REVERIFY_SECONDS


def verify_timeout_seconds(rt: Runtime, pod: Pod) -> float:
    """The pod's ModelDeployment's rollout.verifyTimeoutSeconds (the API's default without
    one)."""
    md = rt.mds.get(_md_of(pod))
    value = (md or {}).get("spec", {}).get("rollout", {}).get("verifyTimeoutSeconds")
    if isinstance(value, int | float) and value > 0:
        return float(value)
    return float(DEFAULT_VERIFY_TIMEOUT_SECONDS)


def _pod_ref(pod: Pod) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod.get("metadata", {})}


def _record(rt: Runtime, pod: Pod, verdict: Verdict, requirement: Requirement) -> None:
    uid = pod["metadata"]["uid"]
    pool = verdict.report.kv_pool_tokens if verdict.report else None
    rt.engines[uid] = VerifiedEngine(verdict.outcome.value, verdict.reason, pool)
    metrics.VERIFICATIONS.labels(verdict.outcome.value, verdict.reason).inc()
    series = _series(pod)
    if verdict.outcome is Outcome.SAFE:
        metrics.LAST_VERIFIED.labels(*series).set(rt.clock().timestamp())
    if pool is not None:
        metrics.KV_POOL_TOKENS.labels(*series).set(pool)
        metrics.HEADROOM_RATIO.labels(*series).set(pool / requirement.context_length)


async def _write(rt: Runtime, pod: Pod, condition: dict[str, str]) -> bool:
    """Patch the condition; returns False when the pod is gone or was replaced."""
    meta = pod["metadata"]
    previous = gate.current_condition(pod)
    result = await rt.api.patch_pod_condition(
        meta["namespace"], meta["name"], meta["uid"], condition
    )
    if result is None:
        _gone(rt, pod)
        return False
    # Keep our copy current so the next decision compares against what we wrote.
    conditions = [
        c
        for c in pod.get("status", {}).get("conditions", None) or []
        if c.get("type") != labels.ENGINE_VERIFIED
    ]
    pod.setdefault("status", {})["conditions"] = [*conditions, condition]
    await _announce(rt, pod, previous, condition)
    return True


def _gone(rt: Runtime, pod: Pod) -> None:
    """The API server has no pod with this uid (its status patch got 404 or 409): forget it as
    its DELETED event would. A pod whose deletion the watch never reported (kopf re-lists after
    a "410 Gone" without telling what vanished meanwhile) would otherwise keep its verifier and
    its place in ``rt.pods``, whose readers (the worker audit's verified engines) trust it."""
    if str(pod.get("metadata", {}).get("uid", "")) in rt.pods:
        on_pod_event(rt, "DELETED", pod)


async def _announce(
    rt: Runtime, pod: Pod, previous: dict[str, str] | None, condition: dict[str, str]
) -> None:
    """Events and logs on transitions: lost verification, first unsafe verdict."""
    now = rt.clock()
    was_true = previous is not None and previous.get("status") == "True"
    message = condition["message"]
    namespace, md_name = _md_of(pod)
    fields = {"namespace": namespace, "deployment": md_name, "pod": gate.pod_name(pod)}
    if condition["status"] == "True":
        if not was_true:
            log.info(
                "engine verified: %s", message, extra={**fields, "reason": condition["reason"]}
            )
        return
    if condition["reason"] == gate.SCALING_DOWN:
        # A scale-down takes it out of traffic on purpose (kvgate.rollout.scaling posts the
        # Events of the drain on the ModelDeployment): no lost verification.
        log.info("engine leaves traffic to scale down: %s", message, extra=fields)
        return
    if was_true and pod.get("metadata", {}).get("deletionTimestamp"):
        # A pod being deleted (scale-down, rollout, namespace deletion) leaves traffic as it
        # should: the gate turns False, but that is no lost verification to warn about.
        log.info(
            "terminating engine leaves traffic: %s",
            message,
            extra={**fields, "reason": condition["reason"]},
        )
        return
    if was_true:
        log.warning(
            "engine verification lost: %s", message, extra={**fields, "reason": condition["reason"]}
        )
        for ref in (_pod_ref(pod), rt.md_ref(*_md_of(pod))):
            await _post(rt, ref, "Warning", "EngineVerificationLost", message, now)
    elif gate.is_unsafe_reason(condition["reason"]) and (
        previous is None or previous.get("reason") != condition["reason"]
    ):
        log.warning("engine unsafe: %s", message, extra={**fields, "reason": condition["reason"]})
        # On the MD too: `kubectl describe kvmd` then shows the pool and the context in numbers
        # (e.g. after a restart the lost-verification Event only says the engine went down).
        for ref in (_pod_ref(pod), rt.md_ref(*_md_of(pod))):
            await _post(rt, ref, "Warning", condition["reason"], message, now)


async def _post(
    rt: Runtime, ref: dict[str, Any], type_: str, reason: str, message: str, now: Any
) -> None:
    try:
        await rt.api.post_event(ref, type_=type_, reason=reason, message=message, now=now)
    except Exception as exc:  # an Event is best effort; the condition is what gates traffic
        log.warning("could not post event %s: %s", reason, exc)


async def requirement_of_pod(rt: Runtime, pod: Pod) -> Requirement | tuple[str, str] | None:
    """What the pod's engine must prove, derived from its ModelDeployment (never from the pod);
    (reason, message) when it cannot be; None when the ModelDeployment is gone (nothing to do)."""
    namespace, md_name = _md_of(pod)
    md = rt.mds.get((namespace, md_name))
    if md is None:
        md = await rt.api.get("ModelDeployment", namespace, md_name) if md_name else None
        if md is not None:
            rt.mds[(namespace, md_name)] = md  # until its watch event brings a newer body
    if md is None or md.get("metadata", {}).get("deletionTimestamp"):
        if not gate.is_verified(pod):
            return gate.NOT_OWNED, f"no ModelDeployment {md_name!r} in {namespace} owns this pod"
        return None
    identity = await resolve_identity(rt, pod, md.get("metadata", {}).get("uid"))
    if isinstance(identity, Unproven):
        return gate.NOT_OWNED, (
            f"{identity.message}; kvgate verifies only pods of its own revision Deployments"
        )
    try:
        spec = ModelDeploymentSpec.model_validate(md.get("spec", {}))
    except ValidationError:
        return gate.REQUIREMENT_UNKNOWN, f"ModelDeployment {md_name} has an invalid spec"
    requirement = requirements.requirement_for(
        spec=spec,
        target_revision=revision_of(spec),
        status=md.get("status"),
        revision=identity.revision,
        role=identity.role,
        cluster_floor=rt.settings.min_engine_version_floor,
    )
    if requirement is None:
        return gate.REQUIREMENT_UNKNOWN, (
            f"the requirement of revision {identity.revision} is not recorded in ModelDeployment "
            f"{md_name}'s status.revisions (it is neither the current spec's revision nor one "
            "kvgate rolled out); it cannot be verified"
        )
    return requirement


async def engine_api_key(rt: Runtime, pod: Pod) -> str | tuple[str, str] | None:
    """The engine API key the probe must send (spec.engine.apiKeySecretRef of the pod's
    ModelDeployment, read from its Secret each pass, so a rotated key is picked up); None when
    the engine has none; (reason, message) when the Secret cannot give it (never verified then:
    the probe could not read the engine anyway)."""
    namespace, md_name = _md_of(pod)
    md = rt.mds.get((namespace, md_name)) or {}
    try:
        ref = ModelDeploymentSpec.model_validate(md.get("spec", {})).engine.api_key_secret_ref
    except ValidationError:
        return None  # requirement_of_pod already reported the invalid spec
    if ref is None:
        return None
    where = f"spec.engine.apiKeySecretRef: Secret {namespace}/{ref.name}"
    secret = await rt.api.get("Secret", namespace, ref.name)
    if secret is None:
        return ENGINE_UNAUTHORIZED, (
            f"{where} does not exist, so kvgate cannot authenticate to the engine; create it "
            f"with the engine's API key under the key {ref.key!r}"
        )
    raw = (secret.get("data") or {}).get(ref.key)
    try:
        key = base64.b64decode(raw, validate=True).decode().strip() if raw else ""
    except (binascii.Error, UnicodeDecodeError, ValueError):
        key = ""
    if not key:
        return ENGINE_UNAUTHORIZED, (
            f"{where} has no non-empty UTF-8 value under the key {ref.key!r}; put the engine's "
            "API key there"
        )
    return key


async def check_pod(rt: Runtime, pod: Pod) -> dict[str, str] | None:
    """One verification pass over one pod; returns the condition written, if any."""
    now = rt.clock()
    metrics.REVERIFY_INTERVAL.labels(*_series(pod)).set(reverify_seconds(rt, pod))
    since = gate.draining_since(pod)
    if since is not None:  # a scale-down drains it: out of traffic, whatever its engine says
        draining = gate.condition_for_draining(pod, since, now)
        return draining if draining is not None and await _write(rt, pod, draining) else None
    requirement = await requirement_of_pod(rt, pod)
    if requirement is None:
        return None
    api_key = None if isinstance(requirement, tuple) else await engine_api_key(rt, pod)
    if isinstance(requirement, tuple):
        condition = gate.condition_for_unverifiable(pod, *requirement, now)
    elif isinstance(api_key, tuple):
        condition = gate.condition_for_unverifiable(pod, *api_key, now)
    else:
        url = gate.engine_url(pod)
        if url is None and group_verify.is_group_pod(pod):  # a leader: is a rank gone?
            md_uid = (rt.mds.get(_md_of(pod)) or {}).get("metadata", {}).get("uid")
            condition = await group_verify.condition_engine_down(rt, pod, md_uid)
        elif url is None:
            condition = gate.condition_for_engine_down(pod, now)
        else:
            started = time.perf_counter()
            verdict = await (
                rt.verify(url, requirement, api_key=api_key)
                if api_key
                else rt.verify(url, requirement)
            )
            metrics.VERIFICATION_DURATION.observe(time.perf_counter() - started)
            _record(rt, pod, verdict, requirement)
            if verdict.outcome is not Outcome.SAFE:
                log.debug(
                    "verdict %s for %s: %s", verdict.outcome, gate.pod_name(pod), verdict.message
                )
            if group_verify.is_group_pod(pod):  # a multi-node engine: only with every rank
                md = rt.mds.get(_md_of(pod)) or {}
                md_uid = md.get("metadata", {}).get("uid")
                condition = await group_verify.condition(rt, pod, verdict, requirement, md_uid)
            else:
                condition = gate.condition_for_verdict(pod, verdict, requirement, rt.clock())
    # A KV canary violation keeps the gate False whatever the pool says.
    condition = kv_canary_watch.on_check(rt, pod, condition, rt.clock())
    if condition is None:
        return None
    if not await _write(rt, pod, condition):
        return None
    return condition


async def run_verifier(
    rt: Runtime, uid: str, stopped: Callable[[], bool], *, proven: Fingerprint | None = None
) -> None:
    """The per-pod loop over ``rt.pods[uid]``: check on change, else every reverify interval,
    until stopped or the pod is gone (the loop holds no body of its own: the latest is in
    ``rt.pods``). ``proven``: the pod as it was when it last proved itself (``take_over``):
    no read until it changes from that or its periodic turn comes, within one interval."""
    wake = rt.pod_wake(uid)
    last: Fingerprint | None = proven
    last_check = float("-inf")
    if proven is not None and uid in rt.pods:
        last_check = time.monotonic() - reverify_seconds(rt, rt.pods[uid]) * random.random()
    gateway = GatewayWatch(
        rt, grace_seconds=rt.settings.gateway_grace_seconds
    )  # deletes the pod if a gateway ignores its NotReady
    period = float("inf")  # this round's re-verify period: within (1 - JITTER, 1] x interval
    turn: float | None = None  # when a due periodic read may run (the fleet's budget)
    while not stopped():
        current = rt.pods.get(uid)
        if current is None:  # deleted
            return
        interval = reverify_seconds(rt, current)
        changed = fingerprint(current) != last
        now = time.monotonic()
        if not changed and turn is None and now - last_check >= min(period, interval):
            # Periodic re-reads of unchanged engines take turns across the fleet
            # (KVGATE_REVERIFY_READS_PER_SECOND); a change below never waits for one.
            wait = rt.reverify_pacer().reserve()
            metrics.REVERIFY_WAIT.observe(wait)
            turn = now + wait
        if changed or (turn is not None and now >= turn):
            turn = None
            first = last is None
            last = fingerprint(current)
            last_check = time.monotonic()
            # Never later than the interval, and spread so that pods verified together (a
            # rollout, an operator start) do not all come due in the same instant again.
            period = interval * (1.0 - REVERIFY_JITTER * random.random())
            # A changed engine is read first; on first sight (e.g. a new leader with thousands
            # of pods) one verified since its engine started waits behind those that are not.
            urgent = changed and not (first and gate.verified_since_engine_start(current))
            token = probe_slots.URGENT.set(urgent)
            try:
                await check_pod(rt, current)
            except asyncio.CancelledError:
                if not stray_cancellation():
                    raise  # the verifier itself was stopped
                log.warning(
                    "verification of pod %s failed: a read was cancelled (not the verifier)",
                    gate.pod_name(current),
                )
            except Exception as exc:
                log.warning("verification of pod %s failed: %s", gate.pod_name(current), exc)
            finally:
                probe_slots.URGENT.reset(token)
        try:
            gateway_due = await gateway.step(current)
        except asyncio.CancelledError:
            if not stray_cancellation():
                raise
            log.warning("gateway check of pod %s was cancelled (not the verifier)", uid)
            gateway_due = float(rt.settings.reconcile_seconds)
        due = turn if turn is not None else last_check + min(period, interval)
        await sleep_until_woken(wake, min(due - time.monotonic(), gateway_due))
