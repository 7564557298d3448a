"""Label, annotation and condition names kvgate puts on the objects it manages."""

from __future__ import annotations

from typing import Final

PREFIX: Final = "kvgate.io"

# Labels (selectors: the router discovers pods by these, the Service selects routers by them).
DEPLOYMENT: Final = f"{PREFIX}/deployment"
ROLE: Final = f"{PREFIX}/role"
REVISION: Final = f"{PREFIX}/revision"
COMPONENT: Final = f"{PREFIX}/component"
MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "kvgate"

COMPONENT_ENGINE: Final = "engine"
COMPONENT_ROUTER: Final = "router"
ROLE_ROUTER: Final = "router"

# Annotations.
REQUIREMENT: Final = f"{PREFIX}/requirement"  # engine pod: what its guard holds it to (JSON, shown)
VERIFY_STARTED_AT: Final = f"{PREFIX}/verify-started-at"  # target Deployment: RFC 3339
REFUSED_REASON: Final = f"{PREFIX}/refused-reason"  # refused revision's Deployments
REFUSED_MESSAGE: Final = f"{PREFIX}/refused-message"
ROUTER_KEY_FINGERPRINT: Final = f"{PREFIX}/router-key"  # router pod template: key digest
TEMPLATE_HASH: Final = f"{PREFIX}/template-hash"  # hash of the built object, to detect drift
# Engine pod: a scale-down took it out of traffic at this time (RFC 3339); it is drained, then
# removed. DRAINED: it was drained (or its drain timed out) and carries the deletion cost that
# makes its ReplicaSet remove exactly it when kvgate lowers the replicas.
DRAINING_SINCE: Final = f"{PREFIX}/draining-since"
DRAINED: Final = f"{PREFIX}/drained"
POD_DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
BOOTSTRAP_PORT: Final = "sglang.ai/bootstrap-port"  # smg reads the prefill bootstrap port here

# The pod readiness gate the operator sets after verifying the live engine.
ENGINE_VERIFIED: Final = f"{PREFIX}/engine-verified"

FINALIZER: Final = f"{PREFIX}/finalizer"

# Label and annotation keys a ModelDeployment's podLabels and podAnnotations may not set: what
# kvgate, smg's discovery and the Deployment and LeaderWorkerSet controllers read or write on
# engine pods (the gate, the routing, the drain and the pods' ownership depend on them).
RESERVED_KEY_DOMAINS: Final = (PREFIX, "sglang.ai", "leaderworkerset.sigs.k8s.io")
RESERVED_KEYS: Final = (MANAGED_BY, POD_DELETION_COST, "pod-template-hash")


def reserved_key(key: str) -> bool:
    """``key`` is one kvgate keeps for itself on engine pods (a domain of RESERVED_KEY_DOMAINS,
    or a subdomain of one, or one of RESERVED_KEYS)."""
    if key in RESERVED_KEYS:
        return True
    domain = key.split("/", 1)[0].lower() if "/" in key else ""
    return any(domain == d or domain.endswith(f".{d}") for d in RESERVED_KEY_DOMAINS)
