"""Chaos on the real control plane (the high-availability promises): kvgate keeps its promises while
its own parts and the API server fail under it. The invariant sampler runs through every scenario.

1. **Leader killed mid-rollout.** The controller runs 2 leader-elected replicas. In each round one
   ModelDeployment goes through its life — create, a safe update, an update the live check must
   refuse, delete — and during each step the leading pod is killed (``kubectl delete pod
   --grace-period=0 --force``: SIGKILL, no Lease release) at a random point. Every step must end
   as it would without the kill: served, served by the new revision, refused with the old one
   still serving, everything gone. Measured per kill: kill -> another replica holds the Lease,
   and kill -> a ModelDeployment change made right after the kill is reconciled
   (``status.observedGeneration``) — the failover a user sees.
2. **Webhook pods lost during 50 concurrent applies.** 50 ``kubectl apply --dry-run=server``
   (the whole admission chain; nothing is persisted) run at once, repeatedly, while a webhook pod
   is deleted (as a drain or rollout does) and while the webhook Deployment is restarted: every
   apply gets kvgate's own answer, none fails because admission was unavailable.
3. **The API server restarted mid-rollout.** kube-apiserver is stopped for 3 s while a new
   ModelDeployment's engines start; the rollout completes and serves known answers.

Rounds: ``KVGATE_E2E_CHAOS_ROUNDS`` (default 1 = 4 leader kills, what ``make test`` runs;
``make chaos`` runs 5 = 20 kills). The random points come from ``KVGATE_E2E_CHAOS_SEED``
(printed, so a failure can be replayed).

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_chaos.py -v -s`` (root).
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest
import yaml
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import REVISION_DEADLINE, STEP_DEADLINE
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import (
    OPERATOR_NAMESPACE,
    WEBHOOK_DEPLOYMENT,
    World,
    is_ready,
    ready_endpoints,
    unsafe_probe_md,
)
from scenario_helpers import (
    deadline_loop,
    known_answer,
    md_story,
    on_pool_without_estimate,
    sample_md,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
ROUNDS = int(os.environ.get("KVGATE_E2E_CHAOS_ROUNDS", "1"))
SEED = int(os.environ.get("KVGATE_E2E_CHAOS_SEED", str(int(time.time()))))
KILL_WITHIN_SECONDS = 6.0  # each step's kill lands at a uniform random point of this window
CONCURRENT_APPLIES = 50
# The chart's webhook Service (kvgate.webhookServiceName: the release's full name + "-webhook").
WEBHOOK_SERVICE = WEBHOOK_DEPLOYMENT
# Deadlines, not bounds: how long a wait may take before the test gives up; what each step took
# is measured and printed. Each is many times what the step takes in make test (this file's own
# time is ~140 s for a whole lifecycle, docs/benchmarks.md) and is reached only by a step that
# never happens. A revision served or refused and a routing step are the shared REVISION_DEADLINE
# and STEP_DEADLINE of kvgate_e2e.deadlines.
DELETION_DEADLINE = 180  # a ModelDeployment and its pods and Deployments gone (grace periods)
WEBHOOK_DEADLINE = 120  # webhook pods Ready again, engine pods created, a wave of applies
# A new leader: the Lease expires after its 10 s duration (kvgate.kube.leader), then the next
# replica's renewal loop takes it and its first pass runs: 90 s is nine Lease durations.
FAILOVER_DEADLINE = 90
# A known answer through a Service that just switched: kube-proxy programs the new endpoints on
# the EndpointSlice change (--iptables-min-sync-period=0s), a sub-second step in make test.
ANSWER_TRY_DEADLINE = 15


# ---------------------------------------------------------------------------------- helpers
def container_restarts(pod: dict[str, Any], container: str) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(c.get("restartCount", 0)) for c in statuses if c["name"] == container)


def serving(world: World, name: str, ns: str, revision_not: str | None = None) -> Any:
    md = world.get_md(name, ns)
    status = (md or {}).get("status") or {}
    revision = status.get("servingRevision")
    if not revision or revision == revision_not:
        return None
    return md if is_ready({"status": {"conditions": status.get("conditions")}}) else None


def answers_known(world: World, name: str, ns: str) -> bool:
    """The known answer through the Service. A connection reset or refusal in the first
    seconds after the Service switched is kube-proxy still programming the new endpoints (seen
    in fresh-clone runs right after a revision started serving): retried for up to 15 s; any
    answer that arrives must be the known one."""

    def ask() -> tuple[bool, str] | None:
        try:
            return known_answer(world, name, ns)
        except OSError:  # reset, refused (urllib wraps it in URLError, an OSError)
            return None

    ok, _ = deadline_loop("an answer through the Service", ask, ANSWER_TRY_DEADLINE, retry_on=())
    return ok


@dataclass
class Failovers:
    to_new_holder: list[float] = field(default_factory=list)
    to_reconciled: list[float] = field(default_factory=list)

    def summary(self) -> str:
        def fmt(values: list[float]) -> str:
            if not values:
                return "n/a"
            return f"p50 {statistics.median(values):.1f}s max {max(values):.1f}s"

        return (
            f"{len(self.to_new_holder)} leader kills: kill -> new Lease holder "
            f"{fmt(self.to_new_holder)}; kill -> a change reconciled by the new leader "
            f"{fmt(self.to_reconciled)}"
        )


def kill_leader(world: World) -> tuple[str, float]:
    """SIGKILL the leader (``World.kill_leader``); its name and when."""
    return world.kill_leader(), time.monotonic()


def failover(
    world: World, ns: str, name: str | None, killed: str, at: float, out: Failovers
) -> None:
    """Right after a kill: change the ModelDeployment (a rollout setting: a new generation, no
    new revision) and time how long until another replica holds the Lease and has reconciled
    that generation."""
    md = world.get_md(name, ns) if name else None
    if md is not None and name:
        timeout = int(md["spec"]["rollout"].get("verifyTimeoutSeconds", 900))
        world.kubectl(
            "patch",
            "kvmd",
            name,
            f"--namespace={ns}",
            "--type=merge",
            "-p",
            yaml.safe_dump({"spec": {"rollout": {"verifyTimeoutSeconds": timeout + 1}}}),
        )
    deadline_loop(
        "another controller replica to hold the Lease",
        lambda: (h := world.leader_name()) is not None and h != killed,
        FAILOVER_DEADLINE,
    )
    out.to_new_holder.append(time.monotonic() - at)
    if md is None or not name:
        return
    latest = world.get_md(name, ns)
    assert latest is not None
    generation = int(latest["metadata"]["generation"])

    def reconciled() -> bool:
        status = (world.get_md(name, ns) or {}).get("status") or {}
        return int(status.get("observedGeneration") or 0) >= generation

    deadline_loop("the new leader to reconcile the change", reconciled, FAILOVER_DEADLINE)
    out.to_reconciled.append(time.monotonic() - at)


def kill_during(
    world: World, ns: str, name: str, rng: random.Random, out: Failovers, step: str
) -> threading.Thread:
    """Kill the leader at a random point of the next KILL_WITHIN_SECONDS, from a thread, and
    time the failover; the step under test runs meanwhile."""
    delay = rng.uniform(0, KILL_WITHIN_SECONDS)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            time.sleep(delay)  # the random point of the step at which the leader dies
            killed, at = kill_leader(world)
            print(f"chaos: {step}: killed leader {killed} {delay:.1f}s into the step")
            failover(world, ns, None if step == "delete" else name, killed, at, out)
        except BaseException as exc:  # reported by join_kill
            errors.append(exc)

    thread = threading.Thread(target=run, name=f"kill-{step}", daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def join_kill(thread: threading.Thread) -> None:
    thread.join(180)
    assert not thread.is_alive(), "the leader kill did not finish"
    errors: list[BaseException] = thread.errors  # type: ignore[attr-defined]
    if errors:
        raise errors[0]


# ------------------------------------------------------------------------- 1. leader killed
def lifecycle_with_kills(
    world: World, ns: str, name: str, rng: random.Random, out: Failovers
) -> None:
    """create, safe update, refused update, delete: the leader is killed during each."""
    # create: served although the leader died on the way
    world.apply(sample_md(name), namespace=ns)
    kill = kill_during(world, ns, name, rng, out, "create")
    story = partial(md_story, world, name, ns)
    first = deadline_loop(
        "the created revision to serve",
        lambda: serving(world, name, ns),
        REVISION_DEADLINE,
        details=story,
    )
    join_kill(kill)
    first_revision = first["status"]["servingRevision"]
    assert answers_known(world, name, ns)

    # safe update: the new revision takes over
    update = sample_md(name)
    update["spec"]["decode"]["memFractionStatic"] = 0.84
    world.apply(update, namespace=ns)
    kill = kill_during(world, ns, name, rng, out, "update")
    second = deadline_loop(
        "the updated revision to serve",
        lambda: serving(world, name, ns, revision_not=first_revision),
        REVISION_DEADLINE,
        details=story,
    )
    join_kill(kill)
    second_revision = second["status"]["servingRevision"]
    assert answers_known(world, name, ns)

    # unsafe update (only the live check can tell): refused, the old revision keeps serving
    world.apply(on_pool_without_estimate(sample_md(name), "small"), namespace=ns)
    kill = kill_during(world, ns, name, rng, out, "refused-update")

    def refused() -> dict[str, Any] | None:
        md = world.get_md(name, ns)
        status = (md or {}).get("status") or {}
        return md if status.get("refusedRevision") not in (None, second_revision) else None

    refusal = deadline_loop(
        "the unsafe revision to be refused", refused, REVISION_DEADLINE, details=story
    )
    join_kill(kill)
    assert refusal["status"]["servingRevision"] == second_revision
    assert answers_known(world, name, ns)

    # delete: everything it owned goes
    world.kubectl("delete", "kvmd", name, f"--namespace={ns}", "--wait=false")
    kill = kill_during(world, ns, name, rng, out, "delete")
    deadline_loop(
        "the ModelDeployment and everything it owned to be gone",
        lambda: (
            world.get_md(name, ns) is None
            and not world.list("pods", ns, f"kvgate.io/deployment={name}")
            and not world.list("deployments", ns, f"kvgate.io/deployment={name}")
        ),
        DELETION_DEADLINE,
    )
    join_kill(kill)


def test_killing_the_leader_at_random_points_of_rollouts_changes_no_outcome(
    world: World, namespace: str
) -> None:
    rng = random.Random(SEED)
    print(f"\nchaos seed {SEED} (KVGATE_E2E_CHAOS_SEED), {ROUNDS} round(s) of 4 kills")
    out = Failovers()
    with InvariantSampler(world.cluster, namespace, name="chaos-leader"):
        for round_ in range(ROUNDS):
            lifecycle_with_kills(world, namespace, f"chaos-{round_}", rng, out)
    print(f"MEASURED failover: {out.summary()}")
    assert len(out.to_new_holder) == 4 * ROUNDS


# ------------------------------------------------------------------- 2. webhook pods lost
def apply_dry_run(world: World, manifest: str) -> subprocess.CompletedProcess[str]:
    result: subprocess.CompletedProcess[str] = world.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=manifest, check=False
    )
    return result


def wave(world: World, safe: str, unsafe: str) -> list[str]:
    """50 dry-run applies at once, every other one unsafe; what was not kvgate's answer."""
    results: list[tuple[bool, subprocess.CompletedProcess[str]]] = []
    lock = threading.Lock()

    def one(expect_denied: bool) -> None:
        result = apply_dry_run(world, unsafe if expect_denied else safe)
        with lock:
            results.append((expect_denied, result))

    threads = [threading.Thread(target=one, args=(i % 2 == 1,)) for i in range(CONCURRENT_APPLIES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == CONCURRENT_APPLIES
    bad = []
    for expect_denied, result in results:
        if expect_denied:
            ok = result.returncode != 0 and "denied the request" in result.stderr
        else:
            ok = result.returncode == 0
        if not ok:
            bad.append(f"rc={result.returncode}: {(result.stderr or result.stdout)[:1000]}")
    return bad


@dataclass
class Wave:
    started: float
    bad: list[str]


def concurrent_applies(
    world: World, ns: str, stop: threading.Event, waves: list[Wave]
) -> list[Wave]:
    """Waves of 50 concurrent dry-run applies (half safe, half unsafe) until ``stop`` (at least
    two); per wave, every outcome that was not kvgate's own answer (allowed, or denied by it)."""
    safe_doc = sample_md("admit-me")
    safe_doc["metadata"]["namespace"] = ns
    unsafe_doc = unsafe_probe_md()
    unsafe_doc["metadata"]["namespace"] = ns
    safe, unsafe = yaml.safe_dump(safe_doc), yaml.safe_dump(unsafe_doc)
    while not stop.is_set() or len(waves) < 2:
        current = Wave(time.monotonic(), [])
        waves.append(current)  # visible to the disruption while it runs
        current.bad.extend(wave(world, safe, unsafe))
    failed = sum(len(w.bad) for w in waves)
    print(
        f"MEASURED {len(waves)} waves of {CONCURRENT_APPLIES} concurrent applies, {failed} failed"
    )
    return waves


def during_applies(
    world: World, ns: str, disruption: Callable[[], None], waves: list[Wave] | None = None
) -> list[Wave]:
    stop = threading.Event()
    waves = [] if waves is None else waves
    thread = threading.Thread(target=concurrent_applies, args=(world, ns, stop, waves), daemon=True)
    thread.start()
    try:
        disruption()
    finally:
        stop.set()
        thread.join(300)
    assert not thread.is_alive()
    return waves


def failures(waves: list[Wave]) -> list[str]:
    return [bad for w in waves for bad in w.bad]


def test_losing_webhook_pods_during_50_concurrent_applies_fails_none_of_them(
    world: World, namespace: str
) -> None:
    ns = namespace
    assert len(world.webhook_pods()) == 2

    def delete_one_webhook_pod() -> None:
        time.sleep(1.0)
        victim = world.webhook_pods()[0]["metadata"]["name"]
        world.kubectl("delete", "pod", victim, f"--namespace={OPERATOR_NAMESPACE}", "--wait=true")
        deadline_loop(
            "2 Ready webhook pods again",
            lambda: len([p for p in world.webhook_pods() if is_ready(p)]) == 2,
            WEBHOOK_DEADLINE,
        )

    bad = failures(during_applies(world, ns, delete_one_webhook_pod))
    assert bad == [], bad[:5]

    def restart_the_webhook_deployment() -> None:
        world.kubectl(
            "rollout",
            "restart",
            f"deployment/{WEBHOOK_DEPLOYMENT}",
            f"--namespace={OPERATOR_NAMESPACE}",
        )
        world.kubectl(
            "rollout",
            "status",
            f"deployment/{WEBHOOK_DEPLOYMENT}",
            f"--namespace={OPERATOR_NAMESPACE}",
            "--timeout=180s",
        )

    bad = failures(during_applies(world, ns, restart_the_webhook_deployment))
    assert bad == [], bad[:5]

    # A crash (SIGKILL, no drain) is different: the requests in flight to the dead process, and
    # the API server's pooled connections to it, fail (it retries no POST whose connection
    # broke). Nothing else may: the other replica answers every later admission, also while the
    # container restarts.
    crashed: list[float] = []
    noticed: list[float] = []
    live: list[Wave] = []

    def crash_one_webhook_container() -> None:
        time.sleep(1.0)
        victim_pod = world.webhook_pods()[0]
        victim, ip = victim_pod["metadata"]["name"], victim_pod["status"]["podIP"]
        restarts = container_restarts(victim_pod, "webhook")

        def in_service() -> bool:
            return ip in ready_endpoints(world, OPERATOR_NAMESPACE, WEBHOOK_SERVICE)

        def crash_seen() -> bool:
            """The cluster has acted on the crash: the pod left the Service's ready endpoints,
            or its restarted container is ready again (the new process serves)."""
            if not in_service():
                return True
            pod = world.get("pod", victim, OPERATOR_NAMESPACE) or {}
            return container_restarts(pod, "webhook") > restarts and is_ready(pod)

        deadline_loop(
            f"{victim} ({ip}) in the webhook Service's ready endpoints", in_service, STEP_DEADLINE
        )
        kubelet = world.kubelet
        crashed.append(time.monotonic())
        kubelet.call(kubelet.kubelet.restart_container(OPERATOR_NAMESPACE, victim, "webhook"))
        deadline_loop("the cluster to act on the crash", crash_seen, WEBHOOK_DEADLINE, period=0.05)
        noticed.append(time.monotonic())
        deadline_loop(
            "2 Ready webhook pods after the crash",
            lambda: len([p for p in world.webhook_pods() if is_ready(p)]) == 2,
            WEBHOOK_DEADLINE,
        )
        # ... and one more wave, started once the crash was noticed, completes.
        deadline_loop(
            "a wave of applies started after the crash was noticed",
            lambda: sum(1 for w in live if w.started > noticed[0]) >= 2,
            WEBHOOK_DEADLINE,
        )

    waves = during_applies(world, ns, crash_one_webhook_container, live)
    bad = failures(waves)
    # Waves that start once the cluster acted on the crash (measured: out of the Service, or
    # the restarted container ready), not a guess of how long that takes on this machine.
    after = [w for w in waves if w.started > noticed[0]]
    print(
        f"MEASURED webhook container SIGKILLed during applies: {len(bad)} of "
        f"{len(waves) * CONCURRENT_APPLIES} failed; the cluster acted on the crash after "
        f"{noticed[0] - crashed[0]:.2f} s; waves started after that: "
        f"{sum(len(w.bad) for w in after)} failed of {len(after) * CONCURRENT_APPLIES}"
    )
    transport = ("EOF", "connection reset", "broken pipe", "closed idle connection", "refused")
    assert all("failed calling webhook" in b and any(t in b for t in transport) for b in bad), bad
    assert after and all(w.bad == [] for w in after), [w.bad[:2] for w in after]
    assert len(bad) < CONCURRENT_APPLIES


# ----------------------------------------------------------------- 3. API server restarted
def test_a_rollout_completes_when_the_api_server_restarts_in_the_middle_of_it(
    world: World, namespace: str
) -> None:
    ns = namespace
    name = "apiserver"
    with InvariantSampler(world.cluster, ns, name="chaos-apiserver") as sampler:
        world.apply(sample_md(name), namespace=ns)
        deadline_loop(
            "the engine pods to be created",
            lambda: len(world.list("pods", ns, f"kvgate.io/deployment={name}")) >= 2,
            WEBHOOK_DEADLINE,
        )
        with sampler.api_outage():
            outage = world.cluster.restart_apiserver(down_seconds=3.0)
        print(f"MEASURED kube-apiserver down (stop -> /readyz) {outage:.1f}s")
        story = partial(md_story, world, name, ns)
        md = deadline_loop(
            "the rollout to serve",
            lambda: serving(world, name, ns),
            REVISION_DEADLINE,
            details=story,
        )
        assert md["status"]["servingRevision"]
        deadline_loop(
            "a known answer", lambda: answers_known(world, name, ns), STEP_DEADLINE, details=story
        )
