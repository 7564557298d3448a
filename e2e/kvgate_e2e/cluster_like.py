"""What the harness reads of a running cluster: ``kvgate_e2e.cluster.Cluster`` has all of it; the
kubelet, the API reader and the invariant sampler take this protocol instead of the class."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Protocol

from kvgate_e2e.pki import PkiPaths


class ClusterLike(Protocol):
    @property
    def kubeconfig(self) -> Path: ...  # the admin kubeconfig, inside the network namespace

    @property
    def host_apiserver_url(self) -> str: ...  # the API server through the host relay

    @property
    def pki(self) -> PkiPaths: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def netns_name(self) -> str: ...

    def add_pod_ip(self) -> ipaddress.IPv4Address: ...

    def release_pod_ip(self, addr: ipaddress.IPv4Address) -> None: ...

    def add_node_ip(self) -> ipaddress.IPv4Address: ...
