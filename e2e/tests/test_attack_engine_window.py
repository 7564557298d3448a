"""An engine whose own window is longer than its pool, or than its partner's: the incident's shape
inside a revision every check called verified.

A tenant deploys ``contextLength: 2048`` with pools of 8,192 (prefill) and 4,096 (decode) tokens,
the content check off, on engines that run with ``--context-length 131072``. Admission denies
that flag in ``engine.args`` (test_attack_engine_args.py), but an engine image's own entrypoint
may add it where admission cannot look: here the node's ``e2e.kvgate.io/engine-args``
annotation stands for such an image. Each engine's pool holds 2,048 tokens, so a verdict that
only asks "does the pool hold the context?" passes both, and the prefill then accepts prompts of
up to 8,186 tokens that the decode cannot hold. kvgate must refuse both engines: an engine's own
window may not reach past the context its revision's pools were proven to hold.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_attack_engine_window.py -v -s`` (root).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml
from kvgate_e2e.deadlines import REVISION_DEADLINE
from kvgate_e2e.kubelet.images import ENGINE_ARGS_ANNOTATION
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import WINDOW_POOL, World
from scenario_helpers import (
    GATE,
    deadline_loop,
    engine_pods,
    make_tenant,
    refused_with,
    sample_md,
)

pytestmark = pytest.mark.e2e

# Both engines refused waits REVISION_DEADLINE (kvgate_e2e.deadlines: a revision's engines started
# and judged; 300 s like every other file, it was 240 s here).
MD = "window"
CONTEXT, PREFILL_POOL, DECODE_POOL, TOLD = 2048, 8192, 4096, 131072


@contextmanager
def engines_started_with(world: World, pool: str, args: list[str]) -> Iterator[None]:
    """Every engine the pool's nodes start meanwhile gets ``args`` last (the image's own flags)."""
    nodes = [
        n["metadata"]["name"] for n in world.reader.list("nodes", None, f"kvgate.io/pool={pool}")
    ]
    assert nodes, f"no node in pool {pool}"
    for node in nodes:
        annotation = f"{ENGINE_ARGS_ANNOTATION}={json.dumps(args)}"
        world.kubectl("annotate", "node", node, annotation, "--overwrite")
    try:
        yield
    finally:
        for node in nodes:
            world.kubectl("annotate", "node", node, f"{ENGINE_ARGS_ANNOTATION}-", check=False)


def window_md() -> dict[str, Any]:
    md = sample_md(MD, WINDOW_POOL)  # the window pool's own node gets the image's flag
    md["spec"]["model"]["contextLength"] = CONTEXT
    md["spec"]["prefill"]["maxTotalTokens"] = PREFILL_POOL
    md["spec"]["decode"]["maxTotalTokens"] = DECODE_POOL
    md["spec"]["safety"]["contentProbe"] = {"enabled": False}
    # Keep the refused engines running, so the test sees these very engines kept off traffic.
    md["spec"]["rollout"]["scaleDownRefused"] = False
    return md


def gate(pod: dict[str, Any]) -> dict[str, Any] | None:
    found = [c for c in pod.get("status", {}).get("conditions", []) if c.get("type") == GATE]
    return found[0] if found else None


def test_engines_whose_own_window_outruns_the_pools_of_their_revision_never_take_traffic(
    world: World, namespace: str
) -> None:
    tenant = make_tenant(world, namespace)
    with (
        engines_started_with(world, WINDOW_POOL, ["--context-length", str(TOLD)]),
        InvariantSampler(world.cluster, namespace, name="engine-window") as sampler,
    ):
        applied = tenant.kubectl("apply", "-f", "-", input=yaml.safe_dump(window_md()))
        assert applied.returncode == 0, applied.stderr

        def both_refused() -> list[dict[str, Any]] | None:
            pods = engine_pods(world, namespace, MD)
            refused = [p for p in pods if (g := gate(p)) and g.get("reason") == "ContextTooLong"]
            return refused if len(refused) == 2 else None

        pods = deadline_loop(
            "both engines refused with ContextTooLong", both_refused, REVISION_DEADLINE
        )
        for pod in pods:
            condition = gate(pod)
            assert condition is not None and condition["status"] == "False", condition
            print(f"{pod['metadata']['name']}: {condition['reason']}: {condition['message']}")
            assert (
                f"effective context length {TOLD:,} tokens > context length {CONTEXT:,}"
                in (condition["message"])
            )
            ready = [c for c in pod["status"]["conditions"] if c["type"] == "Ready"]
            assert ready and ready[0]["status"] == "False", ready

        verified, ready = refused_with(world, namespace, MD, "ContextTooLong")
        print(f"ModelDeployment Ready=False {ready['reason']}: {ready['message']}")
        assert f"{TOLD:,}" in ready["message"] or f"{TOLD:,}" in verified["message"], ready
    print(sampler.summary())
    assert sampler.violations == []
