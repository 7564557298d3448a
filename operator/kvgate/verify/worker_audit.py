"""Which of a router's workers are not a verified engine pod of its revision (pure).

smg discovers engine pods by label and adds one worker per Ready pod. Anything else in its worker
set got there through its control-plane API (``POST /workers``): a tenant who can read the key,
or a bug. The operator compares each router's ``GET /workers`` with the engine pods it verified
and removes every other worker. A worker is known only when its URL is the IP and engine port of
a verified pod of the router's own revision, written exactly as smg's discovery writes it
(``kvgate.verify.gateway.worker_address``: a URL that kvgate and smg could read as two different
hosts
is nobody's), its ``worker_type`` is that pod's role, and any
``smg.ai/pod-uid`` label it carries is that pod's uid (a label alone proves nothing: the API
accepts labels).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kvgate.verify.gateway import POD_UID_LABEL, same_ip, worker_address

# Workers smg is already removing take no new requests.
LEAVING_STATUSES = frozenset({"draining"})


@dataclass(frozen=True)
class KnownEngine:
    """A verified engine pod of the router's revision."""

    uid: str
    ip: str
    port: int
    role: str


def is_known(worker: Mapping[str, Any], engines: Sequence[KnownEngine]) -> bool:
    url = worker.get("url")
    target = worker_address(url) if isinstance(url, str) else None
    if target is None:
        return False
    worker_labels = worker.get("labels")
    uid = worker_labels.get(POD_UID_LABEL) if isinstance(worker_labels, Mapping) else None
    kind = str(worker.get("worker_type") or "").lower()
    for engine in engines:
        if target[1] != engine.port or not same_ip(target[0], engine.ip):
            continue
        if kind != engine.role:
            return False
        return uid is None or uid == engine.uid
    return False


def in_discovery_form(worker: Mapping[str, Any]) -> bool:
    """Whether the worker's URL is written as smg's discovery writes a pod's. One that is not
    was never a discovered pod, so no pass or watch can be behind on it: it need not wait for a
    second audit to be removed."""
    url = worker.get("url")
    return isinstance(url, str) and worker_address(url) is not None


def unknown_workers(
    workers: Sequence[Mapping[str, Any]], engines: Sequence[KnownEngine]
) -> list[Mapping[str, Any]]:
    """The workers to remove: not a verified engine of this revision, and not already leaving."""
    return [
        w
        for w in workers
        if str(w.get("status") or "").lower() not in LEAVING_STATUSES and not is_known(w, engines)
    ]


def describe(worker: Mapping[str, Any]) -> str:
    return f"{worker.get('worker_type') or 'unknown'} worker {worker.get('url')}"


class KeyRefusal(StrEnum):
    """What to do about a router pod that refused kvgate's control-plane key."""

    OLDER_KEY = "OlderKey"  # its template promises an older key: its rollout replaces it
    WAIT = "Wait"  # a first refusal: wake the pass (it restores the Secret), look again
    REPLACE = "Replace"  # refused twice in a row: delete the pod


def key_refusal(
    *, refused_before: bool, pod_fingerprint: str | None, fingerprint: str
) -> KeyRefusal:
    """What to do about a router pod that refused kvgate's control-plane key (HTTP 401).

    smg reads its key once, from the environment, which the kubelet fills from Secret
    ``<md>-router-control`` when the container starts. A router that answers 401 to the key
    kvgate derives started on a Secret kvgate did not write: a tenant deleted kvgate's Secret
    (deletion is not denied) and created their own under the name, or created it before the
    ModelDeployment. That router's worker API then takes the tenant's key, so they can add
    engines kvgate never verified, and kvgate can neither read nor clean its workers. Deleted,
    its replacement reads the Secret again (the pass restores kvgate's own, or scales the routers
    to 0 while the name is someone else's).

    Replaced only when it refused this audit and the one before (one answer is no evidence), and
    its pod carries the current key's fingerprint (``kvgate.io/router-key``): a pod of an older
    template holds an older key by design (a rotated operator seed)."""
    if pod_fingerprint != fingerprint:
        return KeyRefusal.OLDER_KEY
    return KeyRefusal.REPLACE if refused_before else KeyRefusal.WAIT
