"""A warm standby (kvgate.controller.standby): a replica that does not lead keeps the stores of
ModelDeployments, engine pods and kvgate's Deployments current and does nothing else; when it
takes the Lease it leads from them. The scale benchmark's leader kill at 1,000
ModelDeployments: a cold standby listed 9,000 pods from nothing and re-read every engine, and a
shrunk engine's gate went False only 40.2 s after the kill."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from kvgate.api import labels
from kvgate.controller import deployments, engine_pods, md_loops, modeldeployment, standby
from kvgate.controller.runtime import Runtime
from kvgate.kube import probe_slots
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.settings import OperatorSettings
from kvgate.rollout import pass_priority
from kvgate.verify import gate
from kvgate_engine.report import EngineReport
from kvgate_engine.verdict import Requirement, judge

VERIFIED_AT = "2026-12-02T10:00:05Z"
BEFORE = "2026-12-02T10:00:00Z"  # the engine started, then was verified
AFTER = "2026-12-02T10:00:09Z"  # the engine restarted after its verification
POOL = 262_144
REQ = Requirement(context_length=131_072, headroom=1.0, role="decode")


def proven_message(name: str, pool: int = POOL) -> str:
    """The gate's message for a safe engine, as kvgate writes it (gate.verdict_message)."""
    report = EngineReport(
        version="0.5.23",
        role="decode",
        kv_pool_tokens=pool,
        kv_pool_tokens_per_rank=(pool,),
        max_req_input_len=131_066,
        effective_context_length=131_072,
        served_model_name="llama",
    )
    body = {"metadata": {"name": name, "labels": {labels.ROLE: "decode"}}}
    return gate.verdict_message(body, judge(report, REQ), REQ)


def engine_pod(uid: str, *, started: str, gate_status: str = "True") -> dict[str, Any]:
    name = f"llama-abc-decode-{uid}"
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "labels": {
                labels.COMPONENT: labels.COMPONENT_ENGINE,
                labels.DEPLOYMENT: "llama",
                labels.ROLE: "decode",
                labels.REVISION: "abc",
            },
        },
        "status": {
            "podIP": "10.0.0.1",
            "conditions": [
                {"type": "Ready", "status": gate_status},
                {
                    "type": labels.ENGINE_VERIFIED,
                    "status": gate_status,
                    "reason": "EngineVerified" if gate_status == "True" else "KVPoolTooSmall",
                    "message": proven_message(name),
                    "lastTransitionTime": VERIFIED_AT,
                },
            ],
            "containerStatuses": [
                {
                    "name": "engine",
                    "ready": True,
                    "restartCount": 1,
                    "state": {"running": {"startedAt": started}},
                }
            ],
        },
    }


def md_body(name: str, *, settled: bool) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if settled:
        status = {
            "observedGeneration": 1,
            "servingRevision": "abc",
            "targetRevision": "abc",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    return {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1},
        "spec": {},
        "status": status,
    }


def runtime(*, leading: bool, **settings: Any) -> Runtime:
    return Runtime(
        api=KubeApi(Credentials(server="http://127.0.0.1:9")),  # nothing answers there
        settings=OperatorSettings(**settings),
        verify=None,  # type: ignore[arg-type]
        leading=leading,
    )


async def until(predicate: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Every engine read a verifier makes: (pod uid, urgent)."""
    seen: list[tuple[str, bool]] = []

    async def record(rt: Runtime, pod: dict[str, Any]) -> None:
        seen.append((pod["metadata"]["uid"], probe_slots.URGENT.get()))

    monkeypatch.setattr(engine_pods, "check_pod", record)
    return seen


async def test_a_standby_keeps_every_store_current_and_starts_nothing(
    reads: list[tuple[str, bool]],
) -> None:
    rt = runtime(leading=False)
    deployment = {
        "metadata": {
            "name": "llama-abc-decode",
            "namespace": "ns",
            "uid": "d1",
            "labels": {labels.DEPLOYMENT: "llama"},
        }
    }
    try:
        md_loops.on_reflected(rt, None, md_body("llama", settled=False))
        engine_pods.on_pod_event(rt, None, engine_pod("p1", started=BEFORE))
        engine_pods.on_pod_event(rt, "ADDED", engine_pod("p2", started=AFTER))
        deployments.on_deployment_event(rt, None, deployment)
        await asyncio.sleep(0)  # anything started would have its first turn now
        assert set(rt.pods) == {"p1", "p2"}
        assert set(rt.mds) == {("ns", "llama")}
        assert set(rt.deployments) == {"d1"}
        assert not rt.verifiers and not rt.md_loops and not rt.engines
        assert not rt._pod_wakes and not rt._md_wakes
        assert reads == []
        engine_pods.on_pod_event(rt, "DELETED", engine_pod("p2", started=AFTER))
        md_loops.on_reflected(rt, "DELETED", md_body("llama", settled=False))
        assert set(rt.pods) == {"p1"} and not rt.mds
    finally:
        await rt.shutdown()
        await rt.api.close()


async def test_a_new_leader_reads_changed_engines_at_once_and_not_those_that_proved_themselves(
    reads: list[tuple[str, bool]],
) -> None:
    # Re-verify once an hour: within this test only a change may cause a read.
    rt = runtime(leading=False, reverify_seconds=3600.0)
    stop = asyncio.Event()
    try:
        engine_pods.on_pod_event(rt, None, engine_pod("proven", started=BEFORE))
        engine_pods.on_pod_event(rt, None, engine_pod("restarted", started=AFTER))
        engine_pods.on_pod_event(
            rt, None, engine_pod("refused", started=BEFORE, gate_status="False")
        )
        assert await standby.take_over(rt, stop)  # no reflector here: nothing to re-open
        assert rt.leading
        await until(lambda: all(rt.pod_wake(uid)._waiters for uid in rt.verifiers))
        # Read at once, with the urgent probe slots: the restarted and the refused engines.
        assert sorted(reads) == [("refused", True), ("restarted", True)]
        # What the proven engine proved is known without reading it (a pass reports its pool).
        proven = rt.engines["proven"]
        assert (proven.outcome, proven.kv_pool_tokens) == ("Safe", POOL)
        assert "restarted" not in rt.engines
        pod_state = modeldeployment.pod_state(rt, rt.pods["proven"])
        assert pod_state is not None and pod_state.kv_pool_tokens == POOL
        # Once it changes, it is read at once like any other.
        changed = engine_pod("proven", started=BEFORE)
        changed["status"]["containerStatuses"][0]["restartCount"] = 2
        engine_pods.on_pod_event(rt, "MODIFIED", changed)
        await until(lambda: ("proven", True) in reads)
    finally:
        await rt.shutdown()
        await rt.api.close()


async def test_a_proven_engines_first_periodic_read_comes_within_one_interval(
    reads: list[tuple[str, bool]],
) -> None:
    rt = runtime(leading=False, reverify_seconds=0.5)
    try:
        engine_pods.on_pod_event(rt, None, engine_pod("proven", started=BEFORE))
        assert await standby.take_over(rt, asyncio.Event())
        await until(lambda: bool(reads), seconds=5.0)
        assert reads == [("proven", False)]  # a periodic read: behind any changed engine's
    finally:
        await rt.shutdown()
        await rt.api.close()


async def test_a_new_leader_starts_every_modeldeployments_loop_from_its_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[tuple[str, str]] = []

    async def loop(rt: Runtime, key: tuple[str, str], stopped: Any) -> None:
        started.append(key)

    monkeypatch.setattr(modeldeployment, "run_reconciler", loop)
    rt = runtime(leading=False)
    try:
        for name in ("a", "b"):
            md_loops.on_reflected(rt, None, md_body(name, settled=True))
        assert not rt.md_loops
        assert await standby.take_over(rt, asyncio.Event())
        await until(lambda: len(started) == 2)
        assert sorted(started) == [("ns", "a"), ("ns", "b")]
    finally:
        await rt.shutdown()
        await rt.api.close()


def test_the_pool_an_engine_proved_is_read_back_from_its_gate() -> None:
    assert gate.proven_pool_tokens(engine_pod("p", started=BEFORE)) == POOL
    refused = engine_pod("p", started=BEFORE, gate_status="False")
    assert gate.proven_pool_tokens(refused) is None
    other = engine_pod("p", started=BEFORE)
    other["status"]["conditions"][1]["message"] = "verified by someone else"
    assert gate.proven_pool_tokens(other) is None


@pytest.mark.parametrize(
    ("change", "settled"),
    [
        ({}, True),
        ({"observedGeneration": 0}, False),  # the spec was edited since the last pass
        ({"servingRevision": "old"}, False),  # a rollout in flight
        ({"conditions": [{"type": "Ready", "status": "False"}]}, False),
        ({"targetRevision": None, "servingRevision": None}, False),
    ],
)
def test_a_modeldeployment_is_settled_only_as_its_status_says(
    change: dict[str, Any], settled: bool
) -> None:
    body = md_body("a", settled=True)
    body["status"].update(change)
    assert pass_priority.settled_by_status(body) is settled
    assert not pass_priority.settled_by_status(md_body("new", settled=False))


class OrderedReconciler:
    def __init__(self, name: str, order: list[str]) -> None:
        self.namespace, self.name, self.order = "ns", name, order
        self.conflicted = False
        self.draining = False
        self.verify_timeout_seconds = None

    async def reconcile(self) -> None:
        self.order.append(self.name)
        await asyncio.sleep(0.01)


async def test_a_new_modeldeployments_pass_goes_before_the_settled_ones_catching_up() -> None:
    """A leader's first passes: 30 settled ModelDeployments, then one applied at the
    failover, with one pass at a time. (FIFO, it waited behind all 30.)"""
    rt = runtime(leading=True, max_concurrent_reconciles=1, reconcile_seconds=0.1)
    order: list[str] = []
    names = [f"settled-{i:02d}" for i in range(30)]
    for name in names:
        rt.mds[("ns", name)] = md_body(name, settled=True)
    rt.mds[("ns", "new")] = md_body("new", settled=False)

    async def one(name: str) -> None:
        await modeldeployment._reconcile_until_stopped(
            rt,
            OrderedReconciler(name, order),  # type: ignore[arg-type]
            rt.md_wake(("ns", name)),
            lambda: name in order,
        )

    loops = [asyncio.ensure_future(one(name)) for name in [*names, "new"]]
    try:
        await asyncio.wait_for(asyncio.gather(*loops), timeout=20)
    finally:
        await rt.api.close()
    assert sorted(order) == sorted([*names, "new"])
    assert order.index("new") <= 1  # behind at most the pass already running


async def test_a_standby_told_to_stop_before_its_watches_reopen_starts_nothing() -> None:
    rt = runtime(leading=False)
    stop = asyncio.Event()

    async def never(**_: Any) -> None:
        await asyncio.Event().wait()

    rt.resume_reflectors = never  # type: ignore[method-assign]
    engine_pods.on_pod_event(rt, None, engine_pod("p", started=AFTER))
    try:
        taking = asyncio.ensure_future(standby.take_over(rt, stop))
        await asyncio.sleep(0)
        stop.set()
        assert await asyncio.wait_for(taking, timeout=5) is False
        assert not rt.leading and not rt.verifiers
    finally:
        await rt.shutdown()
        await rt.api.close()


class Listing:
    """A reflector as warm_up sees it."""

    def __init__(self) -> None:
        self.synced = False
        self.path = "/api/v1/pods"


async def test_a_replica_stands_for_the_lease_only_once_its_stores_are_listed() -> None:
    """A leader's replacement starts at once and would race the warm standby for the expired
    Lease with empty stores."""
    rt = runtime(leading=False)
    listing = Listing()
    rt.pod_reflectors.append(listing)  # type: ignore[arg-type]
    try:
        warming = asyncio.ensure_future(standby.warm_up(rt, asyncio.Event()))
        await asyncio.sleep(0.2)
        assert not warming.done()
        listing.synced = True
        await asyncio.wait_for(warming, timeout=5)
        # A store that cannot be listed does not keep the replica from ever leading.
        listing.synced = False
        await asyncio.wait_for(standby.warm_up(rt, asyncio.Event(), limit=0.1), timeout=5)
    finally:
        await rt.api.close()


async def test_a_leader_that_loses_its_lease_while_its_watches_reopen_starts_nothing() -> None:
    rt = runtime(leading=False)

    async def never(**_: Any) -> None:
        await asyncio.Event().wait()

    rt.resume_reflectors = never  # type: ignore[method-assign]
    engine_pods.on_pod_event(rt, None, engine_pod("p", started=AFTER))
    holding: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    try:
        taking = asyncio.ensure_future(standby.take_over(rt, asyncio.Event(), holding))
        await asyncio.sleep(0)
        holding.set_result(None)  # the renewals stopped: the Lease is lost
        assert await asyncio.wait_for(taking, timeout=5) is False
        assert not rt.leading and not rt.verifiers
    finally:
        await rt.shutdown()
        await rt.api.close()


async def test_a_modeldeployment_deleted_while_the_watch_was_down_is_forgotten() -> None:
    """After a complete re-list, a stored ModelDeployment the list no longer holds is delivered
    as deleted (kvgate.kube.informer): the store is keyed by name, the reflector asks by uid."""
    rt = runtime(leading=False, namespaces=("ns",))
    try:
        md_loops.start_reflectors(rt)
        (reflector,) = rt.md_reflectors
        for name in ("a", "b"):
            md_loops.on_reflected(rt, None, md_body(name, settled=True))
        assert sorted(reflector.stored()) == ["uid-a", "uid-b"]
        reflector.on_vanished("uid-b")
        assert set(rt.mds) == {("ns", "a")}
        assert reflector.path == "/apis/kvgate.io/v1alpha1/namespaces/ns/modeldeployments"
    finally:
        await rt.shutdown()
        await rt.api.close()
