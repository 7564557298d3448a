"""Planned writes of a rollout step, table-tested: the step and what exists in, the writes out.
Patches are applied here as the API server applies them (RFC 7386 merge patch, RFC 6902 JSON
patch) and the result compared with what the operator builds."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import jsonpatch  # type: ignore[import-untyped]
import pytest
from factories.model_deployments import NOW, make_md
from kvgate.api import labels
from kvgate.objects import builders
from kvgate.rollout.planner import Refusal, RolloutStep, WorkloadIntent
from kvgate.rollout.workload_writes import (
    BuildInputs,
    Create,
    Delete,
    Patch,
    PlannedWrite,
    revision_writes,
    service_writes,
)

MD = make_md()
OLD, NEW = "aaaaaaaaaa", "bbbbbbbbbb"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
REFUSAL = Refusal(NEW, "EngineUnsafe", "decode pod reports KV pool 681,280 tokens < 1,048,576")


def step(**changes: Any) -> RolloutStep:
    base = RolloutStep(
        target_revision=NEW,
        serving_revision=None,
        previous_serving_revision=None,
        workloads=(WorkloadIntent(NEW, "decode", 1),),
        delete_revisions=(),
        service_revision=None,
        refusal=None,
        new_refusal=False,
        verify_started_at=NOW,
    )
    return replace(base, **changes)


def built(revision: str = NEW, component: str = "decode", replicas: int = 1) -> dict[str, Any]:
    return builders.deployment(MD, revision, component, replicas=replicas)


def name(revision: str = NEW, component: str = "decode") -> str:
    return builders.component_name("llama", revision, component)


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies application/merge-patch+json."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


def applied(current: dict[str, Any], writes: list[PlannedWrite]) -> dict[str, Any]:
    for write in writes:
        assert isinstance(write, Patch), write
        if write.content_type == JSON_PATCH:
            current = jsonpatch.apply_patch(current, write.patch)
        else:
            assert write.content_type == MERGE_PATCH
            current = merge(current, write.patch)
    return current


def older_build() -> dict[str, Any]:
    """The decode Deployment as an older kvgate built it: keys this builder no longer writes,
    in maps (a merge patch cannot remove those) and in lists, and that build's hash."""
    old = built()
    template = old["spec"]["template"]
    template["metadata"].setdefault("annotations", {})["kvgate.io/dropped"] = "yes"
    template["spec"]["nodeSelector"] = {"kvgate.io/dropped": "yes"}
    template["spec"]["containers"][0]["env"] = [{"name": "DROPPED", "value": "1"}]
    old["metadata"]["annotations"][labels.TEMPLATE_HASH] = builders.template_hash(template)
    return old


def test_a_missing_target_deployment_is_created_with_its_start_and_refusal_notes() -> None:
    (write,) = revision_writes(MD, step(refusal=REFUSAL, new_refusal=True), {}, BuildInputs())
    assert isinstance(write, Create)
    assert write.body["metadata"]["name"] == name()
    assert write.body["metadata"]["annotations"] == {
        labels.TEMPLATE_HASH: built()["metadata"]["annotations"][labels.TEMPLATE_HASH],
        labels.VERIFY_STARTED_AT: "2026-11-05T12:00:00Z",
        labels.REFUSED_REASON: "EngineUnsafe",
        labels.REFUSED_MESSAGE: REFUSAL.message,
    }
    assert write.body["spec"] == built()["spec"]


def test_a_lost_router_of_the_serving_revision_is_created_without_the_targets_notes() -> None:
    writes = revision_writes(
        MD,
        step(workloads=(WorkloadIntent(OLD, "router", 1),), refusal=REFUSAL, new_refusal=True),
        {},
        BuildInputs(),
    )
    (write,) = writes
    assert isinstance(write, Create)
    assert write.body["metadata"]["annotations"] == built(OLD, "router")["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("case", "the_step", "current", "expected"),
    [
        ("as built: nothing", step(), built(), []),
        (
            "scaled away: scaled back",
            step(workloads=(WorkloadIntent(NEW, "decode", 3),)),
            built(),
            [Patch("Deployment", name(), {"spec": {"replicas": 3}}, MERGE_PATCH)],
        ),
        (
            "new refusal: noted and scaled to 0 in one write",
            step(workloads=(WorkloadIntent(NEW, "decode", 0),), refusal=REFUSAL, new_refusal=True),
            built(),
            [
                Patch(
                    "Deployment",
                    name(),
                    {
                        "spec": {"replicas": 0},
                        "metadata": {
                            "annotations": {
                                labels.REFUSED_REASON: "EngineUnsafe",
                                labels.REFUSED_MESSAGE: REFUSAL.message,
                            }
                        },
                    },
                    MERGE_PATCH,
                )
            ],
        ),
        (
            "standing refusal whose notes were stripped: not re-noted (status is the record)",
            step(workloads=(WorkloadIntent(NEW, "decode", 0),), refusal=REFUSAL),
            built(replicas=0),
            [],
        ),
    ],
)
def test_an_existing_deployment_gets_only_the_writes_it_lacks(
    case: str, the_step: RolloutStep, current: dict[str, Any], expected: list[PlannedWrite]
) -> None:
    assert revision_writes(MD, the_step, {name(): current}, BuildInputs()) == expected, case


def test_template_drift_converges_keys_a_newer_builder_dropped_are_removed() -> None:
    current = older_build()
    writes = revision_writes(MD, step(), {name(): current}, BuildInputs())
    (write,) = writes
    assert isinstance(write, Patch) and write.content_type == JSON_PATCH
    after = applied(current, writes)
    assert after["spec"]["template"] == built()["spec"]["template"]
    assert after["metadata"]["annotations"] == built()["metadata"]["annotations"]
    # Converged: the next pass writes nothing.
    assert revision_writes(MD, step(), {name(): after}, BuildInputs()) == []


def test_template_drift_with_every_annotation_stripped_still_records_the_hash() -> None:
    current = older_build()
    del current["metadata"]["annotations"]
    writes = revision_writes(MD, step(), {name(): current}, BuildInputs())
    after = applied(current, writes)
    assert after["spec"]["template"] == built()["spec"]["template"]
    assert after["metadata"]["annotations"] == built()["metadata"]["annotations"]


def test_scale_and_template_drift_on_one_pass_both_land() -> None:
    current = older_build()
    the_step = step(workloads=(WorkloadIntent(NEW, "decode", 2),))
    after = applied(current, revision_writes(MD, the_step, {name(): current}, BuildInputs()))
    assert after["spec"] == built(replicas=2)["spec"]


def test_a_guard_image_change_alone_replaces_no_template() -> None:
    v1 = builders.Guard("ghcr.io/kvgate/kvgate-operator:0.1.0", None)
    v2 = builders.Guard("ghcr.io/kvgate/kvgate-operator:0.2.0", None)
    current = builders.deployment(MD, NEW, "decode", replicas=1, guard=v1)
    assert revision_writes(MD, step(), {name(): current}, BuildInputs(guard=v2)) == []


def test_retired_revisions_delete_only_their_deployments_that_exist() -> None:
    existing = {name(OLD, "decode"): built(OLD), name(OLD, "router"): built(OLD, "router")}
    writes = revision_writes(
        MD, step(workloads=(), delete_revisions=(OLD,)), existing, BuildInputs()
    )
    assert writes == [
        Delete("Deployment", name(OLD, "decode")),
        Delete("Deployment", name(OLD, "router")),
    ]


SERVICE_NEW = builders.service(MD, NEW)
SERVICE_OLD = builders.service(MD, OLD)


@pytest.mark.parametrize(
    ("case", "current", "desired", "foreign", "expected"),
    [
        ("missing: created", None, SERVICE_NEW, False, [Create(SERVICE_NEW, owned=False)]),
        ("selects the revision: nothing", SERVICE_NEW, SERVICE_NEW, False, []),
        (
            "selects another revision: re-pointed",
            SERVICE_OLD,
            SERVICE_NEW,
            False,
            [
                Patch(
                    "Service",
                    "llama",
                    {"spec": {"selector": SERVICE_NEW["spec"]["selector"]}},
                    MERGE_PATCH,
                )
            ],
        ),
        ("someone else's: never touched", SERVICE_OLD, SERVICE_NEW, True, []),
        ("nothing serves yet: nothing", None, None, False, []),
    ],
)
def test_the_service_is_created_or_re_pointed_only_when_it_must_be(
    case: str,
    current: dict[str, Any] | None,
    desired: dict[str, Any] | None,
    foreign: bool,
    expected: list[PlannedWrite],
) -> None:
    assert service_writes(current, desired, foreign=foreign) == expected, case


def test_the_serving_revisions_router_is_only_scaled_for_a_split_never_retemplated_or_noted() -> (
    None
):
    """Its template is built from the current spec, which is the target's, not its own."""
    drifted = older_build()
    drifted["metadata"]["name"] = name(OLD, "router")
    writes = revision_writes(
        MD,
        step(workloads=(WorkloadIntent(OLD, "router", 9),), refusal=REFUSAL, new_refusal=True),
        {name(OLD, "router"): drifted},
        BuildInputs(),
    )
    assert writes == [
        Patch("Deployment", name(OLD, "router"), {"spec": {"replicas": 9}}, MERGE_PATCH)
    ]


def test_a_split_selector_drops_the_revision_key_and_a_switch_back_restores_it() -> None:
    one = builders.service(MD, OLD)
    split = builders.service(MD, OLD, split=True)
    assert "kvgate.io/revision" not in split["spec"]["selector"]
    (to_split,) = service_writes(one, split, foreign=False)
    assert isinstance(to_split, Patch)
    assert merge(one, to_split.patch)["spec"]["selector"] == split["spec"]["selector"]
    (back,) = service_writes(split, one, foreign=False)
    assert isinstance(back, Patch)
    assert merge(split, back.patch)["spec"]["selector"] == one["spec"]["selector"]


def test_a_router_key_secret_that_is_not_kvgates_keeps_every_router_at_0() -> None:
    both = step(workloads=(WorkloadIntent(NEW, "decode", 2), WorkloadIntent(NEW, "router", 2)))
    router = name(component="router")
    current = {name(): built(replicas=2), router: built(NEW, "router", 2)}
    writes = revision_writes(MD, both, current, BuildInputs(routers_blocked=True))
    # The engines as planned; the routers scaled to 0.
    assert writes == [Patch("Deployment", router, {"spec": {"replicas": 0}}, MERGE_PATCH)]
    # Once the Secret is kvgate's again, the routers come back as planned.
    current[router] = applied(current[router], writes)
    assert revision_writes(MD, both, current, BuildInputs()) == [
        Patch("Deployment", router, {"spec": {"replicas": 2}}, MERGE_PATCH)
    ]
