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
it (``release_legacy_finalizer``). With no kvgate running, ``kubectl patch md NAME --type=json
-p '[{"op":"remove","path":"/metadata/finalizers"}]'`` releases such an object.
"""

from __future__ import annotations

import logging
from typing import Any

from kvgate.api import labels
from kvgate.controller import modeldeployment
from kvgate.controller.runtime import MdKey, Runtime, spawn
from kvgate.kube.k8s import JSON_PATCH, ApiError

log = logging.getLogger("kvgate.md_loops")
LEGACY_FINALIZER = labels.FINALIZER
Body = dict[str, Any]


def _key(body: Body) -> MdKey:
    meta = body.get("metadata", {})
    return meta.get("namespace", ""), meta.get("name", "")


def on_md_event(rt: Runtime, event_type: str | None, body: Body) -> None:
    """Keep the latest body, wake the loop, and start it (first sight) or stop it (deleted or
    being deleted: the garbage collector removes what the ModelDeployment owns)."""
    key = _key(body)
    if event_type == "DELETED":
        rt.forget_md(key)
    else:
        rt.mds[key] = body
        rt.wake_md(*key)
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
