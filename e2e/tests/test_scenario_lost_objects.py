"""Lost derived objects: a Ready ModelDeployment loses a derived object (its Service, the serving
revision's router Deployment, the annotations on a target's Deployments) and the rollout state
must survive it: the revision that served keeps serving and is never deleted unless a verified
successor serves (mission invariant 3), and what was lost comes back with an Event saying why.

The durable record is the ModelDeployment's status (only the operator writes it); the Service,
the Deployments and their annotations are evidence anyone in the namespace may lose or replace.

1. ``kubectl delete service <md>``, then an update kvgate refuses (both roles on the 24 GiB pool
   without ``gpuMemoryGiB``, as scenario 3): the old revision's engine pods stay, the Service
   comes back selecting the old revision with a ``ServiceRecreated`` Event, and once it is back
   a known-answer traffic loop through it has 0 failures. Measured: how long the deployment
   answered nothing (the Service's ClusterIP is gone until kvgate recreates it).
2. During that refused rollout the serving revision's router Deployment is deleted: kvgate
   rebuilds it (``ServingDeploymentRecreated``), the Service keeps its selector, serving resumes
   (measured gap), the engine pods are untouched.
3. Mid-rollout (the target's engines pinned to a pool with no node: Pending, never verified),
   the ``kvgate.io/verify-started-at`` annotations are stripped: no switch, no deletion, and the
   rollout is refused at the recorded deadline (the clock was not reset); then the refusal
   annotations are stripped: the refused revision stays scaled down, no second refusal.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_scenario_lost_objects.py -v -s`` (root).
"""

from __future__ import annotations

import re
import time
import urllib.request
from datetime import datetime
from typing import Any

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import (
    ANSWER_DEADLINE,
    HTTP_GET_TIMEOUT,
    PASS_DEADLINE,
    POD_GONE_DEADLINE,
    REVISION_DEADLINE,
    STEP_DEADLINE,
)
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import (
    OPERATOR_NAMESPACE,
    World,
    condition,
    is_ready,
)
from scenario_helpers import (
    TrafficLoop,
    deadline_loop,
    engine_pods,
    events,
    get_md_table,
    known_answer,
    on_pool_without_estimate,
    sample_md,
    service_revision,
    wait_known_answer,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
REQUESTS_AFTER_RECOVERY = 10
VERIFY_STARTED_AT = "kvgate.io/verify-started-at"
# Deadlines, not bounds (the run prints each recovery it measured): only a step that never
# happens reaches one. Shared ones come from kvgate_e2e.deadlines.
# The deleted router Deployment recreated by kvgate and its new pod Ready (smg's start).
ROUTER_REBUILT_DEADLINE = 120
# The wall clock passing 15 s after the recorded verification start (a sleep, not CPU work),
# plus slack for the polls.
ROLLOUT_AGE_DEADLINE = 60
# Reconcile passes (a count, not seconds) after which a stripped annotation would have had its
# effect: a switch, a deletion or a reset clock.
SETTLE_PASSES = 3
# Speed claim: the stuck revision is refused less than this many seconds after its recorded
# verification deadline (a reset clock would refuse at >= 15 s more). Measured against the
# recorded verifyStartedAt + verifyTimeoutSeconds; holds if kvgate's deadline timer fires on time.
REFUSAL_LATENESS = 10


# ------------------------------------------------------------------------------ helpers
def serve_old_revision(world: World, ns: str, md_name: str, **spec: Any) -> tuple[str, set[str]]:
    """Apply the safe sample and wait until it serves and answers; its revision and the uids
    of its engine pods."""
    world.apply(sample_md(md_name, **spec), namespace=ns)
    md = deadline_loop(
        "the safe revision to serve",
        lambda: (
            (m := world.get_md(md_name, ns))
            and (m.get("status") or {}).get("servingRevision")
            and is_ready(m)
            and m
        ),
        REVISION_DEADLINE,
    )
    revision = str(md["status"]["servingRevision"])
    wait_known_answer(
        world, md_name, ns, ANSWER_DEADLINE, "a known-answer request through the Service"
    )
    return revision, engine_uids(world, ns, md_name, revision)


def engine_uids(world: World, ns: str, md_name: str, revision: str) -> set[str]:
    return {
        p["metadata"]["uid"]
        for p in engine_pods(world, ns, md_name)
        if p["metadata"]["labels"]["kvgate.io/revision"] == revision
    }


def deployments_of(world: World, ns: str, md_name: str, revision: str) -> list[dict[str, Any]]:
    return world.list(
        "deployments", ns, f"kvgate.io/deployment={md_name},kvgate.io/revision={revision}"
    )


def reconcile_passes(world: World) -> int:
    """The operator's reconcile count (``kvgate_reconcile_duration_seconds_count``)."""
    pod = world.operator_pod()
    assert pod is not None, "no operator pod"
    url = f"http://127.0.0.1:{world.forward(pod['status']['podIP'], 8080)}/metrics"
    with urllib.request.urlopen(url, timeout=HTTP_GET_TIMEOUT) as resp:
        text = resp.read().decode()
    found = re.search(r"^kvgate_reconcile_duration_seconds_count (\S+)$", text, re.MULTILINE)
    assert found, "operator /metrics has no kvgate_reconcile_duration_seconds_count"
    return int(float(found.group(1)))


def wait_passes(world: World, passes: int, what: str) -> None:
    """Wait (with a deadline) until the operator reconciled ``passes`` more times."""
    start = reconcile_passes(world)
    deadline_loop(
        f"{passes} reconcile passes {what}",
        lambda: reconcile_passes(world) >= start + passes,
        PASS_DEADLINE,
    )


def as_operator(world: World, *args: str) -> None:
    """kubectl as the operator's ServiceAccount. The chart's admission policy stops anyone else
    (the admin included) from editing kvgate's Deployments, but annotations still get lost
    through that identity (an older kvgate, a restore, a cluster without the policy): this
    injects that loss."""
    pod = world.operator_pod()
    assert pod is not None, "no operator pod"
    account = pod["spec"].get("serviceAccountName") or "default"
    world.kubectl(
        *args,
        f"--as=system:serviceaccount:{OPERATOR_NAMESPACE}:{account}",
        "--as-group=system:serviceaccounts",
    )


def recovery(traffic: TrafficLoop, since: float) -> tuple[float, int]:
    """(seconds from ``since`` to the first answered request after it, failed requests before)."""
    # Results are stamped when a request ends: one in flight at ``since`` may still succeed,
    # so the outage starts at the first failure and ends at the first success after it.
    after = [r for r in traffic.results if r[0] >= since]
    first_failure = next((r for r in after if not r[1]), None)
    if first_failure is None:
        return 0.0, 0
    first_ok = next(r for r in after if r[1] and r[0] > first_failure[0])
    failed = [r for r in after if not r[1] and r[0] < first_ok[0]]
    return first_ok[0] - since, len(failed)


def failures_after(traffic: TrafficLoop, moment: float) -> list[tuple[float, bool, str]]:
    return [r for r in traffic.results if r[0] > moment and not r[1]]


def parse_time(raw: str) -> datetime:
    return datetime.fromisoformat(raw.replace("Z", "+00:00"))


def refused_revision(world: World, ns: str, md_name: str, revision: str | None = None) -> Any:
    md = world.get_md(md_name, ns)
    refused = (md or {}).get("status", {}).get("refusedRevision")
    return md if refused and (revision is None or refused == revision) else None


# ---------------------------------------------------------------------------- scenarios
def test_lost_service_then_refused_update_keeps_the_old_revision_serving(
    world: World, namespace: str
) -> None:
    ns, md_name = namespace, "lost-svc"
    with InvariantSampler(world.cluster, ns, name="lost-service"):
        old, old_pods = serve_old_revision(world, ns, md_name)
        with TrafficLoop(lambda: known_answer(world, md_name, ns)) as traffic:
            deadline_loop(
                "traffic before the deletion", lambda: len(traffic.results) >= 5, STEP_DEADLINE
            )
            # A: the Service alone is deleted (a mistake, a GitOps prune).
            alone_at = time.monotonic()
            world.kubectl("delete", "service", md_name, f"--namespace={ns}")
            deadline_loop(
                "the Service to come back",
                lambda: service_revision(world, ns, md_name) == old,
                PASS_DEADLINE,
            )
            alone_back = time.monotonic()
            deadline_loop(
                "a request answered through the recreated Service",
                lambda: any(r[1] for r in traffic.results if r[0] > alone_back),
                STEP_DEADLINE,
            )
            alone_gap, alone_failed = recovery(traffic, alone_at)
            # B: an update kvgate refuses (its engines report a pool below the context) and the
            # Service deleted again. In this order the pass that misses the Service always sees
            # the new target (the order, deletion first, races the operator's timer).
            world.apply(on_pool_without_estimate(sample_md(md_name), "small"), namespace=ns)
            deleted_at = time.monotonic()
            world.kubectl("delete", "service", md_name, f"--namespace={ns}")
            deadline_loop(
                "the Service to come back selecting the old revision",
                lambda: service_revision(world, ns, md_name) == old,
                PASS_DEADLINE,
            )
            back_at = time.monotonic()
            deadline_loop(
                "a request answered through the recreated Service",
                lambda: any(r[1] for r in traffic.results if r[0] > back_at),
                STEP_DEADLINE,
            )
            refused = deadline_loop(
                "the new revision to be refused",
                lambda: refused_revision(world, ns, md_name),
                REVISION_DEADLINE,
            )
            new = refused["status"]["refusedRevision"]
            deadline_loop(
                "the refused revision's engines to be scaled down",
                lambda: not engine_uids(world, ns, md_name, new),
                POD_GONE_DEADLINE,
            )
            count = len(traffic.results) + REQUESTS_AFTER_RECOVERY
            deadline_loop("more requests", lambda: len(traffic.results) >= count, STEP_DEADLINE)
        gap, failed_in_gap = recovery(traffic, deleted_at)
        print(get_md_table(world, ns))
        print(
            f"MEASURED lost Service alone: the deployment answered again {alone_gap:.1f}s after "
            f"the deletion ({alone_failed} requests failed meanwhile)"
        )
        print(
            f"MEASURED lost Service + refused update: Service back {back_at - deleted_at:.1f}s "
            f"after the deletion (polled); answered again after {gap:.1f}s ({failed_in_gap} "
            f"requests failed meanwhile); {len(traffic.results)} requests in all"
        )
        # Once the Service is back, every request is answered.
        late_a = [r for r in failures_after(traffic, alone_at + alone_gap) if r[0] < deleted_at]
        late_b = failures_after(traffic, deleted_at + gap)
        assert late_a == [] and late_b == [], (late_a, late_b)
        assert new != old
        status = world.get_md(md_name, ns)["status"]  # type: ignore[index]
        assert status["servingRevision"] == old, status
        assert service_revision(world, ns, md_name) == old
        assert engine_uids(world, ns, md_name, old) == old_pods  # untouched
        roles = {
            d["metadata"]["labels"]["kvgate.io/role"]
            for d in deployments_of(world, ns, md_name, old)
        }
        assert roles == {"prefill", "decode", "router"}
        recreated = events(world, ns, "ServiceRecreated")
        assert recreated and all(e["type"] == "Warning" for e in recreated), recreated
        assert all(
            f"recreated it selecting revision {old}'s routers" in e["message"]
            and "recorded in status.servingRevision" in e["message"]
            for e in recreated
        ), recreated
        # The recreation during the update names the refused (or still verifying) target.
        notes = (f"revision {new} is refused", f"revision {new} takes traffic once verified")
        assert any(n in e["message"] for e in recreated for n in notes), recreated


def test_lost_router_deployment_of_the_serving_revision_is_rebuilt_and_serving_resumes(
    world: World, namespace: str
) -> None:
    ns, md_name = namespace, "lost-router"
    with InvariantSampler(world.cluster, ns, name="lost-router"):
        old, old_pods = serve_old_revision(world, ns, md_name)
        world.apply(on_pool_without_estimate(sample_md(md_name), "small"), namespace=ns)
        refused = deadline_loop(
            "the new revision to be refused",
            lambda: refused_revision(world, ns, md_name),
            REVISION_DEADLINE,
        )
        new = refused["status"]["refusedRevision"]
        deadline_loop(
            "the refused revision's engines to be scaled down",
            lambda: not engine_uids(world, ns, md_name, new),
            POD_GONE_DEADLINE,
        )
        router = f"{md_name}-{old}-router"
        before = world.get("deployment", router, ns)
        assert before is not None
        router_pods = f"kvgate.io/deployment={md_name},kvgate.io/component=router"
        routers_before = {p["metadata"]["uid"] for p in world.list("pods", ns, router_pods)}
        with TrafficLoop(lambda: known_answer(world, md_name, ns)) as traffic:
            deadline_loop(
                "traffic before the deletion", lambda: len(traffic.results) >= 5, STEP_DEADLINE
            )
            deleted_at = time.monotonic()
            world.kubectl("delete", "deployment", router, f"--namespace={ns}", "--wait=false")
            rebuilt = deadline_loop(
                "the router Deployment to be recreated and Ready",
                lambda: (
                    (d := world.get("deployment", router, ns))
                    and d["metadata"]["uid"] != before["metadata"]["uid"]
                    and (d.get("status") or {}).get("readyReplicas")
                    and d
                ),
                ROUTER_REBUILT_DEADLINE,
            )
            ready_at = time.monotonic()
            deadline_loop(
                "a request answered after the deletion's outage",
                lambda: any(r[1] for r in traffic.results if r[0] > ready_at),
                ANSWER_DEADLINE,
            )
            count = len(traffic.results) + REQUESTS_AFTER_RECOVERY
            deadline_loop("more requests", lambda: len(traffic.results) >= count, STEP_DEADLINE)
        failed = [r for r in traffic.results if r[0] >= deleted_at and not r[1]]
        last_failure = max((r[0] for r in failed), default=deleted_at)
        recovered = next(r[0] for r in traffic.results if r[0] > last_failure and r[1])
        routers_after = {
            p["metadata"]["uid"]
            for p in world.list("pods", ns, router_pods)
            if not p["metadata"].get("deletionTimestamp")
        }
        print(
            f"MEASURED lost router Deployment: recreated and Ready {ready_at - deleted_at:.1f}s "
            f"after the deletion (router pod replaced: {not routers_after & routers_before}); "
            f"{len(failed)} requests failed"
            + (f" over {last_failure - deleted_at:.1f}s" if failed else "")
            + ", none after"
        )
        assert rebuilt["metadata"]["labels"]["kvgate.io/revision"] == old
        assert service_revision(world, ns, md_name) == old
        assert engine_uids(world, ns, md_name, old) == old_pods
        assert world.get_md(md_name, ns)["status"]["servingRevision"] == old  # type: ignore[index]
        assert failures_after(traffic, recovered) == []
        notes = rebuilt["metadata"].get("annotations") or {}
        assert "kvgate.io/refused-reason" not in notes, notes  # the target's refusal isn't its
        (event,) = events(world, ns, "ServingDeploymentRecreated")
        assert f"router Deployment of serving revision {old} was missing" in event["message"]


def test_stripped_rollout_annotations_cause_no_switch_no_deletion_and_no_clock_reset(
    world: World, namespace: str
) -> None:
    ns, md_name = namespace, "lost-notes"
    timeout = 40
    rollout = {"verifyTimeoutSeconds": timeout}
    with InvariantSampler(world.cluster, ns, name="lost-annotations"):
        # The serving revision keeps the default verifyTimeoutSeconds: the short one is what the
        # stuck revision's clock is checked against, and a first start slower than it (a loaded
        # machine; CI once) refused the safe revision before it could serve.
        old, old_pods = serve_old_revision(world, ns, md_name)
        with TrafficLoop(lambda: known_answer(world, md_name, ns)) as traffic:
            # The target's engines go to a pool no node has: Pending, never verified.
            stuck = on_pool_without_estimate(sample_md(md_name, rollout=rollout), "absent")
            world.apply(stuck, namespace=ns)
            md = deadline_loop(
                "the rollout of the new revision to be recorded",
                lambda: (
                    (m := world.get_md(md_name, ns))
                    and m["status"].get("targetRevision") != old
                    and (m["status"].get("rollout") or {}).get("verifyStartedAt")
                    and m
                ),
                PASS_DEADLINE,
            )
            new = md["status"]["targetRevision"]
            recorded_start = md["status"]["rollout"]["verifyStartedAt"]
            deadline_loop(
                "the new revision's 3 Deployments",
                lambda: len(deployments_of(world, ns, md_name, new)) == 3,
                PASS_DEADLINE,
            )
            names = [d["metadata"]["name"] for d in deployments_of(world, ns, md_name, new)]
            # Strip late enough that a reset clock would refuse far past the recorded deadline.
            deadline_loop(
                "the rollout to be 15 s old",
                lambda: time.time() - parse_time(recorded_start).timestamp() >= 15,
                ROLLOUT_AGE_DEADLINE,
            )
            as_operator(
                world,
                "annotate",
                "deployment",
                *names,
                f"{VERIFY_STARTED_AT}-",
                f"--namespace={ns}",
            )
            wait_passes(world, SETTLE_PASSES, "after stripping the start annotations")
            status = world.get_md(md_name, ns)["status"]  # type: ignore[index]
            assert status["servingRevision"] == old and service_revision(world, ns, md_name) == old
            assert status["rollout"]["verifyStartedAt"] == recorded_start
            assert len(deployments_of(world, ns, md_name, new)) == 3  # not deleted
            assert engine_uids(world, ns, md_name, old) == old_pods

            refused = deadline_loop(
                "the stuck revision to be refused at its recorded deadline",
                lambda: refused_revision(world, ns, md_name, new),
                timeout + 60,
            )
            degraded = condition(refused, "Degraded")
            assert degraded is not None and degraded["reason"] == "VerificationTimeout", degraded
            late = (
                parse_time(degraded["lastTransitionTime"]) - parse_time(recorded_start)
            ).total_seconds()
            print(f"MEASURED refused {late:.0f}s after the recorded start (timeout {timeout}s)")
            # a reset clock: ≥ timeout + 15
            assert timeout <= late < timeout + REFUSAL_LATENESS, late

            # The refusal's annotations go too: it stands (status), nothing is scaled back up.
            as_operator(
                world,
                "annotate",
                "deployment",
                *names,
                "kvgate.io/refused-reason-",
                "kvgate.io/refused-message-",
                f"--namespace={ns}",
            )
            wait_passes(world, SETTLE_PASSES, "after stripping the refusal annotations")
            replicas = {
                d["metadata"]["labels"]["kvgate.io/role"]: d["spec"]["replicas"]
                for d in deployments_of(world, ns, md_name, new)
            }
            count = len(traffic.results) + REQUESTS_AFTER_RECOVERY
            deadline_loop("more requests", lambda: len(traffic.results) >= count, STEP_DEADLINE)
        assert replicas == {"prefill": 0, "decode": 0, "router": 0}, replicas
        assert len(events(world, ns, "RolloutRefused")) == 1
        status = world.get_md(md_name, ns)["status"]  # type: ignore[index]
        assert status["servingRevision"] == old and service_revision(world, ns, md_name) == old
        assert engine_uids(world, ns, md_name, old) == old_pods
        assert traffic.failures == [], traffic.failures[:5]
        print(f"MEASURED {len(traffic.results)} requests while the annotations were lost, 0 failed")
