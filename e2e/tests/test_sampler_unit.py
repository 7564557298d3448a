"""The invariant sampler's decision: which traffic paths point at an engine that fails its
requirement (pure; no cluster)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from kvgate_e2e.sampler import (
    ENDPOINT,
    POD_READY,
    WORKER,
    InvariantSampler,
    Violation,
    decide,
    live_host,
    routable_addresses,
    routes_to_ip,
    smg_host,
    windows,
)
from kvgate_engine.report import EngineReport
from kvgate_engine.verdict import ENGINE_UNREACHABLE, Requirement, Verdict, cannot_tell

NS = "t"
CTX = 1_048_576


def requirement(role: str = "decode", ctx: int = CTX) -> str:
    return json.dumps(
        {"contextLength": ctx, "headroom": 1.0, "role": role, "minEngineVersion": "0.5.22"}
    )


def pod(
    name: str,
    ip: str,
    *,
    ready: bool,
    uid: str | None = None,
    role: str = "decode",
    annotated: bool = True,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": uid or f"uid-{name}",
        "labels": {"kvgate.io/role": role, "kvgate.io/component": "engine"},
        "annotations": {"kvgate.io/requirement": requirement(role)} if annotated else {},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-09-01T00:00:00Z"
    return {
        "metadata": meta,
        "status": {
            "podIP": ip,
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"},
                {"type": "kvgate.io/engine-verified", "status": "True" if ready else "False"},
            ],
        },
    }


def report(pool: int, *, version: str = "0.5.23", role: str = "decode") -> EngineReport:
    return EngineReport(
        version=version,
        role=role,
        kv_pool_tokens=pool,
        kv_pool_tokens_per_rank=(pool,),
        max_req_input_len=min(CTX - 1, pool - 1) - 5,
        effective_context_length=CTX,
        served_model_name="glm",
    )


def annotated(p: Mapping[str, Any]) -> Requirement | None:
    """These unit pods carry their requirement as an annotation (the e2e sampler derives it
    from the ModelDeployment; see test_requirements_from_model_deployments_*)."""
    raw = (p.get("metadata") or {}).get("annotations", {}).get("kvgate.io/requirement")
    if not raw:
        return None
    doc = json.loads(raw)
    return Requirement(int(doc["contextLength"]), float(doc.get("headroom", 1.0)), doc.get("role"))


SAFE = report(1_200_000)
SHRUNK = report(681_280)  # the incident's prefill pool


def slice_(service: str, *endpoints: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{service}-abc", "labels": {"kubernetes.io/service-name": service}},
        "endpoints": [{"addresses": [ip], "conditions": cond} for ip, cond in endpoints],
    }


def workers(*entries: tuple[str, str]) -> dict[str, Any]:
    return {
        "workers": [
            {"url": f"http://{ip}:30000", "worker_type": "decode", "status": status}
            for ip, status in entries
        ]
    }


READY = {"ready": True, "serving": True, "terminating": False}
NOT_READY = {"ready": False, "serving": False, "terminating": False}
ROUTER = f"{NS}/md-router-0"


def run(
    pods: list[dict[str, Any]],
    reports: dict[str, EngineReport | Verdict],
    slices: list[dict[str, Any]] | None = None,
    router: dict[str, Any] | None = None,
    probed: list[dict[str, Any]] | None = None,
) -> list[tuple[str, str, str, str]]:
    decision = decide(
        at=1.0,
        probed_pods=probed if probed is not None else pods,
        reports=reports,
        pods=pods,
        slices=slices or [],
        workers={ROUTER: router} if router is not None else {},
        requirement_of=annotated,
    )
    return [(v.path, v.via, v.pod, v.reason) for v in decision.violations]


D = "md-decode-7f9c"
IP = "198.18.1.7"


@pytest.mark.parametrize(
    ("case", "engine", "ready", "endpoint", "worker_status", "expected"),
    [
        ("verified engine on every path", SAFE, True, READY, "ready", []),
        ("unsafe engine kept off every path", SHRUNK, False, NOT_READY, None, []),
        ("unsafe engine whose worker is draining", SHRUNK, False, NOT_READY, "draining", []),
        (
            "unsafe engine still Ready, in the slice and in the router (restart not noticed)",
            SHRUNK,
            True,
            READY,
            "ready",
            [
                (POD_READY, f"{NS}/{D}", f"{NS}/{D}", "KvPoolTooSmall"),
                (ENDPOINT, "md-decode", f"{NS}/{D}", "KvPoolTooSmall"),
                (WORKER, ROUTER, f"{NS}/{D}", "KvPoolTooSmall"),
            ],
        ),
        (
            "unsafe engine gated off but the gateway has not dropped its worker",
            SHRUNK,
            False,
            NOT_READY,
            "ready",
            [(WORKER, ROUTER, f"{NS}/{D}", "KvPoolTooSmall")],
        ),
        (
            "a pending worker is a path too (only draining takes no new traffic)",
            SHRUNK,
            False,
            NOT_READY,
            "pending",
            [(WORKER, ROUTER, f"{NS}/{D}", "KvPoolTooSmall")],
        ),
        (
            "stale EndpointSlice still lists the NotReady pod as ready",
            SHRUNK,
            False,
            READY,
            None,
            [(ENDPOINT, "md-decode", f"{NS}/{D}", "KvPoolTooSmall")],
        ),
        (
            "terminating but serving endpoint is kube-proxy's fallback path",
            SHRUNK,
            False,
            {"ready": False, "serving": True, "terminating": True},
            None,
            [(ENDPOINT, "md-decode", f"{NS}/{D}", "KvPoolTooSmall")],
        ),
        (
            "pre-fix engine version with a big pool",
            report(1_200_000, version="0.5.20"),
            True,
            NOT_READY,
            None,
            [(POD_READY, f"{NS}/{D}", f"{NS}/{D}", "EngineVersionTooOld")],
        ),
        (
            "prefill engine in a decode pod",
            report(1_200_000, role="prefill"),
            True,
            NOT_READY,
            None,
            [(POD_READY, f"{NS}/{D}", f"{NS}/{D}", "RoleMismatch")],
        ),
    ],
)
def test_decide_flags_exactly_the_paths_to_engines_that_fail_their_requirement(
    case: str,
    engine: EngineReport,
    ready: bool,
    endpoint: dict[str, Any],
    worker_status: str | None,
    expected: list[tuple[str, str, str, str]],
) -> None:
    pods = [pod(D, IP, ready=ready)]
    router = workers((IP, worker_status)) if worker_status else {"workers": []}
    got = run(pods, {f"uid-{D}": engine}, [slice_("md-decode", (IP, endpoint))], router)
    assert sorted(got) == sorted(expected), case


def test_violation_message_gives_the_pool_and_the_context_in_numbers() -> None:
    decision = decide(
        at=2.5,
        probed_pods=[pod(D, IP, ready=True)],
        reports={f"uid-{D}": SHRUNK},
        pods=[pod(D, IP, ready=True)],
        slices=[],
        workers={},
        requirement_of=annotated,
    )
    (v,) = decision.violations
    assert v == Violation(
        2.5,
        POD_READY,
        f"{NS}/{D}",
        f"{NS}/{D}",
        "KvPoolTooSmall",
        "KV pool 681,280 tokens < context length 1,048,576 × headroom 1.0 "
        "(short by 367,296 tokens); max_req_input_len 681,274 tokens < context length "
        "1,048,576 − 6 = 1,048,570 (short by 367,296 tokens)",
    )
    assert "681,280" in v.describe()


def test_unreadable_engine_is_counted_not_flagged() -> None:
    down = cannot_tell(ENGINE_UNREACHABLE, "connection refused")
    decision = decide(
        at=0.0,
        probed_pods=[pod(D, IP, ready=True)],
        reports={f"uid-{D}": down},
        pods=[pod(D, IP, ready=True)],
        slices=[slice_("md-decode", (IP, READY))],
        workers={},
        requirement_of=annotated,
    )
    assert decision.violations == ()
    assert decision.unreadable == (f"{NS}/{D}",)
    assert decision.paths == 2


def test_pod_without_requirement_is_unjudged_unless_the_caller_supplies_one() -> None:
    plain = pod("engine", IP, ready=True, annotated=False)
    args: dict[str, Any] = dict(
        at=0.0, probed_pods=[plain], reports={"uid-engine": SHRUNK}, pods=[plain], slices=[]
    )
    unjudged = decide(**args, workers={}, requirement_of=annotated)
    assert unjudged.violations == () and unjudged.unjudged == (f"{NS}/engine",)
    judged = decide(
        **args,
        workers={},
        requirement_of=lambda p: Requirement(context_length=CTX, role="decode"),
    )
    assert [v.reason for v in judged.violations] == ["KvPoolTooSmall"]


def test_an_ip_reused_by_a_new_pod_is_not_judged_by_the_old_pods_engine() -> None:
    old = pod(D, IP, ready=False, uid="old")
    new = pod("md-decode-new", IP, ready=True, uid="new")
    # The shrunk engine was read from the old pod; the address now belongs to a pod not yet read.
    got = run(
        [new], {"old": SHRUNK}, [slice_("md-decode", (IP, READY))], workers((IP, "ready")), [old]
    )
    assert got == []


def test_a_terminating_pod_does_not_hide_the_live_pod_on_the_same_ip() -> None:
    gone = pod("gone", IP, ready=False, uid="gone", deleting=True)
    live = pod(D, IP, ready=False)
    got = run([live, gone], {f"uid-{D}": SHRUNK}, [], workers((IP, "ready")))
    assert got == [(WORKER, ROUTER, f"{NS}/{D}", "KvPoolTooSmall")]


def test_a_worker_routes_to_an_ip_only_when_its_host_is_that_ip_whole() -> None:
    # CI failure of 430e85e..a736614: a decode pod at 10.0.0.2 was "still routed" for 120 s
    # because the prefill worker's URL, http://10.0.0.21:30000, contains "10.0.0.2".
    prefill = {"url": "http://10.0.0.21:30000", "status": "ready"}
    assert not routes_to_ip([prefill], "10.0.0.2")
    assert routes_to_ip([prefill], "10.0.0.21")
    assert routes_to_ip([{"url": "10.0.0.2:30000", "status": "pending"}], "10.0.0.2")
    assert not routes_to_ip([{"url": "http://10.0.0.2:30000", "status": "draining"}], "10.0.0.2")
    assert live_host({"url": "not a url"}) is None


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://10.0.0.9:30001\\@10.0.0.2:30000", "10.0.0.9"),  # backslash ends the authority
        ("http:\\\\10.0.0.9:30001", "10.0.0.9"),
        ("http://tenant@10.0.0.9:30000", "10.0.0.9"),
        ("http://a@b@10.0.0.9:30000", "10.0.0.9"),  # user info runs to the last @
        ("http://10.0.0.9:30000?@10.0.0.2:1", "10.0.0.9"),
        ("http://10.0.0.9:30000#@10.0.0.2:1", "10.0.0.9"),
        ("http://012.0.0.9:30000", "10.0.0.9"),  # octal
        ("http://0x0a.0.0.9:30000", "10.0.0.9"),  # hex
        ("http://10.9:30000", "10.0.0.9"),  # two parts
        ("http://10.0.0.\t9:30000", "10.0.0.9"),  # tabs are dropped
        ("HTTP://10.0.0.9:30000", "10.0.0.9"),
        ("10.0.0.9:30000", "10.0.0.9"),
        ("http://[fd00:0::9]:30000", "fd00::9"),
        ("not a url", None),
        ("http://", None),
    ],
)
def test_the_sampler_reads_a_worker_url_as_smg_does(url: str, host: str | None) -> None:
    assert smg_host(url) == host


def test_a_worker_whose_url_smg_reads_as_a_rogue_is_a_path_to_the_rogue() -> None:
    rogue = {"url": f"http://10.0.0.9:30001\\@{IP}:30000", "status": "ready"}
    assert routes_to_ip([rogue], "10.0.0.9")
    assert not routes_to_ip([rogue], IP)


def test_routable_addresses_follow_kube_proxy() -> None:
    s = slice_(
        "svc",
        ("198.18.1.1", READY),
        ("198.18.1.2", NOT_READY),
        ("198.18.1.3", {}),  # nil ready means ready
        ("198.18.1.4", {"ready": False, "serving": True, "terminating": True}),
        ("198.18.1.5", {"ready": False, "serving": True, "terminating": False}),
    )
    assert routable_addresses([s]) == [
        ("svc", "198.18.1.1"),
        ("svc", "198.18.1.3"),
        ("svc", "198.18.1.4"),
    ]


def test_a_headless_services_slices_are_no_traffic_path() -> None:
    # LeaderWorkerSet's group Service is headless and publishes not-ready addresses: its slices
    # list a refused leader as ready, but kube-proxy never routes through them (seen in the
    # multi-node e2e scenario: the workers' addresses were counted as traffic paths).
    headless = slice_("grp", ("198.18.1.1", READY), ("198.18.1.2", NOT_READY))
    headless["metadata"]["labels"]["service.kubernetes.io/headless"] = ""
    assert routable_addresses([headless, slice_("svc", ("198.18.1.3", READY))]) == [
        ("svc", "198.18.1.3")
    ]


def test_windows_group_consecutive_samples_and_split_on_a_gap() -> None:
    times = [0.0, 0.2, 0.4, 0.6, 0.8]

    def v(at: float, via: str = "r") -> Violation:
        return Violation(at, WORKER, via, "t/p", "KvPoolTooSmall", "m")

    got = windows([v(0.2), v(0.4), v(0.8), v(0.4, "s")], times)
    assert [(w.via, w.first, w.last, w.samples) for w in got] == [
        ("r", 0.2, 0.4, 2),
        ("s", 0.4, 0.4, 1),
        ("r", 0.8, 0.8, 1),
    ]
    assert got[0].seconds == pytest.approx(0.2)


class _NoCluster:
    kubeconfig = Path("/nonexistent")
    netns_name = "none"


def test_check_fails_listing_every_violation_window() -> None:
    sampler = InvariantSampler(_NoCluster(), NS)
    sampler.stats.samples = 3
    sampler.sample_times = [1.0, 1.2, 1.4]
    sampler.violations = [
        Violation(1.2, ENDPOINT, "md-decode", f"{NS}/{D}", "KvPoolTooSmall", "KV pool 681,280"),
        Violation(1.4, ENDPOINT, "md-decode", f"{NS}/{D}", "KvPoolTooSmall", "KV pool 681,280"),
    ]
    with pytest.raises(AssertionError) as err:
        sampler.check()
    text = str(err.value)
    assert f"EndpointSlice endpoint md-decode -> {NS}/{D} for 0.20s (2 samples)" in text
    assert "KV pool 681,280" in text
    sampler.expect_violations = True
    sampler.check()  # expected violations alone do not fail


def test_check_fails_a_sampler_that_could_not_watch() -> None:
    sampler = InvariantSampler(_NoCluster(), NS)
    with pytest.raises(AssertionError, match="took no sample"):
        sampler.check()
    sampler.stats.samples, sampler.stats.failed = 5, 5
    sampler.stats.last_error = "ApiError: 403"
    with pytest.raises(AssertionError, match=r"5 of 10 sampler ticks failed.*403"):
        sampler.check()


def test_requirements_from_model_deployments_ignore_a_weakened_pod_annotation() -> None:
    from kvgate.api.models import ModelDeploymentSpec
    from kvgate.api.revision import revision_of
    from kvgate_e2e.sampler import requirements_from
    from kvgate_e2e.world import load_sample

    md = load_sample("llama-8b")
    rev = revision_of(ModelDeploymentSpec.model_validate(md["spec"]))
    weak = {
        "metadata": {
            "labels": {
                "kvgate.io/deployment": md["metadata"]["name"],
                "kvgate.io/revision": rev,
                "kvgate.io/role": "decode",
            },
            "annotations": {"kvgate.io/requirement": '{"contextLength": 1}'},
        }
    }
    got = requirements_from([md])(weak)
    assert got is not None and got.context_length == md["spec"]["model"]["contextLength"] > 1
    assert got.role == "decode"


# --------------------------------------------------------------- the watches and their lists
class _FakeApi:
    """A list answer per path, then the given watch events (then the watch ends or raises)."""

    def __init__(self, items: list[dict[str, Any]], events: list[Any]) -> None:
        self.items = items
        self.events = events
        self.lists = 0

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.lists += 1
        return {"metadata": {"resourceVersion": "10"}, "items": list(self.items)}

    async def watch(self, path: str, params: Any, version: str) -> Any:
        events, self.events = self.events, []
        for event in events:
            if isinstance(event, Exception):
                raise event
            yield event


def _follow_until(mirror: Any, api: _FakeApi, done: Any) -> None:
    import asyncio
    import threading

    async def go() -> None:
        stop = threading.Event()
        task = asyncio.ensure_future(mirror.follow(api, stop))
        for _ in range(200):
            await asyncio.sleep(0.005)
            if done():
                break
        stop.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())


def test_a_mirror_lists_then_follows_added_modified_and_deleted_objects() -> None:
    from kvgate_e2e.sampler import _Mirror

    a, b = pod("a", "198.18.0.1", ready=False), pod("b", "198.18.0.2", ready=False)
    a_ready = pod("a", "198.18.0.1", ready=True)
    events = [
        {"type": "ADDED", "object": b},
        {"type": "MODIFIED", "object": a_ready},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
        {"type": "DELETED", "object": b},
    ]
    mirror = _Mirror("/api/v1/namespaces/t/pods", {})
    api = _FakeApi([a], events)
    _follow_until(mirror, api, lambda: not api.events)
    assert mirror.items() == [a_ready]
    assert api.lists == 1  # a watch that ends is resumed, never re-listed


def test_a_broken_watch_makes_the_mirror_unreadable_and_a_410_lists_again() -> None:
    from kvgate_e2e.kubelet.api import ApiError
    from kvgate_e2e.sampler import MirrorStale, _Mirror

    mirror = _Mirror("/api/v1/namespaces/t/pods", {})
    with pytest.raises(MirrorStale, match="not listed yet"):
        mirror.items()  # before its first list: a tick reading it fails
    api = _FakeApi([pod("a", "198.18.0.1", ready=True)], [ApiError("WATCH", "p", 410, "gone")])
    _follow_until(mirror, api, lambda: api.lists >= 2)
    assert api.lists >= 2  # the 410 made it list again
    broken = _FakeApi([], [ConnectionResetError("the API server went away")])
    stale = _Mirror("/api/v1/namespaces/t/pods", {})
    seen: list[str] = []

    def failed() -> bool:
        try:
            stale.items()
        except MirrorStale as exc:
            seen.append(str(exc))
        return broken.lists >= 1 and not broken.events and bool(seen) and "Reset" in seen[-1]

    _follow_until(stale, broken, failed)
    assert seen and "ConnectionResetError" in seen[-1]


class _Mirrored:
    """A mirror whose watch shows ``watched`` and whose list answers ``listed``."""

    def __init__(self, watched: list[dict[str, Any]], listed: list[dict[str, Any]]) -> None:
        self.watched = watched
        self.listed = listed

    def items(self) -> list[dict[str, Any]]:
        return list(self.watched)

    async def fetch(self, api: Any) -> tuple[list[dict[str, Any]], str]:
        return list(self.listed), "1"


def _sampler_seeing(watched_slices: list[Any], listed_slices: list[Any]) -> InvariantSampler:
    """A sampler whose watches show ``watched_slices`` and whose lists answer ``listed_slices``,
    with one decode pod whose engine reports a pool below its requirement."""
    from kvgate_e2e.sampler import _Mirrors

    sampler = InvariantSampler(_NoCluster(), NS, requirement_of=annotated)
    decode = pod(D, IP, ready=False)
    sampler._mirrors = _Mirrors(
        engines=_Mirrored([decode], [decode]),  # type: ignore[arg-type]
        routers=_Mirrored([], []),  # type: ignore[arg-type]
        slices=_Mirrored(watched_slices, listed_slices),  # type: ignore[arg-type]
        mds=_Mirrored([], []),  # type: ignore[arg-type]
    )

    async def small_engine(http: Any, p: Any) -> tuple[str, Any]:
        return p["metadata"]["uid"], report(681_280)

    sampler._report = small_engine  # type: ignore[method-assign]
    return sampler


def _one_tick(sampler: InvariantSampler) -> None:
    import asyncio

    asyncio.run(sampler._tick(None, None))  # type: ignore[arg-type]


def test_a_violation_the_watches_show_counts_only_when_the_lists_show_it_too() -> None:
    open_path = [slice_("md-decode", (IP, READY))]
    closed = [slice_("md-decode", (IP, NOT_READY))]
    refuted = _sampler_seeing(watched_slices=open_path, listed_slices=closed)
    _one_tick(refuted)  # the watch trailed: the lists show the endpoint already out
    assert refuted.violations == [] and refuted.stats.samples == 1
    assert (refuted.stats.confirmed, refuted.stats.unconfirmed) == (1, 1)
    confirmed = _sampler_seeing(watched_slices=open_path, listed_slices=open_path)
    _one_tick(confirmed)
    assert [(v.path, v.reason) for v in confirmed.violations] == [(ENDPOINT, "KvPoolTooSmall")]
    assert (confirmed.stats.confirmed, confirmed.stats.unconfirmed) == (1, 0)
    quiet = _sampler_seeing(watched_slices=closed, listed_slices=open_path)
    _one_tick(quiet)  # nothing seen in the watched state: no list at all
    assert quiet.violations == [] and quiet.stats.confirmed == 0
