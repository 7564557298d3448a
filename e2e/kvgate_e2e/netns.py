"""A private Linux network namespace for one e2e run, and ways to reach into it.

The whole e2e world (etcd, control plane, kube-proxy, loopback kubelet and its pods) runs inside a
network namespace created per run (``ip netns add kvgate-e2e-<random>``). Inside it only ``lo``
exists; pod and node addresses from 198.18.0.0/15 (RFC 2544 benchmarking range, never routed) are
added to ``lo`` as /32s, and the Service CIDR is routed to ``lo`` so kube-proxy's iptables DNAT
rules can rewrite ClusterIP connections. Nothing can leave the namespace: it has no other link.

The test process itself stays in the host namespace. It reaches into the private one in two ways:

* child processes: ``NetNamespace.exec_argv(argv)`` prefixes ``ip netns exec <ns>``;
* sockets: ``NetNamespace.connect(host, port)`` returns a TCP socket *created inside* the
  namespace. A socket's network namespace is fixed when it is created, and ``setns(2)`` with
  ``CLONE_NEWNET`` changes only the calling thread, so one dedicated thread joins the namespace
  and creates sockets for everyone else; no other thread of the test process is affected.
  ``TcpRelay`` builds on that: it listens on 127.0.0.1 (host side, ephemeral port) and pipes each
  connection to an address inside the namespace, so ordinary clients (the ``kubernetes`` Python
  client, ``requests``) work unchanged against a host-side URL.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import ipaddress
import json
import os
import queue
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

from kvgate_e2e.realnode import machine as realnode_machine

CLONE_NEWNET = 0x40000000
NETNS_RUN_DIR = Path("/run/netns")
OWNER_DIR = Path("/run/kvgate-e2e")
NAME_PREFIX = "kvgate-e2e-"
IP_COMMAND_TIMEOUT = 30  # one ip command (this module's, the kubelet's): at once; ends a hung one
# The namespace's socket thread starting, or making one socket for a caller: at once.
SOCKET_THREAD_TIMEOUT = 10
THREAD_STOP_TIMEOUT = 5  # a socket or relay thread ending once told to stop (a daemon thread)
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")


def enter_netns_thread(path: Path) -> None:
    """Move the calling thread (only) into the network namespace at ``path`` (``setns(2)`` with
    ``CLONE_NEWNET``); sockets it creates from then on, and processes it starts, live there."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


class NetnsError(RuntimeError):
    """Creating, changing or deleting the network namespace failed."""


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        list(argv), capture_output=True, text=True, check=False, timeout=IP_COMMAND_TIMEOUT
    )
    if check and proc.returncode != 0:
        raise NetnsError(
            f"`{' '.join(argv)}` failed with exit code {proc.returncode}: {proc.stderr.strip()}"
        )
    return proc


def netns_supported() -> str | None:
    """Return None if this process can create network namespaces, else the reason it can't."""
    if os.geteuid() != 0:
        return "creating a network namespace needs root (ip netns add); run the e2e tier as root"
    try:
        _run(["ip", "-V"])
    except (OSError, NetnsError) as exc:
        return f"iproute2 `ip` is not usable: {exc}"
    return None


def list_namespaces() -> list[str]:
    """Names of all named network namespaces (``ip netns list``)."""
    out = _run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _start_time(pid: int) -> str | None:
    """Process start time (clock ticks since boot) from /proc, to tell a PID apart from reuse."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner_alive(owner: dict[str, object]) -> bool:
    pid = owner.get("pid")
    return isinstance(pid, int) and _start_time(pid) == owner.get("start")


def reap_stale_namespaces() -> list[str]:
    """Delete ``kvgate-e2e-*`` namespaces (and their processes and run dirs) whose creating
    process has died without cleaning up, e.g. a test run killed by a CI timeout.

    Only namespaces with an owner record in ``/run/kvgate-e2e`` whose owner is gone are touched,
    so concurrent runs on the same machine are left alone. Returns the names reaped.
    """
    reaped: list[str] = []
    if not OWNER_DIR.is_dir():
        return reaped
    for record in sorted(OWNER_DIR.glob(f"{NAME_PREFIX}*.json")):
        try:
            owner = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if _owner_alive(owner):
            continue
        ns = NetNamespace(record.stem)
        ns._created = ns.name in list_namespaces()
        with contextlib.suppress(NetnsError):
            ns.delete()
        run_dir = owner.get("run_dir")
        if isinstance(run_dir, str) and run_dir:
            # A real node's containers (in pod network namespaces), cgroups and sysctls.
            for problem in realnode_machine.reap_run_dir(Path(run_dir)):
                print(f"kvgate-e2e: reaping {ns.name}: {problem}")
            shutil.rmtree(run_dir, ignore_errors=True)
        record.unlink(missing_ok=True)
        reaped.append(ns.name)
    return reaped


class _SocketFactory:
    """One thread that has joined the namespace and creates sockets there on request."""

    def __init__(self, netns_path: Path) -> None:
        self._requests: queue.Queue[Future[socket.socket] | None] = queue.Queue()
        self._ready: Future[None] = Future()
        self._path = netns_path
        self._thread = threading.Thread(
            target=self._serve, name=f"netns-sockets-{netns_path.name}", daemon=True
        )
        self._thread.start()
        self._ready.result(timeout=SOCKET_THREAD_TIMEOUT)

    def _serve(self) -> None:
        try:
            enter_netns_thread(self._path)
        except BaseException as exc:
            self._ready.set_exception(exc)
            return
        self._ready.set_result(None)
        while True:
            req = self._requests.get()
            if req is None:
                return
            try:
                req.set_result(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            except BaseException as exc:
                req.set_exception(exc)

    def new_socket(self) -> socket.socket:
        fut: Future[socket.socket] = Future()
        self._requests.put(fut)
        return fut.result(timeout=SOCKET_THREAD_TIMEOUT)

    def close(self) -> None:
        self._requests.put(None)
        self._thread.join(timeout=THREAD_STOP_TIMEOUT)


class NetNamespace:
    """A named network namespace owned by this process: created on ``create()``, gone after
    ``delete()`` together with every process still inside it."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or f"{NAME_PREFIX}{secrets.token_hex(4)}"
        if not _NAME_RE.match(self.name):
            raise ValueError(f"invalid network namespace name {self.name!r}")
        self._sockets: _SocketFactory | None = None
        self._created = False

    @property
    def path(self) -> Path:
        return NETNS_RUN_DIR / self.name

    @property
    def _owner_record(self) -> Path:
        return OWNER_DIR / f"{self.name}.json"

    def record_owner(self, run_dir: Path | None = None) -> None:
        """Note this process (and the run dir) as owner so ``reap_stale_namespaces`` can clean
        up if we die without deleting the namespace."""
        OWNER_DIR.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        record = {"pid": pid, "start": _start_time(pid), "run_dir": str(run_dir or "")}
        self._owner_record.write_text(json.dumps(record))

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed so that it runs inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def create(self) -> None:
        """Create the namespace, bring ``lo`` up."""
        if self.name in list_namespaces():
            raise NetnsError(f"network namespace {self.name} already exists")
        self.record_owner()
        _run(["ip", "netns", "add", self.name])
        self._created = True
        _run(self.exec_argv(["ip", "link", "set", "lo", "up"]))

    def add_address(self, addr: ipaddress.IPv4Address) -> None:
        """Add ``addr``/32 to the namespace's ``lo``."""
        _run(self.exec_argv(["ip", "addr", "add", f"{addr}/32", "dev", "lo"]))

    def del_address(self, addr: ipaddress.IPv4Address) -> None:
        _run(self.exec_argv(["ip", "addr", "del", f"{addr}/32", "dev", "lo"]), check=False)

    def route_to_lo(self, cidr: ipaddress.IPv4Network) -> None:
        """Route ``cidr`` to ``lo``: connects to such addresses then reach iptables' nat OUTPUT
        chain (where kube-proxy DNATs ClusterIPs) instead of failing with ENETUNREACH."""
        _run(self.exec_argv(["ip", "route", "add", str(cidr), "dev", "lo"]))

    def pids(self) -> list[int]:
        """PIDs of processes whose network namespace is this one."""
        if not self._created:
            return []
        proc = _run(["ip", "netns", "pids", self.name], check=False)
        # Never this process: a thread of ours may have setns-ed in (and if the main thread did,
        # `ip netns pids` lists us); we must not signal ourselves.
        return [int(p) for p in proc.stdout.split() if p.isdigit() and int(p) != os.getpid()]

    def connect(self, host: str, port: int, timeout: float = 5.0) -> socket.socket:
        """A TCP connection to ``host:port`` as seen from inside the namespace."""
        if self._sockets is None:
            self._sockets = _SocketFactory(self.path)
        sock = self._sockets.new_socket()
        try:
            sock.settimeout(timeout)
            sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return sock

    def kill_all(self, grace: float = 5.0) -> None:
        """SIGTERM every process left in the namespace, then SIGKILL survivors after ``grace``.

        Every process in this namespace was started by this run (the namespace is private and was
        created by us), so signalling them by PID is safe.
        """
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.1)

    def delete(self) -> None:
        """Kill what is left inside, close our sockets thread, delete the namespace."""
        if self._sockets is not None:
            self._sockets.close()
            self._sockets = None
        if not self._created:
            return
        self.kill_all()
        proc = _run(["ip", "netns", "del", self.name], check=False)
        if proc.returncode != 0 and self.name in list_namespaces():
            raise NetnsError(f"could not delete network namespace {self.name}: {proc.stderr}")
        self._created = False
        self._owner_record.unlink(missing_ok=True)


class TcpRelay:
    """Listens on 127.0.0.1:<ephemeral> in the host namespace and pipes every connection to
    ``target`` inside the namespace (one thread per direction; plenty for test traffic)."""

    def __init__(self, connect: Callable[[], socket.socket], name: str = "relay") -> None:
        self._connect = connect
        self._name = name
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name=name, daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                ready, _, _ = select.select([self._listener], [], [], 0.2)
                if not ready:
                    continue
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(client,), name=f"{self._name}-conn", daemon=True
            ).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = self._connect()
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        with self._lock:
            self._conns.update((client, upstream))
        back = threading.Thread(target=self._pipe, args=(upstream, client), daemon=True)
        back.start()
        self._pipe(client, upstream)
        back.join()
        with self._lock:
            self._conns.difference_update((client, upstream))
        client.close()
        upstream.close()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError as exc:
            if exc.errno not in (errno.EBADF, errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN, None):
                raise
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self._thread.join(timeout=THREAD_STOP_TIMEOUT)
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def temporary_namespace(name: str | None = None) -> Iterator[NetNamespace]:
    """``with temporary_namespace() as ns:`` creates a namespace and always deletes it."""
    ns = NetNamespace(name)
    try:
        ns.create()
        yield ns
    finally:
        ns.delete()
