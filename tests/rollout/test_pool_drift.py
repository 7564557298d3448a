"""The admission estimate against the live pools (kvgate.rollout.pool_drift): per role, the
drift of every verified engine, the worst, the reserve that explains it, the status a user reads
and the Warning Event on the transition into "optimistic" only."""

from __future__ import annotations

from typing import Any

import pytest
from factories.model_deployments import NOW, make_md, md_doc
from kvgate.admission.checks import estimated_role_pool
from kvgate.admission.policy import ClusterPolicy
from kvgate.api.models import ModelDeployment, ModelDeploymentStatus
from kvgate.api.revision import revision_of
from kvgate.controller.runtime import Runtime
from kvgate.kube import metrics
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.settings import OperatorSettings
from kvgate.rollout import pass_decision, pool_drift
from kvgate.rollout.lws_availability import LwsAccess
from kvgate.rollout.planner import ObservedState, PodState, RolloutRecord

# The sample (Llama 3.1 8B, 80 GiB, memFractionStatic 0.85, 15 GiB of weights, 128 KiB a token):
# ((80 − 1) × 0.85 − 15) GiB / 131,072 B = 427,212 tokens with kvgate's 1 GiB assumption.
ESTIMATE = 427_212
H100 = "NVIDIA-H100-80GB-HBM3"


def pod(
    name: str, role: str, pool: int | None, *, verified: bool = True, rev: str = ""
) -> PodState:
    return PodState(name, rev or revision_of(make_md().spec), role, verified, kv_pool_tokens=pool)


def drift_of(
    pods: list[PodState],
    policy: pool_drift.EstimatePolicy | None = None,
    md: ModelDeployment | None = None,
) -> pool_drift.RoleDrift:
    md = md or make_md()
    found = pool_drift.role_drift(md.spec, "decode", pods, policy or pool_drift.EstimatePolicy())
    assert found is not None
    return found


def test_a_live_pool_over_ten_percent_below_the_estimate_is_optimistic_and_names_the_reserve() -> (
    None
):
    drift = drift_of([pod("d-1", "decode", 380_000), pod("d-2", "decode", 420_000)])
    assert drift.estimated_tokens == ESTIMATE
    assert [p.pod for p in drift.pods] == ["d-1", "d-2"]  # the worst first
    assert drift.worst is not None
    assert drift.worst.drift_percent == pytest.approx((380_000 - ESTIMATE) / ESTIMATE * 100)
    assert drift.optimistic
    message = drift.message()
    assert (
        "decode: estimated KV pool 427,212 tokens (gpuReservedGiB 1 from kvgate's assumption"
        in message
    )
    assert "the smallest live pool is 380,000 tokens (pod d-1), -11.1%" in message
    assert "more than 10% below the estimate" in message
    assert (
        "estimator.gpuReservedGiBByProduct" in message and "spec.decode.gpuReservedGiB" in message
    )


def test_the_implied_reserve_makes_the_estimate_equal_the_live_pool() -> None:
    drift = drift_of([pod("d-1", "decode", 380_000)])
    assert drift.implied_reserve_gib is not None
    assert f"about {drift.implied_reserve_gib:.2f} GiB per GPU" in drift.message()
    md = make_md(decode__gpuReservedGiB=drift.implied_reserve_gib)
    found = estimated_role_pool(md.spec, "decode", ClusterPolicy())
    assert found is not None
    assert abs(found[0].kv_pool_tokens - 380_000) <= 1


@pytest.mark.parametrize("live", [ESTIMATE, 400_000, ESTIMATE + 10_000, 500_000])
def test_a_live_pool_within_the_threshold_or_above_the_estimate_is_not_optimistic(
    live: int,
) -> None:
    drift = drift_of([pod("d-1", "decode", live)])
    assert not drift.optimistic
    assert drift.implied_reserve_gib is not None or live > ESTIMATE
    assert "within 10% of the estimate" in drift.message()


def test_the_threshold_is_the_operators_setting() -> None:
    live = [pod("d-1", "decode", 400_000)]  # -6.4 %
    assert not drift_of(live).optimistic
    assert drift_of(live, pool_drift.EstimatePolicy(optimistic_drift_percent=5)).optimistic


def test_only_verified_live_pods_of_the_role_count() -> None:
    pods = [
        pod("p-1", "prefill", 100_000),
        pod("d-unverified", "decode", 100_000, verified=False),
        PodState(
            "d-going",
            revision_of(make_md().spec),
            "decode",
            True,
            terminating=True,
            kv_pool_tokens=1,
        ),
        pod("d-1", "decode", ESTIMATE),
    ]
    drift = drift_of(pods)
    assert [p.pod for p in drift.pods] == ["d-1"] and not drift.optimistic


def test_the_measured_reserve_of_the_roles_gpu_product_is_the_estimate_compared() -> None:
    md = make_md(decode__nodeSelector={"nvidia.com/gpu.product": H100})
    policy = pool_drift.EstimatePolicy(reserves_by_product={H100: 7.5})
    drift = drift_of([pod("d-1", "decode", 380_000)], policy, md)
    assert drift.reserve.gib == 7.5
    assert "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" in drift.reserve.source
    assert drift.estimated_tokens < 380_000 * 1.1 and not drift.optimistic


def test_a_spec_without_an_estimate_has_no_pool_estimate() -> None:
    doc = md_doc()
    del doc["spec"]["decode"]["gpuMemoryGiB"]
    md = ModelDeployment.model_validate(doc)
    assert pool_drift.role_drift(md.spec, "decode", [], pool_drift.EstimatePolicy()) is None
    assert pool_drift.drift_status(None, False) is None


def _pass(
    pods: list[PodState], previous_status: dict[str, Any] | None = None
) -> pass_decision.PassOutcome:
    md = make_md()
    body = md_doc()
    if previous_status is not None:
        body["status"] = previous_status
    observed = ObservedState(
        spec=md.spec,
        target_revision=revision_of(md.spec),
        workloads=(),
        pods=tuple(pods),
        service_revision=None,
        now=NOW,
        recorded=RolloutRecord(),
    )
    inputs = pass_decision.PassInputs(
        body=body,
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
    )
    return pass_decision.conclude(pass_decision.decide(inputs), ())


def test_the_status_shows_each_roles_drift_and_validates_against_the_api() -> None:
    outcome = _pass([pod("p-1", "prefill", ESTIMATE + 7_000), pod("d-1", "decode", 380_000)])
    status = outcome.status
    ModelDeploymentStatus.model_validate(status)
    decode = status["decode"]["poolEstimate"]
    assert decode["estimatedKvPoolTokens"] == ESTIMATE
    assert decode["gpuReservedGiB"] == 1.0
    assert decode["driftPercent"] == -11.1 and decode["optimistic"] is True
    assert decode["pods"] == [{"pod": "d-1", "liveKvPoolTokens": 380_000, "driftPercent": -11.1}]
    prefill = status["prefill"]["poolEstimate"]
    assert prefill["driftPercent"] == 1.6 and prefill["optimistic"] is False


def test_a_warning_event_marks_the_turn_to_optimistic_once_and_only_for_that_role() -> None:
    pods = [pod("p-1", "prefill", ESTIMATE), pod("d-1", "decode", 380_000)]
    first = _pass(pods)
    warnings = [e for e in first.events if e.reason == pool_drift.EVENT_REASON]
    assert len(warnings) == 1 and warnings[0].type == "Warning"
    assert warnings[0].message.startswith(f"revision {revision_of(make_md().spec)}: decode: ")
    assert "-11.1%" in warnings[0].message
    again = _pass(pods, first.status)
    assert not [e for e in again.events if e.reason == pool_drift.EVENT_REASON]


def test_a_restart_without_verified_pods_keeps_the_judgement_and_posts_nothing() -> None:
    first = _pass([pod("d-1", "decode", 380_000)])
    restarting = _pass([pod("d-1", "decode", None, verified=False)], first.status)
    assert restarting.status["decode"]["poolEstimate"]["optimistic"] is True
    assert restarting.status["decode"]["poolEstimate"]["pods"] == []
    back = _pass([pod("d-2", "decode", 380_000)], restarting.status)
    assert not [e for e in back.events if e.reason == pool_drift.EVENT_REASON]


def _series(name: str, ns: str, md: str) -> dict[str, float]:
    """The values of a per-role gauge of one ModelDeployment, by role."""
    return {
        sample.labels["role"]: sample.value
        for family in metrics.REGISTRY.collect()
        for sample in family.samples
        if sample.name == name
        and sample.labels.get("namespace") == ns
        and sample.labels.get("deployment") == md
    }


def test_the_drift_metrics_follow_the_status_and_go_with_the_model_deployment() -> None:
    outcome = _pass([pod("p-1", "prefill", ESTIMATE), pod("d-1", "decode", 380_000)])
    metrics.record_pool_estimates("drift-ns", "gone", outcome.status)
    ratios = _series("kvgate_kv_pool_estimate_drift_ratio", "drift-ns", "gone")
    assert ratios == {"prefill": 0.0, "decode": pytest.approx(-0.111)}
    assert _series("kvgate_kv_pool_estimated_tokens", "drift-ns", "gone") == {
        "prefill": ESTIMATE,
        "decode": ESTIMATE,
    }
    rt = Runtime(
        api=KubeApi(Credentials(server="http://127.0.0.1:9")),
        settings=OperatorSettings(),
        verify=None,  # type: ignore[arg-type]
    )
    rt.forget_md(("drift-ns", "gone"))  # the ModelDeployment was deleted
    assert _series("kvgate_kv_pool_estimate_drift_ratio", "drift-ns", "gone") == {}
    assert _series("kvgate_kv_pool_estimated_tokens", "drift-ns", "gone") == {}


def test_the_serving_revisions_drift_stays_reported_while_the_target_is_refused() -> None:
    """A refused target has no verified engine (its pods are unverified or scaled to zero); the
    serving revision's engines still serve, so their drift stays in the status and the gauge,
    named as the serving revision's, until a target engine is verified."""
    import dataclasses

    from kvgate.rollout.planner import Refusal, WorkloadState

    old_doc = md_doc()
    old = revision_of(make_md().spec)
    md = make_md(model__contextLength=65_536)  # the new spec: another revision, refused
    target = revision_of(md.spec)
    assert target != old
    body = md_doc(model__contextLength=65_536)
    body["status"] = {
        "targetRevision": target,
        "servingRevision": old,
        "history": [{"revision": old, "servedAt": "2026-01-01T00:00:00Z", "spec": old_doc["spec"]}],
    }
    refusal = Refusal(target, "VerificationTimeout", "not verified within 900 s")
    observed = ObservedState(
        spec=md.spec,
        target_revision=target,
        workloads=(
            *(WorkloadState(old, c, 1, 1, verify_started_at=NOW) for c in ("prefill", "decode")),
            WorkloadState(old, "router", 1, 1, verify_started_at=NOW),
            *(
                WorkloadState(target, c, 0, 0, verify_started_at=NOW, refused_reason="x")
                for c in ("prefill", "decode", "router")
            ),
        ),
        pods=(
            pod("p-old", "prefill", ESTIMATE, rev=old),
            pod("d-old", "decode", 380_000, rev=old),
            pod("d-new", "decode", None, verified=False, rev=target),
        ),
        service_revision=old,
        now=NOW,
        recorded=RolloutRecord(
            target_revision=target,
            serving_revision=old,
            verify_started_at=NOW,
            refusal=refusal,
        ),
    )
    inputs = pass_decision.PassInputs(
        body=body,
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
    )
    outcome = pass_decision.conclude(pass_decision.decide(inputs), ())
    assert outcome.status.get("servingRevision") == old, outcome.status.get("servingRevision")
    decode = outcome.status["decode"]["poolEstimate"]
    assert decode["driftPercent"] == -11.1, decode
    assert decode["pods"] == [{"pod": "d-old", "liveKvPoolTokens": 380_000, "driftPercent": -11.1}]
    assert decode["message"].startswith(f"revision {old} (serving; target revision {target} "), (
        decode["message"]
    )
    ModelDeploymentStatus.model_validate(outcome.status)
    warnings = [e for e in outcome.events if e.reason == pool_drift.EVENT_REASON]
    assert [w.message.split(":")[0] for w in warnings] == [
        f"revision {old} (serving; target revision {target} has no verified decode engine)"
    ]
    metrics.record_pool_estimates("drift-ns", "refused", outcome.status)
    ratios = _series("kvgate_kv_pool_estimate_drift_ratio", "drift-ns", "refused")
    assert ratios == {"prefill": 0.0, "decode": pytest.approx(-0.111)}
    # Once a target engine is verified, the target's own drift is the one reported.
    verified = dataclasses.replace(
        observed, pods=(*observed.pods[:2], pod("d-new", "decode", 300_000, rev=target))
    )
    later = pass_decision.decide(dataclasses.replace(inputs, observed=verified)).status
    assert later["decode"]["poolEstimate"]["pods"][0]["pod"] == "d-new"
    assert later["decode"]["poolEstimate"]["message"].startswith(f"revision {target}: decode: ")
