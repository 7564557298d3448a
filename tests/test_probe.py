"""The probe: parse every SGLang payload shape, and survive every way an engine can misbehave.

HTTP tests run a real aiohttp server on 127.0.0.1 that serves the SGLang-shaped fixtures, garbage,
slow answers, 404s and 500s.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from kvgate_engine.probe import fetch_report, parse_report, verify
from kvgate_engine.report import EngineReport
from kvgate_engine.verdict import Outcome, Requirement, Verdict

FIXTURES = Path(__file__).parent / "fixtures" / "engine"
CTX = 131_072


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


# ---------------------------------------------------------------------------------------------
# parse_report on every shape
# ---------------------------------------------------------------------------------------------

PARSE_TABLE = [
    # fixture, models, version, role, pool, per_rank, max_input, effective context, name
    (
        "server_info_0.5.23_decode.json",
        "models_131072.json",
        ("0.5.23", "decode", 412_345, (412_345,), 131_066, 131_072, "llama-3.1-8b"),
    ),
    (
        "server_info_0.5.22_prefill.json",
        "models_131072.json",
        ("0.5.22", "prefill", 200_000, (200_000,), 131_066, 131_072, "llama-3.1-8b"),
    ),
    (
        "server_info_0.5.21_decode.json",
        "models_131072.json",
        ("0.5.21", "decode", 412_345, (412_345,), 131_066, 131_072, "llama-3.1-8b"),
    ),
    (
        "server_info_0.5.20_decode.json",
        "models_131072.json",
        ("0.5.20", "decode", 412_345, (412_345,), 131_066, 131_072, "llama-3.1-8b"),
    ),
    (
        "server_info_0.5.19_prefill.json",
        "models_131072.json",
        ("0.5.19", "prefill", 412_345, (412_345,), 131_066, 131_072, "llama-3.1-8b"),
    ),
    (
        "server_info_0.5.23_incident_decode.json",
        "models_1048576.json",
        ("0.5.23", "decode", 681_280, (681_280,), 681_274, 1_048_576, "glm-5.3"),
    ),
    (
        "server_info_0.5.23_dp2_uneven_decode.json",
        "models_1048576.json",
        ("0.5.23", "decode", 1_000_000, (1_100_000, 1_000_000), 1_048_570, 1_048_576, "glm-5.3"),
    ),
    (
        "server_info_0.5.23_unified.json",
        None,
        ("0.5.23", "null", 412_345, (412_345,), 131_066, 131_072, "llama-3.1-8b"),
    ),
    (
        "server_info_flat_0.4.6.json",
        None,
        ("0.4.6.post1", "prefill", 300_000, (300_000,), 131_066, 131_072, "llama-3.1-8b"),
    ),
    (
        "server_info_flat_no_memory_usage.json",
        None,
        ("0.4.3", None, 250_000, (), 131_066, 131_072, "llama-3.1-8b"),
    ),
]


@pytest.mark.parametrize(("server_info", "models", "expected"), PARSE_TABLE)
def test_parse_report_reads_every_release_shape(
    server_info: str, models: str | None, expected: tuple[Any, ...]
) -> None:
    report = parse_report(load(server_info), load(models) if models else None)
    assert (
        report.version,
        report.role,
        report.kv_pool_tokens,
        report.kv_pool_tokens_per_rank,
        report.max_req_input_len,
        report.effective_context_length,
        report.served_model_name,
    ) == expected


def test_models_max_model_len_wins_over_the_cli_context_length() -> None:
    info = load("server_info_0.5.23_decode.json") | {"context_length": 65_536}
    models = {"data": [{"id": "m", "max_model_len": 100_000}]}
    assert parse_report(info, models).effective_context_length == 100_000


def test_cli_context_length_is_the_first_fallback() -> None:
    info = load("server_info_0.5.23_decode.json") | {"context_length": 65_536}
    assert parse_report(info, None).effective_context_length == 65_536


def test_max_req_input_len_plus_six_is_the_last_fallback() -> None:
    info = load("server_info_0.5.23_incident_decode.json") | {"context_length": None}
    # min(context, pool) = 681,280: a lower bound that never overstates the context.
    assert parse_report(info, None).effective_context_length == 681_280


def test_role_falls_back_to_rank_zero_internal_state() -> None:
    info = load("server_info_0.5.23_decode.json")
    del info["disaggregation_mode"]
    assert parse_report(info, None).role == "decode"


BAD_INFO = [
    ("a list", [1, 2, 3], "/server_info is not a JSON object: [1, 2, 3]"),
    ("a string", "<html>", '/server_info is not a JSON object: "<html>"'),
    ("null", None, "/server_info is not a JSON object: null"),
]


@pytest.mark.parametrize(
    ("payload", "problem"), [r[1:] for r in BAD_INFO], ids=[r[0] for r in BAD_INFO]
)
def test_non_object_server_info_is_a_problem(payload: object, problem: str) -> None:
    report = parse_report(payload, None)
    assert report.problems == (problem,)
    assert report.kv_pool_tokens is None


def _with_capacity(value: object) -> dict[str, Any]:
    info = load("server_info_0.5.23_decode.json")
    info["internal_states"][0]["memory_usage"]["token_capacity"] = value
    return dict(info)


BAD_CAPACITY = [
    ("negative", -5, "is negative: -5"),
    ("absurd", 10**15, "is implausibly large: 1,000,000,000,000,000"),
    ("numeric string", "412345", 'is not a number: "412345"'),
    ("boolean", True, "is not a number: true"),
    ("fraction", 1.5, "is not a whole number: 1.5"),
    ("NaN", float("nan"), "is not a whole number: NaN"),
    ("missing", None, "is missing"),
]


@pytest.mark.parametrize(
    ("value", "problem"), [r[1:] for r in BAD_CAPACITY], ids=[r[0] for r in BAD_CAPACITY]
)
def test_bad_token_capacity_leaves_the_pool_unknown(value: object, problem: str) -> None:
    report = parse_report(_with_capacity(value), load("models_131072.json"))
    assert report.kv_pool_tokens is None
    assert report.problems == (f"internal_states[0].memory_usage.token_capacity {problem}",)
    verdict = verify_offline(report)
    assert verdict.outcome is Outcome.CANNOT_TELL


def test_whole_float_capacity_is_accepted() -> None:
    assert parse_report(_with_capacity(412345.0), None).kv_pool_tokens == 412_345


def test_one_unreadable_dp_rank_makes_the_minimum_unknown() -> None:
    info = load("server_info_0.5.23_dp2_uneven_decode.json")
    del info["internal_states"][1]["memory_usage"]
    report = parse_report(info, None)
    assert report.kv_pool_tokens is None
    assert report.problems == ("internal_states[1] has no memory_usage",)


def test_fewer_ranks_than_dp_size_makes_the_minimum_unknown() -> None:
    info = load("server_info_0.5.23_dp2_uneven_decode.json")
    info["internal_states"] = info["internal_states"][:1]
    report = parse_report(info, None)
    assert report.kv_pool_tokens is None
    assert "dp_size is 2 but internal_states reports 1 rank(s)" in report.problems[0]


def test_max_total_num_tokens_is_not_trusted_for_every_dp_rank() -> None:
    info = load("server_info_flat_no_memory_usage.json") | {"dp_size": 2}
    report = parse_report(info, None)
    assert report.kv_pool_tokens is None
    assert report.problems[1].startswith("dp_size is 2 but no DP rank reports")


def test_negative_max_req_input_len_is_a_problem() -> None:
    info = load("server_info_0.5.23_decode.json") | {"max_req_input_len": -1}
    report = parse_report(info, load("models_131072.json"))
    assert report.max_req_input_len is None
    assert report.problems == ("max_req_input_len is negative: -1",)


def test_unknown_role_is_a_problem() -> None:
    info = load("server_info_0.5.23_decode.json") | {"disaggregation_mode": "both"}
    report = parse_report(info, None)
    assert report.role is None
    assert report.problems == ('disaggregation_mode is not one of prefill, decode, null: "both"',)


@pytest.mark.parametrize(
    "models",
    [{"data": []}, {"object": "list"}, [1], "x", {"data": ["m"]}],
    ids=["empty data", "no data", "a list", "a string", "data of strings"],
)
def test_garbage_models_falls_back_and_says_so(models: object) -> None:
    report = parse_report(load("server_info_0.5.23_decode.json"), models)
    assert report.effective_context_length == 131_072  # max_req_input_len + 6
    assert len(report.problems) == 1 and report.problems[0].startswith("/v1/models")


def verify_offline(report: EngineReport) -> Verdict:
    from kvgate_engine.verdict import judge

    return judge(report, Requirement(CTX))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=30,
)
# Real keys so the fuzzer reaches the parser's branches, not just "not an object".
engine_like = st.fixed_dictionaries(
    {},
    optional={
        "version": json_values,
        "disaggregation_mode": json_values,
        "max_total_num_tokens": json_values,
        "max_req_input_len": json_values,
        "context_length": json_values,
        "dp_size": json_values,
        "internal_states": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "memory_usage": st.fixed_dictionaries(
                        {}, optional={"token_capacity": json_values}
                    )
                    | json_values
                },
            )
            | json_values,
            max_size=3,
        )
        | json_values,
    },
)


@settings(max_examples=100, deadline=None)
@given(info=engine_like | json_values, models=json_values)
def test_parse_report_never_raises_and_garbage_is_never_safe(info: object, models: object) -> None:
    report = parse_report(info, models)
    verdict = verify_offline(report)
    if verdict.outcome is Outcome.SAFE:
        # Only a report with every number present and sound can be safe.
        assert report.kv_pool_tokens is not None and report.kv_pool_tokens >= CTX
        assert report.max_req_input_len is not None and report.max_req_input_len >= CTX - 6
        assert report.version is not None


# ---------------------------------------------------------------------------------------------
# HTTP against a real local server
# ---------------------------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class EngineStub:
    """An aiohttp server on 127.0.0.1 whose routes a test sets; it counts every hit."""

    def __init__(self) -> None:
        self.routes: dict[str, Handler] = {}
        self.hits: Counter[str] = Counter()
        self.release = asyncio.Event()  # lets slow handlers finish at teardown
        self.runner: web.AppRunner | None = None
        self.url = ""

    def json(self, path: str, payload: object, status: int = 200) -> None:
        async def handler(request: web.Request) -> web.StreamResponse:
            return web.json_response(payload, status=status)

        self.routes[path] = handler

    def text(
        self, path: str, body: str, status: int = 200, content_type: str = "text/html"
    ) -> None:
        async def handler(request: web.Request) -> web.StreamResponse:
            return web.Response(text=body, status=status, content_type=content_type)

        self.routes[path] = handler

    def sequence(self, path: str, *handlers: Handler) -> None:
        """Answer the n-th request with handlers[n] (the last one repeats)."""

        async def handler(request: web.Request) -> web.StreamResponse:
            index = min(self.hits[path] - 1, len(handlers) - 1)
            return await handlers[index](request)

        self.routes[path] = handler

    def slow(self, path: str) -> None:
        async def handler(request: web.Request) -> web.StreamResponse:
            await self.release.wait()
            return web.json_response({})

        self.routes[path] = handler

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.hits[request.path] += 1
        handler = self.routes.get(request.path)
        if handler is None:
            return web.Response(status=404, text="404: Not Found")
        return await handler(request)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._dispatch)
        self.runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self.release.set()
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def engine() -> AsyncIterator[EngineStub]:
    stub = EngineStub()
    await stub.start()
    try:
        yield stub
    finally:
        await stub.stop()


def serve_engine(stub: EngineStub, server_info: str, models: str | None) -> None:
    stub.json("/server_info", load(server_info))
    if models:
        stub.json("/v1/models", load(models))


async def test_live_safe_engine_is_verified(engine: EngineStub) -> None:
    serve_engine(engine, "server_info_0.5.23_decode.json", "models_131072.json")
    verdict = await verify(engine.url, Requirement(CTX, role="decode"))
    assert verdict.outcome is Outcome.SAFE
    assert verdict.report is not None and verdict.report.kv_pool_tokens == 412_345
    assert engine.hits["/server_info"] == 1 and engine.hits["/v1/models"] == 1


async def test_live_incident_engine_is_unsafe_with_numbers(engine: EngineStub) -> None:
    serve_engine(engine, "server_info_0.5.23_incident_decode.json", "models_1048576.json")
    verdict = await verify(engine.url + "/", Requirement(1_048_576, role="decode"))
    assert verdict.outcome is Outcome.UNSAFE
    assert verdict.message.startswith("KV pool 681,280 tokens < context length 1,048,576")


async def test_old_engine_is_read_through_get_server_info(engine: EngineStub) -> None:
    engine.json("/get_server_info", load("server_info_flat_0.4.6.json"))
    report = await fetch_report(engine.url)
    assert isinstance(report, EngineReport)
    assert report.version == "0.4.6.post1" and report.kv_pool_tokens == 300_000
    assert engine.hits["/server_info"] == 1 and engine.hits["/get_server_info"] == 1
    assert report.problems == (f"{engine.url}/v1/models: HTTP 404",)


async def test_no_server_info_route_cannot_tell(engine: EngineStub) -> None:
    verdict = await verify(engine.url, Requirement(CTX))
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert verdict.reason == "ReportUnreadable"
    assert verdict.message == (
        f"engine report unreadable: {engine.url} has neither /server_info nor "
        f"/get_server_info (HTTP 404); is it an SGLang engine?"
    )


async def test_html_error_page_cannot_tell(engine: EngineStub) -> None:
    engine.text("/server_info", "<html><body>Bad Gateway</body></html>")
    verdict = await verify(engine.url, Requirement(CTX))
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert verdict.reason == "ReportUnreadable"
    assert "not JSON: '<html><body>Bad Gateway</body></html>'" in verdict.message


async def test_truncated_json_cannot_tell(engine: EngineStub) -> None:
    engine.text("/server_info", '{"version": "0.5.23", "max_total', content_type="application/json")
    verdict = await verify(engine.url, Requirement(CTX))
    assert verdict.outcome is Outcome.CANNOT_TELL and verdict.reason == "ReportUnreadable"


async def test_json_array_cannot_tell(engine: EngineStub) -> None:
    engine.json("/server_info", [1, 2])
    engine.json("/v1/models", load("models_131072.json"))
    verdict = await verify(engine.url, Requirement(CTX))
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert "/server_info is not a JSON object: [1, 2]" in verdict.message


async def test_negative_numbers_from_a_live_engine_are_never_safe(engine: EngineStub) -> None:
    info = load("server_info_0.5.23_decode.json")
    info["internal_states"][0]["memory_usage"]["token_capacity"] = -1
    engine.json("/server_info", info)
    engine.json("/v1/models", load("models_131072.json"))
    verdict = await verify(engine.url, Requirement(CTX))
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert "token_capacity is negative: -1" in verdict.message


async def test_a_500_is_retried_then_read(engine: EngineStub) -> None:
    async def error(request: web.Request) -> web.StreamResponse:
        return web.Response(status=500, text="Internal Server Error")

    async def ok(request: web.Request) -> web.StreamResponse:
        return web.json_response(load("server_info_0.5.23_decode.json"))

    engine.sequence("/server_info", error, ok)
    engine.json("/v1/models", load("models_131072.json"))
    verdict = await verify(engine.url, Requirement(CTX, role="decode"), retries=2)
    assert verdict.outcome is Outcome.SAFE
    assert engine.hits["/server_info"] == 2


async def test_persistent_500_gives_up_after_the_retries(engine: EngineStub) -> None:
    engine.text("/server_info", "Internal Server Error", status=500, content_type="text/plain")
    verdict = await verify(engine.url, Requirement(CTX), retries=2)
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert verdict.reason == "EngineUnreachable"
    assert "HTTP 500: 'Internal Server Error'" in verdict.message
    assert engine.hits["/server_info"] == 3  # one try + two retries


async def test_a_400_is_not_retried(engine: EngineStub) -> None:
    engine.text("/server_info", "nope", status=403, content_type="text/plain")
    verdict = await verify(engine.url, Requirement(CTX), retries=2)
    assert verdict.reason == "ReportUnreadable" and "HTTP 403" in verdict.message
    assert engine.hits["/server_info"] == 1


async def test_a_slow_engine_times_out_within_the_budget(engine: EngineStub) -> None:
    engine.slow("/server_info")
    started = time.monotonic()
    verdict = await verify(engine.url, Requirement(CTX), timeout=0.2, retries=1)
    elapsed = time.monotonic() - started
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert verdict.reason == "EngineUnreachable"
    assert "no answer within 0.2 s" in verdict.message
    # two attempts of 0.2 s plus one 0.1 s backoff; generous for a loaded machine
    assert elapsed < 2.0
    assert engine.hits["/server_info"] == 2


async def test_slow_models_does_not_block_the_verdict_beyond_the_timeout(
    engine: EngineStub,
) -> None:
    engine.json("/server_info", load("server_info_0.5.23_decode.json"))
    engine.slow("/v1/models")
    verdict = await verify(engine.url, Requirement(CTX, role="decode"), timeout=0.2, retries=0)
    assert verdict.outcome is Outcome.SAFE  # max_req_input_len + 6 proves the context
    assert verdict.report is not None
    assert any("no answer within 0.2 s" in p for p in verdict.report.problems)


async def test_connection_refused_cannot_tell() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    verdict = await verify(f"http://127.0.0.1:{port}", Requirement(CTX), retries=1)
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert verdict.reason == "EngineUnreachable"
    assert f"GET http://127.0.0.1:{port}/server_info" in verdict.message


async def test_invalid_url_cannot_tell() -> None:
    verdict = await verify("not a url", Requirement(CTX), retries=0)
    assert verdict.outcome is Outcome.CANNOT_TELL
