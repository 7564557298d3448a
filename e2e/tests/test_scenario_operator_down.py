"""Fail-safe without the operator (no unverified engine serves while kvgate is down): with kvgate
scaled to 0, an engine restarted on a smaller pool still never takes traffic.

The readiness gate ``kvgate.io/engine-verified`` is data: with the operator gone nobody turns it
False, so it stays True on an engine that came back with a small pool. What keeps that pod out of
traffic is the guard sidecar (``kvgate guard``, a native sidecar in every engine pod): it reads the
engine on the pod's localhost every 2 s against the requirement the operator wrote into the pod
template, and its readinessProbe is 503 while the engine does not meet it. The kubelet alone then
keeps the pod NotReady (pod Ready needs every container ready, sidecars included), so it stays out
of the EndpointSlices and smg's workers.

Each round: the operator Deployment in kvgate-system is scaled to 0 and its pod is gone; a serving
engine (decode, prefill, decode, ...) is restarted by the kubelet on 20 GiB of simulated GPU memory
(its new pool is far below the 131,072-token context: the restart scenario's mechanism); the pod
must turn NotReady and leave smg's workers, the guard must reject the shrunk pool within
2 × its period, and the pod must stay NotReady although the engine container is ready again and
the gate still says True. No request may reach the shrunk engine (its own request counter), and
the invariant sampler must see no traffic path to it. Then the node gets its 80 GiB back: the
guard lets the restored engine back in (with the operator still down), and the operator returns.

Measured per round: restart -> pod NotReady, -> left smg's workers; engine shrunk (first
``/server_info`` with the small pool) -> the guard says KvPoolTooSmall, -> pod NotReady.

Rounds: ``KVGATE_E2E_OPERATOR_DOWN_ROUNDS`` (default 3, what ``make test`` runs).

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_scenario_operator_down.py -v -s`` (root).
"""

from __future__ import annotations

import os
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import RESTART_DEADLINE, REVISION_DEADLINE, STEP_DEADLINE
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import (
    World,
    condition,
    http_json,
    is_ready,
)
from scenario_helpers import (
    GATE,
    FirstSeen,
    TrafficLoop,
    deadline_loop,
    engine_pods,
    known_answer,
    operator_down,
    requests_served,
    routed,
    sample_md,
    wait_known_answer,
    wait_md_ready,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
MD = "opdown"
CONTEXT = 131_072
FULL_GIB = 80
SHRUNK_GIB = 20  # Llama-3.1-8B: (20 x 0.85 - 15 GiB weights) / 128 KiB per token << 131,072
GUARD = "kvgate-guard"
GUARD_PORT = 8471
GUARD_PERIOD = 2.0  # builders.GUARD_PERIOD_SECONDS
ROUNDS = int(os.environ.get("KVGATE_E2E_OPERATOR_DOWN_ROUNDS", "3"))
ROLES = ("decode", "prefill")
# Deadlines, not bounds (the asserted bounds are periods of the product or measured here): how
# long a wait may take before the test gives up, many times what the step takes in make test
# (this file's own time ~90 s, docs/benchmarks.md); only a step that never happens reaches one.
# Revision Ready, an engine restarted and a router step are the shared ones of kvgate_e2e.deadlines.


def pool_of(url: str) -> int | None:
    try:
        code, info = http_json(f"{url}/server_info", timeout=2)  # polled
    except OSError:
        return None
    if code != 200 or not isinstance(info, dict):
        return None
    return int(info["max_total_num_tokens"])


def guard_answer(url: str) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(f"{url}/ready", timeout=2) as resp:  # polled
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return None


@dataclass(frozen=True)
class Round:
    role: str
    pool: int
    not_ready: float  # restart -> pod NotReady
    left_workers: float  # restart -> smg no longer routes to it
    shrunk: float  # restart -> first /server_info with the small pool
    guard_rejects: float  # restart -> the guard's /ready says KvPoolTooSmall
    engine_ready: float  # restart -> the engine container ready again (kubelet /health)
    served_by_shrunk: float

    @property
    def shrunk_to_guard(self) -> float:
        return self.guard_rejects - self.shrunk

    @property
    def shrunk_to_not_ready(self) -> float:
        """From the engine answering with its small pool to the pod NotReady (0 when the pod
        was already NotReady: it never was Ready with the shrunk engine)."""
        return max(0.0, self.not_ready - self.shrunk)


def shrink_with_the_operator_down(world: World, ns: str, role: str) -> Round:
    """Restart ``role``'s engine on SHRUNK_GIB while the operator is down; measure; restore."""
    (pod,) = engine_pods(world, ns, MD, role)
    name, node, ip = pod["metadata"]["name"], pod["spec"]["nodeName"], pod["status"]["podIP"]
    assert any(c["name"] == GUARD for c in pod["spec"]["initContainers"]), "no guard sidecar"
    engine = world.engine_url(pod)
    guard = f"http://127.0.0.1:{world.forward(ip, GUARD_PORT)}"
    from kubernetes import client

    core: Any = client.CoreV1Api(world.cluster.new_api_client())

    def live() -> dict[str, Any]:
        return dict(core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, ns)))

    def routed_here() -> bool:
        return routed(world, ns, MD, ip)

    def engine_container_ready_again() -> bool:
        statuses = live()["status"].get("containerStatuses") or []
        return any(
            c["name"] == "engine" and c.get("ready") and c.get("restartCount", 0) > restarts
            for c in statuses
        )

    restarts = int(pod["status"]["containerStatuses"][0].get("restartCount", 0))
    gate_before = condition(pod, GATE)
    assert gate_before is not None and gate_before["status"] == "True", gate_before
    probes: dict[str, Callable[[], bool]] = {
        "pod NotReady": lambda: not is_ready(live()),
        "left smg's workers": lambda: not routed_here(),
        "shrunk pool visible": lambda: (p := pool_of(engine)) is not None and p < CONTEXT,
        "guard rejects the pool": lambda: (
            (a := guard_answer(guard)) is not None and a[0] == 503 and "KvPoolTooSmall" in a[1]
        ),
        "engine container ready": engine_container_ready_again,
    }
    try:
        with FirstSeen(probes) as seen:
            restarted = time.monotonic()
            world.kubelet.call(
                world.kubelet.kubelet.restart_container(
                    ns, name, "engine", gpu_memory_gib=SHRUNK_GIB
                )
            )
            for probe in probes:
                seen.wait(probe, RESTART_DEADLINE)
            # The engine container is ready and the gate (nobody left to change it) still True:
            # only the guard holds the pod out. It must keep doing so, not just once.
            held_since = time.monotonic()
            while time.monotonic() - held_since < 2 * GUARD_PERIOD + 1:
                now = live()
                assert not is_ready(now), f"pod {name} Ready with a shrunk engine: {now['status']}"
                time.sleep(0.1)
        now = live()
        ready = condition(now, "Ready") or {}
        assert ready.get("message") == f"containers with unready status: [{GUARD}]", ready
        gate_now = condition(now, GATE) or {}
        assert [gate_now.get(k) for k in ("status", "reason", "message")] == [
            gate_before.get(k) for k in ("status", "reason", "message")
        ], f"the gate changed with the operator down: {gate_now}"
        pool = pool_of(engine)
        assert pool is not None and pool < CONTEXT
        answer = guard_answer(guard)
        assert answer is not None and answer[0] == 503, answer
        assert f"KV pool {pool:,} tokens" in answer[1] and "131,072" in answer[1], answer
        served = requests_served(engine)
    finally:
        world.kubelet.call(world.kubelet.kubelet.set_gpu_memory(node, FULL_GIB))

    # Give the node its GPUs back, still without the operator: the guard lets the engine back.
    world.kubelet.call(world.kubelet.kubelet.restart_container(ns, name, "engine"))
    deadline_loop(
        "the restored engine's pod Ready again", lambda: is_ready(live()), RESTART_DEADLINE
    )
    deadline_loop("smg to route to the restored engine", routed_here, STEP_DEADLINE)
    t = {k: v - restarted for k, v in seen.seen.items()}
    return Round(
        role=role,
        pool=pool,
        not_ready=t["pod NotReady"],
        left_workers=t["left smg's workers"],
        shrunk=t["shrunk pool visible"],
        guard_rejects=t["guard rejects the pool"],
        engine_ready=t["engine container ready"],
        served_by_shrunk=served,
    )


def test_a_shrunk_engine_leaves_traffic_while_the_operator_is_down(
    world: World, namespace: str
) -> None:
    ns = namespace
    rounds: list[Round] = []
    with InvariantSampler(world.cluster, ns, name="operator-down") as sampler:
        world.apply(sample_md(MD), namespace=ns)
        wait_md_ready(world, MD, ns, REVISION_DEADLINE, "the safe revision to serve")

        wait_known_answer(world, MD, ns, STEP_DEADLINE, "a known-answer request")
        with TrafficLoop(partial(known_answer, world, MD, ns)) as traffic:
            for i in range(ROUNDS):
                with operator_down(world):
                    rounds.append(shrink_with_the_operator_down(world, ns, ROLES[i % 2]))
                wait_md_ready(
                    world, MD, ns, RESTART_DEADLINE, "the MD Ready with the operator back"
                )
        for r in rounds:
            print(
                f"MEASURED operator down, {r.role} restarted at {SHRUNK_GIB} GiB (pool "
                f"{r.pool:,}): pod NotReady {r.not_ready:.2f}s, left smg's workers "
                f"{r.left_workers:.2f}s, shrunk pool visible {r.shrunk:.2f}s, guard rejects it "
                f"{r.guard_rejects:.2f}s (shrunk -> guard {r.shrunk_to_guard:.2f}s, shrunk -> "
                f"pod NotReady {r.shrunk_to_not_ready:.2f}s), engine container ready again "
                f"{r.engine_ready:.2f}s; requests served by the shrunk engine: "
                f"{r.served_by_shrunk:.0f}"
            )

    for r in rounds:
        assert r.served_by_shrunk == 0, f"{r.served_by_shrunk} requests reached the shrunk engine"
        assert r.not_ready <= 2 * GUARD_PERIOD, r
        assert r.shrunk_to_guard <= 2 * GUARD_PERIOD, r
        assert r.shrunk_to_not_ready <= 2 * GUARD_PERIOD, r
        assert r.left_workers <= r.shrunk, "smg routed to the engine after its pool shrank"
    wrong = [f for f in traffic.failures if "WRONG TOKENS" in f[2]]
    assert wrong == [], wrong[:5]

    def stats(values: list[float]) -> str:
        return f"p50 {statistics.median(values):.2f}s max {max(values):.2f}s"

    print(
        f"MEASURED operator down, {len(rounds)} rounds (guard period {GUARD_PERIOD:g}s): "
        f"restart -> pod NotReady {stats([r.not_ready for r in rounds])}; restart -> left smg's "
        f"workers {stats([r.left_workers for r in rounds])}; engine shrunk -> guard rejects "
        f"{stats([r.shrunk_to_guard for r in rounds])}; engine shrunk -> pod NotReady "
        f"{stats([r.shrunk_to_not_ready for r in rounds])}; router requests "
        f"{len(traffic.results)} ({len(traffic.failures)} failed while an engine was out)"
    )
    wait_known_answer(
        world, MD, ns, RESTART_DEADLINE, "a known-answer request after the last round"
    )
    assert sampler.stats.samples > 0
