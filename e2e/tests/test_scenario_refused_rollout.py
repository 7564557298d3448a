"""Scenario 3: a rolling update to an unsafe revision is refused and the old revision keeps
answering, untouched, throughout; the status says why, with numbers.

Which update: the issue's wording is "context raised past the pool", but the webhook denies
that spelling at admission when ``gpuMemoryGiB`` lets it estimate the pool (scenario 5 shows
the denial). An update the webhook must admit and only the live check can refuse is one with
nothing to estimate from: the update moves both roles to the small-GPU pool (24 GiB) and drops
``gpuMemoryGiB``. The new revision's live engines report a pool below the 131,072-token context.

Known-answer requests go through the MD's Service in a loop from before the update until the
refused revision's engines have been scaled down (``rollout.scaleDownRefused`` default) and ten
more requests have answered; every one must succeed with the right tokens.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_scenario_refused_rollout.py -v -s`` (root).
"""

from __future__ import annotations

import re
from functools import partial

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason

# Deadlines, not bounds: kvgate_e2e.deadlines.
from kvgate_e2e.deadlines import POD_GONE_DEADLINE, REVISION_DEADLINE, STEP_DEADLINE
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import (
    World,
    is_ready,
)
from scenario_helpers import (
    TrafficLoop,
    deadline_loop,
    engine_pods,
    events,
    get_md_table,
    known_answer,
    md_condition,
    on_pool_without_estimate,
    sample_md,
    wait_known_answer,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
MD = "rollout"
REQUESTS_AFTER_SCALE_DOWN = 10
REFUSAL = re.compile(
    r"(prefill|decode) pod \S+ reports KV pool [\d,]+ tokens < context length 131,072 "
    r"× headroom 1\.0"
)


def test_refused_rollout_leaves_the_old_revision_serving_every_request(
    world: World, namespace: str
) -> None:
    ns = namespace
    with InvariantSampler(world.cluster, ns, name="refused-rollout"):
        world.apply(sample_md(MD), namespace=ns)
        md = deadline_loop(
            "the safe revision to serve",
            lambda: (
                (m := world.get_md(MD, ns))
                and (m.get("status") or {}).get("servingRevision")
                and is_ready({"status": {"conditions": m["status"].get("conditions")}})
                and m
            ),
            REVISION_DEADLINE,
        )
        old_revision = md["status"]["servingRevision"]
        old_pods = {
            p["metadata"]["uid"]
            for p in world.list(
                "pods", ns, f"kvgate.io/deployment={MD},kvgate.io/revision={old_revision}"
            )
        }

        wait_known_answer(world, MD, ns, STEP_DEADLINE)
        with TrafficLoop(partial(known_answer, world, MD, ns)) as traffic:
            update = on_pool_without_estimate(sample_md(MD), "small")
            world.apply(update, namespace=ns)
            refused = deadline_loop(
                "the new revision to be refused",
                lambda: (
                    (m := world.get_md(MD, ns))
                    and (m.get("status") or {}).get("refusedRevision")
                    and m
                ),
                REVISION_DEADLINE,
            )
            new_revision = refused["status"]["refusedRevision"]
            deadline_loop(
                "the refused revision's engines to be scaled down",
                lambda: (
                    not [
                        p
                        for p in engine_pods(world, ns, MD)
                        if p["metadata"]["labels"]["kvgate.io/revision"] == new_revision
                    ]
                ),
                POD_GONE_DEADLINE,
            )
            count = len(traffic.results) + REQUESTS_AFTER_SCALE_DOWN
            deadline_loop(
                f"{REQUESTS_AFTER_SCALE_DOWN} more requests",
                lambda: len(traffic.results) >= count,
                STEP_DEADLINE,
            )
        status = refused["status"]
        print(get_md_table(world, ns))
        print(f"status: refused {status['refusedRevision']} serving {status['servingRevision']}")
        assert status["servingRevision"] == old_revision
        assert status["refusedRevision"] != old_revision
        ready = md_condition(world, MD, ns, "Ready")
        assert ready is not None and ready["reason"] == "RolloutRefused", ready
        assert ready["status"] == "False" and REFUSAL.search(ready["message"]), ready
        assert f"revision {status['refusedRevision']} refused" in ready["message"], ready
        assert f"revision {old_revision} keeps serving" in ready["message"], ready
        rollout_events = events(world, ns, "RolloutRefused")
        assert any(
            e["type"] == "Warning" and REFUSAL.search(e["message"]) for e in rollout_events
        ), rollout_events
        assert status["contextLength"] == 131_072, status  # the serving revision's window
        assert len(traffic.results) >= 10, traffic.results
        assert traffic.failures == [], traffic.failures[:5]
        print(
            f"MEASURED {len(traffic.results)} known-answer requests during the refused rollout, "
            f"{len(traffic.failures)} failed"
        )
        # Untouched: the same old pods serve.
        now = {
            p["metadata"]["uid"]
            for p in world.list(
                "pods", ns, f"kvgate.io/deployment={MD},kvgate.io/revision={old_revision}"
            )
        }
        assert now == old_pods
