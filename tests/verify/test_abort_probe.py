"""The content check's abort step, pure (kvgate.verify.abort_probe): what it sends and how it
judges the known answer before and after a dropped request."""

from __future__ import annotations

from kvgate.api.models import ContentProbeSpec
from kvgate.controller.content_check import parse_stream
from kvgate.verify import abort_probe, content_probe
from kvgate.verify.abort_probe import AbortOutcome, judge_abort, plan_abort
from kvgate.verify.content_probe import (
    REASON_FAILED,
    REASON_INCONCLUSIVE,
    ContentVerdict,
    Expect,
    ProbeAnswer,
)

PLAN = plan_abort(131_072, 434_523, ContentProbeSpec())
KNOWN = (11, 12, 13, 14, 15, 16, 17, 18)
OTHER = (12, 13, 14, 15, 16, 17, 18, 19)
DROPPED = AbortOutcome(ProbeAnswer(200, seconds=1.0), 1.0)
# The revision's engines counted the drop as an abort and held no request 2.4 s after it.
COUNTED = abort_probe.EngineEvidence(aborted_before=3, aborted_after=4, idle_after=2.4)


def answer(ids: tuple[int, ...] | None, status: int | None = 200) -> ProbeAnswer:
    return ProbeAnswer(status, len(ids or ()), output_ids=ids, seconds=0.1)


def verdict(
    before: ProbeAnswer,
    outcome: AbortOutcome,
    after: ProbeAnswer,
    later: ProbeAnswer | None = None,
    engines: abort_probe.EngineEvidence = COUNTED,
) -> ContentVerdict:
    answers = [("right after the abort", after), ("1.00 s after the abort", later or after)]
    return content_probe.verdict("r1", judge_abort(PLAN, before, outcome, answers, engines))


def test_the_aborted_request_is_as_long_as_the_longest_in_range_probe_with_other_ids() -> None:
    assert PLAN is not None
    assert PLAN.known.prompt_tokens == abort_probe.KNOWN_PROMPT_TOKENS
    assert PLAN.known.expect is Expect.KNOWN_ANSWER and PLAN.known.max_new_tokens == 8
    # The longest prompt answered in full with 64 new tokens: 131,072 - 64 - 2.
    assert PLAN.aborted.prompt_tokens == 131_006 and PLAN.aborted.expect is Expect.ABORT
    assert PLAN.aborted.max_new_tokens == abort_probe.ABORT_NEW_TOKENS == 64
    known = content_probe.prompt_ids(8)
    aborted = content_probe.prompt_ids(8, offset=PLAN.aborted.offset)
    assert all(a != b for a, b in zip(known, aborted, strict=True))
    half = plan_abort(131_072, None, ContentProbeSpec(lengths=[50]))
    assert half.aborted.prompt_tokens == 131_006 // 2


def test_the_drop_comes_half_way_into_the_longest_probes_answer_time() -> None:
    assert abort_probe.drop_after(2.2) == 1.1
    assert abort_probe.drop_after(None) == abort_probe.MIN_ABORT_SECONDS


def test_other_tokens_after_the_abort_fail_the_check_naming_the_contamination() -> None:
    result = verdict(answer(KNOWN), DROPPED, answer(OTHER))
    assert result.reason == REASON_FAILED
    message = result.message
    assert "abort-path contamination" in message
    assert "output_ids [12, 13, 14, 15, 16, 17, 18, 19]; want output_ids [11, 12" in message
    assert "connection closed 1.00 s in, after its HTTP 200 head" not in message  # it passed
    assert "release their KV cleanly" in message


def test_the_same_tokens_after_the_abort_pass() -> None:
    result = verdict(answer(KNOWN), DROPPED, answer(KNOWN))
    assert result.passed, result.message
    assert [f.request.expect for f in result.findings] == [
        Expect.KNOWN_ANSWER,
        Expect.ABORT,
        Expect.KNOWN_ANSWER,
        Expect.KNOWN_ANSWER,
    ]


def test_other_tokens_only_once_the_abort_settled_fail_the_check_too() -> None:
    result = verdict(answer(KNOWN), DROPPED, answer(KNOWN), answer(OTHER))
    assert result.reason == REASON_FAILED
    assert "(known answer, 1.00 s after the abort): HTTP 200" in result.message


def test_no_answer_decides_nothing() -> None:
    nothing = AbortOutcome(ProbeAnswer(None, transport_error="ClientConnectorError"), None)
    assert verdict(answer(KNOWN), nothing, answer(KNOWN)).reason == REASON_INCONCLUSIVE
    assert verdict(answer(KNOWN), DROPPED, answer(None, None)).reason == REASON_INCONCLUSIVE
    assert verdict(answer(None, 503), DROPPED, answer(KNOWN)).reason == REASON_INCONCLUSIVE


def test_a_request_faster_than_the_drop_is_recorded_and_the_answers_still_compared() -> None:
    fast = AbortOutcome(answer((1,) * 64), None)
    passed = verdict(answer(KNOWN), fast, answer(KNOWN))
    assert passed.passed and "answered in full before the drop" in passed.message
    assert verdict(answer(KNOWN), fast, answer(OTHER)).reason == REASON_FAILED


def test_a_request_answered_before_its_drop_goes_again_dropped_at_half_its_own_answer() -> None:
    full = AbortOutcome(ProbeAnswer(200, 64, seconds=0.81), None)
    # CI: the probe took over 1.6 s, the request 0.81 s: next drop 0.405 s in.
    assert abort_probe.sooner_drop(1.1, full, 1) == 0.405
    # Never later than the drop that missed, never under the floor.
    assert abort_probe.sooner_drop(0.3, full, 2) == 0.15
    floor = abort_probe.MIN_ABORT_SECONDS
    assert (
        abort_probe.sooner_drop(0.08, AbortOutcome(ProbeAnswer(200, seconds=0.01), None), 1)
        == floor
    )
    assert (
        abort_probe.sooner_drop(floor, AbortOutcome(ProbeAnswer(200, seconds=0.01), None), 1)
        is None
    )
    # Dropped, no answer, or the last try: no other try.
    assert abort_probe.sooner_drop(1.0, DROPPED, 1) is None
    assert (
        abort_probe.sooner_drop(1.0, AbortOutcome(ProbeAnswer(None, seconds=5.0), None), 1) is None
    )
    assert abort_probe.sooner_drop(1.1, full, abort_probe.ABORT_ATTEMPTS) is None


def test_the_dropped_requests_finding_names_the_tries_answered_before_their_drop() -> None:
    landed = AbortOutcome(ProbeAnswer(200, seconds=0.4), 0.41, missed=((1.1, 0.81),))
    message = verdict(answer(KNOWN), landed, answer(KNOWN)).message
    assert (
        "connection closed 0.41 s in, after its HTTP 200 head (try 1: answered in full in "
        in message
    )
    assert "0.81 s, before its drop at 1.10 s)" in message
    never = AbortOutcome(answer((1,) * 64), None, missed=((1.1, 0.05), (0.05, 0.04)))
    message = verdict(answer(KNOWN), never, answer(KNOWN)).message
    assert "answered in full before the drop in all 3 tries" in message, message


def test_a_known_answer_refused_fails_without_calling_it_contamination() -> None:
    result = verdict(answer(None, 400), DROPPED, answer(None, 400))
    assert result.reason == REASON_FAILED
    assert "contamination" not in result.message


def test_a_long_answer_is_quoted_shortened() -> None:
    shown = abort_probe.show_ids(tuple(range(100)))
    assert shown.startswith("output_ids [0, 1, 2") and shown.endswith(", … (100 in all)]")


def test_a_plain_answer_gives_its_output_ids_and_a_stream_its_count() -> None:
    plain = b'{"output_ids": [5, 6, 7], "meta_info": {"completion_tokens": 3}}'
    assert parse_stream(200, plain, False, 0.1).output_ids == (5, 6, 7)
    stream = (
        b'data: {"output_ids": [5], "meta_info": {"completion_tokens": 1}}\n\n'
        b'data: {"output_ids": [6], "meta_info": {"completion_tokens": 2}}\n\ndata: [DONE]\n\n'
    )
    answer = parse_stream(200, stream, False, 0.1)
    assert answer.generated_tokens == 2 and answer.output_ids is None
    assert parse_stream(400, b'{"error": {"message": "no"}}', False, 0.1).output_ids is None


def test_the_last_known_answer_waits_at_least_two_seconds_after_the_drop() -> None:
    """A drop 0.17 s in left the last request 0.17 s later, before smg (which passes a client's
    disconnect on at its next failed write) had aborted the request on a loaded machine: a
    broken abort path then passed."""
    assert abort_probe.settle_seconds(0.17) == abort_probe.MIN_SETTLE_SECONDS == 2.0
    assert abort_probe.settle_seconds(5.0) == 5.0


def test_an_abort_the_engines_never_counted_is_undecided_never_passed() -> None:
    """The connection was closed after the head, but no engine counted an abort: the engines
    may have answered the request in full before the drop reached them, so no abort path ran.
    The same answers after it prove nothing; the check reruns."""
    uncounted = abort_probe.EngineEvidence(aborted_before=3, aborted_after=3, idle_after=2.4)
    result = verdict(answer(KNOWN), DROPPED, answer(KNOWN), engines=uncounted)
    assert result.reason == REASON_INCONCLUSIVE, result.message
    assert "sglang:num_aborted_requests_total 3 before the drop and 3 after" in result.message
    unread = abort_probe.EngineEvidence(aborted_before=None, aborted_after=None, idle_after=2.4)
    result = verdict(answer(KNOWN), DROPPED, answer(KNOWN), engines=unread)
    assert result.reason == REASON_INCONCLUSIVE, result.message
    counted = verdict(answer(KNOWN), DROPPED, answer(KNOWN))
    assert counted.passed and "the engines counted 1 abort" in counted.message, counted.message
    # Wrong tokens are wrong whatever the counter says.
    assert verdict(answer(KNOWN), DROPPED, answer(OTHER), engines=uncounted).reason == (
        REASON_FAILED
    )


def test_engines_still_holding_a_request_at_the_deadline_leave_the_last_answer_undecided() -> None:
    busy = abort_probe.EngineEvidence(
        aborted_before=3, aborted_after=4, idle_after=None, busy="decode-0: 1 running, 0 queued"
    )
    result = verdict(answer(KNOWN), DROPPED, answer(KNOWN), engines=busy)
    assert result.reason == REASON_INCONCLUSIVE, result.message
    assert "decode-0: 1 running, 0 queued" in result.message
    assert f"{abort_probe.IDLE_DEADLINE_SECONDS:g} s" in result.message
    assert verdict(answer(KNOWN), DROPPED, answer(KNOWN), answer(OTHER), busy).reason == (
        REASON_FAILED
    )


SGLANG_METRICS = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="decode",model_name="m",priority="",tp_rank="0"} 2.0
sglang:num_running_reqs{engine_type="decode",model_name="m",priority="1",tp_rank="0"} 2.0
sglang:num_running_reqs{engine_type="decode",model_name="m",priority="",tp_rank="1"} 1.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="decode",model_name="m",priority="",tp_rank="0"} 0.0
# TYPE sglang:num_aborted_requests_total counter
sglang:num_aborted_requests_total{engine_type="decode",model_name="m"} 4.0
sglang:num_aborted_requests_created{engine_type="decode",model_name="m"} 1.7e9
"""


def test_the_engines_activity_is_read_from_sglangs_own_metrics() -> None:
    """SGLang 0.5.23 (srt/observability/metrics_collector.py): num_running_reqs and
    num_queue_reqs gauges per rank, the total under priority="" and a per-priority breakdown
    beside it when priority scheduling is on (not counted twice); num_aborted_requests_total
    counted by its tokenizer for each request it aborts (a client that went away)."""
    activity = abort_probe.activity_from_metrics("decode-0", SGLANG_METRICS)
    assert activity == abort_probe.EngineActivity("decode-0", 3, 0, 4)
    assert abort_probe.activity_from_metrics("p", "sglang:num_queue_reqs 0.0\n") is None
    idle = abort_probe.EngineActivity("p", 0, 0, 0)
    assert abort_probe.busy_engines([idle, activity]) == "decode-0: 3 running, 0 queued"
    assert abort_probe.busy_engines([idle]) == ""
