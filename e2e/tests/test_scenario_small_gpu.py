"""Scenario 2: the safe sample pinned to the small-GPU pool, where admission cannot estimate the
pool (no ``gpuMemoryGiB``): the live engines report a pool below the context, so their pods
never become Ready, never reach an EndpointSlice or the router, and the CR and an Event say why
in numbers."""

from __future__ import annotations

import re
import time

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
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
    router_workers,
    sample_md,
    scenario_ns,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
__all__ = ["scenario_ns"]

REFUSAL = re.compile(
    r"(prefill|decode) pod (\S+) reports KV pool ([\d,]+) tokens < context length 131,072 "
    r"× headroom 1\.0"
)
HOLD_SECONDS = 6.0  # three of the e2e operator's 2 s re-verification intervals


def test_engines_on_gpus_too_small_for_the_context_never_take_traffic_and_say_why(
    world: World, scenario_ns: str
) -> None:
    ns = scenario_ns
    md = on_pool_without_estimate(sample_md("small-gpus"), "small")
    with InvariantSampler(world.cluster, ns, name="small-gpu"):
        out = world.apply(md, namespace=ns)
        assert "created" in out, out  # admitted: admission had no GPU size to estimate with

        def both_refused() -> list[dict[str, object]] | None:
            pods = engine_pods(world, ns, "small-gpus")
            conds = [
                c
                for p in pods
                for c in p["status"].get("conditions") or []
                if c["type"] == GATE and c["status"] == "False" and c["reason"] == "KvPoolTooSmall"
            ]
            return conds if len(pods) == 2 and len(conds) == 2 else None

        conds = deadline_loop("both engine pods refused with KvPoolTooSmall", both_refused, 240)
        pools = {}
        for cond in conds:
            match = REFUSAL.search(str(cond["message"]))
            assert match, cond
            pools[match.group(1)] = int(match.group(3).replace(",", ""))
        # The number in the message is the live engine's own.
        for pod in engine_pods(world, ns, "small-gpus"):
            role = pod["metadata"]["labels"]["kvgate.io/role"]
            _, info = http_json(world.engine_url(pod) + "/server_info", timeout=10)
            assert info["max_total_num_tokens"] == pools[role] < 131_072, (info, pools)
        print(f"MEASURED small-pool engines report KV pools {pools}")

        verified = deadline_loop(
            "the CR's EnginesVerified condition to give the pool and the context",
            lambda: (
                (c := md_condition(world, "small-gpus", ns, "EnginesVerified"))
                and c["reason"] == "KvPoolTooSmall"
                and c
            ),
            60,
        )
        assert verified["status"] == "False" and REFUSAL.search(verified["message"]), verified
        ready = md_condition(world, "small-gpus", ns, "Ready")
        assert ready is not None and ready["status"] == "False", ready
        pod_events = deadline_loop(
            "a KvPoolTooSmall Event with the numbers",
            lambda: [
                e for e in events(world, ns, "KvPoolTooSmall") if REFUSAL.search(e["message"])
            ],
            60,
        )
        assert pod_events[0]["type"] == "Warning"
        table = get_md_table(world, ns)
        print(table)
        assert "small-gpus" in table and "False" in table, table

        # Never Ready, in no EndpointSlice, not a worker of the router: watched over several
        # re-verifications (the sampler checks the same every 200 ms).
        hold_until = time.monotonic() + HOLD_SECONDS
        while time.monotonic() < hold_until:
            pods = engine_pods(world, ns, "small-gpus")
            assert len(pods) == 2 and not any(is_ready(p) for p in pods), pods
            ips = {p["status"].get("podIP") for p in pods}
            slices = world.list("endpointslices.discovery.k8s.io", ns)
            listed = {a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]}
            assert not (ips & listed), (ips, listed)
            assert router_workers(world, ns, "small-gpus") == []
