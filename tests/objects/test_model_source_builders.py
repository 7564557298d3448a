"""spec.model.source in the engine pods: one read-only volume at /models for every source, and
the download init container for a download, in leaders and workers alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from factories.golden import check_golden
from factories.model_deployments import make_md
from kvgate.api import labels
from kvgate.api.models import Role
from kvgate.api.revision import revision_inputs, revision_of
from kvgate.cmd import cli
from kvgate.objects import builders, lws_builders, model_source

REV = "7c9d0e1f2a"
GUARD = builders.Guard("ghcr.io/kvgate/kvgate-operator:0.2.0", cluster_floor="0.5.23")
CHART = Path(__file__).resolve().parents[2] / "charts" / "kvgate"

PVC = {"persistentVolumeClaim": {"claimName": "llama-weights", "subPath": "llama-3.1-8b"}}
HOST_PATH = {"hostPath": {"path": "/mnt/model-cache"}}
IMAGE = {"image": {"reference": "registry.example.com/models/llama-3.1-8b:v1"}}
DOWNLOAD = {
    "download": {
        "repo": "meta-llama/Llama-3.1-8B-Instruct",
        "revision": "0e9e39f249a16976918f6564b8830bc894c89659",
        "tokenSecretRef": {"name": "hf-token", "key": "token"},
        "exclude": ["original/*", "*.pth"],
        "storage": {"emptyDir": {"sizeLimit": "40Gi"}},
    }
}
DOWNLOAD_TO_CLAIM = {
    "download": {
        "repo": "meta-llama/Llama-3.1-8B-Instruct",
        "storage": {"persistentVolumeClaim": {"claimName": "model-cache"}},
    }
}


def sourced(source: dict[str, Any], **overrides: Any) -> Any:
    return make_md(model__source=source, **overrides)


def template(md: Any, role: str = "decode", guard: Any = None) -> dict[str, Any]:
    body = builders.deployment(md, REV, role, replicas=1, guard=guard)
    spec: dict[str, Any] = body["spec"]["template"]
    return spec


def engine(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["containers"][0]
    return container


def volume(pod: dict[str, Any]) -> dict[str, Any]:
    (found,) = [v for v in pod["spec"]["volumes"] if v["name"] == model_source.MODEL_VOLUME]
    return found


def model_mount(container: dict[str, Any]) -> dict[str, Any]:
    (found,) = [m for m in container["volumeMounts"] if m["name"] == model_source.MODEL_VOLUME]
    return found


@pytest.mark.parametrize(
    ("name", "source", "role"),
    [
        ("decode-deployment-model-pvc", PVC, "decode"),
        ("decode-deployment-model-hostpath", HOST_PATH, "decode"),
        ("decode-deployment-model-image", IMAGE, "decode"),
        ("prefill-deployment-model-download", DOWNLOAD, "prefill"),
    ],
)
def test_each_model_source_matches_its_golden_file(
    name: str, source: dict[str, Any], role: str
) -> None:
    check_golden(name, builders.deployment(sourced(source), REV, role, replicas=1, guard=GUARD))


def test_a_downloading_leader_worker_set_matches_its_golden_file() -> None:
    md = sourced(DOWNLOAD, decode__nodes=2, decode__tensorParallel=16)
    body = lws_builders.leader_worker_set(md, REV, Role.DECODE, replicas=1, guard=GUARD)
    check_golden("decode-leaderworkerset-model-download", body)


@pytest.mark.parametrize("source", [PVC, HOST_PATH, IMAGE, DOWNLOAD, DOWNLOAD_TO_CLAIM])
def test_the_engine_reads_the_weights_read_only_at_models_whatever_the_source(
    source: dict[str, Any],
) -> None:
    for role in ("prefill", "decode"):
        pod = template(sourced(source), role, GUARD)
        mount = model_mount(engine(pod))
        assert mount["mountPath"] == "/models" and mount["readOnly"] is True
        args = engine(pod)["args"]
        assert args[args.index("--model-path") + 1] == "/models/llama-3.1-8b"


def test_a_claim_is_read_only_on_the_volume_too_and_its_sub_path_is_mounted() -> None:
    pod = template(sourced(PVC))
    assert volume(pod)["persistentVolumeClaim"] == {"claimName": "llama-weights", "readOnly": True}
    assert model_mount(engine(pod))["subPath"] == "llama-3.1-8b"
    assert "initContainers" not in pod["spec"]


def test_a_host_path_and_an_image_are_their_kubernetes_volumes() -> None:
    assert volume(template(sourced(HOST_PATH)))["hostPath"] == {
        "path": "/mnt/model-cache",
        "type": "Directory",
    }
    assert volume(template(sourced(IMAGE)))["image"] == {
        "reference": "registry.example.com/models/llama-3.1-8b:v1",
        "pullPolicy": "IfNotPresent",
    }


def test_a_download_runs_kvgate_fetch_model_before_the_guard_with_the_token_from_the_secret() -> (
    None
):
    pod = template(sourced(DOWNLOAD), "prefill", GUARD)
    fetch, guard = pod["spec"]["initContainers"]
    assert (fetch["name"], guard["name"]) == ("kvgate-fetch-model", builders.GUARD_CONTAINER)
    assert "restartPolicy" not in fetch  # a regular init container: the engine waits for it
    assert fetch["image"] == GUARD.image
    assert fetch["env"] == [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    ]
    assert model_mount(fetch) == {"name": "model", "mountPath": "/models"}  # read-write
    assert fetch["securityContext"]["readOnlyRootFilesystem"] is True
    assert volume(pod)["emptyDir"] == {"sizeLimit": "40Gi"}
    args = cli.build_parser().parse_args(fetch["args"])
    assert (args.command, args.repo, args.dest) == (
        "fetch-model",
        "meta-llama/Llama-3.1-8B-Instruct",
        "/models/llama-3.1-8b",
    )
    assert args.revision == "0e9e39f249a16976918f6564b8830bc894c89659"
    assert args.endpoint == "https://huggingface.co"
    assert (args.token_secret_name, args.token_secret_key) == ("hf-token", "token")
    assert args.exclude == ["original/*", "*.pth"]


def test_a_download_to_a_claim_writes_through_a_writable_volume_the_engine_only_reads() -> None:
    pod = template(sourced(DOWNLOAD_TO_CLAIM))
    assert volume(pod)["persistentVolumeClaim"] == {"claimName": "model-cache"}
    (fetch,) = pod["spec"]["initContainers"]
    assert "readOnly" not in model_mount(fetch)
    assert model_mount(engine(pod))["readOnly"] is True
    assert "env" not in fetch  # a public repository: no token


def test_without_the_chart_the_download_runs_the_charts_default_image() -> None:
    (fetch,) = template(sourced(DOWNLOAD))["spec"]["initContainers"]
    assert fetch["image"] == builders.DEFAULT_KVGATE_IMAGE
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert f"{values['image']['repository']}:{chart['appVersion']}" == builders.DEFAULT_KVGATE_IMAGE


def test_workers_of_a_multi_node_engine_download_too_but_carry_no_guard() -> None:
    md = sourced(DOWNLOAD, decode__nodes=2, decode__tensorParallel=16)
    group = lws_builders.leader_worker_set(md, REV, Role.DECODE, replicas=1, guard=GUARD)
    leader = group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    worker = group["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert [c["name"] for c in leader["spec"]["initContainers"]] == [
        "kvgate-fetch-model",
        builders.GUARD_CONTAINER,
    ]
    assert [c["name"] for c in worker["spec"]["initContainers"]] == ["kvgate-fetch-model"]
    assert volume(worker) == volume(leader)
    assert model_mount(engine(worker))["readOnly"] is True


def test_a_multi_node_engine_without_a_download_keeps_workers_without_init_containers() -> None:
    md = sourced(PVC, decode__nodes=2, decode__tensorParallel=16)
    group = lws_builders.leader_worker_set(md, REV, Role.DECODE, replicas=1, guard=GUARD)
    worker = group["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert "initContainers" not in worker["spec"]
    assert volume(worker)["persistentVolumeClaim"]["claimName"] == "llama-weights"


def test_the_template_hash_ignores_the_download_image_like_the_guards() -> None:
    def hashed(image: str) -> str:
        guard = builders.Guard(image, cluster_floor="0.5.23")
        body = builders.deployment(sourced(DOWNLOAD), REV, "prefill", replicas=1, guard=guard)
        return str(body["metadata"]["annotations"][labels.TEMPLATE_HASH])

    assert hashed("kvgate:0.2.0") == hashed("kvgate:0.3.0")


def test_a_spec_without_a_source_keeps_its_revision_and_a_source_changes_it() -> None:
    plain = make_md()
    assert "source" not in revision_inputs(plain.spec)["model"]
    assert "volumeMounts" in engine(template(plain))
    assert [m["name"] for m in engine(template(plain))["volumeMounts"]] == ["dshm"]
    assert revision_of(sourced(PVC).spec) != revision_of(plain.spec)
    assert revision_of(sourced(PVC).spec) != revision_of(sourced(IMAGE).spec)
