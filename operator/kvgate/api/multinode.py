"""Multi-node engines: one engine over ``spec.<role>.nodes`` pods, run as a LeaderWorkerSet group.

Names and conventions shared by the builders, the launcher mapping, pod identity and the group
gate. LeaderWorkerSet (sigs.k8s.io/lws, API ``leaderworkerset.x-k8s.io/v1``, v0.9.0) runs each
group as a leader pod ``<lws>-<g>`` (worker index 0, from the leader StatefulSet ``<lws>``,
controlled by the LeaderWorkerSet) and workers ``<lws>-<g>-<i>`` (i = 1..size-1, from the
StatefulSet ``<lws>-<g>``, controlled by the leader *pod*). Its pod webhook adds
``LWS_LEADER_ADDRESS`` (``<lws>-<g>.<subdomain>.<namespace>``, resolvable through the headless
Service LWS creates, which publishes not-ready addresses) and ``LWS_WORKER_INDEX`` to every
container; kvgate's argv refers to them as ``$(VAR)``, which Kubernetes expands.
"""

from __future__ import annotations

from typing import Final

from kvgate.api.models import EngineSpec, RoleSpec

LWS_GROUP: Final = "leaderworkerset.x-k8s.io"
LWS_VERSION: Final = "v1"
LWS_API_VERSION: Final = f"{LWS_GROUP}/{LWS_VERSION}"
LWS_KIND: Final = "LeaderWorkerSet"
LWS_PLURAL: Final = "leaderworkersets"
LWS_CRD_NAME: Final = f"{LWS_PLURAL}.{LWS_GROUP}"

# Labels the LeaderWorkerSet controller puts on every pod of a group (api/leaderworkerset/v1).
LWS_NAME_LABEL: Final = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_KEY_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-key"
SIZE_ANNOTATION: Final = "leaderworkerset.sigs.k8s.io/size"

# Environment variables LeaderWorkerSet's pod webhook adds to every container.
LEADER_ADDRESS_ENV: Final = "LWS_LEADER_ADDRESS"
WORKER_INDEX_ENV: Final = "LWS_WORKER_INDEX"

# SGLang's torch.distributed rendezvous on rank 0 (--dist-init-addr host:port). SGLang also
# takes the next ports for its ZMQ sockets between ranks (sglang/srt/server_args.py PortArgs:
# port + 1 .. port + 6), so kvgate keeps a block of DIST_INIT_PORT_SPAN free of its other ports.
DIST_INIT_PORT: Final = 20000
DIST_INIT_PORT_SPAN: Final = 16

# The kvgate.io/component of worker pods. The router's discovery and the engine Services select
# component=engine, so a worker (which serves no HTTP) is never a router worker or an endpoint.
COMPONENT_WORKER: Final = "engine-worker"


def is_multi_node(role_spec: RoleSpec) -> bool:
    return role_spec.nodes > 1


def gpus_per_pod(role_spec: RoleSpec) -> int:
    """tensorParallel / nodes: the GPUs each pod of an engine requests (admission and the CRD
    deny a tensorParallel that is not a multiple of nodes)."""
    return max(1, role_spec.tensor_parallel // role_spec.nodes)


def dist_init_port(engine: EngineSpec) -> int:
    """DIST_INIT_PORT, or the next block of DIST_INIT_PORT_SPAN ports that holds neither of the
    engine's own ports (HTTP, bootstrap). (The guard's port is 8471 or just above, below it.)"""
    used = {engine.port, engine.bootstrap_port}
    port = DIST_INIT_PORT
    while any(port <= p < port + DIST_INIT_PORT_SPAN for p in used):
        port += DIST_INIT_PORT_SPAN
    return port


def dist_init_addr(engine: EngineSpec) -> str:
    """Rank 0's rendezvous address: the leader's stable LeaderWorkerSet name and the port."""
    return f"$({LEADER_ADDRESS_ENV}):{dist_init_port(engine)}"


LEADER_RANK: Final = "0"
WORKER_RANK: Final = f"$({WORKER_INDEX_ENV})"
