"""When a ModelDeployment's loop runs its next timer pass (pure).

Every change a rollout waits for (an engine pod verified or not, a Deployment's ready replicas, a
router turning Ready, the CR edited) wakes the loop at once through a watch: the timer only has
to catch what no watch reports, the verify deadline and drift in objects kvgate does not watch.
So a rollout in flight no longer re-reads the cluster every ``reconcile_seconds`` while nothing
changes: each timer pass that found the loop not woken doubles the wait, up to the steady period,
and never past the verify deadline. Settled loops wait the steady period, spread by ±10 % so a
thousand ModelDeployments started together do not resync in lockstep.
"""

from __future__ import annotations

STEADY_SPREAD = 0.1  # ± fraction of the steady period
# An object kvgate needs that is someone else's (kvgate.api.ownership) sends no watch event
# kvgate
# sees when it goes (a tenant's Secret or Service is not labelled as kvgate's): re-check.
CONFLICT_RECHECK_SECONDS = 30.0


def next_pass_seconds(
    *,
    settled: bool,
    failed: bool,
    quiet_passes: int,
    reconcile_seconds: float,
    steady_seconds: float,
    until_deadline: float | None = None,
    jitter: float = 0.5,
    conflicted: bool = False,
) -> float:
    """Seconds until the next timer pass.

    ``quiet_passes``: timer passes in a row that were not woken by a change; ``until_deadline``:
    seconds until the target's verify deadline (None: none pending); ``jitter`` in [0, 1);
    ``conflicted``: the pass reported an ownership conflict (never waits past
    CONFLICT_RECHECK_SECONDS).
    """
    if conflicted:
        return min(
            CONFLICT_RECHECK_SECONDS,
            next_pass_seconds(
                settled=settled,
                failed=failed,
                quiet_passes=quiet_passes,
                reconcile_seconds=reconcile_seconds,
                steady_seconds=steady_seconds,
                until_deadline=until_deadline,
                jitter=jitter,
            ),
        )
    if settled:
        return steady_seconds * (1 - STEADY_SPREAD + 2 * STEADY_SPREAD * jitter)
    if failed:  # the pass raised (API error): try again soon, as before
        return reconcile_seconds
    backoff = reconcile_seconds * 2.0 ** min(quiet_passes, 30)
    wait = min(backoff, max(steady_seconds, reconcile_seconds))
    if until_deadline is not None:
        # Wake just after the deadline, never later than the backoff says.
        wait = min(wait, max(reconcile_seconds, until_deadline + 0.1))
    return wait
