"""Operator memory with N ModelDeployments, on the real e2e control plane (run as root).

    .venv/bin/python tests/benchmarks/bench_operator_memory.py [--count 200]

Brings up the e2e world (the operator installed by Helm, running through the loopback kubelet),
applies N ModelDeployments whose roles all have 0 replicas (so no engine runs: this measures the
operator's own cost per ModelDeployment — its watches, per-MD reconcile daemon and state — not
the engines'), waits until the operator has reconciled every one of them (status
observedGeneration == generation), then samples the operator process's resident set size for a
few seconds. Prints RSS before and after, and the time the operator took to reconcile all N.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from kvgate_e2e.world import World

NAMESPACE = "bench-memory"


def manifest(index: int) -> str:
    return f"""
apiVersion: kvgate.io/v1alpha1
kind: ModelDeployment
metadata:
  name: md-{index:04d}
spec:
  model: {{name: tiny-{index}, path: tiny-llama, contextLength: 2048}}
  engine: {{image: "lmsysorg/sglang:v0.5.23"}}
  prefill: {{replicas: 0}}
  decode: {{replicas: 0}}
  router: {{replicas: 0}}
"""


def operator_rss_mib(world: World) -> float:
    pod = world.operator_pod()
    assert pod is not None, "no operator pod"
    container_id = pod["status"]["containerStatuses"][0]["containerID"]
    pid = int(container_id.removeprefix("loopback://"))
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for operator pid {pid}")


def sample_rss(world: World, seconds: float) -> list[float]:
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(operator_rss_mib(world))
        time.sleep(0.5)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=200)
    args = parser.parse_args()
    with World() as world:
        world.create_namespace(NAMESPACE)
        before = statistics.median(sample_rss(world, 5))
        started = time.monotonic()
        batch = 20
        for first in range(0, args.count, batch):
            last = min(first + batch, args.count)
            world.apply("---".join(manifest(i) for i in range(first, last)), namespace=NAMESPACE)

        def all_reconciled() -> bool:
            items = world.list("modeldeployments", NAMESPACE)
            done = [
                md
                for md in items
                if (md.get("status") or {}).get("observedGeneration")
                == md["metadata"]["generation"]
            ]
            return len(items) == args.count and len(done) == args.count

        world.wait_for(f"{args.count} ModelDeployments reconciled", all_reconciled, timeout=900)
        reconciled = time.monotonic() - started
        after = sample_rss(world, 10)
        print(
            f"operator RSS with 0 ModelDeployments: {before:.0f} MiB; with {args.count}: "
            f"median {statistics.median(after):.0f} MiB, max {max(after):.0f} MiB "
            f"({len(after)} samples over 10 s); all {args.count} reconciled "
            f"{reconciled:.1f} s after the first apply"
        )
        # No per-object clean-up: leaving the World deletes the whole cluster.


if __name__ == "__main__":
    main()
