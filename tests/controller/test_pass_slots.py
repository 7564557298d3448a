"""At most KVGATE_MAX_CONCURRENT_RECONCILES ModelDeployment passes run at once (the scale target's
1,000 ModelDeployments applied together each held their listed Deployments and pods at the same
instant, and the operator kept that peak: 353 MiB at 300 of them)."""

from __future__ import annotations

import asyncio
import itertools
import tracemalloc
from typing import Any

import pytest
from kvgate.controller import modeldeployment
from kvgate.controller.runtime import Runtime
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.settings import OperatorSettings


class CountingReconciler:
    def __init__(self, name: str, tally: dict[str, Any]) -> None:
        self.namespace, self.name, self.tally = "ns", name, tally
        self.conflicted = False
        self.draining = False
        self.verify_timeout_seconds = None

    async def reconcile(self) -> None:
        self.tally["running"] += 1
        self.tally["peak"] = max(self.tally["peak"], self.tally["running"])
        await asyncio.sleep(0.01)
        self.tally["running"] -= 1
        self.tally["done"].add(self.name)


async def test_passes_beyond_the_bound_wait_their_turn_and_all_run() -> None:
    settings = OperatorSettings(max_concurrent_reconciles=3, reconcile_seconds=0.1)
    rt = Runtime(
        api=KubeApi(Credentials(server="http://127.0.0.1:9")),
        settings=settings,
        verify=None,  # type: ignore[arg-type]
    )
    tally: dict[str, Any] = {"running": 0, "peak": 0, "done": set()}
    names = [f"md-{i}" for i in range(20)]

    async def one(name: str) -> None:
        reconciler = CountingReconciler(name, tally)
        await modeldeployment._reconcile_until_stopped(
            rt,
            reconciler,  # type: ignore[arg-type]
            rt.md_wake(("ns", name)),
            lambda: name in tally["done"],
        )

    try:
        await asyncio.wait_for(asyncio.gather(*(one(n) for n in names)), timeout=20)
    finally:
        await rt.api.close()
    assert tally["done"] == set(names)
    assert tally["peak"] == 3


async def test_the_debug_memory_report_names_the_largest_allocation_sites() -> None:
    from aiohttp.test_utils import make_mocked_request
    from kvgate.controller import main

    tracemalloc.start(1)
    try:
        hoard = [bytearray(1 << 20) for _ in range(8)]  # 8 MiB from one line
        answer = await main._memory_report(make_mocked_request("GET", "/debug/memory?top=5"))
    finally:
        tracemalloc.stop()
    text = answer.text or ""
    first, *sites = text.splitlines()
    assert first.startswith("traced ")
    assert len(sites) == 5
    assert "test_pass_slots.py" in sites[0] and float(sites[0].split()[0]) >= 8.0
    assert len(hoard) == 8


def test_the_audit_pacer_spaces_reads_across_the_fleet_in_request_order() -> None:
    from kvgate.controller.runtime import Pacer

    now = [100.0]
    pacer = Pacer(50.0, clock=lambda: now[0])
    waits = [pacer.reserve() for _ in range(100)]  # 100 routers asking at the same instant
    assert waits[0] == 0.0
    assert waits[-1] == pytest.approx(99 / 50)  # the 100th read 1.98 s later: 50 a second
    assert all(b > a for a, b in itertools.pairwise(waits))
    now[0] += 10.0  # idle for long: no burst is saved up beyond the next instant
    assert pacer.reserve() == 0.0 and pacer.reserve() == pytest.approx(0.02)


async def test_a_pass_whose_inner_read_raises_a_stray_cancellation_does_not_end_the_loop() -> None:
    """A CancelledError nobody aimed at the loop (a library's timer that cancelled the task
    and lost the race to turn it into a timeout) is a failed pass, retried like any other; before,
    it ended the ModelDeployment's loop, silently: nothing reconciled it again until it changed.
    Cancelling the loop itself still ends it."""
    settings = OperatorSettings(reconcile_seconds=0.05)
    rt = Runtime(
        api=KubeApi(Credentials(server="http://127.0.0.1:9")),
        settings=settings,
        verify=None,  # type: ignore[arg-type]
    )
    passes: list[str] = []
    second = asyncio.Event()

    class StrayCancel(CountingReconciler):
        async def reconcile(self) -> None:
            passes.append("pass")
            if len(passes) == 1:
                raise asyncio.CancelledError  # not a cancel() of this task
            second.set()

    reconciler = StrayCancel("md", {})
    loop = asyncio.create_task(
        modeldeployment._reconcile_until_stopped(
            rt,
            reconciler,  # type: ignore[arg-type]
            rt.md_wake(("ns", "md")),
            lambda: False,
        )
    )
    try:
        await asyncio.wait_for(second.wait(), timeout=10)
        assert len(passes) >= 2 and not loop.done()
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
    finally:
        loop.cancel()
        await rt.api.close()
