"""Pod hostnames for the loopback kubelet's pods: one hosts file, bind-mounted at ``/etc/hosts``.

The world has no cluster DNS. What a pod needs from it here is the name a headless Service gives
a pod with ``spec.hostname`` and ``spec.subdomain`` (StatefulSet pods, so LeaderWorkerSet groups):
``<hostname>.<subdomain>.<namespace>.svc.<cluster domain>``, which a pod usually reaches through
its resolv.conf search list as ``<hostname>.<subdomain>.<namespace>`` (LWS's
``LWS_LEADER_ADDRESS``). The kubelet keeps one hosts file listing, for every pod it runs with both
fields, its pod IP under those names (the host's own ``/etc/hosts`` first), and each container of
such a pod sees it at ``/etc/hosts`` in its mount namespace (pods without a subdomain keep the
host's file: no pod of theirs can be named, and the rest of the world is left as it was).
The file is rewritten in place (same inode, so
the bind mounts see each change); glibc reads it on every lookup, so a worker that starts before
its leader has an address resolves it once the leader's pod is running, as a real worker retries
until DNS answers. Only pods' own names are served: no Service names (clients here use ClusterIPs)
and no names for pods without a subdomain (Kubernetes publishes none either).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HEADER = "# kvgate e2e loopback kubelet: pod hostnames (kvgate_e2e.kubelet.hosts)\n"


def pod_host_names(pod: Mapping[str, Any], cluster_domain: str = "cluster.local") -> list[str]:
    """The names a pod is reachable by through its headless Service (pure); none without both
    ``spec.hostname`` and ``spec.subdomain``."""
    spec = pod.get("spec") or {}
    hostname, subdomain = spec.get("hostname"), spec.get("subdomain")
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    if not hostname or not subdomain:
        return []
    short = f"{hostname}.{subdomain}.{namespace}"
    return [f"{short}.svc.{cluster_domain}", f"{short}.svc", short]


def render_hosts(base: str, entries: Mapping[str, tuple[str, list[str]]]) -> str:
    """The file: ``base`` (the host's hosts file), then one line per pod, sorted by pod key."""
    lines = [base.rstrip("\n") + "\n" if base.strip() else "127.0.0.1 localhost\n", HEADER]
    for key in sorted(entries):
        ip, names = entries[key]
        if names:
            lines.append(f"{ip} {' '.join(names)}  # {key}\n")
    return "".join(lines)


class PodHosts:
    """The kubelet's hosts file; ``add``/``remove`` rewrite it in place (thread-safe)."""

    def __init__(self, path: Path, base: Path = Path("/etc/hosts")) -> None:
        self.path = path
        try:
            self._base = base.read_text()
        except OSError:
            self._base = ""
        self._entries: dict[str, tuple[str, list[str]]] = {}
        self._lock = threading.Lock()
        # The kubelet's run dir may not exist yet (pods' dirs are made as they start): without
        # this the first write failed and took the whole kubelet down with it.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write()

    def add(self, key: str, ip: str, names: list[str]) -> None:
        if not names:
            return
        with self._lock:
            self._entries[key] = (ip, names)
            self._write()

    def remove(self, key: str) -> None:
        with self._lock:
            if self._entries.pop(key, None) is not None:
                self._write()

    def _write(self) -> None:
        text = render_hosts(self._base, self._entries)
        with self.path.open("a+") as f:  # same inode: the containers' bind mounts see it
            f.seek(0)
            f.truncate()
            f.write(text)
