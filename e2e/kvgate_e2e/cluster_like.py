"""The cluster interface of the e2e harness: what the kubelet, the API reader, the invariant
sampler, the add-on servers (Prometheus, prometheus-adapter) and the LeaderWorkerSet controller
read of a running cluster. ``kvgate_e2e.cluster.Cluster`` has all of it; they take this protocol
instead of the class, and this is the only place it is written down."""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from kvgate_e2e.pki import PkiPaths


class ClusterLike(Protocol):
    @property
    def kubeconfig(self) -> Path: ...  # the admin kubeconfig, inside the network namespace

    @property
    def apiserver_url(self) -> str: ...  # the API server inside the network namespace

    @property
    def host_apiserver_url(self) -> str: ...  # the API server through the host relay

    @property
    def pki(self) -> PkiPaths: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def log_dir(self) -> Path: ...

    @property
    def netns_name(self) -> str: ...

    def add_pod_ip(self) -> ipaddress.IPv4Address: ...

    def release_pod_ip(self, addr: ipaddress.IPv4Address) -> None: ...

    def add_node_ip(self) -> ipaddress.IPv4Address: ...

    def popen_in_netns(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> subprocess.Popen[Any]: ...

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]: ...

    def forward(self, host: str, port: int) -> int: ...  # a host port relayed to host:port inside
