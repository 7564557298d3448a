"""The operator never builds pods from a host path the cluster does not allow, even from a spec the
webhook never saw (failurePolicy Ignore) or admitted before the chart's hostPaths lists: the
ModelDeployment says InvalidSpec, naming the field, the path and the chart value, and nothing is
created (kvgate.admission.host_paths, checked again in the pass)."""

from __future__ import annotations

from dataclasses import replace

import kmock
from factories.kmock_world import NS, put_md, requests
from kvgate.admission.host_paths import HostPathPolicy
from kvgate.controller.modeldeployment import Reconciler
from kvgate.controller.runtime import Runtime


async def test_a_stored_spec_with_a_host_path_nobody_allowed_builds_nothing(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    put_md(kmock, model__source={"hostPath": {"path": "/etc", "type": "DirectoryOrCreate"}})
    assert await Reconciler(rt, NS, "llama").reconcile() is None
    assert [r for r in requests(kmock, "POST") if r.data.get("kind") == "Deployment"] == []
    (write,) = requests(kmock, "PATCH", "/status")
    (ready,) = write.data["status"]["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert ready["message"].startswith("spec.model.source.hostPath.path: /etc is not under")
    assert "hostPaths.modelPrefixes" in ready["message"]
    warnings = [r.data for r in requests(kmock, "POST", "/events")]
    assert [(e["type"], e["reason"]) for e in warnings] == [("Warning", "InvalidSpec")]


async def test_an_rdma_host_path_of_the_nodes_root_builds_nothing(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    put_md(kmock, engine__transfer={"backend": "mooncake", "rdma": {"hostPath": "/"}})
    assert await Reconciler(rt, NS, "llama").reconcile() is None
    assert [r for r in requests(kmock, "POST") if r.data.get("kind") == "Deployment"] == []
    (write,) = requests(kmock, "PATCH", "/status")
    (ready,) = write.data["status"]["conditions"]
    said = ready["message"]
    assert "spec.engine.transfer.rdma.hostPath: / is not an RDMA device directory" in said


async def test_a_host_path_under_the_operators_allowed_prefix_is_built(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    rt.settings = replace(rt.settings, host_paths=HostPathPolicy(model_prefixes=("/mnt/models",)))
    put_md(kmock, model__source={"hostPath": {"path": "/mnt/models/llama"}})
    await Reconciler(rt, NS, "llama").reconcile()
    built = [r.data for r in requests(kmock, "POST") if r.data.get("kind") == "Deployment"]
    engines = [d for d in built if not d["metadata"]["name"].endswith("-router")]
    assert len(engines) == 2
    for deployment in engines:
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        assert {"path": "/mnt/models/llama", "type": "Directory"} in [
            v.get("hostPath") for v in volumes
        ]
