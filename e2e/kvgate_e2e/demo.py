"""`make demo` (`python -m kvgate_e2e.demo`): the whole story on the embedded control plane.

1. builds the control plane and helm if this checkout's build is missing (``build.sh``: a cache
   hit costs nothing; the first build takes 15-40 minutes and shows progress);
2. starts the ``World``: a private network namespace with etcd, the API server, controller
   manager, scheduler and kube-proxy, two GPU node pools (``big``: 80 GiB GPUs, ``small``:
   24 GiB GPUs) on the loopback kubelet, and ``helm install kvgate charts/kvgate``;
3. applies ``crds/samples/demo-big-pool.yaml`` and ``crds/samples/demo-small-pool.yaml``: the
   same model and 131,072-token window on each pool (kvgate's CPU reference engine);
4. and, on a third node pool whose node runs ``lmsysorg/sglang`` images as the **released SGLang
   0.5.23 on CPU** (``kvgate_e2e.real_engine``; installed by ``make real-engine-deps``), a
   ModelDeployment of a tiny Llama generated here (fixed seed): its real engines' pools are what
   ``kubectl get kvmd`` shows, and a request through its router is answered by them
   (``--reference-only`` skips it);
5. prints ``kubectl get kvmd`` with two Ready and one refused with its reason, the refusal's
   message with the numbers, a known-answer request through the Ready one's router and the real
   SGLang's own ``/server_info`` numbers and answer;
6. keeps running until Ctrl-C (``--once``: exits after the summary). Everything it started is
   stopped and removed on the way out.

Must run as root (it creates a network namespace and adds addresses to it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvgate_e2e.build_artifacts import BIN_DIR_ENV, BUILD_SCRIPT, find_binaries
from kvgate_e2e.deadlines import REAL_ANSWER_DEADLINE, REVISION_DEADLINE, SERVER_INFO_TIMEOUT
from kvgate_e2e.netns import netns_supported
from kvgate_e2e.real_engine import (
    DEFAULT_VERSION,
    RUNTIME_ANNOTATION,
    SGLANG_CPU,
    TINY_SERVED,
    RealEngineError,
    sglang_cpu,
    tiny_llama_md,
)
from kvgate_e2e.real_engine_cache import make_tiny_llama
from kvgate_e2e.signals import interrupt_on_signals
from kvgate_e2e.world import (
    REAL_NODE,
    REAL_NODE_SPEC,
    REAL_POOL,
    SAMPLES,
    World,
    WorldConfig,
    WorldError,
    condition,
    http_json,
    is_ready,
    known_answer_body,
    output_ids,
    ready_endpoints,
)

NAMESPACE = "kvgate-demo"
READY_MD, REFUSED_MD = "llama-8b-big", "llama-8b-small"
SERVED_MODEL = "llama-3.1-8b"
REAL_MD = "tiny-llama-sglang"
REAL_TIMEOUT = 600.0  # a CPU SGLang prefill + decode pair starts in ~1-2 min on 2 cores
REAL_PROMPT_IDS = [0, 40, 41, 42, 100, 200, 300, 12, 13, 14]  # ids of the tiny model's vocab
UNSAFE_REASONS = (
    "KvPoolTooSmall",
    "ContextTooShort",
    "ContextTooLong",
    "MaxInputTooShort",
    "MaxInputTooLong",
    "EngineVersionTooOld",
)


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


def prepare_real_model(work: Path) -> Path:
    """The tiny Llama for the real SGLang, generated into ``work`` (an error names the fix)."""
    env = sglang_cpu(DEFAULT_VERSION)
    return make_tiny_llama(env, sys.executable, work / "tiny-llama")


def apply_real(world: World, model: Path) -> None:
    """Switch the real pool's node to the released SGLang, then apply the tiny Llama's MD."""
    world.kubectl(
        "annotate", "node", REAL_NODE, f"{RUNTIME_ANNOTATION}={SGLANG_CPU}", "--overwrite"
    )
    heading(
        f"kubectl apply -n {NAMESPACE}: {REAL_MD}, a tiny Llama served by the released SGLang "
        f"{DEFAULT_VERSION} on CPU (node {REAL_NODE}, {RUNTIME_ANNOTATION}={SGLANG_CPU})"
    )
    say(world.apply(tiny_llama_md(REAL_MD, model, REAL_POOL), NAMESPACE).rstrip())


def show_real(world: World) -> bool:
    """The real engines' own /server_info numbers and an answer through their router."""
    heading(f"{REAL_MD}: what the released SGLang itself reports (/server_info)")
    ok = True
    engines = world.list(
        "pods", NAMESPACE, f"kvgate.io/deployment={REAL_MD},kvgate.io/component=engine"
    )
    for pod in sorted(engines, key=lambda p: str(p["metadata"]["name"])):
        code, info = http_json(f"{world.engine_url(pod)}/server_info", timeout=SERVER_INFO_TIMEOUT)
        if code != 200 or not isinstance(info, dict):
            say(f"WRONG: {pod['metadata']['name']} /server_info answered HTTP {code}")
            ok = False
            continue
        gate = condition(pod, "kvgate.io/engine-verified") or {}
        say(
            f"{pod['metadata']['name']}: SGLang {info.get('version')} "
            f"disaggregation_mode={info.get('disaggregation_mode')} device={info.get('device')} "
            f"max_total_num_tokens={info.get('max_total_num_tokens')} "
            f"max_req_input_len={info.get('max_req_input_len')}; "
            f"gate {gate.get('status')} {gate.get('reason')}"
        )
        ok &= info.get("version") == DEFAULT_VERSION and gate.get("status") == "True"
    body = {
        "model": TINY_SERVED,
        "input_ids": REAL_PROMPT_IDS,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0},
    }
    heading(f"a request through the {REAL_MD} router (smg -> SGLang prefill -> SGLang decode)")
    say(f"POST /generate {json.dumps(body)}")

    def answered() -> tuple[int, Any] | None:
        # smg reports healthy before it has discovered its workers: a 503 at first is normal.
        code, answer = world.router_request(REAL_MD, body, NAMESPACE, timeout=60)
        return (code, answer) if code not in (502, 503) else None

    try:
        code, answer = world.wait_for(
            f"an answer from {REAL_MD}'s router", answered, REAL_ANSWER_DEADLINE
        )
    except WorldError as exc:
        say(f"WRONG: {exc}".splitlines()[0])
        return False
    got = output_ids(answer)
    say(f"HTTP {code}: output_ids {got}")
    if code == 200 and got is not None and len(got) == 4:
        say(
            "4 greedy tokens of the tiny Llama (random weights): the real prefill->decode KV "
            "handoff; e2e/tests/test_scenario_real_engine.py compares them with a unified server"
        )
    else:
        say(f"WRONG: expected 4 output ids; full answer: {answer}")
        ok = False
    return ok


def run_demo(world: World, real_model: Path | None = None) -> bool:
    """Apply the samples and print the story; True when it came out as it should."""
    ok = True
    world.create_namespace(NAMESPACE)
    if real_model is not None:
        apply_real(world, real_model)
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
        timeout=REVISION_DEADLINE,
    )
    refused_md = world.wait_for(
        f"{REFUSED_MD} to be refused with a reason",
        lambda: (m := world.get_md(REFUSED_MD, NAMESPACE)) and refusal_of(m) and m,
        timeout=REVISION_DEADLINE,
    )
    say(f"both settled in {time.monotonic() - started:.1f}s")
    if real_model is not None:
        say(f"waiting for kvgate to verify {REAL_MD}'s real SGLang engines ...")
        world.wait_for(
            f"{REAL_MD} to be Ready on the real SGLang",
            lambda: (m := world.get_md(REAL_MD, NAMESPACE)) and is_ready(m),
            timeout=REAL_TIMEOUT,
        )
        say(f"{REAL_MD} Ready {time.monotonic() - started:.1f}s after the apply")

    heading(f"kubectl get kvmd -n {NAMESPACE}")
    say(world.kubectl("get", "kvmd", f"--namespace={NAMESPACE}").stdout.rstrip())

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
    if real_model is not None:
        ok &= show_real(world)
    return ok


def main(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        say(
            "the demo must run as root: it creates a private network namespace for the "
            "cluster (ip netns) and adds pod addresses to it. Run `sudo make demo` (or "
            "`sudo .venv/bin/python -m kvgate_e2e.demo`)."
        )
        return 2
    reason = netns_supported()
    if reason is not None:
        say(f"the demo needs network namespaces: {reason}")
        return 2
    began = time.monotonic()
    if not ensure_built():
        say(f"the control-plane build failed or is incomplete; see the output of {BUILD_SCRIPT}")
        return 1
    interrupt_on_signals()  # Ctrl-C and SIGTERM both stop everything
    ok = False
    real = not args.reference_only
    if real:
        try:
            sglang_cpu(DEFAULT_VERSION)
        except RealEngineError as exc:
            say(f"{exc}; or run `make demo DEMO_ARGS=--reference-only` (make demo installs it)")
            return 2
    work = Path(tempfile.mkdtemp(prefix="kvgate-demo-"))
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        # The tiny Llama is generated while the world starts.
        model: Future[Path] | None = pool.submit(prepare_real_model, work) if real else None
        heading("starting the e2e world")
        extra = (REAL_NODE_SPEC,) if real else ()
        with World(WorldConfig(progress=sys.stdout, extra_nodes=extra)) as world:
            ok = run_demo(world, model.result() if model is not None else None)
            heading("summary")
            say(
                f"{READY_MD} serves on the 80 GiB pool; {REFUSED_MD} is refused on the 24 GiB "
                f"pool and takes no traffic"
                + (
                    f"; {REAL_MD} is served by the released SGLang {DEFAULT_VERSION}, verified "
                    "from its own /server_info"
                    if real
                    else ""
                )
                + f". ({time.monotonic() - began:.1f}s so far)"
            )
            if not args.once:
                binaries = find_binaries()
                kubectl = f"{binaries.k8s} kubectl" if binaries else "kubectl"
                say(
                    "\nthe cluster keeps running; try:\n"
                    f"  {kubectl} --kubeconfig {world.cluster.host_kubeconfig} get kvmd,pods -A\n"
                    "press Ctrl-C to stop everything"
                )
                threading.Event().wait()
            say("\nstopping: uninstalling kvgate, stopping the kubelet and the control plane ...")
    except KeyboardInterrupt:
        say("\ninterrupted: everything started has been stopped")
    except Exception as exc:
        say(f"\ndemo failed: {exc}")
        return 1
    finally:
        pool.shutdown(wait=True)
        shutil.rmtree(work, ignore_errors=True)
    say(f"done in {time.monotonic() - began:.1f}s")
    return 0 if ok else 1


def parser() -> argparse.ArgumentParser:
    """``python -m kvgate_e2e.demo``: a development tool, not part of the ``kvgate`` CLI (the
    production image holds no e2e code)."""
    p = argparse.ArgumentParser(
        prog="python -m kvgate_e2e.demo",
        description="bring up the embedded control plane, the operator and sample deployments",
    )
    p.add_argument("--once", action="store_true", help="exit after printing the summary")
    p.add_argument(
        "--reference-only",
        action="store_true",
        help=(
            "skip the deployment served by the released SGLang on CPU (it needs "
            "`make real-engine-deps`); only kvgate's reference engine runs"
        ),
    )
    return p


__all__ = ["main", "parser", "run_demo"]

if __name__ == "__main__":
    raise SystemExit(main(parser().parse_args()))
