"""Scenario 3: a rolling update to an unsafe revision is refused and the old revision keeps
answering, untouched, throughout; the status says why, with numbers.

The update moves both roles to the small-GPU pool and drops ``gpuMemoryGiB`` (so admission has
nothing to estimate with): the new revision's live engines report a pool below the 131,072-token
context. Known-answer requests go through the MD's Service in a loop from before the update until
after the refusal; every one must succeed with the right tokens.
"""

from __future__ import annotations

import time

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import (
    KNOWN_PROMPT_IDS,
    World,
    is_ready,
    known_answer_body,
    output_ids,
)
from scenario_helpers import (
    TrafficLoop,
    deadline_loop,
    events,
    get_md_table,
    md_condition,
    on_pool_without_estimate,
    sample_md,
    scenario_ns,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
__all__ = ["scenario_ns"]
MD = "rollout"
MODEL = "llama-3.1-8b"
AFTER_REFUSAL_SECONDS = 4.0


def test_refused_rollout_leaves_the_old_revision_serving_every_request(
    world: World, scenario_ns: str
) -> None:
    ns = scenario_ns
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
            300,
        )
        old_revision = md["status"]["servingRevision"]
        old_pods = {
            p["metadata"]["uid"]
            for p in world.list(
                "pods", ns, f"kvgate.io/deployment={MD},kvgate.io/revision={old_revision}"
            )
        }

        def known_answer() -> tuple[bool, str]:
            code, answer = world.router_request(MD, known_answer_body(MODEL), ns, timeout=30)
            ids = output_ids(answer)
            return code == 200 and ids == KNOWN_PROMPT_IDS[:4], f"HTTP {code} {str(answer)[:200]}"

        deadline_loop(
            "a known-answer request through the router", lambda: (r := known_answer())[0] and r, 60
        )
        with TrafficLoop(known_answer) as traffic:
            update = on_pool_without_estimate(sample_md(MD), "small")
            world.apply(update, namespace=ns)
            refused = deadline_loop(
                "the new revision to be refused",
                lambda: (
                    (m := world.get_md(MD, ns))
                    and (m.get("status") or {}).get("refusedRevision")
                    and m
                ),
                300,
            )
            settle = time.monotonic() + AFTER_REFUSAL_SECONDS
            deadline_loop("traffic after the refusal", lambda: time.monotonic() > settle, 30)
        status = refused["status"]
        print(get_md_table(world, ns))
        print(f"status: refused {status['refusedRevision']} serving {status['servingRevision']}")
        assert status["servingRevision"] == old_revision
        assert status["refusedRevision"] != old_revision
        ready = md_condition(world, MD, ns, "Ready")
        assert ready is not None and ready["reason"] == "RolloutRefused", ready
        assert "KV pool" in ready["message"] and "131,072" in ready["message"], ready
        assert f"revision {old_revision} keeps serving" in ready["message"], ready
        assert any("131,072" in e["message"] for e in events(world, ns, "RolloutRefused")), events(
            world, ns
        )
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
