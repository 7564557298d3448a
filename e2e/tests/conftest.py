"""Shared fixtures of the e2e tier (run as root, after ``e2e/controlplane/build.sh``)::

    .venv/bin/pytest -m e2e e2e/tests -v -s          # all of it
    .venv/bin/pytest -m e2e e2e/tests/test_scenario_safe_deployment.py -v -s   # one file

Fixtures (use them in any e2e test module; mark the module ``pytestmark = pytest.mark.e2e``):

``world`` (session scope)
    One ``kvgate_e2e.world.World`` for the whole session: the control plane in its own network
    namespace, the loopback kubelet with three GPU pools (``kvgate.io/pool=big``: 32 x 80 GiB on
    node ``kvgate-node-0``; ``kvgate.io/pool=small``: 8 x 24 GiB on ``kvgate-small-0``;
    ``kvgate.io/pool=real``: 8 x 80 GiB on ``kvgate-real-0``, the real SGLang's), and
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

``prometheus`` (module scope)
    A real Prometheus server (``kvgate_e2e.prometheus.Prometheus``) in the session world for the
    module: the chart's ServiceMonitor (operator and webhook metrics) and its engine and router
    PodMonitors as kubernetes_sd scrape jobs, scrape and rule evaluation every 1 s, and the
    chart's PrometheusRule as its rules, rendered with the module's ``PROMETHEUS_RULE_VALUES``
    (values under ``metrics.prometheusRule``, e.g. ``{"headroomFor": "2s"}``; none: the
    chart's defaults). It changes nothing the other tests see (its own process and port), so it
    shares the world. Members: ``query(expr) -> [Series(labels, value)]``, ``alerts() ->
    [Alert(name, state, labels)]`` (from ``ALERTS``), ``wait_firing(alertname, labels,
    deadline) -> Alert``, ``wait_resolved(alertname, labels, deadline)``, ``targets()``,
    ``rules()``, ``set_rules(values)``, ``reload()``, ``url``. A module's
    ``PROMETHEUS_EXTRA_MONITORS`` (PodMonitor/ServiceMonitor dicts) adds scrape jobs.

``metrics_adapter`` (module scope, uses ``prometheus``)
    prometheus-adapter (``kvgate_e2e.prometheus_adapter.PrometheusAdapter``) serving
    ``custom.metrics.k8s.io`` (v1beta1, v1beta2) from the module's Prometheus through the API
    server's aggregation layer, with the rules of ``docs/autoscaling/prometheus-adapter-rules.yaml``
    (per-pod ``sglang_num_running_reqs``, ``sglang_num_queue_reqs``, ``sglang_kv_used_tokens``,
    ``sglang_token_usage``; verified engines only: ``kvgate_verified_num_queue_reqs``,
    ``kvgate_verified_num_running_reqs``, ``kvgate_kv_usage_ratio``), so an ``autoscaling/v2``
    HPA with a Pods metric is run by the world's real HPA controller (sync every 2 s). One per
    world at a time (the APIService is cluster-wide): a second module's fixture waits for the
    first's end. Members:
    ``pod_metrics(ns, metric, selector) -> {pod: value}``, ``wait_pod_metrics(ns, metric, accept,
    timeout)``, ``raw(path)``, ``log_tail()``.

``lws`` (module scope)
    The session ``world`` with LeaderWorkerSet running (CRDs, webhooks, controller:
    ``kvgate_e2e.lws``) and kvgate upgraded with ``leaderWorkerSet.enabled=true``, from the first
    test of the module that asks for it to the module's end; then both are undone (after the
    namespaces that ran groups are gone), so later modules see the world they always saw. Put a
    module's tests that need it last.

A test that fails prints the operator's log tail (``world.operator_log()``).

One world, several workers (`make e2e`: ``KVGATE_E2E_SHARED_WORLD=1 pytest -n 3 --dist loadfile``;
``kvgate_e2e.shared_world``): the xdist controller starts the world and each worker's ``world``
attaches to it, so the tests of up to three modules run at once against one control plane. A
test shares the world with the others unless ``ALONE`` names it: it changes what every other
test sees, so it waits for the running tests, keeps new ones out and runs alone (``Turns``).
Without ``-n`` (or without ``KVGATE_E2E_SHARED_WORLD``) the session builds its own world, as
before, and nothing waits for a turn. The terminal summary gives each file's seconds (setup,
call and teardown of its tests, less the time they waited for their turn) and its wall span.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvgate_e2e import shared_world
from kvgate_e2e.build_artifacts import e2e_required_by, find_binaries, missing_binaries_reason
from kvgate_e2e.lws import controller_binary
from kvgate_e2e.netns import netns_supported
from kvgate_e2e.prometheus import (
    Prometheus,
    missing_server_reason,
    server_binary,
)
from kvgate_e2e.prometheus_adapter import (
    PrometheusAdapter,
    adapter_binary,
    missing_adapter_reason,
)
from kvgate_e2e.world import TEST_NODE_SPECS, World, WorldConfig

# Tests that change what every other test of a shared world sees run alone in it: file -> test
# names ("*": all of the file's tests). A name that the file no longer has fails the run (so a
# renamed test is never silently shared).
ALONE: dict[str, tuple[str, ...]] = {
    # kills the leader and webhook pods, restarts kube-apiserver
    "test_chaos.py": ("*",),
    # the operator at 0 replicas; a node's GPU memory shrunk
    "test_scenario_operator_down.py": ("*",),
    "test_scenario_kv_canary.py": (
        # the operator at 0 replicas
        "test_a_violation_logged_while_the_operator_is_down_trips_the_gate_when_it_is_back",
    ),
    "test_scenario_mass_deletion.py": (
        # 100 ModelDeployments at once (a timing bound on the shared operator), and the
        # operator at 0 replicas
        "test_deleting_100_model_deployments_at_once_takes_seconds",
        "test_deletion_completes_with_the_operator_down",
    ),
    "test_helm_install.py": (
        # helm upgrade, uninstall and install of the release
        "test_helm_install_upgrade_and_uninstall_keep_the_webhook_valid_and_users_deployments",
    ),
}
# Not here, though they lift an admission policy: the tenant attacks (attack_helpers.policy_lifted
# lifts a binding for the test's own namespace only). Not here, though they change a node: the
# engine-restart, engine-window, incident and real-SGLang scenarios, each on a node of its own
# (kvgate_e2e.world.TEST_NODE_SPECS). The probe attack shares the world too: its operator-memory
# bound (300 MiB, against 1,079 MiB before the fix) holds with other tests' deployments, and other
# tests' verdicts only add to the count it waits for.
# Files whose module-scoped fixtures change the world: alone from their first test to their end.
MODULE_ALONE: frozenset[str] = frozenset()
# The ``lws`` fixture (helm upgrade with LeaderWorkerSet) takes the world alone from the first
# test that asks for it to the end of its module.

# Seconds per file, to start the longest first when they share a world; a file not listed counts
# 20. Each file's own seconds in the last whole `make test` that printed them (fresh clone at
# 7618b29, 3 workers, unit and conformance beside at nice 15: the "MEASURED seconds per file"
# table); files under 20 s are left out. Refresh them from that table when a file changes much.
EXPECTED_SECONDS: dict[str, int] = {
    "test_scenario_real_engine.py": 880,
    "test_scenario_real_incident.py": 499,
    "test_scenario_lost_objects.py": 463,
    "test_scenario_progressive.py": 428,
    "test_attack_pods.py": 304,
    "test_scenario_multinode.py": 290,
    "test_chaos.py": 226,
    "test_scenario_mass_deletion.py": 221,
    "test_kubelet_smoke.py": 195,
    "test_scenario_autoscaling.py": 194,
    "test_attack_tenant_addresses.py": 185,
    "test_alerts_fire.py": 180,
    "test_attack_tenant.py": 146,
    "test_scenario_content_check.py": 136,
    "test_scenario_engine_restart.py": 131,
    "test_attack_step_dilution.py": 130,
    "test_attack_role_scales.py": 110,
    "test_quick_start.py": 107,
    "test_scenario_rollback.py": 102,
    "test_scenario_operator_down.py": 98,
    "test_scenario_kv_canary.py": 98,
    "test_real_node.py": 92,
    "test_dashboards_query.py": 88,
    "test_md_events_and_drift.py": 85,
    "test_helm_install.py": 83,
    "test_attack_inputs.py": 82,
    "test_attack_probe.py": 80,
    "test_cluster_smoke.py": 79,
    "test_attack_secrets.py": 79,
    "test_attack_host_paths.py": 78,
    "test_attack_canary_log.py": 58,
    "test_scenario_refused_rollout.py": 58,
    "test_scenario_model_download.py": 57,
    "test_attack_plugin_record.py": 57,
    "test_attack_worker_url.py": 56,
    "test_scenario_incident.py": 52,
    "test_scenario_small_gpu.py": 50,
    "test_scenario_platform_fit.py": 49,
    "test_network_policies.py": 40,
    "test_attack_engine_args.py": 40,
    "test_scenario_safe_deployment.py": 39,
    "test_metrics_pipeline.py": 33,
    "test_attack_engine_window.py": 31,
    "test_cpu_load_unit.py": 24,
}
_WORLD_FIXTURES = frozenset({"world", "namespace", "lws"})
# The longest the files without a lone test wait for the lone tests (a safety net: a lone test's
# end is recorded even if its worker crashes, by the controller).
LONE_PHASE_TIMEOUT = 3600.0
# Set on a test whose own turn has the world alone: its namespace's clean-up shares the world.
_OWN_LONE_TURN = pytest.StashKey[bool]()


def _shared_dir() -> Path | None:
    value = os.environ.get(shared_world.DIR_ENV)
    return Path(value) if value else None


_host: shared_world.WorldHost | None = None
_turns: shared_world.Turns | None = None


def pytest_configure(config: pytest.Config) -> None:
    """In the xdist controller of a run that asks for one shared world: start it (in the
    background, while the workers collect) and tell the workers where it is."""
    global _host
    if (
        os.environ.get(shared_world.REQUEST_ENV) != "1"
        or not getattr(config.option, "numprocesses", None)
        or hasattr(config, "workerinput")
        or find_binaries() is None
        or os.geteuid() != 0
        or netns_supported() is not None
    ):
        return
    directory = Path(tempfile.mkdtemp(prefix="kvgate-shared-world-"))
    _host = shared_world.WorldHost(directory)
    _host.start()
    os.environ[shared_world.DIR_ENV] = str(directory)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _host
    if _host is not None:
        host, _host = _host, None
        started = time.monotonic()
        host.stop()
        print(f"\nMEASURED shared world stopped in {time.monotonic() - started:.1f}s")
        os.environ.pop(shared_world.DIR_ENV, None)


def _alone_names(item: pytest.Item) -> tuple[str, ...]:
    return ALONE.get(Path(str(item.fspath)).name, ())


def _named_alone(item: pytest.Item) -> bool:
    """Does ``ALONE`` name ``item`` (or all of its file's tests)?"""
    names = _alone_names(item)
    return "*" in names or getattr(item, "originalname", item.name) in names


def _is_lone(item: pytest.Item) -> bool:
    """Does ``item`` have the shared world alone (``ALONE``, ``MODULE_ALONE``, the ``lws``
    fixture)?"""
    return (
        _named_alone(item)
        or Path(str(item.fspath)).name in MODULE_ALONE
        or "lws" in getattr(item, "fixturenames", ())
    )


# The lone tests of this session and their files (collected alike on every worker). A lone test
# waits for the tests running when its turn comes, and the other workers idle meanwhile; so the
# files that hold no lone test start only once every lone test is done (``Turns.after_lone_tests``):
# first the lone tests one after another (with their own files' shared tests), then the rest
# side by side with nothing left to wait for.
_lone_tests: set[str] = set()
_files_with_lone: set[str] = set()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Check ``ALONE`` against the collected tests; in a shared world, start the files with a
    lone test first (their turns come while most files still wait to start), each group longest
    first. Tests keep their order inside a file."""
    collected: dict[str, set[str]] = defaultdict(set)
    for item in items:
        collected[Path(str(item.fspath)).name].add(getattr(item, "originalname", item.name))
    for file, names in ALONE.items():
        missing = [n for n in names if n != "*" and n not in collected[file]]
        if collected[file] and missing:
            raise pytest.UsageError(f"conftest.ALONE names tests {file} does not have: {missing}")
    if _shared_dir() is None:
        return
    _lone_tests.update(item.nodeid for item in items if _is_lone(item))
    _files_with_lone.update(str(item.fspath) for item in items if item.nodeid in _lone_tests)
    order = {id(item): i for i, item in enumerate(items)}

    def key(item: pytest.Item) -> tuple[int, int, int]:
        file = Path(str(item.fspath)).name
        has_alone = 0 if str(item.fspath) in _files_with_lone else 1
        return (has_alone, -EXPECTED_SECONDS.get(file, 20), order[id(item)])

    files_first: dict[str, int] = {}
    for item in items:
        files_first.setdefault(str(item.fspath), order[id(item)])
    items.sort(key=lambda it: (*key(it)[:2], files_first[str(it.fspath)], order[id(it)]))


def _turns_here() -> shared_world.Turns | None:
    global _turns
    directory = _shared_dir()
    if directory is None:
        return None
    if _turns is None:
        _turns = shared_world.Turns(directory)
    return _turns


@pytest.fixture(scope="module", autouse=True)
def _module_turn(request: pytest.FixtureRequest) -> Iterator[None]:
    """A file in ``MODULE_ALONE`` has the shared world alone for all of its tests."""
    turns = _turns_here()
    if turns is None or Path(str(request.node.fspath)).name not in MODULE_ALONE:
        yield
        return
    with turns.hold(alone=True) as waited:
        print(f"\nMEASURED waited {waited:.1f}s to have the world alone for {request.node.name}")
        yield


@pytest.fixture(autouse=True)
def _world_turn(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test of the shared world waits for its turn: shared, or alone (``ALONE``)."""
    turns = _turns_here()
    if turns is None or not _WORLD_FIXTURES & set(request.fixturenames):
        yield
        return
    alone = _named_alone(request.node)
    if str(request.node.fspath) not in _files_with_lone:
        waited = turns.after_lone_tests(_lone_tests, LONE_PHASE_TIMEOUT)
        if waited >= 1.0:
            print(f"\nMEASURED waited {waited:.1f}s for the lone tests to be done")
        request.node.user_properties.append(("turn_wait", waited))
    own = not turns.holding  # this hold takes the lock (not inside a module's or lws' lone turn)
    with turns.hold(alone=alone) as waited:
        request.node.stash[_OWN_LONE_TURN] = alone and own
        request.node.user_properties.append(("turn_wait", waited))
        if waited >= 1.0:
            kind = "alone" if alone else "shared"
            print(f"\nMEASURED waited {waited:.1f}s for a {kind} turn of the world")
        yield


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
    directory = _shared_dir()
    own = WorldConfig(extra_nodes=TEST_NODE_SPECS)
    with shared_world.attach(directory) if directory is not None else World(own) as w:
        up = getattr(w, "started_in", None) or time.monotonic() - started
        print(f"\nMEASURED world (cluster + kubelet + helm install) up in {up:.1f}s")
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
    ran groups are waited for first), so later modules see the world they always saw. In a
    shared world the module has it alone from here to its end (the upgrade restarts the
    operator every test uses)."""
    if controller_binary() is None:
        pytest.fail(
            "the LeaderWorkerSet controller is not built: run e2e/controlplane/build-lws.sh"
        )
    turns = _turns_here()
    with turns.hold(alone=True) if turns is not None else _no_turn() as waited:
        if waited >= 1.0:
            print(f"\nMEASURED waited {waited:.1f}s to have the world alone for LeaderWorkerSet")
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


@pytest.fixture(scope="module")
def prometheus(world: World, request: pytest.FixtureRequest) -> Iterator[Prometheus]:
    """A Prometheus server scraping the world with the chart's monitors and evaluating its
    rules (the module's ``PROMETHEUS_RULE_VALUES``), from the module's first test that asks for
    it to the module's end."""
    if server_binary() is None:
        if e2e_required_by(os.environ) is not None:
            pytest.fail(missing_server_reason())
        pytest.skip(missing_server_reason())
    values = dict(getattr(request.module, "PROMETHEUS_RULE_VALUES", {}))
    extra = tuple(getattr(request.module, "PROMETHEUS_EXTRA_MONITORS", ()))
    started = time.monotonic()
    with Prometheus(world.cluster, rule_values=values, extra_monitors=extra) as server:
        print(f"\nMEASURED Prometheus up in {time.monotonic() - started:.1f}s")
        yield server


@pytest.fixture(scope="module")
def metrics_adapter(world: World, prometheus: Prometheus) -> Iterator[PrometheusAdapter]:
    """prometheus-adapter serving ``custom.metrics.k8s.io`` from the module's ``prometheus``
    through the API server (its APIServices, Service, EndpointSlice and RBAC), so the world's
    HPA controller scales on the rules of docs/autoscaling/prometheus-adapter-rules.yaml; one
    per world at a time (a second module's waits for the first's end)."""
    if adapter_binary() is None:
        if e2e_required_by(os.environ) is not None:
            pytest.fail(missing_adapter_reason())
        pytest.skip(missing_adapter_reason())
    started = time.monotonic()
    with PrometheusAdapter(world.cluster, prometheus) as adapter:
        print(
            f"\nMEASURED prometheus-adapter up (APIServices Available) in "
            f"{time.monotonic() - started:.1f}s"
        )
        yield adapter


@contextlib.contextmanager
def _no_turn() -> Iterator[float]:
    yield 0.0


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
        turns = _turns_here()
        if turns is not None and request.node.stash.get(_OWN_LONE_TURN, False):
            turns.share_rest()  # the clean-up changes nothing the others see: they may start
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


_file_seconds: dict[str, float] = defaultdict(float)
_file_waited: dict[str, float] = defaultdict(float)
_file_span: dict[str, list[float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each file's seconds (its tests' setup, call and teardown, less the time they waited for
    a turn of the shared world) and wall span, for the terminal summary."""
    if _host is not None and report.when in ("teardown", "???"):  # "???": a crashed worker's
        shared_world.record_finished(_host.directory, report.nodeid)
    file = report.nodeid.split("::", 1)[0]
    _file_seconds[file] += report.duration
    if report.when == "setup":
        _file_waited[file] += sum(v for k, v in report.user_properties if k == "turn_wait")
    start, stop = getattr(report, "start", None), getattr(report, "stop", None)
    if start is not None and stop is not None:
        span = _file_span.setdefault(file, [start, stop])
        span[0], span[1] = min(span[0], start), max(span[1], stop)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _file_seconds or hasattr(terminalreporter.config, "workerinput"):
        return
    rows = sorted(_file_seconds, key=lambda f: -(_file_seconds[f] - _file_waited[f]))
    terminalreporter.section("MEASURED seconds per file")
    terminalreporter.write_line(f"{'seconds':>8} {'waited':>7} {'span':>7}  file")
    total = 0.0
    for file in rows:
        own = _file_seconds[file] - _file_waited[file]
        total += own
        span = _file_span.get(file)
        wall = f"{span[1] - span[0]:7.1f}" if span else "      -"
        terminalreporter.write_line(f"{own:8.1f} {_file_waited[file]:7.1f} {wall}  {file}")
    terminalreporter.write_line(f"{total:8.1f} {'':7} {'':7}  all files")


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile``: the real-SGLang files go to one worker, back to back
    (``kvgate_e2e.file_groups``); every other file is its own unit, as before."""
    if getattr(config.option, "dist", None) != "loadfile":
        return None
    from kvgate_e2e.file_groups import GroupedFileScheduling

    return GroupedFileScheduling(config, log)
