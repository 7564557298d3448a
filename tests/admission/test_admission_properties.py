"""Property tests: thousands of generated and mutated ModelDeployments and AdmissionReviews each
get a decision — never a crash, never a 500, never an allow the checks would not give.

Example budget (≥ 1,000 in all): 1,200 mutated documents + 400 generated numeric specs on the
pure checks, 400 mutated AdmissionReviews over real HTTPS.
"""

from __future__ import annotations

import asyncio
import copy
import http.client
import json
import math
import ssl
import threading
from collections import ChainMap, Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from factories.admission_reviews import review, sample
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvgate.admission import check_document
from kvgate.admission.answer import WEBHOOK_PATH
from kvgate.admission.limits import (
    MAX_SPEC_BYTES,
    _spec_schema,
    size_message,
    spec_bytes,
    with_defaults,
)
from kvgate.admission.schema import _bad_numbers, number_problems
from kvgate.api.models import DEFAULT_GPU_RESERVED_GIB, ModelDeployment
from kvgate.objects.names import binding_names, derived_names
from kvgate.webhook.app import serving
from kvgate_engine.estimator import NoRoomForKvCache, estimate_pool

SAMPLE = sample()


def _paths(node: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            paths += _paths(value, (*prefix, key))
    return paths


LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.integers(min_value=-5, max_value=300_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(
        ["", "auto", "fp8_e4m3", "lmsysorg/sglang:v0.5.20", "lmsysorg/sglang:latest", "0.5.22"]
    ),
)
JSON_VALUES = st.recursive(
    LEAVES,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def mutated_documents(draw: st.DrawFn, base: dict[str, Any] = SAMPLE) -> dict[str, Any]:
    """The safe sample with 1–4 random edits: a value replaced, a key deleted or a key added."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        paths = _paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = doc
        for key in path[:-1]:
            parent = parent[key]
        if not isinstance(parent, dict):
            continue
        operation = draw(st.sampled_from(["set", "set", "delete", "add"]))
        if operation == "set":
            parent[path[-1]] = draw(JSON_VALUES)
        elif operation == "delete":
            parent.pop(path[-1], None)
        else:
            parent[draw(st.text(min_size=1, max_size=12))] = draw(JSON_VALUES)
    return doc


@st.composite
def numeric_specs(draw: st.DrawFn) -> dict[str, Any]:
    """Well-formed specs with realistic numbers, so the estimator runs on both sides of the line."""
    doc = copy.deepcopy(SAMPLE)
    spec = doc["spec"]
    # Mostly within the sample model's 131,072 tokens, where the pool decides; sometimes beyond.
    spec["model"]["contextLength"] = draw(
        st.integers(min_value=1, max_value=131_072) | st.integers(min_value=1, max_value=2**20)
    )
    spec["safety"]["headroom"] = draw(st.floats(min_value=1.0, max_value=2.0))
    spec["engine"]["kvCacheDtype"] = draw(st.sampled_from(["auto", "fp8_e4m3", "bfloat16"]))
    spec["engine"]["pageSize"] = draw(st.sampled_from([1, 16, 64]))
    for role in ("prefill", "decode"):
        spec[role]["gpuMemoryGiB"] = draw(
            st.sampled_from([16, 24, 40, 48, 80, 96, 141, 192])
            | st.floats(min_value=8, max_value=192)
        )
        spec[role]["memFractionStatic"] = draw(st.floats(min_value=0.3, max_value=0.95))
        spec[role]["tensorParallel"] = draw(st.sampled_from([1, 2, 4, 8]))
        if draw(st.booleans()):
            spec[role]["maxTotalTokens"] = draw(st.integers(min_value=1, max_value=2**21))
    return doc


def _assert_decided(document: Any) -> None:
    result = check_document(document)
    assert all(str(problem) for problem in result.denials + result.warnings)
    if result.allowed:
        # Never an accidental allow: what is allowed parses and satisfies the safety ranges.
        md = ModelDeployment.model_validate(document)
        assert md.spec.safety.headroom >= 1.0
        for role in (md.spec.prefill, md.spec.decode):
            assert 0 < role.mem_fraction_static < 1
            assert role.replicas >= 0
            assert role.tensor_parallel >= 1
    else:
        assert result.message


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_documents())
def test_every_mutated_document_gets_a_decision(document: dict[str, Any]) -> None:
    _assert_decided(document)


def _estimated_pool(document: dict[str, Any], role: str) -> int:
    """The estimator's KV pool for one role of a numeric spec, computed here independently of
    the checks; 0 when the weights leave no room for one."""
    spec = document["spec"]
    try:
        estimate = estimate_pool(
            spec["model"]["config"],
            gpu_memory_gib=spec[role]["gpuMemoryGiB"],
            tp=spec[role]["tensorParallel"],
            mem_fraction_static=spec[role]["memFractionStatic"],
            kv_cache_dtype=spec["engine"]["kvCacheDtype"],
            page_size=spec["engine"]["pageSize"],
            weights_gib=spec["model"]["weightsGiB"],
            max_total_tokens=spec[role].get("maxTotalTokens"),
            gpu_reserved_gib=spec[role].get("gpuReservedGiB", DEFAULT_GPU_RESERVED_GIB),
        )
    except NoRoomForKvCache:
        return 0
    return estimate.kv_pool_tokens


# Of the 400 generated numeric specs, at least this many must land on each side of the line (an
# allowed spec; a spec with a role whose estimated pool is below the requirement), or the property
# below has not been exercised: a check that denied everything, or a generator that never reached
# the line, would pass it.
MIN_EXAMPLES_PER_SIDE = 40


def test_an_allowed_spec_never_has_an_estimated_pool_below_the_context() -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=400, deadline=None)
    @given(numeric_specs())
    def check(document: dict[str, Any]) -> None:
        _assert_decided(document)
        result = check_document(document)
        spec = document["spec"]
        required = math.ceil(spec["model"]["contextLength"] * spec["safety"]["headroom"])
        pools = {role: _estimated_pool(document, role) for role in ("prefill", "decode")}
        if result.allowed:
            seen["allowed"] += 1
            assert all(pool >= required for pool in pools.values()), (pools, required)
        if any(0 < pool < required for pool in pools.values()):
            seen["a pool below the requirement"] += 1
        for role, pool in pools.items():
            if any(
                p.field == f"spec.{role}" and p.message.startswith("estimated KV pool")
                for p in result.denials
            ):
                seen["denied for the pool"] += 1
                assert pool < required, (role, pool, required, result.message)

    check()
    assert seen["allowed"] >= MIN_EXAMPLES_PER_SIDE, seen
    assert seen["a pool below the requirement"] >= MIN_EXAMPLES_PER_SIDE, seen
    assert seen["denied for the pool"] >= 1, seen


class ThreadedWebhook:
    """The webhook on its own event loop in a thread, so synchronous hypothesis tests can call
    it; a keep-alive HTTPS connection keeps each example cheap."""

    def __init__(self, tls_dir: Path) -> None:
        self.tls_dir = tls_dir
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.ssl = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
        self._connection: http.client.HTTPSConnection | None = None

    def _run(self) -> None:
        async def main() -> None:
            self._stop = asyncio.Event()
            try:
                async with serving(self.tls_dir) as server:
                    self.port = server.port
                    self._started.set()
                    await self._stop.wait()
            except BaseException as error:
                self._error = error
                self._started.set()

        self._loop.run_until_complete(main())
        self._loop.close()

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(timeout=15) or self._error is not None:
            raise RuntimeError(f"webhook did not start: {self._error!r}")

    def stop(self) -> None:
        if self._connection is not None:
            self._connection.close()
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=15)
        assert not self._thread.is_alive()

    def post(self, body: bytes, path: str = WEBHOOK_PATH) -> tuple[int, bytes]:
        for attempt in (1, 2):
            if self._connection is None:
                self._connection = http.client.HTTPSConnection(
                    "127.0.0.1", self.port, context=self.ssl, timeout=10
                )
            try:
                self._connection.request(
                    "POST", path, body=body, headers={"Content-Type": "application/json"}
                )
                response = self._connection.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, ConnectionError):
                self._connection.close()
                self._connection = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def threaded_webhook(tls_dir: Path) -> Iterator[ThreadedWebhook]:
    webhook = ThreadedWebhook(tls_dir)
    webhook.start()
    yield webhook
    webhook.stop()


@st.composite
def admission_reviews(draw: st.DrawFn) -> bytes:
    """Reviews whose object is a mutated document or a generated numeric spec, with the
    envelope itself sometimes mutated, sometimes replaced by random bytes."""
    kind = draw(st.sampled_from(["mutated", "numeric", "envelope", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    obj = draw(numeric_specs() if kind == "numeric" else mutated_documents())
    body: dict[str, Any] = review(obj, uid=draw(st.uuids()).hex)
    if kind == "envelope":
        body = draw(mutated_documents(base=body))
    return json.dumps(body, allow_nan=True).encode()


# Of the 400 generated reviews, at least this many must end in each kind of answer (allowed,
# denied, refused with an HTTP error; allowed and denied CREATEs compared with the pure checks),
# or the property has not been exercised: a webhook that answered every review with an HTTP 400
# (an error message, and the test returned early) passed it.
MIN_REVIEWS_PER_ANSWER = 20


def test_every_admission_review_gets_a_decision_over_https(
    threaded_webhook: ThreadedWebhook,
) -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(body=admission_reviews())
    def check(body: bytes) -> None:
        status, payload = threaded_webhook.post(body)
        assert status in (200, 400, 404, 409, 413), (status, payload[:300])
        if status != 200:
            seen["refused with an HTTP error"] += 1
            assert json.loads(payload)["error"]
            return
        answer = json.loads(payload)["response"]
        assert isinstance(answer["allowed"], bool)
        seen["allowed" if answer["allowed"] else "denied"] += 1
        sent = json.loads(body)
        request = sent["request"]
        assert answer["uid"] == request["uid"]
        if not answer["allowed"]:
            assert answer["status"]["message"]
        if request["operation"] == "CREATE":
            # The webhook decides exactly as the pure checks do: no allow by accident.
            assert answer["allowed"] == check_document(request["object"]).allowed
            seen[f"CREATE {'allowed' if answer['allowed'] else 'denied'} as the checks"] += 1

    check()
    print(f"review answers: {dict(seen)}")
    for answer in (
        "allowed",
        "denied",
        "refused with an HTTP error",
        "CREATE allowed as the checks",
        "CREATE denied as the checks",
    ):
        assert seen[answer] >= MIN_REVIEWS_PER_ANSWER, (answer, seen)


# ------------------------------------------- the webhook's fast paths equal their definitions


def _as_stored_by_definition(value: Any) -> Any:
    """Numbers as the API server writes them (1.0 -> 1): the rule, written plainly."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _as_stored_by_definition(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_stored_by_definition(v) for v in value]
    return value


def _spec_bytes_by_definition(spec: Any) -> int:
    stored = _as_stored_by_definition(with_defaults(spec, _spec_schema()))
    return len(json.dumps(stored, separators=(",", ":"), default=str))


NUMBERS = (
    st.sampled_from(
        [math.nan, math.inf, -math.inf, 2**63, -(2**63) - 1, 2**63 - 1, 1e16, 1e20, 1e21, 3.0]
    )
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(min_value=-1e22, max_value=1e22).map(float.__round__).map(float)
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.booleans()
)


@st.composite
def documents_with_odd_numbers(draw: st.DrawFn) -> dict[str, Any]:
    """The sample with 1-3 values replaced by a number (or a list of them): non-finite,
    integral floats on both sides of 1e21 (Go writes those below it as integers), beyond 64
    bits, booleans."""
    doc = draw(mutated_documents())
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(_paths(doc) or [("spec",)]))
        parent: Any = doc
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict):
            parent[path[-1]] = draw(NUMBERS | st.lists(NUMBERS, min_size=1, max_size=3))
    return doc


@st.composite
def specs_near_the_size_limit(draw: st.DrawFn) -> dict[str, Any]:
    """Odd documents whose spec is padded to within a few KiB of the size limit, either side:
    ASCII or not (escaped: one character, six bytes), and numbers that Go writes longer than
    Python (1e+20: 21 digits)."""
    doc = draw(documents_with_odd_numbers())
    spec = doc.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
        return doc
    config = spec["model"].get("config")
    config = spec["model"]["config"] = dict(config) if isinstance(config, dict) else {}
    config["rope_scaling_factors"] = [1e20] * draw(st.sampled_from([0, 1, 50, 300]))
    padding = draw(st.sampled_from(["x", "é", "x\n"]))
    target = MAX_SPEC_BYTES - spec_bytes(spec) + draw(st.integers(min_value=-3000, max_value=300))
    config["padding"] = padding * max(0, target // len(json.dumps(padding)[1:-1]))
    return doc


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    documents_with_odd_numbers()
    | mutated_documents()
    | numeric_specs()
    | specs_near_the_size_limit()
)
def test_fast_paths_of_the_checks_measure_and_find_exactly_what_their_definitions_do(
    document: dict[str, Any],
) -> None:
    spec = document.get("spec")
    # The spec size: one walk instead of defaults, then numbers, then JSON; and no walk at all
    # when the spec, as it came, is far enough below the limit.
    size = _spec_bytes_by_definition(spec)
    assert spec_bytes(spec) == size
    if isinstance(spec, Mapping):
        assert (size_message(spec) is None) == (size <= MAX_SPEC_BYTES), size
    # Numbers beyond 64 bits or not finite: a cheap walk first, locations only when needed.
    # (A Mapping that is not a dict takes the original walk.)
    assert number_problems(document) == number_problems(ChainMap(document))
    assert bool(number_problems(document)) == any(True for _ in _bad_numbers(document))
    # The names a ModelDeployment name makes too long: cached per name.
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if isinstance(name, str):
        assert binding_names(name) == [d for d in derived_names(name) if len(d.name) > d.max_length]
