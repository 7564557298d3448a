"""Progressive rollouts, pure parts: the router split of a weight, and the step check."""

from __future__ import annotations

import pytest
from kvgate.rollout.progressive import (
    EngineFailures,
    RouterCounters,
    check_step,
    counters_from_metrics,
    engine_failures_from_metrics,
    engine_failures_since,
    share_percent,
    since,
    split_routers,
)

# What smg 1.13 exposes (recorded from a real `smg launch` answering two generation requests, a
# chat request, a 404, an over-length refusal and a request whose client went away).
SMG_METRICS = """\
# HELP smg_http_responses_total Total HTTP responses by path, status_code and error_code
# TYPE smg_http_responses_total counter
smg_http_responses_total{path="/generate",status_code="200",error_code=""} 40
smg_http_responses_total{path="/generate",status_code="503",error_code="no_available_workers"} 2
smg_http_responses_total{path="/v1/completions",status_code="200",error_code=""} 7
smg_http_responses_total{path="/v1/chat/completions",status_code="400",error_code="bad_request"} 3
smg_http_responses_total{path="/generate",status_code="499",error_code="client_closed_request"} 5
smg_http_responses_total{path="other",status_code="404",error_code="unknown_url"} 11
smg_http_responses_total{path="/health",status_code="200",error_code=""} 90
smg_http_requests_total{method="POST",path="/generate"} 47
"""


@pytest.mark.parametrize(
    ("weight", "max_routers", "expected"),
    [
        (10, 10, (9, 1)),
        (50, 10, (1, 1)),  # the fewest routers among equally close ratios
        (25, 10, (3, 1)),
        (33, 10, (2, 1)),
        (90, 10, (1, 9)),
        (20, 4, (3, 1)),  # 25 %: the closest four routers can do
    ],
)
def test_a_weight_becomes_the_closest_router_ratio(
    weight: int, max_routers: int, expected: tuple[int, int]
) -> None:
    assert split_routers(weight, max_routers) == expected


@pytest.mark.parametrize("max_routers", [2, 4, 10, 20])
def test_every_admissible_weight_is_within_half_a_router_of_its_share(max_routers: int) -> None:
    low = -(-100 // max_routers)
    for weight in range(low, 100 - low + 1):
        serving, target = split_routers(weight, max_routers)
        assert serving >= 1 and target >= 1 and serving + target <= max_routers
        share = 100 * target / (serving + target)
        assert abs(share - weight) <= 100 / (2 * max_routers) + 1e-9, (weight, serving, target)


def test_the_share_is_the_targets_part_of_the_ready_routers() -> None:
    assert share_percent(9, 1) == 10
    assert share_percent(0, 3) == 100
    assert share_percent(0, 0) == 0


def test_generation_responses_are_counted_and_other_paths_are_not() -> None:
    counters = counters_from_metrics("router-a", SMG_METRICS)
    # 2 503s and 5 499s failed (smg cannot tell a client that went away from a request it
    # dropped), 3 400s refused; /health and the 404 are not generation requests.
    assert counters == RouterCounters("router-a", requests=57, errors=7, rejected=3)


def test_a_restarted_router_counts_from_zero_and_a_new_one_from_its_first_request() -> None:
    baseline = [RouterCounters("a", 100, 5, 1), RouterCounters("b", 10, 0, 0)]
    now = [
        RouterCounters("a", 30, 2, 0),
        RouterCounters("b", 25, 1, 2),
        RouterCounters("c", 4, 0, 0),
    ]
    assert since(baseline, now) == (30 + 15 + 4, 2 + 1, 0 + 2)


def test_the_check_fails_above_the_error_share_and_names_the_numbers() -> None:
    check = check_step(
        [RouterCounters("a", 100, 0, 0)],
        [RouterCounters("a", 150, 2, 0)],
        max_error_percent=1.0,
        max_rejected_percent=100.0,
    )
    assert check.requests == 50 and check.errors == 2
    assert check.failure == (
        "2 of 50 answered requests failed (4.0 % > rollout.stepCheck.maxErrorPercent=1)"
    )


def test_the_check_holds_at_the_error_share_and_without_requests() -> None:
    at_limit = check_step(
        [], [RouterCounters("a", 100, 1, 0)], max_error_percent=1.0, max_rejected_percent=100.0
    )
    assert at_limit.failure is None and at_limit.error_percent == 1.0
    quiet = check_step([], [], max_error_percent=0.0, max_rejected_percent=0.0)
    assert quiet.failure is None and quiet.requests == 0


def test_refusals_fail_the_check_only_above_their_own_limit() -> None:
    counters = [RouterCounters("a", 20, 0, 5)]
    lenient = check_step([], counters, max_error_percent=1.0, max_rejected_percent=100.0)
    assert lenient.failure is None and lenient.rejected_percent == 25.0
    strict = check_step([], counters, max_error_percent=1.0, max_rejected_percent=10.0)
    assert strict.failure == (
        "5 of 20 requests refused (25.0 % > rollout.stepCheck.maxRejectedPercent=10)"
    )


async def test_the_step_check_reads_a_router_exposition_to_its_end() -> None:
    # A router's /metrics (~100 KiB) arrives in several TCP chunks; fetch_text read only what
    # had arrived first, so counters past that point (the 5xx line) were never counted.
    import asyncio

    from aiohttp import web
    from factories.local_http import serving_app
    from kvgate.controller.step_check import fetch_text

    head = "".join(f"# HELP filler_{i} padding\nfiller_{i} 0\n" for i in range(3000))
    tail = 'smg_http_responses_total{status_code="500"} 7\n'

    async def metrics(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(head.encode())
        await asyncio.sleep(0.05)
        await response.write(tail.encode())
        return response

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with serving_app(app) as url:
        text = await fetch_text(f"{url}/metrics")
    assert text.endswith(tail) and len(text) == len(head) + len(tail)


# What smg 1.13 exposes after streamed generation requests whose decode engine broke its stream
# after the 200 head (recorded from a real `smg launch --pd-disaggregation` in front of an
# engine that closed the connection mid-body): smg ends its own stream cleanly with an in-band
# ``{"error": {"type": "stream_error"}}`` event, so the response is counted as a 200 with no
# error code; only ``smg_router_request_errors_total`` counts the broken stream (backend_error).
# A non-streamed 500 from decode is counted in both series; a prefill 400 is a
# validation_error.
SMG_BROKEN_STREAMS = """\
smg_http_responses_total{path="/generate",status_code="200",error_code=""} 10
smg_http_responses_total{path="/v1/chat/completions",status_code="200",error_code=""} 4
smg_http_responses_total{path="/generate",status_code="500",error_code="decode_internal_error"} 1
smg_http_responses_total{path="/generate",status_code="400",error_code="prefill_bad_request"} 2
smg_router_request_errors_total{router_type="http",backend_type="pd",connection_mode="http",\
model="m",endpoint="generate",error_type="backend_error"} 6
smg_router_request_errors_total{router_type="http",backend_type="pd",connection_mode="http",\
model="m",endpoint="chat",error_type="backend_error"} 3
smg_router_request_errors_total{router_type="http",backend_type="pd",connection_mode="http",\
model="m",endpoint="generate",error_type="validation_error"} 2
smg_router_request_errors_total{router_type="http",backend_type="pd",connection_mode="http",\
model="m",endpoint="responses",error_type="backend_error"} 50
""".replace("\\\n", "")


def test_streams_that_broke_after_a_200_head_count_as_failed() -> None:
    counters = counters_from_metrics("router-a", SMG_BROKEN_STREAMS)
    # 6 + 3 broken generation streams or decode 500s (the 500 is in both series: counted
    # once); the 400s are refusals; a non-generation endpoint's errors are not the step's.
    assert counters == RouterCounters("router-a", requests=17, errors=9, rejected=2)
    check = check_step([], [counters], max_error_percent=1.0, max_rejected_percent=100.0)
    assert check.failure == (
        "9 of 15 answered requests failed (60.0 % > rollout.stepCheck.maxErrorPercent=1; "
        "2 refused with a 4xx are not counted)"
    )


def test_a_2xx_response_that_smg_labels_stream_error_counts_as_failed() -> None:
    text = (
        'smg_http_responses_total{path="/generate",status_code="200",error_code=""} 7\n'
        'smg_http_responses_total{path="/generate",status_code="200",error_code="stream_error"} 3\n'
    )
    assert counters_from_metrics("r", text) == RouterCounters("r", 10, 3, 0)


def test_a_499_counts_as_failed_since_smg_gives_a_dropped_request_the_same_labels() -> None:
    # smg 1.13: "a request whose client closed the connection first counts as status_code 499
    # with error_code client_closed_request, as does the rare request the server dropped
    # unanswered (a handler panic, a forced shutdown)": the labels cannot tell them apart.
    text = (
        'smg_http_responses_total{path="/generate",status_code="200",error_code=""} 95\n'
        'smg_http_responses_total{path="/generate",status_code="499",'
        'error_code="client_closed_request"} 5\n'
    )
    assert counters_from_metrics("r", text) == RouterCounters("r", 100, 5, 0)


# What an SGLang 0.5.23 decode engine exposes with --enable-metrics (prometheus_client text; the
# scheduler's counters carry its ranks, one series per data-parallel rank), after 3 KV transfers
# failed on rank 0 and 1 on rank 1, 2 bootstraps failed, and 4 requests whose clients left.
SGLANG_DECODE_METRICS = """\
# HELP sglang:num_transfer_failed_reqs_total The number of transfer failed requests.
# TYPE sglang:num_transfer_failed_reqs_total counter
sglang:num_transfer_failed_reqs_total{dp_rank="0",engine_type="decode",model_name="m",\
moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.0
sglang:num_transfer_failed_reqs_total{dp_rank="1",engine_type="decode",model_name="m",\
moe_ep_rank="0",pp_rank="0",tp_rank="1"} 1.0
# HELP sglang:num_bootstrap_failed_reqs_total The number of bootstrap failed requests.
# TYPE sglang:num_bootstrap_failed_reqs_total counter
sglang:num_bootstrap_failed_reqs_total{dp_rank="0",engine_type="decode",model_name="m",\
moe_ep_rank="0",pp_rank="0",tp_rank="0"} 2.0
# HELP sglang:num_aborted_requests_total Number of requests aborted.
# TYPE sglang:num_aborted_requests_total counter
sglang:num_aborted_requests_total{engine_type="decode",model_name="m"} 4.0
sglang:num_requests_total{engine_type="decode",model_name="m"} 90.0
"""


def test_an_engines_failed_transfers_and_bootstraps_are_summed_over_its_ranks() -> None:
    failures = engine_failures_from_metrics("decode-0", "decode", SGLANG_DECODE_METRICS)
    # the aborted requests are not failures: SGLang counts a client's disconnect there too
    assert failures == EngineFailures("decode-0", "decode", transfers=4, bootstraps=2)
    assert engine_failures_from_metrics("p", "prefill", "") == EngineFailures("p", "prefill", 0, 0)


def test_a_restarted_engine_counts_from_zero_and_a_new_one_from_its_start() -> None:
    baseline = [EngineFailures("a", "decode", 5, 1), EngineFailures("b", "decode", 2, 0)]
    now = [
        EngineFailures("a", "decode", 1, 0),  # restarted: its counters went down
        EngineFailures("b", "decode", 2, 0),  # nothing new
        EngineFailures("c", "prefill", 0, 3),  # not there when the step began
    ]
    assert engine_failures_since(baseline, now) == (
        EngineFailures("a", "decode", 1, 0),
        EngineFailures("c", "prefill", 0, 3),
    )


def test_streams_the_engine_ended_with_an_in_band_error_fail_the_step_and_name_the_pod() -> None:
    # smg counted 60 plain 200s (a clean in-band error is a 200 in every smg series); the
    # target's decode counted 3 failed KV transfers since the step began.
    check = check_step(
        [RouterCounters("r", 40, 0, 0)],
        [RouterCounters("r", 100, 0, 0)],
        max_error_percent=1.0,
        max_rejected_percent=100.0,
        engine_baseline=[EngineFailures("decode-x", "decode", 1, 0)],
        engines=[EngineFailures("decode-x", "decode", 4, 0), EngineFailures("p", "prefill", 0, 0)],
    )
    assert check.errors == 3
    assert check.failure == (
        "3 of 60 answered requests failed (5.0 % > rollout.stepCheck.maxErrorPercent=1); "
        "3 KV transfers failed on decode pod decode-x"
    )
    assert check.summary().endswith("; 3 KV transfers failed on decode pod decode-x")


def test_a_failure_both_engines_or_the_router_also_counted_is_counted_once() -> None:
    # One failed transfer, counted by its prefill and its decode; a non-streamed one also
    # reached the router as a 5xx.
    check = check_step(
        [],
        [RouterCounters("r", 100, 2, 0)],
        max_error_percent=5.0,
        max_rejected_percent=100.0,
        engines=[
            EngineFailures("p", "prefill", 2, 0),
            EngineFailures("d1", "decode", 1, 0),
            EngineFailures("d2", "decode", 1, 0),
        ],
    )
    assert check.errors == 2 and check.failure is None
    more = check_step(
        [],
        [RouterCounters("r", 100, 2, 0)],
        max_error_percent=5.0,
        max_rejected_percent=100.0,
        engines=[EngineFailures("d1", "decode", 4, 3)],
    )
    assert more.errors == 7 and more.failure is not None


# Issue 46 item 4, as measured: a tenant flooded the target's routers with invalid JSON (answered
# 4xx) during a step of a revision whose decode failed its KV transfers.
FLOODED = RouterCounters("router-b", requests=284_286, errors=54, rejected=284_224)
FAILED_TRANSFERS = EngineFailures("decode-b", "decode", 10, 0)


def test_a_flood_of_refused_requests_does_not_dilute_a_failing_revisions_step() -> None:
    # 54 failed of 284,286 was 0.02 % and passed maxErrorPercent=1: the 284,224 refusals were in
    # the denominator. Only the 62 answered requests are evidence, and 54 of them failed.
    check = check_step(
        [],
        [FLOODED],
        max_error_percent=1.0,
        max_rejected_percent=100.0,
        engines=[FAILED_TRANSFERS],
    )
    assert (check.requests, check.answered, check.errors) == (284_286, 62, 54)
    assert check.failure == (
        "54 of 62 answered requests failed (87.1 % > rollout.stepCheck.maxErrorPercent=1; "
        "284,224 refused with a 4xx are not counted); 10 KV transfers failed on decode pod decode-b"
    )


@pytest.mark.parametrize("flood", [0, 1, 1_000, 284_224, 100_000_000])
def test_refused_requests_change_no_verdict_on_the_answered_ones(flood: int) -> None:
    # 1 failed of 100 answered holds at maxErrorPercent=1, 2 failed does not, whatever the
    # number of 4xx beside them (with maxRejectedPercent at its default, report only).
    def verdict(errors: int) -> str | None:
        return check_step(
            [RouterCounters("r", 50, 0, 50)],
            [RouterCounters("r", 50 + 100 + flood, errors, 50 + flood)],
            max_error_percent=1.0,
            max_rejected_percent=100.0,
        ).failure

    assert verdict(1) is None
    assert verdict(2) is not None and verdict(2).startswith("2 of 100 answered requests failed")


def test_the_engines_failures_count_even_when_every_request_was_refused() -> None:
    # Failures the engines counted beyond the requests the routers answered are failures
    # hidden under 4xx heads: the answered requests are at least the failures.
    check = check_step(
        [],
        [RouterCounters("r", 500, 0, 500)],
        max_error_percent=1.0,
        max_rejected_percent=100.0,
        engines=[FAILED_TRANSFERS],
    )
    assert (check.answered, check.errors) == (10, 10)
    assert check.failure is not None and check.failure.startswith(
        "10 of 10 answered requests failed (100.0 %"
    )


def engine_pod(name: str, role: str, ip: str | None, ready: bool = True) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": {"kvgate.io/role": role}},
        "spec": {
            "containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 30000}]}]
        },
        "status": {
            "podIP": ip,
            "containerStatuses": [{"name": "engine", "ready": ready}],
        },
    }


async def test_each_serving_engine_is_read_and_an_unreadable_one_decides_nothing() -> None:
    from kvgate.controller.step_check import read_engine_failures

    asked: list[str] = []

    async def fetch(url: str) -> str:
        asked.append(url)
        if "10.0.0.3" in url:
            raise TimeoutError("no answer")
        return SGLANG_DECODE_METRICS

    serving = [engine_pod("d-0", "decode", "10.0.0.1"), engine_pod("p-0", "prefill", "10.0.0.2")]
    starting = engine_pod("d-1", "decode", "10.0.0.9", ready=False)  # not serving: not read
    read = await read_engine_failures([*serving, starting], fetch)
    assert read == (
        EngineFailures("d-0", "decode", 4, 2),
        EngineFailures("p-0", "prefill", 4, 2),
    )
    assert sorted(asked) == ["http://10.0.0.1:30000/metrics", "http://10.0.0.2:30000/metrics"]
    silent = engine_pod("d-2", "decode", "10.0.0.3")
    assert await read_engine_failures([*serving, silent], fetch) is None
