"""A tenant's attacks, as a tenant would try them on a serving ModelDeployment: the router's
worker API (through the ``<md>`` Service, with and without the key), a weakened requirement
annotation on an engine pod, and objects that squat on the names kvgate derives. The invariant
sampler watches every traffic path throughout.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_attack_tenant.py -v -s`` (root).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from attack_helpers import admitted, policy_lifted
from kvgate_e2e.deadlines import (
    ENGINE_POD_DEADLINE,
    ENGINE_VERDICT_DEADLINE,
    EVENT_DEADLINE,
    FIRST_PASS_DEADLINE,
    GENERATE_TIMEOUT,
    POLICY_LIFT_DEADLINE,
    REVISION_DEADLINE,
    ROUTER_API_TIMEOUT,
    ROUTER_AUDIT_DEADLINE,
    ROUTERS_GONE_DEADLINE,
)
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import (
    World,
    http_json,
    is_ready,
    router_key,
)
from scenario_helpers import (
    GATE,
    deadline_loop,
    engine_pods,
    events,
    known_answer,
    make_tenant,
    md_condition,
    on_pool_without_estimate,
    router_workers,
    sample_md,
    wait_md_ready,
)

pytestmark = pytest.mark.e2e

ROGUE_IMAGE = "lmsysorg/sglang:v0.5.23"


POD_METADATA_BINDING = "kvgate-kvgate-system-pod-metadata"  # the chart's VAP bindings
SECRET_DELETION_BINDING = "kvgate-kvgate-system-secret-deletion"
# Deadlines, not bounds (the run prints each time it measured; nothing here asserts one): only a
# step that never happens reaches one. Shared ones come from kvgate_e2e.deadlines (the first
# revision Ready uses REVISION_DEADLINE, 300 s, like every other file; it was 180 s here).
# kvgate noticing the tenant's Secret under its name: a watch event, or its conflict re-check
# within 30 s; twice that.
SECRET_CONFLICT_DEADLINE = 60
# Ready again once the tenant's Secret is gone: the conflict re-check (within 30 s), kvgate's
# Secret recreated, the routers started and discovering the engines.
ROUTERS_BACK_DEADLINE = 120


def rogue_engine(ns: str) -> dict[str, Any]:
    """A tenant's own engine (no kvgate labels): 1,024 tokens of context on a 692-token pool,
    nowhere near the 131,072 the ModelDeployment advertises."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rogue", "namespace": ns, "labels": {"app": "rogue"}},
        "spec": {
            "nodeSelector": {"kvgate.io/pool": "small"},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "engine",
                    "image": ROGUE_IMAGE,
                    "command": ["python3", "-m", "sglang.launch_server"],
                    "args": [
                        *("--model-path", "tiny-llama", "--host", "0.0.0.0", "--port", "30000"),
                        *("--context-length", "1024", "--max-total-tokens", "692"),
                        *("--disaggregation-mode", "decode"),
                    ],
                    "ports": [{"name": "http", "containerPort": 30000}],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": 30000}},
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def test_the_router_worker_api_refuses_anyone_without_the_key_and_the_operator_removes_injected_workers(  # noqa: E501
    world: World, namespace: str
) -> None:
    ns, md = namespace, "guarded"
    world.apply(sample_md(md), ns)
    wait_md_ready(world, md, ns, REVISION_DEADLINE)
    world.apply(rogue_engine(ns), ns)
    rogue = world.wait_for(
        "the tenant's rogue engine to be Ready",
        lambda: ((p := world.get("pod", "rogue", ns)) is not None and is_ready(p) and p) or None,
        ENGINE_POD_DEADLINE,
    )
    rogue_url = f"http://{rogue['status']['podIP']}:30000"
    service = world.service_url(md, ns)
    injection = {"url": rogue_url, "worker_type": "decode"}

    with InvariantSampler(world.cluster, ns, name="router-api") as sampler:
        # 1. A client of the Service (anyone who can reach it) cannot touch the worker API.
        for method, path, body in (
            ("POST", "/workers", injection),
            ("GET", "/workers", None),
            ("DELETE", "/workers/anything", None),
        ):
            code, answer = http_json(
                service + path, body, timeout=ROUTER_API_TIMEOUT, method=method
            )
            print(f"{method} {path} through Service {md} without the key: HTTP {code} {answer}")
            assert code == 401, (method, path, code, answer)

        # 2. A namespace editor can read the Secret; the worker it injects is removed.
        key = router_key(world, ns, md)
        auth = {"Authorization": f"Bearer {key}"}
        posted = time.monotonic()
        code, answer = http_json(
            service + "/workers", injection, timeout=ROUTER_API_TIMEOUT, headers=auth
        )
        print(f"POST /workers with the key: HTTP {code} {answer}")
        assert code == 202, answer

        def gone() -> float | None:
            listed = [w.get("url") for w in router_workers(world, ns, md)]
            removed = any(
                e.get("reason") == "UnknownWorkerRemoved" and rogue_url in e.get("message", "")
                for e in events(world, ns)
            )
            return time.monotonic() - posted if removed and rogue_url not in listed else None

        took = deadline_loop(
            "the operator to remove the injected worker", gone, ROUTER_AUDIT_DEADLINE
        )
        print(f"MEASURED injected worker removed {took:.2f} s after POST /workers")
        event = next(e for e in events(world, ns) if e.get("reason") == "UnknownWorkerRemoved")
        print(f"Event {event['reason']}: {event['message']}")
        assert event["involvedObject"]["kind"] == "ModelDeployment"
        assert "not a verified engine pod of revision" in event["message"]
        # It stays gone (the audit keeps running).
        assert rogue_url not in [w.get("url") for w in router_workers(world, ns, md)]
        ok, detail = known_answer(world, md, ns, timeout=GENERATE_TIMEOUT)
        assert ok, detail
    assert sampler.violations == []


def test_a_weakened_requirement_annotation_does_not_verify_an_undersized_engine(
    world: World, namespace: str
) -> None:
    ns, md = namespace, "weak"
    # 131,072 tokens advertised on 24 GiB GPUs: every engine's pool is far too small.
    undersized = on_pool_without_estimate(sample_md(md, pool="small"), "small")
    undersized["spec"].setdefault("rollout", {})["scaleDownRefused"] = False  # keep the pods
    world.apply(undersized, ns)
    pods = deadline_loop(
        "both engines to be judged unsafe",
        lambda: (
            (
                (
                    ps := [
                        p
                        for p in engine_pods(world, ns, md)
                        if any(
                            c.get("type") == GATE and c.get("reason") == "KvPoolTooSmall"
                            for c in p.get("status", {}).get("conditions", [])
                        )
                    ]
                )
                and len(ps) == 2
                and ps
            )
            or None
        ),
        ENGINE_VERDICT_DEADLINE,
    )
    weak = json.dumps({"contextLength": 1, "headroom": 1.0, "minEngineVersion": "0.0.1"})
    with InvariantSampler(world.cluster, ns, name="weak-annotation") as sampler:
        # The chart's admission policy denies this edit to everyone (test_attack_pods shows it);
        # on a cluster without it (policy disabled, or a pre-1.30 API server) the operator must
        # not care either: lift the policy's binding for the edit only.
        with policy_lifted(world, POD_METADATA_BINDING, ns):
            for pod in pods:
                annotate = (
                    "annotate", "--overwrite", "-n", ns, "pod", pod["metadata"]["name"],
                    f"kvgate.io/requirement={weak}",
                )  # fmt: skip
                deadline_loop(
                    "the annotation to be admitted with the policy lifted",
                    lambda annotate=annotate: admitted(world.kubectl(*annotate, check=False)),
                    POLICY_LIFT_DEADLINE,
                )
        # Several re-verification periods (2 s in the e2e world): the gate never turns True.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for pod in engine_pods(world, ns, md):
                gate = next(
                    (c for c in pod["status"].get("conditions", []) if c.get("type") == GATE), {}
                )
                assert gate.get("status") != "True", pod["metadata"]["name"]
                assert not is_ready(pod)
            time.sleep(0.5)
        gate = next(
            c for c in engine_pods(world, ns, md)[0]["status"]["conditions"] if c["type"] == GATE
        )
        print(f"after the annotation: {gate['reason']}: {gate['message']}")
        assert gate["reason"] == "KvPoolTooSmall" and "context length 131,072" in gate["message"]
    assert sampler.violations == []


def test_objects_squatting_on_kvgates_names_are_never_adopted_and_the_conflict_is_named(
    world: World, namespace: str
) -> None:
    ns, md = namespace, "squat"
    theirs = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": md, "namespace": ns},
        "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    world.apply(theirs, ns)
    world.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": f"{md}-router"}}, ns
    )
    world.apply(sample_md(md), ns)

    def conflict() -> dict[str, Any] | None:
        cond = md_condition(world, md, ns, "Degraded")
        return cond if cond and cond.get("reason") == "Conflict" else None

    cond = deadline_loop("the Conflict condition", conflict, FIRST_PASS_DEADLINE)
    print(f"Degraded: {cond['reason']}: {cond['message']}")
    assert f"Service {md} already exists and kvgate does not own it" in cond["message"]
    assert f"ServiceAccount {md}-router already exists" in cond["message"]
    ready = md_condition(world, md, ns, "Ready")
    assert ready is not None and ready["status"] == "False" and ready["reason"] == "Conflict"
    # The Event is posted after the status write that carries the condition.
    deadline_loop("a Conflict Event", lambda: events(world, ns, "Conflict"), EVENT_DEADLINE)

    # Once the revision is verified, kvgate would switch traffic; it still never re-points the
    # tenant's Service.
    def verified() -> bool | None:
        status = (world.get_md(md, ns) or {}).get("status") or {}
        roles = [status.get(r, {}).get("verifiedReplicas", 0) for r in ("prefill", "decode")]
        return all(n >= 1 for n in roles) or None

    deadline_loop("both roles of the revision to be verified", verified, ENGINE_VERDICT_DEADLINE)
    svc = world.get("service", md, ns)
    assert svc is not None and svc["spec"]["selector"] == {"app": "theirs"}
    assert not svc["metadata"].get("ownerReferences")


TENANT_KEY = "the-tenants-own-router-key"


def test_a_tenant_who_replaces_the_router_key_secret_gets_no_router_on_their_key(
    world: World, namespace: str
) -> None:
    """A Secret without kvgate's label or owner is the tenant's own to create. Where a tenant
    may delete Secret <md>-router-control (a cluster without the chart's secret-deletion policy,
    whose binding is lifted here for that one delete; with it, the delete is denied:
    test_attack_tenant_addresses.py), they can create their own under that name and restart the
    routers: smg reads its worker-API key from that Secret when it starts, so a router on it
    would let the tenant add engines kvgate never verified. kvgate runs no router on it
    (Conflict, routers at 0) and, once the name is free again, recreates its own Secret and
    serves again."""
    ns, md = namespace, "rekeyed"
    secret = f"{md}-router-control"
    routers = f"kvgate.io/deployment={md},kvgate.io/component=router"
    world.apply(sample_md(md), ns)
    wait_md_ready(world, md, ns, REVISION_DEADLINE)
    tenant = make_tenant(world, ns)
    with InvariantSampler(world.cluster, ns, name="router-key-secret") as sampler:
        with policy_lifted(world, SECRET_DELETION_BINDING, ns):
            deadline_loop(
                "the tenant's delete to be admitted with the policy lifted",
                lambda: admitted(tenant.kubectl("delete", "secret", secret)),
                POLICY_LIFT_DEADLINE,
            )
        mine = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret},
            "stringData": {"admin-key": TENANT_KEY},
        }
        created = tenant.create(mine)
        assert created.returncode == 0, created.stderr
        assert tenant.kubectl("delete", "pods", "-l", routers, "--wait=false").returncode == 0
        replaced = time.monotonic()

        def conflict() -> dict[str, Any] | None:
            cond = md_condition(world, md, ns, "Degraded")
            ok = cond and cond.get("reason") == "Conflict" and secret in cond.get("message", "")
            return cond if ok else None

        cond = deadline_loop(
            "a Conflict naming the tenant's Secret", conflict, SECRET_CONFLICT_DEADLINE
        )
        print(f"Degraded: {cond['reason']}: {cond['message']}")
        assert "every router of this ModelDeployment at 0 replicas" in cond["message"]
        ready = md_condition(world, md, ns, "Ready")
        assert ready is not None and ready["status"] == "False", ready

        def no_router() -> float | None:
            left = world.list("pods", ns, routers)
            return None if left else time.monotonic() - replaced

        took = deadline_loop("no router pod left", no_router, ROUTERS_GONE_DEADLINE)
        print(f"MEASURED no router pod {took:.2f} s after the tenant's Secret and restart")
        deployment = world.list("deployments", ns, routers)
        assert deployment and all(d["spec"]["replicas"] == 0 for d in deployment), deployment
        theirs = world.get("secret", secret, ns)
        assert theirs is not None and not theirs["metadata"].get("ownerReferences")

        # The way out the condition names: delete the Secret; kvgate recreates its own (the
        # loop re-checks a conflict within 30 s) and the routers come back on kvgate's key.
        world.kubectl("delete", "secret", secret, f"--namespace={ns}")
        freed = time.monotonic()
        wait_md_ready(world, md, ns, ROUTERS_BACK_DEADLINE)
        print(f"MEASURED Ready again {time.monotonic() - freed:.2f} s after the Secret was freed")
        ours = world.get("secret", secret, ns)
        assert (
            ours is not None and ours["metadata"]["ownerReferences"][0]["kind"] == "ModelDeployment"
        )
        ok, detail = known_answer(world, md, ns, timeout=GENERATE_TIMEOUT)
        assert ok, detail
        service = world.service_url(md, ns)
        tenant_auth = {"Authorization": f"Bearer {TENANT_KEY}"}
        code, _ = http_json(
            service + "/workers", None, timeout=ROUTER_API_TIMEOUT, headers=tenant_auth
        )
        assert code == 401, code
    assert sampler.violations == []
