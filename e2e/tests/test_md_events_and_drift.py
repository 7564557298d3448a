"""What a user sees of a ModelDeployment on the real API server:

- ``kubectl describe kvmd`` lists the Events the engine verifier posts about it (kubectl matches
  Events to the object by ``involvedObject.uid``; an Event without it is not shown);
- a revision Deployment whose pod template an older kvgate built (a key this build no longer
  writes, that build's hash) is brought back to exactly this build's template: the key is
  removed, not merged around;
- the router's ServiceAccount, Role and RoleBinding, deleted, come back from the running
  operator (they were once created only once per operator lifetime).

Run: ``flock /tmp/kvgate-e2e.lock .venv/bin/pytest -q -s e2e/tests/test_md_events_and_drift.py``
(root).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from kvgate.api import labels
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import FIRST_PASS_DEADLINE, PASS_DEADLINE, REVISION_DEADLINE
from kvgate_e2e.world import OPERATOR_NAMESPACE, World
from scenario_helpers import (
    deadline_loop,
    metric_value,
    on_pool_without_estimate,
    operator_metrics,
    sample_md,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]

REFUSAL = re.compile(
    r"(prefill|decode) pod \S+ reports KV pool [\d,]+ tokens < context length 131,072 "
    r"× headroom 1\.0"
)
DROPPED = "kvgate.io/dropped-by-a-newer-build"
OPTIMISTIC = "KvPoolEstimateOptimistic"  # kvgate.rollout.pool_drift.EVENT_REASON
DRIFT_METRIC = "kvgate_kv_pool_estimate_drift_ratio"
T = TypeVar("T")
# Deadlines, not bounds (nothing here asserts how fast; the run prints what it measured): only a
# step that never happens reaches one. Shared ones come from kvgate_e2e.deadlines (the refused
# revision's Event uses REVISION_DEADLINE, 300 s, like every other file; it was 240 s here).
# The prefill role's poolEstimate once decode's is in: both engines started together, so only its
# verification and a pass may lag.
SECOND_ROLE_DEADLINE = 120


def wait(world: World, what: str, probe: Callable[[], T | None], timeout: float) -> T:
    """``deadline_loop`` that fails with the operator's log tail (what it did meanwhile)."""
    try:
        return deadline_loop(what, probe, timeout)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n--- operator log (tail) ---\n{world.operator_log(60)}"
        ) from None


def describe_md(world: World, ns: str, name: str) -> str:
    return str(world.kubectl("describe", "kvmd", name, "-n", ns).stdout)


def events_section(described: str) -> str:
    return described.split("\nEvents:", 1)[1] if "\nEvents:" in described else ""


def test_kubectl_describe_md_shows_the_verifiers_refusal_with_its_numbers(
    world: World, namespace: str
) -> None:
    ns, name = namespace, "described"
    md = on_pool_without_estimate(sample_md(name), "small")
    assert "created" in world.apply(md, namespace=ns)
    uid = world.get_md(name, ns)["metadata"]["uid"]
    # What an Event without involvedObject.uid (the verifier's before this fix) looks like to
    # kubectl describe: posted by hand, it must not show, or this test could not tell.
    world.kubectl(
        "create",
        "-n",
        ns,
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{name}.without-uid", "namespace": ns},
                "involvedObject": {
                    "apiVersion": "kvgate.io/v1alpha1",
                    "kind": "ModelDeployment",
                    "name": name,
                    "namespace": ns,
                },
                "reason": "PostedWithoutUid",
                "message": "an Event about the md that carries no uid",
                "type": "Warning",
                "source": {"component": "e2e"},
            }
        ),
    )

    def described_refusal() -> str | None:
        section = events_section(describe_md(world, ns, name))
        rows = [line for line in section.splitlines() if "KvPoolTooSmall" in line]
        return section if any(REFUSAL.search(row) for row in rows) else None

    section = wait(
        world,
        "kubectl describe kvmd to list the verifier's KvPoolTooSmall Event with its numbers",
        described_refusal,
        REVISION_DEADLINE,
    )
    print(f"kubectl describe kvmd {name} (Events):{section}")
    row = next(line for line in section.splitlines() if "KvPoolTooSmall" in line)
    assert row.split()[0] == "Warning", row
    assert "PostedWithoutUid" not in section, section
    verifier_events = [
        e
        for e in world.list("events", ns)
        if e.get("reason") == "KvPoolTooSmall"
        and e["involvedObject"].get("kind") == "ModelDeployment"
    ]
    assert verifier_events, "no KvPoolTooSmall Event on the ModelDeployment"
    assert {e["involvedObject"].get("uid") for e in verifier_events} == {uid}, verifier_events


def _as_operator(world: World, *args: str, input: str | None = None) -> None:
    """kubectl as the operator's ServiceAccount: the chart's admission policy lets only it edit
    kvgate's Deployments (here: to put back what an older kvgate built)."""
    pod = world.operator_pod()
    assert pod is not None, "no operator pod"
    account = pod["spec"].get("serviceAccountName") or "default"
    world.kubectl(
        *args,
        f"--as=system:serviceaccount:{OPERATOR_NAMESPACE}:{account}",
        "--as-group=system:serviceaccounts",
        input=input,
    )


def test_a_template_key_a_newer_build_dropped_is_removed_from_the_deployment(
    world: World, namespace: str
) -> None:
    ns, name = namespace, "drifted"
    md = on_pool_without_estimate(sample_md(name), "small")
    assert "created" in world.apply(md, namespace=ns)
    selector = f"kvgate.io/deployment={name},kvgate.io/component=router"
    router = wait(
        world,
        "the router Deployment",
        lambda: next(iter(world.list("deployments", ns, selector)), None),
        FIRST_PASS_DEADLINE,
    )
    dname = router["metadata"]["name"]
    built_hash = router["metadata"]["annotations"][labels.TEMPLATE_HASH]
    built_template = router["spec"]["template"]
    # The Deployment as an older kvgate left it: a template annotation and a nodeSelector key
    # this build does not write, and that build's hash.
    older: list[dict[str, Any]] = [
        {"op": "add", "path": "/spec/template/spec/nodeSelector", "value": {DROPPED: "yes"}},
        {
            "op": "add",
            "path": "/metadata/annotations/" + labels.TEMPLATE_HASH.replace("/", "~1"),
            "value": "0123456789ab",
        },
    ]
    if built_template["metadata"].get("annotations"):
        older.append(
            {
                "op": "add",
                "path": "/spec/template/metadata/annotations/" + DROPPED.replace("/", "~1"),
                "value": "yes",
            }
        )
    _as_operator(
        world, "patch", "deployment", dname, "-n", ns, "--type=json", "-p", json.dumps(older)
    )

    def converged() -> dict[str, Any] | None:
        current = world.get("deployments", dname, ns)
        if current is None:
            return None
        template = current["spec"]["template"]
        ok = (
            current["metadata"]["annotations"].get(labels.TEMPLATE_HASH) == built_hash
            and DROPPED not in (template["spec"].get("nodeSelector") or {})
            and DROPPED not in (template["metadata"].get("annotations") or {})
        )
        return current if ok else None

    current = wait(
        world,
        f"the operator to remove {DROPPED} from {dname}'s template and restore its hash",
        converged,
        PASS_DEADLINE,
    )
    assert current["spec"]["template"] == built_template, (
        current["spec"]["template"],
        built_template,
    )


def test_deleted_router_rbac_comes_back_without_an_operator_restart(
    world: World, namespace: str
) -> None:
    ns, name = namespace, "rbac-lost"
    md = on_pool_without_estimate(sample_md(name), "small")
    assert "created" in world.apply(md, namespace=ns)
    account = f"{name}-router"
    kinds = (
        "serviceaccounts",
        "roles.rbac.authorization.k8s.io",
        "rolebindings.rbac.authorization.k8s.io",
    )

    def all_there() -> list[dict[str, Any]] | None:
        found = [world.get(kind, account, ns) for kind in kinds]
        return [f for f in found if f is not None] if all(found) else None

    before = wait(
        world, "the router's ServiceAccount, Role and RoleBinding", all_there, FIRST_PASS_DEADLINE
    )
    uid = world.get_md(name, ns)["metadata"]["uid"]
    # A cluster admin's mistake (the operator itself holds no delete on these kinds).
    world.kubectl("delete", *[f"{kind}/{account}" for kind in kinds], "-n", ns, "--wait=true")
    deleted_at = time.monotonic()
    after = wait(
        world,
        "the router's RBAC to be re-created by the running operator",
        all_there,
        PASS_DEADLINE,
    )
    print(f"MEASURED router RBAC re-created {time.monotonic() - deleted_at:.1f}s after deletion")
    assert {o["metadata"]["uid"] for o in after}.isdisjoint(o["metadata"]["uid"] for o in before)
    for obj in after:
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["uid"] == uid and owner["kind"] == "ModelDeployment", obj


def _pool_estimate(world: World, ns: str, name: str, role: str) -> dict[str, Any] | None:
    md = world.get_md(name, ns) or {}
    estimate = ((md.get("status") or {}).get(role) or {}).get("poolEstimate") or {}
    return estimate if estimate.get("pods") else None


def _drift_ratios(world: World, ns: str, name: str) -> tuple[float, float] | None:
    text = operator_metrics(world)
    decode, prefill = (
        metric_value(text, DRIFT_METRIC, namespace=ns, deployment=name, role=role)
        for role in ("decode", "prefill")
    )
    return (decode, prefill) if decode is not None and prefill is not None else None


def _reconciles(world: World) -> float:
    """Passes the leading operator has finished (kvgate_reconcile_duration_seconds' count)."""
    for line in operator_metrics(world).splitlines():
        if line.startswith("kvgate_reconcile_duration_seconds_count "):
            return float(line.split()[1])
    return 0.0


def _optimistic_events(world: World, ns: str) -> list[dict[str, Any]]:
    return [
        e
        for e in world.list("events", ns)
        if e.get("reason") == OPTIMISTIC and e["involvedObject"].get("kind") == "ModelDeployment"
    ]


def test_a_live_pool_below_the_estimate_shows_its_drift_metric_and_one_warning_for_that_role(
    world: World, namespace: str
) -> None:
    """The decode role's spec says 90 GiB GPUs; the nodes it runs on have 80 GiB (a GPU with less
    free memory than admission was told): its live pool comes out ~12 % below the estimate. The
    prefill role's 80 GiB is right: its live pool is within 10 % (above, as the reference engine
    keeps no 1 GiB reserve)."""
    ns, name = namespace, "estimate-drift"
    md = sample_md(name)
    md["spec"]["decode"]["gpuMemoryGiB"] = 90
    assert "created" in world.apply(md, namespace=ns)
    started = time.monotonic()
    decode = wait(
        world,
        "status.decode.poolEstimate with a verified pod",
        lambda: _pool_estimate(world, ns, name, "decode"),
        REVISION_DEADLINE,
    )
    prefill = wait(
        world,
        "status.prefill.poolEstimate with a verified pod",
        lambda: _pool_estimate(world, ns, name, "prefill"),
        SECOND_ROLE_DEADLINE,
    )
    print(f"MEASURED apply -> both roles' drift in status: {time.monotonic() - started:.1f}s")
    print(f"status.decode.poolEstimate: {json.dumps(decode)}")
    print(f"status.prefill.poolEstimate: {json.dumps(prefill)}")
    assert decode["optimistic"] is True and decode["driftPercent"] < -10, decode
    assert decode["gpuReservedGiB"] == 1.0 and "kvgate's assumption" in decode["reserveSource"]
    assert "more than 10% below the estimate" in decode["message"], decode["message"]
    assert prefill["optimistic"] is False and -10 <= prefill["driftPercent"] <= 10, prefill
    (live_decode,) = decode["pods"]
    assert live_decode["liveKvPoolTokens"] < decode["estimatedKvPoolTokens"]

    ratios = wait(
        world,
        f"{DRIFT_METRIC} of both roles on the operator's /metrics",
        lambda: _drift_ratios(world, ns, name),
        PASS_DEADLINE,
    )
    decode_ratio, prefill_ratio = ratios
    assert decode_ratio == pytest.approx(decode["driftPercent"] / 100, abs=0.002)
    assert decode_ratio < -0.1 < prefill_ratio, ratios

    events = wait(
        world,
        f"a {OPTIMISTIC} Warning Event",
        lambda: _optimistic_events(world, ns) or None,
        PASS_DEADLINE,
    )
    (event,) = events
    assert event["type"] == "Warning" and ": decode: estimated KV pool" in event["message"]
    assert "prefill" not in event["message"]
    section = events_section(describe_md(world, ns, name))
    assert OPTIMISTIC in section, section
    # Later passes judge the same drift again and post nothing more (a metadata change wakes
    # one; the operator's pass counter shows it ran).
    passes = _reconciles(world)
    world.kubectl("annotate", "kvmd", name, "-n", ns, "e2e.kvgate.io/nudge=1")
    wait(
        world,
        "another reconcile pass",
        lambda: _reconciles(world) >= passes + 2 or None,
        PASS_DEADLINE,
    )
    again = _optimistic_events(world, ns)
    assert len(again) == 1 and (again[0].get("count") or 1) == 1, again
