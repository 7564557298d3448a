"""Pods a revision's Deployment cannot create, in the ReplicaSet controller's own words (pure).

When the API server refuses a pod (a ResourceQuota, a LimitRange, Pod Security, an admission
webhook or policy), the ReplicaSet controller sets the ReplicaSet's ``ReplicaFailure`` condition
(reason ``FailedCreate``, the API server's message) and the Deployment controller copies it onto
the Deployment. kvgate reads it there (it already watches its Deployments) and says it at once,
instead of "0/1 verified" until the verification deadline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

REPLICA_FAILURE = "ReplicaFailure"  # the Deployment (and ReplicaSet) condition type
REASON = "FailedCreate"  # the ReplicaSet controller's reason, and kvgate's
MAX_MESSAGE = 1024  # the API server's message, kept whole up to this (a quota's names all fit)
HEAD = "cannot create its pods"  # how every note starts after the Deployment's name


@dataclass(frozen=True)
class CreationFailure:
    """One Deployment of kvgate's whose ReplicaSet cannot create pods."""

    component: str  # prefill, decode or router
    deployment: str
    message: str  # the ReplicaSet controller's, as the API server refused the pod

    def describe(self) -> str:
        return (
            f"{self.component} Deployment {self.deployment} {HEAD} ({REASON}): {self.message}; "
            "kvgate verifies them once they exist: fix what the message names (a "
            "ResourceQuota, a LimitRange, Pod Security or an admission policy of the namespace)"
        )


def replica_failure(status: Mapping[str, Any] | None) -> str | None:
    """The message of a Deployment status's ``ReplicaFailure`` condition when its ReplicaSet
    failed to create pods (status True, reason FailedCreate); None otherwise."""
    for cond in (status or {}).get("conditions") or []:
        if (
            isinstance(cond, Mapping)
            and cond.get("type") == REPLICA_FAILURE
            and cond.get("status") == "True"
            and cond.get("reason") == REASON
        ):
            message = str(cond.get("message") or "the API server refused the pod")
            return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "…"
    return None


def first_note(failures: Iterable[CreationFailure]) -> str:
    """``; <the first failure>`` (engines before the router), or nothing."""
    ordered = sorted(failures, key=lambda f: (f.component == "router", f.component))
    return f"; {ordered[0].describe()}" if ordered else ""
