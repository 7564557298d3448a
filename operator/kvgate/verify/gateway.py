"""Does a gateway still route to an engine pod whose verification gate turned False? (pure)

smg 1.13 drains and drops the worker of a pod that turns NotReady within about a second. A
gateway that does not honour NotReady would keep sending requests to an unverified engine; the
only lasting way to stop it is to delete the pod. This module decides
that from plain data: the pod, when its gate turned False, and the workers each router pod of the
same revision lists in ``GET /workers`` (smg's JSON, plain dicts).

Missing information never deletes: a router that cannot be read is reported, not acted on.
Deleting on missing information would turn a router outage (or a network policy between operator
and router) into engine churn, and a router the operator cannot reach gets no new evidence by
deleting the pod. Only a router that answers and lists the pod as routable, after the grace
period, gets the pod deleted.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

DEFAULT_GRACE_SECONDS = 15.0
POD_UID_LABEL = "smg.ai/pod-uid"
# smg worker statuses that take no new requests (pending and ready do).
NOT_ROUTING_STATUSES = frozenset({"draining", "failed", "not_ready"})

WITHIN_GRACE = "WithinGrace"
GATEWAY_HONOURED_NOT_READY = "GatewayHonouredNotReady"
GATEWAY_IGNORED_NOT_READY = "GatewayIgnoredNotReady"
GATEWAY_UNREACHABLE = "GatewayUnreachable"
NO_ROUTERS = "NoRouters"


class Action(StrEnum):
    KEEP = "Keep"
    DELETE = "Delete"


@dataclass(frozen=True)
class EnginePod:
    name: str
    uid: str
    ip: str
    port: int
    role: str = "engine"


@dataclass(frozen=True)
class RouterWorkers:
    """What one router pod answered: its workers, or why they could not be read."""

    router: str  # router pod name
    workers: tuple[Mapping[str, Any], ...] | None = None  # None: not read
    error: str | None = None
    # HTTP 401/403 to kvgate's control-plane key: the router runs with a key kvgate did not give
    # it (kvgate.verify.worker_audit.key_refusal).
    refused: bool = False


@dataclass(frozen=True)
class GatewayDecision:
    action: Action
    reason: str
    message: str
    unreachable: tuple[str, ...] = ()  # routers that could not be read (reported, never acted on)


def worker_address(url: str) -> tuple[str, int] | None:
    """The pod IP and port of a worker URL in exactly the form smg's Kubernetes discovery
    registers for a pod (``http://<podIP>:<port>``, or bare ``<podIP>:<port>``; an IPv6 address
    in brackets), else None.

    kvgate and smg must agree on where a worker sends traffic, and they parse URLs differently:
    Python's ``urlsplit`` follows RFC 3986, smg the WHATWG URL standard, where ``\\`` is ``/``
    for http (``http://rogue:1\\@verified:30000`` is host ``rogue`` to smg and ``verified`` to
    urlsplit), leading zeros in an IPv4 part make it octal, and tabs and newlines are dropped. So
    nothing is parsed leniently here: the text must be the canonical spelling of an IP address
    and a port, with nothing else (no user info, path, query, fragment, whitespace or other
    scheme). Anything else is no pod's worker."""
    rest = url[len("http://") :] if url.startswith("http://") else url
    if rest.startswith("["):
        host, sep, port = rest[1:].partition("]:")
        if not sep or ":" not in host:
            return None
    else:
        host, sep, port = rest.partition(":")
        if not sep or ":" in host:
            return None
    if not port.isascii() or not port.isdigit() or str(int(port)) != port or int(port) > 65535:
        return None
    try:
        canonical = str(ipaddress.ip_address(host))
    except ValueError:
        return None
    return (host, int(port)) if canonical == host else None


def same_ip(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a.lower() == b.lower()


def is_worker_of(worker: Mapping[str, Any], pod: EnginePod) -> bool:
    """The worker is this pod: its smg.ai/pod-uid label is the pod's uid, or (no uid label) its
    URL is the pod's IP:engine port. A uid label of another pod wins over a matching URL: the IP
    was reused and that worker is the other pod."""
    worker_labels = worker.get("labels")
    uid = worker_labels.get(POD_UID_LABEL) if isinstance(worker_labels, Mapping) else None
    if uid:
        return str(uid) == pod.uid
    url = worker.get("url")
    target = worker_address(url) if isinstance(url, str) else None
    return target is not None and target[1] == pod.port and same_ip(target[0], pod.ip)


def routes_to(worker: Mapping[str, Any], pod: EnginePod) -> bool:
    """The worker is the pod's and still takes new requests."""
    status = str(worker.get("status") or "").lower()
    return is_worker_of(worker, pod) and status not in NOT_ROUTING_STATUSES


def _seconds(value: float) -> str:
    return f"{value:,.1f} s"


def decide(
    pod: EnginePod,
    *,
    gate_false_since: datetime,
    now: datetime,
    routers: Sequence[RouterWorkers],
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
) -> GatewayDecision:
    """Keep the pod, or delete it because a gateway still routes to it after the grace period."""
    who = f"{pod.role} pod {pod.name}"
    elapsed = (now - gate_false_since).total_seconds()
    unreachable = tuple(r.router for r in routers if r.workers is None)
    if elapsed < grace_seconds:
        return GatewayDecision(
            Action.KEEP,
            WITHIN_GRACE,
            f"{who} turned NotReady {_seconds(elapsed)} ago; gateways get "
            f"{_seconds(grace_seconds)} to drain it",
            unreachable,
        )
    for router in routers:
        for worker in router.workers or ():
            if routes_to(worker, pod):
                status = worker.get("status") or "unknown"
                return GatewayDecision(
                    Action.DELETE,
                    GATEWAY_IGNORED_NOT_READY,
                    f"gateway {router.router} still routes to {who} (worker {worker.get('url')} "
                    f"status {status}) {_seconds(elapsed)} after it turned NotReady (grace "
                    f"{_seconds(grace_seconds)}); deleting the pod so no request reaches an "
                    "unverified engine",
                    unreachable,
                )
    if unreachable:
        problems = "; ".join(
            f"{r.router}: {r.error or 'no answer'}" for r in routers if r.workers is None
        )
        return GatewayDecision(
            Action.KEEP,
            GATEWAY_UNREACHABLE,
            f"cannot tell whether gateway {', '.join(unreachable)} still routes to {who} "
            f"{_seconds(elapsed)} after it turned NotReady ({problems}); kvgate deletes a pod "
            "only on a router's own word, never on missing information; check the router pods "
            "and the network path from the operator to their port",
            unreachable,
        )
    if not routers:
        return GatewayDecision(
            Action.KEEP, NO_ROUTERS, f"no router pod of {who}'s revision lists workers", ()
        )
    names = ", ".join(r.router for r in routers)
    return GatewayDecision(
        Action.KEEP,
        GATEWAY_HONOURED_NOT_READY,
        f"gateway {names} no longer routes to {who} {_seconds(elapsed)} after it turned NotReady",
        (),
    )
