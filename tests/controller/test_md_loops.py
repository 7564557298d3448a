"""ModelDeployments carry no finalizer: their reconcile loops are tasks started and stopped by
watch events (kvgate.controller.md_loops), and a finalizer left by an earlier kvgate is removed.

Why: deleting 200 ModelDeployments took over 2 minutes (a kopf daemon per object, so a
finalizer and an operator round trip per deletion), and hung with the operator uninstalled.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kmock
import pytest
from factories.model_deployments import MD_UID, md_doc
from kvgate.controller import md_loops
from kvgate.controller.main import register_handlers
from kvgate.controller.runtime import Runtime
from kvgate.kube.settings import OperatorSettings

NS = "models"
FOREIGN = "example.com/keep-me"


@pytest.fixture
def operator_settings() -> OperatorSettings:
    """The loops' passes wait a minute between them: these tests watch only starts and stops."""
    return OperatorSettings(reconcile_seconds=60.0, steady_reconcile_seconds=60.0)


def _md(uid: str = MD_UID, **meta: Any) -> dict[str, Any]:
    doc = md_doc()
    doc["metadata"].update(uid=uid, **meta)
    return doc


def test_no_kopf_handler_makes_kopf_add_a_finalizer() -> None:
    """Daemons, timers and on.delete handlers make kopf finalize every matching object; kvgate
    registers none, so no kvgate-managed object waits for the operator to be deleted."""
    registry = register_handlers()
    blocking = [
        handler.id
        for handler in [
            *registry._spawning.get_all_handlers(),
            *registry._changing.get_all_handlers(),
        ]
        if handler.requires_finalizer
    ]
    assert blocking == []


async def test_first_event_starts_one_loop_and_deletion_stops_it(rt: Runtime) -> None:
    key = (NS, "llama")
    md_loops.on_md_event(rt, None, _md())  # initial list
    (uid, task) = rt.md_loops[key]
    md_loops.on_md_event(rt, "MODIFIED", _md())
    assert rt.md_loops[key] == (uid, task) and uid == MD_UID  # the same loop, not a second one
    md_loops.on_md_event(rt, "DELETED", _md())
    assert key not in rt.md_loops
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), timeout=5)
    assert task.cancelled()


async def test_deletion_timestamp_stops_the_loop_at_once(rt: Runtime) -> None:
    md_loops.on_md_event(rt, "ADDED", _md())
    (_, task) = rt.md_loops[(NS, "llama")]
    md_loops.on_md_event(rt, "MODIFIED", _md(deletionTimestamp="2026-11-05T12:00:00Z"))
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), timeout=5)
    assert task.cancelled() and (NS, "llama") not in rt.md_loops


async def test_old_objects_deletion_never_stops_a_new_namesakes_loop(rt: Runtime) -> None:
    md_loops.on_md_event(rt, "ADDED", _md(uid="old"))
    md_loops.on_md_event(rt, "ADDED", _md(uid="new"))
    md_loops.on_md_event(rt, "DELETED", _md(uid="old"))
    (uid, task) = rt.md_loops[(NS, "llama")]
    assert uid == "new" and not task.done()


async def test_legacy_finalizer_is_removed_and_others_kept(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    doc = _md(finalizers=[FOREIGN, md_loops.LEGACY_FINALIZER])
    kmock.objects[kmock.resource("kvgate.io", "v1alpha1", "modeldeployments"), NS, "llama"] = doc
    assert await md_loops.release_legacy_finalizer(rt, doc) is True
    (patch,) = [r for r in kmock if r.method.value == "PATCH"]
    assert patch.headers["Content-Type"] == "application/json-patch+json"
    assert patch.data == [
        {"op": "test", "path": "/metadata/finalizers/1", "value": "kvgate.io/finalizer"},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]


async def test_no_patch_without_the_legacy_finalizer(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    assert await md_loops.release_legacy_finalizer(rt, _md(finalizers=[FOREIGN])) is False
    assert [r for r in kmock if r.method.value == "PATCH"] == []
