"""One pass decided from what it read (kvgate.rollout.pass_decision, owned_objects): the writes
in order, the ownership conflicts and the status they lead to, with no API server."""

from __future__ import annotations

import copy
import dataclasses
from datetime import timedelta
from typing import Any

from factories.model_deployments import MD_UID, NOW, make_md, md_doc
from kvgate.api.content_types import MERGE_PATCH
from kvgate.api.labels import ROLE_ROUTER
from kvgate.api.models import ModelDeployment
from kvgate.api.ownership import CONFLICT, OwnershipConflict
from kvgate.api.revision import revision_of
from kvgate.objects import builders, network_policy
from kvgate.rollout import owned_objects, pass_decision
from kvgate.rollout.access_checks import AccessCheck
from kvgate.rollout.lws_availability import LwsAccess
from kvgate.rollout.planner import ObservedState, Refusal, RolloutRecord, WorkloadState
from kvgate.rollout.workload_writes import Create, Delete, Patch

KEY = "k" * 64


def _foreign(body: dict[str, Any]) -> dict[str, Any]:
    taken = copy.deepcopy(body)
    taken["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "theirs", "uid": "u2"}
    ]
    taken["metadata"]["ownerReferences"][0]["controller"] = True
    return taken


def _inputs(
    md: ModelDeployment | None = None,
    *,
    access: dict[str, dict[str, Any] | None] | None = None,
    secret: dict[str, Any] | None = None,
    last: AccessCheck | None = None,
    policies: pass_decision.PolicyInputs | None = None,
) -> pass_decision.PassInputs:
    md = md or make_md()
    observed = ObservedState(
        spec=md.spec,
        target_revision=revision_of(md.spec),
        workloads=(),
        pods=(),
        service_revision=None,
        now=NOW,
        recorded=RolloutRecord(),
    )
    return pass_decision.PassInputs(
        body=md_doc(),
        md=md,
        observed=observed,
        deployments=(),
        service=None,
        lws_access=LwsAccess.SERVED,
        router_key=KEY,
        guard=None,
        access_current=access,
        secret_current=secret,
        last_access=last,
        policies=policies or pass_decision.PolicyInputs(),
    )


def _names(wave: tuple[Any, ...]) -> list[tuple[str, str]]:
    out = []
    for write in wave:
        if isinstance(write, Create):
            out.append((type(write).__name__, write.body["kind"]))
        else:
            out.append((type(write).__name__, write.kind))
    return out


def test_a_missing_object_is_created_and_an_unchanged_one_gets_no_write() -> None:
    desired = builders.router_role(make_md())
    assert owned_objects.ensure(desired, None, MD_UID).writes == (Create(desired),)
    as_served = copy.deepcopy(desired)
    as_served["metadata"]["resourceVersion"] = "7"  # what the API server adds around it
    assert owned_objects.ensure(desired, as_served, MD_UID) == owned_objects.Ensured()


def test_an_edited_object_is_patched_back_and_the_patch_says_why() -> None:
    desired = builders.router_role(make_md())
    edited = copy.deepcopy(desired)
    edited["rules"] = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
    (write,) = owned_objects.ensure(desired, edited, MD_UID).writes
    assert isinstance(write, Patch) and write.content_type == MERGE_PATCH
    assert write.patch == {"rules": desired["rules"]}
    assert write.note is not None and "(rules)" in write.note


def test_a_binding_to_another_role_is_deleted_then_created() -> None:
    desired = builders.router_role_binding(make_md())
    moved = copy.deepcopy(desired)
    moved["roleRef"] = {**desired["roleRef"], "name": "cluster-admin"}
    writes = owned_objects.ensure(desired, moved, MD_UID).writes
    assert [type(w) for w in writes] == [Delete, Create]


def test_someone_elses_object_is_a_conflict_and_never_written() -> None:
    desired = builders.router_service_account(make_md())
    ensured = owned_objects.ensure(desired, _foreign(desired), MD_UID)
    assert ensured.writes == ()
    assert ensured.conflict is not None and ensured.conflict.controller == "Deployment/theirs"


def test_the_role_binding_is_written_after_its_role_and_the_routers_after_both() -> None:
    decision = pass_decision.decide(_inputs(access={}))
    waves = [_names(w) for w in decision.waves]
    assert waves[0] == [("Create", "ServiceAccount"), ("Create", "Role"), ("Create", "Secret")]
    assert waves[1] == [("Create", "RoleBinding")]
    assert ("Create", "Deployment") in waves[2]


def test_without_the_access_check_only_the_key_secret_is_ensured() -> None:
    decision = pass_decision.decide(_inputs(access=None))
    kinds = {kind for wave in decision.waves for _, kind in _names(wave)}
    assert "Secret" in kinds and not kinds & {"ServiceAccount", "Role", "RoleBinding"}


def test_someone_elses_key_secret_holds_every_router_at_zero_and_stops_serving() -> None:
    md = make_md()
    secret = _foreign(builders.router_control_secret(md, KEY))
    decision = pass_decision.decide(_inputs(md, access={}, secret=secret))
    (conflict,) = decision.conflicts
    assert conflict.kind == "Secret" and conflict.stops_serving
    assert conflict.consequence == pass_decision.SECRET_CONSEQUENCE
    routers = [
        w.body
        for wave in decision.waves
        for w in wave
        if isinstance(w, Create)
        and w.body["metadata"]["labels"].get("kvgate.io/role") == ROLE_ROUTER
    ]
    assert routers and all(r["spec"]["replicas"] == 0 for r in routers)


def test_conflicts_are_reported_access_secret_written_then_policies() -> None:
    md = make_md()
    decision = pass_decision.decide(_inputs(md, access={}))
    late = [
        OwnershipConflict("NetworkPolicy", "p", None),
        OwnershipConflict("Deployment", "d", None),
        OwnershipConflict("Secret", "s", None),
        OwnershipConflict("Role", "r", None),
    ]
    outcome = pass_decision.conclude(decision, late)
    assert [c.kind for c in outcome.conflicts] == ["Role", "Secret", "Deployment", "NetworkPolicy"]
    secret = outcome.conflicts[1]
    assert secret.stops_serving and secret.consequence == pass_decision.SECRET_CONSEQUENCE
    assert outcome.access_conflicts == (late[3],)
    assert outcome.policy_conflicts == (late[0],)
    (event,) = [e for e in outcome.events if e.reason == CONFLICT]
    assert event.message.index("Role r") < event.message.index("NetworkPolicy p")
    assert CONFLICT in {c.get("reason") for c in outcome.status["conditions"]}


def test_a_pass_that_did_not_read_keeps_the_last_checks_findings() -> None:
    last = AccessCheck(
        frozenset(),
        0.0,
        (OwnershipConflict("Role", "r", None),),
        (OwnershipConflict("NetworkPolicy", "p", None),),
    )
    outcome = pass_decision.conclude(pass_decision.decide(_inputs(last=last)), [])
    assert outcome.access_conflicts == last.access_conflicts
    assert outcome.policy_conflicts == last.policy_conflicts


def test_turned_off_policies_read_this_pass_are_deleted_only_when_they_are_the_mds() -> None:
    md = make_md()
    rev = revision_of(md.spec)
    own, theirs, *_ = network_policy.policy_names("llama", rev, router_egress=True)
    built = network_policy.network_policies(
        md, rev, operator_namespace="kvgate", operator_pod_labels={"app": "kvgate"}
    )
    current = {own: built[0], theirs: _foreign(built[1])}
    policies = pass_decision.PolicyInputs(current=current, read=True)
    decision = pass_decision.decide(_inputs(md, policies=policies))
    deletes = [w for wave in decision.waves for w in wave if isinstance(w, Delete)]
    assert deletes == [Delete("NetworkPolicy", own)]


def test_the_targets_refusal_is_recorded_in_status_refusals_once_with_its_time() -> None:
    """kvgate's own record of refusals (kvgate history lists it; it needs no Event)."""
    md = make_md()
    target = revision_of(md.spec)
    refusal = Refusal(target, "VerificationTimeout", "not verified within 900 s")
    inputs = _inputs(md)
    observed = dataclasses.replace(
        inputs.observed,
        # The refused revision's Deployments still exist: its refusal stands.
        workloads=tuple(
            WorkloadState(target, role, 1, 0, verify_started_at=NOW)
            for role in ("prefill", "decode", "router")
        ),
        recorded=RolloutRecord(target_revision=target, verify_started_at=NOW, refusal=refusal),
    )
    status = pass_decision.decide(dataclasses.replace(inputs, observed=observed)).status
    assert status["refusals"] == [
        {
            "revision": target,
            "reason": "VerificationTimeout",
            "message": "not verified within 900 s",
            "refusedAt": NOW.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    ]
    later = dataclasses.replace(
        inputs,
        observed=dataclasses.replace(observed, now=NOW + timedelta(minutes=5)),
        body={**inputs.body, "status": {"refusals": status["refusals"]}},
    )
    assert pass_decision.decide(later).status["refusals"] == status["refusals"]
    nothing = pass_decision.decide(inputs).status
    assert nothing["refusals"] == []


def _serving(
    inputs: pass_decision.PassInputs, *, service: dict[str, Any], foreign: bool = False
) -> pass_decision.PassDecision:
    """The pass of a ModelDeployment whose revision serves (recorded, its Deployments up)."""
    target = inputs.observed.target_revision
    observed = dataclasses.replace(
        inputs.observed,
        workloads=tuple(
            WorkloadState(target, role, 1, 1, verify_started_at=NOW)
            for role in ("prefill", "decode", "router")
        ),
        service_revision=target,
        service_foreign=foreign,
        recorded=RolloutRecord(
            target_revision=target, serving_revision=target, verify_started_at=NOW
        ),
    )
    return pass_decision.decide(dataclasses.replace(inputs, observed=observed, service=service))


def test_the_status_names_the_services_in_cluster_url_once_a_revision_serves() -> None:
    md = make_md(router__port=8080)
    inputs = _inputs(md)
    # Nothing serves yet: no Service, no URL (null, so a merge patch removes an old one).
    assert "url" in pass_decision.decide(inputs).status
    assert pass_decision.decide(inputs).status["url"] is None
    own = builders.service(md, inputs.observed.target_revision)
    status = _serving(inputs, service=own).status
    assert status["url"] == "http://llama.models.svc:8080"


def test_a_service_kvgate_does_not_own_is_never_given_as_the_url() -> None:
    md = make_md()
    inputs = _inputs(md)
    theirs = _foreign(builders.service(md, inputs.observed.target_revision))
    decision = _serving(inputs, service=theirs, foreign=True)
    assert any(c.kind == "Service" for c in decision.conflicts)
    assert decision.status["url"] is None
    # A Service someone else created between the read and kvgate's create: no URL either.
    md_name = md.metadata.name or ""
    own = _serving(inputs, service=builders.service(md, inputs.observed.target_revision))
    late = pass_decision.conclude(own, [OwnershipConflict("Service", md_name, None)])
    assert pass_decision.conclude(own, []).status["url"] == builders.service_url(md)
    assert late.status["url"] is None


def _defences(md: ModelDeployment, role: str) -> dict[str, dict[str, Any]]:
    status = pass_decision.decide(_inputs(md)).status
    return {d["name"]: d for d in status[role]["engineDefences"]}


def test_the_status_says_each_engine_defence_is_on_where_the_release_has_it() -> None:
    for role in ("prefill", "decode"):
        defences = _defences(make_md(engine__image="lmsysorg/sglang:v0.5.23"), role)
        assert {name: d["enabled"] for name, d in defences.items()} == {
            "kvChecksum": True,
            "deferredDecodeKvRelease": True,
        }


def test_a_release_without_kv_checksums_is_reported_off_with_the_release_that_has_them() -> None:
    checksum = _defences(make_md(engine__image="lmsysorg/sglang:v0.5.20"), "decode")["kvChecksum"]
    assert checksum["enabled"] is False
    assert "SGLang 0.5.20" in checksum["message"]
    assert "0.5.21" in checksum["message"] and "engine.image" in checksum["message"]


def test_a_defence_turned_off_in_the_spec_is_reported_off_naming_the_field() -> None:
    md = make_md(safety__kvChecksum=False, safety__deferredDecodeKvRelease=False)
    defences = _defences(md, "prefill")
    assert defences["kvChecksum"]["enabled"] is False
    assert "spec.safety.kvChecksum is false" in defences["kvChecksum"]["message"]
    assert defences["deferredDecodeKvRelease"]["enabled"] is False
    assert "spec.safety.deferredDecodeKvRelease" in defences["deferredDecodeKvRelease"]["message"]
