"""Progressive rollouts: traffic moves in gated steps, and a failing step rolls back.

``spec.rollout.strategy: Progressive`` with steps 10 % and 50 %: once the new revision's engines
are verified (and content-checked), the Service selects the routers of both revisions and the
planner runs 9 old routers to 1 new one, then 1 to 1, each step held for its pause while the step
check reads the new routers' ``smg_http_responses_total``; then all traffic moves. The observed
split is measured from every router's own counters over the part of each step where its routers
were all ready, and must be within three standard deviations (binomial) of the router ratio,
plus one point. A new revision that starts failing requests in a step (the reference engine's
injected faults: HTTP 500s, streams that break after their 200 head, or decode engines whose KV
transfers fail and that end each stream cleanly with SGLang's in-band error, which no smg
counter sees) is refused with the numbers and all traffic goes back to the old revision.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_scenario_progressive.py -v -s`` (root).
"""

from __future__ import annotations

import math
import re
import time
from functools import partial
from typing import Any

import pytest
from kvgate.rollout.progressive import counters_from_metrics
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import (
    EVENT_DEADLINE,
    REVISION_DEADLINE,
    ROUTERS_GONE_DEADLINE,
    STEP_DEADLINE,
)
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import KNOWN_PROMPT_IDS, World, http_json, is_ready, known_answer_body
from scenario_helpers import (
    SERVED_MODEL,
    TrafficLoop,
    deadline_loop,
    engine_pods,
    events,
    known_answer,
    md_story,
    sample_md,
    service_revision,
    stream_generate,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
PAUSE_SECONDS = 25
# Requests a step must see for its 3-sigma check to tell 10 % from 0 % or 20 % (sigma 4.2 points).
MIN_REQUESTS = 50
ROUTERS = "kvgate.io/deployment={name},kvgate.io/component=router"
# Deadlines, not bounds (the run prints when each step was reached; a step's own length is
# its pause + STEP_DEADLINE): only a step that never happens reaches one. Shared ones come from
# kvgate_e2e.deadlines.
# A step's split on the ready routers: step 1 waits for revision B's engines and router to start
# and verify after the apply, step 2 for the routers rescaled after step 1's pause.
STEP_REACHED_DEADLINE = 240
# Revision B serving all traffic once step 2 ended, and revision A's Deployments deleted after.
SWITCH_DEADLINE = 120
# The step check refusing revision B once its engines fail: at the end of the step's pause
# (PAUSE_SECONDS) with the requests it needs.
REFUSAL_DEADLINE = 120
STREAM_TIMEOUT = 30  # one streamed 4-token known answer through smg: ends a hung stream only


def progressive_md(name: str, pause: int = PAUSE_SECONDS, **rollout: Any) -> dict[str, Any]:
    return sample_md(
        name,
        rollout={
            "strategy": "Progressive",
            "steps": [
                {"weight": 10, "pauseSeconds": pause},
                {"weight": 50, "pauseSeconds": pause},
            ],
            **rollout,
        },
    )


def status_of(world: World, name: str, ns: str) -> dict[str, Any]:
    return dict(((world.get_md(name, ns) or {}).get("status")) or {})


def split_is(world: World, name: str, ns: str, split: str) -> bool:
    return status_of(world, name, ns).get("trafficSplit") == split


def step_left(world: World, name: str, ns: str, index: int) -> bool:
    step = (status_of(world, name, ns).get("rollout") or {}).get("step") or {}
    return step.get("index") != index


def progressing(world: World, name: str, ns: str) -> str:
    """What the Progressing condition says (why a step waits)."""
    for condition in status_of(world, name, ns).get("conditions") or []:
        if condition.get("type") == "Progressing":
            return f"Progressing: {condition.get('reason')}: {condition.get('message')}"
    return "no Progressing condition"


def serving(world: World, name: str, ns: str, not_: str | None = None) -> str | None:
    md = world.get_md(name, ns) or {}
    status = md.get("status") or {}
    revision = status.get("servingRevision")
    if not revision or revision == not_ or status.get("targetRevision") != revision:
        return None
    return revision if is_ready({"status": {"conditions": status.get("conditions")}}) else None


def router_requests(world: World, name: str, ns: str) -> dict[str, tuple[str, int]]:
    """Router pod -> (revision, generation responses so far), from each pod's own metrics."""
    out: dict[str, tuple[str, int]] = {}
    for pod in world.list("pods", ns, ROUTERS.format(name=name)):
        ip = (pod.get("status") or {}).get("podIP")
        if not ip or pod["status"].get("phase") != "Running":
            continue
        try:
            code, text = http_json(f"http://127.0.0.1:{world.forward(ip, 29000)}/metrics")
        except OSError:
            continue
        if code == 200 and isinstance(text, str):
            counters = counters_from_metrics(pod["metadata"]["name"], text)
            out[counters.pod] = (pod["metadata"]["labels"]["kvgate.io/revision"], counters.requests)
    return out


def share_between(
    before: dict[str, tuple[str, int]], after: dict[str, tuple[str, int]], target: str
) -> tuple[float, int]:
    """The target revision's share (percent) of the generation requests answered between two
    snapshots, and how many there were (pods in both snapshots only)."""
    per_revision: dict[str, int] = {}
    for pod, (revision, count) in after.items():
        if pod in before:
            per_revision[revision] = per_revision.get(revision, 0) + count - before[pod][1]
    total = sum(per_revision.values())
    return (100.0 * per_revision.get(target, 0) / total if total else 0.0), total


def test_a_safe_revision_takes_10_then_50_then_all_traffic_with_nothing_unverified_in_between(
    world: World, namespace: str
) -> None:
    ns, name = namespace, "progressive"
    world.apply(progressive_md(name), namespace=ns)
    rev_a = deadline_loop(
        "revision A to serve",
        lambda: serving(world, name, ns),
        REVISION_DEADLINE,
        details=partial(md_story, world, name, ns),
    )

    measured: list[str] = []
    with (
        InvariantSampler(world.cluster, ns, name="progressive") as sampler,
        TrafficLoop(lambda: known_answer(world, name, ns), pause=0.05) as traffic,
    ):
        # Each step must see MIN_REQUESTS: its pause comes from the rate this machine sends them
        # at now (one at a time), twice over, and is never below PAUSE_SECONDS.
        deadline_loop(
            "10 requests to revision A", lambda: len(traffic.results) >= 10, STEP_DEADLINE
        )
        rate = 10 / (traffic.results[9][0] - traffic.started[0])
        pause = max(PAUSE_SECONDS, math.ceil(2 * MIN_REQUESTS / rate))
        measured.append(f"{rate:.1f} requests/s before the update: steps of {pause} s")
        update = progressive_md(name, pause)
        update["spec"]["decode"]["memFractionStatic"] = 0.84
        applied = time.monotonic()
        world.apply(update, namespace=ns)
        rev_b = deadline_loop(
            "revision B to be the target",
            lambda: (
                status_of(world, name, ns).get("targetRevision") not in (None, rev_a)
                and status_of(world, name, ns)["targetRevision"]
            ),
            STEP_DEADLINE,
        )
        for index, (weight, old_routers, new_routers) in enumerate([(10, 9, 1), (50, 1, 1)]):
            split = f"{rev_a}={100 - weight}%,{rev_b}={weight}%"
            deadline_loop(
                f"step {index + 1}: {split} of ready routers",
                partial(split_is, world, name, ns, split),
                STEP_REACHED_DEADLINE,
                details=partial(md_story, world, name, ns),
            )
            reached = time.monotonic() - applied
            step = status_of(world, name, ns)["rollout"]["step"]
            assert step["index"] == index and step["weight"] == weight
            routers = [
                r
                for r in world.list("pods", ns, ROUTERS.format(name=name))
                if not r["metadata"].get("deletionTimestamp")
            ]
            by_revision = [
                sum(1 for r in routers if r["metadata"]["labels"]["kvgate.io/revision"] == rev)
                for rev in (rev_a, rev_b)
            ]
            assert by_revision == [old_routers, new_routers], by_revision
            before = router_requests(world, name, ns)
            deadline_loop(
                f"step {index + 1} to end",
                partial(step_left, world, name, ns, index),
                pause + STEP_DEADLINE,
                details=partial(progressing, world, name, ns),
            )
            after = router_requests(world, name, ns)
            observed, requests = share_between(before, after, rev_b)
            sigma = 100 * math.sqrt(weight / 100 * (1 - weight / 100) / max(requests, 1))
            measured.append(
                f"step {index + 1} ({weight} %) reached {reached:.1f}s after apply; observed "
                f"{observed:.1f} % of {requests} requests (3 sigma {3 * sigma:.1f} points)"
            )
            assert requests >= MIN_REQUESTS, measured
            assert abs(observed - weight) <= 3 * sigma + 1, measured[-1]
        deadline_loop(
            "revision B to serve", lambda: serving(world, name, ns, not_=rev_a), SWITCH_DEADLINE
        )
        done = time.monotonic() - applied
        assert status_of(world, name, ns)["trafficSplit"] == f"{rev_b}=100%"
        deadline_loop(
            "revision A's Deployments to be deleted",
            lambda: (
                {
                    d["metadata"]["labels"]["kvgate.io/revision"]
                    for d in world.list("deployments", ns, f"kvgate.io/deployment={name}")
                }
                == {rev_b}
            ),
            SWITCH_DEADLINE,
        )
    # The API lists Events in no particular order: match each step's by its number.
    started = sorted(e["message"] for e in events(world, ns, "TrafficStepStarted"))
    assert len(started) == 2, started
    assert "step 1" in started[0] and "takes 10 % of requests" in started[0], started
    assert "step 2" in started[1] and "takes 50 % of requests" in started[1], started
    print("MEASURED progressive: " + "; ".join(measured) + f"; all traffic at {done:.1f}s")
    print(
        f"MEASURED progressive traffic: {len(traffic.results)} known-answer requests, "
        f"{len(traffic.failures)} failed; sampler: {sampler.summary()}"
    )
    assert traffic.failures == [], traffic.failures[:3]
    sampler.check()


def streamed_known_answer(world: World, md: str, namespace: str) -> tuple[bool, str]:
    """One streamed known-answer request through ``md``'s Service: right only with a 200 head,
    the known tokens and no in-band error (a broken stream is a 200 with an error event)."""
    url = world.service_url(md, namespace) + "/generate"
    answer = stream_generate(url, known_answer_body(SERVED_MODEL), timeout=STREAM_TIMEOUT)
    ok = answer.status == 200 and not answer.errors
    return ok and answer.output_ids == KNOWN_PROMPT_IDS[
        :4
    ], f"HTTP {answer.status} {answer.raw[:200]}"


# (fault trigger, traffic, router args of the failing revision, the engines faulted: None is
# both roles). A decode stream that breaks after its 200 head is counted by smg 1.13 only in
# smg_router_request_errors_total (backend_error); its circuit breaker is off for that case, so
# no 503 (no_available_workers) can fail the step in its place: only the broken streams are left
# to count. A decode whose KV transfers fail ends each stream cleanly (200, an in-band error
# event, [DONE]): smg counts a plain 200 everywhere, only the engine's
# sglang:num_transfer_failed_reqs_total counts it.
FAULTS: dict[str, tuple[str, Any, list[str], str | None]] = {
    "fail-generation": ("/kvgate/faults/fail-generation", known_answer, [], None),
    "break-streams": (
        "/kvgate/faults/break-streams",
        streamed_known_answer,
        ["--disable-circuit-breaker"],
        "decode",
    ),
    "in-band-errors": ("/kvgate/faults/fail-transfers", streamed_known_answer, [], "decode"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_revision_that_starts_failing_in_a_step_is_rolled_back_and_refused(
    world: World, namespace: str, fault: str
) -> None:
    trigger, send, router_args, roles = FAULTS[fault]
    ns, name = namespace, f"canary-{fault}"
    world.apply(progressive_md(name), namespace=ns)
    rev_a = deadline_loop(
        "revision A to serve",
        lambda: serving(world, name, ns),
        REVISION_DEADLINE,
        details=partial(md_story, world, name, ns),
    )

    failing = progressive_md(name)
    failing["spec"]["engine"].setdefault("env", []).append(
        {"name": "KVGATE_REFERENCE_FAULTS", "value": "1"}
    )
    if router_args:
        failing["spec"]["router"] = {"args": router_args}
    with (
        InvariantSampler(world.cluster, ns, name=f"progressive-{fault}") as sampler,
        TrafficLoop(lambda: send(world, name, ns), pause=0.05) as traffic,
    ):
        world.apply(failing, namespace=ns)
        rev_b = deadline_loop(
            "revision B in its first step",
            lambda: (
                (status_of(world, name, ns).get("trafficSplit") or "").endswith("=10%")
                and status_of(world, name, ns)["targetRevision"]
            ),
            REVISION_DEADLINE,
            details=partial(md_story, world, name, ns),
        )
        at_injection = router_metrics(world, name, ns, rev_b)  # (the content check's abort: a 499)
        for pod in engine_pods(world, ns, name, roles):
            if pod["metadata"]["labels"]["kvgate.io/revision"] == rev_b:
                port = 30000
                code, _ = http_json(
                    f"http://127.0.0.1:{world.forward(pod['status']['podIP'], port)}{trigger}",
                    {},
                )
                assert code == 200
        injected = time.monotonic()
        seen: dict[str, str] = {}  # B's router pod -> its last /metrics read
        # When the last status read that showed no refusal began: the operator had not refused
        # by then. The refusal scales B's engines to zero in its own pass, so a request that ends
        # between it and this test's next read may get B's router's 503 "No available prefill
        # workers": the rollback's doing, not the fault's.
        unrefused = [injected]

        def refused() -> Any:
            seen.update(router_metrics(world, name, ns, rev_b))
            read_at = time.monotonic()
            refusal = (status_of(world, name, ns).get("rollout") or {}).get("refusal")
            if not refusal:
                unrefused[0] = read_at
            return refusal

        refusal = deadline_loop(
            "revision B refused by the step check",
            refused,
            REFUSAL_DEADLINE,
            details=partial(md_story, world, name, ns),
        )
        refused_at = time.monotonic()
        refused_after = refused_at - injected
        deadline_loop(
            "the Service to select revision A only",
            lambda: service_revision(world, ns, name) == rev_a,
            EVENT_DEADLINE,
        )
        back_after = time.monotonic() - injected
        deadline_loop(
            "revision B's routers to be gone",
            lambda: (
                not [
                    p
                    for p in world.list("pods", ns, ROUTERS.format(name=name))
                    if p["metadata"]["labels"]["kvgate.io/revision"] == rev_b
                ]
            ),
            ROUTERS_GONE_DEADLINE,
        )
        failures_at_rollback = len(traffic.failures)
        calm = time.monotonic()
        deadline_loop(
            "50 requests after the rollback",
            lambda: sum(1 for t, _, _ in traffic.results if t > calm) >= 50,
            STEP_DEADLINE,
        )
        late_failures = [f for f in traffic.failures if f[0] > calm]
    assert refusal["reason"] == "StepCheckFailed"
    assert "requests failed" in refusal["message"] and rev_a in refusal["message"]
    status = status_of(world, name, ns)
    assert status["servingRevision"] == rev_a and status["trafficSplit"] == f"{rev_a}=100%"
    refused_events = events(world, ns, "RolloutRefused")
    assert refused_events and "StepCheckFailed" in refused_events[0]["message"]
    print(
        f"MEASURED progressive rollback ({fault}): fault injected -> refused "
        f"{refused_after:.1f}s, "
        f"Service back on A {back_after:.1f}s; {failures_at_rollback} of "
        f"{len(traffic.results)} requests failed before it (all on B's router), "
        f"{len(late_failures)} after; sampler: {sampler.summary()}"
    )
    assert late_failures == [], late_failures[:3]
    if fault == "break-streams":
        # What B's router counted from the fault to the refusal: the broken streams only as
        # backend errors, so counting failed heads alone sees fewer failures than there were.
        # Usually it sees none; on a loaded machine a request may also fail at its head (a 502
        # "PD disaggregation request failed", a 499 from a client that gave up), which the heads
        # do count: the broken streams must still outnumber them (seen: 1 head, 3 streams).
        heads, broken = failed_heads_and_broken_streams(seen.values())
        heads_before, broken_before = failed_heads_and_broken_streams(at_injection.values())
        heads, broken = heads - heads_before, broken - broken_before
        counted = [
            line
            for text in seen.values()
            for line in text.splitlines()
            if line.startswith(("smg_http_responses_total{", "smg_router_request_errors_total{"))
            and "/workers" not in line
        ]
        print(
            f"MEASURED B's router from the fault to the refusal: {heads} 5xx/499 heads, "
            f"{broken} broken streams; {counted}"
        )
        assert broken > heads, (heads, broken)
    if fault == "in-band-errors":
        # Every failed request the client saw before the refusal was a 200 whose stream ended
        # cleanly with an in-band error, and smg counted none of them as a backend error: the
        # refusal came from B's decode engines' failed-transfer counters, and names the pod.
        heads, broken = failed_heads_and_broken_streams(seen.values())
        heads_before, broken_before = failed_heads_and_broken_streams(at_injection.values())
        # Only requests that ended before the refusal: after it, requests in flight on B's router
        # may meet B's engines going away.
        seen_by_client = [f[2] for f in traffic.failures if f[0] < unrefused[0]]
        around = [f[2] for f in traffic.failures if unrefused[0] <= f[0] < refused_at]
        print(
            f"MEASURED B's router from the fault to the refusal: {heads - heads_before} 5xx/499 "
            f"heads, {broken - broken_before} broken streams; the client saw "
            f"{seen_by_client[:2]}; {len(around)} more ended in the last "
            f"{refused_at - unrefused[0]:.1f} s before the refusal was read: {around[:2]}; "
            f"refusal: {refusal['message']}"
        )
        in_band = [f for f in seen_by_client + around if f.startswith("HTTP 200 ")]
        assert in_band and all('"error"' in f for f in in_band), in_band[:3]
        assert all(f.startswith("HTTP 200 ") for f in seen_by_client), seen_by_client
        # In that last stretch the refusal may already have taken B's engines from B's router
        # ("No available" workers), or be stopping them under a request B's router had sent
        # ("Transport error" from smg; seen once in a make test at 172 % CPU, where the refusal
        # came 1.1 s after the fault and the test read it 1.0 s after that).
        gone = ("No available", "Transport error")
        assert all(f in in_band or any(g in f for g in gone) for f in around), around
        assert broken == broken_before, (broken_before, broken)
        assert re.search(r"KV transfers? failed on decode pod ", refusal["message"]), refusal
    sampler.check()


def router_metrics(world: World, name: str, ns: str, revision: str) -> dict[str, str]:
    """Each of ``revision``'s router pods' /metrics text (pods that answer)."""
    out: dict[str, str] = {}
    for pod in world.list("pods", ns, ROUTERS.format(name=name)):
        ip = (pod.get("status") or {}).get("podIP")
        if pod["metadata"]["labels"]["kvgate.io/revision"] != revision or not ip:
            continue
        try:
            code, text = http_json(f"http://127.0.0.1:{world.forward(ip, 29000)}/metrics")
        except OSError:
            continue
        if code == 200 and isinstance(text, str):
            out[pod["metadata"]["name"]] = text
    return out


def failed_heads_and_broken_streams(texts: Any) -> tuple[int, int]:
    """(generation responses whose head was a 5xx or 499, generation requests smg counted as
    backend errors) over these smg /metrics texts."""
    heads = broken = 0
    for text in texts:
        for line in text.splitlines():
            value = line.rsplit(" ", 1)[-1]
            if line.startswith("smg_http_responses_total{") and '/generate"' in line:
                if 'status_code="5' in line or 'status_code="499"' in line:
                    heads += int(float(value))
            elif line.startswith("smg_router_request_errors_total{") and (
                'endpoint="generate"' in line and 'error_type="backend_error"' in line
            ):
                broken += int(float(value))
    return heads, broken
