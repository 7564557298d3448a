"""Probe slots (kvgate.kube.probe_slots): at most N engine reads at once, a changed engine's first.

The scale target: among 8,000 engines re-read every 30 s, a restarted engine must be re-verified
within 1 s (p50); in a FIFO queue it waits behind every periodic read queued before it."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import kmock
import pytest
from factories.fake_engine import FakeEngine, running
from factories.kmock_world import NS, declare_resources, engine_pod
from factories.model_deployments import NOW
from kvgate.controller import engine_pods
from kvgate.controller.main import make_verify
from kvgate.controller.runtime import Runtime
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.probe_slots import URGENT, ProbeSlots
from kvgate.kube.settings import OperatorSettings
from kvgate_engine.verdict import Requirement, Verdict


async def _hold(slots: ProbeSlots, order: list[str], name: str, release: asyncio.Event) -> None:
    async with slots.slot():
        order.append(name)
        await release.wait()


async def test_an_urgent_read_takes_the_next_slot_before_queued_periodic_reads() -> None:
    slots = ProbeSlots(1)
    order: list[str] = []
    go = asyncio.Event()
    first = asyncio.create_task(_hold(slots, order, "busy", go))
    await asyncio.sleep(0)
    periodic = [asyncio.create_task(_hold(slots, order, f"periodic-{i}", go)) for i in range(5)]
    await asyncio.sleep(0)

    async def urgent() -> None:
        URGENT.set(True)  # as the verifier does for a changed pod (this task's context only)
        await _hold(slots, order, "urgent", go)

    task = asyncio.create_task(urgent())
    await asyncio.sleep(0)
    assert slots.waiting == (1, 5)
    go.set()
    await asyncio.wait_for(asyncio.gather(first, task, *periodic), timeout=5)
    assert order == ["busy", "urgent", *(f"periodic-{i}" for i in range(5))]


async def test_never_more_than_size_reads_at_once() -> None:
    slots = ProbeSlots(3)
    running = peak = 0

    async def read(urgent: bool) -> None:
        nonlocal running, peak
        async with slots.slot(urgent):
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.001)
            running -= 1

    await asyncio.wait_for(asyncio.gather(*(read(i % 4 == 0) for i in range(40))), timeout=5)
    assert peak == 3
    assert slots.waiting == (0, 0)


async def test_a_cancelled_waiter_gives_up_its_place_and_loses_no_slot() -> None:
    slots = ProbeSlots(1)
    go = asyncio.Event()
    order: list[str] = []
    busy = asyncio.create_task(_hold(slots, order, "busy", go))
    await asyncio.sleep(0)
    gone = asyncio.create_task(_hold(slots, order, "gone", go))
    after = asyncio.create_task(_hold(slots, order, "after", go))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    go.set()
    await asyncio.wait_for(asyncio.gather(busy, after), timeout=5)
    assert order == ["busy", "after"]
    # Both slots' worth of holders have left: one slot is free again.
    await asyncio.wait_for(slots.acquire(urgent=False), timeout=1)


def test_a_size_below_one_is_refused_with_the_number() -> None:
    with pytest.raises(ValueError, match="at least 1, got 0"):
        ProbeSlots(0)


@pytest.mark.usefixtures("revision_chain")
async def test_the_verifier_marks_reads_of_a_changed_engine_urgent_and_periodic_ones_not(
    kmock: kmock.KubernetesEmulator,
) -> None:
    declare_resources(kmock)
    api = KubeApi(Credentials(server=str(kmock.url).rstrip("/")))
    settings = OperatorSettings(probe_timeout_seconds=2.0, reverify_seconds=0.2)
    inner = make_verify(settings)
    seen: list[bool] = []

    async def recording(url: str, requirement: Requirement, **kw: Any) -> Verdict:
        seen.append(URGENT.get())
        return await inner(url, requirement, **kw)

    rt = Runtime(api=api, settings=settings, verify=recording, clock=lambda: NOW)
    try:
        async with running(FakeEngine("decode", 131_072, 200_000)) as engine:
            pod = engine_pod(engine.port)
            kmock.objects[kmock.resource("", "v1", "pods"), NS, pod["metadata"]["name"]] = pod
            engine_pods.on_pod_event(rt, "ADDED", pod)  # first sighting
            await poll(lambda: len(seen) >= 3)  # then two periodic re-reads
            restarted = engine_pod(engine.port)
            restarted["status"]["containerStatuses"][0]["restartCount"] = 1
            count = len(seen)
            engine_pods.on_pod_event(rt, "MODIFIED", restarted)
            await poll(lambda: len(seen) > count)
            after_restart = seen[count]
    finally:
        await rt.shutdown()
        await api.close()
    assert seen[0] is True and seen[1:3] == [False, False]
    assert after_restart is True


@pytest.mark.usefixtures("revision_chain")
async def test_periodic_rereads_keep_to_the_fleet_budget_and_a_restart_never_waits_for_it(
    kmock: kmock.KubernetesEmulator,
) -> None:
    """Four engines due every 0.1 s would be re-read ~40 times a second; with a budget of 2 a second
    they are read at most that often, and a restarted engine's read comes at once although the
    budget's queue is seconds deep (at the scale target, periodic re-reads of 8,000 engines must not
    delay a restart's verdict or starve the rest of the operator)."""
    declare_resources(kmock)
    api = KubeApi(Credentials(server=str(kmock.url).rstrip("/")))
    settings = OperatorSettings(
        probe_timeout_seconds=2.0, reverify_seconds=0.1, reverify_reads_per_second=2.0
    )
    inner = make_verify(settings)
    reads: list[tuple[float, bool]] = []
    loop = asyncio.get_running_loop()

    async def recording(url: str, requirement: Requirement, **kw: Any) -> Verdict:
        reads.append((loop.time(), URGENT.get()))
        return await inner(url, requirement, **kw)

    rt = Runtime(api=api, settings=settings, verify=recording, clock=lambda: NOW)
    pods = []
    try:
        async with running(FakeEngine("decode", 131_072, 200_000)) as engine:
            for i in range(4):
                pod = engine_pod(engine.port)
                pod["metadata"]["name"] += f"-{i}"
                pod["metadata"]["uid"] = f"pod-uid-{i}"
                kmock.objects[kmock.resource("", "v1", "pods"), NS, pod["metadata"]["name"]] = pod
                pods.append(pod)
                engine_pods.on_pod_event(rt, "ADDED", pod)  # first sightings: at once
            await poll(lambda: len(reads) >= 4)
            started = loop.time()
            await asyncio.sleep(2.0)
            periodic = [t for t, urgent in reads if not urgent and t >= started]
            restarted = dict(pods[0], status={**pods[0]["status"]})
            restarted["status"]["containerStatuses"] = [
                {**pods[0]["status"]["containerStatuses"][0], "restartCount": 1}
            ]
            count, restarted_at = len(reads), loop.time()
            engine_pods.on_pod_event(rt, "MODIFIED", restarted)
            await poll(lambda: any(urgent for _, urgent in reads[count:]))
            after_restart = next(t for t, urgent in reads[count:] if urgent)
    finally:
        await rt.shutdown()
        await api.close()
    assert [urgent for _, urgent in reads[:4]] == [True] * 4
    # 2 s at 2 a second: 4 turns, plus the one the window may open on.
    assert 2 <= len(periodic) <= 5, periodic
    assert all(b - a >= 0.45 for a, b in itertools.pairwise(periodic)), periodic
    assert after_restart - restarted_at < 0.3


async def poll(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
