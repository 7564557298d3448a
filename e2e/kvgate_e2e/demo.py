"""`kvgate demo` (`make demo`): the whole story on the embedded control plane.

1. builds the control plane and helm if this checkout's build is missing (``build.sh``: a cache
   hit costs nothing; the first build takes 15-40 minutes and shows progress);
2. starts the ``World``: a private network namespace with etcd, the API server, controller
   manager, scheduler and kube-proxy, two GPU node pools (``big``: 80 GiB GPUs, ``small``:
   24 GiB GPUs) on the loopback kubelet, and ``helm install kvgate charts/kvgate``;
3. applies ``crds/samples/demo-big-pool.yaml`` and ``crds/samples/demo-small-pool.yaml``: the
   same model and 131,072-token window on each pool;
4. prints ``kubectl get md`` with one Ready and one refused with its reason, the refusal's
   message with the numbers, and a known-answer request through the Ready one's router;
5. keeps running until Ctrl-C (``--once``: exits after the summary). Everything it started is
   stopped and removed on the way out.

Must run as root (it creates a network namespace and adds addresses to it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Any

from kvgate_e2e.build_artifacts import BIN_DIR_ENV, BUILD_SCRIPT, find_binaries
from kvgate_e2e.netns import netns_supported
from kvgate_e2e.world import (
    SAMPLES,
    World,
    WorldConfig,
    condition,
    is_ready,
    known_answer_body,
    output_ids,
    ready_endpoints,
)

NAMESPACE = "kvgate-demo"
READY_MD, REFUSED_MD = "llama-8b-big", "llama-8b-small"
SERVED_MODEL = "llama-3.1-8b"
UNSAFE_REASONS = ("KvPoolTooSmall", "ContextTooShort", "MaxInputTooShort", "EngineVersionTooOld")


def say(text: str = "") -> None:
    print(text, flush=True)


def heading(text: str) -> None:
    say(f"\n=== {text}")


def ensure_built() -> bool:
    """Run build.sh unless binaries were pointed at explicitly; True when they are there."""
    if os.environ.get(BIN_DIR_ENV):
        return find_binaries() is not None
    heading("control plane build (cached by content hash; the first build takes 15-40 min)")
    proc = subprocess.run([str(BUILD_SCRIPT)], check=False)
    return proc.returncode == 0 and find_binaries() is not None


def refusal_of(md: dict[str, Any]) -> dict[str, Any] | None:
    """The Ready=False condition once it carries an unsafe verdict's reason and numbers."""
    ready = condition(md, "Ready")
    if ready is None or ready.get("status") != "False":
        return None
    verified = condition(md, "EnginesVerified") or {}
    for cond in (ready, verified):
        if cond.get("reason") in UNSAFE_REASONS or "tokens <" in str(cond.get("message", "")):
            return cond
    return None


def run_demo(world: World) -> bool:
    """Apply the two samples and print the story; True when it came out as it should."""
    ok = True
    world.create_namespace(NAMESPACE)
    heading(
        f"kubectl apply -f crds/samples/demo-big-pool.yaml -f demo-small-pool.yaml -n {NAMESPACE}"
    )
    applied = world.kubectl(
        "apply",
        f"--namespace={NAMESPACE}",
        "-f",
        str(SAMPLES / "demo-big-pool.yaml"),
        "-f",
        str(SAMPLES / "demo-small-pool.yaml"),
    )
    say(applied.stdout.rstrip())
    if applied.stderr.strip():
        say(applied.stderr.rstrip())  # the webhook's warning for the pool it cannot estimate

    started = time.monotonic()
    say("\nwaiting for kvgate to verify the live engines of both deployments ...")
    world.wait_for(
        f"{READY_MD} to be Ready",
        lambda: (m := world.get_md(READY_MD, NAMESPACE)) and is_ready(m),
        timeout=300,
    )
    refused_md = world.wait_for(
        f"{REFUSED_MD} to be refused with a reason",
        lambda: (m := world.get_md(REFUSED_MD, NAMESPACE)) and refusal_of(m) and m,
        timeout=300,
    )
    say(f"both settled in {time.monotonic() - started:.1f}s")

    heading(f"kubectl get md -n {NAMESPACE}")
    say(world.kubectl("get", "md", f"--namespace={NAMESPACE}").stdout.rstrip())

    refusal = refusal_of(refused_md) or {}
    heading(f"why {REFUSED_MD} is refused (its Ready condition)")
    say(f"reason:  {refusal.get('reason')}")
    say(f"message: {refusal.get('message')}")
    events = world.kubectl(
        "get",
        "events",
        f"--namespace={NAMESPACE}",
        f"--field-selector=involvedObject.name={REFUSED_MD},type=Warning",
        "-o",
        "custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message",
    ).stdout.rstrip()
    say(f"\nits Warning events:\n{events}")
    engines = world.list(
        "pods", NAMESPACE, f"kvgate.io/deployment={REFUSED_MD},kvgate.io/component=engine"
    )
    serving = (
        ready_endpoints(world, NAMESPACE, REFUSED_MD)
        if world.get("service", REFUSED_MD, NAMESPACE)
        else set()
    )
    if any(is_ready(p) for p in engines) or serving:
        say("WRONG: a refused engine pod is Ready or its Service has endpoints")
        ok = False
    elif engines:
        say(f"its engine pods are not Ready (no endpoint, no router worker): {len(engines)}")
    else:
        say(
            "its engine Deployments were scaled to 0 after the refusal, freeing their GPUs "
            "(spec.rollout.scaleDownRefused); nothing of it ever took traffic"
        )
    ok &= bool(refusal)

    heading(f"a known-answer request through the {READY_MD} router (Service {READY_MD})")
    body = known_answer_body(SERVED_MODEL, 4)
    say(f"POST /generate {json.dumps(body)}")
    code, answer = world.router_request(READY_MD, body, NAMESPACE)
    got = output_ids(answer)
    expected = body["input_ids"][:4]
    say(f"HTTP {code}: output_ids {got}")
    if code == 200 and got == expected:
        say("correct: the reference model copies the prompt, and it did")
    else:
        say(f"WRONG: expected output_ids {expected}; full answer: {answer}")
        ok = False
    return ok


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        say(
            "kvgate demo must run as root: it creates a private network namespace for the "
            "cluster (ip netns) and adds pod addresses to it. Run `sudo make demo` (or "
            "`sudo .venv/bin/kvgate demo`)."
        )
        return 2
    reason = netns_supported()
    if reason is not None:
        say(f"kvgate demo needs network namespaces: {reason}")
        return 2
    began = time.monotonic()
    if not ensure_built():
        say(f"the control-plane build failed or is incomplete; see the output of {BUILD_SCRIPT}")
        return 1
    # Ctrl-C and SIGTERM both stop everything (also when started with SIGINT ignored, as a
    # background job is).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    ok = False
    try:
        heading("starting the e2e world")
        with World(WorldConfig(progress=sys.stdout)) as world:
            ok = run_demo(world)
            heading("summary")
            say(
                f"{READY_MD} serves on the 80 GiB pool; {REFUSED_MD} is refused on the 24 GiB "
                f"pool and takes no traffic. ({time.monotonic() - began:.1f}s so far)"
            )
            if not args.once:
                binaries = find_binaries()
                kubectl = f"{binaries.k8s} kubectl" if binaries else "kubectl"
                say(
                    "\nthe cluster keeps running; try:\n"
                    f"  {kubectl} --kubeconfig {world.cluster.host_kubeconfig} get md,pods -A\n"
                    "press Ctrl-C to stop everything"
                )
                threading.Event().wait()
            say("\nstopping: uninstalling kvgate, stopping the kubelet and the control plane ...")
    except KeyboardInterrupt:
        say("\ninterrupted: everything started has been stopped")
    except Exception as exc:
        say(f"\ndemo failed: {exc}")
        return 1
    say(f"done in {time.monotonic() - began:.1f}s")
    return 0 if ok else 1


__all__ = ["main", "run_demo"]
