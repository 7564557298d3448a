"""ModelDeployments: gather cluster state -> plan the rollout step -> apply it -> write status.

Runs as one loop per ModelDeployment (kvgate.controller.md_loops), woken by changes to the CR,
its engine pods, its Deployments and the other objects it owns, and on a timer. What it keeps
between passes (Reconciler.__init__ lists it) is timer input, caches of reads and metrics'
memory; which RoleScales exist comes from the operator's watch of them (RoleScaleNames): a
restarted operator resumes from cluster state and decides the same.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import aiohttp
from pydantic import ValidationError

from kvgate.admission.host_paths import HostPathPolicy, check_host_paths
from kvgate.api import labels
from kvgate.api.models import (
    SCALE_KIND,
    ModelDeployment,
    ModelDeploymentSpec,
    ObjectMeta,
    Role,
    RolloutStrategy,
)
from kvgate.api.ownership import OwnershipConflict, conflict_for, is_controlled_by
from kvgate.api.revision import revision_of
from kvgate.api.timestamps import parse_rfc3339
from kvgate.controller import content_check, engine_pods, step_check
from kvgate.controller.deployments import RoleScaleNames
from kvgate.controller.router_workers import audit_loop
from kvgate.controller.runtime import (
    MdKey,
    PodStore,
    Runtime,
    Wake,
    sleep_until_woken,
    stray_cancellation,
)
from kvgate.kube import k8s, metrics
from kvgate.kube.k8s import JSON_PATCH, ApiError
from kvgate.objects import builders, model_source, router_auth
from kvgate.rollout import (
    access_checks,
    lws_availability,
    model_download,
    pass_decision,
    pass_timing,
    pod_creation,
    pool_drift,
    rollback,
    scaling,
    workload_writes,
)
from kvgate.rollout.pass_priority import PassClass
from kvgate.rollout.planner import (
    ObservedState,
    PodState,
    RolloutRecord,
    RolloutStep,
    WorkloadState,
)
from kvgate.rollout.progressive import EngineFailures, RouterCounters
from kvgate.rollout.status import invalid_spec_status, refusal_is_new, rollout_record
from kvgate.verify import content_probe, gate

log = logging.getLogger("kvgate.modeldeployment")
MIN_PASS_SECONDS = 0.2
LWS_RECHECK_SECONDS = 30.0  # see Reconciler._leader_worker_sets
Body = dict[str, Any]


def workload_state(body: Body) -> WorkloadState | None:
    meta = body.get("metadata", {})
    lab = meta.get("labels", {})
    ann = meta.get("annotations", {}) or {}
    revision, component = lab.get(labels.REVISION), lab.get(labels.ROLE)
    if not revision or not component:
        return None
    not_created = pod_creation.replica_failure(body.get("status"))
    return WorkloadState(
        revision=revision,
        component=component,
        replicas=int(body.get("spec", {}).get("replicas", 0) or 0),
        ready_replicas=int(body.get("status", {}).get("readyReplicas", 0) or 0),
        verify_started_at=parse_rfc3339(ann.get(labels.VERIFY_STARTED_AT)),
        refused_reason=ann.get(labels.REFUSED_REASON),
        refused_message=ann.get(labels.REFUSED_MESSAGE),
        creation_failure=(
            pod_creation.CreationFailure(component, str(meta.get("name") or ""), not_created)
            if not_created is not None
            else None
        ),
    )


def pod_state(rt: Runtime, body: Body) -> PodState | None:
    meta = body.get("metadata", {})
    lab = meta.get("labels", {})
    revision, role = lab.get(labels.REVISION), lab.get(labels.ROLE)
    if not revision or not role:
        return None
    cond = gate.current_condition(body) or {}
    verified = cond.get("status") == "True"
    reason, message = cond.get("reason"), cond.get("message")
    failure = model_download.failure_of(body) if not verified else None
    # The engine cannot start: say why, with the download's own words (never over an unsafe
    # verdict an earlier engine of this pod gave: that one refuses the revision).
    if failure is not None and not gate.is_unsafe_reason(reason):
        cached = rt.owned(DownloadLogs).lines.get(meta.get("uid", ""))
        said = cached[1] if cached is not None and cached[0] == failure.key else None
        reason = model_download.REASON
        message = model_download.describe(
            role, meta.get("name", ""), meta.get("namespace", ""), failure, said
        )
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in body.get("status", {}).get("conditions", None) or []
    )
    engine = rt.engines.get(meta.get("uid", ""))
    return PodState(
        name=meta.get("name", ""),
        revision=revision,
        role=role,
        verified=verified,
        gate_reason=reason,
        gate_message=message,
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
        kv_pool_tokens=engine.kv_pool_tokens if engine and verified else None,
        draining_since=parse_rfc3339(gate.draining_since(body)),
        drained=labels.DRAINED in (meta.get("annotations") or {}),
        created=parse_rfc3339(meta.get("creationTimestamp")),
    )


@dataclass
class DownloadLogs:
    """The last log line of each engine pod's failed model download attempt, read once per
    attempt (pod uid -> (attempt, line or None when the log could not be read))."""

    lines: dict[str, tuple[tuple[int, int | None], str | None]] = field(default_factory=dict)

    def forget_pod(self, uid: str) -> None:
        self.lines.pop(uid, None)


DOWNLOAD_LOG_BYTES = 16 << 10


async def read_download_logs(rt: Runtime, pods: Iterable[Body]) -> None:
    """Read the failed attempt's last log line of each pod whose model download fails (once per
    attempt), for pod_state's message; a log that cannot be read leaves the line out."""
    store = rt.owned(DownloadLogs)

    async def one(pod: Body) -> None:
        failure = model_download.failure_of(pod)
        meta = pod.get("metadata", {})
        uid = str(meta.get("uid", ""))
        if failure is None or gate.is_verified(pod):
            return
        cached = store.lines.get(uid)
        if cached is not None and cached[0] == failure.key:
            return
        path = f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}/log"
        params = {"container": model_source.FETCH_CONTAINER, "tailLines": "5"}
        if failure.retrying:
            params["previous"] = "true"
        try:
            text = await rt.api.get_text(path, params, DOWNLOAD_LOG_BYTES)
            line = model_download.last_line(text)
        except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.info("model download log of %s unreadable: %s", meta.get("name"), exc)
            line = None
        store.lines[uid] = (failure.key, line)

    await asyncio.gather(*(one(p) for p in pods))


def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_none(v) for v in value]
    return value


@dataclass
class LwsMemory:
    """When the LeaderWorkerSet API last answered 404 or 403, across the fleet (this module's
    state for one operator run: a new leader asks again)."""

    unavailable: tuple[float, int] | None = None  # (time.monotonic(), HTTP status)


class Reconciler:
    """One ModelDeployment's passes: observe (every read) -> decide (pure,
    kvgate.rollout.pass_decision) -> act (every write)."""

    def __init__(self, rt: Runtime, namespace: str, name: str) -> None:
        self.rt, self.namespace, self.name = rt, namespace, name
        # What a pass keeps for the next one. None of it changes what a pass decides: each is a
        # timer input set by the pass just before, a cache whose loss costs one more read, or a
        # metric's memory. A restarted operator starts them empty and decides the same.
        # The last pass's outcome, for the timer to the next one (set by every pass):
        self.conflicted = False  # it reported an ownership conflict
        self.verify_timeout_seconds: float | None = None  # of the last spec that parsed
        self.draining = False  # it left an engine draining for a scale-down
        # Caches of reads: lost, the next pass reads again (kvgate.rollout.access_checks: with
        # no check held, one is due) and decides from what it read.
        self.access_check: access_checks.AccessCheck | None = None
        self.network_policies_cleared = False  # policies turned off: the own ones are gone
        # Only for kvgate_scale_up_verified_seconds: a scale-up under way at a restart is
        # not timed; nothing is decided from these.
        self.effective: dict[Role, int] = {}  # each autoscaled role's count at the last pass
        # role -> (the raised count, when it was seen): until that many verified engines serve
        self.scale_ups: dict[Role, tuple[int, float]] = {}

    async def reconcile(self) -> RolloutStep | None:
        started = time.perf_counter()
        try:
            return await self._reconcile()
        finally:
            metrics.RECONCILE_DURATION.observe(time.perf_counter() - started)

    async def _reconcile(self) -> RolloutStep | None:
        body = await self.rt.api.get("ModelDeployment", self.namespace, self.name)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            return None
        self.rt.mds[(self.namespace, self.name)] = body
        try:
            spec = ModelDeploymentSpec.model_validate(body.get("spec", {}))
        except ValidationError as exc:
            await self._invalid(body, exc)
            return None
        not_allowed = check_host_paths(spec, self.rt.settings.host_paths or HostPathPolicy())
        if not_allowed:
            # Admission denies these; a spec stored without the webhook (failurePolicy Ignore) or
            # admitted before the cluster's allow-lists still never becomes pods.
            await self._report_invalid(body, "; ".join(str(p) for p in not_allowed))
            return None
        self.verify_timeout_seconds = spec.rollout.verify_timeout_seconds
        requested = rollback.decide_rollback(
            (body["metadata"].get("annotations") or {}).get(rollback.ROLLBACK_ANNOTATION),
            rollback.history_in(body.get("status")),
            target_revision=revision_of(spec),
            revision_of=_revision_of_raw,
        )
        if requested is not None:
            # The patched ModelDeployment comes back as a watch event and wakes the next pass,
            # which rolls out the restored spec like any other.
            await self._rollback(body, requested)
            return None
        # observe: every read, and the clock once
        inputs = await self._observe(body, spec)
        # decide: the step, its writes, the status and its Events (pure)
        decision = pass_decision.decide(inputs)
        # act: every write; then the status and Events, with what the writes found
        late_conflicts = await self._act(decision.waves, inputs.md.metadata.uid)
        outcome = pass_decision.conclude(decision, late_conflicts)
        self._remember(inputs, outcome)
        await self._record(body, decision.step, outcome, inputs)
        self._record_scaling(decision)
        return decision.step

    def _record_scaling(self, decision: pass_decision.PassDecision) -> None:
        """Autoscaled roles' gauges, their drains, and how long a raised count took to serve."""
        now = time.monotonic()
        for role in scaling.ENGINE_ROLES:
            series = (self.namespace, self.name, role.value)
            count = decision.counts.get(role)
            status = decision.scales.statuses.get(role) if decision.scales else None
            if count is None or status is None:
                metrics.record_role(series, None)
                self.scale_ups.pop(role, None)
                continue
            serving = scaling.serving_engines(
                decision.inputs.observed.pods, scaling.traffic_revisions(decision.step), role
            )
            verified = int(status["replicas"])
            metrics.record_role(
                series,
                {
                    "desired": count.requested,
                    "effective": count.effective,
                    "verified": verified,
                    "verified_kv_tokens": sum(p.kv_pool_tokens or 0 for p in serving),
                    "draining": len(status["draining"]),
                },
            )
            since = self.scale_ups.get(role)
            if since is not None and count.effective < since[0]:
                self.scale_ups.pop(role)  # lowered again before it served
                since = None
            previous = self.effective.get(role)
            if since is None and previous is not None and count.effective > previous:
                since = self.scale_ups[role] = (count.effective, now)
            if since is not None and verified >= since[0]:
                metrics.SCALE_UP_VERIFIED_SECONDS.labels(role.value).observe(now - since[1])
                self.scale_ups.pop(role, None)
            self.effective[role] = count.effective
        self.draining = bool(decision.drains and any(decision.drains.draining.values()))
        for removal in decision.drains.removals if decision.drains else ():
            metrics.DRAIN_SECONDS.labels(removal.role).observe(removal.seconds)
            result = "timeout" if removal.timed_out else "drained"
            metrics.DRAINS.labels(removal.role, result).inc()

    async def _observe(self, body: Body, spec: ModelDeploymentSpec) -> pass_decision.PassInputs:
        """Every read of the pass: the ModelDeployment's workloads, pods, Service and key
        Secret at once; then what depends on them (the router access objects and NetworkPolicies
        when due, the target's router counters during a progressive step)."""
        rt, ns, name = self.rt, self.namespace, self.name
        meta, now = body["metadata"], rt.clock()
        uid, target = meta.get("uid"), revision_of(spec)
        md = ModelDeployment(
            metadata=ObjectMeta(
                name=name, namespace=ns, uid=uid, generation=meta.get("generation")
            ),
            spec=spec,
        )
        router_key = router_auth.control_key(rt.settings.router_key_seed, ns, name, uid or "")
        secret_name = builders.router_control_secret_name(name)
        selector = {labels.DEPLOYMENT: name, labels.MANAGED_BY: labels.MANAGED_BY_VALUE}
        listed, (lws_access, groups), listed_pods, service, secret = await asyncio.gather(
            self._deployments(selector),
            # Multi-node engines' LeaderWorkerSets count as workloads like Deployments.
            self._leader_worker_sets(selector, uid),
            self._engine_pods(),
            rt.api.get("Service", ns, name),
            rt.api.get("Secret", ns, secret_name),
        )
        # Only the MD's own Deployments and their pods count: labels can be copied by anyone.
        deployments = [d for d in listed if is_controlled_by(d, uid)] + groups
        await read_download_logs(rt, _pods_of(deployments, listed_pods))
        own_service = service if is_controlled_by(service or {}, uid) else None
        workloads = tuple(w for w in map(workload_state, deployments) if w is not None)
        recorded = rollout_record(body.get("status"))
        selector_now = (own_service or {}).get("spec", {}).get("selector") or {}
        running = {w.revision for w in workloads} | {target}
        due = self._access_check_due(running, target, recorded, selector_now)
        own_pods = _pods_of(deployments, listed_pods)
        access, policies, counters, engine_failures, scales, loads = await asyncio.gather(
            self._access_objects(md) if due else _nothing(),
            self._policies(name, running, due),
            self._target_router_counters(spec, target, recorded, deployments),
            self._target_engine_failures(spec, target, recorded, deployments, listed_pods),
            self._scales(spec),
            _drain_loads(own_pods),
        )
        observed = ObservedState(
            spec=spec,
            target_revision=target,
            workloads=workloads,
            pods=tuple(
                p for p in (pod_state(rt, b) for b in _pods_of(deployments, listed_pods)) if p
            ),
            service_revision=selector_now.get(labels.REVISION),
            now=now,
            # The durable record (status: only the operator writes it); the Service, the
            # Deployments and their annotations are evidence that anyone may lose or replace.
            recorded=recorded,
            service_exists=service is not None,
            service_foreign=service is not None and own_service is None,
            content_checks=content_probe.checks_in(body.get("status")),
            service_split=selector_now == builders.split_selector(name),
            target_router_counters=counters,
            target_engine_failures=engine_failures,
        )
        return pass_decision.PassInputs(
            body=body,
            md=md,
            observed=observed,
            deployments=tuple(deployments),
            service=service,
            lws_access=lws_access,
            router_key=router_key,
            guard=self._guard(),
            access_current=access,
            secret_current=secret,
            last_access=self.access_check,
            policies=policies,
            content=content_check.finished(rt, ns, name, target),
            estimates=pool_drift.EstimatePolicy(
                rt.settings.gpu_reserved_gib_by_product, rt.settings.optimistic_drift_percent
            ),
            scales=scales,
            loads=loads,
        )

    async def _scales(self, spec: ModelDeploymentSpec) -> dict[Role, Body | None]:
        """The RoleScale of each autoscaled role, and of each other role whose RoleScale the
        operator's watch shows (to delete it: RoleScaleNames)."""
        watched = self.rt.owned(RoleScaleNames)
        roles = [
            role
            for role in scaling.ENGINE_ROLES
            if scaling.autoscaling_of(spec, role) is not None
            or watched.exists(self.namespace, scaling.scale_name(self.name, role))
        ]
        found = await asyncio.gather(
            *(
                self.rt.api.get(SCALE_KIND, self.namespace, scaling.scale_name(self.name, role))
                for role in roles
            )
        )
        return dict(zip(roles, found, strict=True))

    def _access_check_due(
        self, running: set[str], target: str, recorded: RolloutRecord, selector: Body
    ) -> bool:
        """Whether this pass reads (and restores) the router access objects and NetworkPolicies
        (kvgate.rollout.access_checks: they are watched, so a change to one wakes a pass that
        reads it). A revision that neither is the target nor serves may be deleted this pass,
        and its NetworkPolicies with it: read them too. A pass that fails from here leaves the
        next one due."""
        serving = {target, recorded.serving_revision, selector.get(labels.REVISION)}
        due = access_checks.access_check_due(
            self.access_check,
            revisions=frozenset(running),
            deleting=bool(running - serving),
            changed=self.rt.take_access_changed((self.namespace, self.name)),
            now=time.monotonic(),
            safety_net_seconds=self.rt.settings.steady_reconcile_seconds,
        )
        if due:
            self.access_check = None
        return due

    async def _access_objects(self, md: ModelDeployment) -> dict[str, Body | None]:
        """The router's ServiceAccount, Role and RoleBinding as they are, by kind (all three
        are named after the router's account)."""
        name = builders.router_account_name(md.metadata.name or "")
        found = await asyncio.gather(
            *(self.rt.api.get(kind, self.namespace, name) for kind in pass_decision.ACCESS_KINDS)
        )
        return dict(zip(pass_decision.ACCESS_KINDS, found, strict=True))

    async def _policies(
        self, name: str, running: set[str], due: bool
    ) -> pass_decision.PolicyInputs:
        """The NetworkPolicy settings, and every policy the running revisions can have when the
        check is due (turned off: until the MD's own are deleted once)."""
        settings = self.rt.settings.network_policy
        read = (due and settings is not None) or (
            settings is None and not self.network_policies_cleared
        )
        names = pass_decision.policy_names_to_read(name, running) if read else []
        found = await asyncio.gather(
            *(self.rt.api.get("NetworkPolicy", self.namespace, n) for n in names)
        )
        current = dict(zip(names, found, strict=True))
        if settings is None:
            return pass_decision.PolicyInputs(current=current, read=read)
        return pass_decision.PolicyInputs(
            enabled=True,
            operator_namespace=settings.operator_namespace,
            operator_pod_labels=settings.operator_pod_labels,
            router_egress=settings.router_egress,
            current=current,
            read=read,
        )

    def _guard(self) -> builders.Guard | None:
        """The engine pods' guard sidecar (kvgate.cmd.guard); none outside the chart."""
        settings = self.rt.settings
        if not settings.guard_image:
            return None
        return builders.Guard(
            settings.guard_image,
            settings.min_engine_version_floor,
            settings.guard_resources,
            settings.engine_pull_secrets,
        )

    async def _deployments(self, selector: dict[str, str]) -> list[Body]:
        """The ModelDeployment's kvgate Deployments: from the operator's own watch once it has
        listed them all (``Runtime.deployments_listed``; slim: pod_view.slim_workload), else
        listed. A Deployment a pass just created may not be there yet: planned again, its
        create finds it (409) and reads it; a change after the read wakes the next pass."""
        listed = self.rt.deployments_listed
        return await self._stored_or_listed(self.rt.deployments, listed, "Deployment", selector)

    async def _stored_or_listed(
        self, store: PodStore, listed: bool, kind: str, selector: dict[str, str]
    ) -> list[Body]:
        """The MD's objects from one of the operator's own stores once it is ``listed`` (in
        name order, as a list returns them), else listed from the API."""
        if listed:
            return sorted((b for _, b in store.of_md(self.namespace, self.name)), key=_key)
        return await self.rt.api.list(kind, self.namespace, selector)

    async def _engine_pods(self) -> list[Body]:
        """The ModelDeployment's engine pods: from the operator's own watch once it has listed
        every engine pod (``Runtime.engine_pods_listed``, kvgate.kube.informer), else listed.
        With 1,000 ModelDeployments in a namespace a list per pass made the API server scan
        9,000 pods every pass (0.57 s a pass, the largest request of the scale benchmark). The
        watch is as current as the events that wake the pass; a change after the read wakes
        the next one."""
        selector = {labels.DEPLOYMENT: self.name, labels.COMPONENT: labels.COMPONENT_ENGINE}
        return await self._stored_or_listed(
            self.rt.pods, self.rt.engine_pods_listed, "Pod", selector
        )

    async def _target_router_counters(
        self,
        spec: ModelDeploymentSpec,
        target: str,
        recorded: RolloutRecord,
        deployments: list[Body],
    ) -> tuple[RouterCounters, ...] | None:
        """The target's routers' response counters, read only while a progressive rollout to it
        is under way (another revision serves); only pods of kvgate's own router Deployment."""
        progressive = spec.rollout.strategy is RolloutStrategy.PROGRESSIVE
        if not progressive or recorded.serving_revision in (None, target):
            return None
        routers = await self.rt.api.list(
            "Pod",
            self.namespace,
            builders.selector_labels(self.name, target, labels.ROLE_ROUTER),
        )
        return await step_check.read_counters(_pods_of(deployments, routers), self.rt.fetch_text)

    async def _target_engine_failures(
        self,
        spec: ModelDeploymentSpec,
        target: str,
        recorded: RolloutRecord,
        deployments: list[Body],
        engine_pods: list[Body],
    ) -> tuple[EngineFailures, ...] | None:
        """The target's engine pods' failure counters, read only while a progressive rollout to
        it is under way; only pods of kvgate's own engine workloads."""
        progressive = spec.rollout.strategy is RolloutStrategy.PROGRESSIVE
        if not progressive or recorded.serving_revision in (None, target):
            return ()
        own = [
            p
            for p in _pods_of(deployments, engine_pods)
            if (p.get("metadata", {}).get("labels") or {}).get(labels.REVISION) == target
        ]
        return await step_check.read_engine_failures(own, self.rt.fetch_text)

    async def _leader_worker_sets(
        self, selector: dict[str, str], md_uid: str | None
    ) -> tuple[lws_availability.LwsAccess, list[Body]]:
        """The ModelDeployment's own LeaderWorkerSets (with their kind, which list items lack)
        and whether kvgate may use that API. Asked every pass, whatever the spec says now: a
        revision that still serves may be a multi-node one. An API that is not served (404) or
        not allowed (403) holds no LeaderWorkerSet of this ModelDeployment: that answer is
        reused for LWS_RECHECK_SECONDS across the fleet instead of asked again every pass (a
        request in every pass of 1,000 ModelDeployments on a cluster without
        LeaderWorkerSet); installing LeaderWorkerSet is seen within that."""
        memory = self.rt.owned(LwsMemory)
        unavailable = memory.unavailable
        if unavailable is not None and time.monotonic() - unavailable[0] < LWS_RECHECK_SECONDS:
            return lws_availability.access_from_status(unavailable[1]), []
        try:
            found = await self.rt.api.list("LeaderWorkerSet", self.namespace, selector)
        except ApiError as exc:
            if exc.status in (403, 404):
                memory.unavailable = (time.monotonic(), exc.status)
                return lws_availability.access_from_status(exc.status), []
            raise
        memory.unavailable = None
        own = [{"kind": "LeaderWorkerSet", **g} for g in found if is_controlled_by(g, md_uid)]
        return lws_availability.LwsAccess.SERVED, own

    async def _act(
        self, waves: tuple[pass_decision.Wave, ...], owner_uid: str | None
    ) -> list[OwnershipConflict]:
        """Every planned write, wave after wave (the writes of one wave at once); returns the
        objects a create found someone else's."""
        conflicts: list[OwnershipConflict] = []
        for wave in waves:
            found = await asyncio.gather(*(self._write(write, owner_uid) for write in wave))
            conflicts += [c for c in found if c is not None]
        return conflicts

    async def _write(
        self, write: workload_writes.PlannedWrite, owner_uid: str | None
    ) -> OwnershipConflict | None:
        """Perform one planned write; a create of an owned object checks an existing one."""
        api, ns = self.rt.api, self.namespace
        if isinstance(write, workload_writes.Create):
            if await api.create(write.body) is not None or not write.owned:
                return None
            current = await api.get(write.body["kind"], ns, _key(write.body))
            return conflict_for(current, owner_uid) if current is not None else None
        if isinstance(write, workload_writes.Patch):
            if write.note:
                log.warning(
                    "%s %s %s",
                    write.kind,
                    write.name,
                    write.note,
                    extra={"namespace": ns, "deployment": self.name},
                )
            # Gone since the pass read it (the store can be a watch event behind): nothing to
            # patch; its deletion event wakes the pass that creates it again.
            written = await api.patch(
                write.kind,
                ns,
                write.name,
                write.patch,
                content_type=write.content_type,
                missing_ok=True,
                sub=write.subresource,
            )
            if write.kind == "Pod" and written is not None:
                engine_pods.on_own_write(self.rt, written)  # read by the next pass at once
        else:
            await api.delete(write.kind, ns, write.name)
        return None

    def _remember(
        self, inputs: pass_decision.PassInputs, outcome: pass_decision.PassOutcome
    ) -> None:
        """What the next pass needs from this one: the access check's findings, whether the
        NetworkPolicies of a turned-off setting are gone, whether a conflict stands."""
        if inputs.access_current is not None:
            observed = inputs.observed
            running = {w.revision for w in observed.workloads} | {observed.target_revision}
            self.access_check = access_checks.AccessCheck(
                frozenset(running),
                time.monotonic(),
                outcome.access_conflicts,
                outcome.policy_conflicts,
            )
        if not inputs.policies.enabled and inputs.policies.read:
            self.network_policies_cleared = True
        self.conflicted = bool(outcome.conflicts)

    async def _record(
        self,
        body: Body,
        step: RolloutStep,
        outcome: pass_decision.PassOutcome,
        inputs: pass_decision.PassInputs,
    ) -> None:
        """Write the status if it changed, post the Events due, count and log a refusal."""
        ns, name = self.namespace, self.name
        metrics.CONTEXT_LENGTH_TOKENS.labels(ns, name).set(
            inputs.observed.spec.model.context_length
        )
        metrics.OWNERSHIP_CONFLICTS.labels(ns, name).set(len(outcome.conflicts))
        metrics.record_pool_estimates(ns, name, outcome.status)
        metrics.record_revisions(ns, name, outcome.status)
        previous = body.get("status") or None
        if _strip_none(previous or {}) != _strip_none(outcome.status):
            await self.rt.api.patch_md_status(ns, name, outcome.status)
        if step.refusal is not None and refusal_is_new(step, previous):
            # Counted once it is written (a pass cut before this write counts it on the next).
            metrics.ROLLOUTS_REFUSED.labels(ns, name, step.refusal.reason).inc()
            log.warning(
                "rollout refused: %s",
                step.refusal.message,
                extra={"namespace": ns, "deployment": name, "revision": step.target_revision},
            )
        if inputs.content is not None:
            content_check.recorded(self.rt, ns, name, step.target_revision)
        for event in outcome.events:
            await self._event(body, event.type, event.reason, event.message)
        content_check.keep_due(self.rt, inputs.md, step)

    async def _invalid(self, body: Body, exc: ValidationError) -> None:
        problems = "; ".join(
            f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        await self._report_invalid(body, problems)

    async def _report_invalid(self, body: Body, problems: str) -> None:
        """Ready=False InvalidSpec naming ``problems``, and one Event; nothing is built."""
        status, event = invalid_spec_status(
            body.get("status"),
            problems,
            generation=int(body.get("metadata", {}).get("generation") or 0),
            now=self.rt.clock(),
        )
        if status is None or event is None:
            return  # already reported, unchanged: no rewrite, no Event
        log.error(
            "invalid spec: %s",
            problems,
            extra={"namespace": self.namespace, "deployment": self.name},
        )
        await self.rt.api.patch_md_status(self.namespace, self.name, status)
        await self._event(body, event.type, event.reason, event.message)

    async def _rollback(self, body: Body, decision: rollback.RollbackDecision) -> None:
        """Apply a kvgate.io/rollback decision: restore the recorded spec (the API server's
        admission, kvgate's webhook included, checks it as any update) and drop the annotation;
        a refused restore still drops it and says why."""
        api, ns, name = self.rt.api, self.namespace, self.name
        version = (body.get("metadata") or {}).get("resourceVersion")
        event = (decision.event_type, decision.reason, decision.message)
        try:
            await api.patch(
                "ModelDeployment",
                ns,
                name,
                rollback.rollback_patch(decision, version),
                content_type=JSON_PATCH,
            )
        except ApiError as exc:
            denied = "denied the request" in exc.message or exc.status in (400, 403)
            if decision.spec is None or not denied:
                # 404/409, or the resourceVersion test failed (422): changed or deleted
                # meanwhile; the next pass decides again.
                if exc.status in (404, 409, 422):
                    return
                raise
            refused = rollback.RollbackDecision(None, "Warning", "RollbackRefused", "")
            await api.patch(
                "ModelDeployment",
                ns,
                name,
                rollback.rollback_patch(refused, version),
                content_type=JSON_PATCH,
            )
            event = (
                "Warning",
                "RollbackRefused",
                f"restoring the recorded spec was refused by the API server (HTTP {exc.status}): "
                f"{exc.message}",
            )
        await self._event(body, *event)

    async def _event(self, body: Body, type_: str, reason: str, message: str) -> None:
        try:
            await self.rt.api.post_event(
                body, type_=type_, reason=reason, message=message, now=self.rt.clock()
            )
        except Exception as exc:
            log.warning("could not post event %s: %s", reason, exc)


async def _drain_loads(pods: list[Body]) -> dict[str, scaling.EngineLoad | None]:
    """The requests in flight of each engine pod a scale-down is draining (its /metrics; None
    when it cannot be read: then only the drain timeout removes it)."""
    draining = [
        p
        for p in pods
        if gate.draining_since(p) and labels.DRAINED not in (p["metadata"].get("annotations") or {})
    ]

    async def one(pod: Body) -> scaling.EngineLoad | None:
        url = gate.engine_url(pod)
        if url is None:
            return None
        try:  # SGLang's live load snapshot first; an engine without it: its /metrics
            loads = json.loads(await step_check.fetch_text(f"{url}{scaling.LOADS_PATH}"))
            found = scaling.load_from_loads(loads)
            if found is not None:
                return found
        except (aiohttp.ClientError, TimeoutError, RuntimeError, OSError, ValueError):
            pass
        try:
            return scaling.load_from_metrics(await step_check.fetch_text(f"{url}/metrics"))
        except (aiohttp.ClientError, TimeoutError, RuntimeError, OSError) as exc:
            log.info("engine metrics unreadable while draining: %s/metrics: %s", url, exc)
            return None

    loads = await asyncio.gather(*(one(p) for p in draining))
    return {gate.pod_name(p): load for p, load in zip(draining, loads, strict=True)}


async def _nothing() -> None:
    """Stands for a read this pass does not make."""
    return None


def _pods_of(deployments: list[Body], pods: list[Body]) -> list[Body]:
    """Pods controlled by a ReplicaSet of one of these Deployments (``<deployment>-<hash>``).
    The verifier proves the full chain before a pod's gate can turn True; this cheap filter only
    keeps look-alike pods out of the rollout's counts."""
    prefixes = tuple(f"{_key(d)}-" for d in deployments if d.get("kind") != "LeaderWorkerSet")
    # A multi-node engine's leader comes from the leader StatefulSet named as its group's LWS.
    groups = {_key(d) for d in deployments if d.get("kind") == "LeaderWorkerSet"}
    out = []
    for pod in pods:
        for ref in pod.get("metadata", {}).get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == "ReplicaSet":
                if str(ref.get("name", "")).startswith(prefixes) and prefixes:
                    out.append(pod)
                break
            if ref.get("controller") and ref.get("kind") == "StatefulSet":
                if str(ref.get("name", "")) in groups:
                    out.append(pod)
                break
    return out


def _key(body: Body) -> str:
    return str(body.get("metadata", {}).get("name", ""))


def _revision_of_raw(raw: Any) -> str | None:
    """The revision this operator computes for a recorded spec; None if it no longer parses."""
    try:
        return revision_of(ModelDeploymentSpec.model_validate(raw))
    except ValidationError:
        return None


def next_interval(
    rt: Runtime,
    step: RolloutStep | None,
    quiet_passes: int = 0,
    *,
    verify_timeout_seconds: float | None = None,
    conflicted: bool = False,
    draining: bool = False,
) -> float:
    """Seconds to the next timer pass (kvgate.rollout.pass_timing): in flight, quiet timer passes
    back off towards the steady period (watches wake the loop on every change), bounded by the
    verify deadline (``verify_timeout_seconds``: the spec's, as the pass parsed it); while a
    scale-down drains an engine (``draining``), every DRAIN_RECHECK_SECONDS: the end of a
    request is no watch event."""
    settled = (
        step is not None
        and step.serving_revision == step.target_revision
        and not step.serving_problems
        and not step.delete_revisions
    )
    steady = settled or (step is not None and step.refusal is not None and not step.new_refusal)
    interval = pass_timing.next_pass_seconds(
        settled=steady,
        failed=step is None,
        quiet_passes=quiet_passes,
        reconcile_seconds=rt.settings.reconcile_seconds,
        steady_seconds=rt.settings.steady_reconcile_seconds,
        until_deadline=_until_verify_deadline(rt, step, verify_timeout_seconds),
        jitter=random.random(),
        conflicted=conflicted,
    )
    return min(interval, scaling.DRAIN_RECHECK_SECONDS) if draining else interval


def _until_verify_deadline(
    rt: Runtime, step: RolloutStep | None, timeout: float | None
) -> float | None:
    """Seconds until the target revision's verify deadline; None when no rollout waits on it."""
    if step is None or timeout is None or step.refusal is not None:
        return None
    if step.serving_revision == step.target_revision:
        return None
    deadline = step.verify_started_at + timedelta(seconds=float(timeout))
    return (deadline - rt.clock()).total_seconds()


async def run_reconciler(rt: Runtime, key: MdKey, stopped: Callable[[], bool]) -> None:
    """The per-ModelDeployment loop, until stopped."""
    reconciler = Reconciler(rt, *key)
    wake = rt.md_wake(key)
    audit = asyncio.create_task(audit_loop(rt, key, stopped), name=f"audit-{key[0]}/{key[1]}")
    try:
        await _reconcile_until_stopped(rt, reconciler, wake, stopped)
    finally:
        audit.cancel()
        content_check.stop(rt, key)
        await asyncio.gather(audit, return_exceptions=True)


async def _reconcile_until_stopped(
    rt: Runtime, reconciler: Reconciler, wake: Wake, stopped: Callable[[], bool]
) -> None:
    key = (reconciler.namespace, reconciler.name)
    quiet = 0  # timer passes in a row that no change woke
    while not stopped():
        try:
            # Passes asked for go first, then namespaces take turns (kvgate.rollout.pass_priority).
            async with rt.pass_slots().slot(key, rt.pass_class(key)) as granted:
                wake.clear()  # a change from here on calls for another pass
                rt.pass_requests.discard(key)  # this pass reads what was asked for
                # A pass asked for goes first for the API client's request slots too, and so
                # does this one once somebody asks while it runs (rt.ask_pass).
                urgency = rt.pass_urgency[key] = k8s.Urgency(granted is PassClass.REQUESTED)
                token = k8s.URGENT.set(urgency)
                try:
                    step = await reconciler.reconcile()
                finally:
                    k8s.URGENT.reset(token)
                    if rt.pass_urgency.get(key) is urgency:
                        del rt.pass_urgency[key]
        except asyncio.CancelledError:
            if not stray_cancellation():
                raise  # this loop was cancelled: its ModelDeployment is gone or not ours
            log.warning(
                "reconcile failed: an operation of the pass was cancelled (not the loop)",
                extra={"namespace": key[0], "deployment": key[1]},
            )
            step = None
        except Exception as exc:
            log.warning(
                "reconcile failed: %s", exc, extra={"namespace": key[0], "deployment": key[1]}
            )
            step = None
        # Debounce: our own writes come back as watch events; let them land together. Not when
        # somebody asked for something while this pass ran (a rollback annotation): its pass
        # goes at once.
        if key not in rt.pass_requests:
            await asyncio.sleep(MIN_PASS_SECONDS)
        woken = await sleep_until_woken(
            wake,
            next_interval(
                rt,
                step,
                quiet,
                verify_timeout_seconds=reconciler.verify_timeout_seconds,
                conflicted=reconciler.conflicted,
                draining=reconciler.draining,
            )
            - MIN_PASS_SECONDS,
        )
        quiet = 0 if woken else quiet + 1
