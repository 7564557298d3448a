"""Scenarios 1, 5 and 7 of the e2e tier, as a user's session reads:

1. a safe ModelDeployment becomes Ready, ``kubectl get kvmd`` shows the context and the verified
   pools, and a known-answer request through the router returns the right tokens;
5. ``kubectl apply`` of an unsafe ModelDeployment is denied by the webhook with its message, a
   safe one is admitted;
7. the CRD from ``crds/`` is accepted by the API server, its printer columns render, and a
   document violating a CEL rule is refused by the API server itself (schema validation runs
   before validating webhooks, so the refusal cannot come from kvgate's webhook).

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_scenario_safe_deployment.py -v -s`` (root).
"""

from __future__ import annotations

import copy
import statistics
from typing import Any

import pytest
import yaml
from kvgate_e2e.deadlines import GENERATE_TIMEOUT, REVISION_DEADLINE
from kvgate_e2e.world import (
    BIG_POOL,
    GATE,
    REPO,
    PodTimeline,
    World,
    condition,
    is_ready,
    load_sample,
    ready_endpoints,
)
from scenario_helpers import known_answer, wait_md_ready

pytestmark = pytest.mark.e2e

CONTEXT = 131_072
# Deadlines, not bounds: the first revision Ready is REVISION_DEADLINE (kvgate_e2e.deadlines,
# 300 s like every other file; it was 240 s here); the router as the Service's ready endpoint
# once it is Ready: the EndpointSlice controller's next sync.
ENDPOINT_DEADLINE = 30


def safe_md(name: str, pool: str = BIG_POOL) -> dict[str, Any]:
    """The sample (llama-3.1-8b, 131,072 tokens, 80 GiB GPUs) with engines pinned to ``pool``."""
    md = copy.deepcopy(load_sample("llama-8b"))
    md["metadata"] = {"name": name}
    for role in ("prefill", "decode"):
        md["spec"][role]["nodeSelector"] = {"kvgate.io/pool": pool}
    return md


def get_md_table(world: World, namespace: str) -> dict[str, dict[str, str]]:
    """``kubectl get kvmd`` as {name: {COLUMN: value}} (the printer columns a user sees)."""
    lines = world.kubectl("get", "kvmd", f"--namespace={namespace}").stdout.splitlines()
    header = lines[0].split()
    return {row.split()[0]: dict(zip(header, row.split(), strict=False)) for row in lines[1:]}


def test_safe_deployment_becomes_ready_shows_verified_pools_and_answers_through_the_router(
    world: World, namespace: str
) -> None:
    with PodTimeline(world, namespace, "kvgate.io/component=engine") as timeline:
        world.apply(safe_md("llama"), namespace)
        md = wait_md_ready(world, "llama", namespace, REVISION_DEADLINE)
    status = md["status"]
    verified = condition(md, "EnginesVerified")
    assert verified is not None and verified["status"] == "True", verified
    assert status["contextLength"] == CONTEXT
    for role in ("prefill", "decode"):
        assert status[role]["verifiedReplicas"] == 1
        # 80 GiB x 0.85 minus 15 GiB of weights, 128 KiB per token (Llama-3.1-8B, bf16).
        assert status[role]["minVerifiedKvPoolTokens"] >= CONTEXT

    table = get_md_table(world, namespace)
    print(world.kubectl("get", "kvmd", f"--namespace={namespace}").stdout)
    row = table["llama"]
    assert row["READY"] == "True"
    assert row["CONTEXT"] == str(CONTEXT)
    assert int(row["PREFILL-POOL"]) >= CONTEXT and int(row["DECODE-POOL"]) >= CONTEXT
    assert row["SERVING"] == status["servingRevision"]

    # Both engine pods verified by the operator (the kubelet never sets the gate) and Ready.
    engines = world.list("pods", namespace, "kvgate.io/deployment=llama,kvgate.io/component=engine")
    assert sorted(p["metadata"]["labels"]["kvgate.io/role"] for p in engines) == [
        "decode",
        "prefill",
    ]
    for pod in engines:
        gate = condition(pod, GATE)
        assert gate is not None and gate["status"] == "True", gate
        assert is_ready(pod)
        assert pod["spec"]["nodeSelector"] == {"kvgate.io/pool": BIG_POOL}
    delays = timeline.ready_to_verified()
    assert set(delays) == {p["metadata"]["name"] for p in engines}, delays
    print(
        "MEASURED engine container ready -> pod verified: "
        + ", ".join(f"{d:.2f}s" for d in sorted(delays.values()))
        + f" (median {statistics.median(delays.values()):.2f}s)"
    )

    # The <md> Service selects the serving revision's router, which is Ready and an endpoint.
    service = world.get("service", "llama", namespace)
    assert service is not None
    selector = service["spec"]["selector"]
    assert selector["kvgate.io/revision"] == status["servingRevision"]
    routers = world.list("pods", namespace, ",".join(f"{k}={v}" for k, v in selector.items()))
    assert len(routers) == 1 and is_ready(routers[0])
    world.wait_for(
        "the router as the Service's ready endpoint",
        lambda: ready_endpoints(world, namespace, "llama") == {routers[0]["status"]["podIP"]},
        timeout=ENDPOINT_DEADLINE,
    )

    # Known answer: the reference model copies the prompt.
    ok, detail = known_answer(world, "llama", namespace, timeout=GENERATE_TIMEOUT)
    assert ok, detail


def test_kubectl_apply_of_an_unsafe_deployment_is_denied_with_its_numbers_and_a_safe_one_admitted(
    world: World, namespace: str
) -> None:
    unsafe = safe_md("too-small", pool="small")
    for role in ("prefill", "decode"):
        unsafe["spec"][role]["gpuMemoryGiB"] = 24
    denied = world.kubectl(
        "apply", f"--namespace={namespace}", "-f", "-", input=yaml.safe_dump(unsafe), check=False
    )
    print(denied.stderr)
    assert denied.returncode != 0
    assert 'admission webhook "' in denied.stderr and "denied the request" in denied.stderr
    # The field, the numbers and the way out.
    assert "spec.prefill: estimated KV pool 37,273 tokens < contextLength 131,072" in denied.stderr
    assert "raise prefill.gpuMemoryGiB" in denied.stderr
    assert world.get_md("too-small", namespace) is None

    admitted = world.kubectl(
        "apply", f"--namespace={namespace}", "-f", "-", input=yaml.safe_dump(safe_md("safe"))
    )
    assert "modeldeployment.kvgate.io/safe created" in admitted.stdout
    assert world.get_md("safe", namespace) is not None


def test_crd_is_established_renders_printer_columns_and_the_api_server_enforces_cel_rules(
    world: World, namespace: str
) -> None:
    crd = world.get("crd", "modeldeployments.kvgate.io")
    assert crd is not None
    established = condition(crd, "Established")
    assert established is not None and established["status"] == "True"
    # What the chart installed is crds/modeldeployment.yaml (same schema, same columns).
    source = yaml.safe_load((REPO / "crds" / "modeldeployment.yaml").read_text(encoding="utf-8"))
    (served,) = crd["spec"]["versions"]
    (expected,) = source["spec"]["versions"]
    assert served["additionalPrinterColumns"] == expected["additionalPrinterColumns"]
    assert served["schema"] == expected["schema"]

    world.apply(safe_md("columns"), namespace)
    header = world.kubectl("get", "kvmd", f"--namespace={namespace}").stdout.splitlines()[0]
    assert header.split() == [
        "NAME",
        "READY",
        "CONTEXT",
        "PREFILL-POOL",
        "DECODE-POOL",
        "SERVING",
        "TRAFFIC",
        "REASON",
        "URL",
        "AGE",
    ]
    wide = world.kubectl("get", "kvmd", "-o", "wide", f"--namespace={namespace}").stdout
    assert wide.splitlines()[0].split()[-1] == "MESSAGE"

    bad = safe_md("low-headroom")
    bad["spec"]["safety"]["headroom"] = 0.5
    refused = world.kubectl(
        "apply",
        "--dry-run=server",
        f"--namespace={namespace}",
        "-f",
        "-",
        input=yaml.safe_dump(bad),
        check=False,
    )
    print(refused.stderr)
    assert refused.returncode != 0
    assert "is invalid" in refused.stderr
    assert "safety.headroom must be >= 1.0 (the pool must hold the context)" in refused.stderr
    assert "admission webhook" not in refused.stderr  # refused before any webhook ran
