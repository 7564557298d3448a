"""The content check in the reconcile pass against the kmock API emulator
(kvgate.controller.content_check): a failed check refuses the revision, an inconclusive one
records nothing and backs off.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import kmock
import pytest
from factories.kmock_world import (
    NS,
    content_check_ran,
    put_md,
    requests,
    router_ready,
    verified_pods,
)
from factories.model_deployments import make_md
from kvgate.api.revision import revision_of
from kvgate.controller import content_check
from kvgate.controller.md_loops import on_md_event
from kvgate.controller.modeldeployment import Reconciler
from kvgate.controller.runtime import Runtime
from kvgate.verify.content_probe import REASON_FAILED, ContentVerdict


async def _verified_and_router_ready(kmock: kmock.KubernetesEmulator, rev: str) -> None:
    router_ready(kmock, rev)
    pods = kmock.resource("", "v1", "pods")
    for pod in verified_pods():
        kmock.objects[pods, NS, pod["metadata"]["name"]] = pod


async def _content_check_due(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> tuple[Reconciler, str]:
    """A first pass, then both engines verified and the router Ready: the next pass runs the
    target's content check (whatever ``run_content_check`` is patched to answer)."""
    put_md(kmock)
    rev = revision_of(make_md().spec)
    reconciler = Reconciler(rt, NS, "llama")
    await reconciler.reconcile()
    await _verified_and_router_ready(kmock, rev)
    return reconciler, rev


@pytest.mark.usefixtures("revision_chain")
async def test_a_failed_content_check_refuses_the_verified_revision_and_nothing_serves(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    leak = "content check of revision x failed: 131,073 tokens: HTTP 200, 8 tokens generated"

    async def content_check_fails(*_: Any) -> ContentVerdict:
        return ContentVerdict(False, REASON_FAILED, leak, ())

    monkeypatch.setattr(content_check, "run_content_check", content_check_fails)
    reconciler, rev = await _content_check_due(kmock, rt)
    await content_check_ran(reconciler, rt)
    step = await reconciler.reconcile()
    assert step is not None and step.serving_revision is None
    assert step.refusal is not None and step.refusal.reason == "ContentCheckFailed"
    assert not [r for r in requests(kmock, "POST") if r.data.get("kind") == "Service"]
    status = requests(kmock, "PATCH", "/status")[-1].data["status"]
    assert status["rollout"]["refusal"] == {"reason": "ContentCheckFailed", "message": leak}
    assert status["contentChecks"][0]["revision"] == rev
    assert status["contentChecks"][0]["passed"] is False
    events = [(r.data["type"], r.data["reason"]) for r in requests(kmock, "POST", "/events")]
    assert ("Warning", REASON_FAILED) in events and ("Warning", "RolloutRefused") in events


@pytest.mark.usefixtures("revision_chain")
async def test_an_inconclusive_content_check_records_nothing_and_nothing_serves(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_router(*_: Any) -> None:
        return None

    monkeypatch.setattr(content_check, "run_content_check", no_router)
    reconciler, _ = await _content_check_due(kmock, rt)
    await content_check_ran(reconciler, rt)
    step = await reconciler.reconcile()
    assert step is not None and step.serving_revision is None and step.refusal is None
    assert step.content_check_due
    status = requests(kmock, "PATCH", "/status")[-1].data["status"]
    assert status.get("contentChecks", []) == []


@pytest.mark.usefixtures("revision_chain")
async def test_an_inconclusive_checks_backoff_belongs_to_the_runtime_and_ends_with_its_md(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retried RETRY_SECONDS later, not at the next pass; kept by this operator's runtime (a
    new leader starts clean) and dropped when the ModelDeployment is deleted (no leak)."""
    checks: list[str] = []

    async def no_router(*args: Any) -> None:
        checks.append(args[4])  # the revision

    monkeypatch.setattr(content_check, "run_content_check", no_router)
    reconciler, rev = await _content_check_due(kmock, rt)
    await content_check_ran(reconciler, rt)
    await content_check_ran(reconciler, rt)
    assert checks == [rev]  # the second pass backed off
    state = rt.owned(content_check.ContentChecks)
    assert list(state.inconclusive) == [(NS, "llama", rev)]
    other = Runtime(api=rt.api, settings=rt.settings, verify=rt.verify)
    assert other.owned(content_check.ContentChecks).inconclusive == {}
    on_md_event(rt, "DELETED", {"metadata": {"namespace": NS, "name": "llama"}})
    assert state.inconclusive == {}


@pytest.mark.usefixtures("revision_chain")
async def test_a_check_in_flight_survives_a_pass_that_finds_an_engine_briefly_unverified(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-verification that times out for a moment (an engine busy answering the check's own
    longest prompt on a loaded machine) does not restart the target's check from its first
    probe: restarting it on every such blip never let a check finish under load, so a leaky
    revision waited for rollout.verifyTimeoutSeconds instead of being refused by its check."""
    import asyncio

    leak = "content check of revision x failed: 131,073 tokens: HTTP 200, 8 tokens generated"
    started: list[str] = []
    answer = asyncio.Event()

    async def slow_leak(*args: Any) -> ContentVerdict:
        started.append(args[4])
        await answer.wait()
        return ContentVerdict(False, REASON_FAILED, leak, ())

    monkeypatch.setattr(content_check, "run_content_check", slow_leak)
    reconciler, rev = await _content_check_due(kmock, rt)
    await reconciler.reconcile()  # starts the check
    await asyncio.sleep(0)
    assert started == [rev]
    pods = kmock.resource("", "v1", "pods")
    blip = verified_pods()[1]
    blip["status"]["conditions"][1] = {
        "type": "kvgate.io/engine-verified",
        "status": "False",
        "reason": "EngineUnreachable",
    }
    kmock.objects[pods, NS, blip["metadata"]["name"]] = blip
    step = await reconciler.reconcile()
    assert step is not None and not step.content_check_due
    await _verified_and_router_ready(kmock, rev)
    await reconciler.reconcile()
    answer.set()
    await content_check.idle(rt)
    step = await reconciler.reconcile()
    assert started == [rev]  # one check, never restarted
    assert step is not None and step.refusal is not None
    assert step.refusal.reason == "ContentCheckFailed"


@pytest.mark.usefixtures("revision_chain")
async def test_a_check_of_a_revision_that_is_no_longer_the_target_stops(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    async def never(*_: Any) -> ContentVerdict:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    monkeypatch.setattr(content_check, "run_content_check", never)
    reconciler, rev = await _content_check_due(kmock, rt)
    await reconciler.reconcile()
    state = rt.owned(content_check.ContentChecks)
    task = state.tasks[(NS, "llama", rev)]
    # the spec changed: another revision is the target, and its engines are not verified yet
    step = SimpleNamespace(target_revision="other", content_check_due=False, progress={})
    content_check.keep_due(rt, make_md(), step)  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert task.cancelled() and not state.tasks
