"""The chart gives the operator its own image as the engine pods' guard image
(KVGATE_GUARD_IMAGE), however the image is pinned, and the guard's resources (guard.resources,
KVGATE_GUARD_RESOURCES) as the operator reads them."""

from __future__ import annotations

import json

import pytest
import yaml
from factories.model_deployments import make_md
from helm_runner import CHART, Helm
from kvgate.api.models import Role
from kvgate.cmd.cli import build_parser
from kvgate.kube.settings import OperatorSettings
from kvgate.objects import builders

ENV = "KVGATE_GUARD_IMAGE"
APIS = ("admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",)
DIGEST = "sha256:" + "ab" * 32
APP_VERSION = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


@pytest.mark.parametrize(
    ("sets", "image"),
    [
        ((), f"ghcr.io/kvgate/kvgate-operator:{APP_VERSION}"),
        (("image.tag=9.9.9",), "ghcr.io/kvgate/kvgate-operator:9.9.9"),
        (
            ("image.repository=registry.local:5000/acme/kvgate", f"image.digest={DIGEST}"),
            f"registry.local:5000/acme/kvgate@{DIGEST}",
        ),
    ],
)
def test_the_guard_image_is_the_operators_own_image(
    helm: Helm, sets: tuple[str, ...], image: str
) -> None:
    deployment = helm.template(*sets, api_versions=APIS).controller()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[ENV] == container["image"] == image


def _guard_resources_env(helm: Helm, *sets: str) -> str:
    deployment = helm.template(*sets, api_versions=APIS).controller()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    value: str = {e["name"]: e.get("value") for e in container["env"]}["KVGATE_GUARD_RESOURCES"]
    return value


def test_the_default_guard_resources_are_the_builders_own(helm: Helm) -> None:
    # Equal, so that installing or upgrading to a chart that passes them restarts no engine.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["guard"]["resources"] == builders.GUARD_RESOURCES
    assert json.loads(_guard_resources_env(helm)) == builders.GUARD_RESOURCES


def test_guard_resources_reach_every_engine_pods_sidecar(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = _guard_resources_env(
        helm, "guard.resources.requests.memory=96Mi", "guard.resources.limits.memory=256Mi"
    )
    monkeypatch.setenv("KVGATE_GUARD_RESOURCES", raw)
    monkeypatch.setenv("KVGATE_NETWORK_POLICIES", "false")
    settings = OperatorSettings.from_args(build_parser().parse_args(["operator", "--no-webhook"]))
    guard = builders.Guard("kvgate:test", None, settings.guard_resources)
    sidecar = builders.guard_container(make_md(), Role.PREFILL, "7c9d0e1f2a", guard)
    assert sidecar["resources"] == {
        "requests": {"cpu": "10m", "memory": "96Mi"},
        "limits": {"memory": "256Mi"},
    }
