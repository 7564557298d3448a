"""The node directories a ModelDeployment may mount (kvgate.admission.host_paths): a model hostPath
only under the chart's hostPaths.modelPrefixes (none by default), an RDMA hostPath only from
hostPaths.rdmaDevices (/dev/infiniband by default). Every denial names the field, the path and
the chart value; a setting that would allow the node's root stops start-up naming the value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from factories.admission_reviews import mutated
from kvgate.admission import check_document
from kvgate.admission.host_paths import (
    HostPathPolicy,
    host_path_policy,
    model_host_path_problem,
    rdma_host_path_problem,
    under,
)
from kvgate.admission.policy import ClusterPolicy
from kvgate.cmd.cli import build_parser, main
from kvgate.kube.settings import OperatorSettings
from kvgate.webhook.webhook_command import WebhookSettings

CHART = Path(__file__).resolve().parents[2] / "charts" / "kvgate"
MODELS = HostPathPolicy(model_prefixes=("/mnt/models", "/data/weights"))
MODEL_FIELD = "spec.model.source.hostPath.path"
RDMA_FIELD = "spec.engine.transfer.rdma.hostPath"


def model_source(path: str, kind: str = "Directory") -> dict[str, object]:
    return {"spec.model.source": {"hostPath": {"path": path, "type": kind}}}


def denials(document: dict[str, object], policy: HostPathPolicy) -> dict[str, str]:
    result = check_document(document, ClusterPolicy(host_paths=policy))
    return {p.field: p.message for p in result.denials}


@pytest.mark.parametrize(
    ("path", "prefix", "inside"),
    [
        ("/mnt/models", "/mnt/models", True),
        ("/mnt/models/llama", "/mnt/models", True),
        ("/mnt/models-evil", "/mnt/models", False),
        ("/mnt/model", "/mnt/models", False),
        ("/mnt", "/mnt/models", False),
        ("/etc", "/mnt/models", False),
    ],
)
def test_a_path_is_under_a_prefix_only_inside_its_directory(
    path: str, prefix: str, inside: bool
) -> None:
    assert under(path, prefix) is inside


@pytest.mark.parametrize(
    ("path", "kind"),
    [("/etc", "DirectoryOrCreate"), ("/var/lib", "Directory"), ("/mnt/models-evil", "Directory")],
)
def test_a_model_host_path_outside_the_prefixes_is_denied_naming_the_path_and_chart_value(
    path: str, kind: str
) -> None:
    message = denials(mutated(model_source(path, kind)), MODELS)[MODEL_FIELD]
    assert message.startswith(f"{path} is not under the directories the cluster admin allows")
    assert "(/mnt/models, /data/weights)" in message
    assert "hostPaths.modelPrefixes" in message
    assert "persistentVolumeClaim" in message


def test_with_the_charts_default_every_model_host_path_is_denied() -> None:
    for path in ("/mnt/models", "/etc"):
        message = denials(mutated(model_source(path)), HostPathPolicy())[MODEL_FIELD]
        assert f"{path} is not under a directory the cluster admin allows" in message
        assert "hostPaths.modelPrefixes is empty" in message
        assert "e.g. /mnt/models" in message
    # `kvgate validate` without flags answers as a default install's webhook.
    assert not check_document(mutated(model_source("/mnt/models"))).allowed


@pytest.mark.parametrize("kind", ["Directory", "DirectoryOrCreate"])
@pytest.mark.parametrize("path", ["/mnt/models", "/mnt/models/llama-3.1-8b", "/data/weights/x"])
def test_a_model_host_path_under_an_allowed_prefix_is_admitted(path: str, kind: str) -> None:
    result = check_document(mutated(model_source(path, kind)), ClusterPolicy(host_paths=MODELS))
    assert result.allowed, result.message
    assert (
        "Pod Security"
        in {w.field: w.message for w in result.warnings}["spec.model.source.hostPath"]
    )


@pytest.mark.parametrize(
    "path", ["/mnt/models/../../etc", "/mnt/models/./x", "/mnt/models//x", "/mnt/models/.."]
)
def test_a_model_host_path_that_only_looks_inside_a_prefix_is_denied(path: str) -> None:
    message = denials(mutated(model_source(path)), MODELS)[MODEL_FIELD]
    assert message.startswith(path)
    assert "'..'" in message


@pytest.mark.parametrize("path", ["/", "/dev", "/dev/infiniband/../..", "/etc", "/dev/infiniband2"])
def test_an_rdma_host_path_other_than_an_allowed_device_directory_is_denied(path: str) -> None:
    document = mutated({"spec.engine.transfer": {"rdma": {"hostPath": path}}})
    message = denials(document, HostPathPolicy())[RDMA_FIELD]
    assert message.startswith(f"{path} is not an RDMA device directory the cluster admin allows")
    assert "(/dev/infiniband; the chart value hostPaths.rdmaDevices)" in message
    assert "set it to /dev/infiniband" in message and "resourceName" in message


def test_the_infiniband_directory_and_a_listed_one_are_admitted_for_rdma() -> None:
    assert rdma_host_path_problem("/dev/infiniband", HostPathPolicy()) is None
    listed = HostPathPolicy(rdma_devices=("/dev/infiniband", "/dev/rdma"))
    assert rdma_host_path_problem("/dev/rdma", listed) is None
    assert rdma_host_path_problem("/dev/rdma", HostPathPolicy()) is not None
    nothing = HostPathPolicy(rdma_devices=())
    assert rdma_host_path_problem("/dev/infiniband", nothing) is not None


def test_a_model_host_path_problem_is_none_exactly_under_a_prefix() -> None:
    assert model_host_path_problem("/mnt/models/a", MODELS) is None
    assert model_host_path_problem("/mnt/modelsa", MODELS) is not None


@pytest.mark.parametrize(
    ("models", "devices", "words"),
    [
        ('["/"]', None, ["hostPaths.modelPrefixes", "'/' is the node's root"]),
        ('["/mnt/models/"]', None, ["hostPaths.modelPrefixes", "normal form"]),
        ('["mnt/models"]', None, ["hostPaths.modelPrefixes", "is not absolute"]),
        ('["/mnt/../etc"]', None, ["hostPaths.modelPrefixes", "'..'"]),
        ("/mnt/models", None, ["KVGATE_MODEL_HOST_PATH_PREFIXES", "JSON list"]),
        (None, '["/"]', ["hostPaths.rdmaDevices", "root"]),
        (None, '{"a": 1}', ["KVGATE_RDMA_HOST_PATHS", "JSON list"]),
    ],
)
def test_a_setting_that_is_not_a_list_of_directories_is_refused_naming_the_chart_value(
    models: str | None, devices: str | None, words: list[str]
) -> None:
    with pytest.raises(ValueError) as refused:
        host_path_policy(models, devices)
    for word in words:
        assert word in str(refused.value)


def test_unset_settings_are_the_charts_defaults() -> None:
    assert host_path_policy(None, None) == HostPathPolicy() == host_path_policy("", " ")
    assert HostPathPolicy().model_prefixes == ()
    assert HostPathPolicy().rdma_devices == ("/dev/infiniband",)
    assert host_path_policy("[]", "[]") == HostPathPolicy(model_prefixes=(), rdma_devices=())


def test_webhook_and_operator_take_the_host_paths_from_the_chart_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVGATE_NETWORK_POLICIES", "false")  # not what this test is about
    monkeypatch.setenv("KVGATE_MODEL_HOST_PATH_PREFIXES", '["/mnt/models"]')
    monkeypatch.setenv("KVGATE_RDMA_HOST_PATHS", '["/dev/infiniband", "/dev/rdma"]')
    webhook = WebhookSettings.from_args(
        build_parser().parse_args(["webhook", "--tls-dir", "/nonexistent"])
    )
    operator = OperatorSettings.from_args(build_parser().parse_args(["operator", "--no-webhook"]))
    expected = HostPathPolicy(("/mnt/models",), ("/dev/infiniband", "/dev/rdma"))
    assert webhook.policy.host_paths == expected == operator.host_paths
    monkeypatch.setenv("KVGATE_MODEL_HOST_PATH_PREFIXES", '["/"]')
    with pytest.raises(SystemExit) as stop:
        WebhookSettings.from_args(
            build_parser().parse_args(["webhook", "--tls-dir", "/nonexistent"])
        )
    assert "hostPaths.modelPrefixes" in str(stop.value)


def test_validate_with_a_prefix_answers_as_that_clusters_webhook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "md.yaml"
    manifest.write_text(yaml.safe_dump(mutated(model_source("/mnt/models/llama"))))
    assert main(["validate", str(manifest)]) == 1
    assert "hostPaths.modelPrefixes is empty" in capsys.readouterr().out
    assert main(["validate", str(manifest), "--model-host-path-prefix", "/mnt/models"]) == 0
    assert main(["validate", str(manifest), "--model-host-path-prefix", "/"]) == 2
    assert "--model-host-path-prefix" in capsys.readouterr().err


def test_the_charts_defaults_are_the_policys() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["hostPaths"]
    assert tuple(values["modelPrefixes"]) == HostPathPolicy().model_prefixes
    assert tuple(values["rdmaDevices"]) == HostPathPolicy().rdma_devices
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["hostPaths"]["properties"]) == {"modelPrefixes", "rdmaDevices"}
