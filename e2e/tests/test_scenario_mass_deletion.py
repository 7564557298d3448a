"""Deletion at scale: deleting many ModelDeployments at once, or any with the operator
down, is done by the API server and its garbage collector, not by a round trip through kvgate.

Before: every ModelDeployment ran as a kopf daemon, so kopf put ``kvgate.io/finalizer`` on it and
each deletion waited for the operator to stop the daemon (a 3 s cancellation back-off, a touch
patch to be called again, then the finalizer patch): 200 deleted at once took over 2 minutes,
and with the operator scaled to 0 or uninstalled a deletion hung until someone removed the
finalizer by hand. Now ModelDeployments carry no finalizer (kvgate.controller.md_loops); what they
own goes through ownerReferences.

1. 100 ModelDeployments (engines pinned to a pool with no node: Pending; no router, so only
   the operator's objects exist), each reconciled, none with a finalizer; ``kubectl delete kvmd
   --all``: all gone within 30 s, their Deployments garbage-collected within 90 s (measured).
2. With the controller scaled to 0, ``kubectl delete kvmd`` completes within 15 s and the garbage
   collector removes its Deployments.
3. A ModelDeployment created with the legacy ``kvgate.io/finalizer`` (as an earlier kvgate left
   it) loses it to the running operator within 30 s.

Run: ``flock /tmp/kvgate-e2e.lock .venv/bin/pytest -q -s e2e/tests/test_scenario_mass_deletion.py``
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import FIRST_PASS_DEADLINE
from kvgate_e2e.world import World
from scenario_helpers import deadline_loop, sample_md
from test_scenario_operator_down import operator_down

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
# 100, not the 200: the world's operator resyncs every 5 s (E2E_OPERATOR_ENV), so 200
# ModelDeployments keep its API server busy for minutes before the deletion even starts; the scale
# benchmark (e2e/bench/scale.py, kvgate's defaults) deletes 1,000.
MASS = 100
NO_NODE_POOL = "nowhere"  # no node has kvgate.io/pool=nowhere: engine pods stay Pending
LEGACY_FINALIZER = "kvgate.io/finalizer"
MD_SELECTOR = "kvgate.io/deployment"
# Speed claim, the scenario's point: with no finalizer the API server deletes them alone, so all
# MASS ModelDeployments are gone within DELETE_VS_APPLY times the seconds the same kubectl took to
# apply them (MASS admission reviews and writes each way; measured in the run, so a loaded machine
# slows both), and never later than MASS_DELETED_FLOOR unless that apply itself was slower. The
# old finalizer round trip took over 2 minutes for 200: one operator pass per ModelDeployment.
DELETE_VS_APPLY = 2.0
# 17.2 s measured alone (docs/testing.md); the bound this test had before it was derived.
MASS_DELETED_FLOOR = 30
# Deadlines, not bounds (the run prints each time it measured): only a step that never happens
# reaches one. Shared ones come from kvgate_e2e.deadlines.
# MASS ModelDeployments applied at once, each reconciled (12.3 s in docs/testing.md).
RECONCILED_DEADLINE = 300
# The garbage collector removing their 2 x MASS Deployments (50.6 s in docs/testing.md).
GC_DEADLINE = 90
ORPHAN_GC_DEADLINE = 60  # the garbage collector removing one ModelDeployment's Deployments
# One ModelDeployment without a finalizer deleted: a single API request (0.3 s in
# docs/testing.md); with the old finalizer and no operator it never completed, so any deadline
# tells the two apart.
DELETE_DEADLINE = 15
# The running operator removing the legacy finalizer: its first pass of the new ModelDeployment.
FINALIZER_REMOVED_DEADLINE = 30


def pending_md(name: str, **meta: Any) -> dict[str, Any]:
    """Engines pinned to no node (Pending) and no router: only the operator's own objects. The
    rollout is refused after 1 s, so each settles (steady passes) instead of polling in flight."""
    md = sample_md(name, pool=NO_NODE_POOL, router={"replicas": 0})
    md["spec"]["rollout"]["verifyTimeoutSeconds"] = 1
    md["metadata"].update(meta)
    return md


def reconciled(md: dict[str, Any]) -> bool:
    meta = md.get("metadata", {})
    return (md.get("status") or {}).get("observedGeneration") == meta.get("generation")


def managed_deployments(world: World, ns: str) -> list[Any]:
    return world.list("deployments", ns, "app.kubernetes.io/managed-by=kvgate")


def test_deleting_100_model_deployments_at_once_takes_seconds(world: World, namespace: str) -> None:
    ns = namespace
    docs = [pending_md(f"md-{i:03d}") for i in range(MASS)]
    started = time.monotonic()
    world.kubectl(
        "apply", f"--namespace={ns}", "-f", "-", input=yaml.safe_dump_all(docs), check=True
    )
    applied = time.monotonic() - started
    deleted_bound = max(MASS_DELETED_FLOOR, DELETE_VS_APPLY * applied)
    print(f"\nMEASURED {MASS} ModelDeployments applied in {applied:.1f}s")
    started = time.monotonic()
    mds = deadline_loop(
        f"all {MASS} ModelDeployments reconciled (status.observedGeneration)",
        lambda: (
            (items := world.list("modeldeployments", ns))
            and len(items) == MASS
            and all(reconciled(m) for m in items)
            and items
        ),
        RECONCILED_DEADLINE,
    )
    print(f"\nMEASURED {MASS} ModelDeployments reconciled in {time.monotonic() - started:.1f}s")
    finalized = [m["metadata"]["name"] for m in mds if m["metadata"].get("finalizers")]
    assert finalized == [], f"ModelDeployments with finalizers: {finalized[:5]}"
    created = len(managed_deployments(world, ns))
    assert created >= 2 * MASS, f"{created} Deployments for {MASS} ModelDeployments"

    started = time.monotonic()
    world.kubectl("delete", "modeldeployments", "--all", f"--namespace={ns}", "--wait=false")
    deadline_loop(
        f"all {MASS} ModelDeployments gone",
        lambda: not world.list("modeldeployments", ns),
        deleted_bound,
    )
    gone = time.monotonic() - started
    print(f"MEASURED {MASS} ModelDeployments deleted in {gone:.1f}s after kubectl delete")
    deadline_loop(
        "their Deployments garbage-collected",
        lambda: not managed_deployments(world, ns),
        GC_DEADLINE,
    )
    print(
        f"MEASURED their {created} Deployments garbage-collected in "
        f"{time.monotonic() - started:.1f}s"
    )


def test_deletion_completes_with_the_operator_down(world: World, namespace: str) -> None:
    ns = namespace
    world.apply(pending_md("orphan"), namespace=ns)
    deadline_loop(
        "the ModelDeployment reconciled, with its Deployments",
        lambda: (
            (md := world.get_md("orphan", ns)) and reconciled(md) and managed_deployments(world, ns)
        ),
        FIRST_PASS_DEADLINE,
    )
    with operator_down(world):
        started = time.monotonic()
        world.kubectl("delete", "kvmd", "orphan", f"--namespace={ns}", "--wait=false")
        deadline_loop(
            "the ModelDeployment gone with no operator running",
            lambda: world.get_md("orphan", ns) is None,
            DELETE_DEADLINE,
        )
        print(f"\nMEASURED deletion with the operator down: {time.monotonic() - started:.1f}s")
        deadline_loop(
            "its Deployments garbage-collected with no operator running",
            lambda: not managed_deployments(world, ns),
            ORPHAN_GC_DEADLINE,
        )


def test_running_operator_removes_a_legacy_finalizer(world: World, namespace: str) -> None:
    ns = namespace
    world.apply(pending_md("legacy", finalizers=[LEGACY_FINALIZER]), namespace=ns)
    deadline_loop(
        f"the operator to remove {LEGACY_FINALIZER}",
        lambda: (
            (md := world.get_md("legacy", ns)) is not None
            and LEGACY_FINALIZER not in (md["metadata"].get("finalizers") or [])
        ),
        FINALIZER_REMOVED_DEADLINE,
    )
    world.kubectl("delete", "kvmd", "legacy", f"--namespace={ns}", "--wait=false")
    deadline_loop(
        "the ModelDeployment gone", lambda: world.get_md("legacy", ns) is None, DELETE_DEADLINE
    )
