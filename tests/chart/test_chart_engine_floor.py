"""The chart's engineVersionFloor reaches the operator (KVGATE_MIN_ENGINE_VERSION_FLOOR), and a
value that is not a version fails `helm template` before anything is installed."""

from __future__ import annotations

import pytest
import yaml
from helm_runner import CHART, Helm
from kvgate.admission.policy import ClusterPolicy
from kvgate.api.models import DEFAULT_MIN_ENGINE_VERSION

ENV = "KVGATE_MIN_ENGINE_VERSION_FLOOR"
# A Kubernetes the chart fully renders for (admissionPolicy needs this API).
APIS = ("admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",)


def _operator_env(helm: Helm, *sets: str) -> dict[str, object]:
    deployment = helm.template(*sets, api_versions=APIS).controller()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_default_floor_is_the_mission_default_and_reaches_the_operator(helm: Helm) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["engineVersionFloor"] == DEFAULT_MIN_ENGINE_VERSION == "0.5.22"
    assert _operator_env(helm)[ENV] == "0.5.22"


def test_a_raised_floor_reaches_the_operator_as_written(helm: Helm) -> None:
    assert _operator_env(helm, "engineVersionFloor=0.5.23")[ENV] == "0.5.23"


@pytest.mark.parametrize("value", ["0.5.23rc1", "1.0", "0.5.22.post1"])
def test_every_floor_the_schema_accepts_is_one_the_operator_accepts(helm: Helm, value: str) -> None:
    floor = _operator_env(helm, f"engineVersionFloor={value}")[ENV]
    assert isinstance(floor, str)
    ClusterPolicy(min_engine_version_floor=floor)  # raises when the operator would not start


@pytest.mark.parametrize("value", ["latest", "v0.5.22", "0.5.22; rm -rf /", ""])
def test_a_floor_that_is_not_a_version_fails_the_install_naming_the_value(
    helm: Helm, value: str
) -> None:
    result = helm.template_result(f"engineVersionFloor={value}", api_versions=APIS)
    assert result.returncode != 0
    assert "engineVersionFloor" in result.stderr and "does not match pattern" in result.stderr
