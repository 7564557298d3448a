"""Multi-node engines are LeaderWorkerSets: leader = the gated, serving rank 0; workers = ranks
1..N-1 that nothing routes to. Single-node roles keep their Deployments."""

from __future__ import annotations

from typing import Any

import pytest
from factories.golden import check_golden
from factories.model_deployments import make_md
from kvgate.api import labels, multinode
from kvgate.api.models import Role
from kvgate.objects import builders, lws_builders

REV = "7c9d0e1f2a"
GUARD = builders.Guard(image="kvgate:test")


def md(**overrides: Any) -> Any:
    return make_md(
        prefill__nodes=2,
        prefill__tensorParallel=16,
        decode__nodes=4,
        decode__tensorParallel=32,
        **overrides,
    )


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _engine(template: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = template["spec"]["containers"][0]
    return container


def test_leader_worker_set_matches_golden_file() -> None:
    body = lws_builders.leader_worker_set(md(), REV, Role.DECODE, replicas=2, guard=GUARD)
    check_golden("decode-leaderworkerset", body)


@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE])
def test_multi_node_role_is_one_leader_worker_set_group_per_engine(role: Role) -> None:
    body = lws_builders.engine_workload(md(), REV, role, replicas=3, guard=GUARD)
    assert (body["apiVersion"], body["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert body["metadata"]["name"] == f"llama-{REV}-{role.value}"
    assert body["metadata"]["ownerReferences"][0]["kind"] == "ModelDeployment"
    spec = body["spec"]
    assert spec["replicas"] == 3  # engines, not pods
    group = spec["leaderWorkerTemplate"]
    assert group["size"] == (2 if role is Role.PREFILL else 4)
    assert group["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert spec["rolloutStrategy"]["rollingUpdateConfiguration"] == {
        "maxUnavailable": 1,
        "maxSurge": 0,
    }


def test_leader_serves_and_is_gated_workers_neither_serve_nor_are_discovered() -> None:
    body = lws_builders.leader_worker_set(md(), REV, Role.PREFILL, replicas=1, guard=GUARD)
    leader = body["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    worker = body["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    # leader: readiness gate, guard, HTTP probe, bootstrap port for smg
    assert leader["spec"]["readinessGates"] == [{"conditionType": labels.ENGINE_VERIFIED}]
    assert [c["name"] for c in leader["spec"]["initContainers"]] == [builders.GUARD_CONTAINER]
    assert _engine(leader)["readinessProbe"]["httpGet"]["path"] == "/health"
    assert leader["metadata"]["annotations"][labels.BOOTSTRAP_PORT] == "8998"
    # worker: none of that
    assert "readinessGates" not in worker["spec"] and "initContainers" not in worker["spec"]
    assert "readinessProbe" not in _engine(worker) and "ports" not in _engine(worker)
    assert "annotations" not in worker["metadata"]
    # The router discovers with the selector labels: the leader matches, a worker never does.
    selector = builders.selector_labels("llama", REV, Role.PREFILL.value)
    assert selector.items() <= leader["metadata"]["labels"].items()
    assert not selector.items() <= worker["metadata"]["labels"].items()
    assert worker["metadata"]["labels"][labels.COMPONENT] == multinode.COMPONENT_WORKER
    argv = builders.router_argv(md(), REV)
    prefill_selector = argv[argv.index("--prefill-selector") + 1 : argv.index("--decode-selector")]
    assert f"{labels.COMPONENT}=engine" in prefill_selector


def test_ranks_leader_address_and_gpus_per_pod() -> None:
    body = lws_builders.leader_worker_set(md(), REV, Role.DECODE, replicas=1, guard=GUARD)
    group = body["spec"]["leaderWorkerTemplate"]
    leader, worker = _engine(group["leaderTemplate"]), _engine(group["workerTemplate"])
    assert flag(leader["args"], "--node-rank") == "0"
    assert flag(worker["args"], "--node-rank") == "$(LWS_WORKER_INDEX)"
    for container in (leader, worker):
        assert flag(container["args"], "--nnodes") == "4"
        assert flag(container["args"], "--tp-size") == "32"
        assert flag(container["args"], "--dist-init-addr") == "$(LWS_LEADER_ADDRESS):20000"
        # tensorParallel 32 over 4 nodes: 8 GPUs per pod
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert container["resources"]["requests"]["nvidia.com/gpu"] == 8


def test_single_node_role_keeps_its_deployment_unchanged() -> None:
    single = make_md()
    body = lws_builders.engine_workload(single, REV, Role.DECODE, replicas=2, guard=GUARD)
    assert body == builders.deployment(single, REV, "decode", replicas=2, guard=GUARD)
    args = _engine(body["spec"]["template"])["args"]
    assert "--nnodes" not in args


def test_mixed_roles_give_a_deployment_and_a_leader_worker_set() -> None:
    mixed = make_md(decode__nodes=2, decode__tensorParallel=2)
    prefill = lws_builders.engine_workload(mixed, REV, Role.PREFILL, replicas=1)
    decode = lws_builders.engine_workload(mixed, REV, Role.DECODE, replicas=1)
    assert (prefill["kind"], decode["kind"]) == ("Deployment", "LeaderWorkerSet")


def test_template_hash_ignores_the_guard_image_and_follows_the_worker() -> None:
    base = lws_builders.leader_worker_set(md(), REV, Role.DECODE, replicas=1, guard=GUARD)
    other_guard = lws_builders.leader_worker_set(
        md(), REV, Role.DECODE, replicas=1, guard=builders.Guard(image="kvgate:next")
    )
    assert (
        base["metadata"]["annotations"][labels.TEMPLATE_HASH]
        == other_guard["metadata"]["annotations"][labels.TEMPLATE_HASH]
    )
    changed = lws_builders.leader_worker_set(
        md(engine__env=[{"name": "NCCL_DEBUG", "value": "INFO"}]),
        REV,
        Role.DECODE,
        replicas=1,
        guard=GUARD,
    )
    assert (
        base["metadata"]["annotations"][labels.TEMPLATE_HASH]
        != changed["metadata"]["annotations"][labels.TEMPLATE_HASH]
    )
