"""What a platform team adds to kvgate's pods (kvgate.admission.pod_fit): admitted when it adapts
the pods to the cluster, denied naming the field when it touches what the gate depends on (kvgate's
keys, its accelerator count, its volumes, the engine's key) or what Kubernetes would refuse."""

from __future__ import annotations

from typing import Any

import pytest
from factories.admission_reviews import mutated
from kvgate.admission import check_document

ADAPTED: dict[str, Any] = {
    "spec.prefill.acceleratorResource": "amd.com/gpu",
    "spec.prefill.podLabels": {"team": "search", "example.com/cost-centre": "4711"},
    "spec.prefill.podAnnotations": {"example.com/owner": "search-infra@example.com"},
    "spec.prefill.serviceAccountName": "engines",
    "spec.prefill.priorityClassName": "inference-high",
    "spec.prefill.imagePullSecrets": [{"name": "regcred"}],
    "spec.prefill.topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
        }
    ],
    "spec.prefill.extraVolumes": [{"name": "ca-bundle", "configMap": {"name": "corp-ca"}}],
    "spec.prefill.extraVolumeMounts": [{"name": "ca-bundle", "mountPath": "/etc/ssl/corp"}],
    "spec.prefill.extraEnv": [{"name": "SSL_CERT_DIR", "value": "/etc/ssl/corp"}],
    "spec.decode.acceleratorResource": "nvidia.com/mig-3g.40gb",
    "spec.decode.gpuMemoryGiB": 40,
    "spec.decode.resources": {"limits": {"nvidia.com/mig-3g.40gb": 1, "memory": "64Gi"}},
    "spec.router.resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
    "spec.router.nodeSelector": {"pool": "cpu"},
    "spec.router.tolerations": [{"key": "dedicated", "operator": "Exists"}],
    "spec.router.affinity": {"nodeAffinity": {}},
    "spec.router.imagePullSecrets": [{"name": "mirror"}],
}


def denials(changes: dict[str, Any]) -> dict[str, str]:
    return {p.field: p.message for p in check_document(mutated(changes)).denials}


def test_a_pod_adapted_to_the_platform_is_admitted() -> None:
    result = check_document(mutated(ADAPTED))
    assert result.allowed, result.message


def test_a_gpu_limit_that_conflicts_with_kvgates_is_denied_not_overwritten() -> None:
    found = denials(
        {
            "spec.decode.tensorParallel": 2,
            "spec.decode.resources": {"limits": {"nvidia.com/gpu": 1}},
        }
    )
    message = found["spec.decode.resources.limits[nvidia.com/gpu]"]
    assert "1 conflicts with the 2 nvidia.com/gpu kvgate gives each engine pod" in message
    assert "tensorParallel 2" in message and "remove it" in message


def test_kvgates_own_gpu_count_written_out_is_admitted() -> None:
    assert denials({"spec.decode.resources": {"requests": {"nvidia.com/gpu": "1"}}}) == {}


def test_a_second_accelerator_beside_the_roles_is_denied_naming_the_way_out() -> None:
    found = denials({"spec.prefill.resources": {"limits": {"amd.com/gpu": 1}}})
    assert (
        "set prefill.acceleratorResource: amd.com/gpu"
        in (found["spec.prefill.resources.limits[amd.com/gpu]"])
    )


@pytest.mark.parametrize(
    ("field", "key"),
    [
        ("podLabels", "kvgate.io/role"),
        ("podLabels", "kvgate.io/revision"),
        ("podLabels", "pod-template-hash"),
        ("podLabels", "leaderworkerset.sigs.k8s.io/name"),
        ("podAnnotations", "kvgate.io/requirement"),
        ("podAnnotations", "sglang.ai/bootstrap-port"),
        ("podAnnotations", "metrics.kvgate.io/anything"),
        ("podAnnotations", "controller.kubernetes.io/pod-deletion-cost"),
    ],
)
def test_a_key_kvgate_keeps_is_denied_naming_the_field(field: str, key: str) -> None:
    found = denials({f"spec.decode.{field}": {key: "1"}})
    assert f"{key} is kvgate's own key" in found[f"spec.decode.{field}[{key}]"]


@pytest.mark.parametrize(
    ("labels_", "says"),
    [
        ({"bad key!": "a"}, "is not a Kubernetes label or annotation key"),
        ({"team": "a b"}, "label value"),
    ],
)
def test_a_label_kubernetes_refuses_is_denied_before_any_pod(
    labels_: dict[str, str], says: str
) -> None:
    (message,) = denials({"spec.prefill.podLabels": labels_}).values()
    assert says in message


def test_extra_volumes_never_take_kvgates_names_paths_or_the_nodes_directories() -> None:
    found = denials(
        {
            "spec.decode.extraVolumes": [
                {"name": "model", "emptyDir": {}},
                {"name": "etc", "hostPath": {"path": "/etc"}},
                {"name": "cache", "emptyDir": {}},
            ],
            "spec.decode.extraVolumeMounts": [
                {"name": "cache", "mountPath": "/models/cache"},
                {"name": "cache", "mountPath": "/dev"},
                {"name": "other", "mountPath": "/cache"},
            ],
        }
    )
    assert (
        "model is the name of a volume kvgate builds" in found["spec.decode.extraVolumes[0].name"]
    )
    assert "hostPaths.modelPrefixes" in found["spec.decode.extraVolumes[1].hostPath"]
    assert "inside or above /models" in found["spec.decode.extraVolumeMounts[0].mountPath"]
    assert "inside or above /dev/shm" in found["spec.decode.extraVolumeMounts[1].mountPath"]
    assert "not one of decode.extraVolumes" in found["spec.decode.extraVolumeMounts[2].name"]


def test_the_engines_api_key_variable_stays_kvgates() -> None:
    found = denials({"spec.prefill.extraEnv": [{"name": "KVGATE_ENGINE_API_KEY", "value": "x"}]})
    assert "apiKeySecretRef" in found["spec.prefill.extraEnv[0].name"]


def test_an_rdma_resource_that_is_also_the_gpu_resource_is_denied() -> None:
    found = denials({"spec.engine.transfer.rdma": {"resourceName": "nvidia.com/gpu"}})
    assert (
        "cannot be both the GPUs and the RDMA device"
        in (found["spec.engine.transfer.rdma.resourceName"])
    )


def test_a_router_never_asks_for_a_gpu() -> None:
    found = denials({"spec.router.resources": {"limits": {"nvidia.com/gpu": 1}}})
    assert "runs on CPU" in found["spec.router.resources.limits[nvidia.com/gpu]"]


def test_a_roles_own_env_counts_for_the_longer_context_override() -> None:
    config_limit = {"spec.model.config.max_position_embeddings": 65536}
    assert "spec.model.contextLength" in denials(config_limit)
    env = [{"name": "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "value": "1"}]
    only_decode = denials({**config_limit, "spec.decode.extraEnv": env})
    assert "spec.model.contextLength" in only_decode
    both = denials({**config_limit, "spec.prefill.extraEnv": env, "spec.decode.extraEnv": env})
    assert "spec.model.contextLength" not in both
