"""Shared fixtures of the e2e tier (run as root, after ``e2e/controlplane/build.sh``)::

    .venv/bin/pytest -m e2e e2e/tests -v -s          # all of it
    .venv/bin/pytest -m e2e e2e/tests/test_scenario_safe_deployment.py -v -s   # one file

Fixtures (use them in any e2e test module; mark the module ``pytestmark = pytest.mark.e2e``):

``world`` (session scope)
    One ``kvgate_e2e.world.World`` for the whole session (per pytest-xdist worker with
    `make e2e E2E_WORKERS=2`, each module on one of them): the control plane in its own network
    namespace, the loopback kubelet with two GPU pools (``kvgate.io/pool=big``: 8 x 80 GiB on
    node ``kvgate-node-0``; ``kvgate.io/pool=small``: 8 x 24 GiB on ``kvgate-small-0``), and
    ``helm install kvgate charts/kvgate`` in ``kvgate-system`` (operator re-verifies every 2 s).
    Built on first use, torn down at the end of the session. Useful members::

        world.apply(yaml_text_or_dict, namespace=None) -> str     # kubectl apply -f -
        world.kubectl(*args, input=None, check=True)              # CompletedProcess
        world.get(kind, name, ns) / world.list(kind, ns, selector) / world.get_md(name, ns)
        world.wait_for(what, predicate, timeout) -> value         # 0.2 s polling, deadline
        world.router_request(md, body, ns) -> (status, json)      # POST via the <md> Service
        world.service_url(name, ns) / world.engine_url(pod) / world.forward(ip, port)
        world.kubelet (KubeletThread), world.cluster (Cluster), world.operator_log()
    and in ``kvgate_e2e.world``: ``load_sample``, ``known_answer_body``, ``output_ids``,
    ``condition``, ``is_ready``, ``ready_endpoints``, ``PodTimeline``.

``namespace`` (function scope)
    A fresh namespace named after the test, deleted afterwards, so each test cleans up every
    object it created there: its ModelDeployments, Deployments and pods are deleted and waited
    for (the kubelet has stopped every process before the next test starts); the Namespace
    object goes on in the background (the namespace controller starts only 5 s after the
    request), and the session waits for all of them before the world stops (a namespace left
    after that deadline fails the run). Prints the test's wall time as
    ``MEASURED wall time <test>: <s>`` and the clean-up's as ``MEASURED clean-up <test>: <s>``.
    Tests must not leave cluster-scoped objects behind and must restore the release if they
    change it (see test_helm_install.py).

``lws`` (module scope)
    The session ``world`` with LeaderWorkerSet running (CRDs, webhooks, controller:
    ``kvgate_e2e.lws``) and kvgate upgraded with ``leaderWorkerSet.enabled=true``, from the first
    test of the module that asks for it to the module's end; then both are undone (after the
    namespaces that ran groups are gone), so later modules see the world they always saw. Put a
    module's tests that need it last.

A test that fails prints the operator's log tail (``world.operator_log()``).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterator

import pytest
from kvgate_e2e.build_artifacts import e2e_required_by, find_binaries, missing_binaries_reason
from kvgate_e2e.lws import controller_binary
from kvgate_e2e.netns import netns_supported
from kvgate_e2e.world import World


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under CI (``CI`` set) and in `make test`/`make e2e` (KVGATE_REQUIRE_E2E=1) a missing
    control-plane build is a failure, never a silently skipped tier (a green `make test` means
    the e2e tier ran); the modules' own ``skipif`` marks apply only outside them."""
    required_by = e2e_required_by(os.environ)
    if required_by is not None and find_binaries() is None:
        pytest.exit(f"{required_by}: {missing_binaries_reason()}", returncode=1)


@pytest.fixture(scope="session")
def world() -> Iterator[World]:
    if find_binaries() is None:
        pytest.skip(missing_binaries_reason())
    if os.geteuid() != 0:
        pytest.fail("the e2e tier must run as root (it creates a network namespace)")
    reason = netns_supported()
    if reason is not None:
        pytest.fail(f"the e2e tier needs network namespaces: {reason}")
    started = time.monotonic()
    with World() as w:
        print(
            f"\nMEASURED world (cluster + kubelet + helm install) up in "
            f"{time.monotonic() - started:.1f}s"
        )
        yield w
        # The namespace fixture leaves each Namespace object to the namespace controller (its
        # pods are stopped by then); a namespace still there after the deadline fails the run.
        started = time.monotonic()
        w.wait_namespaces_deleted()
        print(
            f"\nMEASURED test namespaces gone {time.monotonic() - started:.1f}s after the last test"
        )


@pytest.fixture(scope="module")
def lws(world: World) -> Iterator[World]:
    """LeaderWorkerSet in the session world for this module's remaining tests, and kvgate
    upgraded with ``leaderWorkerSet.enabled=true``; both undone afterwards (the namespaces that
    ran groups are waited for first), so later modules see the world they always saw."""
    if controller_binary() is None:
        pytest.fail(
            "the LeaderWorkerSet controller is not built: run e2e/controlplane/build-lws.sh"
        )
    started = time.monotonic()
    world.enable_leaderworkerset()
    took = time.monotonic() - started
    print(f"\nMEASURED LeaderWorkerSet started and kvgate upgraded in {took:.1f}s")
    try:
        yield world
    finally:
        world.wait_namespaces_deleted()
        started = time.monotonic()
        world.disable_leaderworkerset()
        took = time.monotonic() - started
        print(f"MEASURED LeaderWorkerSet uninstalled and kvgate upgraded back in {took:.1f}s")


@pytest.fixture
def namespace(world: World, request: pytest.FixtureRequest) -> Iterator[str]:
    # Unique per test (parametrized ones too): a namespace is deleted in the background, so a
    # later test must never ask for a name whose namespace is still terminating.
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    stem = request.node.name.removeprefix("test_").replace("_", "-")
    stem = re.sub(r"[^a-z0-9-]", "-", stem.lower())[:40].rstrip("-")
    name = f"t-{stem}-{digest}"
    world.create_namespace(name)
    started = time.monotonic()
    try:
        yield name
    finally:
        print(f"\nMEASURED wall time {request.node.name}: {time.monotonic() - started:.1f}s")
        started = time.monotonic()
        world.delete_namespace(name, wait=False)
        print(f"MEASURED clean-up {request.node.name}: {time.monotonic() - started:.1f}s")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    world_fixture = getattr(item, "funcargs", {}).get("world")
    if call.when == "call" and call.excinfo is not None and isinstance(world_fixture, World):
        try:
            log = world_fixture.operator_log(60)
        except Exception as exc:
            log = f"(unavailable: {exc})"
        item.add_report_section("call", "kvgate operator log (tail)", log)
    return report
