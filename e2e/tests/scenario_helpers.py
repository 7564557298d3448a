"""Shared pieces of the e2e scenarios 2, 3, 4 and 6: a per-test namespace, wall-time reporting,
ModelDeployment manifests derived from the sample, and reading what a user would read
(``kubectl get md``, conditions, Events)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from kvgate_e2e.world import World, condition, load_sample

T = TypeVar("T")
GATE = "kvgate.io/engine-verified"


@pytest.fixture
def scenario_ns(world: World, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted (pods stopped by the kubelet) afterwards; prints the
    test's wall time."""
    name = "s-" + request.node.name.removeprefix("test_").replace("_", "-")[:40].rstrip("-")
    world.create_namespace(name)
    started = time.monotonic()
    try:
        yield name
    finally:
        print(f"MEASURED wall time {request.node.name}: {time.monotonic() - started:.1f}s")
        world.delete_namespace(name)


def deadline_loop(what: str, probe: Callable[[], T | None], timeout: float) -> T:
    """Poll ``probe`` every 0.2 s until truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except Exception as exc:  # may race with object creation
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}"
                + (f" (last error: {last})" if last else "")
            )
        time.sleep(0.2)


def sample_md(name: str, **spec_changes: Any) -> dict[str, Any]:
    """The safe sample (llama-8b, 131,072 tokens) renamed; ``spec_changes`` replace top-level
    spec keys (``prefill=...``)."""
    md = copy.deepcopy(load_sample("llama-8b"))
    md["metadata"] = {"name": name}
    md["spec"].update(spec_changes)
    return md


def on_pool_without_estimate(md: dict[str, Any], pool: str) -> dict[str, Any]:
    """Pin both roles to a node pool and drop ``gpuMemoryGiB`` so admission cannot estimate the
    pool: only the live engine can tell."""
    for role in ("prefill", "decode"):
        md["spec"][role].pop("gpuMemoryGiB", None)
        md["spec"][role]["nodeSelector"] = {"kvgate.io/pool": pool}
    return md


def get_md_table(world: World, namespace: str) -> str:
    """``kubectl get md`` as a user sees it (printer columns)."""
    return str(world.kubectl("get", "md", f"--namespace={namespace}").stdout)


def md_condition(world: World, name: str, namespace: str, kind: str) -> dict[str, Any] | None:
    md = world.get_md(name, namespace)
    return condition(md, kind) if md else None


def events(world: World, namespace: str, reason: str | None = None) -> list[dict[str, Any]]:
    items = world.list("events", namespace)
    return [e for e in items if reason is None or e.get("reason") == reason]


def engine_pods(world: World, namespace: str, md: str, role: str | None = None) -> list[Any]:
    selector = f"kvgate.io/deployment={md},kvgate.io/component=engine"
    if role:
        selector += f",kvgate.io/role={role}"
    return [
        p
        for p in world.list("pods", namespace, selector)
        if not p["metadata"].get("deletionTimestamp")
    ]


def router_workers(world: World, namespace: str, md: str) -> list[dict[str, Any]]:
    """Every worker of every running router pod of ``md`` (``GET /workers``)."""
    from kvgate_e2e.world import http_json

    out: list[dict[str, Any]] = []
    selector = f"kvgate.io/deployment={md},kvgate.io/component=router"
    for router in world.list("pods", namespace, selector):
        ip = router.get("status", {}).get("podIP")
        if not ip or router["status"].get("phase") != "Running":
            continue
        code, body = http_json(f"http://127.0.0.1:{world.forward(ip, 8000)}/workers", timeout=5)
        if code == 200 and isinstance(body, dict):
            out.extend(body.get("workers") or [])
    return out


class TrafficLoop:
    """Known-answer requests in a loop from a background thread, each result recorded:
    ``with TrafficLoop(send) as traffic: ...``; ``send()`` returns (ok, detail)."""

    def __init__(self, send: Callable[[], tuple[bool, str]], pause: float = 0.1) -> None:
        import threading

        self.send = send
        self.pause = pause
        self.results: list[tuple[float, bool, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ok, detail = self.send()
            except Exception as exc:  # a refused connection is a failed request
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            self.results.append((time.monotonic(), ok, detail))
            self._stop.wait(self.pause)

    def __enter__(self) -> TrafficLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)

    @property
    def failures(self) -> list[tuple[float, bool, str]]:
        return [r for r in self.results if not r[1]]
