"""Pure builders for multi-node engines: one LeaderWorkerSet per revision and role (plain dicts).

A role with ``nodes`` > 1 runs as ``<md>-<rev>-<role>``, a LeaderWorkerSet of ``replicas`` groups
of ``nodes`` pods; a role with ``nodes`` == 1 keeps its Deployment (kvgate.objects.builders).

- The **leader** (rank 0) is the pod kvgate's single-node engine pod already is: it serves HTTP
  and, for prefill, the KV bootstrap server; it carries the readiness gate and the guard sidecar,
  and its labels are the ones the router's discovery and the engine NetworkPolicies select
  (``kvgate.io/component=engine``).
- A **worker** (rank 1..nodes-1) runs the same engine command with ``--node-rank
  $(LWS_WORKER_INDEX)``. It serves no HTTP, so it has no readiness probe, no readiness gate and
  no guard, and it is labelled ``kvgate.io/component=engine-worker``: no selector that brings
  traffic (router discovery, Services) ever matches it.
- ``RecreateGroupOnPodRestart``: SGLang's ranks cannot rejoin a running engine, so a restarted
  or lost rank recreates the whole group (and the leader comes back unverified). Until LWS does
  so, the group gate (kvgate.verify.group_gate) already holds the leader out of traffic.
- Rolling updates take one group down at a time and never surge (no spare GPUs asked for); the
  template of a revision only changes when kvgate itself is upgraded, as for Deployments.
"""

from __future__ import annotations

import copy
from typing import Any

from kvgate_engine.launcher import engine_argv

from kvgate.api import labels, multinode
from kvgate.api.models import ModelDeployment, Role
from kvgate.objects import builders
from kvgate.objects.engine_launch import engine_launch

Body = dict[str, Any]


def worker_labels(md_name: str, revision: str, role: str) -> dict[str, str]:
    """A worker's labels: its revision and role, but never the engine component."""
    return {
        labels.DEPLOYMENT: md_name,
        labels.REVISION: revision,
        labels.ROLE: role,
        labels.COMPONENT: multinode.COMPONENT_WORKER,
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
    }


def leader_pod_template(
    md: ModelDeployment, role: Role, revision: str, guard: builders.Guard | None = None
) -> Body:
    """Rank 0: the single-node engine pod template, whose argv already names the group
    (--nnodes, --node-rank 0, --dist-init-addr) because the role's nodes > 1."""
    return builders.engine_pod_template(md, role, revision, guard)


def worker_pod_template(
    md: ModelDeployment, role: Role, revision: str, guard: builders.Guard | None = None
) -> Body:
    """Ranks 1..nodes-1: the leader's container with its own rank, without what serves or gates
    traffic (HTTP port and probe, bootstrap port, readiness gate, guard, requirement); with the
    leader's model volume, and its download init container when the weights are downloaded."""
    template = copy.deepcopy(builders.engine_pod_template(md, role, revision, guard))
    name = md.metadata.name or ""
    role_spec = md.spec.prefill if role is Role.PREFILL else md.spec.decode
    user_labels, user_annotations = builders.user_pod_metadata(role_spec)
    template["metadata"] = {"labels": {**user_labels, **worker_labels(name, revision, role.value)}}
    if user_annotations:
        template["metadata"]["annotations"] = user_annotations
    pod_spec = template["spec"]
    pod_spec.pop("readinessGates", None)
    # The guard goes; a download of the weights stays: every rank loads them from its own node.
    kept = [c for c in pod_spec.pop("initContainers", []) if c["name"] != builders.GUARD_CONTAINER]
    if kept:
        pod_spec["initContainers"] = kept
    container = pod_spec["containers"][0]
    command, args = builders.split_command(
        engine_argv(engine_launch(md.spec, role, node_rank=multinode.WORKER_RANK))
    )
    container["command"], container["args"] = command, args
    container.pop("readinessProbe", None)
    container.pop("ports", None)
    return template


def leader_worker_set(
    md: ModelDeployment,
    revision: str,
    role: Role,
    *,
    replicas: int,
    annotations: dict[str, str] | None = None,
    guard: builders.Guard | None = None,
) -> Body:
    """The LeaderWorkerSet of one revision's multi-node ``role`` engines."""
    name = md.metadata.name or ""
    role_spec = md.spec.prefill if role is Role.PREFILL else md.spec.decode
    spec: Body = {
        "replicas": replicas,
        # Workers start with their leader's pod; the leader waits (not Ready) for every rank.
        "startupPolicy": "LeaderCreated",
        "leaderWorkerTemplate": {
            "size": role_spec.nodes,
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": leader_pod_template(md, role, revision, guard),
            "workerTemplate": worker_pod_template(md, role, revision, guard),
        },
        "rolloutStrategy": {
            "type": "RollingUpdate",
            "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
        },
        # One headless Service <lws>: the leader is <lws>-<g>.<lws>.<namespace>.
        "networkConfig": {"subdomainPolicy": "Shared"},
    }
    component = role.value
    meta = builders._metadata(
        md,
        builders.component_name(name, revision, component),
        builders.object_labels(name, revision, component),
    )
    group = spec["leaderWorkerTemplate"]
    # Each template hashed as a Deployment's is (the guard's image left out), then the group.
    hashed = {
        **group,
        "leaderTemplate": builders.template_hash(group["leaderTemplate"]),
        "workerTemplate": builders.template_hash(group["workerTemplate"]),
    }
    meta["annotations"] = {
        labels.TEMPLATE_HASH: builders.template_hash(hashed),
        **(annotations or {}),
    }
    return {
        "apiVersion": multinode.LWS_API_VERSION,
        "kind": multinode.LWS_KIND,
        "metadata": meta,
        "spec": spec,
    }


def engine_workload(
    md: ModelDeployment,
    revision: str,
    role: Role,
    *,
    replicas: int,
    annotations: dict[str, str] | None = None,
    guard: builders.Guard | None = None,
) -> Body:
    """The object that runs ``role``'s engines: a LeaderWorkerSet when an engine spans several
    nodes, else the Deployment it has always been."""
    role_spec = md.spec.prefill if role is Role.PREFILL else md.spec.decode
    if multinode.is_multi_node(role_spec):
        return leader_worker_set(
            md, revision, role, replicas=replicas, annotations=annotations, guard=guard
        )
    return builders.deployment(
        md, revision, role.value, replicas=replicas, annotations=annotations, guard=guard
    )
