"""ModelDeployment passes share the pass slots fairly across namespaces, and a pass a user asked
for (a rollback, a scale request, an edited spec) takes the next free slot.

Before: two FIFO queues, every pass of a ModelDeployment that was not Ready ahead of every pass
of a settled one. A tenant with 200 ModelDeployments that never turn Ready and keep changing
(their pods restart, say) kept the first queue full: another namespace's rollback of a settled
ModelDeployment never ran, and its edited spec waited behind all 200.

These tests run the real loop (``modeldeployment._reconcile_until_stopped``) with the debounce
set to 0, so every loop asks for its next pass at once and the slots are always contended: what
they count is the order the slots grant, not timing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from kvgate.api import labels
from kvgate.controller import deployments, md_loops, modeldeployment
from kvgate.controller.pass_slots import PassSlots
from kvgate.controller.runtime import Runtime
from kvgate.kube import k8s
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.settings import OperatorSettings
from kvgate.rollout.pass_priority import (
    PassClass,
    WaitingPass,
    may_take_slot,
    next_pass,
    pass_class,
    reserved_slots,
    scale_requested,
)
from kvgate.rollout.rollback import ROLLBACK_ANNOTATION

SLOTS = 2
NEVER_READY = 200
# Generous for the two loaded cores this suite shares: a fair run needs well under a second.
DEADLINE_SECONDS = 30.0


def md_body(namespace: str, name: str, *, settled: bool, generation: int = 1) -> dict[str, Any]:
    """A ModelDeployment as kvgate's status left it: settled (serving its target, Ready) or
    never Ready (observed, its rollout waiting on engines that never verify)."""
    ready = "True" if settled else "False"
    return {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "generation": generation,
        },
        "spec": {},
        "status": {
            "observedGeneration": 1,
            "targetRevision": "new",
            "servingRevision": "new" if settled else None,
            "conditions": [{"type": "Ready", "status": ready}],
        },
    }


class Fleet:
    """Loops of fake reconcilers; every pass start is recorded in order."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.starts: list[tuple[str, str]] = []
        self.stopped = False
        self.loops: list[asyncio.Task[None]] = []

    def run(self, namespace: str, name: str, *, busy: bool, passes: int | None = None) -> None:
        """Start the loop of ``namespace/name``: a ``busy`` one asks for another pass as soon
        as one ends (its pods keep changing); it stops after ``passes`` passes if given."""
        fleet, key = self, (namespace, name)

        class Reconciler:
            def __init__(self) -> None:
                self.namespace, self.name = key
                self.conflicted = self.draining = False
                self.verify_timeout_seconds = None

            async def reconcile(self) -> None:
                fleet.starts.append(key)
                await asyncio.sleep(0.001)
                if busy:
                    fleet.rt.wake_md(*key)

        def stop() -> bool:
            done = passes is not None and self.starts.count(key) >= passes
            return self.stopped or done

        self.loops.append(
            asyncio.ensure_future(
                modeldeployment._reconcile_until_stopped(
                    self.rt,
                    Reconciler(),  # type: ignore[arg-type]
                    self.rt.md_wake(key),
                    stop,
                )
            )
        )

    def never_ready(self, namespaces: list[str]) -> None:
        """NEVER_READY busy loops of never-Ready ModelDeployments over ``namespaces``."""
        for i in range(NEVER_READY):
            namespace = namespaces[i % len(namespaces)]
            name = f"never-ready-{i:03d}"
            self.rt.mds[(namespace, name)] = md_body(namespace, name, settled=False)
            self.run(namespace, name, busy=True)

    async def until(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while not predicate():
            assert time.monotonic() < deadline, f"{what}: not within {DEADLINE_SECONDS} s"
            await asyncio.sleep(0.001)

    async def saturated(self) -> None:
        """Every never-Ready loop has had a pass, so the queue holds (almost) all of them."""
        await self.until(lambda: len(self.starts) >= 2 * NEVER_READY, "the load's passes")

    async def close(self) -> None:
        self.stopped = True
        for loop in self.loops:
            loop.cancel()
        await asyncio.gather(*self.loops, return_exceptions=True)
        await self.rt.api.close()


@pytest.fixture
async def fleet(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(modeldeployment, "MIN_PASS_SECONDS", 0.0)
    rt = Runtime(
        api=KubeApi(Credentials(server="http://127.0.0.1:9")),  # nothing answers there
        # No timer pass in these tests: every pass is woken or asked for.
        settings=OperatorSettings(max_concurrent_reconciles=SLOTS, reconcile_seconds=3600),
        verify=None,  # type: ignore[arg-type]
    )
    fleet = Fleet(rt)
    yield fleet
    await fleet.close()


def a_passes_ahead(fleet: Fleet, since: int, key: tuple[str, str]) -> int:
    """Passes of other ModelDeployments that started after index ``since`` and before
    ``key``'s first pass from there."""
    later = fleet.starts[since:]
    return later.index(key)


# The load in one namespace, over twenty, and in the asking ModelDeployment's own namespace.
TWENTY = [f"tenant-a{i:02d}" for i in range(20)]
LOAD_SPREADS = [["tenant-a"], TWENTY, ["tenant-b"]]
LOAD_IDS = ["one-namespace", "twenty-namespaces", "its-own-namespace"]


@pytest.mark.parametrize("load", LOAD_SPREADS, ids=LOAD_IDS)
async def test_a_rollback_asked_of_a_settled_modeldeployment_takes_the_next_free_slot(
    fleet: Fleet, load: list[str]
) -> None:
    fleet.never_ready(load)
    await fleet.saturated()
    body = md_body("tenant-b", "llama", settled=True)
    body["metadata"]["annotations"] = {ROLLBACK_ANNOTATION: "old"}
    fleet.rt.mds[("tenant-b", "llama")] = body
    asked = len(fleet.starts)
    fleet.run("tenant-b", "llama", busy=False, passes=1)
    await fleet.until(lambda: ("tenant-b", "llama") in fleet.starts, "the rollback's pass")
    # At most the passes already handed a slot as the rollback arrived start before it.
    assert a_passes_ahead(fleet, asked, ("tenant-b", "llama")) <= SLOTS


@pytest.mark.parametrize("load", LOAD_SPREADS, ids=LOAD_IDS)
async def test_an_edited_spec_of_a_settled_modeldeployment_takes_the_next_free_slot(
    fleet: Fleet, load: list[str]
) -> None:
    """``kubectl scale``-free scaling: ``spec.decode.replicas`` edited (a new generation)."""
    fleet.never_ready(load)
    await fleet.saturated()
    fleet.rt.mds[("tenant-b", "llama")] = md_body("tenant-b", "llama", settled=True, generation=2)
    asked = len(fleet.starts)
    fleet.run("tenant-b", "llama", busy=False, passes=1)
    await fleet.until(lambda: ("tenant-b", "llama") in fleet.starts, "the edited spec's pass")
    assert a_passes_ahead(fleet, asked, ("tenant-b", "llama")) <= SLOTS


async def test_a_rolescale_count_changed_by_an_autoscaler_takes_the_next_free_slot(
    fleet: Fleet,
) -> None:
    """The ModelDeployment itself does not change (its RoleScale does): the RoleScale's watch
    event marks the pass as asked for. A pass not asked for would wait for each of the 20
    namespaces to have a turn, and behind its own namespace's never-Ready passes."""
    key = ("tenant-b", "llama")
    fleet.rt.mds[key] = md_body(*key, settled=True)
    fleet.run(*key, busy=False, passes=2)  # its first pass, then it sleeps (settled)
    await fleet.until(lambda: key in fleet.starts, "the settled ModelDeployment's first pass")
    fleet.never_ready(["tenant-b", *TWENTY[1:]])
    await fleet.saturated()
    role_scale = {
        "metadata": {
            "name": "llama-decode",
            "namespace": "tenant-b",
            "generation": 3,  # kubectl scale (or an HPA) wrote spec.replicas
            "labels": {labels.DEPLOYMENT: "llama"},
        },
        "spec": {"replicas": 4},
        "status": {"observedGeneration": 2},
    }
    asked = len(fleet.starts)
    deployments.on_role_scale_event(fleet.rt, role_scale)
    await fleet.until(lambda: fleet.starts.count(key) == 2, "the scale request's pass")
    assert a_passes_ahead(fleet, asked, key) <= SLOTS


async def test_two_namespaces_with_passes_waiting_share_the_slots_evenly(fleet: Fleet) -> None:
    """200 busy never-Ready ModelDeployments in one namespace, 20 in another: while both have
    passes waiting, each namespace gets every other slot (FIFO gave the second 20 in 220)."""
    fleet.never_ready(["tenant-a"])
    for i in range(20):
        name = f"busy-{i:02d}"
        fleet.rt.mds[("tenant-b", name)] = md_body("tenant-b", name, settled=False)
        fleet.run("tenant-b", name, busy=True)
    await fleet.until(lambda: len(fleet.starts) >= 1_400, "1,400 passes")
    window = fleet.starts[400:1_400]  # every loop has queued by then
    share = sum(1 for namespace, _ in window if namespace == "tenant-b") / len(window)
    assert 0.45 <= share <= 0.55, f"tenant-b got {share:.0%} of the slots"


# The order itself (kvgate.rollout.pass_priority, pure) and the slots that apply it.

R, F, S = PassClass.REQUESTED, PassClass.IN_FLIGHT, PassClass.SETTLED


def waiting(*passes: tuple[str, PassClass]) -> list[WaitingPass]:
    return [WaitingPass(namespace, c, i) for i, (namespace, c) in enumerate(passes)]


@pytest.mark.parametrize(
    ("passes", "last_served", "first"),
    [
        ([], {}, None),
        # asked for beats everything, whatever the namespace's turn
        ([("a", F), ("a", S), ("b", R)], {"a": 1, "b": 9}, 2),
        # namespaces in turn: the least recently served goes next
        ([("a", F), ("a", F), ("b", F)], {"a": 5, "b": 3}, 2),
        ([("a", F), ("b", F)], {"a": 3, "b": 5}, 0),
        # a namespace with nothing waiting or running before goes ahead of one served
        ([("a", F), ("b", S)], {"a": 0}, 1),
        # within a namespace: in flight before settled, then first come
        ([("a", S), ("a", F), ("a", F)], {"a": 0}, 1),
        # requested passes of two namespaces take turns too
        ([("a", R), ("a", R), ("b", R)], {"a": 7, "b": 4}, 2),
        ([("a", S), ("b", S)], {}, 0),  # a tie: first come
    ],
)
def test_the_next_free_slot_goes_to(
    passes: list[tuple[str, PassClass]], last_served: dict[str, int], first: int | None
) -> None:
    chosen = next_pass(waiting(*passes), last_served)
    assert (chosen.enqueued if chosen else None) == first


def test_a_rollback_annotation_or_an_unobserved_spec_asks_for_a_pass() -> None:
    settled = md_body("ns", "m", settled=True)
    assert pass_class(settled) is S
    assert pass_class(md_body("ns", "m", settled=False)) is F
    assert pass_class(settled, requested=True) is R
    assert pass_class(md_body("ns", "m", settled=True, generation=2)) is R
    assert pass_class({"metadata": {"name": "new", "generation": 1}}) is R  # no status yet
    annotated = md_body("ns", "m", settled=True)
    annotated["metadata"]["annotations"] = {ROLLBACK_ANNOTATION: "abc"}
    assert pass_class(annotated) is R


@pytest.mark.parametrize(
    ("generation", "observed", "asked"),
    [(3, 2, True), (3, None, True), (3, 3, False), (None, None, False)],
)
def test_a_rolescale_asks_for_a_pass_while_its_count_is_not_observed(
    generation: int | None, observed: int | None, asked: bool
) -> None:
    body = {"metadata": {"generation": generation}, "status": {"observedGeneration": observed}}
    assert scale_requested(body) is asked


async def test_200_waiting_never_ready_passes_let_another_namespaces_asked_pass_in_next() -> None:
    slots = PassSlots(2)
    granted: list[str] = []
    holders = [asyncio.ensure_future(slots.acquire(("a", f"run-{i}"), F)) for i in range(2)]
    await asyncio.gather(*holders)
    load = [
        asyncio.ensure_future(_take(slots, ("a", f"md-{i:03d}"), F, granted)) for i in range(200)
    ]
    await asyncio.sleep(0)
    asked = asyncio.ensure_future(_take(slots, ("b", "llama"), R, granted))
    await asyncio.sleep(0)
    assert slots.waiting == {R: 1, F: 200, S: 0}
    slots.release(("a", "run-0"))  # one slot turns over
    await asyncio.sleep(0)
    assert granted == ["b/llama"]
    slots.release(("a", "run-1"))
    await asyncio.gather(asked, *load)
    assert len(granted) == 201


async def test_a_pass_that_waited_moves_up_when_asked_for_and_a_cancelled_one_is_skipped() -> None:
    slots = PassSlots(1)
    granted: list[str] = []
    await slots.acquire(("a", "running"), F)
    first = asyncio.ensure_future(_take(slots, ("a", "first"), F, granted))
    gone = asyncio.ensure_future(_take(slots, ("a", "gone"), F, granted))
    later = asyncio.ensure_future(_take(slots, ("a", "later"), S, granted))
    await asyncio.sleep(0)
    slots.reclassify(("a", "later"), R)  # a rollback annotation arrived while it waited
    gone.cancel()
    slots.release(("a", "running"))
    await asyncio.gather(first, later)
    assert granted == ["a/later", "a/first"]
    assert gone.cancelled() and slots.waiting == {R: 0, F: 0, S: 0}
    assert slots._active == {} and slots._last_served == {}  # nothing kept for idle namespaces


async def test_a_slot_handed_to_a_pass_cancelled_at_that_moment_goes_to_the_next() -> None:
    slots = PassSlots(1)
    granted: list[str] = []
    await slots.acquire(("a", "running"), F)
    doomed = asyncio.ensure_future(_take(slots, ("a", "doomed"), F, granted))
    other = asyncio.ensure_future(_take(slots, ("a", "other"), F, granted))
    await asyncio.sleep(0)
    slots.release(("a", "running"))  # the slot goes to "doomed" (first come)...
    assert slots.waiting[F] == 1
    doomed.cancel()  # ...which is cancelled before it runs: it passes the slot on
    await asyncio.gather(other)
    assert doomed.cancelled() and granted == ["a/other"]
    assert slots._active == {} and slots._free == 1


async def _take(slots: PassSlots, key: tuple[str, str], c: PassClass, granted: list[str]) -> None:
    async with slots.slot(key, c):
        granted.append("/".join(key))
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("c", "free", "reserved", "may"),
    [
        (R, 1, 1, True),  # a pass asked for takes a reserved slot
        (F, 1, 1, False),  # no other pass does
        (S, 1, 1, False),
        (F, 2, 1, True),  # one more than the reserved: free for anyone
        (R, 0, 0, False),
        (F, 3, 0, True),
    ],
)
def test_a_pass_may_take_a_free_slot_if(c: PassClass, free: int, reserved: int, may: bool) -> None:
    assert may_take_slot(c, free, reserved) is may


@pytest.mark.parametrize(("size", "reserved"), [(1, 0), (2, 0), (15, 0), (16, 1), (32, 2)])
def test_one_pass_slot_in_sixteen_is_kept_for_passes_asked_for(size: int, reserved: int) -> None:
    assert reserved_slots(size) == reserved
    assert PassSlots(size).reserved == reserved


async def test_a_rollback_takes_a_kept_slot_at_once_while_a_tenants_passes_hold_the_rest() -> None:
    """The default 32 slots: a tenant's never-Ready passes hold 30 and queue the rest; another
    namespace's rollback starts without waiting for any of them to end, and so does a waiting
    pass of the tenant that is asked for meanwhile (an edited spec)."""
    slots = PassSlots(32)
    granted: list[str] = []
    for i in range(30):
        assert await slots.acquire(("tenant", f"held-{i}"), F) is F
    load = [
        asyncio.ensure_future(_take(slots, ("tenant", f"md-{i:03d}"), F, granted))
        for i in range(170)
    ]
    await asyncio.sleep(0)
    assert slots.busy == 30 and slots.waiting[F] == 170  # two slots stay free
    assert await asyncio.wait_for(slots.acquire(("victim", "llama"), R), 1) is R
    assert slots.busy == 31
    slots.reclassify(("tenant", "md-007"), R)
    await asyncio.sleep(0)
    assert granted == ["tenant/md-007"] and slots.waiting[F] == 169
    slots.release(("victim", "llama"))
    for i in range(30):
        slots.release(("tenant", f"held-{i}"))
    await asyncio.wait_for(asyncio.gather(*load), DEADLINE_SECONDS)
    assert len(granted) == 170 and slots.busy == 0


async def test_a_rollback_asked_while_its_pass_runs_raises_that_pass_and_skips_the_debounce(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A settled ModelDeployment's pass is running (slow: its reads queue behind a tenant's)
    when the rollback annotation arrives: the rest of that pass's API requests go first, and
    the pass that acts on the annotation starts when it ends, not a debounce later."""
    debounce = 5.0  # far longer than the test waits
    monkeypatch.setattr(modeldeployment, "MIN_PASS_SECONDS", debounce)
    rt = Runtime(
        api=KubeApi(Credentials(server="http://127.0.0.1:9")),  # nothing answers there
        settings=OperatorSettings(reconcile_seconds=3600, steady_reconcile_seconds=3600),
        verify=None,  # type: ignore[arg-type]
    )
    key = ("victim", "llama")
    body = md_body(*key, settled=True)
    rt.mds[key] = body
    event = asyncio.Event()
    seen: list[tuple[str, bool]] = []  # (pass, its requests urgent?) in order
    ended: list[float] = []

    class Reconciler:
        namespace, name = key
        conflicted = draining = False
        verify_timeout_seconds = None

        async def reconcile(self) -> None:
            seen.append(("start", k8s.urgent_now()))
            if len(seen) == 1:
                await event.wait()  # the annotation arrives while this pass runs
                seen.append(("after the annotation", k8s.urgent_now()))
            ended.append(time.monotonic())

    loop = asyncio.ensure_future(
        modeldeployment._reconcile_until_stopped(
            rt,
            Reconciler(),  # type: ignore[arg-type]
            rt.md_wake(key),
            lambda: len(ended) >= 2,
        )
    )
    rt.md_loops[key] = (body["metadata"]["uid"], loop)  # the loop md_loops would have started
    try:
        await asyncio.sleep(0.01)
        assert seen == [("start", False)]  # a settled ModelDeployment's timer pass
        annotated = md_body(*key, settled=True)
        annotated["metadata"]["annotations"] = {ROLLBACK_ANNOTATION: "old"}
        md_loops.on_md_event(rt, "MODIFIED", annotated)
        event.set()
        deadline = time.monotonic() + debounce / 2
        while len(ended) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await rt.api.close()
    assert seen == [("start", False), ("after the annotation", True), ("start", True)]
    assert ended[1] - ended[0] < debounce / 2  # not a debounce later
