"""Admission of spec.model.source: the path the engine reads, the download's room and deadline,
and /dev/shm against the memory limit; every denial and warning names the field, the numbers
and the way out."""

from __future__ import annotations

from typing import Any

import pytest
from factories.admission_reviews import mutated
from kvgate.admission import check_document
from kvgate.admission.host_paths import HostPathPolicy
from kvgate.admission.model_source import quantity_bytes
from kvgate.admission.policy import ClusterPolicy

COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"
PVC = {"persistentVolumeClaim": {"claimName": "llama-weights"}}
DOWNLOAD: dict[str, Any] = {
    "download": {
        "repo": "meta-llama/Llama-3.1-8B-Instruct",
        "revision": COMMIT,
        "tokenSecretRef": {"name": "hf-token", "key": "token"},
        "storage": {"emptyDir": {"sizeLimit": "40Gi"}},
    }
}


def fields(problems: Any) -> dict[str, str]:
    return {p.field: p.message for p in problems}


@pytest.mark.parametrize(
    "source",
    [
        PVC,
        {"persistentVolumeClaim": {"claimName": "w", "subPath": "llama/3.1-8b"}},
        {"image": {"reference": "registry.example.com/models/llama:v1", "pullPolicy": "Always"}},
        DOWNLOAD,
        {"download": {"repo": "org/m", "revision": COMMIT}},
        {
            "download": {
                "repo": "org/m",
                "revision": COMMIT,
                "storage": {"persistentVolumeClaim": {"claimName": "cache"}},
            }
        },
    ],
)
def test_a_source_with_a_path_under_models_is_allowed_without_warnings(
    source: dict[str, Any],
) -> None:
    result = check_document(mutated({"spec.model.source": source}))
    assert result.allowed, result.message
    assert not [w for w in result.warnings if "source" in w.field or "rollout" in w.field]


@pytest.mark.parametrize(
    ("path", "why", "example"),
    [
        ("/weights/llama", "is outside /models", "/models/llama"),
        ("/modelsx/llama", "is outside /models", "/models/llama"),
        ("/models/../etc", "holds '.' or '..' segments", "/models/etc"),
        ("/models/llama/", "is not in normal form", "/models/llama"),
        ("meta-llama/Llama-3.1-8B", "is outside /models", "/models/Llama-3.1-8B"),
    ],
)
def test_a_path_the_source_does_not_hold_is_denied_with_a_path_that_would_work(
    path: str, why: str, example: str
) -> None:
    result = check_document(mutated({"spec.model.source": PVC, "spec.model.path": path}))
    message = fields(result.denials)["spec.model.path"]
    assert why in message and f"e.g. {example}" in message
    assert "spec.model.source is mounted at /models" in message


def test_a_path_is_free_without_a_source() -> None:
    assert check_document(mutated({"spec.model.path": "meta-llama/Llama-3.1-8B"})).allowed


def test_a_path_under_models_without_a_source_is_admitted_with_a_warning_naming_the_ways_out() -> (
    None
):
    result = check_document(mutated({}))  # the sample: /models/llama-3.1-8b, no source
    assert result.allowed, result.message
    warned = fields(result.warnings)["spec.model.path"]
    assert "/models/llama-3.1-8b is under /models" in warned
    assert "spec.model.source is not set" in warned
    assert "lmsysorg/sglang:v0.5.23" in warned  # the only thing that could hold the weights
    assert "rollout.verifyTimeoutSeconds (900 s)" in warned
    for way_out in ("persistentVolumeClaim", "image", "download"):
        assert way_out in warned
    assert "hostPath" not in warned  # hostPaths.modelPrefixes is empty: hostPath is denied


def test_the_warning_offers_a_host_path_only_under_the_clusters_allowed_prefixes() -> None:
    policy = ClusterPolicy(host_paths=HostPathPolicy(model_prefixes=("/mnt/models",)))
    warned = fields(check_document(mutated({}), policy).warnings)["spec.model.path"]
    assert "hostPath (a node directory under /mnt/models)" in warned


@pytest.mark.parametrize(
    "source",
    [
        PVC,
        {"image": {"reference": "registry.example.com/models/llama:v1", "pullPolicy": "Always"}},
        DOWNLOAD,
    ],
)
def test_a_source_mounts_the_path_so_nothing_warns_about_it(source: dict[str, Any]) -> None:
    result = check_document(mutated({"spec.model.source": source}))
    assert result.allowed, result.message
    assert "spec.model.path" not in fields(result.warnings)


def test_a_path_outside_models_without_a_source_is_the_images_or_a_mounts_and_not_warned() -> None:
    mount = {"name": "weights", "mountPath": "/weights"}
    volume = {"name": "weights", "persistentVolumeClaim": {"claimName": "llama-weights"}}
    for changes in (
        {"spec.model.path": "/opt/llama-3.1-8b"},  # baked into a custom engine image
        {
            "spec.model.path": "/weights/llama-3.1-8b",
            "spec.prefill.extraVolumes": [volume],
            "spec.prefill.extraVolumeMounts": [mount],
            "spec.decode.extraVolumes": [volume],
            "spec.decode.extraVolumeMounts": [mount],
        },
    ):
        result = check_document(mutated(changes))
        assert result.allowed, result.message
        assert "spec.model.path" not in fields(result.warnings)


def test_a_hub_id_without_a_source_warns_that_the_engine_downloads_it_unpinned_and_unchecked() -> (
    None
):
    result = check_document(mutated({"spec.model.path": "meta-llama/Llama-3.1-8B-Instruct"}))
    assert result.allowed, result.message
    warned = fields(result.warnings)["spec.model.path"]
    assert "meta-llama/Llama-3.1-8B-Instruct is a hub id" in warned
    assert "rollout.verifyTimeoutSeconds (900 s)" in warned
    assert "not pinned to a commit" in warned and "no hash check" in warned
    assert "spec.model.source.download" in warned
    assert "repo: meta-llama/Llama-3.1-8B-Instruct" in warned
    assert "spec.model.path to /models/Llama-3.1-8B-Instruct" in warned


@pytest.mark.parametrize(
    ("source", "field", "words"),
    [
        (
            {"image": {"reference": "r/m:v1"}, "hostPath": {"path": "/mnt/m"}},
            "spec.model.source",
            [
                "exactly one of persistentVolumeClaim, hostPath, image and download",
                "hostPath, image",
            ],
        ),
        ({}, "spec.model.source", ["exactly one", "got none"]),
        (
            {"persistentVolumeClaim": {}},
            "spec.model.source.persistentVolumeClaim.claimName",
            ["required"],
        ),
        (
            {"persistentVolumeClaim": {"claimName": "w", "subPath": "/abs"}},
            "spec.model.source.persistentVolumeClaim.subPath",
            ["/abs"],
        ),
        (
            {"persistentVolumeClaim": {"claimName": "w", "subPath": "a/../b"}},
            "spec.model.source.persistentVolumeClaim",
            ["subPath a/../b holds a '..' segment", "name a directory inside the claim"],
        ),
        ({"hostPath": {"path": "relative"}}, "spec.model.source.hostPath.path", ["relative"]),
        (
            {"hostPath": {"path": "/mnt/m", "type": "File"}},
            "spec.model.source.hostPath.type",
            ["one of Directory or DirectoryOrCreate", "'File'"],
        ),
        (
            {"download": {"repo": "org/m", "tokenSecretRef": {"name": "hf-token"}}},
            "spec.model.source.download.tokenSecretRef.key",
            ["required"],
        ),
        ({"download": {"repo": "../../x"}}, "spec.model.source.download.repo", ["../../x"]),
        (
            {"download": {"repo": "org/m", "endpoint": "https://user:pw@hub.example"}},
            "spec.model.source.download.endpoint",
            ["https://user:pw@hub.example"],
        ),
        (
            {"download": {"repo": "org/m", "storage": {}}},
            "spec.model.source.download.storage",
            ["exactly one of emptyDir", "persistentVolumeClaim"],
        ),
        ({"image": {"reference": "has space"}}, "spec.model.source.image.reference", ["space"]),
    ],
)
def test_a_malformed_source_is_denied_naming_the_field(
    source: dict[str, Any], field: str, words: list[str]
) -> None:
    result = check_document(mutated({"spec.model.source": source}))
    assert not result.allowed
    message = fields(result.denials).get(field)
    assert message is not None, result.message
    for word in words:
        assert word in message, message


def test_a_download_emptydir_smaller_than_the_weights_is_denied_with_the_size_that_fits() -> None:
    source = {"download": {**DOWNLOAD["download"], "storage": {"emptyDir": {"sizeLimit": "10Gi"}}}}
    result = check_document(mutated({"spec.model.source": source}))
    message = fields(result.denials)["spec.model.source.download.storage.emptyDir.sizeLimit"]
    assert message.startswith("10Gi (10 GiB) < the weights' 15 GiB (spec.model.weightsGiB)")
    assert "raise sizeLimit to at least 17Gi" in message


def test_the_weights_estimated_from_the_config_count_when_weights_gib_is_unset() -> None:
    source = {"download": {**DOWNLOAD["download"], "storage": {"emptyDir": {"sizeLimit": "5Gi"}}}}
    doc = mutated({"spec.model.source": source})
    del doc["spec"]["model"]["weightsGiB"]
    doc["spec"]["model"]["config"]["vocab_size"] = 128256
    doc["spec"]["model"]["config"]["intermediate_size"] = 14336
    message = fields(check_document(doc).denials)[
        "spec.model.source.download.storage.emptyDir.sizeLimit"
    ]
    assert "(estimated from spec.model.config)" in message


def test_a_download_that_may_outlast_the_verification_deadline_is_a_warning() -> None:
    result = check_document(
        mutated(
            {
                "spec.model.source": {"download": {"repo": "org/m", "revision": COMMIT}},
                "spec.model.weightsGiB": 140.0,  # a 70B model, on TP 4 of 80 GiB GPUs
                "spec.prefill.tensorParallel": 4,
                "spec.decode.tensorParallel": 4,
                "spec.rollout.verifyTimeoutSeconds": 900,
            }
        )
    )
    assert result.allowed  # a warning: the deadline may hold on a fast network
    message = fields(result.warnings)["spec.rollout.verifyTimeoutSeconds"]
    assert message.startswith(
        "900 s may be too short for spec.model.source.download: downloading 140 GiB "
        "(spec.model.weightsGiB) takes 1,434 s at 100 MiB/s, more than 50% of the deadline"
    )
    assert "Raise rollout.verifyTimeoutSeconds to at least 2,868 s" in message


def test_a_branch_and_a_token_over_http_are_warnings() -> None:
    source = {
        "download": {
            "repo": "org/m",
            "endpoint": "http://hub.internal:8080",
            "tokenSecretRef": {"name": "hf-token", "key": "token"},
        }
    }
    result = check_document(mutated({"spec.model.source": source}))
    assert result.allowed
    warned = fields(result.warnings)
    assert "main is not a commit" in warned["spec.model.source.download.revision"]
    assert "pin the commit" in warned["spec.model.source.download.revision"]
    assert "Secret hf-token travels unencrypted" in warned["spec.model.source.download.endpoint"]


def test_an_allowed_host_path_is_admitted_with_a_pod_security_warning() -> None:
    policy = ClusterPolicy(host_paths=HostPathPolicy(model_prefixes=("/mnt/models",)))
    result = check_document(
        mutated({"spec.model.source": {"hostPath": {"path": "/mnt/models"}}}), policy
    )
    assert result.allowed, result.message
    warned = fields(result.warnings)["spec.model.source.hostPath"]
    assert "pod-security.kubernetes.io/enforce=privileged" in warned


def test_a_dev_shm_as_large_as_the_memory_limit_is_a_warning() -> None:
    result = check_document(
        mutated(
            {
                "spec.engine.transfer": {"shmSize": "16Gi"},
                "spec.decode.resources": {"limits": {"memory": "16Gi"}},
            }
        )
    )
    assert result.allowed
    message = fields(result.warnings)["spec.engine.transfer.shmSize"]
    assert message.startswith("16Gi ≥ spec.decode.resources.limits.memory 16Gi")
    assert "raise decode.resources.limits.memory" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16Gi", 16 * 2**30),
        ("1.5Gi", 1.5 * 2**30),
        ("40G", 40e9),
        ("512", 512.0),
        ("1e3", None),
        # forms the API server takes but kvgate does not read as a size: None, never an error
        ("500m", None),
        ("1Ei", None),
        ("5n", None),
    ],
)
def test_quantities_are_read_in_bytes(text: str, expected: float | None) -> None:
    assert quantity_bytes(text) == expected
