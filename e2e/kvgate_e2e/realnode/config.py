"""The real node's configuration files, from plain values (pure: no I/O).

containerd 1.6's CRI plugin, the CNI network that gives pods addresses on a bridge in the
world's network namespace, and the kubelet's ``KubeletConfiguration``. Why each unusual setting
is there is said beside it; docs/testing.md has the story.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Pods of real nodes get addresses from this block of the world's 198.18.0.0/15; the loopback
# kubelet's pod addresses stop below it (kvgate_e2e.cluster.DEFAULT_POD_IPS).
REAL_POD_CIDR = ipaddress.IPv4Network("198.18.240.0/20")
BRIDGE = "kvgate0"  # inside the world's network namespace, so a fixed name collides with nothing
CNI_NETWORK = "kvgate-e2e"
SANDBOX_IMAGE = "localhost/kvgate-e2e/pause:1"


@dataclass(frozen=True)
class RuntimePaths:
    """Where one real node's containerd keeps everything (all under the world's run dir)."""

    root: Path
    state: Path
    socket: Path
    runc_root: Path
    runc: Path
    cni_bin: Path
    cni_conf: Path
    ipam: Path


def containerd_config(paths: RuntimePaths) -> str:
    """containerd 1.6's config: its CRI plugin on, state under the run dir, runc from the cache."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    runc = f"{cri}.containerd.runtimes.runc"
    return "\n".join(
        [
            "version = 2",
            f'root = "{paths.root}"',
            f'state = "{paths.state}"',
            "[grpc]",
            f'  address = "{paths.socket}"',
            "[ttrpc]",
            f'  address = "{paths.socket}.ttrpc"',
            "[metrics]",
            '  address = ""',
            f"[{cri}]",
            f'  sandbox_image = "{SANDBOX_IMAGE}"',
            # Pod network namespaces are pinned under the state dir, not /run/netns.
            "  netns_mounts_under_state_dir = true",
            # This machine's root lacks CAP_SYS_RESOURCE (CapBnd 0x1fffeffffff), so no process
            # may lower an oom_score_adj: runc failed every sandbox writing the kubelet's -998
            # ("can't get final child's PID from pipe: EOF"). containerd then caps the values
            # the kubelet asks for at its own (0).
            "  restrict_oom_score_adj = true",
            '  stream_server_address = "127.0.0.1"',
            "  tolerate_missing_hugetlb_controller = true",
            f"[{cri}.cni]",
            f'  bin_dir = "{paths.cni_bin}"',
            f'  conf_dir = "{paths.cni_conf}"',
            f"[{runc}]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{runc}.options]",
            f'  BinaryName = "{paths.runc}"',
            f'  Root = "{paths.runc_root}"',
            "  SystemdCgroup = false",
            "",
        ]
    )


def cni_conflist(subnet: ipaddress.IPv4Network, ipam_dir: Path) -> dict[str, Any]:
    """A bridge in the world's namespace with the subnet's first address as the pods' gateway:
    the API server, kube-proxy and the tests reach pod addresses through it."""
    gateway = subnet.network_address + 1
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(subnet), "gateway": str(gateway)}]],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "loopback"},
        ],
    }


def cni_conflist_text(subnet: ipaddress.IPv4Network, ipam_dir: Path) -> str:
    return json.dumps(cni_conflist(subnet, ipam_dir), indent=2) + "\n"


@dataclass(frozen=True)
class KubeletSettings:
    node_ip: ipaddress.IPv4Address
    cgroup_root: str
    runtime_socket: Path
    pod_logs: Path
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    cluster_domain: str
    cluster_dns: ipaddress.IPv4Address | None = None


def kubelet_config(s: KubeletSettings) -> dict[str, Any]:
    """The ``KubeletConfiguration`` of a real node on this cgroup v1 machine."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # cgroup v1 (hybrid) here: 1.35+ refuses it unless told not to, and logs a warning.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        # The world's own cgroup subtree, removed at teardown (never the machine's /kubepods).
        "cgroupRoot": s.cgroup_root,
        "cgroupsPerQOS": True,
        "failSwapOn": False,
        # The kubelet sets six kernel sysctls (machine-wide); the world restores them.
        "protectKernelDefaults": False,
        "containerRuntimeEndpoint": f"unix://{s.runtime_socket}",
        "podLogsDir": str(s.pod_logs),
        "address": str(s.node_ip),
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 0,
        "tlsCertFile": str(s.serving_cert),
        "tlsPrivateKeyFile": str(s.serving_key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(s.ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": s.cluster_domain,
        "clusterDNS": [str(s.cluster_dns)] if s.cluster_dns is not None else [],
        # No eviction and no image garbage collection: the world's disk and memory belong to
        # the machine, and an imported image cannot be pulled back.
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "enforceNodeAllocatable": [],
        "localStorageCapacityIsolation": False,
        "serializeImagePulls": False,
        "nodeStatusReportFrequency": "10s",
    }
