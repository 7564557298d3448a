"""Admission of multi-node shapes: tensorParallel (GPUs per engine) over nodes (pods per engine).

Table tests: every consistent shape is allowed; every inconsistent one is denied naming the field,
the numbers and a shape that works.
"""

from __future__ import annotations

from typing import Any

import pytest
from factories.admission_reviews import mutated
from kvgate.admission import check_document
from kvgate.admission.policy import ClusterPolicy
from kvgate.api.models import MAX_ENGINE_NODES, MAX_GPUS_PER_NODE, ModelDeploymentSpec
from kvgate.api.revision import revision_inputs, revision_of


def _denials(doc: dict[str, Any], field: str, policy: ClusterPolicy | None = None) -> str:
    result = check_document(doc, policy)
    assert not result.allowed, f"{field} was allowed"
    messages = [p.message for p in result.denials if p.field == field]
    assert messages, f"no denial on {field}: {result.message}"
    return "\n".join(messages)


# (case, changes) — shapes whose GPUs split evenly and fit a node.
ALLOWED: list[tuple[str, dict[str, Any]]] = [
    ("one pod per engine (default)", {}),
    ("2 nodes x 8 GPUs", {"spec.decode.nodes": 2, "spec.decode.tensorParallel": 16}),
    (
        "both roles multi-node",
        {
            "spec.prefill.nodes": 2,
            "spec.prefill.tensorParallel": 2,
            "spec.decode.nodes": 4,
            "spec.decode.tensorParallel": 32,
        },
    ),
    ("a node's full 16", {"spec.decode.nodes": 2, "spec.decode.tensorParallel": 32}),
    (
        "the largest group",
        {"spec.decode.nodes": MAX_ENGINE_NODES, "spec.decode.tensorParallel": MAX_ENGINE_NODES},
    ),
]


@pytest.mark.parametrize("changes", [c[1] for c in ALLOWED], ids=[c[0] for c in ALLOWED])
def test_consistent_multi_node_shape_is_allowed(changes: dict[str, Any]) -> None:
    result = check_document(mutated(changes))
    assert result.allowed, result.message


# (case, changes, field, words the message must hold: numbers and the way out)
DENIED: list[tuple[str, dict[str, Any], str, list[str]]] = [
    (
        "GPUs do not split over the nodes",
        {"spec.decode.nodes": 3, "spec.decode.tensorParallel": 16},
        "spec.decode.tensorParallel",
        ["16 GPUs per engine", "nodes 3", "5.33 GPUs per pod", "multiple of 3", "15 or 18"],
    ),
    (
        "fewer GPUs than nodes",
        {"spec.prefill.nodes": 4, "spec.prefill.tensorParallel": 2},
        "spec.prefill.tensorParallel",
        ["2 GPUs per engine", "nodes 4", "multiple of 4", "e.g. 4", "prefill.nodes", "e.g. 2"],
    ),
    (
        "one node asked for 32 GPUs",
        {"spec.decode.tensorParallel": 32},
        "spec.decode.tensorParallel",
        ["tensorParallel 32 / nodes 1 = 32 GPUs per pod > 16", "set decode.nodes to 2"],
    ),
    (
        "two nodes asked for 24 each",
        {"spec.decode.nodes": 2, "spec.decode.tensorParallel": 48},
        "spec.decode.tensorParallel",
        ["48 / nodes 2 = 24 GPUs per pod > 16", "set decode.nodes to 3 (48 / 3 = 16"],
    ),
    (
        "user sets the rank",
        {"spec.engine.args": ["--node-rank", "1"]},
        "spec.engine.args[0]",
        ["--node-rank 1: SGLang reads it as --node-rank", "kvgate's to set", "spec.decode.nodes"],
    ),
    (
        "user sets the leader address (alias, = form)",
        {"spec.engine.args": ["--log-level=info", "--nccl-init-addr=10.0.0.1:5000"]},
        "spec.engine.args[1]",
        ["--nccl-init-addr", "remove"],
    ),
    (
        "user sets nnodes",
        {"spec.engine.args": ["--nnodes", "2"]},
        "spec.engine.args[0]",
        ["--nnodes"],
    ),
    (
        "nodes zero",
        {"spec.decode.nodes": 0},
        "spec.decode.nodes",
        [">= 1", "got 0", "pods (nodes) per engine"],
    ),
    (
        "nodes above a group's limit",
        {"spec.decode.nodes": MAX_ENGINE_NODES + 1},
        "spec.decode.nodes",
        [f"<= {MAX_ENGINE_NODES}", "LeaderWorkerSet group"],
    ),
]


@pytest.mark.parametrize(
    ("changes", "field", "words"), [c[1:] for c in DENIED], ids=[c[0] for c in DENIED]
)
def test_inconsistent_shape_is_denied_naming_field_numbers_and_fix(
    changes: dict[str, Any], field: str, words: list[str]
) -> None:
    message = _denials(mutated(changes), field)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_cluster_gpus_per_node_denies_a_pod_larger_than_the_nodes() -> None:
    doc = mutated({"spec.decode.nodes": 2, "spec.decode.tensorParallel": 16})
    assert check_document(doc, ClusterPolicy(gpus_per_node=8)).allowed
    message = _denials(
        mutated({"spec.decode.tensorParallel": 16}),
        "spec.decode.tensorParallel",
        ClusterPolicy(gpus_per_node=8),
    )
    assert "16 / nodes 1 = 16 GPUs per pod > 8" in message
    assert "gpusPerNode 8" in message and "set decode.nodes to 2" in message
    assert check_document(mutated({"spec.decode.tensorParallel": 16})).allowed  # 16 ≤ 16


def test_tensor_parallel_above_every_node_times_the_largest_group_is_denied_by_the_schema() -> None:
    limit = MAX_GPUS_PER_NODE * MAX_ENGINE_NODES
    message = _denials(
        mutated({"spec.decode.nodes": MAX_ENGINE_NODES, "spec.decode.tensorParallel": limit + 1}),
        "spec.decode.tensorParallel",
    )
    assert f"<= {limit:,}" in message and f"got {limit + 1:,}" in message


def test_nodes_defaults_to_one_pod_per_engine() -> None:
    spec = ModelDeploymentSpec.model_validate(mutated({})["spec"])
    assert spec.prefill.nodes == 1 and spec.decode.nodes == 1


def test_single_node_specs_keep_their_revision_and_nodes_changes_it() -> None:
    """An upgrade that brings `nodes` must not roll every existing ModelDeployment: the default
    is left out of the revision; any other value is a new revision (new engines)."""
    single = ModelDeploymentSpec.model_validate(mutated({})["spec"])
    assert "nodes" not in revision_inputs(single)["decode"]
    assert "nodes" not in revision_inputs(single)["prefill"]
    double = ModelDeploymentSpec.model_validate(
        mutated({"spec.decode.nodes": 2, "spec.decode.tensorParallel": 2})["spec"]
    )
    wider = ModelDeploymentSpec.model_validate(mutated({"spec.decode.tensorParallel": 2})["spec"])
    assert revision_of(double) != revision_of(wider)


@pytest.mark.parametrize(
    ("name", "replicas", "allowed"),
    [
        # <name>-<rev 10>-decode-<group>-<hash 10>: group 1023 leaves 29 characters
        ("a" * 29, 1024, True),
        ("a" * 30, 1024, False),
        ("a" * 32, 10, True),  # group 9
        ("a" * 33, 10, False),
        ("a" * 63, 1, True),  # single-node roles keep the 63 of the Service
    ],
)
def test_name_leaves_room_for_the_labels_leader_worker_set_derives(
    name: str, replicas: int, allowed: bool
) -> None:
    multi = {"spec.decode.nodes": 2, "spec.decode.tensorParallel": 2}
    changes = {"metadata.name": name, "spec.decode.replicas": replicas}
    if len(name) < 63:
        changes |= multi
    result = check_document(mutated(changes))
    assert result.allowed is allowed, result.message
    if not allowed:
        message = _denials(mutated(changes), "metadata.name")
        assert f"{len(name)} characters is too long for spec.decode.nodes 2" in message
        assert "controller-revision-hash" in message and "> 63" in message
        assert f"at most {len(name) - 1} characters" in message
