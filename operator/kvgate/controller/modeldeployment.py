"""ModelDeployments: gather cluster state -> plan the rollout step -> apply it -> write status.

Runs as one loop per ModelDeployment (kvgate.controller.md_loops), woken by changes to the CR,
its engine pods, its Deployments and the other objects it owns, and on a timer. Nothing is kept
in memory between passes except the engines' last pool sizes (for status only) and when the
router access objects and NetworkPolicies were last read (kvgate.rollout.access_checks): a restarted
operator resumes from cluster state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from kvgate.api import labels
from kvgate.api.models import ModelDeployment, ModelDeploymentSpec, ObjectMeta, RolloutStrategy
from kvgate.api.revision import revision_of
from kvgate.build import builders, network_policy
from kvgate.controller import content_check, step_check
from kvgate.controller.router_workers import audit_loop
from kvgate.controller.runtime import MdKey, PodStore, Runtime, Wake, sleep_until_woken
from kvgate.kube import metrics
from kvgate.kube.k8s import JSON_PATCH, MERGE_PATCH, ApiError
from kvgate.rollout import (
    access_checks,
    lws_availability,
    pass_timing,
    requirements,
    rollback,
    workload_writes,
)
from kvgate.rollout.conflict_status import conflict_events, with_conflicts
from kvgate.rollout.ownership import OwnershipConflict, conflict_for, is_controlled_by
from kvgate.rollout.planner import (
    ObservedState,
    PodState,
    RolloutRecord,
    RolloutStep,
    WorkloadState,
    plan,
)
from kvgate.rollout.progressive import RouterCounters
from kvgate.rollout.status import compute_status, events_for, invalid_spec_status, rollout_record
from kvgate.verify import content_probe, gate, router_auth

log = logging.getLogger("kvgate.modeldeployment")
MIN_PASS_SECONDS = 0.2
LWS_RECHECK_SECONDS = 30.0  # see Reconciler._leader_worker_sets
Body = dict[str, Any]


def on_md_event(rt: Runtime, event_type: str | None, body: Body) -> None:
    meta = body.get("metadata", {})
    key = (meta.get("namespace", ""), meta.get("name", ""))
    if event_type == "DELETED":
        rt.forget_md(key)
        return
    rt.mds[key] = body
    rt.wake_md(*key)


def parse_time(raw: str | None) -> datetime | None:
    if not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


def workload_state(body: Body) -> WorkloadState | None:
    meta = body.get("metadata", {})
    lab = meta.get("labels", {})
    ann = meta.get("annotations", {}) or {}
    revision, component = lab.get(labels.REVISION), lab.get(labels.ROLE)
    if not revision or not component:
        return None
    return WorkloadState(
        revision=revision,
        component=component,
        replicas=int(body.get("spec", {}).get("replicas", 0) or 0),
        ready_replicas=int(body.get("status", {}).get("readyReplicas", 0) or 0),
        verify_started_at=parse_time(ann.get(labels.VERIFY_STARTED_AT)),
        refused_reason=ann.get(labels.REFUSED_REASON),
        refused_message=ann.get(labels.REFUSED_MESSAGE),
    )


def pod_state(rt: Runtime, body: Body) -> PodState | None:
    meta = body.get("metadata", {})
    lab = meta.get("labels", {})
    revision, role = lab.get(labels.REVISION), lab.get(labels.ROLE)
    if not revision or not role:
        return None
    cond = gate.current_condition(body) or {}
    verified = cond.get("status") == "True"
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
        gate_reason=cond.get("reason"),
        gate_message=cond.get("message"),
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
        kv_pool_tokens=engine.kv_pool_tokens if engine and verified else None,
    )


def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_none(v) for v in value]
    return value


class Reconciler:
    """One pass over one ModelDeployment."""

    def __init__(self, rt: Runtime, namespace: str, name: str) -> None:
        self.rt, self.namespace, self.name = rt, namespace, name
        self.conflicted = False  # the last pass reported an ownership conflict
        self.network_policies_cleared = False
        self.access_check: access_checks.AccessCheck | None = None  # kvgate.rollout.access_checks

    async def reconcile(self) -> RolloutStep | None:
        started = time.perf_counter()
        try:
            return await self._reconcile()
        finally:
            metrics.RECONCILE_DURATION.observe(time.perf_counter() - started)

    async def _reconcile(self) -> RolloutStep | None:
        api, ns, name = self.rt.api, self.namespace, self.name
        body = await api.get("ModelDeployment", ns, name)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            return None
        self.rt.mds[(ns, name)] = body
        try:
            spec = ModelDeploymentSpec.model_validate(body.get("spec", {}))
        except ValidationError as exc:
            await self._invalid(body, exc)
            return None
        meta = body["metadata"]
        md = ModelDeployment(
            metadata=ObjectMeta(
                name=name, namespace=ns, uid=meta.get("uid"), generation=meta.get("generation")
            ),
            spec=spec,
        )
        target = revision_of(spec)
        metrics.CONTEXT_LENGTH_TOKENS.labels(ns, name).set(spec.model.context_length)
        requested = (meta.get("annotations") or {}).get(rollback.ROLLBACK_ANNOTATION)
        decision = rollback.decide_rollback(
            requested,
            rollback.history_in(body.get("status")),
            target_revision=target,
            revision_of=_revision_of_raw,
        )
        if decision is not None:
            # The patched ModelDeployment comes back as a watch event and wakes the next pass,
            # which rolls out the restored spec like any other.
            await self._rollback(body, decision)
            return None

        # gather: the four reads at once (one round trip, not four: with 1,000 ModelDeployments
        # on a loaded API server a pass is bound by its requests' latency, issue 16)
        selector = {labels.DEPLOYMENT: name, labels.MANAGED_BY: labels.MANAGED_BY_VALUE}
        listed, (lws_access, groups), listed_pods, service = await asyncio.gather(
            self._deployments(selector),
            # Multi-node engines' LeaderWorkerSets count as workloads like Deployments.
            self._leader_worker_sets(selector, meta.get("uid")),
            self._engine_pods(),
            api.get("Service", ns, name),
        )
        # Only the MD's own Deployments and their pods count: labels can be copied by anyone.
        deployments = [d for d in listed if is_controlled_by(d, meta.get("uid"))]
        deployments += groups
        pods = _pods_of(deployments, listed_pods)
        own_service = service if is_controlled_by(service or {}, meta.get("uid")) else None
        workloads = [w for w in map(workload_state, deployments) if w is not None]
        recorded = rollout_record(body.get("status"))
        selector_now = (own_service or {}).get("spec", {}).get("selector") or {}
        observed = ObservedState(
            spec=spec,
            target_revision=target,
            workloads=tuple(workloads),
            pods=tuple(p for p in (pod_state(self.rt, b) for b in pods) if p is not None),
            service_revision=(own_service or {})
            .get("spec", {})
            .get("selector", {})
            .get(labels.REVISION),
            now=self.rt.clock(),
            # The durable record (status: only the operator writes it); the Service, the
            # Deployments and their annotations are evidence that anyone may lose or replace.
            recorded=recorded,
            service_exists=service is not None,
            service_foreign=service is not None and own_service is None,
            content_checks=content_probe.checks_in(body.get("status")),
            service_split=selector_now == builders.split_selector(name),
            target_router_counters=await self._target_router_counters(
                spec, target, recorded, deployments
            ),
        )

        # evaluate
        step = plan(observed)
        # The target's content check at maximum length, when due (it plans again with it).
        step, content_record, content_result = await content_check.check_if_due(
            self.rt, ns, name, meta.get("uid"), observed, step
        )

        # write
        conflicts = await self._apply(
            md,
            step,
            {_key(d): d for d in deployments},
            service,
            leader_worker_sets=lws_access is lws_availability.LwsAccess.SERVED,
        )
        previous = body.get("status") or None
        status = compute_status(
            step,
            generation=int(meta.get("generation") or 0),
            context_length=spec.model.context_length,
            previous=previous,
            now=self.rt.clock(),
        )
        # The requirement of every revision still running, so its pods are verified against
        # what kvgate rolled out once the spec has moved on (status: tenants cannot write it).
        status["revisions"] = requirements.updated_records(
            previous,
            requirements.record_of(spec, target),
            keep={w.revision for w in workloads} | {step.serving_revision or ""},
        )
        # The spec of every revision that served (the last revisionHistoryLimit), so
        # kvgate.io/rollback=<revision> never depends on its objects still running.
        status["history"] = rollback.updated_history(
            previous,
            serving_revision=step.serving_revision,
            target_revision=target,
            spec=body.get("spec") or {},
            served_at=self.rt.clock().strftime("%Y-%m-%dT%H:%M:%SZ"),
            limit=spec.rollout.revision_history_limit,
        )
        # Each running revision's content check: a revision switches only after it passed.
        status["contentChecks"] = content_probe.updated_records(
            previous, content_record, keep={w.revision for w in workloads} | {target}
        )
        status = with_conflicts(
            status,
            conflicts,
            generation=int(meta.get("generation") or 0),
            previous=previous,
            now=self.rt.clock(),
        )
        lws_message = lws_availability.unavailable_message(spec, lws_access)
        status = lws_availability.with_lws_unavailable(
            status,
            lws_message,
            generation=int(meta.get("generation") or 0),
            previous=previous,
            now=self.rt.clock(),
        )
        metrics.OWNERSHIP_CONFLICTS.labels(ns, name).set(len(conflicts))
        self.conflicted = bool(conflicts)
        if _strip_none(previous or {}) != _strip_none(status):
            await api.patch_md_status(ns, name, status)
        for event in [
            *events_for(step, previous),
            *conflict_events(conflicts, previous),
            *lws_availability.lws_events(lws_message, previous),
        ]:
            await self._event(body, event.type, event.reason, event.message)
        if content_result is not None:
            await self._event(
                body,
                "Normal" if content_result.passed else "Warning",
                content_result.reason,
                content_result.message,
            )
        if step.new_refusal and step.refusal is not None:
            metrics.ROLLOUTS_REFUSED.labels(ns, name, step.refusal.reason).inc()
            log.warning(
                "rollout refused: %s",
                step.refusal.message,
                extra={"namespace": ns, "deployment": name, "revision": target},
            )
        return step

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
        every engine pod (``Runtime.engine_pods_listed``, kvgate.kube.informer), else listed. With
        1,000 ModelDeployments in a namespace the list made the API server scan 9,000 pods for
        every pass: 0.57 s a pass, the largest request of the benchmark (issue 16). The watch
        is as current as the events that wake the pass; a change after the read wakes the next
        one."""
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

    async def _leader_worker_sets(
        self, selector: dict[str, str], md_uid: str | None
    ) -> tuple[lws_availability.LwsAccess, list[Body]]:
        """The ModelDeployment's own LeaderWorkerSets (with their kind, which list items lack)
        and whether kvgate may use that API. Asked every pass, whatever the spec says now: a
        revision that still serves may be a multi-node one. An API that is not served (404) or
        not allowed (403) holds no LeaderWorkerSet of this ModelDeployment: that answer is
        reused for LWS_RECHECK_SECONDS across the fleet instead of asked again every pass (a
        request in every pass of 1,000 ModelDeployments on a cluster without LeaderWorkerSet,
        issue 16); installing LeaderWorkerSet is seen within that."""
        unavailable = self.rt.lws_unavailable
        if unavailable is not None and time.monotonic() - unavailable[0] < LWS_RECHECK_SECONDS:
            return lws_availability.access_from_status(unavailable[1]), []
        try:
            found = await self.rt.api.list("LeaderWorkerSet", self.namespace, selector)
        except ApiError as exc:
            if exc.status in (403, 404):
                self.rt.lws_unavailable = (time.monotonic(), exc.status)
                return lws_availability.access_from_status(exc.status), []
            raise
        self.rt.lws_unavailable = None
        own = [{"kind": "LeaderWorkerSet", **g} for g in found if is_controlled_by(g, md_uid)]
        return lws_availability.LwsAccess.SERVED, own

    async def _apply(
        self,
        md: ModelDeployment,
        step: RolloutStep,
        existing: dict[str, Body],
        service: Body | None,
        *,
        leader_worker_sets: bool = True,
    ) -> list[OwnershipConflict]:
        """Write the step; returns the objects kvgate needed but may not touch (not its own)."""
        # The router's ServiceAccount, Role and RoleBinding and the NetworkPolicies: when due
        # (kvgate.rollout.access_checks: they are watched, so a change to one wakes a pass that
        # reads
        # it); the key Secret every pass. A deleted or edited object comes back either way.
        # Independent objects, so ensured at once (in order in the result).
        revisions = {i.revision for i in step.workloads}
        deleted = set(step.delete_revisions)
        check_due = access_checks.access_check_due(
            self.access_check,
            revisions=frozenset(revisions - deleted),
            deleting=bool(deleted),
            changed=self.rt.take_access_changed((self.namespace, self.name)),
            now=time.monotonic(),
            safety_net_seconds=self.rt.settings.steady_reconcile_seconds,
        )
        access, secret = self._per_md_objects(md)
        if check_due:
            started = time.monotonic()
            self.access_check = None  # a pass that fails from here on leaves the next one due
            *independent, binding = access
            ensured = await asyncio.gather(
                *(self._ensure(obj, md.metadata.uid) for obj in [*independent, secret])
            )
            # The RoleBinding once its Role exists: the API server resolves the roleRef when it
            # is created (404 until the Role is there). Created together, the first pass of
            # every new ModelDeployment failed on it and a second pass did it all again.
            bound = await self._ensure(binding, md.metadata.uid)
            access_conflicts = tuple(c for c in [*ensured[:-1], bound] if c is not None)
            secret_conflict = ensured[-1]
        else:
            assert self.access_check is not None  # check_due is True without one
            access_conflicts = self.access_check.access_conflicts
            secret_conflict = await self._ensure(secret, md.metadata.uid)
        conflicts: list[OwnershipConflict] = [*access_conflicts]
        if secret_conflict is not None:
            # Someone else wrote the router key Secret: a router started on it would take their
            # key on its worker API (add engines kvgate never verified); none runs meanwhile.
            conflicts.append(
                dataclasses.replace(
                    secret_conflict,
                    consequence="it holds the routers' control-plane key, so kvgate runs every "
                    "router of this ModelDeployment at 0 replicas until the Secret is its own",
                    stops_serving=True,
                )
            )
        fingerprint = router_auth.key_fingerprint(self._router_key(md))
        settings = self.rt.settings
        guard = (  # engine pods' guard sidecar (kvgate.cmd.guard); none outside the chart
            builders.Guard(settings.guard_image, settings.min_engine_version_floor)
            if settings.guard_image
            else None
        )

        for write in workload_writes.revision_writes(
            md,
            step,
            existing,
            workload_writes.BuildInputs(
                fingerprint,
                guard,
                leader_worker_sets,
                routers_blocked=secret_conflict is not None,
            ),
        ):
            conflict = await self._write(write, md.metadata.uid)
            if conflict is not None:
                conflicts.append(conflict)
        if check_due:
            policy_conflicts = tuple(await self._network_policies(md, revisions, deleted))
            self.access_check = access_checks.AccessCheck(
                frozenset(revisions - deleted), started, access_conflicts, policy_conflicts
            )
        conflicts += self.access_check.policy_conflicts if self.access_check else ()

        service_conflict = conflict_for(service, md.metadata.uid) if service is not None else None
        if service_conflict is not None:
            conflicts.append(service_conflict)  # someone else's: never adopt or re-point it
        for write in workload_writes.service_writes(
            service,
            builders.service(md, step.service_revision, split=step.service_split)
            if step.service_revision
            else None,
            foreign=service_conflict is not None,
        ):
            await self._write(write, None)
        return conflicts

    async def _write(
        self, write: workload_writes.PlannedWrite, owner_uid: str | None
    ) -> OwnershipConflict | None:
        """Perform one planned write; a create checks ownership when ``owner_uid`` is given."""
        api, ns = self.rt.api, self.namespace
        if isinstance(write, workload_writes.Create):
            if owner_uid is None:
                await api.create(write.body)
                return None
            return await self._create(write.body, owner_uid)
        if isinstance(write, workload_writes.Patch):
            # Gone since the pass read it (the store can be a watch event behind): nothing to
            # patch; its deletion event wakes the pass that creates it again.
            await api.patch(
                write.kind,
                ns,
                write.name,
                write.patch,
                content_type=write.content_type,
                missing_ok=True,
            )
        else:
            await api.delete(write.kind, ns, write.name)
        return None

    async def _network_policies(
        self, md: ModelDeployment, revisions: set[str], deleted: set[str]
    ) -> list[OwnershipConflict]:
        """Each running revision's NetworkPolicies (kvgate.build.network_policy): created with it,
        restored on drift, deleted with it. Turned off: the MD's own are deleted once."""
        settings = self.rt.settings.network_policy
        name = self.name
        if settings is None:
            if not self.network_policies_cleared:
                for revision in revisions | deleted:
                    for policy in network_policy.policy_names(name, revision, router_egress=True):
                        await self._delete_own("NetworkPolicy", policy, md.metadata.uid)
                self.network_policies_cleared = True
            return []
        wanted = [
            desired
            for revision in sorted(revisions - deleted)
            for desired in network_policy.network_policies(
                md,
                revision,
                operator_namespace=settings.operator_namespace,
                operator_pod_labels=settings.operator_pod_labels,
                router_egress=settings.router_egress,
            )
        ]
        ensured = await asyncio.gather(*(self._ensure(d, md.metadata.uid) for d in wanted))
        conflicts = [c for c in ensured if c is not None]
        for revision in deleted:
            for policy in network_policy.policy_names(name, revision, router_egress=True):
                await self._delete_own("NetworkPolicy", policy, md.metadata.uid)
        return conflicts

    async def _delete_own(self, kind: str, name: str, owner_uid: str | None) -> None:
        """Delete the object only if it is the MD's own (never someone else's)."""
        current = await self.rt.api.get(kind, self.namespace, name)
        if current is not None and is_controlled_by(current, owner_uid):
            await self.rt.api.delete(kind, self.namespace, name)

    def _router_key(self, md: ModelDeployment) -> str:
        return router_auth.control_key(
            self.rt.settings.router_key_seed, self.namespace, self.name, md.metadata.uid or ""
        )  # == rt.router_key(ns, name) once the MD's body is in rt.mds

    def _per_md_objects(self, md: ModelDeployment) -> tuple[list[Body], Body]:
        """Objects one per ModelDeployment: the router's identity and access (watched), and its
        control key Secret (not watched)."""
        return [
            builders.router_service_account(md),
            builders.router_role(md),
            builders.router_role_binding(md),
        ], builders.router_control_secret(md, self._router_key(md))

    async def _create(self, desired: Body, owner_uid: str | None) -> OwnershipConflict | None:
        """Create; an object of that name that already exists must be the MD's own."""
        if await self.rt.api.create(desired) is not None:
            return None
        current = await self.rt.api.get(desired["kind"], self.namespace, _key(desired))
        return conflict_for(current, owner_uid) if current is not None else None

    async def _ensure(self, desired: Body, owner_uid: str | None) -> OwnershipConflict | None:
        """Create the object, or bring the MD's own copy back to what kvgate built (a tenant's
        edit or a lost field); an object someone else controls is a conflict, left untouched."""
        api, kind, name = self.rt.api, desired["kind"], _key(desired)
        current = await api.get(kind, self.namespace, name)
        if current is None:
            return await self._create(desired, owner_uid)
        conflict = conflict_for(current, owner_uid)
        if conflict is not None:
            return conflict
        if desired.get("roleRef") is not None and current.get("roleRef") != desired["roleRef"]:
            # roleRef is immutable: replace the binding (it is the MD's own).
            await api.delete(kind, self.namespace, name)
            return await self._create(desired, owner_uid)
        drift = {
            key: desired[key]
            for key in DRIFT_FIELDS
            if key in desired and not _contains(current.get(key), desired[key])
        }
        if drift:
            log.warning(
                "%s %s drifted from what kvgate built (%s); restoring it",
                kind,
                name,
                ", ".join(sorted(drift)),
                extra={"namespace": self.namespace, "deployment": self.name},
            )
            await api.patch(kind, self.namespace, name, drift, content_type=MERGE_PATCH)
        return None

    async def _invalid(self, body: Body, exc: ValidationError) -> None:
        problems = "; ".join(
            f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
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


# Fields of per-MD objects that kvgate restores when they differ from what it built.
DRIFT_FIELDS = ("data", "rules", "subjects", "spec")


def _contains(current: Any, desired: Any) -> bool:
    """Everything kvgate set is still there (the API server may add defaults around it)."""
    if isinstance(desired, dict):
        return isinstance(current, dict) and all(
            _contains(current.get(k), v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(current, list)
            and len(current) == len(desired)
            and all(_contains(c, d) for c, d in zip(current, desired, strict=True))
        )
    return bool(current == desired)


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
    key: MdKey | None = None,
    *,
    conflicted: bool = False,
) -> float:
    """Seconds to the next timer pass (kvgate.rollout.pass_timing): in flight, quiet timer passes
    back
    off towards the steady period (watches wake the loop on every change), bounded by the verify
    deadline."""
    settled = (
        step is not None
        and step.serving_revision == step.target_revision
        and not step.serving_problems
        and not step.delete_revisions
    )
    steady = settled or (step is not None and step.refusal is not None and not step.new_refusal)
    return pass_timing.next_pass_seconds(
        settled=steady,
        failed=step is None,
        quiet_passes=quiet_passes,
        reconcile_seconds=rt.settings.reconcile_seconds,
        steady_seconds=rt.settings.steady_reconcile_seconds,
        until_deadline=_until_verify_deadline(rt, step, key),
        jitter=random.random(),
        conflicted=conflicted,
    )


def _until_verify_deadline(
    rt: Runtime, step: RolloutStep | None, key: MdKey | None
) -> float | None:
    """Seconds until the target revision's verify deadline; None when no rollout waits on it."""
    if step is None or key is None or step.refusal is not None:
        return None
    if step.serving_revision == step.target_revision:
        return None
    spec = (rt.mds.get(key) or {}).get("spec") or {}
    timeout = (spec.get("rollout") or {}).get("verifyTimeoutSeconds")  # defaulted by the CRD
    if not isinstance(timeout, int | float):
        try:
            timeout = ModelDeploymentSpec.model_validate(spec).rollout.verify_timeout_seconds
        except ValidationError:
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
        await asyncio.gather(audit, return_exceptions=True)


async def _reconcile_until_stopped(
    rt: Runtime, reconciler: Reconciler, wake: Wake, stopped: Callable[[], bool]
) -> None:
    key = (reconciler.namespace, reconciler.name)
    quiet = 0  # timer passes in a row that no change woke
    while not stopped():
        try:
            async with rt.pass_slots():
                wake.clear()  # a change from here on calls for another pass
                step = await reconciler.reconcile()
        except Exception as exc:
            log.warning(
                "reconcile failed: %s", exc, extra={"namespace": key[0], "deployment": key[1]}
            )
            step = None
        # Debounce: our own writes come back as watch events; let them land together.
        await asyncio.sleep(MIN_PASS_SECONDS)
        woken = await sleep_until_woken(
            wake,
            next_interval(rt, step, quiet, key, conflicted=reconciler.conflicted)
            - MIN_PASS_SECONDS,
        )
        quiet = 0 if woken else quiet + 1
