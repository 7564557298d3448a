"""Engine shape: GPUs per engine (tensorParallel) against pods per engine (nodes). Pure.

kvgate's semantics: ``tensorParallel`` is the engine's whole ``--tp-size``, across all its nodes;
each of its ``nodes`` pods runs on its own node and requests ``tensorParallel / nodes`` GPUs.
So tensorParallel must split evenly over the nodes, and no pod may ask for more GPUs than a node
has (``MAX_GPUS_PER_NODE``, or the cluster's own figure when the admin set it). The flags that tie
the ranks together (``--nnodes``, ``--node-rank``, ``--dist-init-addr``) are kvgate's to set:
``engine.args`` may not carry them (:mod:`kvgate.admission.engine_args`).
"""

from __future__ import annotations

from kvgate.admission.policy import ClusterPolicy
from kvgate.admission.result import Problem
from kvgate.api.models import MAX_GPUS_PER_NODE, ModelDeploymentSpec, Role, RoleSpec
from kvgate.api.revision import REVISION_LENGTH
from kvgate.objects.builders import component_name
from kvgate.objects.names import LABEL_VALUE_MAX

# A StatefulSet labels its pods controller-revision-hash=<statefulset>-<hash>; the hash is a
# uint32 written in up to 10 characters, and a label value holds at most 63.
CONTROLLER_REVISION_HASH_MAX = 10


def _n(value: int) -> str:
    return f"{value:,}"


def _divisors(value: int, limit: int) -> list[int]:
    return [d for d in range(2, min(value, limit) + 1) if value % d == 0]


def _uneven(role: str, shape: RoleSpec, node_gpus: int) -> Problem:
    tp, nodes = shape.tensor_parallel, shape.nodes
    lower = tp - tp % nodes
    upper = lower + nodes
    multiples = [m for m in (lower, upper) if m >= nodes and m // nodes <= node_gpus]
    ways = []
    if multiples:
        ways.append(
            f"set {role}.tensorParallel to a multiple of {nodes} "
            f"(e.g. {' or '.join(_n(m) for m in multiples)})"
        )
    divisors = [d for d in _divisors(tp, tp) if tp // d <= node_gpus]
    if divisors:
        ways.append(f"set {role}.nodes to one that divides {_n(tp)} (e.g. {divisors[0]})")
    return Problem(
        f"spec.{role}.tensorParallel",
        f"{_n(tp)} GPUs per engine do not split evenly over nodes {nodes} "
        f"({_n(tp)} / {nodes} = {tp / nodes:.2f} GPUs per pod); each of an engine's pods gets "
        f"tensorParallel / nodes GPUs, so " + (" or ".join(ways) or "change either"),
    )


def _too_many_per_node(role: str, shape: RoleSpec, node_gpus: int, source: str) -> Problem:
    tp, nodes = shape.tensor_parallel, shape.nodes
    per_node = tp // nodes
    fitting = [d for d in _divisors(tp, tp) if d > nodes and tp // d <= node_gpus]
    way = (
        f"set {role}.nodes to {fitting[0]} ({_n(tp)} / {fitting[0]} = {tp // fitting[0]} GPUs "
        "per pod)"
        if fitting
        else f"lower {role}.tensorParallel to at most {_n(node_gpus * nodes)}"
    )
    return Problem(
        f"spec.{role}.tensorParallel",
        f"tensorParallel {_n(tp)} / nodes {nodes} = {_n(per_node)} GPUs per pod > {node_gpus}, "
        f"{source}; no pod of this engine could be scheduled; {way}",
    )


def check_shape(
    spec: ModelDeploymentSpec, policy: ClusterPolicy
) -> tuple[list[Problem], list[Problem]]:
    """Each role's tensorParallel splits evenly over its nodes, within a node's GPUs."""
    denials: list[Problem] = []
    if policy.gpus_per_node is not None:
        node_gpus = policy.gpus_per_node
        source = f"the GPUs a node has in this cluster (chart value gpusPerNode {node_gpus})"
    else:
        node_gpus = MAX_GPUS_PER_NODE
        source = f"the most GPUs any node has ({MAX_GPUS_PER_NODE})"
    for role in (Role.PREFILL.value, Role.DECODE.value):
        shape: RoleSpec = getattr(spec, role)
        if shape.tensor_parallel % shape.nodes:
            denials.append(_uneven(role, shape, node_gpus))
        elif shape.tensor_parallel // shape.nodes > node_gpus:
            denials.append(_too_many_per_node(role, shape, node_gpus, source))
    return denials, []


def _longest_group_label(md_name: str, role: str, replicas: int) -> str:
    """The longest label value LeaderWorkerSet's StatefulSets derive from this role: the
    worker StatefulSet <lws>-<group> of the last group, plus -<hash>."""
    lws = component_name(md_name, "0" * REVISION_LENGTH, role)
    return f"{lws}-{max(replicas - 1, 0)}-{'0' * CONTROLLER_REVISION_HASH_MAX}"


def check_group_names(md_name: object, spec: ModelDeploymentSpec) -> list[Problem]:
    """metadata.name short enough for the names LeaderWorkerSet derives from a multi-node
    role's engines (a longer one is admitted but its worker pods are never created)."""
    if not isinstance(md_name, str):
        return []
    denials = []
    for role in (Role.PREFILL.value, Role.DECODE.value):
        shape: RoleSpec = getattr(spec, role)
        if shape.nodes < 2:
            continue
        value = _longest_group_label(md_name, role, shape.replicas)
        if len(value) <= LABEL_VALUE_MAX:
            continue
        room = LABEL_VALUE_MAX - (len(value) - len(md_name))
        denials.append(
            Problem(
                "metadata.name",
                f"{len(md_name):,} characters is too long for spec.{role}.nodes "
                f"{shape.nodes}: each engine group's worker StatefulSet "
                f"<name>-<revision>-{role}-<group> labels its pods controller-revision-hash "
                f"of up to {len(value)} characters (at {shape.replicas:,} replicas) > "
                f"{LABEL_VALUE_MAX}; use a name of at most {room} characters",
            )
        )
    return denials
