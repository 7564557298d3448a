"""Scenario 4: an engine restarted with a smaller pool loses verification and its traffic.

A verified decode engine of the safe sample (80 GiB GPUs) is killed and restarted by the kubelet
on 20 GiB of simulated GPU memory: its new pool is far below the 131,072-token context. The
operator must turn its gate False (the pod leaves Ready, smg drains and drops its worker) before
any request reaches the shrunk engine. Known-answer requests run through the router the whole
time; the shrunk engine's own request counter (``sglang:num_requests_total`` of the new process)
must stay 0. Measured from the restart: gate False, pod NotReady, smg worker draining/removed.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import (
    KNOWN_PROMPT_IDS,
    World,
    condition,
    is_ready,
    known_answer_body,
    output_ids,
)
from scenario_helpers import (
    GATE,
    TrafficLoop,
    deadline_loop,
    engine_pods,
    events,
    md_condition,
    router_workers,
    sample_md,
    scenario_ns,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
__all__ = ["scenario_ns"]
MD = "restart"
MODEL = "llama-3.1-8b"
SHRUNK_GIB = 20  # Llama-3.1-8B: (20 x 0.85 - 15 GiB weights) / 128 KiB per token << 131,072


def requests_served(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("sglang:num_requests_total"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("engine /metrics has no sglang:num_requests_total")


def test_engine_restarted_with_a_smaller_pool_loses_verification_and_traffic(
    world: World, scenario_ns: str
) -> None:
    ns = scenario_ns
    with InvariantSampler(world.cluster, ns, name="engine-restart") as sampler:
        world.apply(sample_md(MD), namespace=ns)
        deadline_loop(
            "the safe revision to serve",
            lambda: (c := md_condition(world, MD, ns, "Ready")) and c["status"] == "True",
            300,
        )
        (decode,) = engine_pods(world, ns, MD, "decode")
        name, node = decode["metadata"]["name"], decode["spec"]["nodeName"]
        engine = world.engine_url(decode)

        def known_answer() -> tuple[bool, str]:
            code, answer = world.router_request(MD, known_answer_body(MODEL), ns, timeout=30)
            return code == 200 and output_ids(answer) == KNOWN_PROMPT_IDS[:4], f"HTTP {code}"

        deadline_loop("a known-answer request", lambda: known_answer()[0], 60)
        assert requests_served(engine) >= 1
        try:
            with TrafficLoop(known_answer) as traffic:
                restarted = time.monotonic()
                world.kubelet.call(
                    world.kubelet.kubelet.restart_container(
                        ns, name, "engine", gpu_memory_gib=SHRUNK_GIB
                    )
                )

                def gate_false() -> bool:
                    c = condition(world.get("pod", name, ns) or {}, GATE)
                    return c is not None and c["status"] == "False"

                deadline_loop("the decode gate to turn False", gate_false, 60)
                gate_after = time.monotonic() - restarted
                deadline_loop(
                    "the decode pod NotReady",
                    lambda: not is_ready(world.get("pod", name, ns) or {}),
                    60,
                )
                not_ready_after = time.monotonic() - restarted
                ip = decode["status"]["podIP"]
                deadline_loop(
                    "smg to stop routing to the shrunk decode",
                    lambda: (
                        not any(
                            ip in w["url"] and w.get("status") != "draining"
                            for w in router_workers(world, ns, MD)
                        )
                    ),
                    60,
                )
                drained_after = time.monotonic() - restarted
                shrunk = deadline_loop(
                    "the restarted engine to report its shrunk pool",
                    lambda: (
                        (info := _server_info(engine))
                        and info["max_total_num_tokens"] < 131_072
                        and info
                    ),
                    120,
                )
                lost = deadline_loop(
                    "the gate to give the shrunk pool's numbers",
                    lambda: (
                        (c := condition(world.get("pod", name, ns) or {}, GATE))
                        and c["reason"] == "KvPoolTooSmall"
                        and c
                    ),
                    60,
                )
                served_by_shrunk = requests_served(engine)
        finally:
            world.kubelet.call(world.kubelet.kubelet.set_gpu_memory(node, 80))
        pool = shrunk["max_total_num_tokens"]
        assert f"KV pool {pool:,} tokens < context length 131,072" in lost["message"], lost
        assert served_by_shrunk == 0, f"{served_by_shrunk} requests reached the shrunk engine"
        degraded = md_condition(world, MD, ns, "Degraded")
        assert degraded is not None and degraded["status"] == "True", degraded
        assert any(f"{pool:,}" in e["message"] for e in events(world, ns, "EngineVerificationLost"))
        print(
            f"MEASURED engine restart at {SHRUNK_GIB} GiB (pool {pool:,}) -> gate False "
            f"{gate_after:.2f}s, pod NotReady {not_ready_after:.2f}s, smg stops routing "
            f"{drained_after:.2f}s; requests served by the shrunk engine: {served_by_shrunk:.0f}; "
            f"router requests during: {len(traffic.results)} ({len(traffic.failures)} failed)"
        )
    assert sampler.stats.samples > 0


def _server_info(url: str) -> dict[str, Any] | None:
    from kvgate_e2e.world import http_json

    try:
        code, info = http_json(f"{url}/server_info", timeout=3)
    except OSError:
        return None
    return info if code == 200 and isinstance(info, dict) else None
