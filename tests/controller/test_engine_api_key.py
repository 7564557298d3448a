"""The operator's probe authenticates to engines started with spec.engine.apiKeySecretRef: the
key comes from the ModelDeployment's Secret on every pass (a rotated key is picked up), and a
missing Secret or key makes the pod unverifiable with a message naming the field, never a probe
that cannot succeed."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import kmock
import pytest
from factories.fake_engine import FakeEngine, running
from factories.kmock_world import (
    controller_ref,
    declare_resources,
    put_deployment_and_replica_set,
)
from factories.model_deployments import NOW, md_doc
from kvgate.api.models import ModelDeployment
from kvgate.api.revision import revision_of
from kvgate.controller import engine_pods
from kvgate.controller.main import make_verify
from kvgate.controller.runtime import Runtime
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.settings import OperatorSettings
from kvgate.objects import builders
from kvgate_engine.verdict import ENGINE_UNAUTHORIZED

NS = "models"


class Secrets:
    def __init__(self, secrets: dict[str, dict[str, Any]]) -> None:
        self.secrets = secrets
        self.reads: list[tuple[str, str, str]] = []

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads.append((kind, namespace, name))
        return self.secrets.get(name)


def runtime(secrets: dict[str, dict[str, Any]], **engine: Any) -> Any:
    doc = md_doc(**{f"engine__{k}": v for k, v in engine.items()})
    return SimpleNamespace(mds={(NS, "llama"): doc}, api=Secrets(secrets))


POD = {"metadata": {"namespace": NS, "labels": {"kvgate.io/deployment": "llama"}}}
REF = {"name": "engine-key", "key": "token"}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def test_an_engine_without_an_api_key_is_probed_without_one() -> None:
    rt = runtime({})
    assert await engine_pods.engine_api_key(rt, POD) is None
    assert rt.api.reads == []  # no Secret read at all


async def test_the_key_is_read_from_the_secret_on_every_pass() -> None:
    rt = runtime({"engine-key": {"data": {"token": b64("s3cret\n")}}}, apiKeySecretRef=REF)
    assert await engine_pods.engine_api_key(rt, POD) == "s3cret"
    rt.api.secrets["engine-key"] = {"data": {"token": b64("rotated")}}
    assert await engine_pods.engine_api_key(rt, POD) == "rotated"
    assert rt.api.reads == [("Secret", NS, "engine-key")] * 2


@pytest.mark.parametrize(
    ("secrets", "says"),
    [
        ({}, "Secret models/engine-key does not exist"),
        ({"engine-key": {"data": {}}}, "has no non-empty UTF-8 value under the key 'token'"),
        ({"engine-key": {"data": {"token": "!!not base64"}}}, "has no non-empty UTF-8 value"),
        ({"engine-key": {"data": {"token": b64("  ")}}}, "has no non-empty UTF-8 value"),
    ],
)
async def test_a_missing_secret_or_key_makes_the_pod_unverifiable_naming_the_field(
    secrets: dict[str, dict[str, Any]], says: str
) -> None:
    result = await engine_pods.engine_api_key(runtime(secrets, apiKeySecretRef=REF), POD)
    assert isinstance(result, tuple)
    reason, message = result
    assert reason == ENGINE_UNAUTHORIZED
    assert message.startswith("spec.engine.apiKeySecretRef: Secret models/engine-key")
    assert says in message


# --- end to end through check_pod: the kmock API server and an engine that wants the key ---


def chain_with_key(km: kmock.KubernetesEmulator, port: int) -> dict[str, Any]:
    """The MD (with apiKeySecretRef), its decode Deployment and ReplicaSet, and an engine pod."""
    declare_resources(km)
    doc = md_doc(model__contextLength=131_072, engine__apiKeySecretRef=REF)
    doc["metadata"]["namespace"] = NS
    km.objects[km.resource("kvgate.io", "v1alpha1", "modeldeployments"), NS, "llama"] = doc
    md = ModelDeployment.model_validate(doc)
    rev = revision_of(md.spec)
    dep = builders.deployment(md, rev, "decode", replicas=1)
    name = dep["metadata"]["name"]
    put_deployment_and_replica_set(km, dep, "decode")
    template = dep["spec"]["template"]
    template["spec"]["containers"][0]["ports"][0]["containerPort"] = port
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **template["metadata"],
            "name": f"{name}-x2",
            "namespace": NS,
            "uid": "pod-uid-1",
            "ownerReferences": [controller_ref("ReplicaSet", f"{name}-7f", "rs-decode")],
        },
        "spec": template["spec"],
        "status": {
            "podIP": "127.0.0.1",
            "containerStatuses": [{"name": "engine", "ready": True, "restartCount": 0}],
            "conditions": [{"type": "ContainersReady", "status": "True"}],
        },
    }
    km.objects[km.resource("", "v1", "pods"), NS, pod["metadata"]["name"]] = pod
    return pod


@pytest.mark.parametrize("secret", [True, False])
async def test_an_engine_that_wants_its_key_is_verified_with_the_key_from_the_secret(
    kmock: kmock.KubernetesEmulator, secret: bool
) -> None:
    declare_resources(kmock)
    api = KubeApi(Credentials(server=str(kmock.url).rstrip("/")))
    settings = OperatorSettings(probe_timeout_seconds=2.0)
    rt = Runtime(api=api, settings=settings, verify=make_verify(settings), clock=lambda: NOW)
    try:
        async with running(FakeEngine("decode", 131_072, 200_000, api_key="s3cret")) as engine:
            pod = chain_with_key(kmock, engine.port)
            if secret:
                kmock.objects[kmock.resource("", "v1", "secrets"), NS, "engine-key"] = {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "engine-key", "namespace": NS},
                    "data": {"token": b64("s3cret")},
                }
            condition = await engine_pods.check_pod(rt, pod)
    finally:
        await rt.shutdown()
        await api.close()
    assert condition is not None
    if secret:
        assert (condition["status"], condition["reason"]) == ("True", "EngineVerified")
    else:
        assert (condition["status"], condition["reason"]) == ("False", ENGINE_UNAUTHORIZED)
        assert (
            "spec.engine.apiKeySecretRef: Secret models/engine-key does not exist"
            in (condition["message"])
        )
