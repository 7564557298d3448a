"""Scenario 2: the safe sample pinned to the small-GPU pool (8 x 24 GiB), where admission cannot
estimate the pool (no ``gpuMemoryGiB``): the live engines report a pool below the 131,072-token
context, so their pods never become Ready, never reach an EndpointSlice or the router's
workers, and the CR, the pod condition and an Event say why in numbers.

Two ModelDeployments run side by side (one world, one wait):

- ``small-gpus`` sets ``rollout.scaleDownRefused: false`` so the refused pods stay and can be
  watched NotReady across the operator's re-verifications;
- ``small-default`` keeps the default (``scaleDownRefused: true``): the refused revision's
  engines are scaled to zero to free the GPUs, and the status still explains the refusal.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_scenario_small_gpu.py -v -s`` (root).
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import (
    PASS_DEADLINE,
    POD_GONE_DEADLINE,
    REVISION_DEADLINE,
    SERVER_INFO_TIMEOUT,
)
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import World, http_json, is_ready
from scenario_helpers import (
    GATE,
    deadline_loop,
    engine_pods,
    events,
    get_md_table,
    md_condition,
    on_pool_without_estimate,
    refused_with,
    router_workers,
    sample_md,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]

KEPT, DEFAULT = "small-gpus", "small-default"
REFUSAL = re.compile(
    r"(prefill|decode) pod (\S+) reports KV pool ([\d,]+) tokens < context length 131,072 "
    r"× headroom 1\.0"
)
# Sampler ticks to keep watching after the refusal is recorded (>= one 2 s re-verification).
WATCH_TICKS = 15
# Deadlines, not bounds: only a step that never happens reaches one. Shared ones come from
# kvgate_e2e.deadlines (both engines refused: a revision's engines started and judged,
# REVISION_DEADLINE, 300 s like every other file; it was 240 s here).
# The sampler's next tick: it samples every 0.2 s, one round of API reads (each up to 5 s).
TICK_DEADLINE = 10
# small-default's refusal in its Ready condition, applied with small-gpus whose refusal is
# already seen: its own engines' verdict and a pass.
DEFAULT_REFUSED_DEADLINE = 120


def ticked(sampler: InvariantSampler, tick: int) -> bool:
    return sampler.stats.samples > tick


def refused_gates(world: World, ns: str, md: str) -> list[dict[str, Any]]:
    return [
        c
        for p in engine_pods(world, ns, md)
        for c in p["status"].get("conditions") or []
        if c["type"] == GATE and c["status"] == "False" and c["reason"] == "KvPoolTooSmall"
    ]


def test_engines_on_gpus_too_small_for_the_context_never_take_traffic_and_say_why(
    world: World, namespace: str
) -> None:
    ns = namespace
    kept = on_pool_without_estimate(sample_md(KEPT), "small")
    kept["spec"]["rollout"]["scaleDownRefused"] = False
    default = on_pool_without_estimate(sample_md(DEFAULT), "small")
    with InvariantSampler(world.cluster, ns, name="small-gpu") as sampler:
        for md in (kept, default):
            out = world.apply(md, namespace=ns)
            assert "created" in out, out  # admitted: admission had no GPU size to estimate with

        def both_refused() -> list[dict[str, Any]] | None:
            gates = refused_gates(world, ns, KEPT)
            return gates if len(gates) == 2 else None

        conds = deadline_loop(
            "both engine pods of small-gpus refused with KvPoolTooSmall",
            both_refused,
            REVISION_DEADLINE,
        )
        pools = {}
        for cond in conds:
            match = REFUSAL.search(str(cond["message"]))
            assert match, cond
            pools[match.group(1)] = int(match.group(3).replace(",", ""))
        # The number in the message is the live engine's own.
        for pod in engine_pods(world, ns, KEPT):
            role = pod["metadata"]["labels"]["kvgate.io/role"]
            _, info = http_json(world.engine_url(pod) + "/server_info", timeout=SERVER_INFO_TIMEOUT)
            assert info["max_total_num_tokens"] == pools[role] < 131_072, (info, pools)
        print(f"MEASURED small-pool engines report KV pools {pools}")

        verified, ready = refused_with(world, ns, KEPT, "KvPoolTooSmall")
        assert REFUSAL.search(verified["message"]), verified
        assert REFUSAL.search(ready["message"]), ready
        assert "nothing serves" in ready["message"], ready
        pod_events = deadline_loop(
            "a KvPoolTooSmall Warning Event with the numbers",
            lambda: [
                e for e in events(world, ns, "KvPoolTooSmall") if REFUSAL.search(e["message"])
            ],
            PASS_DEADLINE,
        )
        assert pod_events[0]["type"] == "Warning"
        table = get_md_table(world, ns)
        print(table)
        row = next(line.split() for line in table.splitlines() if line.startswith(KEPT + " "))
        assert row[1] == "False" and "RolloutRefused" in row, table

        # Never Ready, in no EndpointSlice, not a worker of the (running) router: watched from
        # the refusal on, for WATCH_TICKS sampler ticks (the sampler checks the same each tick).
        routers = world.list("pods", ns, f"kvgate.io/deployment={KEPT},kvgate.io/component=router")
        assert routers, "scaleDownRefused=false keeps the router running"
        until = sampler.stats.samples + WATCH_TICKS
        watched = 0
        while sampler.stats.samples < until:
            tick = sampler.stats.samples
            pods = engine_pods(world, ns, KEPT)
            assert len(pods) == 2 and not any(is_ready(p) for p in pods), pods
            ips = {p["status"].get("podIP") for p in pods}
            slices = world.list("endpointslices.discovery.k8s.io", ns)
            listed = {a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]}
            assert not (ips & listed), (ips, listed)
            assert router_workers(world, ns, KEPT) == []
            watched += 1
            deadline_loop("the sampler's next tick", partial(ticked, sampler, tick), TICK_DEADLINE)
        print(f"MEASURED watched the refused pods NotReady over {WATCH_TICKS} sampler ticks")

        # The default: the refused revision's engines are scaled to zero, the refusal stays
        # explained in numbers.
        default_ready = deadline_loop(
            "small-default's refusal in its Ready condition",
            lambda: (
                (c := md_condition(world, DEFAULT, ns, "Ready"))
                and c["reason"] == "RolloutRefused"
                and c
            ),
            DEFAULT_REFUSED_DEADLINE,
        )
        assert default_ready["status"] == "False" and REFUSAL.search(default_ready["message"])
        deadline_loop(
            "small-default's engine pods to be scaled to zero",
            lambda: engine_pods(world, ns, DEFAULT) == [],
            POD_GONE_DEADLINE,
        )
        deployments = world.list("deployments.apps", ns, f"kvgate.io/deployment={DEFAULT}")
        assert deployments and all(d["spec"]["replicas"] == 0 for d in deployments), [
            (d["metadata"]["name"], d["spec"]["replicas"]) for d in deployments
        ]
        status = world.get_md(DEFAULT, ns)
        assert status is not None and status["status"]["refusedRevision"], status
    assert watched >= 1
