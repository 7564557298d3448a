"""The content check at maximum length before traffic.

1. A healthy revision (the safe sample: 131,072-token context, 80 GiB GPUs) is verified, passes
   its content check through its own router (in-range prompts of ~50 % and ~100 % of the
   context answered in full, over-pool and over-context prompts refused) and only then serves.
2. An update whose engines let over-length prompts through (``KVGATE_ADMIT_OVER_LENGTH=1``: the
   pool is as large as before, so every engine pod passes the pool check and turns verified) is
   refused by the content check: the condition and an Event name the over-context prompt and
   the HTTP 200 with generated tokens. The old revision keeps answering every known-answer
   request throughout, untouched, and the invariant sampler sees no traffic path to an engine
   that failed its requirement.
3. An update whose decode engines break the abort path (``KVGATE_REFERENCE_STALE_KV_AFTER_ABORT=1``:
   an aborted request's KV lands in the pages of the next request) passes every length probe
   and is refused by the abort step: after a request dropped mid-flight, the known-answer request
   got other tokens. The healthy revision's own check ran the same abort step and passed.

Run: ``flock /tmp/kvgate-e2e.lock .venv/bin/pytest -q -s e2e/tests/test_scenario_content_check.py``
(root).
"""

from __future__ import annotations

import copy
import re
import time
from functools import partial

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import EVENT_DEADLINE, STEP_DEADLINE
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import World, is_ready
from scenario_helpers import (
    GATE,
    TrafficLoop,
    deadline_loop,
    engine_pods,
    events,
    get_md_table,
    known_answer,
    md_condition,
    md_story,
    sample_md,
    wait_known_answer,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
MD = "content"
REQUESTS_AFTER_REFUSAL = 10
# A deadline, not a bound (the run prints each time from apply to served or refused): a revision
# started, verified and content-checked (eight probes, two of them near the 131,072-token context
# on the reference engine), then serving or refused; twice REVISION_DEADLINE for the probes.
CONTENT_CHECK_DEADLINE = 600
LEAK = re.compile(
    r"131,073 tokens \(over contextLength 131,072\): HTTP 200, 8 tokens generated; want a "
    r"refusal"
)
PROBE_LINE = re.compile(r"content probe (passed|FAILED): ([\d,]+) tokens .*\(([\d.]+) s\)")
ABORT_STEP = re.compile(r"content check abort step: ([\d.]+) s \(the drop ([\d.]+) s in")
CONTAMINATION = re.compile(
    r"abort-path contamination: .*64 tokens \(known answer, (right|[\d.]+ s) after the abort\): "
    r"HTTP 200, "
    r"8 tokens generated, output_ids \[[\d, ]+\]; want output_ids \[[\d, ]+\] \(the answer "
    r"before the abort\)"
)


def _serving(world: World, ns: str) -> dict | None:  # type: ignore[type-arg]
    md = world.get_md(MD, ns)
    status = (md or {}).get("status") or {}
    if status.get("servingRevision") and is_ready(
        {"status": {"conditions": status.get("conditions")}}
    ):
        return md
    return None


def _refuse_stale_kv(world: World, ns: str, leaky: str) -> dict:  # type: ignore[type-arg]
    """Apply an update whose decode lands an aborted request's KV in the next request's pages;
    wait until it, not the leaky one, is the refused revision. Returns the ModelDeployment."""
    spec = sample_md(MD)
    spec["spec"]["engine"] = copy.deepcopy(spec["spec"]["engine"])
    spec["spec"]["engine"]["env"] = [
        {"name": "KVGATE_REFERENCE_STALE_KV_AFTER_ABORT", "value": "1"}
    ]
    world.apply(spec, namespace=ns)
    started = time.monotonic()
    md = deadline_loop(
        "the revision with a broken abort path to be refused",
        lambda: (
            (m := world.get_md(MD, ns))
            and (m.get("status") or {}).get("refusedRevision") not in (None, leaky)
            and m
        ),
        CONTENT_CHECK_DEADLINE,
        details=partial(md_story, world, MD, ns),
    )
    print(f"MEASURED broken abort path applied -> refused: {time.monotonic() - started:.1f} s")
    return md  # type: ignore[no-any-return]


def test_content_check_passes_a_healthy_revision_and_refuses_one_that_answers_over_length(
    world: World, namespace: str
) -> None:
    ns = namespace
    with InvariantSampler(world.cluster, ns, name="content-check") as sampler:
        started = time.monotonic()
        world.apply(sample_md(MD), namespace=ns)
        md = deadline_loop(
            "the healthy revision to pass its content check and serve",
            lambda: _serving(world, ns),
            CONTENT_CHECK_DEADLINE,
            details=partial(md_story, world, MD, ns),
        )
        first_serving = time.monotonic() - started
        old = md["status"]["servingRevision"]
        checks = {c["revision"]: c for c in md["status"]["contentChecks"]}
        assert checks[old]["passed"], checks
        probes = checks[old]["probes"]
        assert [(p["expect"], p["httpStatus"], p["generatedTokens"]) for p in probes] == [
            ("Answer", 200, 8),
            ("Answer", 200, 8),
            ("Refusal", probes[2]["httpStatus"], 0),
            ("Refusal", probes[3]["httpStatus"], 0),
            ("KnownAnswer", 200, 8),  # the abort step: the known answer,
            ("Abort", 200, 0),  # a 131,006-token request dropped mid-flight after its head,
            ("KnownAnswer", 200, 8),  # the same answer again at once,
            ("KnownAnswer", 200, 8),  # and once the abort has surely reached the engines
        ], probes
        assert probes[5]["promptTokens"] == 131_072 - 66 and all(p["passed"] for p in probes)
        assert all(400 <= p["httpStatus"] < 500 or p["error"] for p in probes[2:4]), probes
        assert [p["promptTokens"] for p in probes][1] == 131_072 - 10
        # The pass writes the status, then posts its Events: the Event may trail the status.
        deadline_loop(
            "the ContentCheckPassed event",
            lambda: events(world, ns, "ContentCheckPassed"),
            EVENT_DEADLINE,
        )
        old_pods = {p["metadata"]["uid"] for p in engine_pods(world, ns, MD)}

        wait_known_answer(world, MD, ns, STEP_DEADLINE, "a known-answer request")
        with TrafficLoop(partial(known_answer, world, MD, ns)) as traffic:
            leaky = sample_md(MD)
            leaky["spec"]["engine"] = copy.deepcopy(leaky["spec"]["engine"])
            leaky["spec"]["engine"]["env"] = [{"name": "KVGATE_ADMIT_OVER_LENGTH", "value": "1"}]
            world.apply(leaky, namespace=ns)
            refused = deadline_loop(
                "the leaky revision to be refused",
                lambda: (
                    (m := world.get_md(MD, ns))
                    and (m.get("status") or {}).get("refusedRevision")
                    and m
                ),
                CONTENT_CHECK_DEADLINE,
                details=partial(md_story, world, MD, ns),
            )
            new = refused["status"]["refusedRevision"]
            count = len(traffic.results) + REQUESTS_AFTER_REFUSAL
            deadline_loop(
                f"{REQUESTS_AFTER_REFUSAL} more requests",
                lambda: len(traffic.results) >= count,
                STEP_DEADLINE,
            )
        print(get_md_table(world, ns))
        status = refused["status"]
        assert new != old and status["servingRevision"] == old, status
        # The pool check passed on the leaky engines: the content check ran only after both
        # roles were verified, and it is what refused them.
        leaky_check = next(c for c in status["contentChecks"] if c["revision"] == new)
        assert not leaky_check["passed"] and LEAK.search(leaky_check["message"]), leaky_check
        ready = md_condition(world, MD, ns, "Ready")
        assert ready is not None and ready["reason"] == "RolloutRefused", ready
        assert LEAK.search(ready["message"]) and f"revision {old} keeps serving" in ready["message"]
        failed = events(world, ns, "ContentCheckFailed")
        assert any(e["type"] == "Warning" and LEAK.search(e["message"]) for e in failed), failed
        assert traffic.failures == [], traffic.failures[:5]
        assert len(traffic.results) >= REQUESTS_AFTER_REFUSAL
        now_old = {
            p["metadata"]["uid"]
            for p in engine_pods(world, ns, MD)
            if p["metadata"]["labels"]["kvgate.io/revision"] == old
        }
        assert now_old == old_pods  # untouched
        for pod in engine_pods(world, ns, MD):
            if pod["metadata"]["labels"]["kvgate.io/revision"] == new:  # not yet scaled down
                gate = next(c for c in pod["status"]["conditions"] if c["type"] == GATE)
                assert gate["status"] == "True", gate  # the pool check alone would let it in
        with TrafficLoop(partial(known_answer, world, MD, ns)) as stale_traffic:
            stale = _refuse_stale_kv(world, ns, new)
        assert stale_traffic.failures == [], stale_traffic.failures[:5]
    assert sampler.violations == [], sampler.violations[:5]
    refused_rev = stale["status"]["refusedRevision"]
    stale_check = next(c for c in stale["status"]["contentChecks"] if c["revision"] == refused_rev)
    assert CONTAMINATION.search(stale_check["message"]), stale_check["message"]
    stale_probes = stale_check["probes"]
    assert [p["expect"] for p in stale_probes[:6]] == [
        "Answer",
        "Answer",
        "Refusal",
        "Refusal",
        "KnownAnswer",
        "Abort",
    ] and all(p["passed"] for p in stale_probes[:6]), stale_probes
    wrong = [p for p in stale_probes[6:] if not p["passed"]]
    assert wrong and all(p["httpStatus"] == 200 for p in wrong), stale_probes
    assert stale["status"]["servingRevision"] == old, stale["status"]
    ready = md_condition(world, MD, ns, "Ready")
    assert ready is not None and ready["reason"] == "RolloutRefused", ready
    assert CONTAMINATION.search(ready["message"]), ready["message"]
    failed = events(world, ns, "ContentCheckFailed")
    assert any(CONTAMINATION.search(e["message"]) for e in failed), failed
    for total, drop in ABORT_STEP.findall(world.operator_log()):
        print(f"MEASURED content check abort step {total} s (the drop {drop} s in)")
    lines = PROBE_LINE.findall(world.operator_log())
    print(f"MEASURED first revision serving after {first_serving:.1f} s (content check included)")
    for verdict, tokens, seconds in lines:
        print(f"MEASURED content probe {tokens} tokens: {verdict} in {seconds} s")
    print(
        f"MEASURED {len(traffic.results)} known-answer requests during the refused rollout, "
        f"{len(traffic.failures)} failed"
    )
