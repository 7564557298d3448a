"""The chart's estimator values reach the processes that use them: the measured reserve per GPU
product (estimator.gpuReservedGiBByProduct) both the webhook and the operator (admission and the
drift report), the optimistic-drift threshold the operator; the schema refuses what is no
measurement."""

from __future__ import annotations

from typing import Any

import pytest
from helm_runner import Helm
from kvgate.cmd.cli import build_parser
from kvgate.kube.settings import OperatorSettings
from kvgate.webhook.webhook_command import WebhookSettings

H100 = "NVIDIA-H100-80GB-HBM3"
RESERVES = "KVGATE_GPU_RESERVED_GIB_BY_PRODUCT"
DRIFT = "KVGATE_OPTIMISTIC_DRIFT_PERCENT"


def _env(deployment: dict[str, Any]) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_the_measured_reserves_reach_the_webhook_and_the_operator(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --set makes 3 a number but 2.5 a string (helm parses only integers); a values file keeps
    # 2.5 a number.
    rendered = helm.template(
        f"estimator.gpuReservedGiBByProduct.{H100}=3",
        "estimator.gpuReservedGiBByProduct.NVIDIA-L40S=2",
        "estimator.optimisticDriftPercent=15",
    )
    operator, webhook = _env(rendered.controller()), _env(rendered.webhook())
    assert operator[RESERVES] == webhook[RESERVES]
    assert DRIFT not in webhook and operator[DRIFT] == "15"
    monkeypatch.setenv("KVGATE_NETWORK_POLICIES", "false")
    for name in (RESERVES, DRIFT):
        monkeypatch.setenv(name, operator[name])
    settings = OperatorSettings.from_args(build_parser().parse_args(["operator", "--no-webhook"]))
    assert settings.gpu_reserved_gib_by_product == {H100: 3.0, "NVIDIA-L40S": 2.0}
    assert settings.optimistic_drift_percent == 15.0
    policy = WebhookSettings.from_args(
        build_parser().parse_args(["webhook", "--tls-dir", "/nonexistent"])
    ).policy
    assert policy.gpu_reserved_gib_by_product == {H100: 3.0, "NVIDIA-L40S": 2.0}


def test_by_default_no_reserve_is_set_and_the_threshold_is_ten_percent(helm: Helm) -> None:
    rendered = helm.template()
    operator, webhook = _env(rendered.controller()), _env(rendered.webhook())
    assert RESERVES not in operator and RESERVES not in webhook
    assert operator[DRIFT] == "10"


@pytest.mark.parametrize(
    "value",
    [
        f"estimator.gpuReservedGiBByProduct.{H100}=-1",
        f"estimator.gpuReservedGiBByProduct.{H100}=80",
        "estimator.optimisticDriftPercent=0",
        "estimator.optimisticDriftPercent=100",
    ],
)
def test_a_reserve_or_threshold_that_is_no_measurement_fails_the_install(
    helm: Helm, value: str
) -> None:
    result = helm.template_result(value)
    assert result.returncode != 0, f"{value} was accepted"
    assert "estimator" in result.stderr
