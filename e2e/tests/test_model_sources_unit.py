"""Model sources in the e2e world (no cluster): the loopback kubelet mounts a claim of a local
PersistentVolume as that volume's directory, read-only when the pod says so, and the real-engine
scenario's ModelDeployment reads the tiny Llama from a claim."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kvgate.api.models import MODEL_MOUNT_PATH as KVGATE_MOUNT_PATH
from kvgate.api.models import ModelDeployment, Role
from kvgate.objects import builders
from kvgate_e2e.kubelet.api import ApiError
from kvgate_e2e.kubelet.mounts import (
    _MOUNT_SCRIPT,
    MountPoints,
    container_mounts,
    in_mount_namespace,
    read_only_targets,
)
from kvgate_e2e.kubelet.podspec import PodSpecError
from kvgate_e2e.kubelet.volumes import claim_path, link_claim, write_volumes
from kvgate_e2e.local_volumes import claim_bound, local_claim, volume_name
from kvgate_e2e.real_engine import MODEL_MOUNT_PATH, tiny_llama_md

# The mount script in its own namespaces echoing 'started': a shell, at once; ends a hung one.
MOUNT_SCRIPT_TIMEOUT = 30


class FakeApi:
    """The two reads claim_path makes, from a dict of paths."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.objects = objects

    async def get(self, path: str, params: Any = None) -> Any:
        if path not in self.objects:
            raise ApiError("GET", path, 404, "not found")
        return self.objects[path]


CLAIM_PATH = "/api/v1/namespaces/ns/persistentvolumeclaims/weights"


def bound(volume: str = "ns-weights", phase: str = "Bound") -> dict[str, Any]:
    return {"spec": {"volumeName": volume}, "status": {"phase": phase}}


def test_the_world_mounts_sources_where_kvgate_does() -> None:
    assert MODEL_MOUNT_PATH == KVGATE_MOUNT_PATH == "/models"


def test_a_local_volume_is_pre_bound_to_its_claim_on_one_node(tmp_path: Path) -> None:
    pv, pvc = local_claim("weights", "ns", tmp_path, "kvgate-real-0")
    assert pv["metadata"]["name"] == volume_name("ns", "weights") == "ns-weights"
    assert pv["spec"]["local"] == {"path": str(tmp_path)}
    assert pv["spec"]["claimRef"] == {"namespace": "ns", "name": "weights"}
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    (term,) = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["kvgate-real-0"]}
    ]
    assert pvc["spec"]["volumeName"] == "ns-weights"
    assert pvc["spec"]["accessModes"] == pv["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert claim_bound({"status": {"phase": "Bound"}}) and not claim_bound(None)


@pytest.mark.parametrize("kind", ["local", "hostPath"])
def test_a_bound_claim_resolves_to_its_volumes_directory(kind: str) -> None:
    api = FakeApi(
        {
            CLAIM_PATH: bound(),
            "/api/v1/persistentvolumes/ns-weights": {"spec": {kind: {"path": "/srv/w"}}},
        }
    )
    assert asyncio.run(claim_path(api, "ns", "weights")) == Path("/srv/w")  # type: ignore[arg-type]


def test_a_claim_not_bound_or_missing_or_on_network_storage_keeps_the_pod_waiting() -> None:
    pending = FakeApi({CLAIM_PATH: bound(phase="Pending")})
    with pytest.raises(PodSpecError, match="is not bound \\(phase Pending\\): waiting"):
        asyncio.run(claim_path(pending, "ns", "weights"))  # type: ignore[arg-type]
    with pytest.raises(ApiError):
        asyncio.run(claim_path(FakeApi({}), "ns", "weights"))  # type: ignore[arg-type]
    nfs = FakeApi(
        {
            CLAIM_PATH: bound(),
            "/api/v1/persistentvolumes/ns-weights": {"spec": {"nfs": {"path": "/x"}}},
        }
    )
    with pytest.raises(PodSpecError, match="neither local nor hostPath"):
        asyncio.run(claim_path(nfs, "ns", "weights"))  # type: ignore[arg-type]


def test_a_claim_is_linked_into_the_pods_volumes_and_removing_them_keeps_its_files(
    tmp_path: Path,
) -> None:
    data = tmp_path / "pv"
    (data / "tiny").mkdir(parents=True)
    (data / "tiny" / "config.json").write_text("{}")
    api = FakeApi(
        {
            CLAIM_PATH: bound(),
            "/api/v1/persistentvolumes/ns-weights": {"spec": {"local": {"path": str(data)}}},
        }
    )
    pod = {
        "metadata": {"namespace": "ns", "name": "p"},
        "spec": {"volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": "weights"}}]},
    }
    volumes = tmp_path / "pod" / "volumes"
    asyncio.run(write_volumes(api, pod, volumes))  # type: ignore[arg-type]
    assert (volumes / "model").is_symlink()
    assert (volumes / "model" / "tiny" / "config.json").read_text() == "{}"
    asyncio.run(write_volumes(api, pod, volumes))  # again, as on a retried set-up
    shutil.rmtree(volumes)  # what the kubelet does when the pod goes
    assert (data / "tiny" / "config.json").read_text() == "{}"


def test_a_volume_directory_missing_on_the_node_is_named(tmp_path: Path) -> None:
    with pytest.raises(PodSpecError, match="does not exist on this node"):
        link_claim(tmp_path / "volumes" / "model", tmp_path / "absent")


def test_read_only_mounts_are_the_ones_the_pod_marks_so() -> None:
    pod = {
        "spec": {
            "volumes": [
                {"name": "model", "persistentVolumeClaim": {"claimName": "w", "readOnly": True}},
                {"name": "cache", "persistentVolumeClaim": {"claimName": "c"}},
                {"name": "tls", "secret": {"secretName": "s"}},
                {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            ]
        }
    }
    container = {
        "volumeMounts": [
            {"name": "model", "mountPath": "/models"},
            {"name": "cache", "mountPath": "/cache"},
            {"name": "tls", "mountPath": "/tls", "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ]
    }
    assert read_only_targets(pod, container) == ["/models", "/tls"]


def test_read_only_targets_follow_the_bind_mounts_and_the_command_runs_after_them(
    tmp_path: Path,
) -> None:
    argv = in_mount_namespace(
        ["echo", "engine"], [("/src", "/models")], "/venv/bin", MountPoints(tmp_path), ["/models"]
    )
    script_args = argv[argv.index("kvgate-pod") + 1 :]
    assert script_args == ["/src", "/models", "--", "/models", "--", "echo", "engine"]


def test_the_mount_script_runs_the_command_even_where_a_read_only_remount_is_refused() -> None:
    # No bind mount, one read-only target that cannot be remounted (it does not exist): the
    # script says so and still runs the container's command (run without a mount namespace:
    # nothing is mounted).
    target = "/nonexistent/kvgate-test/models"
    done = subprocess.run(
        ["/bin/sh", "-c", _MOUNT_SCRIPT, "kvgate-pod", "--", target, "--", "echo", "started"],
        capture_output=True,
        text=True,
        timeout=MOUNT_SCRIPT_TIMEOUT,
    )
    assert done.returncode == 0 and done.stdout == "started\n", done
    assert f"kvgate-kubelet: cannot make {target} read-only" in done.stderr


def test_the_real_engine_md_reads_the_tiny_llama_from_its_claim(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"vocab_size": 384}')
    doc = tiny_llama_md("real", tmp_path, "real", claim="tiny-llama")
    model = doc["spec"]["model"]
    assert model["path"] == "/models"
    assert model["source"] == {"persistentVolumeClaim": {"claimName": "tiny-llama"}}
    assert model["config"] == {"vocab_size": 384}
    md = ModelDeployment.model_validate({**doc, "metadata": {"name": "real", "namespace": "ns"}})
    pod = builders.engine_pod_template(md, Role.PREFILL, "rev")
    (weights,) = [v for v in pod["spec"]["volumes"] if v["name"] == "model"]
    assert weights["persistentVolumeClaim"] == {"claimName": "tiny-llama", "readOnly": True}
    # Without a claim, the node's own path, as before.
    assert tiny_llama_md("real", tmp_path, "real")["spec"]["model"]["path"] == str(tmp_path)


def test_a_missing_host_path_source_never_leaves_a_file_where_a_directory_belongs(
    tmp_path: Path,
) -> None:
    """A hostPath DirectoryOrCreate volume whose directory does not exist yet is created, as the
    kubelet does, and its mountPath made a directory: before, the kubelet touched a *file* at
    the mountPath (``/models`` on the host), and every later pod mounting a directory there
    failed with "mount point is not a directory". What it creates goes when it leaves."""
    source, target = tmp_path / "node" / "models" / "llama", tmp_path / "container" / "models"
    pod = {
        "spec": {
            "volumes": [
                {"name": "model", "hostPath": {"path": str(source), "type": "DirectoryOrCreate"}}
            ]
        }
    }
    container = {"volumeMounts": [{"name": "model", "mountPath": str(target)}]}
    points = MountPoints(tmp_path / "registry")
    assert container_mounts(pod, container, tmp_path / "volumes", points) == [
        (str(source), str(target))
    ]
    assert source.is_dir() and target.is_dir()
    points.cleanup()
    assert not source.exists() and not target.exists()


def test_a_host_path_directory_that_is_missing_fails_the_container_not_the_node(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "nothing-here"
    pod = {
        "spec": {
            "volumes": [{"name": "model", "hostPath": {"path": str(missing), "type": "Directory"}}]
        }
    }
    container = {"volumeMounts": [{"name": "model", "mountPath": str(tmp_path / "models")}]}
    with pytest.raises(PodSpecError, match="is not a directory on the node"):
        container_mounts(pod, container, tmp_path / "volumes", MountPoints(tmp_path / "registry"))
    assert not (tmp_path / "models").exists()
