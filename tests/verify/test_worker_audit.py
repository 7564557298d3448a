"""A router's workers are exactly the verified engine pods of its revision; others are removed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kvgate.api import labels
from kvgate.controller import router_workers
from kvgate.controller.runtime import Runtime
from kvgate.kube import metrics
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.settings import OperatorSettings
from kvgate.objects import router_auth
from kvgate.verify.pod_identity import EngineIdentity
from kvgate.verify.worker_audit import KeyRefusal, KnownEngine, key_refusal, unknown_workers

DECODE = KnownEngine("uid-d", "198.18.0.7", 30000, "decode")
PREFILL = KnownEngine("uid-p", "198.18.0.8", 30000, "prefill")


def worker(url: str, kind: str = "decode", status: str = "ready", **extra: Any) -> dict[str, Any]:
    return {"id": "w-" + url[-12:], "url": url, "worker_type": kind, "status": status, **extra}


@pytest.mark.parametrize(
    ("case", "w", "removed"),
    [
        ("discovered verified decode pod", worker("http://198.18.0.7:30000"), False),
        ("discovered verified prefill pod", worker("http://198.18.0.8:30000", "prefill"), False),
        ("bare ip:port form", worker("198.18.0.7:30000"), False),
        (
            "uid label of the same pod",
            worker("http://198.18.0.7:30000", labels={"smg.ai/pod-uid": "uid-d"}),
            False,
        ),
        ("tenant engine elsewhere", worker("http://10.9.9.9:30000"), True),
        ("verified pod, other port", worker("http://198.18.0.7:31000"), True),
        (
            "verified decode pod posted as prefill",
            worker("http://198.18.0.7:30000", "prefill"),
            True,
        ),
        (
            "forged uid label on a rogue url",
            worker("http://10.9.9.9:30000", labels={"smg.ai/pod-uid": "uid-d"}),
            True,
        ),
        (
            "verified url with another pod's uid",
            worker("http://198.18.0.7:30000", labels={"smg.ai/pod-uid": "uid-x"}),
            True,
        ),
        ("pending injection", worker("http://10.9.9.9:30000", status="pending"), True),
        ("no url", {"id": "x", "worker_type": "decode", "status": "ready"}, True),
        ("already draining", worker("http://10.9.9.9:30000", status="draining"), False),
        # URLs Python's urlsplit reads as the verified pod and smg (WHATWG) as another host.
        ("backslash before user info", worker("http://10.9.9.9:30001\\@198.18.0.7:30000"), True),
        ("user info", worker("http://tenant@198.18.0.7:30000"), True),
        ("path", worker("http://198.18.0.7:30000/"), True),
        ("query", worker("http://198.18.0.7:30000?x"), True),
        ("fragment", worker("http://198.18.0.7:30000#x"), True),
        ("tab inside", worker("http://198.18.0.7:3\t0000"), True),
        ("leading zero (octal to WHATWG)", worker("http://198.18.0.07:30000"), True),
        ("port with a leading zero", worker("http://198.18.0.7:030000"), True),
        ("another scheme", worker("https://198.18.0.7:30000"), True),
        ("upper-case scheme", worker("HTTP://198.18.0.7:30000"), True),
        ("no port", worker("http://198.18.0.7"), True),
        ("surrounding space", worker(" http://198.18.0.7:30000"), True),
    ],
)
def test_only_verified_engine_pods_of_the_revision_are_known_workers(
    case: str, w: dict[str, Any], removed: bool
) -> None:
    assert (unknown_workers([w], [DECODE, PREFILL]) == [w]) is removed, case


def test_with_no_verified_engine_every_live_worker_is_unknown() -> None:
    ws = [worker("http://198.18.0.7:30000"), worker("http://198.18.0.8:30000", "prefill")]
    assert unknown_workers(ws, []) == ws


# -- the audit against a router that requires its key -------------------------------------------


class FakeRouter:
    def __init__(self, key: str, workers: list[dict[str, Any]]) -> None:
        self.key, self.workers, self.deleted = key, workers, []  # type: list[str]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/workers", self.list)
        app.router.add_delete("/workers/{id}", self.delete)
        return app

    def authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.key}"

    async def list(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return web.Response(status=401, text="Missing or invalid Authorization header")
        return web.json_response({"workers": self.workers, "total": len(self.workers)})

    async def delete(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return web.Response(status=401)
        self.deleted.append(request.match_info["id"])
        return web.json_response({"status": "accepted"}, status=202)


@pytest.fixture
async def served() -> AsyncIterator[tuple[Runtime, FakeRouter]]:
    settings = OperatorSettings(router_key_seed=b"0123456789abcdef-seed")
    posted: list[dict[str, Any]] = []

    class Api(KubeApi):
        async def post_event(self, involved: Any, **kw: Any) -> None:
            posted.append(kw)

    rt = Runtime(
        api=Api(Credentials(server="http://127.0.0.1:9")),
        settings=settings,
        verify=None,  # type: ignore[arg-type]
    )
    rt.mds[("ns", "llama")] = {"metadata": {"name": "llama", "namespace": "ns", "uid": "md-uid"}}
    key = rt.router_key("ns", "llama")
    assert key is not None
    router = FakeRouter(key, [])
    server = TestServer(router.app(), host="127.0.0.1")
    await server.start_server()
    router_pod = {
        "metadata": {
            "name": "llama-rev-router-1",
            "namespace": "ns",
            "uid": "router-uid",
            "labels": {labels.DEPLOYMENT: "llama", labels.REVISION: "rev", labels.ROLE: "router"},
        },
        "spec": {
            "containers": [
                {"name": "router", "ports": [{"name": "http", "containerPort": server.port}]}
            ]
        },
        "status": {"podIP": "127.0.0.1"},
    }
    rt.routers["router-uid"] = router_pod
    # The router's and the decode pod's controller chains, as identity.resolve_identity caches them.
    from kvgate.controller.identity import _ownership_fingerprint

    rt.identities["router-uid"] = (
        _ownership_fingerprint(router_pod),
        EngineIdentity("llama", "rev", "router", "llama-rev-router"),
    )
    decode_pod = {
        # A proven engine pod carries its Deployment's labels (kvgate.verify.pod_identity checks
        # them).
        "metadata": {
            "name": "d",
            "namespace": "ns",
            "uid": "uid-d",
            "labels": {labels.DEPLOYMENT: "llama", labels.REVISION: "rev", labels.ROLE: "decode"},
        },
        "spec": {
            "containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 30000}]}]
        },
        "status": {
            "podIP": "198.18.0.7",
            "conditions": [{"type": labels.ENGINE_VERIFIED, "status": "True"}],
        },
    }
    rt.pods["uid-d"] = decode_pod
    rt.identities["uid-d"] = ("x", EngineIdentity("llama", "rev", "decode", "llama-rev-decode"))
    rt.posted = posted  # type: ignore[attr-defined]
    yield rt, router
    await server.close()
    await rt.api.close()


async def test_an_injected_worker_is_removed_with_the_key_and_announced(
    served: tuple[Runtime, FakeRouter],
) -> None:
    rt, router = served
    router.workers = [
        worker("http://198.18.0.7:30000", labels={"smg.ai/pod-uid": "uid-d"}),
        {**worker("http://10.9.9.9:30000", status="pending"), "id": "injected"},
    ]
    assert await router_workers.audit_md(rt, "ns", "llama") == 0  # a suspect, first
    assert await router_workers.audit_md(rt, "ns", "llama") == 1  # still unknown: removed
    assert router.deleted == ["injected"]
    (event,) = rt.posted  # type: ignore[attr-defined]
    assert event["reason"] == "UnknownWorkerRemoved"
    assert "decode worker http://10.9.9.9:30000" in event["message"]
    assert "not a verified engine pod of revision rev" in event["message"]


async def test_a_worker_url_smg_and_kvgate_could_read_differently_is_removed_at_first_sight(
    served: tuple[Runtime, FakeRouter],
) -> None:
    rt, router = served
    disguised = "http://10.9.9.9:30001\\@198.18.0.7:30000"  # smg connects to 10.9.9.9
    router.workers = [
        worker("http://198.18.0.7:30000", labels={"smg.ai/pod-uid": "uid-d"}),
        {**worker(disguised, status="pending"), "id": "disguised"},
    ]
    assert await router_workers.audit_md(rt, "ns", "llama") == 1
    assert router.deleted == ["disguised"]
    (event,) = rt.posted  # type: ignore[attr-defined]
    assert event["reason"] == "UnknownWorkerRemoved"
    assert disguised in event["message"]
    assert "not http://<pod IP>:<port> as smg's discovery writes it" in event["message"]


async def test_a_verified_engine_a_new_leader_has_not_identified_yet_keeps_its_worker(
    served: tuple[Runtime, FakeRouter],
) -> None:
    """A leader that just took over can audit before its pod watch and verifiers have caught
    up: a verified engine it does not know yet must not lose its place in the router."""
    rt, router = served
    router.workers = [worker("http://198.18.0.7:30000", labels={"smg.ai/pod-uid": "uid-d"})]
    identity = rt.identities.pop("uid-d")  # not resolved yet by its verifier
    pod = rt.pods.pop("uid-d")  # nor listed yet by the pod watch
    assert await router_workers.audit_md(rt, "ns", "llama") == 0
    rt.pods["uid-d"], rt.identities["uid-d"] = pod, identity  # caught up
    assert await router_workers.audit_md(rt, "ns", "llama") == 0
    assert await router_workers.audit_md(rt, "ns", "llama") == 0
    assert router.deleted == []


async def test_a_router_that_is_not_provably_kvgates_never_gets_the_key(
    served: tuple[Runtime, FakeRouter],
) -> None:
    rt, router = served
    router.workers = [worker("http://10.9.9.9:30000")]
    rt.identities.pop("router-uid")
    rt.routers["router-uid"]["metadata"]["ownerReferences"] = []  # a tenant's look-alike pod
    assert await router_workers.audit_md(rt, "ns", "llama") == 0
    assert router.deleted == []


async def test_the_worker_api_refuses_a_caller_without_the_key(
    served: tuple[Runtime, FakeRouter],
) -> None:
    rt, router = served
    other = Runtime(
        api=rt.api, settings=OperatorSettings(router_key_seed=b"another-seed-xxxxxxx"), verify=None
    )  # type: ignore[arg-type]
    other.mds, other.routers, other.identities, other.pods = (
        rt.mds,
        rt.routers,
        rt.identities,
        rt.pods,
    )
    router.workers = [worker("http://10.9.9.9:30000")]
    assert await router_workers.audit_md(other, "ns", "llama") == 0
    assert router.deleted == []


# -- a router on a key kvgate did not write ---------------------------------------------------


@pytest.mark.parametrize(
    ("refused_before", "pod_fingerprint", "action"),
    [
        (True, "current", KeyRefusal.REPLACE),
        (False, "current", KeyRefusal.WAIT),  # one refusal is no evidence
        (True, "older", KeyRefusal.OLDER_KEY),  # an older template's key: its rollout replaces it
        (True, None, KeyRefusal.OLDER_KEY),
    ],
)
def test_a_router_is_replaced_only_after_two_refusals_of_the_key_its_template_promises(
    refused_before: bool, pod_fingerprint: str | None, action: KeyRefusal
) -> None:
    got = key_refusal(
        refused_before=refused_before, pod_fingerprint=pod_fingerprint, fingerprint="current"
    )
    assert got is action


def _on_tenant_key(rt: Runtime, router: FakeRouter, fingerprint: str) -> list[tuple[str, ...]]:
    """The router answers only a tenant's key; its pod carries ``fingerprint``. Returns the
    pod deletions the audit asks for."""
    router.key = "the-tenants-own-key"
    rt.routers["router-uid"]["metadata"]["annotations"] = {
        labels.ROUTER_KEY_FINGERPRINT: fingerprint
    }
    deleted: list[tuple[str, ...]] = []

    async def delete_pod(namespace: str, name: str, uid: str) -> bool:
        deleted.append((namespace, name, uid))
        return True

    rt.api.delete_pod = delete_pod  # type: ignore[method-assign]
    return deleted


async def test_a_router_started_on_a_tenants_key_is_deleted_and_announced(
    served: tuple[Runtime, FakeRouter],
) -> None:
    """A tenant deleted kvgate's router key Secret, created their own under its name and
    restarted the router: its worker API takes their key and refuses kvgate's (401)."""
    rt, router = served
    key = rt.router_key("ns", "llama")
    assert key is not None
    deleted = _on_tenant_key(rt, router, router_auth.key_fingerprint(key))
    before = metrics.ROUTER_PODS_REPLACED.labels("ns", "llama")._value.get()
    woken = rt.md_wake(("ns", "llama"))
    assert await router_workers.audit_md(rt, "ns", "llama") == 0
    assert deleted == [] and woken.is_set()  # the pass is woken to restore the Secret
    assert await router_workers.audit_md(rt, "ns", "llama") == 0
    assert deleted == [("ns", "llama-rev-router-1", "router-uid")]
    assert metrics.ROUTER_PODS_REPLACED.labels("ns", "llama")._value.get() == before + 1
    (event,) = rt.posted  # type: ignore[attr-defined]
    assert event["reason"] == "RouterKeyRefused" and event["type_"] == "Warning"
    assert "router pod llama-rev-router-1 (revision rev) refuses" in event["message"]
    assert "Secret llama-router-control that kvgate did not write" in event["message"]


async def test_a_router_of_an_older_key_is_left_to_its_rollout(
    served: tuple[Runtime, FakeRouter],
) -> None:
    rt, router = served
    deleted = _on_tenant_key(rt, router, "fingerprint-of-the-old-seed")
    for _ in range(3):
        assert await router_workers.audit_md(rt, "ns", "llama") == 0
    assert deleted == [] and rt.posted == []  # type: ignore[attr-defined]
    assert not rt.md_wake(("ns", "llama")).is_set()  # expected: no pass for it


async def test_a_router_that_takes_the_key_again_starts_the_count_over(
    served: tuple[Runtime, FakeRouter],
) -> None:
    rt, router = served
    key = rt.router_key("ns", "llama")
    assert key is not None
    deleted = _on_tenant_key(rt, router, router_auth.key_fingerprint(key))
    assert await router_workers.audit_md(rt, "ns", "llama") == 0  # refused
    router.key = key
    assert await router_workers.audit_md(rt, "ns", "llama") == 0  # answered
    router.key = "the-tenants-own-key"
    assert await router_workers.audit_md(rt, "ns", "llama") == 0  # refused once more
    assert deleted == []
