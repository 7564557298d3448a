"""The probe: parse every SGLang payload shape, and survive every way an engine can misbehave.

HTTP tests run a real aiohttp server on 127.0.0.1 that serves the SGLang-shaped fixtures, garbage,
slow answers, 404s and 500s.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from kvgate_engine.probe import (
    SERVER_INFO_LIMITS,
    fetch_report,
    parse_report,
    project_models,
    project_server_info,
    verify,
)
from kvgate_engine.report import EngineReport
from kvgate_engine.untrusted import BodyLimits, Unreadable, count_values, decode_json
from kvgate_engine.verdict import Outcome, Requirement, Verdict, judge

FIXTURES = Path(__file__).parents[1] / "fixtures" / "engine"
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
    ("a list", [1, 2, 3], "/server_info is not a JSON object: a list"),
    ("a string", "<html>", "/server_info is not a JSON object: a string of 6 characters"),
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


@settings(max_examples=200, deadline=None)
@given(info=engine_like | json_values, models=json_values)
def test_the_kept_projection_reads_exactly_like_the_whole_document(
    info: object, models: object
) -> None:
    # The probe keeps only the projection of each answer (so no large document outlives its
    # parse); parse_report must not be able to tell the difference.
    assert parse_report(project_server_info(info), project_models(models)) == parse_report(
        info, models
    )


@pytest.mark.parametrize(("server_info", "models", "expected"), PARSE_TABLE)
def test_the_projection_of_every_release_shape_reads_the_same(
    server_info: str, models: str | None, expected: tuple[Any, ...]
) -> None:
    info, card = load(server_info), load(models) if models else None
    assert parse_report(project_server_info(info), project_models(card)) == parse_report(info, card)
    assert len(json.dumps(project_server_info(info))) < 400


SHOWN = [
    # what the engine sent as disaggregation_mode -> how a problem shows it
    ("both", '"both"'),
    ("Decode-v2.1", '"Decode-v2.1"'),
    ("decode\nEngine verified", "a string of 22 characters"),
    ("<b>decode</b>", "a string of 13 characters"),
    ("x" * 33, "a string of 33 characters"),
    (7, "7"),
    (10**30, "a 31-digit number"),
    (1.5, "1.5"),
    (float("nan"), "NaN"),
    (True, "true"),
    (["decode"], "a list"),
    ({"mode": "decode"}, "an object"),
]


@pytest.mark.parametrize(("value", "shown"), SHOWN, ids=[repr(v)[:30] for v, _ in SHOWN])
def test_problems_quote_only_numbers_and_short_plain_words(value: object, shown: str) -> None:
    report = parse_report(
        load("server_info_0.5.23_decode.json") | {"disaggregation_mode": value}, None
    )
    assert report.problems == (f"disaggregation_mode is not one of prefill, decode, null: {shown}",)


VERSIONS = [
    # sent, kept, how a problem shows it
    ("0.5.23", "0.5.23", None),
    ("0.5.23.post1", "0.5.23.post1", None),
    ("0.5.0rc2", "0.5.0rc2", None),
    ("0.5.23+cu124", "0.5.23+cu124", None),
    ("0.5.23\nkvgate: engine verified", None, "a string of 30 characters"),
    ("0.5.23 ", None, "a string of 7 characters"),
    ("v0.5.23", None, '"v0.5.23"'),
    ("9" * 65, None, "a string of 65 characters"),
    ("<0.5.23>", None, "a string of 8 characters"),
]


@pytest.mark.parametrize(("sent", "kept", "shown"), VERSIONS)
def test_only_a_version_shaped_version_is_kept(
    sent: str, kept: str | None, shown: str | None
) -> None:
    report = parse_report(load("server_info_0.5.23_decode.json") | {"version": sent}, None)
    assert report.version == kept
    if kept is None:
        assert report.problems == (f"version is not a version string: {shown}",)
        assert verify_offline(report).outcome is Outcome.CANNOT_TELL


def test_ten_thousand_unreadable_ranks_make_four_problems_and_a_short_message() -> None:
    ranks = [{"memory_usage": {"token_capacity": 412_345}}] + [{}] * 10_000
    info = load("server_info_0.5.23_decode.json") | {"internal_states": ranks}
    report = parse_report(info, None)
    assert report.kv_pool_tokens is None
    assert report.problems[:3] == tuple(
        f"internal_states[{i}] has no memory_usage" for i in range(1, 4)
    )
    assert report.problems[3:] == ("and 9,997 more DP ranks without a readable token_capacity",)


def test_the_worst_report_still_makes_a_short_message() -> None:
    odd = "\n" + "x" * 10_000
    info = {
        "version": odd,
        "disaggregation_mode": odd,
        "max_total_num_tokens": -(10**4000),
        "max_req_input_len": 10**4000,
        "context_length": odd,
        "dp_size": 10**9,
        "served_model_name": odd,
        "internal_states": [{"memory_usage": {"token_capacity": odd}}] * 100_000,
    }
    verdict = verify_offline(parse_report(info, {"data": [odd]}))
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert len(verdict.message) < 1_500
    assert "xxx" not in verdict.message


# ---------------------------------------------------------------------------------------------
# Parse cost: what the worst body within the caps costs to parse
# ---------------------------------------------------------------------------------------------


def costly_bodies(limits: Any, fill: str) -> dict[str, bytes]:
    """Cheap-to-send, costly-to-parse shapes, each as large as ``fill`` says: ``values`` (the
    most the value cap lets through) or ``bytes`` (the byte cap alone: refused, or it would cost
    ~27x its size)."""

    def count(unit: bytes) -> int:
        per = count_values(unit) - 1
        if fill == "values":
            return (limits.max_values - 3) // per
        return (limits.max_bytes - 2) // len(unit) - 1

    def many(unit: bytes) -> bytes:
        return b"[" + unit * count(unit) + unit[:-1] + b"]"

    keys = b",".join(b'"%x":{}' % i for i in range(count(b'"12345":{},')))
    return {
        "empty objects": many(b"{},"),
        "empty lists": many(b"[],"),
        "unique keys": b"{" + keys + b"}",
        "short strings": many(b'"ab",'),
        "floats": many(b"1.5,"),
        "one long string": b'"' + b"x" * (limits.max_bytes - 2) + b'"',
    }


SHAPES = list(costly_bodies(BodyLimits(64, 4), "values"))


@pytest.mark.parametrize("fill", ["values", "bytes"])
@pytest.mark.parametrize("shape", SHAPES)
def test_any_server_info_within_the_byte_cap_parses_in_bounded_memory_or_is_refused(
    shape: str, fill: str
) -> None:
    body = costly_bodies(SERVER_INFO_LIMITS, fill)[shape]
    assert len(body) <= SERVER_INFO_LIMITS.max_bytes
    tracemalloc.start()
    try:
        doc = decode_json(body, SERVER_INFO_LIMITS, "GET /server_info")
    except Unreadable as exc:
        assert fill == "bytes" and "refused unparsed" in str(exc)
    else:
        del doc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    # Measured: at most ~23 MiB (unique keys at the value cap); 4 MiB of {} would cost ~100 MiB.
    assert peak < 32 * 2**20, f"{shape}: {peak / 2**20:.1f} MiB"


@pytest.mark.parametrize("unit", [b"{},", b"[],", b"0,", b'"",'])
def test_one_value_over_the_cap_is_refused_unparsed(unit: bytes) -> None:
    n = SERVER_INFO_LIMITS.max_values
    body = b"[" + unit * n + unit[:-1] + b"]"  # n + 1 elements and the list
    with pytest.raises(Unreadable, match=r"refused unparsed: .* above the cap of 262,144"):
        decode_json(body, SERVER_INFO_LIMITS, "GET /server_info")


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
    assert verdict.message == (
        f"engine report unreadable: GET {engine.url}/server_info: not JSON (Expecting value, "
        "37 bytes)"
    )


async def test_truncated_json_cannot_tell(engine: EngineStub) -> None:
    engine.text("/server_info", '{"version": "0.5.23", "max_total', content_type="application/json")
    verdict = await verify(engine.url, Requirement(CTX))
    assert verdict.outcome is Outcome.CANNOT_TELL and verdict.reason == "ReportUnreadable"


async def test_json_array_cannot_tell(engine: EngineStub) -> None:
    engine.json("/server_info", [1, 2])
    engine.json("/v1/models", load("models_131072.json"))
    verdict = await verify(engine.url, Requirement(CTX))
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert "/server_info is not a JSON object: a list" in verdict.message


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
    assert verdict.message == f"engine unreachable: GET {engine.url}/server_info: HTTP 500"
    assert engine.hits["/server_info"] == 3  # one try + two retries


async def test_a_400_is_not_retried(engine: EngineStub) -> None:
    engine.text("/server_info", "nope", status=400, content_type="text/plain")
    verdict = await verify(engine.url, Requirement(CTX), retries=2)
    assert verdict.reason == "ReportUnreadable" and "HTTP 400" in verdict.message
    assert engine.hits["/server_info"] == 1


async def test_a_403_is_not_retried_and_asks_for_the_api_key(engine: EngineStub) -> None:
    engine.text("/server_info", "nope", status=403, content_type="text/plain")
    verdict = await verify(engine.url, Requirement(CTX), retries=2)
    assert verdict.reason == "EngineUnauthorized" and "HTTP 403" in verdict.message
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
    engine.slow("/v1/models")  # never answers while the test runs
    # 2 s, not 0.2: the unit tier runs at nice 15 beside the e2e tier, where this in-process
    # stub's /server_info can take longer than 0.2 s to answer.
    verdict = await verify(engine.url, Requirement(CTX, role="decode"), timeout=2.0, retries=0)
    assert verdict.outcome is Outcome.SAFE  # max_req_input_len + 6 proves the context
    assert verdict.report is not None
    assert any("/v1/models: no answer within 2 s" in p for p in verdict.report.problems)


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


# ---------------------------------------------------------------------------------------------
# Tenant-controlled fetches: whoever can edit a pod decides what its address answers
# ---------------------------------------------------------------------------------------------

SECRET = "SECRET-7f3a9c"  # stands for whatever the operator's network position could read


def safe_info(**extra: object) -> dict[str, Any]:
    return dict(load("server_info_0.5.23_decode.json")) | extra


def assert_no_secret(verdict: Verdict) -> None:
    assert SECRET not in verdict.message
    for finding in verdict.findings:
        assert SECRET not in finding.message
    if verdict.report is not None:
        assert SECRET not in repr(verdict.report)


@pytest.fixture
async def elsewhere() -> AsyncIterator[EngineStub]:
    """Another server: what a redirect would make the operator read (metadata, another engine)."""
    stub = EngineStub()
    await stub.start()
    try:
        yield stub
    finally:
        await stub.stop()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_is_not_followed_and_cannot_tell(
    engine: EngineStub, elsewhere: EngineStub, status: int
) -> None:
    # The redirect target is a perfectly safe engine: following it would verify the wrong one.
    serve_engine(elsewhere, "server_info_0.5.23_decode.json", "models_131072.json")
    target = f"{elsewhere.url}/server_info?{SECRET}"

    async def redirect(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, headers={"Location": target}, text=SECRET)

    engine.routes["/server_info"] = redirect
    engine.routes["/v1/models"] = redirect
    verdict = await verify(engine.url, Requirement(CTX, role="decode"))
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert verdict.reason == "ReportUnreadable"
    assert f"GET {engine.url}/server_info: HTTP {status} redirect, not followed" in verdict.message
    assert elsewhere.hits == Counter()  # the operator never fetched the Location
    assert elsewhere.url not in verdict.message
    assert_no_secret(verdict)


async def test_a_redirect_on_models_alone_is_not_followed(
    engine: EngineStub, elsewhere: EngineStub
) -> None:
    elsewhere.json("/v1/models", {"data": [{"id": "m", "max_model_len": 10**9}]})
    engine.json("/server_info", safe_info())

    async def redirect(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(f"{elsewhere.url}/v1/models")

    engine.routes["/v1/models"] = redirect
    report = await fetch_report(engine.url)
    assert isinstance(report, EngineReport)
    assert elsewhere.hits == Counter()
    assert report.effective_context_length == 131_072  # the fallback, not the target's 10**9
    assert f"GET {engine.url}/v1/models: HTTP 302 redirect, not followed" in report.problems[-1]


def padded_info(size: int) -> bytes:
    """A safe /server_info of exactly ``size`` bytes (one long string field pads it)."""
    body = json.dumps(safe_info(pad="")).encode()
    return body.replace(b'"pad": ""', b'"pad": "' + b"x" * (size - len(body)) + b'"')


async def test_a_server_info_over_4_mib_cannot_tell_and_names_the_cap(engine: EngineStub) -> None:
    body = padded_info(4 * 2**20 + 1)

    async def big(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    engine.routes["/server_info"] = big
    engine.json("/v1/models", load("models_131072.json"))
    verdict = await verify(engine.url, Requirement(CTX, role="decode"))
    assert verdict.outcome is Outcome.CANNOT_TELL and verdict.reason == "ReportUnreadable"
    assert "body larger than the 4 MiB cap" in verdict.message


async def test_a_server_info_just_under_the_cap_is_read(engine: EngineStub) -> None:
    body = padded_info(4 * 2**20)

    async def big(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    engine.routes["/server_info"] = big
    engine.json("/v1/models", load("models_131072.json"))
    verdict = await verify(engine.url, Requirement(CTX, role="decode"))
    assert verdict.outcome is Outcome.SAFE


async def test_an_endless_chunked_body_is_cut_off_at_the_cap(engine: EngineStub) -> None:
    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)  # chunked: no Content-Length to refuse early
        await response.write(b'{"version": "0.5.23", "pad": "')
        while not engine.release.is_set():
            await response.write(b"x" * 65536)
        return response

    engine.routes["/server_info"] = endless
    verdict = await asyncio.wait_for(verify(engine.url, Requirement(CTX), timeout=30), 20)
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert "body larger than the 4 MiB cap" in verdict.message


async def test_models_over_1_mib_is_not_read(engine: EngineStub) -> None:
    engine.json("/server_info", safe_info())
    engine.json("/v1/models", {"data": [{"id": "m", "max_model_len": 131_072}], "pad": "x" * 2**20})
    report = await fetch_report(engine.url)
    assert isinstance(report, EngineReport)
    assert "body larger than the 1 MiB cap" in report.problems[-1]


def bomb(unit: bytes, size: int) -> bytes:
    """A safe /server_info whose ``pad`` is a list of ``unit`` repeated to ``size`` bytes."""
    head = json.dumps(safe_info(pad=[])).encode()
    count = (size - len(head)) // len(unit)
    return head.replace(b'"pad": []', b'"pad": [' + (unit * count)[:-1] + b"]")


async def test_a_json_bomb_within_the_byte_cap_is_refused_unparsed(engine: EngineStub) -> None:
    # 3.9 MiB of {}: CPython would spend ~100 MiB on it (~370 MiB for the 16 MiB of the finding).
    body = bomb(b"{},", int(3.9 * 2**20))

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    engine.routes["/server_info"] = handler
    engine.json("/v1/models", load("models_131072.json"))
    verdict = await verify(engine.url, Requirement(CTX, role="decode"))
    assert verdict.outcome is Outcome.CANNOT_TELL and verdict.reason == "ReportUnreadable"
    assert "refused unparsed" in verdict.message
    assert "above the cap of 262,144" in verdict.message


async def test_deeply_nested_json_is_unreadable_not_a_crash(engine: EngineStub) -> None:
    depth = 100_000
    body = b'{"version": "0.5.23", "pad": ' + b"[" * depth + b"]" * depth + b"}"

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    engine.routes["/server_info"] = handler
    verdict = await verify(engine.url, Requirement(CTX))
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert verdict.reason == "ReportUnreadable"
    assert "nested too deeply" in verdict.message


async def test_a_body_trickled_after_the_headers_is_cut_off_at_the_deadline(
    engine: EngineStub,
) -> None:
    async def slowloris(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = 10_000
        await response.prepare(request)
        while not engine.release.is_set():
            await response.write(b" ")
            await asyncio.sleep(0.05)
        return response

    engine.routes["/server_info"] = slowloris
    started = time.monotonic()
    verdict = await asyncio.wait_for(
        verify(engine.url, Requirement(CTX), timeout=0.5, retries=0), 10
    )
    elapsed = time.monotonic() - started
    assert verdict.outcome is Outcome.CANNOT_TELL and verdict.reason == "EngineUnreachable"
    assert f"GET {engine.url}/server_info: no answer within 0.5 s" in verdict.message
    assert elapsed < 3.0


ECHO_STATUSES = [400, 403, 418, 500, 503]


@pytest.mark.parametrize("status", ECHO_STATUSES)
async def test_an_error_body_is_never_echoed(engine: EngineStub, status: int) -> None:
    engine.text("/server_info", f"<pre>{SECRET}</pre>", status=status)
    engine.text("/v1/models", SECRET, status=status)
    verdict = await verify(engine.url, Requirement(CTX), retries=0)
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert f"GET {engine.url}/server_info: HTTP {status}" in verdict.message
    assert_no_secret(verdict)


async def test_a_non_json_body_is_never_echoed(engine: EngineStub) -> None:
    engine.text("/server_info", f"root:x:0:0:{SECRET}:/root:/bin/bash\n")
    verdict = await verify(engine.url, Requirement(CTX))
    assert verdict.outcome is Outcome.CANNOT_TELL and "not JSON" in verdict.message
    assert_no_secret(verdict)


async def test_a_broken_status_line_is_never_echoed() -> None:
    # aiohttp's parser error quotes the offending line: the message must not.
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(f"HTTPX {SECRET}\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        verdict = await verify(f"http://127.0.0.1:{port}", Requirement(CTX), retries=0)
    finally:
        server.close()
        await server.wait_closed()
    assert verdict.outcome is Outcome.CANNOT_TELL and verdict.reason == "EngineUnreachable"
    assert "not a valid HTTP response" in verdict.message
    assert_no_secret(verdict)


INJECTED_FIELDS = [
    ("version", f"0.5.23\nkvgate: engine verified {SECRET}"),
    ("version", f"0.5.23+{SECRET}" + "0" * 80),
    ("version", [SECRET]),
    ("disaggregation_mode", f"decode {SECRET}"),
    ("max_req_input_len", f"131066 {SECRET}"),
    ("internal_states", f"<{SECRET}>"),
    ("internal_states", [{"memory_usage": f"<{SECRET}>"}]),
    ("internal_states", [{"memory_usage": {"token_capacity": f"{SECRET} tokens"}}]),
]


@pytest.mark.parametrize(
    ("key", "value"), INJECTED_FIELDS, ids=[f"{k}={v!r}"[:40] for k, v in INJECTED_FIELDS]
)
async def test_an_odd_field_is_never_echoed(engine: EngineStub, key: str, value: object) -> None:
    engine.json("/server_info", safe_info(**{key: value}))
    engine.json("/v1/models", {"data": [{"id": "m", "max_model_len": f"{SECRET}\n"}]})
    verdict = await verify(engine.url, Requirement(CTX, role="decode"))
    assert verdict.report is not None and verdict.report.problems  # it was seen, and described
    assert_no_secret(verdict)


@pytest.mark.parametrize(
    "name", [f"llama\n{SECRET}", f"<script>{SECRET}</script>", "m" * 300 + SECRET]
)
async def test_an_odd_model_name_is_dropped_not_kept(engine: EngineStub, name: str) -> None:
    # The name is not a check (the verdict may be safe), but it is never kept to be shown.
    engine.json("/server_info", safe_info(served_model_name=None))
    engine.json("/v1/models", {"data": [{"id": name, "max_model_len": 131_072}]})
    verdict = await verify(engine.url, Requirement(CTX, role="decode"))
    assert verdict.outcome is Outcome.SAFE
    assert verdict.report is not None and verdict.report.served_model_name is None
    assert_no_secret(verdict)


async def test_a_compressed_body_is_not_inflated(engine: EngineStub) -> None:
    # 4 MiB of zeros gzip to ~4 KB: inflating would hand the parser far more than was sent.
    bomb_body = gzip.compress(json.dumps(safe_info(pad="0" * 4 * 2**20)).encode())
    seen: list[str] = []

    async def gzipped(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Accept-Encoding", ""))
        return web.Response(
            body=bomb_body,
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )

    engine.routes["/server_info"] = gzipped
    verdict = await verify(engine.url, Requirement(CTX))
    assert seen == ["identity"]  # kvgate asks for the bytes as they are
    assert verdict.outcome is Outcome.CANNOT_TELL and verdict.reason == "ReportUnreadable"
    assert f"not JSON ({len(bomb_body):,} bytes)" in verdict.message


# --- DP attention (SGLang 0.5.23, sglang/srt/arg_groups/parallel_hook.py
# handle_deprecated_dp_attention: `--dp-size N --enable-dp-attention` -> attn_dp_size N, dp_size 1;
# one scheduler, so one KV pool, per rank of dp_size × attn_dp_size:
# sglang/srt/runtime_context.py num_dp_ranks_of)


def _dp_attention(
    ranks: int, reported: int, pools: tuple[int, ...] | None = None
) -> dict[str, Any]:
    info = load("server_info_0.5.23_decode.json")
    rank0 = info["internal_states"][0]
    states = []
    for index in range(reported):
        state = json.loads(json.dumps(rank0))
        if pools is not None:
            state["memory_usage"]["token_capacity"] = pools[index]
        states.append(state)
    return info | {
        "dp_size": 1,
        "attn_dp_size": ranks,
        "enable_dp_attention": ranks > 1,
        "internal_states": states,
    }


def test_dp_attention_pool_is_the_minimum_over_all_attention_dp_ranks() -> None:
    info = _dp_attention(4, 4, pools=(500_000, 412_345, 300_000, 450_000))
    report = parse_report(info, load("models_131072.json"))
    assert report.kv_pool_tokens == 300_000
    assert report.kv_pool_tokens_per_rank == (500_000, 412_345, 300_000, 450_000)


def test_dp_attention_engine_reporting_fewer_ranks_than_attn_dp_size_cannot_tell() -> None:
    # dp_size stays 1 under DP attention: counting dp_size alone would take rank 0's pool for all.
    report = parse_report(_dp_attention(4, 1), load("models_131072.json"))
    assert report.kv_pool_tokens is None
    assert report.problems[0] == (
        "dp_size 1 × attn_dp_size 4 = 4 DP ranks but internal_states reports 1 rank(s); the "
        "smallest pool is unknown"
    )
    assert verify_offline(report).outcome is Outcome.CANNOT_TELL


def test_max_total_num_tokens_is_not_trusted_under_dp_attention() -> None:
    info = load("server_info_flat_no_memory_usage.json") | {"dp_size": 1, "attn_dp_size": 8}
    report = parse_report(info, None)
    assert report.kv_pool_tokens is None
    assert report.problems[1].startswith(
        "dp_size 1 × attn_dp_size 8 = 8 DP ranks but no DP rank reports"
    )


def test_the_projection_keeps_attn_dp_size() -> None:
    info = _dp_attention(4, 1)
    assert project_server_info(info)["attn_dp_size"] == 4  # type: ignore[index]
    assert parse_report(project_server_info(info), None) == parse_report(info, None)


# --- --enable-pd-role-switch: the live role is per rank
# (sglang/srt/managers/scheduler_components/internal_state.py _add_disaggregation writes the
# scheduler's current mode into each rank's internal state; the top level is the start-up flag)


def test_the_live_rank_role_wins_over_the_start_up_role() -> None:
    info = _dp_attention(2, 2)
    for state in info["internal_states"]:
        state["disaggregation_mode"] = "prefill"  # flipped at run time via /pd_role_switch
    report = parse_report(info | {"disaggregation_mode": "decode"}, load("models_131072.json"))
    assert report.role == "prefill"
    verdict = judge(report, Requirement(CTX, role="decode"))
    assert verdict.outcome is Outcome.UNSAFE
    assert verdict.reason == "RoleMismatch"


def test_ranks_in_different_roles_leave_the_role_unknown_and_never_safe() -> None:
    info = _dp_attention(2, 2)
    info["internal_states"][1]["disaggregation_mode"] = "prefill"
    report = parse_report(info, load("models_131072.json"))
    assert report.role is None
    assert report.problems == (
        'DP ranks run different disaggregation_mode ("decode" on 1 rank(s), "prefill" on 1 '
        "rank(s)); with --enable-pd-role-switch the live role is per rank",
    )
    assert judge(report, Requirement(CTX, role="decode")).outcome is Outcome.CANNOT_TELL


# --- Engines started with --api-key (sglang/srt/utils/auth.py decide_request_auth: /server_info
# and /v1/models are NORMAL endpoints; with --api-key they need `Authorization: Bearer <key>`)


def serve_keyed_engine(stub: EngineStub, key: str) -> None:
    """The 0.5.23 decode engine behind SGLang's API-key middleware."""
    for path, name in (
        ("/server_info", "server_info_0.5.23_decode.json"),
        ("/v1/models", "models_131072.json"),
    ):
        payload = load(name)

        async def handler(request: web.Request, payload: object = payload) -> web.StreamResponse:
            if request.headers.get("Authorization") != f"Bearer {key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
            return web.json_response(payload)

        stub.routes[path] = handler


async def test_an_engine_with_an_api_key_is_verified_with_that_key(engine: EngineStub) -> None:
    serve_keyed_engine(engine, "s3cret")
    verdict = await verify(engine.url, Requirement(CTX, role="decode"), api_key="s3cret")
    assert verdict.outcome is Outcome.SAFE, verdict.message


async def test_an_engine_with_an_api_key_probed_without_one_names_apikeysecretref(
    engine: EngineStub,
) -> None:
    serve_keyed_engine(engine, "s3cret")
    verdict = await verify(engine.url, Requirement(CTX, role="decode"), retries=0)
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert verdict.reason == "EngineUnauthorized"
    assert "HTTP 401" in verdict.message
    assert "spec.engine.apiKeySecretRef" in verdict.message
    assert engine.hits["/server_info"] == 1  # a 401 is final, not retried


async def test_a_wrong_api_key_is_refused_and_says_the_secret_is_wrong(engine: EngineStub) -> None:
    serve_keyed_engine(engine, "s3cret")
    verdict = await verify(engine.url, Requirement(CTX), api_key="stale", retries=0)
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert verdict.reason == "EngineUnauthorized"
    assert "is not the engine's --api-key" in verdict.message
    assert "stale" not in verdict.message and "s3cret" not in verdict.message
