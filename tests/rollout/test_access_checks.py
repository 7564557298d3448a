"""When a pass reads the router access objects and NetworkPolicies again
(kvgate.rollout.access_checks)."""

from __future__ import annotations

import pytest
from kvgate.rollout.access_checks import AccessCheck, access_check_due

LAST = AccessCheck(frozenset({"rev-a"}), at=100.0, access_conflicts=(), policy_conflicts=())
SAFETY_NET = 36_000.0


@pytest.mark.parametrize(
    ("last", "revisions", "deleting", "changed", "now", "due"),
    [
        pytest.param(None, {"rev-a"}, False, False, 101.0, True, id="first-pass"),
        pytest.param(LAST, {"rev-a"}, False, False, 101.0, False, id="pods-woke-it"),
        pytest.param(LAST, {"rev-a"}, False, True, 101.0, True, id="a-watch-event-about-them"),
        pytest.param(LAST, {"rev-a", "rev-b"}, False, False, 101.0, True, id="new-revision"),
        pytest.param(LAST, set(), False, False, 101.0, True, id="revision-gone"),
        pytest.param(LAST, {"rev-a"}, True, False, 101.0, True, id="policies-to-delete"),
        pytest.param(LAST, {"rev-a"}, False, False, 100.0 + SAFETY_NET, True, id="safety-net"),
        pytest.param(LAST, {"rev-a"}, False, False, 99.0 + SAFETY_NET, False, id="before-it"),
    ],
)
def test_the_access_objects_are_read_when_something_could_have_changed_them(
    last: AccessCheck | None,
    revisions: set[str],
    deleting: bool,
    changed: bool,
    now: float,
    due: bool,
) -> None:
    assert (
        access_check_due(
            last,
            revisions=frozenset(revisions),
            deleting=deleting,
            changed=changed,
            now=now,
            safety_net_seconds=SAFETY_NET,
        )
        is due
    )
