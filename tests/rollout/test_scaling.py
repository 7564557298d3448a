"""Autoscaling per role, decided from plain data (kvgate.rollout.scaling, with the planner and
pass_decision): the counts, the RoleScale writes, and scale-down that drains before it removes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from factories.model_deployments import MD_UID, NOW, make_md, md_doc
from kvgate.admission.checks import check_document
from kvgate.api import labels
from kvgate.api.models import ModelDeployment, Role
from kvgate.api.revision import revision_of
from kvgate.rollout import pass_decision, scaling
from kvgate.rollout.lws_availability import LwsAccess
from kvgate.rollout.planner import (
    ObservedState,
    PodState,
    RolloutRecord,
    WorkloadIntent,
    WorkloadState,
    plan,
)
from kvgate.rollout.workload_writes import Create, Delete, Patch

AUTO = {"minReplicas": 1, "maxReplicas": 4, "drainTimeoutSeconds": 60}


def _md(decode: dict[str, Any] | None = None, **more: Any) -> ModelDeployment:
    return make_md(decode__autoscaling=decode or AUTO, **more)


def _pod(
    name: str,
    rev: str,
    *,
    verified: bool = True,
    ready: bool | None = None,
    age: int = 100,
    **more: Any,
) -> PodState:
    return PodState(
        name=name,
        revision=rev,
        role="decode",
        verified=verified,
        ready=verified if ready is None else ready,
        created=NOW - timedelta(seconds=age),
        kv_pool_tokens=200_000 if verified else None,
        **more,
    )


def _scale(replicas: int, *, mn: int = 1, mx: int = 4, uid: str = MD_UID) -> dict[str, Any]:
    return {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "RoleScale",
        "metadata": {
            "name": "llama-decode",
            "generation": 2,
            "ownerReferences": [
                {
                    "apiVersion": "kvgate.io/v1alpha1",
                    "kind": "ModelDeployment",
                    "name": "llama",
                    "uid": uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "replicas": replicas,
            "modelDeployment": "llama",
            "role": "decode",
            "minReplicas": mn,
            "maxReplicas": mx,
        },
    }


def _inputs(
    md: ModelDeployment,
    *,
    decode_replicas: int,
    pods: tuple[PodState, ...],
    scale: dict[str, Any] | None,
    loads: dict[str, scaling.EngineLoad | None] | None = None,
    extra_workloads: tuple[WorkloadState, ...] = (),
    target: str | None = None,
) -> pass_decision.PassInputs:
    rev = revision_of(md.spec)
    serving = rev if target is None else target
    workloads = (
        WorkloadState(serving, "prefill", 1, 1),
        WorkloadState(serving, "decode", decode_replicas, decode_replicas),
        WorkloadState(serving, labels.ROLE_ROUTER, 1, 1),
        *extra_workloads,
    )
    observed = ObservedState(
        spec=md.spec,
        target_revision=rev,
        workloads=workloads,
        pods=(PodState("p0", serving, "prefill", True, ready=True, kv_pool_tokens=9), *pods),
        service_revision=serving,
        now=NOW,
        recorded=RolloutRecord(target_revision=rev, serving_revision=serving),
    )
    return pass_decision.PassInputs(
        body=md_doc(decode__autoscaling=AUTO),
        md=md,
        observed=observed,
        deployments=(),
        service=None,
        lws_access=LwsAccess.SERVED,
        router_key="k" * 64,
        guard=None,
        access_current=None,
        secret_current=None,
        last_access=None,
        policies=pass_decision.PolicyInputs(),
        scales={Role.DECODE: scale},
        loads=loads or {},
    )


def _writes(decision: pass_decision.PassDecision) -> list[Any]:
    return [w for wave in decision.waves for w in wave]


def _decode_intent(decision: pass_decision.PassDecision, rev: str) -> WorkloadIntent:
    (intent,) = [
        w for w in decision.step.workloads if w.revision == rev and w.component == "decode"
    ]
    return intent


def _pod_patches(decision: pass_decision.PassDecision) -> dict[str, dict[str, Any]]:
    return {
        w.name: w.patch["metadata"]["annotations"]
        for w in _writes(decision)
        if isinstance(w, Patch) and w.kind == "Pod"
    }


# -- counts ----------------------------------------------------------------------------------


def test_role_scale_count_replaces_spec_replicas_for_the_serving_revision() -> None:
    md = _md()
    rev = revision_of(md.spec)
    pods = (_pod("d0", rev),)
    decision = pass_decision.decide(_inputs(md, decode_replicas=1, pods=pods, scale=_scale(3)))
    assert _decode_intent(decision, rev).replicas == 3  # the autoscaler's count, not spec's 1


def test_a_missing_role_scale_is_created_at_the_count_the_role_runs_now() -> None:
    md = _md()
    rev = revision_of(md.spec)
    pods = tuple(_pod(f"d{i}", rev) for i in range(3))
    decision = pass_decision.decide(_inputs(md, decode_replicas=3, pods=pods, scale=None))
    (create,) = [
        w for w in _writes(decision) if isinstance(w, Create) and w.body["kind"] == "RoleScale"
    ]
    assert create.body["kind"] == "RoleScale"
    assert create.body["metadata"]["name"] == "llama-decode"
    assert create.body["spec"] == {
        "modelDeployment": "llama",
        "role": "decode",
        "minReplicas": 1,
        "maxReplicas": 4,
        "replicas": 3,
    }
    assert create.body["metadata"]["ownerReferences"][0]["uid"] == MD_UID
    assert _decode_intent(decision, rev).replicas == 3  # turning autoscaling on changes nothing


def test_status_counts_only_verified_ready_engines_and_selects_the_serving_revision() -> None:
    md = _md()
    rev = revision_of(md.spec)
    pods = (_pod("d0", rev), _pod("d1", rev, verified=False, age=1))
    decision = pass_decision.decide(_inputs(md, decode_replicas=2, pods=pods, scale=_scale(2)))
    (status,) = [
        w.patch["status"]
        for w in _writes(decision)
        if isinstance(w, Patch) and w.kind == "RoleScale" and w.subresource == "status"
    ]
    assert status["replicas"] == 1
    assert status["effectiveReplicas"] == 2
    assert status["selector"] == (
        f"kvgate.io/deployment=llama,kvgate.io/role=decode,kvgate.io/revision in ({rev})"
    )


def test_new_bounds_put_on_the_role_scale_move_a_count_they_exclude() -> None:
    md = _md({"minReplicas": 2, "maxReplicas": 3})
    rev = revision_of(md.spec)
    pods = (_pod("d0", rev),)
    md2 = make_md(decode__autoscaling={"minReplicas": 2, "maxReplicas": 3}, decode__replicas=2)
    decision = pass_decision.decide(_inputs(md2, decode_replicas=1, pods=pods, scale=_scale(1)))
    (bounds,) = [
        w.patch["spec"]
        for w in _writes(decision)
        if isinstance(w, Patch) and w.kind == "RoleScale" and w.subresource is None
    ]
    assert bounds == {"minReplicas": 2, "maxReplicas": 3, "replicas": 2}
    assert _decode_intent(decision, rev).replicas == 2
    assert md.spec.decode.autoscaling is not None


def test_role_scale_of_a_role_no_longer_autoscaled_is_deleted() -> None:
    md = make_md()
    rev = revision_of(md.spec)
    decision = pass_decision.decide(
        _inputs(md, decode_replicas=1, pods=(_pod("d0", rev),), scale=_scale(3))
    )
    assert Delete("RoleScale", "llama-decode") in _writes(decision)
    assert _decode_intent(decision, rev).replicas == md.spec.decode.replicas


def test_someone_elses_role_scale_is_a_conflict_and_its_count_is_not_run() -> None:
    md = _md()
    rev = revision_of(md.spec)
    decision = pass_decision.decide(
        _inputs(md, decode_replicas=1, pods=(_pod("d0", rev),), scale=_scale(4, uid="other"))
    )
    assert [c.kind for c in decision.conflicts] == ["RoleScale"]
    assert _decode_intent(decision, rev).replicas == 1


def test_someone_elses_role_scale_is_reported_with_its_way_out() -> None:
    """Degraded says Conflict, names the RoleScale and says to delete it (which `edit` may)."""
    md = _md()
    rev = revision_of(md.spec)
    decision = pass_decision.decide(
        _inputs(md, decode_replicas=1, pods=(_pod("d0", rev),), scale=_scale(4, uid="other"))
    )
    outcome = pass_decision.conclude(decision, [])
    assert [c.kind for c in outcome.conflicts] == ["RoleScale"]
    degraded = next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "Conflict"
    assert "RoleScale llama-decode" in degraded["message"]
    assert "delete it and kvgate creates its own" in degraded["message"]


def test_a_role_scales_name_says_whose_it_is_whatever_its_labels() -> None:
    """The RoleScale watch wakes the ModelDeployment a RoleScale's name belongs to: the pass
    reads it by that name, and a name, unlike a label, never changes."""
    for md_name in ("llama", "llama-3-1-8b", "a-decode", "x"):
        for role in Role.PREFILL, Role.DECODE:
            assert scaling.scale_owner(scaling.scale_name(md_name, role)) == md_name
    for name in ("llama", "llama-router", "-decode", "llama-decode-0", "llama_prefill", ""):
        assert scaling.scale_owner(name) is None, name


def test_ratio_bounds_move_prefill_to_the_nearest_count_beside_decode() -> None:
    spec = make_md(
        prefill__autoscaling={"minReplicas": 1, "maxReplicas": 8},
        decode__autoscaling={"minReplicas": 1, "maxReplicas": 8},
        prefillPerDecode={"min": 0.5, "max": 1},
    ).spec
    counts = scaling.role_counts(spec, {Role.PREFILL: 1, Role.DECODE: 6})
    assert counts[Role.DECODE].effective == 6
    assert counts[Role.PREFILL].effective == 3
    assert "prefillPerDecode" in counts[Role.PREFILL].why
    assert counts[Role.PREFILL].requested == 1  # the RoleScale's count is kept as asked


# -- admission -------------------------------------------------------------------------------


def _denials(**spec: Any) -> list[str]:
    return [str(p) for p in check_document(md_doc(**spec)).denials]


def test_admission_denies_min_above_max_naming_both() -> None:
    (denial,) = _denials(decode__autoscaling={"minReplicas": 5, "maxReplicas": 2})
    assert "spec.decode.autoscaling" in denial and "5" in denial and "2" in denial


def test_admission_denies_replicas_outside_the_bounds() -> None:
    (denial,) = _denials(decode__autoscaling={"minReplicas": 2, "maxReplicas": 4})
    assert denial.startswith("spec.decode.replicas: 1 is outside spec.decode.autoscaling 2..4")


def test_admission_denies_max_above_the_crd_bound() -> None:
    (denial,) = _denials(decode__autoscaling={"minReplicas": 1, "maxReplicas": 5000})
    assert "spec.decode.autoscaling.maxReplicas" in denial and "1,024" in denial


def test_admission_denies_ratio_bounds_no_counts_satisfy() -> None:
    (denial,) = _denials(
        prefill__autoscaling={"minReplicas": 1, "maxReplicas": 2},
        decode__autoscaling={"minReplicas": 8, "maxReplicas": 10},
        decode__replicas=8,
        prefillPerDecode={"min": 0.5, "max": 1},
    )
    assert denial.startswith("spec.prefillPerDecode: spec.prefillPerDecode (min 0.5, max 1)")
    assert "1..2" in denial and "8..10" in denial


def test_admission_denies_autoscaling_a_multi_node_role() -> None:
    denials = _denials(
        decode__autoscaling={"minReplicas": 1, "maxReplicas": 2},
        decode__nodes=2,
        decode__tensorParallel=2,
    )
    assert any("multi-node role" in d and d.startswith("spec.decode.autoscaling") for d in denials)


def test_admission_allows_satisfiable_autoscaling() -> None:
    assert (
        _denials(
            prefill__autoscaling={"minReplicas": 1, "maxReplicas": 4},
            decode__autoscaling={"minReplicas": 1, "maxReplicas": 8},
            prefillPerDecode={"min": 0.25, "max": 1},
        )
        == []
    )


# -- scale-down drains first ------------------------------------------------------------------


def test_scale_down_takes_the_newest_verified_engine_out_of_traffic_and_keeps_the_replicas() -> (
    None
):
    md = _md()
    rev = revision_of(md.spec)
    pods = (_pod("old", rev, age=500), _pod("new", rev, age=10))
    decision = pass_decision.decide(_inputs(md, decode_replicas=2, pods=pods, scale=_scale(1)))
    assert _decode_intent(decision, rev).replicas == 2  # nothing removed yet
    patches = _pod_patches(decision)
    assert list(patches) == ["new"]
    assert patches["new"] == {labels.DRAINING_SINCE: "2026-11-05T12:00:00Z"}
    assert [e[1] for e in decision.drains.events] == ["ScalingDown"] if decision.drains else False


def test_the_planner_decides_the_count_written_while_an_engine_drains_and_nothing_rewrites_it() -> (
    None
):
    """The planner's step already holds what each Deployment runs this pass (the count a
    scale-down heads for beside it); the drains only mark pods and the controller only acts."""
    md = _md()
    rev = revision_of(md.spec)
    since = NOW - timedelta(seconds=10)
    pods = (_pod("old", rev), _pod("new", rev, draining_since=since, ready=False))
    planned = pass_decision.plan_step(_inputs(md, decode_replicas=2, pods=pods, scale=_scale(1)))
    assert planned.step == plan(planned.observed)
    intent = next(
        w for w in planned.step.workloads if w.revision == rev and w.component == "decode"
    )
    assert (intent.replicas, intent.scale_down_to) == (2, 1)  # 2 run until it drained


def test_a_draining_engine_with_requests_in_flight_is_kept() -> None:
    md = _md()
    rev = revision_of(md.spec)
    since = NOW - timedelta(seconds=10)
    pods = (_pod("old", rev), _pod("new", rev, draining_since=since, ready=False))
    busy = scaling.EngineLoad(running=2, queued=0, transfers=1)
    decision = pass_decision.decide(
        _inputs(md, decode_replicas=2, pods=pods, scale=_scale(1), loads={"new": busy})
    )
    assert _decode_intent(decision, rev).replicas == 2
    assert _pod_patches(decision) == {}
    assert decision.scales is not None
    message = decision.scales.statuses[Role.DECODE]["message"]
    assert "2 running, 0 queued, 1 in the KV transfer queues" in message


def test_an_idle_drained_engine_is_marked_then_removed_exactly() -> None:
    md = _md()
    rev = revision_of(md.spec)
    since = NOW - timedelta(seconds=5)
    draining = _pod("new", rev, draining_since=since)
    draining = PodState(**{**draining.__dict__, "verified": False, "ready": False})
    pods = (_pod("old", rev), draining)
    decision = pass_decision.decide(
        _inputs(
            md, decode_replicas=2, pods=pods, scale=_scale(1), loads={"new": scaling.EngineLoad()}
        )
    )
    assert _decode_intent(decision, rev).replicas == 2  # marked this pass, removed the next
    assert _pod_patches(decision)["new"] == {
        labels.DRAINED: "2026-11-05T12:00:00Z",
        labels.POD_DELETION_COST: str(-(2**31)),
    }
    assert decision.drains is not None
    (removal,) = decision.drains.removals
    assert (removal.pod, removal.timed_out, removal.seconds) == ("new", False, 5.0)
    # The next pass sees the mark: the Deployment loses exactly one replica.
    marked = PodState(**{**draining.__dict__, "drained": True})
    decision = pass_decision.decide(
        _inputs(md, decode_replicas=2, pods=(_pod("old", rev), marked), scale=_scale(1))
    )
    assert _decode_intent(decision, rev).replicas == 1


def test_an_engine_idle_at_once_is_not_drained_before_the_settle_time() -> None:
    md = _md()
    rev = revision_of(md.spec)
    since = NOW - timedelta(seconds=0.5)
    pods = (_pod("old", rev), _pod("new", rev, draining_since=since, ready=False))
    decision = pass_decision.decide(
        _inputs(
            md, decode_replicas=2, pods=pods, scale=_scale(1), loads={"new": scaling.EngineLoad()}
        )
    )
    assert _pod_patches(decision) == {}


def test_drain_timeout_removes_the_engine_and_warns_with_what_was_in_flight() -> None:
    md = _md()
    rev = revision_of(md.spec)
    since = NOW - timedelta(seconds=61)
    pods = (_pod("old", rev), _pod("new", rev, draining_since=since, ready=False))
    busy = scaling.EngineLoad(running=1)
    decision = pass_decision.decide(
        _inputs(md, decode_replicas=2, pods=pods, scale=_scale(1), loads={"new": busy})
    )
    assert labels.DRAINED in _pod_patches(decision)["new"]
    assert decision.drains is not None
    (event,) = decision.drains.events
    assert event[:2] == ("Warning", "DrainTimedOut")
    assert "1 running" in event[2] and "drainTimeoutSeconds 60" in event[2]


def test_unreadable_metrics_never_count_as_idle() -> None:
    md = _md()
    rev = revision_of(md.spec)
    since = NOW - timedelta(seconds=10)
    pods = (_pod("old", rev), _pod("new", rev, draining_since=since, ready=False))
    decision = pass_decision.decide(
        _inputs(md, decode_replicas=2, pods=pods, scale=_scale(1), loads={"new": None})
    )
    assert _pod_patches(decision) == {}


def test_an_unverified_engine_is_removed_first_without_a_drain() -> None:
    md = _md()
    rev = revision_of(md.spec)
    pods = (_pod("a", rev), _pod("b", rev), _pod("starting", rev, verified=False, age=500))
    decision = pass_decision.decide(_inputs(md, decode_replicas=3, pods=pods, scale=_scale(2)))
    assert _pod_patches(decision) == {
        "starting": {
            labels.DRAINED: "2026-11-05T12:00:00Z",
            labels.POD_DELETION_COST: str(-(2**31)),
        }
    }


def test_never_drains_below_min_verified() -> None:
    md = _md({"minReplicas": 2, "maxReplicas": 4})
    rev = revision_of(md.spec)
    # Three pods, one not verified: going to 2 removes the unverified one only.
    pods = (_pod("a", rev), _pod("b", rev), _pod("c", rev, verified=False))
    md2 = make_md(decode__autoscaling={"minReplicas": 2, "maxReplicas": 4}, decode__replicas=2)
    decision = pass_decision.decide(
        _inputs(md2, decode_replicas=3, pods=pods, scale=_scale(2, mn=2))
    )
    assert list(_pod_patches(decision)) == ["c"]
    assert md.spec.decode.autoscaling is not None


def test_a_count_raised_again_takes_a_draining_engine_back() -> None:
    md = _md()
    rev = revision_of(md.spec)
    since = NOW - timedelta(seconds=3)
    pods = (_pod("old", rev), _pod("new", rev, draining_since=since, ready=False))
    decision = pass_decision.decide(_inputs(md, decode_replicas=2, pods=pods, scale=_scale(2)))
    assert _pod_patches(decision) == {
        "new": {
            labels.DRAINING_SINCE: None,
            labels.DRAINED: None,
            labels.POD_DELETION_COST: None,
        }
    }
    assert decision.drains is not None
    assert [e[1] for e in decision.drains.events] == ["ScaleDownCancelled"]


def test_a_marked_engine_its_replica_set_is_removing_is_left_alone() -> None:
    md = _md()
    rev = revision_of(md.spec)
    leaving = _pod("new", rev, drained=True, verified=False)
    decision = pass_decision.decide(
        _inputs(md, decode_replicas=1, pods=(_pod("old", rev), leaving), scale=_scale(1))
    )
    assert _pod_patches(decision) == {}
    assert _decode_intent(decision, rev).replicas == 1


def test_a_refused_revision_is_scaled_to_zero_without_drains() -> None:
    md = _md()
    target = revision_of(md.spec)
    old = "0ld0ld0ld0"
    pods = (_pod("s0", old), _pod("t0", target), _pod("t1", target))
    inputs = _inputs(
        md,
        decode_replicas=1,
        pods=pods,
        scale=_scale(1),
        target=old,
        extra_workloads=(
            WorkloadState(
                target, "decode", 2, 2, refused_reason="EngineUnsafe", refused_message="x"
            ),
        ),
    )
    decision = pass_decision.decide(inputs)
    assert _decode_intent(decision, target).replicas == 0
    assert _pod_patches(decision) == {}


def test_during_a_rollout_the_serving_revision_follows_the_autoscaler() -> None:
    md = _md()
    target = revision_of(md.spec)
    old = "0ld0ld0ld0"
    decision = pass_decision.decide(
        _inputs(md, decode_replicas=1, pods=(_pod("s0", old),), scale=_scale(3), target=old)
    )
    assert _decode_intent(decision, old).replicas == 3
    assert _decode_intent(decision, target).replicas == 3  # the new revision starts there too


def test_load_is_read_from_every_rank_and_pd_queue() -> None:
    text = "\n".join(
        [
            "# TYPE sglang:num_running_reqs gauge",
            'sglang:num_running_reqs{tp_rank="0"} 1.0',
            'sglang:num_running_reqs{tp_rank="1"} 2.0',
            'sglang:num_queue_reqs{tp_rank="0"} 0.0',
            'sglang:num_decode_transfer_queue_reqs{tp_rank="0"} 1.0',
            'sglang:num_prefill_inflight_queue_reqs{tp_rank="0"} 2.0',
        ]
    )
    assert scaling.load_from_metrics(text) == scaling.EngineLoad(3, 0, 3)
    assert scaling.load_from_metrics("sglang:num_queue_reqs 0\n") is None
    assert scaling.load_from_metrics('sglang:num_running_reqs{a="b"} NaN\n') is None


def test_load_is_read_from_sglangs_live_load_snapshot_when_it_has_one() -> None:
    """SGLang 0.5.23's GET /v1/loads?include=core,disagg (every DP rank): its /metrics gauges
    can read 0 while a decode waits on a KV transfer with nothing to run; this snapshot cannot."""
    answer = {
        "timestamp": "2026-12-05T00:00:00+00:00",
        "version": "0.5.23",
        "loads": [
            {
                "dp_rank": 0,
                "num_running_reqs": 0,
                "num_waiting_reqs": 1,
                "disaggregation": {
                    "mode": "decode",
                    "prefill_bootstrap_queue_reqs": 0,
                    "prefill_inflight_queue_reqs": 0,
                    "decode_prealloc_queue_reqs": 0,
                    "decode_transfer_queue_reqs": 1,
                    "decode_retracted_queue_reqs": 0,
                    "kv_transfer_speed_gb_s": 1.5,
                    "kv_transfer_latency_ms": 3.0,
                },
            },
            {"dp_rank": 1, "num_running_reqs": 2, "num_waiting_reqs": 0},
        ],
    }
    assert scaling.load_from_loads(answer) == scaling.EngineLoad(2, 1, 1)
    assert not scaling.EngineLoad(2, 1, 1).idle
    assert scaling.load_from_loads({"loads": []}) is None
    assert scaling.load_from_loads({"detail": "Not Found"}) is None
    assert scaling.load_from_loads({"loads": [{"num_running_reqs": "0"}]}) is None


def test_a_draining_engine_is_read_again_within_a_second_even_in_steady_state() -> None:
    """The end of a request is no watch event: without a timer the drain waited for the steady
    resync (minutes) unless some other change woke the pass."""
    from types import SimpleNamespace

    from kvgate.controller.modeldeployment import next_interval

    rt: Any = SimpleNamespace(
        settings=SimpleNamespace(reconcile_seconds=5.0, steady_reconcile_seconds=300.0)
    )
    md = _md()
    rev = revision_of(md.spec)
    step = pass_decision.decide(
        _inputs(md, decode_replicas=1, pods=(_pod("d0", rev),), scale=_scale(1))
    ).step
    assert next_interval(rt, step) >= 240.0
    assert next_interval(rt, step, draining=True) == scaling.DRAIN_RECHECK_SECONDS
