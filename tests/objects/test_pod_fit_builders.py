"""Pods a platform team can adapt: what a role's and the router's pod fields put in the pods,
and what they never replace (the gate, the argv, the guard, kvgate's labels and volumes)."""

from __future__ import annotations

from typing import Any

import pytest
from factories.golden import check_golden
from factories.model_deployments import make_md
from kvgate.api import labels
from kvgate.api.models import Role
from kvgate.api.revision import revision_of
from kvgate.kube.settings import parse_pull_secrets
from kvgate.objects import builders, lws_builders

REV = "7c9d0e1f2a"
GUARD = builders.Guard(
    "registry.example.com/kvgate/kvgate-operator:0.2.0",
    cluster_floor="0.5.23",
    pull_secrets=("kvgate-registry", "team-registry"),
)
# The sample's revision before these fields existed: a spec that sets none of them keeps it.
SAMPLE_REVISION = "ec6a29e97b"

PLATFORM_ROLE: dict[str, Any] = {
    "acceleratorResource": "amd.com/gpu",
    "tensorParallel": 2,
    "podLabels": {"team": "search", "example.com/cost-centre": "4711"},
    "podAnnotations": {"example.com/owner": "search-infra@example.com"},
    "serviceAccountName": "engines",
    "priorityClassName": "inference-high",
    "imagePullSecrets": [{"name": "team-registry"}],
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"kvgate.io/deployment": "llama"}},
        }
    ],
    "extraVolumes": [{"name": "ca-bundle", "configMap": {"name": "corp-ca"}}],
    "extraVolumeMounts": [{"name": "ca-bundle", "mountPath": "/etc/ssl/corp", "readOnly": True}],
    "extraEnv": [{"name": "SSL_CERT_DIR", "value": "/etc/ssl/corp"}],
    "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "96Gi"}},
}
PLATFORM_ROUTER: dict[str, Any] = {
    "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
    "nodeSelector": {"pool": "cpu"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "gw", "effect": "NoSchedule"}
    ],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    "imagePullSecrets": [{"name": "mirror"}],
}


def _platform_md(**overrides: Any) -> Any:
    fields = {f"prefill__{k}": v for k, v in PLATFORM_ROLE.items()}
    fields |= {f"router__{k}": v for k, v in PLATFORM_ROUTER.items()}
    return make_md(**(fields | overrides))


def _pod(md: Any, component: str, guard: builders.Guard | None = GUARD) -> Any:
    template = builders.deployment(md, REV, component, replicas=1, guard=guard)["spec"]["template"]
    return template


def test_an_adapted_prefill_deployment_matches_golden_file() -> None:
    check_golden(
        "prefill-deployment-platform",
        builders.deployment(_platform_md(), REV, "prefill", replicas=1, guard=GUARD),
    )


def test_an_adapted_router_deployment_matches_golden_file() -> None:
    check_golden(
        "router-deployment-platform",
        builders.deployment(_platform_md(), REV, "router", replicas=2),
    )


def test_engine_pods_request_the_roles_accelerator_resource_not_nvidia() -> None:
    md = _platform_md(decode__acceleratorResource="nvidia.com/mig-3g.40gb")
    prefill = _pod(md, "prefill")["spec"]["containers"][0]["resources"]
    assert prefill["limits"] == {"memory": "96Gi", "amd.com/gpu": 2}
    assert prefill["requests"] == {"cpu": "8", "memory": "64Gi", "amd.com/gpu": 2}
    decode = _pod(md, "decode")["spec"]["containers"][0]["resources"]
    assert decode["limits"] == {"nvidia.com/mig-3g.40gb": 1}


def test_a_gpu_count_that_skipped_admission_still_gets_kvgates_count() -> None:
    md = make_md(prefill__tensorParallel=4, prefill__resources={"limits": {"nvidia.com/gpu": 1}})
    resources = _pod(md, "prefill")["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 4


def test_the_chart_pull_secrets_follow_the_specs_own_each_once() -> None:
    spec = _pod(_platform_md(), "prefill")["spec"]
    assert spec["imagePullSecrets"] == [
        {"name": "team-registry"},
        {"name": "kvgate-registry"},
    ]
    # The decode role names none of its own: it still pulls the guard with the chart's.
    assert _pod(_platform_md(), "decode")["spec"]["imagePullSecrets"] == [
        {"name": "kvgate-registry"},
        {"name": "team-registry"},
    ]
    assert "imagePullSecrets" not in _pod(make_md(), "decode", guard=None)["spec"]


def test_the_router_gets_its_own_pull_secrets_never_the_operators() -> None:
    spec = _pod(_platform_md(), "router")["spec"]
    assert spec["imagePullSecrets"] == [{"name": "mirror"}]
    assert spec["serviceAccountName"] == "llama-router"  # smg's discovery account, always


def test_pod_fields_never_replace_what_the_gate_depends_on() -> None:
    # As a spec that skipped admission (failurePolicy Ignore) would hold them.
    md = _platform_md(
        prefill__podLabels={"kvgate.io/role": "decode", "team": "search"},
        prefill__podAnnotations={"kvgate.io/requirement": "{}", "sglang.ai/bootstrap-port": "1"},
        prefill__extraVolumes=[{"name": "dshm", "emptyDir": {}}],
        prefill__extraVolumeMounts=[{"name": "dshm", "mountPath": "/scratch"}],
        prefill__extraEnv=[{"name": "KVGATE_ENGINE_API_KEY", "value": "mine"}],
        engine__apiKeySecretRef={"name": "engine-key", "key": "key"},
    )
    template = _pod(md, "prefill")
    plain = _pod(
        _platform_md(engine__apiKeySecretRef={"name": "engine-key", "key": "key"}), "prefill"
    )
    meta = template["metadata"]
    assert meta["labels"][labels.ROLE] == "prefill" and meta["labels"]["team"] == "search"
    assert (
        meta["annotations"][labels.REQUIREMENT]
        == plain["metadata"]["annotations"][labels.REQUIREMENT]
    )
    assert meta["annotations"][labels.BOOTSTRAP_PORT] == "8998"
    spec = template["spec"]
    assert spec["readinessGates"] == [{"conditionType": labels.ENGINE_VERIFIED}]
    assert [v for v in spec["volumes"] if v["name"] == "dshm"] == [
        v for v in plain["spec"]["volumes"] if v["name"] == "dshm"
    ]
    engine = spec["containers"][0]
    assert [m for m in engine["volumeMounts"] if m["name"] == "dshm"] == [
        {"name": "dshm", "mountPath": "/dev/shm"}
    ]
    key_env = [e for e in engine["env"] if e["name"] == "KVGATE_ENGINE_API_KEY"]
    assert key_env == [e for e in plain["spec"]["containers"][0]["env"] if e in key_env]
    assert "value" not in key_env[0]
    assert (engine["command"], engine["args"]) == (
        plain["spec"]["containers"][0]["command"],
        plain["spec"]["containers"][0]["args"],
    )
    assert spec["initContainers"] == plain["spec"]["initContainers"]
    assert spec["automountServiceAccountToken"] is False


def test_a_roles_env_follows_engine_env_and_wins_on_a_shared_name() -> None:
    md = make_md(
        engine__env=[{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "A", "value": "1"}],
        decode__extraEnv=[{"name": "NCCL_DEBUG", "value": "WARN"}],
    )
    decode = {e["name"]: e.get("value") for e in _pod(md, "decode")["spec"]["containers"][0]["env"]}
    prefill = {
        e["name"]: e.get("value") for e in _pod(md, "prefill")["spec"]["containers"][0]["env"]
    }
    assert (decode["NCCL_DEBUG"], decode["A"]) == ("WARN", "1")
    assert prefill["NCCL_DEBUG"] == "INFO"


def test_the_spec_safety_setting_replaces_an_env_entry_of_the_same_name_once() -> None:
    name = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"
    md = make_md(
        engine__env=[{"name": name, "value": "false"}],
        decode__extraEnv=[{"name": name, "value": "0"}],
    )
    for role in ("prefill", "decode"):
        env = _pod(md, role)["spec"]["containers"][0]["env"]
        assert [e for e in env if e["name"] == name] == [{"name": name, "value": "true"}]
    off = make_md(safety__deferredDecodeKvRelease=False)
    env = _pod(off, "decode")["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == name] == [{"name": name, "value": "false"}]


def test_multi_node_workers_carry_the_roles_labels_and_annotations_but_not_the_engine_label() -> (
    None
):
    md = _platform_md(prefill__nodes=2)
    worker = lws_builders.worker_pod_template(md, Role.PREFILL, REV, GUARD)
    assert worker["metadata"]["labels"]["team"] == "search"
    assert worker["metadata"]["labels"][labels.COMPONENT] == "engine-worker"
    assert worker["metadata"]["annotations"] == PLATFORM_ROLE["podAnnotations"]
    assert worker["spec"]["priorityClassName"] == "inference-high"
    assert "readinessGates" not in worker["spec"]


def test_a_spec_without_the_new_fields_keeps_its_revision() -> None:
    assert revision_of(make_md().spec) == SAMPLE_REVISION
    assert revision_of(make_md(prefill__acceleratorResource="nvidia.com/gpu").spec) == (
        SAMPLE_REVISION
    )


@pytest.mark.parametrize(
    "override",
    [
        {"prefill__acceleratorResource": "amd.com/gpu"},
        {"decode__podLabels": {"team": "a"}},
        {"decode__podAnnotations": {"example.com/a": "b"}},
        {"prefill__serviceAccountName": "engines"},
        {"prefill__priorityClassName": "high"},
        {"decode__imagePullSecrets": [{"name": "regcred"}]},
        {"decode__extraEnv": [{"name": "X", "value": "1"}]},
        {"router__resources": {"requests": {"cpu": "1"}}},
        {"router__nodeSelector": {"pool": "cpu"}},
        {"safety__deferredDecodeKvRelease": False},
    ],
)
def test_a_pod_field_is_a_new_revision_as_node_selector_is(override: dict[str, Any]) -> None:
    assert revision_of(make_md(**override).spec) != SAMPLE_REVISION


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        (None, ()),
        ("[]", ()),
        ('[{"name": "regcred"}, {"name": "mirror"}, {"name": "regcred"}]', ("regcred", "mirror")),
        ('["regcred"]', ("regcred",)),
    ],
)
def test_the_operator_reads_the_charts_pull_secrets(
    raw: str | None, names: tuple[str, ...]
) -> None:
    assert parse_pull_secrets(raw) == names


@pytest.mark.parametrize("raw", ["regcred", '{"name": "a"}', '[{"name": "Reg Cred"}]', "[1]"])
def test_a_malformed_pull_secret_setting_names_the_variable_and_the_form(raw: str) -> None:
    with pytest.raises(ValueError, match=r"KVGATE_ENGINE_IMAGE_PULL_SECRETS=.*imagePullSecrets"):
        parse_pull_secrets(raw)
