"""Scenario 6, the incident end to end: with kvgate's gate bypassed, an over-length prompt reads
another request's KV; under kvgate the same engines never take traffic.

The model is tiny-llama (2,048-token context) so prompts stay cheap; the prefill's KV pool is
capped at 692 tokens (``--max-total-tokens 692``), below the context, as the GLM prefill's
681,280 was below 1,048,576. Request A carries a canary; request B is 800 tokens: longer than
the prefill's ``max_req_input_len`` (686), shorter than the context, so it passes the tokenizer
and fails only the scheduler.

What the gateway does with it matters: smg 1.13.0 returns the *first non-2xx leg* to the client,
so the pre-fix prefill's 400 wins and the client gets ``prefill_bad_request`` even though the
decode engine generated from stale pages. The incident-era gateway returned decode's answer
(research/smg.md §1: v1.9 checked decode first). The bypassed half shows both: smg 1.13.0's
answer, and the canary that comes back when decode's answer is returned, as the incident-era
router did (``decode_first``).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
import yaml
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.sampler import InvariantSampler, Obj
from kvgate_e2e.world import World, http_json, is_ready
from kvgate_engine.verdict import Requirement
from scenario_helpers import (
    GATE,
    deadline_loop,
    engine_pods,
    events,
    get_md_table,
    md_condition,
    router_workers,
    scenario_ns,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
__all__ = ["scenario_ns"]

CONTEXT = 2048
PREFILL_POOL = 692  # max_req_input_len = min(2047, 691) - 5 = 686
CANARY = list(range(1001, 1013))
REQUEST_A = [1, 2, 3, 4, *CANARY, *range(20, 300)]  # 296 tokens
REQUEST_B = [7] * 800  # >= 686, < 2,048
MODEL = "tiny-llama"
PRE_FIX_IMAGE = "lmsysorg/sglang:v0.5.20"
SMG_IMAGE = "ghcr.io/lightseekorg/smg:1.13.0"


def contains(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack)))


def body(ids: list[int], max_new: int) -> dict[str, Any]:
    return {"model": MODEL, "input_ids": ids, "sampling_params": {"max_new_tokens": max_new}}


# ------------------------------------------------------------------ the bypassed deployment
def engine_args(role: str, pool: int | None) -> list[str]:
    args = ["--model-path", MODEL, "--host", "0.0.0.0", "--port", "30000"]
    args += ["--context-length", str(CONTEXT), "--enable-metrics"]
    args += ["--disaggregation-mode", role, "--disaggregation-bootstrap-port", "8998"]
    return args + (["--max-total-tokens", str(pool)] if pool else [])


def plain_engine(ns: str, role: str, pool: int | None) -> dict[str, Any]:
    labels = {"app": "leaky", "tier": "engine", "role": role}
    annotations = {"sglang.ai/bootstrap-port": "8998"} if role == "prefill" else {}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"leaky-{role}", "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "nodeSelector": {"kvgate.io/pool": "small"},
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {
                            "name": "engine",
                            "image": PRE_FIX_IMAGE,
                            "command": ["python3", "-m", "sglang.launch_server"],
                            "args": engine_args(role, pool),
                            "ports": [{"name": "http", "containerPort": 30000}],
                            "readinessProbe": {
                                "httpGet": {"path": "/health", "port": 30000},
                                "periodSeconds": 1,
                            },
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def plain_router(ns: str) -> list[dict[str, Any]]:
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    labels = {"app": "leaky-router"}
    args = [
        "--host", "0.0.0.0", "--port", "8000", "--pd-disaggregation", "--policy", "round_robin",
        "--service-discovery", "--service-discovery-namespace", ns,
        "--service-discovery-port", "30000",
        "--prefill-selector", "app=leaky", "role=prefill",
        "--decode-selector", "app=leaky", "role=decode",
        "--worker-startup-check-interval", "1", "--health-check-interval-secs", "1",
    ]  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "router"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "router"}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "router"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "router"},
         "subjects": [{"kind": "ServiceAccount", "name": "router", "namespace": ns}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "leaky-router"},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "serviceAccountName": "router", "terminationGracePeriodSeconds": 2,
                      "containers": [{"name": "router", "image": SMG_IMAGE,
                                      "command": ["smg", "launch"], "args": args,
                                      "ports": [{"name": "http", "containerPort": 8000}],
                                      "readinessProbe": {"httpGet": {"path": "/readiness",
                                                                     "port": 8000},
                                                         "periodSeconds": 1}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "leaky-router"},
         "spec": {"selector": labels, "ports": [{"name": "http", "port": 80,
                                                 "targetPort": "http"}]}},
    ]  # fmt: skip


def plain_requirement(pod: Obj) -> Requirement | None:
    """What the bypassed deployment advertises (its --context-length) for each role."""
    role = ((pod.get("metadata") or {}).get("labels") or {}).get("role")
    return Requirement(context_length=CONTEXT, role=role) if role else None


def decode_first(world: World, prefill: Obj, decode: Obj, ids: list[int], max_new: int) -> Any:
    """One PD request the way the incident-era gateway answered it: both legs at once with the
    same bootstrap room, and the client gets decode's response."""
    room = random.randrange(2**63)
    leg = body(ids, max_new) | {
        "bootstrap_host": prefill["status"]["podIP"],
        "bootstrap_port": 8998,
        "bootstrap_room": room,
    }
    answers: dict[str, tuple[int, Any]] = {}

    def send(role: str, pod: Obj) -> None:
        answers[role] = http_json(world.engine_url(pod) + "/generate", leg, timeout=60)

    threads = [
        threading.Thread(target=send, args=(r, p))
        for r, p in (("prefill", prefill), ("decode", decode))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return answers["decode"]


def test_bypassed_gate_lets_an_over_length_prompt_read_another_requests_canary(
    world: World, scenario_ns: str
) -> None:
    ns = scenario_ns
    started = time.monotonic()
    sampler = InvariantSampler(
        world.cluster,
        ns,
        engine_selector="app=leaky,tier=engine",
        router_selector="app=leaky-router",
        requirement_of=plain_requirement,
        expect_violations=True,
        name="bypassed",
    )
    with sampler:
        manifests = [plain_engine(ns, "prefill", PREFILL_POOL), plain_engine(ns, "decode", None)]
        manifests += plain_router(ns)
        world.apply(yaml.safe_dump_all(manifests), namespace=ns)
        deadline_loop(
            "the plain router to be Ready (both pre-fix engines Ready and discovered)",
            lambda: any(is_ready(p) for p in world.list("pods", ns, "app=leaky-router")),
            timeout=180,
        )
        # The sampler proves it can fail: Ready pods and live gateway workers point at engines
        # whose pool (692) is below the context and whose version is below the floor.
        first = sampler.wait_for_violation(timeout=30)
        print(f"sampler flagged: {first.describe()}")

        url = world.service_url("leaky-router", ns)
        code, a = http_json(url + "/generate", body(REQUEST_A, 4), timeout=60)
        assert code == 200 and a["output_ids"] == REQUEST_A[:4], a
        code, b = http_json(url + "/generate", body(REQUEST_B, 40), timeout=60)
        print(f"smg 1.13.0 answer to the over-length prompt: HTTP {code} {str(b)[:200]}")
        # smg 1.13.0 returns the first non-2xx leg: the pre-fix prefill's 400.
        assert code == 400 and b["error"]["code"] == "prefill_bad_request", b

        (prefill,) = world.list("pods", ns, "app=leaky,role=prefill")
        (decode,) = world.list("pods", ns, "app=leaky,role=decode")
        code, a = decode_first(world, prefill, decode, REQUEST_A, 4)
        assert code == 200 and a["output_ids"] == REQUEST_A[:4], a
        code, b = decode_first(world, prefill, decode, REQUEST_B, 40)
        print(f"decode's answer to the over-length prompt: HTTP {code} {b}")
        assert code == 200, b
        assert contains(b["output_ids"], CANARY), b["output_ids"]
    reasons = {v.reason for v in sampler.violations}
    paths = {v.path for v in sampler.violations}
    assert {"KvPoolTooSmall", "EngineVersionTooOld"} <= reasons, reasons
    assert {"pod Ready", "gateway worker"} <= paths, paths
    print(f"MEASURED scenario 6 (bypassed) {time.monotonic() - started:.1f}s")


# ------------------------------------------------------------------ the same engines under kvgate
def kvgate_md(name: str) -> dict[str, Any]:
    """tiny-llama behind kvgate on the small pool with the pre-fix behaviour and the prefill
    pool below the context. Admission refuses the honest spelling of this (image v0.5.20, or
    ``maxTotalTokens: 692``); here both are out of its sight (an unversioned image whose
    engines emulate 0.5.20, the cap in ``engine.args``), so only the live gate stands."""
    role = {"replicas": 1, "nodeSelector": {"kvgate.io/pool": "small"}}
    return {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": MODEL, "path": MODEL, "contextLength": CONTEXT},
            "engine": {
                "image": "lmsysorg/sglang:latest",
                "args": ["--max-total-tokens", str(PREFILL_POOL)],
                "env": [{"name": "KVGATE_EMULATE_INCIDENT", "value": "1"}],
            },
            "prefill": role,
            "decode": role,
        },
    }


def test_kvgate_keeps_the_same_engines_off_traffic_and_leaks_no_canary(
    world: World, scenario_ns: str
) -> None:
    ns = scenario_ns
    started = time.monotonic()
    with InvariantSampler(world.cluster, ns, name="kvgate-incident"):
        world.apply(kvgate_md("leaky"), namespace=ns)

        def refused() -> list[Any] | None:
            pods = engine_pods(world, ns, "leaky")
            gated = [
                p
                for p in pods
                if any(
                    c.get("type") == GATE and c.get("status") == "False"
                    and c.get("reason") == "KvPoolTooSmall"
                    for c in p["status"].get("conditions") or []
                )
            ]  # fmt: skip
            return gated if len(gated) == 2 else None

        gated = deadline_loop("both engine pods to be refused by the gate", refused, 180)
        for pod in gated:
            assert not is_ready(pod)
            cond = next(c for c in pod["status"]["conditions"] if c["type"] == GATE)
            assert (
                f"reports KV pool {PREFILL_POOL} tokens < context length 2,048" in cond["message"]
            ), cond
        print(get_md_table(world, ns))
        ready = md_condition(world, "leaky", ns, "Ready")
        assert ready is not None and ready["status"] == "False", ready
        assert any("692" in e.get("message", "") for e in events(world, ns, "KvPoolTooSmall"))
        assert router_workers(world, ns, "leaky") == []
        # The same traffic, at the router pods themselves (the MD's Service has no ready
        # router behind it: a router is Ready only with a verified prefill and decode).
        routers = world.list("pods", ns, "kvgate.io/deployment=leaky,kvgate.io/component=router")
        assert routers and not any(is_ready(r) for r in routers)
        for router in routers:
            url = f"http://127.0.0.1:{world.forward(router['status']['podIP'], 8000)}"
            for ids, n in ((REQUEST_A, 4), (REQUEST_B, 40)):
                code, answer = http_json(url + "/generate", body(ids, n), timeout=30)
                print(f"kvgate-managed router answer: HTTP {code} {str(answer)[:160]}")
                assert code >= 500, answer
                assert "output_ids" not in str(answer)
    print(f"MEASURED scenario 6 (kvgate) {time.monotonic() - started:.1f}s")
