"""kvgate explain, decided from given objects (kvgate.diagnose.explain): why a ModelDeployment is
or is not Ready, the live numbers per role, and the smallest change that fixes it."""

from __future__ import annotations

import copy
from typing import Any

from factories.cluster_objects import (
    CONTEXT,
    T0,
    engine_pod,
    event,
    pod_name,
    refused_md,
    revision,
    serving_md,
    spec_of,
    verdict_condition,
)
from kvgate.diagnose.explain import (
    estimated_changes,
    explain,
    explanation_json,
    explanation_text,
    parse_spec,
    pools_in,
)

SMALL_POOL = 44_584  # the demo's llama-8b-small on 24 GiB


def _refused_with_pods(
    spec: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    md = refused_md("placeholder", spec=spec)
    rev = md["status"]["targetRevision"]
    decode = verdict_condition("decode", pod_name("llama", rev, "decode"), SMALL_POOL)
    prefill = verdict_condition("prefill", pod_name("llama", rev, "prefill"), SMALL_POOL)
    md["status"]["rollout"]["refusal"]["message"] = decode["message"]
    pods = [
        engine_pod("llama", rev, "prefill", prefill),
        engine_pod("llama", rev, "decode", decode),
    ]
    return md, pods


def test_the_pool_a_gate_message_reports_is_read_back_from_the_operators_own_wording() -> None:
    for pool in (SMALL_POOL, CONTEXT, 434_523):
        message = verdict_condition("decode", "llama-abc-decode-1", pool)["message"]
        assert pools_in(message) == [("decode", "llama-abc-decode-1", pool)], message


def test_a_refused_rollout_names_the_live_pools_and_the_smallest_change_that_fixes_it() -> None:
    md, pods = _refused_with_pods()
    e = explain(md, pods, [])
    assert not e.ready and e.reason == "RolloutRefused"
    assert e.refusal is not None and e.refusal[0] == "EngineUnsafe"
    assert (e.context_length, e.headroom, e.required_pool_tokens) == (CONTEXT, 1.0, CONTEXT)
    for live in e.roles:
        assert live.kv_pool_tokens == SMALL_POOL and live.source == "the pods' gate conditions"
        assert live.holds is False and live.short_by_tokens == CONTEXT - SMALL_POOL
    # The planner's change for each role (judged at the live/estimate ratio), then the context.
    fields = [change.field for change in e.changes]
    assert fields[-1] == "spec.model.contextLength" and e.changes[-1].value == SMALL_POOL
    assert e.changes[-1].basis == "live"
    assert {f.split(".")[1] for f in fields[:-1]} == {"prefill", "decode"}
    for change in e.changes[:-1]:
        assert change.basis == "estimate" and change.kv_pool_tokens is not None
    assert {row.name for row in e.advice} >= {"RolloutRefused", "EngineUnsafe", "KvPoolTooSmall"}
    text = explanation_text(e)
    assert "llama in models: not Ready (RolloutRefused)" in text
    assert f"short by {CONTEXT - SMALL_POOL:,}" in text
    assert f"lower spec.model.contextLength to {SMALL_POOL:,}" in text
    assert "smallest change that fixes it:" in text


def test_a_change_to_the_shape_must_hold_at_the_ratio_the_live_engine_shows() -> None:
    """The estimate for 80 GiB × TP 1 holds 131,072 tokens; the live engine reports a tenth of
    it. A change is offered only if it holds the context at that same ratio."""
    spec = parse_spec({"spec": spec_of()})
    assert spec is not None
    as_estimated = estimated_changes(spec, "decode", 10**9)  # live above the estimate: holds
    assert as_estimated == []
    changes = estimated_changes(spec, "decode", SMALL_POOL)
    assert changes, "a larger TP or GPU holds it"
    for change in changes:
        assert change.kv_pool_tokens is not None
        assert "about" in change.text  # the pool expected live, at the engine's ratio
        expected = int(change.text.split("about ")[1].split(" ")[0].replace(",", ""))
        assert expected >= CONTEXT, change.text


def test_without_a_model_config_the_fix_is_the_context_and_a_note_on_what_is_missing() -> None:
    spec = spec_of()
    del spec["model"]["config"]
    md, pods = _refused_with_pods(spec)
    e = explain(md, pods, [])
    assert [c.field for c in e.changes] == ["spec.model.contextLength"]
    assert any("spec.model.config" in note and "2.94×" in note for note in e.notes), e.notes


def test_a_refused_revision_scaled_to_zero_is_explained_from_the_refusal_in_its_status() -> None:
    md, _ = _refused_with_pods()
    e = explain(md, [], [])  # scaleDownRefused: the refused engines are gone
    decode = next(r for r in e.roles if r.role == "decode")
    assert decode.kv_pool_tokens == SMALL_POOL and decode.source == "status.rollout.refusal"
    prefill = next(r for r in e.roles if r.role == "prefill")
    assert prefill.kv_pool_tokens is None  # the refusal names the first unsafe pod only
    assert e.changes[-1].value == SMALL_POOL


def test_events_are_listed_newest_first() -> None:
    md = refused_md(
        "revision not verified within rollout.verifyTimeoutSeconds=900 s",
        reason="VerificationTimeout",
    )
    events = [
        event("RolloutStarted", "a", "2026-11-05T11:00:00Z", type_="Normal"),
        event("RolloutRefused", "b", "2026-11-05T11:30:00Z"),
        event("KvPoolTooSmall", "c", "2026-11-05T11:45:00Z"),
    ]
    e = explain(md, [], events)
    assert [line.time for line in e.events] == sorted(
        [x["lastTimestamp"] for x in events], reverse=True
    )


def test_a_serving_deployment_is_ready_with_its_verified_pools_and_no_change() -> None:
    md = serving_md()
    e = explain(md, [], [])
    assert e.ready and e.reason == "RevisionServing"
    assert [(r.role, r.kv_pool_tokens, r.holds) for r in e.roles] == [
        ("prefill", 434_523, True),
        ("decode", 434_523, True),
    ]
    assert e.changes == () and e.advice == ()
    assert "llama in models: Ready (RevisionServing)" in explanation_text(e)


def test_a_status_older_than_the_spec_is_not_ready() -> None:
    md = serving_md()
    md["metadata"]["generation"] = 2
    e = explain(md, [], [])
    assert not e.ready
    assert any("generation 1" in note and "generation 2" in note for note in e.notes)


def test_a_deployment_the_operator_never_saw_says_so() -> None:
    md = serving_md()
    del md["status"]
    e = explain(md, [], [])
    assert not e.ready and e.roles and all(r.kv_pool_tokens is None for r in e.roles)
    assert any("no status" in note for note in e.notes)


def test_an_engine_too_old_gets_the_catalogues_change_not_a_pool_change() -> None:
    md = refused_md("placeholder")
    rev = md["status"]["targetRevision"]
    cond = verdict_condition("decode", pod_name("llama", rev, "decode"), 434_523)
    cond.update(
        status="False",
        reason="EngineVersionTooOld",
        message="decode pod x reports engine version 0.5.9 < minimum 0.5.22",
    )
    e = explain(md, [engine_pod("llama", rev, "decode", cond)], [])
    assert e.changes == ()
    too_old = next(row for row in e.advice if row.name == "EngineVersionTooOld")
    assert "image" in too_old.change


def test_an_invalid_spec_is_explained_without_numbers() -> None:
    md = refused_md("x")
    md["spec"] = {"model": {"name": "m"}}
    md["status"]["conditions"][0].update(reason="InvalidSpec", message="spec.model.path: required")
    e = explain(md, [], [])
    assert not e.ready and e.roles == () and e.context_length is None
    assert any(row.name == "InvalidSpec" for row in e.advice)


def test_events_of_an_earlier_object_of_the_same_name_are_left_out() -> None:
    md = serving_md()
    stranger = event("RolloutRefused", "revision x refused (EngineUnsafe): old")
    stranger["involvedObject"] = {**stranger["involvedObject"], "uid": "someone-else"}
    assert (
        explain(md, [], [stranger, event("RevisionServing", "ok", type_="Normal")]).events[0].reason
        == "RevisionServing"
    )
    assert len(explain(md, [], [stranger]).events) == 0


def test_the_json_keys_are_always_present() -> None:
    md, pods = _refused_with_pods()
    document = explanation_json(explain(md, pods, [event("RolloutRefused", "r")]))
    assert set(document) == {
        "name",
        "namespace",
        "ready",
        "reason",
        "message",
        "generation",
        "observed_generation",
        "serving_revision",
        "target_revision",
        "refused_revision",
        "refusal",
        "requirement",
        "roles",
        "changes",
        "advice",
        "events",
        "notes",
    }
    assert set(document["roles"]) == {"prefill", "decode"}
    assert document["roles"]["decode"]["pods"][0]["kv_pool_tokens"] == SMALL_POOL
    assert document["changes"][-1] == {
        "field": "spec.model.contextLength",
        "value": SMALL_POOL,
        "basis": "live",
        "kv_pool_tokens": None,
        "text": document["changes"][-1]["text"],
    }
    # Only plain data: json.dumps would fail on anything else.
    assert copy.deepcopy(document) == document
    assert revision(spec_of()) == md["status"]["targetRevision"]


def _forged(reason: str, message: str, **reporter: Any) -> dict[str, Any]:
    """An Event a namespace editor created on ``llama`` in kvgate's wording."""
    item = event(reason, message)
    item.update(reporter)
    return item


def test_a_pool_reported_only_by_an_event_is_never_read_as_the_live_pool() -> None:
    md = refused_md(
        "revision not verified within rollout.verifyTimeoutSeconds=900 s",
        reason="VerificationTimeout",
    )
    rev = md["status"]["targetRevision"]
    message = verdict_condition("prefill", pod_name("llama", rev, "prefill"), 2_048)["message"]
    e = explain(md, [], [_forged("KvPoolTooSmall", message, source={"component": "kvgate"})])
    prefill = next(r for r in e.roles if r.role == "prefill")
    assert (prefill.kv_pool_tokens, prefill.source) == (None, "")
    assert not any(c.field == "spec.model.contextLength" for c in e.changes), e.changes
    assert "prefill  no pool reported yet" in explanation_text(e)


def test_events_are_shown_as_events_with_the_reporter_they_claim_never_as_kvgates_finding() -> None:
    md = serving_md()
    forged = _forged(
        "RolloutRefused",
        "revision 1fa11ed0 refused (EngineUnsafe): forged",
        source={"component": "kvgate", "host": "node-1"},
        reportingComponent="kvgate",
        reportingInstance="kvgate-operator",
    )
    bare = _forged("RolloutRefused", "revision 2fa11ed0 refused (EngineUnsafe): no reporter")
    legacy = _forged("RollbackStarted", "rolling back", source={"component": "kvgate"})
    e = explain(md, [], [forged, bare, legacy])
    assert e.ready and e.refusal is None and e.refused_revision is None
    lines = explanation_text(e).splitlines()
    heading = next(i for i, line in enumerate(lines) if line.startswith("Events "))
    assert "not kvgate's record" in lines[heading]
    shown = {line.split(": ", 1)[1]: line for line in lines[heading + 1 :]}
    assert "reported as kvgate/kvgate-operator" in shown[forged["message"]]
    assert "no reporter named" in shown[bare["message"]]
    assert "reported as kvgate:" in shown[legacy["message"]]
    assert all(lines.index(line) > heading for line in lines if "fa11ed0" in line)
    reporters = [x["reporter"] for x in explanation_json(e)["events"]]
    assert sorted(reporters, key=str) == sorted(["kvgate/kvgate-operator", None, "kvgate"], key=str)


def test_an_events_newlines_and_terminal_escapes_never_print_as_lines_of_kvgates_own() -> None:
    md = serving_md()
    forged = _forged(
        "RolloutRefused\nserving: nothing",
        "ok\nrefusal: decode pod x reports KV pool 2,048 tokens\x1b[1A\x1b[2K\u202e",
        source={"component": "kvgate\r"},
    )
    text = explanation_text(explain(md, [], [forged]))
    lines = text.splitlines()
    assert lines[-1] == (
        f"  {T0} Warning RolloutRefused\\nserving: nothing, reported as kvgate\\r: "
        "ok\\nrefusal: decode pod x reports KV pool 2,048 tokens\\x1b[1A\\x1b[2K\\u202e"
    ), lines[-1]
    assert lines[-2].startswith("Events on it (not kvgate's record")
    assert "\x1b" not in text and "\u202e" not in text and "\r" not in text


H100 = "NVIDIA-H100-80GB-HBM3"


def _decode_on_h100() -> Any:
    doc = spec_of()
    doc["decode"]["nodeSelector"] = {"nvidia.com/gpu.product": H100}
    spec = parse_spec({"spec": doc})
    assert spec is not None
    return spec


def test_a_shape_change_is_estimated_with_the_measured_reserve_of_the_roles_gpu_product() -> None:
    """Admission estimates a role on a measured product with that product's reserve; explain's
    change is judged by the same estimate, and says which reserve it took."""
    spec = _decode_on_h100()
    assumed = estimated_changes(spec, "decode", SMALL_POOL)
    measured = estimated_changes(spec, "decode", SMALL_POOL, {H100: 6.0})
    assert assumed and measured
    assert "gpuReservedGiB 1 from kvgate's assumption" in assumed[0].text, assumed[0].text
    assert (
        f"gpuReservedGiB 6 from the cluster's measured reserve for nvidia.com/gpu.product={H100}"
        in measured[0].text
    ), measured[0].text
    by_field = {c.field: c.kv_pool_tokens for c in assumed}
    assert any(
        c.kv_pool_tokens is not None
        and c.field in by_field
        and c.kv_pool_tokens < (by_field[c.field] or 0)
        for c in measured
    ), (assumed, measured)


def test_explain_takes_the_reserve_the_operator_wrote_in_the_status_and_a_flag_wins() -> None:
    from kvgate.admission.gpu_reserve import measured_source

    doc = spec_of()
    doc["decode"]["nodeSelector"] = {"nvidia.com/gpu.product": H100}
    md, pods = _refused_with_pods(doc)
    md["status"]["decode"] = {
        "poolEstimate": {
            "estimatedKvPoolTokens": 100_000,
            "gpuReservedGiB": 6.0,
            "reserveSource": measured_source(H100),
        }
    }

    def decode_change(e: Any) -> str:
        return next(c.text for c in e.changes if c.field.startswith("spec.decode."))

    assert "gpuReservedGiB 6 from the cluster's measured" in decode_change(explain(md, pods, []))
    flagged = explain(md, pods, [], reserves_by_product={H100: 2.5})
    assert "gpuReservedGiB 2.5 from the cluster's measured" in decode_change(flagged)


def test_kvgate_explain_takes_gpu_reserve_and_refuses_a_bad_one_naming_the_flag(
    capsys: Any,
) -> None:
    from kvgate.cmd.cli import build_parser, main

    args = build_parser().parse_args(["explain", "llama", "--gpu-reserve", f"{H100}=2.5"])
    assert args.gpu_reserve == [f"{H100}=2.5"]
    code = main(["explain", "llama", "--gpu-reserve", "H100=lots", "--json"])
    assert code == 2
    out = capsys.readouterr().out
    assert "--gpu-reserve" in out and "PRODUCT=GIB" in out, out
