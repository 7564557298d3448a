"""The cluster's GPUs per node (chart value gpusPerNode, KVGATE_GPUS_PER_NODE): when the admin
states it, the webhook, the operator's in-process webhook and `kvgate validate --gpus-per-node`
deny an engine pod asking for more; a value that is not a count stops start-up naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from factories.admission_reviews import mutated
from kvgate.admission.policy import ClusterPolicy, parse_gpus_per_node
from kvgate.api.models import MAX_GPUS_PER_NODE
from kvgate.cmd.cli import build_parser, main
from kvgate.kube.settings import OperatorSettings
from kvgate.webhook.webhook_command import WebhookSettings

CHART = Path(__file__).resolve().parents[2] / "charts" / "kvgate"
SIXTEEN_ON_ONE_NODE = {"spec.decode.tensorParallel": 16}


@pytest.fixture(autouse=True)
def _no_network_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_NETWORK_POLICIES", "false")  # not what these tests are about
    monkeypatch.delenv("KVGATE_GPUS_PER_NODE", raising=False)


def _webhook_settings() -> WebhookSettings:
    return WebhookSettings.from_args(
        build_parser().parse_args(["webhook", "--tls-dir", "/nonexistent"])
    )


def _operator_settings() -> OperatorSettings:
    return OperatorSettings.from_args(build_parser().parse_args(["operator", "--no-webhook"]))


def test_webhook_and_operator_take_the_cluster_gpus_per_node_from_the_chart_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVGATE_GPUS_PER_NODE", "8")
    assert _webhook_settings().policy.gpus_per_node == 8
    assert _operator_settings().gpus_per_node == 8
    monkeypatch.delenv("KVGATE_GPUS_PER_NODE")
    assert _webhook_settings().policy.gpus_per_node is None
    assert _operator_settings().gpus_per_node is None


@pytest.mark.parametrize("raw", ["eight", "0", "-2", "8.5"])
def test_a_gpus_per_node_that_is_not_a_count_stops_start_up_naming_the_chart_value(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv("KVGATE_GPUS_PER_NODE", raw)
    for start in (_webhook_settings, _operator_settings):
        with pytest.raises(SystemExit) as stop:
            start()
        assert "gpusPerNode" in str(stop.value) and repr(raw) in str(stop.value)
    with pytest.raises(ValueError, match="whole number"):
        parse_gpus_per_node(raw)


def test_validate_with_gpus_per_node_answers_as_that_clusters_webhook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "md.yaml"
    path.write_text(yaml.safe_dump(mutated(SIXTEEN_ON_ONE_NODE)))
    assert main(["validate", str(path)]) == 0  # 16 GPUs: within the ceiling
    capsys.readouterr()
    assert main(["validate", str(path), "--gpus-per-node", "8"]) == 1
    out = capsys.readouterr().out
    assert "16 GPUs per pod > 8" in out and "gpusPerNode 8" in out
    assert "set decode.nodes to 2" in out
    assert main(["validate", str(path), "--gpus-per-node", "0"]) == 2
    assert "--gpus-per-node: gpusPerNode 0: must be 1 or more" in capsys.readouterr().err


def test_a_gpus_per_node_above_what_any_node_has_is_refused_naming_the_limit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Above MAX_GPUS_PER_NODE (no node has more, and the chart's schema caps it there too) the
    setting is a typo, not a cluster: start-up stops and `kvgate validate` exits 2, each naming
    the value, the limit and the way out."""
    too_many = str(MAX_GPUS_PER_NODE + 1)
    monkeypatch.setenv("KVGATE_GPUS_PER_NODE", too_many)
    for start in (_webhook_settings, _operator_settings):
        with pytest.raises(SystemExit) as stop:
            start()
        assert f"at most {MAX_GPUS_PER_NODE}" in str(stop.value)
    with pytest.raises(ValueError, match=f"at most {MAX_GPUS_PER_NODE}"):
        ClusterPolicy(gpus_per_node=MAX_GPUS_PER_NODE + 1)
    path = tmp_path / "md.yaml"
    path.write_text(yaml.safe_dump(mutated(SIXTEEN_ON_ONE_NODE)))
    assert main(["validate", str(path), "--gpus-per-node", too_many]) == 2
    err = capsys.readouterr().err
    assert f"gpusPerNode {too_many}" in err and f"at most {MAX_GPUS_PER_NODE}" in err


def test_the_charts_gpus_per_node_bound_is_the_apis() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["gpusPerNode"]["maximum"] == MAX_GPUS_PER_NODE
