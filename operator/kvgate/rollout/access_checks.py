"""When a pass reads the router's ServiceAccount, Role and RoleBinding and each running
revision's NetworkPolicies again (pure).

They are watched (label-filtered on the server: kvgate.controller.main), and a watch event about
one of
them marks its ModelDeployment (``Runtime.access_changed``) and wakes its loop. So a pass woken
only by its engine pods, its Deployments or its own status need not GET them again: on a
loaded API server those five or more reads were a third of a pass's requests (at 1,000
ModelDeployments). They are read on the loop's first pass, after a watch event about one of
them, when the set of running revisions changes (new or deleted NetworkPolicies), and at the
steady safety net (KVGATE_STEADY_RECONCILE_SECONDS) for whatever a watch could have missed. The
router's key Secret is not watched (that would mean reading every Secret in the cluster), so it
is read every pass as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.api.ownership import OwnershipConflict


@dataclass(frozen=True)
class AccessCheck:
    """What the last pass that read them found."""

    revisions: frozenset[str]  # the running revisions whose NetworkPolicies it ensured
    at: float  # time.monotonic() of that pass
    access_conflicts: tuple[OwnershipConflict, ...]  # ServiceAccount, Role, RoleBinding
    policy_conflicts: tuple[OwnershipConflict, ...]  # NetworkPolicies


def access_check_due(
    last: AccessCheck | None,
    *,
    revisions: frozenset[str],
    deleting: bool,
    changed: bool,
    now: float,
    safety_net_seconds: float,
) -> bool:
    """Whether this pass must read (and restore) the router access objects and the
    NetworkPolicies. ``revisions``: the running ones that keep theirs; ``deleting``: a revision's
    are to be deleted; ``changed``: a watch event about one of them since the last check."""
    if last is None or changed or deleting or revisions != last.revisions:
        return True
    return now - last.at >= safety_net_seconds
