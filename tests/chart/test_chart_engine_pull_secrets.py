"""The chart's imagePullSecrets reach every engine pod (the guard sidecar and the model download
run the operator's image) through the operator's KVGATE_ENGINE_IMAGE_PULL_SECRETS, after the
ModelDeployment's own."""

from __future__ import annotations

import pytest
from factories.model_deployments import make_md
from helm_runner import Helm
from kvgate.cmd.cli import build_parser
from kvgate.kube.settings import OperatorSettings
from kvgate.objects import builders

ENV = "KVGATE_ENGINE_IMAGE_PULL_SECRETS"
APIS = ("admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",)


def _operator_env(helm: Helm, *sets: str) -> dict[str, str | None]:
    deployment = helm.template(*sets, api_versions=APIS).controller()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_the_charts_pull_secrets_reach_every_engine_pod_after_the_specs_own(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _operator_env(
        helm, "imagePullSecrets[0].name=kvgate-registry", "imagePullSecrets[1].name=mirror"
    )
    monkeypatch.setenv(ENV, env[ENV] or "")
    monkeypatch.setenv("KVGATE_NETWORK_POLICIES", "false")
    settings = OperatorSettings.from_args(build_parser().parse_args(["operator", "--no-webhook"]))
    guard = builders.Guard("kvgate:test", None, None, settings.engine_pull_secrets)
    md = make_md(decode__imagePullSecrets=[{"name": "team-registry"}, {"name": "mirror"}])
    for role, expected in (
        ("prefill", ["kvgate-registry", "mirror"]),
        ("decode", ["team-registry", "mirror", "kvgate-registry"]),
    ):
        pod = builders.deployment(md, "7c9d0e1f2a", role, replicas=1, guard=guard)
        secrets = pod["spec"]["template"]["spec"]["imagePullSecrets"]
        assert [s["name"] for s in secrets] == expected


def test_without_chart_pull_secrets_engine_pods_get_none(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "[]": an install without them, whose engine templates (and revisions) stay as they were.
    env = _operator_env(helm)
    assert env[ENV] == "[]"
    monkeypatch.setenv(ENV, "[]")
    monkeypatch.setenv("KVGATE_NETWORK_POLICIES", "false")
    settings = OperatorSettings.from_args(build_parser().parse_args(["operator", "--no-webhook"]))
    guard = builders.Guard("kvgate:test", None, None, settings.engine_pull_secrets)
    pod = builders.deployment(make_md(), "7c9d0e1f2a", "decode", replicas=1, guard=guard)
    assert "imagePullSecrets" not in pod["spec"]["template"]["spec"]
