"""The released SGLang 0.5.23, not kvgate's imitation of it, behind kvgate (real-engine mode).

The real pool's node (``kvgate-real-0``, apart from the big pool the other scenarios use) is
annotated ``e2e.kvgate.io/engine-runtime=sglang-cpu`` for this module, so its engine pods run
the real SGLang on CPU (``kvgate_e2e.real_engine``: kvgate's launcher argv plus only the CPU
flags of research/sglang-cpu.md), with a tiny Llama (fixed seed) that reaches them as a platform
team's weights do: a PersistentVolumeClaim (``spec.model.source.persistentVolumeClaim``) bound to
a local PersistentVolume of that node holding the model (``kvgate_e2e.local_volumes``), mounted
read-only at ``/models`` in every engine container. The model and its greedy known answer,
recorded from a unified real server, are cached on disk by everything they depend on
(``kvgate_e2e.real_engine_cache``); on a miss the model is generated and the unified server
started at the beginning, in parallel with the pair, and stopped once it answered.
``KVGATE_REAL_ENGINE_NO_CACHE=1`` computes both afresh.

One ModelDeployment (1 prefill, 1 decode, smg) is shared by the first three tests, in order, under
the invariant sampler; CPU SGLang takes about a minute to start, so each start is paid once:

1. the real engines load the weights from the claim (``/models``, read-only), are verified, pass
   kvgate's content check at maximum length, ``kubectl get kvmd`` shows their real pools (8,192),
   and a request through the router returns the recorded known answer;
2. ``kvgate verify --url`` against each real engine gives the operator's verdict;
3. the decode engine restarted with a smaller ``--max-total-tokens`` (the node's
   ``e2e.kvgate.io/max-total-tokens``, as the restart scenario shrinks GPU memory) loses
   verification and its traffic, with the real numbers in the condition and the Event;
4. a second ModelDeployment whose engines run with a pool below the context: ``maxTotalTokens``
   below ``contextLength`` is denied at admission with its numbers, and so is the same cap in
   ``engine.args``; the node's ``e2e.kvgate.io/max-total-tokens`` (a node with less free memory,
   out of admission's sight) gives the real engines the small pool, they report it, and kvgate
   refuses them with the real numbers in the condition and the Event; they never appear in smg's
   workers.

The safety settings the CPU needs: ``safety.kvChecksum: false`` (SGLang 0.5.23's checksum asserts
CUDA tensors, ``disaggregation/checksum.py``, and crashes prefill's warm-up on CPU; on GPUs it
stays on) and ``memFractionStatic: 0.5`` (on CPU the pool is sized from host RAM; the cap is
``maxTotalTokens``; ``CPU_MEM_FRACTION_STATIC`` says why not lower).

Run: ``flock /tmp/kvgate-e2e.lock .venv/bin/pytest -q -s e2e/tests/test_scenario_real_engine.py``
(root; after ``make real-engine-deps``). Prints ``MEASURED`` lines for each step.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import (
    EVENT_DEADLINE,
    GENERATE_TIMEOUT,
    METRICS_TIMEOUT,
    POD_GONE_DEADLINE,
    REAL_ANSWER_DEADLINE,
    STEP_DEADLINE,
)
from kvgate_e2e.kubelet.node import MAX_TOTAL_TOKENS_ANNOTATION
from kvgate_e2e.local_volumes import claim_bound, local_claim, volume_name
from kvgate_e2e.real_engine import (
    DEFAULT_VERSION,
    MODEL_MOUNT_PATH,
    RUNTIME_ANNOTATION,
    SGLANG_CPU,
    TINY_CONTEXT,
    TINY_POOL,
    TINY_SERVED,
    RealEngineError,
    SglangCpu,
    one_real_pair_at_a_time,
    sglang_cpu,
    tiny_llama_md,
    unified_server_argv,
    unified_server_port,
)
from kvgate_e2e.real_engine_cache import known_answer, tiny_llama
from kvgate_e2e.sampler import InvariantSampler, live_host
from kvgate_e2e.world import (
    GATE,
    REAL_NODE,
    REAL_POOL,
    World,
    condition,
    http_json,
    is_ready,
    output_ids,
)
from scenario_helpers import (
    deadline_loop,
    engine_pods,
    events,
    md_condition,
    node_pool_capped,
    routed,
    router_workers,
    server_info,
)

ABORT_STEP = re.compile(r"content check abort step: ([\d.]+) s \(the drop ([\d.]+) s in")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.real_engine,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]

SERVED = TINY_SERVED
CONTEXT = TINY_CONTEXT
POOL = TINY_POOL
SMALL_POOL = 2048
SEED = 0
PROMPT_IDS = [0, 40, 41, 42, 100, 200, 300, 12, 13, 14]  # ids of the tiny model's 384-token vocab
NEW_TOKENS = 4
START_TIMEOUT = 600.0  # two CPU SGLang servers started together on a loaded 2-core machine
CLAIM = "tiny-llama"  # the PersistentVolumeClaim holding the model
# Deadlines, not bounds (the run prints each time it measured; nothing here asserts one): only a
# step that never happens reaches one. Shared ones come from kvgate_e2e.deadlines.
# One NEW_TOKENS generation on a CPU SGLang server with the tiny model (384-token vocabulary).
REAL_GENERATE_TIMEOUT = 30
CLAIM_BOUND_DEADLINE = 60  # the claim bound to the local volume made for it (the PV controller)
VERIFY_CLI_TIMEOUT = 60  # kvgate verify --url against a running real engine: a few requests
# The decode gate turning (False once its container is killed, KvPoolTooSmall once the restarted
# engine reports its pool): the next verification (every 2 s in the e2e world) and its write.
GATE_DEADLINE = 60


def generate_body() -> dict[str, Any]:
    return {
        "model": SERVED,
        "input_ids": PROMPT_IDS,
        "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0},
    }


class KnownAnswer:
    """The tiny model's greedy answer to ``generate_body()`` from a unified (not disaggregated)
    real server, kept on disk by everything it depends on
    (``kvgate_e2e.real_engine_cache.known_answer``): on a hit no server starts. On a miss a
    unified server (host network, 127.0.0.1) starts at once and a background thread asks it as
    soon as it is up, then stops it: an idle CPU SGLang scheduler keeps a core busy and holds
    3 GB, which the PD pair starting beside it needs. ``ids()`` returns the answer (waiting for
    it if need be)."""

    def __init__(self, env: SglangCpu, model: Path, log: Path) -> None:
        self.env, self.model, self.log = env, model, log
        self.started = time.monotonic()
        self.proc: subprocess.Popen[bytes] | None = None
        self._ids: list[int] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._find, name="known-answer", daemon=True)
        self._thread.start()

    def argv(self, port: int) -> list[str]:
        return unified_server_argv(
            sys.executable,
            str(self.model),
            SERVED,
            host="127.0.0.1",
            port=port,
            context_length=CONTEXT,
        )

    def _find(self) -> None:
        try:
            found = known_answer(
                self.env,
                self.model,
                self.argv(0),
                generate_body(),
                inspect.getsource(KnownAnswer),
                self._record,
            )
            took = time.monotonic() - self.started
            if found.computed:
                print(
                    f"\nMEASURED known answer computed: unified real SGLang up and answered in "
                    f"{took:.1f}s: {found.value} (stored under key {found.key[:12]})"
                )
            else:
                print(
                    f"\nMEASURED known answer from the cache (key {found.key[:12]}) in "
                    f"{took:.1f}s, no unified server started: {found.value}"
                )
            self._ids = found.value
        except BaseException as exc:  # reported by ids()
            self._error = exc
        finally:
            self.stop()

    def _record(self) -> list[int]:
        port = unified_server_port()
        proc = self.proc = subprocess.Popen(
            self.argv(port),
            env={**os.environ, **self.env.env()},
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"

        def alive() -> None:
            log = self.log.read_text(errors="replace")
            if proc.poll() is not None or "address already in use" in log:
                raise AssertionError(f"unified SGLang did not start: {log[-3000:]}")

        def answer() -> list[int] | None:
            info = server_info(url)
            if info is None:
                return None
            # The answer is cached: it must be this server's, not another's on a reused port.
            mine = info.get("port") == port and info.get("disaggregation_mode") == "null"
            assert mine, f"127.0.0.1:{port} answers as another server: {info.get('port')}"
            code, body = http_json(
                f"{url}/generate", generate_body(), timeout=REAL_GENERATE_TIMEOUT
            )
            return output_ids(body) if code == 200 else None

        ids: list[int] = deadline_loop(
            "the unified real SGLang's known answer",
            answer,
            START_TIMEOUT,
            guard=alive,
            retry_on=(OSError,),
        )
        return ids

    def ids(self) -> list[int]:
        self._thread.join(START_TIMEOUT + 60)
        if self._error is not None:
            raise self._error
        assert self._ids is not None, "the unified real SGLang gave no known answer"
        return self._ids

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


@dataclass
class Real:
    world: World
    env: SglangCpu
    model: Path
    node: str
    ns: str
    known: KnownAnswer


def real_md(name: str, model: Path, **role_changes: Any) -> dict[str, Any]:
    """The tiny Llama from the claim ``CLAIM`` (``model``: the host copy, for its config.json)."""
    return tiny_llama_md(name, model, REAL_POOL, claim=CLAIM, **role_changes)


@pytest.fixture(scope="module")
def real_pair_turn() -> Iterator[None]:
    """This module's real engines run while no other module's do (one_real_pair_at_a_time)."""
    with one_real_pair_at_a_time():
        yield


@pytest.fixture(scope="module")
def real(
    real_pair_turn: None, world: World, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Real]:
    try:
        env = sglang_cpu(DEFAULT_VERSION)
    except RealEngineError as exc:
        pytest.fail(f"{exc} (make test runs make real-engine-deps first)")
    started = time.monotonic()
    found = tiny_llama(env, sys.executable, tmp_path_factory.mktemp("tiny-llama"), SEED)
    model = found.value
    how = "generated" if found.computed else "copied from the cache"
    print(
        f"\nMEASURED tiny Llama {how} (key {found.key[:12]}) in "
        f"{time.monotonic() - started:.1f}s at {model}"
    )
    node = REAL_NODE  # the real pool's node: no other scenario uses it
    ns = "t-real-engine-" + hashlib.sha1(str(model).encode()).hexdigest()[:6]
    known = KnownAnswer(env, model, tmp_path_factory.mktemp("unified") / "sglang.log")
    try:
        world.kubectl("annotate", "node", node, f"{RUNTIME_ANNOTATION}={SGLANG_CPU}", "--overwrite")
        world.create_namespace(ns)
        # The weights as a platform team provides them: a claim bound to a local volume of the
        # node (the model's directory), mounted read-only in every engine container.
        volume, claim = local_claim(CLAIM, ns, model, node)
        world.apply(volume)
        world.apply(claim, ns)
        world.wait_for(
            f"PersistentVolumeClaim {CLAIM} to be bound",
            lambda: claim_bound(world.get("persistentvolumeclaims", CLAIM, ns)),
            CLAIM_BOUND_DEADLINE,
        )
        yield Real(world, env, model, node, ns, known)
    finally:
        known.stop()
        started = time.monotonic()
        world.delete_namespace(ns)  # the engines gone before the next real pair starts
        # Retained: the model's files stay; the volume object goes once the claim is gone.
        world.kubectl(
            "delete",
            "pv",
            volume_name(ns, CLAIM),
            "--ignore-not-found",
            "--wait=false",
            check=False,
        )
        for key in (RUNTIME_ANNOTATION, MAX_TOTAL_TOKENS_ANNOTATION):  # either may be absent
            world.kubectl("annotate", "node", node, f"{key}-", check=False)
        print(f"MEASURED real-engine namespace clean-up {time.monotonic() - started:.1f}s")


def engine_log(real: Real, pod: str, container: str = "engine") -> str:
    path = real.world.kubelet.kubelet.log_path(real.ns, pod, container)
    return path.read_text(errors="replace")[-4000:] if path and path.exists() else "(no log)"


def wait_real_md_ready(real: Real, name: str) -> dict[str, Any]:
    world, ns = real.world, real.ns
    started = time.monotonic()
    try:
        md: dict[str, Any] = world.wait_for(
            f"ModelDeployment {name} to be Ready on the real SGLang",
            lambda: (m := world.get_md(name, ns)) and is_ready(m) and m,
            timeout=START_TIMEOUT,
        )
    except Exception:
        for pod in engine_pods(world, ns, name):
            print(f"--- {pod['metadata']['name']}:\n{engine_log(real, pod['metadata']['name'])}")
        raise
    print(f"\nMEASURED real PD pair applied -> MD Ready: {time.monotonic() - started:.1f}s")
    return md


def through_router(real: Real, name: str) -> list[int]:
    """The known-answer request through the MD's Service and smg (smg reports healthy before
    it has discovered its workers: retry a 503 until a deadline)."""

    def ask() -> list[int] | None:
        code, body = real.world.router_request(
            name, generate_body(), real.ns, timeout=GENERATE_TIMEOUT
        )
        if code == 200:
            ids = output_ids(body)
            assert ids is not None, body
            return ids
        assert code in (502, 503), (code, body)
        return None

    return deadline_loop(f"a 200 from {name}'s router", ask, REAL_ANSWER_DEADLINE)


def aborted_requests(url: str) -> float:
    """``sglang:num_aborted_requests_total`` on an engine's ``/metrics`` (0 before any)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=METRICS_TIMEOUT) as resp:
        lines = resp.read().decode().splitlines()
    prefix = "sglang:num_aborted_requests_total"
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))


def get_md_row(world: World, ns: str, name: str) -> dict[str, str]:
    lines = world.kubectl("get", "kvmd", f"--namespace={ns}").stdout.splitlines()
    print("\n".join(lines))
    header = lines[0].split()
    rows = {r.split()[0]: dict(zip(header, r.split(), strict=False)) for r in lines[1:]}
    return rows[name]


# ---------------------------------------------------------------------- 1. verified, serving
def test_real_sglang_pd_pair_is_verified_shows_its_real_pools_and_returns_the_known_answer(
    real: Real,
) -> None:
    world, ns = real.world, real.ns
    with InvariantSampler(world.cluster, ns, name="real-engine-safe"):
        world.apply(real_md("real", real.model), ns)
        md = wait_real_md_ready(real, "real")
        known = real.known.ids()

        # The content check at maximum length (on by default) passed on the real engines:
        # full answers at 50 % and 100 % of the longest prompt, refusals over the pool and over
        # contextLength, all through smg.
        checks = {c["revision"]: c for c in md["status"]["contentChecks"]}
        check = checks[md["status"]["servingRevision"]]
        print(f"content check: {check['message']}")
        probes = check["probes"]
        assert check["passed"], check
        assert [(p["expect"], p["httpStatus"], p["generatedTokens"]) for p in probes[:2]] == [
            ("Answer", 200, 8),
            ("Answer", 200, 8),
        ], probes
        assert probes[1]["promptTokens"] == CONTEXT - 10, probes
        # Refused: a 4xx, or (a stream's head is committed before the scheduler runs) a 200
        # whose only event is SGLang's in-band error; never a 200 with tokens.
        refusals = [p for p in probes if p["expect"] == "Refusal"]
        assert len(refusals) >= 1 and all(
            p["generatedTokens"] == 0 and (400 <= p["httpStatus"] < 500 or p["error"])
            for p in refusals
        ), probes
        # The abort step: the known answer, a request of the longest in-range length dropped
        # mid-flight through smg, and the same greedy answer again from the real SGLang.
        assert [(p["expect"], p["httpStatus"], p["generatedTokens"]) for p in probes[-4:]] == [
            ("KnownAnswer", 200, 8),
            ("Abort", 200, 0),
            ("KnownAnswer", 200, 8),
            ("KnownAnswer", 200, 8),
        ], probes
        assert probes[-3]["promptTokens"] == CONTEXT - 66, probes
        assert "the same output_ids" in check["message"], check["message"]
        for total, drop in ABORT_STEP.findall(world.operator_log()):
            print(f"MEASURED real SGLang content check abort step {total} s (drop {drop} s in)")
        # The drop reached the real engines: SGLang counts a request it aborted because its
        # client (smg) went away.
        for pod in engine_pods(world, ns, "real"):
            role = pod["metadata"]["labels"]["kvgate.io/role"]
            aborted = aborted_requests(world.engine_url(pod))
            print(f"MEASURED real SGLang {role}: sglang:num_aborted_requests_total {aborted:g}")
            if role == "decode":
                assert aborted >= 1, "the dropped request never reached decode as an abort"
        for role in ("prefill", "decode"):
            assert md["status"][role]["verifiedReplicas"] == 1, md["status"]
            assert md["status"][role]["minVerifiedKvPoolTokens"] == POOL, md["status"]
        row = get_md_row(world, ns, "real")
        assert row["READY"] == "True" and row["CONTEXT"] == str(CONTEXT), row
        assert row["PREFILL-POOL"] == str(POOL) and row["DECODE-POOL"] == str(POOL), row

        for pod in engine_pods(world, ns, "real"):
            gate = condition(pod, GATE)
            assert gate is not None and gate["status"] == "True", gate
            # The weights came from the claim, read-only, not from a path of the node.
            (weights,) = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
            assert weights["persistentVolumeClaim"] == {"claimName": CLAIM, "readOnly": True}
            # The kubelet's mount script warns (first, before the engine's own lines) if the
            # kernel refused the read-only remount.
            path = world.kubelet.kubelet.log_path(ns, pod["metadata"]["name"], "engine")
            assert path is not None and path.exists(), path
            head = path.read_text(errors="replace")[:20_000]
            assert f"cannot make {MODEL_MOUNT_PATH} read-only" not in head, head[:2000]
            info = server_info(world.engine_url(pod))
            assert info is not None
            assert info["model_path"] == MODEL_MOUNT_PATH, info["model_path"]
            # The real SGLang, not the reference engine: its version, its own per-rank state,
            # and the role kvgate's launcher gave it.
            assert info["version"] == DEFAULT_VERSION, info["version"]
            assert info["max_total_num_tokens"] == POOL
            assert info["internal_states"][0]["memory_usage"]["token_capacity"] >= POOL
            assert info["disaggregation_mode"] == pod["metadata"]["labels"]["kvgate.io/role"]
            assert info["device"] == "cpu"

        started = time.monotonic()
        ids = through_router(real, "real")
        print(f"MEASURED first known-answer 200 through smg: {time.monotonic() - started:.1f}s")
        assert ids == known, f"through prefill->decode: {ids}; unified real server: {known}"


# ---------------------------------------------------------------------- 2. kvgate verify --url
def verify_cli(url: str, context: int, role: str) -> tuple[int, dict[str, Any]]:
    kvgate = Path(sys.executable).parent / "kvgate"
    done = subprocess.run(
        [
            str(kvgate),
            "verify",
            "--url",
            url,
            "--context-length",
            str(context),
            "--role",
            role,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=VERIFY_CLI_TIMEOUT,
    )
    return done.returncode, json.loads(done.stdout)


def test_kvgate_verify_url_against_the_real_engines_gives_the_operators_verdict(
    real: Real,
) -> None:
    world, ns = real.world, real.ns
    pods = engine_pods(world, ns, "real")
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        role = pod["metadata"]["labels"]["kvgate.io/role"]
        url = world.engine_url(pod)
        code, verdict = verify_cli(url, CONTEXT, role)
        gate = condition(world.get("pod", pod["metadata"]["name"], ns) or {}, GATE)
        assert gate is not None
        print(
            f"kvgate verify --url ({role}): {verdict['outcome']} {verdict['reason']}; "
            f"operator gate: {gate['status']} {gate['reason']}"
        )
        assert code == 0 and verdict["outcome"] == "Safe", verdict
        assert gate["status"] == "True" and gate["reason"] == verdict["reason"], (gate, verdict)
        report = verdict["report"]
        assert report["kv_pool_tokens"] == POOL and report["version"] == DEFAULT_VERSION
        assert report["effective_context_length"] == CONTEXT
        assert report["max_req_input_len"] == CONTEXT - 6
        # Asked for twice the context, the same engine is unsafe, for the real reasons.
        code, verdict = verify_cli(url, 2 * CONTEXT, role)
        assert code == 1 and verdict["outcome"] == "Unsafe", verdict
        assert "ContextTooShort" in json.dumps(verdict["findings"]), verdict["findings"]


# ---------------------------------------------------------------------- 3. restart, smaller pool
def test_a_real_engine_restarted_with_a_smaller_pool_loses_verification_and_traffic(
    real: Real,
) -> None:
    world, ns = real.world, real.ns
    (pod,) = engine_pods(world, ns, "real", "decode")
    name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
    url = world.engine_url(pod)
    restarts = int(
        next(c for c in pod["status"]["containerStatuses"] if c["name"] == "engine").get(
            "restartCount", 0
        )
    )

    def gate() -> dict[str, Any] | None:
        live = world.get("pod", name, ns)
        return condition(live, GATE) if live else None

    def routed_here() -> bool:
        return routed(world, ns, "real", ip)

    assert routed_here()
    with (
        InvariantSampler(world.cluster, ns, name="real-engine-restart"),
        node_pool_capped(world, real.node, SMALL_POOL),
    ):
        restarted = time.monotonic()
        world.kubelet.call(world.kubelet.kubelet.restart_container(ns, name, "engine"))
        deadline_loop(
            "the decode gate False", lambda: (g := gate()) and g["status"] == "False", GATE_DEADLINE
        )
        gate_false = time.monotonic() - restarted
        deadline_loop(
            "smg to stop routing to the decode engine", lambda: not routed_here(), STEP_DEADLINE
        )
        smg_stops = time.monotonic() - restarted
        info = deadline_loop(
            "the restarted real engine's /server_info with the small pool",
            lambda: (i := server_info(url)) and i["max_total_num_tokens"] == SMALL_POOL and i,
            START_TIMEOUT,
        )
        pool_visible = time.monotonic() - restarted
        lost = deadline_loop(
            "the decode gate KvPoolTooSmall",
            lambda: (g := gate()) and g["reason"] == "KvPoolTooSmall" and g,
            GATE_DEADLINE,
        )
        refused = time.monotonic() - restarted
        # Traffic: the shrunk engine is out of the Service and of smg's workers.
        live = world.get("pod", name, ns)
        assert live is not None and not is_ready(live)
        assert not routed_here()
        try:
            status_code, body = world.router_request(
                "real", generate_body(), ns, timeout=GENERATE_TIMEOUT
            )
        except OSError as exc:
            status_code, body = 0, str(exc)
        print(f"request through smg without a verified decode engine: {status_code} {body}")
        assert status_code != 200, "a request was served without a verified decode engine"
    live = world.get("pod", name, ns)
    assert live is not None
    engine = next(c for c in live["status"]["containerStatuses"] if c["name"] == "engine")
    assert engine["restartCount"] > restarts
    assert info["version"] == DEFAULT_VERSION
    assert lost["status"] == "False"
    assert f"KV pool {SMALL_POOL:,} tokens < context length {CONTEXT:,}" in lost["message"], lost
    assert lost["message"].startswith(f"decode pod {name} reports"), lost
    numbers = deadline_loop(
        "a KvPoolTooSmall Event with the real pool's numbers",
        lambda: [
            e
            for e in events(world, ns, "KvPoolTooSmall")
            if e["involvedObject"]["name"] == name and f"{SMALL_POOL:,}" in e["message"]
        ],
        EVENT_DEADLINE,
    )
    assert f"context length {CONTEXT:,}" in numbers[0]["message"], numbers
    degraded = deadline_loop(
        "the MD Degraded with the numbers",
        lambda: (
            (c := md_condition(world, "real", ns, "Degraded"))
            and c["status"] == "True"
            and f"{SMALL_POOL:,}" in c["message"]
            and c
        ),
        EVENT_DEADLINE,
    )
    print(f"Degraded: {degraded['message']}")
    print(
        f"MEASURED real decode restart with --max-total-tokens {SMALL_POOL}: gate False "
        f"{gate_false:.1f}s, smg stops routing {smg_stops:.1f}s, small pool visible "
        f"{pool_visible:.1f}s, gate KvPoolTooSmall {refused:.1f}s after the kill"
    )


# ---------------------------------------------------------------------- 4. small pool, refused
def test_real_engines_with_a_pool_below_the_context_are_refused_with_their_numbers(
    real: Real,
) -> None:
    world, ns = real.world, real.ns
    # Free the first pair's memory: one real PD pair at a time fits next to the control plane.
    world.kubectl("delete", "kvmd", "real", f"--namespace={ns}", "--wait=true")
    deadline_loop(
        "the first pair gone", lambda: not engine_pods(world, ns, "real") or None, POD_GONE_DEADLINE
    )

    denied = world.kubectl(
        "apply",
        f"--namespace={ns}",
        "-f",
        "-",
        input=yaml.safe_dump(real_md("capped", real.model, maxTotalTokens=SMALL_POOL)),
        check=False,
    )
    print(denied.stderr)
    assert denied.returncode != 0 and "denied the request" in denied.stderr
    assert f"spec.prefill.maxTotalTokens: {SMALL_POOL:,} <" in denied.stderr, denied.stderr

    in_args = real_md("capped", real.model)
    in_args["spec"]["engine"]["args"] = ["--max-total-tokens", str(SMALL_POOL)]
    denied = world.kubectl(
        "apply", f"--namespace={ns}", "-f", "-", input=yaml.safe_dump(in_args), check=False
    )
    print(denied.stderr)
    assert denied.returncode != 0 and "denied the request" in denied.stderr
    args_denial = f"spec.engine.args[0]: --max-total-tokens {SMALL_POOL}: SGLang reads it as"
    assert args_denial in denied.stderr, denied.stderr
    assert "spec.prefill.maxTotalTokens / spec.decode.maxTotalTokens" in denied.stderr

    small = real_md("small", real.model)
    # Keep the refused engines running so their own /server_info can be read after the refusal
    # (by default kvgate scales a refused revision to 0 to free its GPUs).
    small["spec"]["rollout"]["scaleDownRefused"] = False
    seen_workers: list[dict[str, Any]] = []
    with (
        node_pool_capped(world, real.node, SMALL_POOL),
        InvariantSampler(world.cluster, ns, name="real-engine-small"),
    ):
        world.apply(small, ns)
        started = time.monotonic()

        def both_refused() -> list[dict[str, Any]] | None:
            seen_workers.extend(router_workers(world, ns, "small"))
            pods = engine_pods(world, ns, "small")
            gates = [condition(p, GATE) for p in pods]
            if len(pods) == 2 and all(g and g["reason"] == "KvPoolTooSmall" for g in gates):
                return pods
            return None

        try:
            pods = deadline_loop("both real engines refused", both_refused, START_TIMEOUT)
        except AssertionError:
            for pod in engine_pods(world, ns, "small"):
                print(
                    f"--- {pod['metadata']['name']}:\n{engine_log(real, pod['metadata']['name'])}"
                )
            raise
        print(
            f"\nMEASURED small real pair applied -> both refused: {time.monotonic() - started:.1f}s"
        )
        for pod in pods:
            role, name = pod["metadata"]["labels"]["kvgate.io/role"], pod["metadata"]["name"]
            info = server_info(world.engine_url(pod))
            assert info is not None and info["version"] == DEFAULT_VERSION
            assert info["max_total_num_tokens"] == SMALL_POOL  # the real engine's own number
            gate = condition(pod, GATE)
            assert gate is not None and gate["status"] == "False"
            assert gate["message"].startswith(
                f"{role} pod {name} reports KV pool 2,048 tokens < context length 4,096"
            ), gate
            assert not is_ready(pod)
        refused = deadline_loop(
            "an MD condition with the real numbers",
            lambda: [
                c
                for c in (world.get_md("small", ns) or {}).get("status", {}).get("conditions", [])
                if "2,048" in str(c.get("message")) and "4,096" in str(c.get("message"))
            ],
            EVENT_DEADLINE,
        )
        for c in refused:
            print(f"MD condition {c['type']}={c['status']} {c['reason']}: {c['message']}")
        names = {p["metadata"]["name"] for p in pods}

        def pool_events() -> list[dict[str, Any]] | None:
            found = [
                e
                for e in events(world, ns, "KvPoolTooSmall")
                if e["involvedObject"]["name"] in names
            ]
            return found if {e["involvedObject"]["name"] for e in found} == names else None

        evs = deadline_loop("KvPoolTooSmall Events for both engines", pool_events, EVENT_DEADLINE)
        for e in evs:
            assert "2,048" in e["message"] and "4,096" in e["message"], e
        seen_workers.extend(router_workers(world, ns, "small"))
    ips = {p["status"]["podIP"] for p in pods}
    assert not [w for w in seen_workers if live_host(w) in ips], seen_workers
    md = world.get_md("small", ns)
    assert md is not None and not is_ready(md)
