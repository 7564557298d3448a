"""One e2e world shared by the pytest-xdist workers of a run (`make e2e`).

The control plane mostly waits, and every e2e test works in its own namespaces, so the tests of
several modules can run at once against ONE world instead of one after another (or against
several worlds, which doubles the control planes, operators and kube-proxies a 2-core machine
carries). How:

* ``WorldHost`` runs in the xdist controller process (the ``pytest`` the user started; it only
  dispatches tests and reports): it starts the ``World`` in a thread while the workers collect,
  so the control plane, the loopback kubelet and every pod are its children, and it serves the
  few calls that must run where the world lives over a Unix socket in a root-only directory
  (``multiprocessing.connection``, with an authentication key in a 0600 file): the kubelet's
  methods (restart a container, change a node's GPU memory, a container's log path), restarting
  kube-apiserver, and LeaderWorkerSet on and off. It stops the world when the run ends.
* ``attach`` (in each worker) asks the host for the world's coordinates and returns a
  ``SharedWorld``: a ``World`` whose ``Cluster`` is the host's (same network namespace, run
  directory, PKI and API relay; kubectl and helm run from the worker, relays to pod addresses
  are the worker's own) and whose ``kubelet`` forwards to the host.
* ``Turns`` decides who may use the world when: a test that changes what every other test sees
  (stops the operator or the API server, upgrades the release, caps a node, lifts an admission
  policy) takes the world alone; every other test shares it. A writer-preferring
  reader-writer lock over two ``flock`` files: a test waiting to take the world alone stops new
  tests from starting, waits for the running ones, runs, and lets the others go on.
"""

from __future__ import annotations

import contextlib
import fcntl
import inspect
import os
import secrets
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection, Iterator
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any, cast

from kvgate_e2e.cluster import Cluster, ClusterError
from kvgate_e2e.kubelet.agent import KubeletThread, LoopbackKubelet
from kvgate_e2e.lws import LwsController
from kvgate_e2e.netns import NetNamespace
from kvgate_e2e.world import TEST_NODE_SPECS, World, WorldConfig, WorldError

DIR_ENV = "KVGATE_E2E_SHARED_WORLD_DIR"  # set by the host for its workers
REQUEST_ENV = "KVGATE_E2E_SHARED_WORLD"  # "1": the run asks for one shared world (make e2e)
SOCKET, KEY = "rpc.sock", "rpc.key"
STATE_TIMEOUT = 600.0  # how long a worker waits for the host's world to come up
CALL_TIMEOUT = 300.0  # the longest a host call may take (helm upgrade with LeaderWorkerSet)


class WorldHost:
    """The world of a run, in the xdist controller, and the calls its workers make on it."""

    def __init__(self, directory: Path, config: WorldConfig | None = None) -> None:
        self.directory = directory
        self.config = config or WorldConfig(progress=sys.stderr, extra_nodes=TEST_NODE_SPECS)
        self.world: World | None = None
        self.error: str | None = None
        self.started_in: float | None = None
        self._ready = threading.Event()
        self._listener: Listener | None = None
        self._lock = threading.Lock()  # one host call at a time changes the world
        self._closing = False

    def start(self) -> None:
        """Listen, and bring the world up in the background (``state`` waits for it)."""
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(mode=0o700, parents=True)
        key = secrets.token_bytes(32)
        key_path = self.directory / KEY
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        self._listener = Listener(str(self.directory / SOCKET), family="AF_UNIX", authkey=key)
        threading.Thread(target=self._accept, name="shared-world-rpc", daemon=True).start()
        threading.Thread(target=self._bring_up, name="shared-world-start", daemon=True).start()

    def _bring_up(self) -> None:
        started = time.monotonic()
        world = World(self.config)
        try:
            world.start()
        except BaseException:
            self.error = traceback.format_exc()
            with contextlib.suppress(Exception):
                world.stop()
        else:
            self.world = world
            self.started_in = time.monotonic() - started
        finally:
            self._ready.set()

    def stop(self) -> None:
        """Stop serving, then the world (uninstall, kubelet and its pods, control plane)."""
        self._closing = True
        if self._listener is not None:
            with contextlib.suppress(Exception):
                self._listener.close()
        self._ready.wait(STATE_TIMEOUT)
        if self.world is not None:
            self.world.stop()
            self.world = None
        shutil.rmtree(self.directory, ignore_errors=True)

    # ------------------------------------------------------------------ serving
    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closing:
            try:
                conn = self._listener.accept()
            except Exception:  # closed, or a client that failed authentication
                if self._closing:
                    return
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            try:
                op, args, kwargs = conn.recv()
            except (EOFError, OSError):
                return
            try:
                reply: tuple[str, Any] = ("ok", self.dispatch(op, *args, **kwargs))
            except BaseException as exc:
                reply = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            with contextlib.suppress(Exception):
                conn.send(reply)

    def _world(self) -> World:
        if not self._ready.wait(STATE_TIMEOUT):
            raise WorldError(f"the shared world did not come up in {STATE_TIMEOUT:.0f}s")
        if self.world is None:
            raise WorldError(f"the shared world failed to start:\n{self.error}")
        return self.world

    def dispatch(self, op: str, *args: Any, **kwargs: Any) -> Any:
        world = self._world()
        if op == "state":
            cluster = world.cluster
            return {
                "netns": cluster.netns_name,
                "run_dir": str(cluster.run_dir),
                "pki": cluster.pki,
                "api_url": cluster.host_apiserver_url,
                "cluster_config": cluster.config,
                "binaries": cluster.binaries,
                "world_config": WorldConfig(
                    operator_env=dict(world.config.operator_env),
                    helm_values=dict(world.config.helm_values),
                    start_timeout=world.config.start_timeout,
                    leaderworkerset=world.config.leaderworkerset,
                    extra_nodes=world.config.extra_nodes,
                    cluster=world.config.cluster,
                ),
                "started_in": self.started_in,
            }
        if op == "kubelet":
            name, *rest = args
            result = getattr(world.kubelet.kubelet, name)(*rest, **kwargs)
            if inspect.iscoroutine(result):
                result = world.kubelet.call(result, timeout=CALL_TIMEOUT)
            return result
        with self._lock:
            if op == "restart_apiserver":
                return world.cluster.restart_apiserver(**kwargs)
            if op == "component_pids":
                return world.cluster.component_pids()
            if op == "enable_leaderworkerset":
                world.enable_leaderworkerset()
                return None
            if op == "disable_leaderworkerset":
                world.disable_leaderworkerset()
                return None
        raise WorldError(f"unknown shared-world call {op!r}")


# ---------------------------------------------------------------------- the workers' side
class HostClient:
    """Calls on the ``WorldHost`` of ``directory`` (one connection per call)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._key = (directory / KEY).read_bytes()

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        with Client(str(self.directory / SOCKET), family="AF_UNIX", authkey=self._key) as conn:
            conn.send((op, args, kwargs))
            status, value = conn.recv()
        if status != "ok":
            raise WorldError(f"shared world: {op} failed on the host: {value}")
        return value


class AttachedCluster(Cluster):
    """The host's ``Cluster`` seen from a worker: its namespace, run directory, PKI and API relay.
    It starts and stops nothing of the control plane (only the worker's own relays); restarting
    kube-apiserver is a host call."""

    def __init__(self, host: HostClient, state: dict[str, Any]) -> None:
        super().__init__(state["cluster_config"], state["binaries"])
        self._host = host
        self.netns = NetNamespace(state["netns"])
        self._run_dir = Path(state["run_dir"])
        self._pki = state["pki"]
        self._api_url = str(state["api_url"])
        self._started = True

    @property
    def host_apiserver_url(self) -> str:
        return self._api_url

    def start(self) -> None:
        raise ClusterError("an attached cluster is started by its host")

    def stop(self) -> None:
        for relay in self._relays:
            with contextlib.suppress(Exception):
                relay.close()
        self._relays.clear()

    def restart_apiserver(self, *, down_seconds: float = 0.0, timeout: float = 90.0) -> float:
        return float(
            self._host.call("restart_apiserver", down_seconds=down_seconds, timeout=timeout)
        )

    def component_pids(self) -> dict[str, int]:
        return dict(self._host.call("component_pids"))


class _RemoteCall:
    """A coroutine method of the host's kubelet, asked for but not run yet (``call`` runs it)."""

    def __init__(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.name, self.args, self.kwargs = name, args, kwargs


class _RemoteKubeletMethods:
    """``world.kubelet.kubelet`` in a worker: a coroutine method gives a ``_RemoteCall`` for
    ``world.kubelet.call(...)`` (as the real one gives a coroutine); any other method runs on
    the host at once."""

    def __init__(self, host: HostClient) -> None:
        self._host = host

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(LoopbackKubelet, name, None)
        if not callable(method):
            raise AttributeError(f"the shared world's kubelet has no method {name!r}")
        if inspect.iscoroutinefunction(method):
            return lambda *args, **kwargs: _RemoteCall(name, args, kwargs)
        return lambda *args, **kwargs: self._host.call("kubelet", name, *args, **kwargs)


class RemoteKubelet:
    """``world.kubelet`` in a worker: ``call(world.kubelet.kubelet.<coroutine method>(...))``
    runs the method on the host's kubelet, as ``KubeletThread.call`` runs it on its loop."""

    def __init__(self, host: HostClient) -> None:
        self._host = host
        self.kubelet = _RemoteKubeletMethods(host)

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        if not isinstance(coro, _RemoteCall):
            raise TypeError("the shared world's kubelet runs only its own methods")
        return self._host.call("kubelet", coro.name, *coro.args, **coro.kwargs)


class SharedWorld(World):
    """The host's world, used from a worker: everything a test does through kubectl, helm, the
    API or a relay runs here; the kubelet, kube-apiserver restarts and LeaderWorkerSet are host
    calls. Stopping it closes only this worker's relays."""

    def __init__(self, host: HostClient, state: dict[str, Any]) -> None:
        super().__init__(state["world_config"])
        self._host = host
        self._cluster = AttachedCluster(host, state)
        self._remote_kubelet = RemoteKubelet(host)
        self.started_in: float | None = state.get("started_in")

    @property
    def kubelet(self) -> KubeletThread:
        return cast(KubeletThread, self._remote_kubelet)

    @property
    def lws(self) -> LwsController:
        raise WorldError("LeaderWorkerSet runs on the shared world's host")

    @property
    def leaderworkerset_running(self) -> bool:
        return self.config.leaderworkerset

    def __enter__(self) -> SharedWorld:
        return self  # up already: the host started it

    def start(self) -> None:
        raise WorldError("a shared world is started by its host")

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.stop()
        self._reader = None

    def enable_leaderworkerset(self) -> LwsController:
        self._host.call("enable_leaderworkerset")
        self.config.leaderworkerset = True
        return cast(LwsController, None)

    def disable_leaderworkerset(self) -> None:
        self._host.call("disable_leaderworkerset")
        self.config.leaderworkerset = False


def attach(directory: Path) -> SharedWorld:
    """The host's world (waits until it is up; raises ``WorldError`` if it failed)."""
    host = HostClient(directory)
    return SharedWorld(host, host.call("state"))


# ---------------------------------------------------------------------- turns
FINISHED = "finished-tests"  # one node id per line, appended by the xdist controller


def record_finished(directory: Path, nodeid: str) -> None:
    """Note that the test ``nodeid`` is over (its teardown reported, or its worker crashed)."""
    with open(directory / FINISHED, "a", encoding="utf-8") as out:
        out.write(nodeid + "\n")


class Turns:
    """Who uses the shared world: ``hold(alone=False)`` shares it with the other holders,
    ``hold(alone=True)`` waits until no one else holds it and keeps new holders out (they wait
    behind a waiting lone holder: writer preference). Reentrant within a process: inside a lone
    hold every hold is free; a lone hold inside a shared one is refused (it would wait for
    itself)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._gate = directory / "gate.lock"
        self._world = directory / "world.lock"
        self._mode: str | None = None
        self._held: int | None = None  # the world lock's descriptor while a turn holds it
        self.waited: float = 0.0  # seconds this process spent waiting for its turns

    def after_lone_tests(self, lone: Collection[str], timeout: float) -> float:
        """Wait until every test of ``lone`` has finished (``record_finished``), at most
        ``timeout`` seconds (then go on: the order of turns is an optimisation, not a rule);
        returns the seconds waited."""
        started = time.monotonic()
        done = self.directory / FINISHED
        while time.monotonic() - started < timeout:
            try:
                finished = set(done.read_text().splitlines())
            except FileNotFoundError:
                finished = set()
            if finished >= set(lone):
                break
            time.sleep(0.5)
        return time.monotonic() - started

    @property
    def holding(self) -> bool:
        """Does a turn of this process hold the world lock now (not a free inner hold)?"""
        return self._held is not None

    def share_rest(self) -> bool:
        """Share the world for the rest of this process's lone turn (its clean-up changes nothing
        the others see): other holders may start at once. False if no lone turn is held here."""
        if self._mode != "alone" or self._held is None:
            return False
        fcntl.flock(self._held, fcntl.LOCK_SH)  # converts the lock: waiting holders get theirs
        self._mode = "shared"
        return True

    @contextlib.contextmanager
    def hold(self, *, alone: bool) -> Iterator[float]:
        """Yields the seconds waited for this turn."""
        if self._mode == "alone" or (self._mode == "shared" and not alone):
            yield 0.0
            return
        if self._mode == "shared":
            raise WorldError("a test that shares the world cannot take it alone inside that turn")
        started = time.monotonic()
        gate = os.open(self._gate, os.O_RDWR | os.O_CREAT, 0o600)
        world = os.open(self._world, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(gate, fcntl.LOCK_EX)
            try:
                fcntl.flock(world, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)
            waited = time.monotonic() - started
            self.waited += waited
            self._mode = "alone" if alone else "shared"
            self._held = world
            try:
                yield waited
            finally:
                self._mode = None
                self._held = None
                fcntl.flock(world, fcntl.LOCK_UN)
        finally:
            os.close(world)
            os.close(gate)
