"""Rollback in one command: ``kubectl annotate kvmd <name> kvgate.io/rollback=<rev>``.

A ModelDeployment serves revision A, is updated to a safe revision B (A's objects are then
deleted), and is rolled back to A with one annotation. kvgate restores A's spec from
``status.history`` (it does not need A's objects), removes the annotation, re-creates A's
engines, verifies them and only then switches traffic back; known-answer requests through the
Service never fail and the invariant sampler sees no unverified engine in any traffic path. An
annotation naming a revision kvgate did not keep is refused with an Event listing the ones it
did, and changes nothing.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_scenario_rollback.py -v -s`` (root).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason

# Deadlines, not bounds (the run prints the rollback's time): kvgate_e2e.deadlines.
from kvgate_e2e.deadlines import EVENT_DEADLINE, PASS_DEADLINE, POD_GONE_DEADLINE, REVISION_DEADLINE
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import World, is_ready
from scenario_helpers import (
    TrafficLoop,
    deadline_loop,
    events,
    known_answer,
    md_story,
    sample_md,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
MD = "rollback"


def serving(world: World, ns: str, revision_not: str | None = None) -> dict[str, Any] | None:
    md = world.get_md(MD, ns)
    status = (md or {}).get("status") or {}
    revision = status.get("servingRevision")
    if not revision or revision == revision_not or status.get("targetRevision") != revision:
        return None
    return md if is_ready({"status": {"conditions": status.get("conditions")}}) else None


def status_of(world: World, ns: str) -> dict[str, Any]:
    return dict(((world.get_md(MD, ns) or {}).get("status")) or {})


def history_of(world: World, ns: str) -> list[str]:
    return [e["revision"] for e in status_of(world, ns).get("history") or []]


def revisions_running(world: World, ns: str) -> set[str]:
    deployments = world.list("deployments", ns, f"kvgate.io/deployment={MD}")
    return {d["metadata"]["labels"]["kvgate.io/revision"] for d in deployments}


def test_one_annotation_rolls_back_to_a_deleted_revision_after_re_verifying_it(
    world: World, namespace: str
) -> None:
    ns = namespace

    def story() -> str:
        return md_story(world, MD, ns)

    with InvariantSampler(world.cluster, ns, name="rollback"):
        world.apply(sample_md(MD), namespace=ns)
        first = deadline_loop(
            "revision A to serve", lambda: serving(world, ns), REVISION_DEADLINE, details=story
        )
        rev_a = first["status"]["servingRevision"]
        update = sample_md(MD)
        update["spec"]["decode"]["memFractionStatic"] = 0.84
        world.apply(update, namespace=ns)
        second = deadline_loop(
            "revision B to serve",
            lambda: serving(world, ns, revision_not=rev_a),
            REVISION_DEADLINE,
            details=story,
        )
        rev_b = second["status"]["servingRevision"]
        deadline_loop(
            "revision A's objects to be deleted",
            lambda: revisions_running(world, ns) == {rev_b},
            POD_GONE_DEADLINE,
            details=story,
        )
        assert history_of(world, ns) == [rev_b, rev_a]

        # Not kept: refused, named, nothing changes.
        world.kubectl("annotate", "kvmd", MD, f"--namespace={ns}", "kvgate.io/rollback=0000000000")
        refused = deadline_loop(
            "the RollbackRefused Event",
            lambda: events(world, ns, "RollbackRefused"),
            PASS_DEADLINE,
            details=story,
        )
        assert f"{rev_b}, {rev_a}" in refused[0]["message"], refused[0]["message"]
        deadline_loop(
            "the refused annotation to be removed",
            lambda: (
                "kvgate.io/rollback"
                not in ((world.get_md(MD, ns) or {})["metadata"].get("annotations") or {})
            ),
            EVENT_DEADLINE,
            details=story,
        )
        assert status_of(world, ns)["servingRevision"] == rev_b

        with TrafficLoop(partial(known_answer, world, MD, ns)) as traffic:
            started = time.monotonic()
            world.kubectl(
                "annotate", "kvmd", MD, f"--namespace={ns}", f"kvgate.io/rollback={rev_a}"
            )
            back = deadline_loop(
                "revision A to serve again",
                lambda: serving(world, ns, revision_not=rev_b),
                REVISION_DEADLINE,
                details=story,
            )
            took = time.monotonic() - started
            deadline_loop(
                "revision B's objects to be deleted",
                lambda: revisions_running(world, ns) == {rev_a},
                POD_GONE_DEADLINE,
                details=story,
            )
        assert back["status"]["servingRevision"] == rev_a
        assert back["spec"]["decode"]["memFractionStatic"] == 0.85  # A's spec, restored
        assert "kvgate.io/rollback" not in (back["metadata"].get("annotations") or {})
        started_events = events(world, ns, "RollbackStarted")
        assert started_events and rev_a in started_events[0]["message"]
        assert "verified before it takes traffic" in started_events[0]["message"]
        print(
            f"MEASURED rollback annotate -> revision A serving again {took:.1f}s; "
            f"{len(traffic.results)} known-answer requests meanwhile, "
            f"{len(traffic.failures)} failed"
        )
        assert len(traffic.results) >= 10 and traffic.failures == [], traffic.failures[:3]
        assert history_of(world, ns) == [rev_a, rev_b]
