"""Leader election on a Lease (kvgate.kube.leader): the pure decision table, then two electors
racing
for one Lease held by an in-memory API server with resourceVersion (optimistic concurrency)."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest
from kvgate.kube.k8s import ApiError
from kvgate.kube.leader import Action, LeaderConfig, LeaderElector, LeaseRecord, decide

ME = LeaderConfig(namespace="kvgate-system", name="kvgate-operator", identity="pod-a")


def lease(holder: str, duration: int = 10, transitions: int = 3) -> LeaseRecord:
    t = "2026-12-01T00:00:00.000000Z"
    return LeaseRecord(holder, duration, t, t, transitions)


@pytest.mark.parametrize(
    ("current", "observed_ago", "action", "transitions"),
    [
        (None, None, Action.CREATE, 0),
        (lease("pod-a"), 0.0, Action.RENEW, 3),
        (lease("pod-a"), 60.0, Action.RENEW, 3),
        (lease(""), 0.0, Action.ACQUIRE, 4),
        (lease("pod-b"), 0.0, Action.WAIT, None),
        (lease("pod-b"), 9.9, Action.WAIT, None),
        (lease("pod-b"), 10.0, Action.ACQUIRE, 4),
        # The holder's own duration wins over ours: it may run with other settings.
        (lease("pod-b", duration=30), 15.0, Action.WAIT, None),
        (lease("pod-b", duration=30), 30.0, Action.ACQUIRE, 4),
        # A record seen for the first time counts as just renewed: never take over blind.
        (lease("pod-b"), None, Action.WAIT, None),
    ],
)
def test_a_lease_changes_hands_only_when_free_or_unrenewed_for_its_duration_in_our_clock(
    current: LeaseRecord | None,
    observed_ago: float | None,
    action: Action,
    transitions: int | None,
) -> None:
    now = 1000.0
    seen = None if observed_ago is None else now - observed_ago
    decision = decide(current, config=ME, now_wall=1.8e9, now_mono=now, observed_at_mono=seen)
    assert decision.action is action, decision.reason
    if transitions is None:
        assert decision.record is None
    else:
        assert decision.record is not None
        assert decision.record.holder == "pod-a"
        assert decision.record.transitions == transitions
        assert decision.record.renew_time == "2027-01-15T08:00:00.000000Z"


def test_timings_that_would_let_two_leaders_overlap_are_refused_with_the_variables_named() -> None:
    bad = LeaderConfig("ns", "l", "me", lease_duration_seconds=5, renew_deadline_seconds=5)
    assert any("KVGATE_LEADER_LEASE_DURATION_SECONDS=5" in p for p in bad.problems())
    bad = LeaderConfig("ns", "l", "me", renew_deadline_seconds=2, retry_period_seconds=2)
    assert any("KVGATE_LEADER_RENEW_DEADLINE_SECONDS=2" in p for p in bad.problems())
    assert LeaderConfig("ns", "l", "").problems() == [
        "the replica's identity is empty; set POD_NAME (the chart does)"
    ]
    assert ME.problems() == []


class LeaseServer:
    """The API server's Lease semantics: POST fails 409 if it exists, PUT fails 409 on a stale
    resourceVersion. ``down`` makes every request fail like an unreachable API server."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.versions = itertools.count(1)
        self.down: set[str] = set()  # identities whose requests fail
        self.writes: list[str] = []
        self.delay = 0.0  # seconds each request takes (a loaded API server)

    def client(self, identity: str) -> Any:
        server = self

        class Client:
            async def request(
                self,
                method: str,
                path: str,
                *,
                body: dict[str, Any] | None = None,
                missing_ok: bool = False,
                **_: Any,
            ) -> dict[str, Any] | None:
                await asyncio.sleep(server.delay)
                if identity in server.down:
                    raise OSError("connection refused")
                if method == "GET":
                    if server.lease is None:
                        if missing_ok:
                            return None
                        raise ApiError(404, method, path, "not found")
                    return {
                        "metadata": dict(server.lease["metadata"]),
                        "spec": dict(server.lease["spec"]),
                    }
                assert body is not None
                if method == "POST":
                    if server.lease is not None:
                        raise ApiError(409, method, path, "already exists")
                elif method == "PUT":
                    current = server.lease["metadata"]["resourceVersion"] if server.lease else None
                    if body["metadata"].get("resourceVersion") != current:
                        raise ApiError(409, method, path, "the object has been modified")
                body = {**body, "metadata": {**body["metadata"]}}
                body["metadata"]["resourceVersion"] = str(next(server.versions))
                server.lease = body
                server.writes.append(f"{identity}:{method}:{body['spec']['holderIdentity']}")
                return body

        return Client()

    @property
    def holder(self) -> str | None:
        return None if self.lease is None else self.lease["spec"]["holderIdentity"]


def fast(identity: str) -> LeaderConfig:
    return LeaderConfig(
        namespace="kvgate-system",
        name="kvgate-operator",
        identity=identity,
        lease_duration_seconds=1.0,  # Lease.spec.leaseDurationSeconds is whole seconds
        renew_deadline_seconds=0.6,
        retry_period_seconds=0.1,
    )


async def until(predicate: Any, timeout: float = 5.0) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not predicate():
        if loop.time() - start > timeout:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)
    return loop.time() - start


def elector(server: LeaseServer, identity: str, changes: list[tuple[str, bool]]) -> LeaderElector:
    def on_change(leading: bool) -> None:
        changes.append((identity, leading))

    return LeaderElector(server.client(identity), fast(identity), on_change=on_change)


async def test_two_replicas_race_and_exactly_one_leads_until_it_releases_the_lease() -> None:
    server, changes = LeaseServer(), []
    a, b = elector(server, "pod-a", changes), elector(server, "pod-b", changes)
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    wins = await asyncio.wait(
        [asyncio.create_task(a.acquire(stop_a)), asyncio.create_task(b.acquire(stop_b))],
        return_when=asyncio.FIRST_COMPLETED,
    )
    first, standby = (a, b) if a.leading else (b, a)
    assert [first.leading, standby.leading] == [True, False]
    assert server.holder == first.config.identity
    hold = asyncio.create_task(first.hold(stop_a if first is a else stop_b))
    # The standby keeps polling but never takes a Lease that is being renewed.
    await asyncio.sleep(2.5)  # 2.5 lease durations of renewals
    assert server.holder == first.config.identity and not standby.leading
    (stop_a if first is a else stop_b).set()
    await hold
    await first.release()
    waited = await until(lambda: standby.leading, timeout=2.0)
    assert server.holder == standby.config.identity
    # Released: the standby leads at its next poll, not after a lease duration.
    assert waited < 0.8
    assert changes[-2:] == [(first.config.identity, False), (standby.config.identity, True)]
    (stop_b if standby is b else stop_a).set()
    for task in wins[1]:
        await task


async def test_a_killed_leader_is_replaced_after_the_lease_duration_not_before() -> None:
    server, changes = LeaseServer(), []
    a, b = elector(server, "pod-a", changes), elector(server, "pod-b", changes)
    stop = asyncio.Event()
    assert await a.acquire(stop)
    holding = asyncio.create_task(a.hold(stop))
    standby = asyncio.create_task(b.acquire(asyncio.Event()))
    await asyncio.sleep(0.5)
    assert not b.leading
    holding.cancel()  # killed: no release, no more renewals
    killed_at = asyncio.get_running_loop().time()
    await until(lambda: b.leading, timeout=3.0)
    took = asyncio.get_running_loop().time() - killed_at
    # The lease duration since the last renewal (<= one retry period before the kill), plus
    # at most one poll; generous on top for a loaded machine, but never less than the duration.
    assert 1.0 - 0.1 - 0.05 <= took <= 1.0 + 0.1 + 0.5, took
    assert server.holder == "pod-b"
    assert server.lease is not None and server.lease["spec"]["leaseTransitions"] == 1
    await standby


async def test_a_leader_cut_off_from_the_api_steps_down_before_its_lease_can_be_taken() -> None:
    server, changes = LeaseServer(), []
    a, b = elector(server, "pod-a", changes), elector(server, "pod-b", changes)
    stop = asyncio.Event()
    assert await a.acquire(stop)
    holding = asyncio.create_task(a.hold(stop))
    standby = asyncio.create_task(b.acquire(asyncio.Event()))
    await asyncio.sleep(0.3)
    server.down.add("pod-a")
    await asyncio.wait_for(holding, timeout=2.0)  # returns within the renew deadline: lost
    stepped_down = asyncio.get_running_loop().time()
    assert not a.leading and ("pod-a", False) in changes
    await until(lambda: b.leading, timeout=3.0)
    # pod-a stopped leading before pod-b started: never two leaders.
    assert changes.index(("pod-a", False)) < changes.index(("pod-b", True))
    assert asyncio.get_running_loop().time() >= stepped_down
    await standby


async def test_a_leader_keeps_its_lease_when_each_renewal_takes_longer_than_the_retry_period() -> (
    None
):
    """client-go's rule: a renewal may take until the renew deadline. Cut at the retry period
    instead (2 s), an API server loaded enough to answer a GET and a PUT in 2.5 s made every
    renewal fail and the leader step down and restart, over and over (scale benchmark)."""
    server, changes = LeaseServer(), []
    a = elector(server, "pod-a", changes)
    stop = asyncio.Event()
    assert await a.acquire(stop)
    server.delay = 0.08  # a renewal (GET + PUT) takes 0.16 s: over 0.1, within 0.6
    holding = asyncio.create_task(a.hold(stop))
    await asyncio.sleep(2.0)  # two lease durations, three renew deadlines
    assert a.leading and not holding.done()
    assert sum(w.startswith("pod-a:PUT") for w in server.writes) >= 5
    stop.set()
    await holding
    assert changes == [("pod-a", True)]


async def test_a_leader_whose_lease_was_taken_over_stops_leading_at_its_next_renewal() -> None:
    server, changes = LeaseServer(), []
    a = elector(server, "pod-a", changes)
    stop = asyncio.Event()
    assert await a.acquire(stop)
    holding = asyncio.create_task(a.hold(stop))
    # Someone else wrote the Lease (e.g. a replica whose clock says ours expired).
    assert server.lease is not None
    server.lease["spec"]["holderIdentity"] = "pod-z"
    server.lease["metadata"]["resourceVersion"] = "999"
    await asyncio.wait_for(holding, timeout=1.0)
    assert not a.leading and changes == [("pod-a", True), ("pod-a", False)]
    await a.release()  # not ours any more: release must not clear pod-z's Lease
    assert server.holder == "pod-z"


async def test_renewals_go_on_while_the_operators_event_loop_is_blocked() -> None:
    """At 1,000 ModelDeployments (docs/design/scale.md) the operator's loop was so busy that a
    renewal queued on it missed the renew deadline; the leader stepped down and restarted over and
    over. The holder runs on a thread of its own with its own client."""
    from kvgate.controller import main

    server, changes = LeaseServer(), []
    a = elector(server, "pod-a", changes)
    stop = asyncio.Event()
    assert await a.acquire(stop)

    def thread_client() -> Any:
        client = server.client("pod-a")
        client.close = _no_close
        return client

    holding = asyncio.ensure_future(main._hold_in_thread(a, thread_client, stop))
    await asyncio.sleep(0.3)  # the thread has started renewing
    before = len(server.writes)
    time.sleep(1.5)  # the main loop runs nothing: 2.5 renew deadlines, 1.5 lease durations
    during = len(server.writes) - before
    assert during >= 5, server.writes  # every 0.1 s, from the thread
    assert a.leading and server.holder == "pod-a"
    stop.set()
    await asyncio.wait_for(holding, timeout=5)
    assert a.leading  # a stop is no loss: the caller releases
    await a.release()
    assert not server.holder  # released


async def _no_close() -> None:
    return None
