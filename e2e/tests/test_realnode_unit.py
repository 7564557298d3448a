"""The real node's configuration and machine-state helpers, without a node (no root needed)."""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path

import pytest
from kvgate_e2e.cluster import DEFAULT_POD_IPS
from kvgate_e2e.realnode import machine
from kvgate_e2e.realnode.config import (
    REAL_POD_CIDR,
    SANDBOX_IMAGE,
    KubeletSettings,
    RuntimePaths,
    cni_conflist,
    containerd_config,
    kubelet_config,
)

PATHS = RuntimePaths(
    root=Path("/run/w/root"),
    state=Path("/run/w/state"),
    socket=Path("/run/w/c.sock"),
    runc_root=Path("/run/w/runc"),
    runc=Path("/cache/bin/runc"),
    cni_bin=Path("/cache/cni/bin"),
    cni_conf=Path("/run/w/cni"),
    ipam=Path("/run/w/ipam"),
)


def test_containerd_keeps_its_state_under_the_run_dir_and_caps_oom_score_adj() -> None:
    config = tomllib.loads(containerd_config(PATHS))
    assert config["root"] == "/run/w/root" and config["state"] == "/run/w/state"
    assert config["grpc"]["address"] == "/run/w/c.sock"
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == SANDBOX_IMAGE
    assert cri["netns_mounts_under_state_dir"] is True
    # Without it every sandbox fails on this machine: root lacks CAP_SYS_RESOURCE.
    assert cri["restrict_oom_score_adj"] is True
    assert cri["cni"] == {"bin_dir": "/cache/cni/bin", "conf_dir": "/run/w/cni"}
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc == {"BinaryName": "/cache/bin/runc", "Root": "/run/w/runc", "SystemdCgroup": False}


def test_pods_of_real_nodes_get_addresses_the_loopback_kubelet_never_hands_out() -> None:
    conf = cni_conflist(REAL_POD_CIDR, PATHS.ipam)
    bridge = conf["plugins"][0]
    assert [p["type"] for p in conf["plugins"]] == ["bridge", "portmap", "loopback"]
    (subnet,) = bridge["ipam"]["ranges"][0]
    assert subnet == {"subnet": "198.18.240.0/20", "gateway": "198.18.240.1"}
    assert bridge["ipam"]["dataDir"] == "/run/w/ipam"
    first, last = DEFAULT_POD_IPS
    assert ipaddress.IPv4Network("198.18.0.0/15").supernet_of(REAL_POD_CIDR)
    assert last < REAL_POD_CIDR.network_address and first not in REAL_POD_CIDR


def test_kubelet_runs_on_cgroup_v1_in_the_worlds_own_cgroup_root() -> None:
    settings = KubeletSettings(
        node_ip=ipaddress.IPv4Address("198.18.0.11"),
        cgroup_root="/kvgate-e2e-abcd",
        runtime_socket=PATHS.socket,
        pod_logs=Path("/run/w/pod-logs"),
        ca_cert=Path("/run/w/ca.crt"),
        serving_cert=Path("/run/w/kubelet.crt"),
        serving_key=Path("/run/w/kubelet.key"),
        cluster_domain="cluster.local",
    )
    config = kubelet_config(settings)
    assert config["failCgroupV1"] is False and config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == "/kvgate-e2e-abcd"
    assert config["containerRuntimeEndpoint"] == "unix:///run/w/c.sock"
    assert config["address"] == "198.18.0.11" and config["readOnlyPort"] == 0
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["podLogsDir"] == "/run/w/pod-logs"


MOUNTINFO = """\
25 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 25 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:8 - tmpfs tmpfs ro,mode=755
27 26 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw
28 26 0:25 / /sys/fs/cgroup/systemd rw,nosuid shared:10 - cgroup cgroup rw,xattr,name=systemd
29 26 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:11 - cgroup cgroup rw,cpu,cpuacct
30 26 0:27 / /sys/fs/cgroup/memory rw,nosuid shared:12 - cgroup cgroup rw,memory
31 29 0:28 / /tmp/x/sys/fs/cgroup/memory rw shared:13 - cgroup cgroup rw,memory
"""


def test_every_mounted_cgroup_hierarchy_is_found_and_nothing_else() -> None:
    found = machine.cgroup_hierarchies(MOUNTINFO)
    assert [p.name for p in found] == ["cpu,cpuacct", "memory", "systemd", "unified"]


def test_reaping_a_run_dir_without_a_real_node_does_nothing(tmp_path: Path) -> None:
    assert machine.reap_run_dir(tmp_path) == []


def test_the_reaper_removes_the_mount_points_a_dead_node_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(machine, "OWNER_DIR", tmp_path / "owners")
    monkeypatch.setattr(machine, "SYSCTLS_FILE", tmp_path / "owners" / "sysctls.json")
    monkeypatch.setattr(machine, "CGROUP_MOUNTS", tmp_path / "no-cgroups")
    made = tmp_path / "var" / "lib" / "kubelet"
    made.mkdir(parents=True)
    record = machine.NodeRecord("kvgate-e2e-dead", "kvgate-e2e-dead", "", (str(made),))
    (tmp_path / "run").mkdir()
    machine.record_node(tmp_path / "run", record)
    assert machine.reap_run_dir(tmp_path / "run") == []
    assert not made.exists()
    assert machine.live_nodes() == []
