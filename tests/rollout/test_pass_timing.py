"""kvgate.rollout.pass_timing: a rollout in flight backs off while nothing wakes it, never past its
verify deadline; settled loops wait the steady period, spread so they do not run in lockstep."""

from __future__ import annotations

import pytest
from kvgate.rollout.pass_timing import next_pass_seconds

BASE = {"reconcile_seconds": 5.0, "steady_seconds": 30.0}


@pytest.mark.parametrize(
    ("quiet", "until_deadline", "expected"),
    [
        (0, None, 5.0),  # just woken (or first pass): as before
        (1, None, 10.0),
        (2, None, 20.0),
        (3, None, 30.0),  # capped at the steady period
        (50, None, 30.0),
        (3, 12.0, 12.1),  # never past the verify deadline
        (3, 2.0, 5.0),  # a deadline sooner than the base period: the base period, as before
        (3, -40.0, 5.0),  # past it (the pass that refuses is due): the base period
        (0, 600.0, 5.0),
    ],
)
def test_in_flight_backoff(quiet: int, until_deadline: float | None, expected: float) -> None:
    got = next_pass_seconds(
        settled=False, failed=False, quiet_passes=quiet, until_deadline=until_deadline, **BASE
    )
    assert got == pytest.approx(expected)


def test_a_failed_pass_retries_after_the_base_period_whatever_the_quiet_count() -> None:
    assert next_pass_seconds(settled=False, failed=True, quiet_passes=9, **BASE) == 5.0


@pytest.mark.parametrize(("jitter", "expected"), [(0.0, 27.0), (0.5, 30.0), (0.999, 32.99)])
def test_settled_waits_the_steady_period_spread_by_ten_percent(
    jitter: float, expected: float
) -> None:
    got = next_pass_seconds(settled=True, failed=False, quiet_passes=0, jitter=jitter, **BASE)
    assert got == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize("settled", [True, False])
def test_a_reported_conflict_is_re_checked_within_30_s_however_quiet_or_settled(
    settled: bool,
) -> None:
    """A tenant's Secret or Service under kvgate's name sends kvgate no watch event when it
    goes: the loop must look again, not wait the steady period (10 h by default)."""
    long = {"reconcile_seconds": 5.0, "steady_seconds": 36_000.0}
    quiet = {"settled": settled, "failed": False, "quiet_passes": 20, **long}
    assert next_pass_seconds(**quiet) > 30.0  # type: ignore[arg-type]
    assert next_pass_seconds(**quiet, conflicted=True) == 30.0  # type: ignore[arg-type]
    assert (
        next_pass_seconds(  # sooner stays sooner
            settled=False, failed=True, quiet_passes=0, conflicted=True, **long
        )
        == 5.0
    )
