"""One reconcile loop per ModelDeployment: an asyncio task started by the CR's watch events and
cancelled by its deletion. No finalizer.

Why not a kopf daemon: kopf puts its finalizer on every object with a daemon, so each deletion
took a round trip through the operator (stop the daemon, wait out its cancellation back-off,
touch the object to be called again, patch the finalizer away). 200 ModelDeployments deleted at
once took over 2 minutes, and with the operator down or uninstalled a deletion hung until
someone removed the finalizer by hand. Nothing needs it: every object kvgate creates for a
ModelDeployment carries an ownerReference to it, so the API server's garbage collector deletes
them, with or without the operator; the operator only stops the loop and forgets the series.

ModelDeployments created by an earlier kvgate still carry ``kvgate.io/finalizer``: the first
watch event of each (the initial list when the operator starts, or the deletion itself) removes
it (``release_legacy_finalizer``). With no kvgate running, ``kubectl patch kvmd NAME --type=json
-p '[{"op":"remove","path":"/metadata/finalizers"}]'`` releases such an object.
"""

from __future__ import annotations

import logging
from collections.abc import ItemsView, Iterator, Mapping
from typing import Any

from kvgate.api import labels
from kvgate.api.models import API_VERSION, GROUP, KIND, PLURAL, VERSION
from kvgate.controller import modeldeployment
from kvgate.controller.runtime import MdKey, Runtime, spawn
from kvgate.kube.informer import Watched
from kvgate.kube.k8s import JSON_PATCH, ApiError
from kvgate.rollout import pass_priority

log = logging.getLogger("kvgate.md_loops")
LEGACY_FINALIZER = labels.FINALIZER
Body = dict[str, Any]


def _key(body: Body) -> MdKey:
    meta = body.get("metadata", {})
    return meta.get("namespace", ""), meta.get("name", "")


def on_md_event(rt: Runtime, event_type: str | None, body: Body) -> None:
    """Keep the latest body, wake the loop, and start it (first sight) or stop it (deleted or
    being deleted: the garbage collector removes what the ModelDeployment owns). A standby
    keeps the body only."""
    key = _key(body)
    if not rt.leading:
        if event_type == "DELETED":
            rt.mds.pop(key, None)
        else:
            rt.mds[key] = body
        return
    if event_type == "DELETED":
        rt.forget_md(key)
    else:
        rt.mds[key] = body
        rt.wake_md(*key)
        if pass_priority.requested_by_body(body):
            # Asked for (a rollback annotation, a new spec): a pass running now read the body
            # before this, so the next goes at once, ahead of the rest.
            rt.ask_pass(key)
        # A pass already waiting moves up if the user just asked for something (a rollback).
        rt.pass_slots().reclassify(key, rt.pass_class(key))
    uid = str(body.get("metadata", {}).get("uid", ""))
    if event_type == "DELETED" or body.get("metadata", {}).get("deletionTimestamp"):
        stop_loop(rt, key, uid)
        return
    running = rt.md_loops.get(key)
    if running is not None and not running[1].done():
        if running[0] == uid:
            return
        running[1].cancel()  # a new object of the same name: the old one's loop ends
    task = spawn(
        modeldeployment.run_reconciler(rt, key, lambda: False), name=f"reconcile-{key[0]}/{key[1]}"
    )
    rt.md_loops[key] = (uid, task)


def stop_loop(rt: Runtime, key: MdKey, uid: str) -> None:
    """Cancel the loop of the ModelDeployment ``key`` with this uid (never a newer namesake's)."""
    running = rt.md_loops.get(key)
    if running is None or (uid and running[0] and running[0] != uid):
        return
    del rt.md_loops[key]
    running[1].cancel()


async def release_legacy_finalizer(rt: Runtime, body: Body) -> bool:
    """Remove ``kvgate.io/finalizer`` (added by earlier kvgate versions) from the ModelDeployment;
    True when a patch removed it. The JSON patch tests the entry first, so a concurrent change
    of the list fails the patch (422) instead of removing someone else's finalizer."""
    meta = body.get("metadata", {})
    finalizers = list(meta.get("finalizers") or [])
    if LEGACY_FINALIZER not in finalizers:
        return False
    index = finalizers.index(LEGACY_FINALIZER)
    path = f"/metadata/finalizers/{index}"
    patch = [
        {"op": "test", "path": path, "value": LEGACY_FINALIZER},
        {"op": "remove", "path": path},
    ]
    namespace, name = _key(body)
    try:
        await rt.api.patch("ModelDeployment", namespace, name, patch, content_type=JSON_PATCH)
    except ApiError as exc:
        if exc.status in (404, 409, 422):  # gone, or the list changed: the next event retries
            return False
        raise
    log.info(
        "removed the legacy finalizer %s (ModelDeployments need none: their objects are "
        "garbage-collected through ownerReferences)",
        LEGACY_FINALIZER,
        extra={"namespace": namespace, "deployment": name},
    )
    return True


def on_reflected(rt: Runtime, event_type: str | None, body: Body) -> None:
    """A listed or watched ModelDeployment (the operator's own list-then-watch): as
    ``on_md_event``; a leader also releases a legacy finalizer (in a task of its own)."""
    on_md_event(rt, event_type, body)
    finalizers = body.get("metadata", {}).get("finalizers") or ()
    if rt.leading and event_type != "DELETED" and LEGACY_FINALIZER in finalizers:
        key = _key(body)
        spawn(release_legacy_finalizer(rt, body), name=f"finalizer-{key[0]}/{key[1]}")


def take_over(rt: Runtime) -> None:
    """This replica starts leading with the ModelDeployments its standby store holds: each
    gets its loop (and a legacy finalizer is released), as on a first watch event."""
    for body in list(rt.mds.values()):
        on_reflected(rt, None, body)


class _ByUid(Mapping[str, Body]):
    """``rt.mds`` seen by uid, as a reflector's store (kvgate.kube.informer.per_namespace)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def _index(self) -> dict[str, Body]:
        return {str(b.get("metadata", {}).get("uid", "")): b for b in self.rt.mds.values()}

    def __getitem__(self, uid: str) -> Body:
        return self._index()[uid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index())

    def __len__(self) -> int:
        return len(self.rt.mds)

    def items(self) -> ItemsView[str, Body]:  # one index, not one per key
        return self._index().items()


MODEL_DEPLOYMENTS = Watched(KIND, API_VERSION, f"/apis/{GROUP}/{VERSION}/{PLURAL}", "")


def start_reflectors(rt: Runtime) -> None:
    """Start the list-then-watch of ModelDeployments (one per watched namespace, or one
    cluster-wide): every listed or watched one goes to ``on_reflected``."""
    rt.reflect(
        MODEL_DEPLOYMENTS,
        store=_ByUid(rt),
        on_event=lambda event_type, body: on_reflected(rt, event_type, body),
        into=rt.md_reflectors,
    )
