"""The operator builds pods from a role's pod fields, and never from a node directory among its
extraVolumes, even from a spec the webhook never saw (failurePolicy Ignore): InvalidSpec naming
the field, and nothing created."""

from __future__ import annotations

import kmock
from factories.kmock_world import NS, put_md, requests
from kvgate.controller.modeldeployment import Reconciler
from kvgate.controller.runtime import Runtime


async def test_a_stored_spec_with_a_host_path_extra_volume_builds_nothing(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    put_md(kmock, decode__extraVolumes=[{"name": "etc", "hostPath": {"path": "/etc"}}])
    assert await Reconciler(rt, NS, "llama").reconcile() is None
    assert [r for r in requests(kmock, "POST") if r.data.get("kind") == "Deployment"] == []
    (write,) = requests(kmock, "PATCH", "/status")
    (ready,) = write.data["status"]["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert ready["message"].startswith("spec.decode.extraVolumes[0].hostPath: a node directory")


async def test_the_pass_builds_engine_pods_with_the_roles_pod_fields(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    put_md(
        kmock,
        decode__priorityClassName="inference",
        decode__podLabels={"team": "search", "kvgate.io/role": "prefill"},
        router__resources={"requests": {"cpu": "100m"}},
    )
    await Reconciler(rt, NS, "llama").reconcile()
    built = {
        r.data["metadata"]["name"].rsplit("-", 1)[-1]: r.data["spec"]["template"]
        for r in requests(kmock, "POST")
        if r.data.get("kind") == "Deployment"
    }
    decode = built["decode"]
    assert decode["spec"]["priorityClassName"] == "inference"
    assert decode["metadata"]["labels"]["team"] == "search"
    assert decode["metadata"]["labels"]["kvgate.io/role"] == "decode"
    assert built["router"]["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "100m"}}
