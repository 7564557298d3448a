"""Built objects match their golden files; the router only discovers its own revision."""

from __future__ import annotations

import json
from typing import Any

import pytest
from factories.golden import check_golden
from factories.model_deployments import make_md
from kvgate.api import labels
from kvgate.api.models import Role
from kvgate.api.revision import revision_of
from kvgate.objects import builders

REV = "7c9d0e1f2a"


def _full_md() -> Any:
    return make_md(
        prefill__tensorParallel=4,
        prefill__nodeSelector={"gpu": "h100"},
        prefill__tolerations=[
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ],
        prefill__affinity={
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}
        },
        prefill__resources={"limits": {"memory": "200Gi"}, "requests": {"cpu": "16"}},
        engine__env=[{"name": "NCCL_DEBUG", "value": "INFO"}],
        router__args=["--policy", "round_robin"],
    )


@pytest.mark.parametrize(
    ("name", "build"),
    [
        ("prefill-deployment", lambda md: builders.deployment(md, REV, "prefill", replicas=1)),
        ("decode-deployment", lambda md: builders.deployment(md, REV, "decode", replicas=1)),
        ("router-deployment", lambda md: builders.deployment(md, REV, "router", replicas=1)),
        ("service", lambda md: builders.service(md, REV)),
        ("router-serviceaccount", builders.router_service_account),
        ("router-role", builders.router_role),
        ("router-rolebinding", builders.router_role_binding),
    ],
)
def test_built_object_matches_golden_file(name: str, build: Any) -> None:
    check_golden(name, build(make_md()))


def test_prefill_with_placement_and_resources_matches_golden_file() -> None:
    check_golden(
        "prefill-deployment-full", builders.deployment(_full_md(), REV, "prefill", replicas=2)
    )


def test_engine_pods_request_one_gpu_per_tensor_parallel_rank() -> None:
    body = builders.deployment(_full_md(), REV, "prefill", replicas=2)
    resources = body["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"memory": "200Gi", "nvidia.com/gpu": 4}
    assert resources["requests"] == {"cpu": "16", "nvidia.com/gpu": 4}


def test_engine_pods_are_gated_on_verification_and_carry_their_requirement() -> None:
    md = make_md(safety__headroom=1.2)
    for role in (Role.PREFILL, Role.DECODE):
        template = builders.deployment(md, REV, role.value, replicas=1)["spec"]["template"]
        assert template["spec"]["readinessGates"] == [
            {"conditionType": "kvgate.io/engine-verified"}
        ]
        requirement = json.loads(template["metadata"]["annotations"][labels.REQUIREMENT])
        assert requirement == {
            "contextLength": 131072,
            "headroom": 1.2,
            "minEngineVersion": "0.5.22",
            "role": role.value,
        }
        probe = template["spec"]["containers"][0]["readinessProbe"]
        assert probe["httpGet"] == {"path": "/health", "port": 30000}


def test_only_prefill_pods_announce_the_bootstrap_port() -> None:
    md = make_md()
    prefill = builders.deployment(md, REV, "prefill", replicas=1)["spec"]["template"]
    decode = builders.deployment(md, REV, "decode", replicas=1)["spec"]["template"]
    assert prefill["metadata"]["annotations"][labels.BOOTSTRAP_PORT] == "8998"
    assert labels.BOOTSTRAP_PORT not in decode["metadata"]["annotations"]


def test_router_discovers_only_its_own_revisions_engines() -> None:
    md = make_md()
    args = builders.deployment(md, REV, "router", replicas=1)["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    prefill_sel = args[args.index("--prefill-selector") + 1 : args.index("--decode-selector")]
    decode_sel = args[args.index("--decode-selector") + 1 : args.index("--host")]
    for sel, role in ((prefill_sel, "prefill"), (decode_sel, "decode")):
        assert f"kvgate.io/revision={REV}" in sel
        assert "kvgate.io/deployment=llama" in sel
        assert f"kvgate.io/role={role}" in sel
    assert args[args.index("--service-discovery-namespace") + 1] == "models"
    assert args[args.index("--service-discovery-port") + 1] == "30000"


def test_every_object_is_owned_by_its_model_deployment() -> None:
    md = make_md()
    objects = [builders.deployment(md, REV, c, replicas=1) for c in builders.COMPONENTS] + [
        builders.service(md, REV),
        builders.router_service_account(md),
        builders.router_role(md),
        builders.router_role_binding(md),
    ]
    for body in objects:
        (owner,) = body["metadata"]["ownerReferences"]
        assert owner["uid"] == md.metadata.uid
        assert owner["controller"] is True
        assert body["metadata"]["labels"][labels.MANAGED_BY] == "kvgate"


def test_service_selects_the_serving_revisions_routers() -> None:
    selector = builders.service(make_md(), "abc")["spec"]["selector"]
    assert selector == {
        "kvgate.io/deployment": "llama",
        "kvgate.io/component": "router",
        "kvgate.io/revision": "abc",
    }


def test_revision_ignores_replicas_and_rollout_settings() -> None:
    base = revision_of(make_md().spec)
    assert revision_of(make_md(decode__replicas=5, router__replicas=3).spec) == base
    assert revision_of(make_md(rollout__verifyTimeoutSeconds=5).spec) == base


@pytest.mark.parametrize(
    "override",
    [
        {"model__contextLength": 65536},
        {"engine__image": "lmsysorg/sglang:v0.5.24"},
        {"safety__headroom": 1.5},
        {"decode__memFractionStatic": 0.8},
        {"router__args": ["--policy", "random"]},
    ],
)
def test_revision_changes_with_anything_that_changes_the_engines(override: dict[str, Any]) -> None:
    assert revision_of(make_md(**override).spec) != revision_of(make_md().spec)


def test_revision_is_a_valid_label_value() -> None:
    rev = revision_of(make_md().spec)
    assert len(rev) == 10 and rev.isalnum() and rev == rev.lower()


GUARD = builders.Guard("ghcr.io/kvgate/kvgate-operator:0.2.0", cluster_floor="0.5.23")


def test_guarded_decode_deployment_matches_golden_file() -> None:
    check_golden(
        "decode-deployment-guard",
        builders.deployment(make_md(), REV, "decode", replicas=1, guard=GUARD),
    )


def test_engine_pods_carry_a_guard_sidecar_checking_the_operators_requirement() -> None:
    from kvgate.api import requirements
    from kvgate.cmd import cli, guard

    md = make_md(safety__headroom=1.2)
    for role in (Role.PREFILL, Role.DECODE):
        spec = builders.deployment(md, REV, role.value, replicas=1, guard=GUARD)["spec"]
        (sidecar,) = spec["template"]["spec"]["initContainers"]
        assert sidecar["restartPolicy"] == "Always"  # a native sidecar, not a one-shot init
        assert [sidecar["command"][0], sidecar["args"][0]] == ["kvgate", "guard"]
        args = cli.build_parser().parse_args(sidecar["args"])
        # Exactly the requirement the operator verifies this revision against.
        assert guard.requirement_of(args) == requirements.requirement_for(
            spec=md.spec,
            target_revision=REV,
            status=None,
            revision=REV,
            role=role.value,
            cluster_floor="0.5.23",
        )
        assert (args.engine_port, args.engine_host) == (30000, "127.0.0.1")
        probe = sidecar["readinessProbe"]
        assert probe["httpGet"]["path"] == "/ready"
        assert (probe["periodSeconds"], probe["failureThreshold"]) == (1, 1)
        assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
        assert "cpu" not in sidecar["resources"]["limits"]


def test_the_requirement_annotation_is_the_guards_requirement_cluster_floor_included() -> None:
    from kvgate.cmd import cli, guard

    md = make_md(safety__headroom=1.2)  # safety.minEngineVersion 0.5.22, the cluster's 0.5.23
    for role in (Role.PREFILL, Role.DECODE):
        template = builders.deployment(md, REV, role.value, replicas=1, guard=GUARD)["spec"][
            "template"
        ]
        (sidecar,) = template["spec"]["initContainers"]
        held = guard.requirement_of(cli.build_parser().parse_args(sidecar["args"]))
        shown = json.loads(template["metadata"]["annotations"][labels.REQUIREMENT])
        assert shown == {
            "contextLength": held.context_length,
            "headroom": held.headroom,
            "minEngineVersion": "0.5.23",
            "role": role.value,
        }
        assert held.min_version == "0.5.23"


def test_without_a_guard_image_no_sidecar_is_built() -> None:
    for component in builders.COMPONENTS:
        template = builders.deployment(make_md(), REV, component, replicas=1)["spec"]["template"]
        assert "initContainers" not in template["spec"]
    router = builders.deployment(make_md(), REV, "router", replicas=1, guard=GUARD)
    assert "initContainers" not in router["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("engine", "port"),
    [({}, 8471), ({"port": 8471}, 8472), ({"port": 8471, "bootstrapPort": 8472}, 8473)],
)
def test_the_guard_port_never_collides_with_the_engines(engine: dict[str, int], port: int) -> None:
    md = make_md(**{f"engine__{k}": v for k, v in engine.items()})
    sidecar = builders.guard_container(md, Role.PREFILL, REV, GUARD)
    assert sidecar["ports"][0]["containerPort"] == port
    assert sidecar["args"][sidecar["args"].index("--port") + 1] == str(port)


def test_the_guards_resources_are_the_operators_setting_or_the_measured_default() -> None:
    assert builders.guard_container(make_md(), Role.DECODE, REV, GUARD)["resources"] == (
        builders.GUARD_RESOURCES
    )
    larger = {"requests": {"cpu": "20m", "memory": "96Mi"}, "limits": {"memory": "256Mi"}}
    guard = builders.Guard(GUARD.image, GUARD.cluster_floor, resources=larger)
    assert builders.guard_container(make_md(), Role.DECODE, REV, guard)["resources"] == larger

    def hashed(g: builders.Guard) -> str:
        body = builders.deployment(make_md(), REV, "decode", replicas=1, guard=g)
        return str(body["metadata"]["annotations"][labels.TEMPLATE_HASH])

    # The default given explicitly (the chart always passes it) builds the same template, so
    # installing a chart that passes it restarts no engine; another value rolls them once.
    as_default = builders.Guard(GUARD.image, GUARD.cluster_floor, builders.GUARD_RESOURCES)
    assert hashed(as_default) == hashed(GUARD)
    assert hashed(guard) != hashed(GUARD)


def test_the_template_hash_ignores_the_guard_image_but_not_its_requirement() -> None:
    def hashed(g: builders.Guard) -> str:
        body = builders.deployment(make_md(), REV, "decode", replicas=1, guard=g)
        return str(body["metadata"]["annotations"][labels.TEMPLATE_HASH])

    newer = builders.Guard("ghcr.io/kvgate/kvgate-operator:0.3.0", cluster_floor="0.5.23")
    assert hashed(newer) == hashed(GUARD)
    assert hashed(builders.Guard(GUARD.image, cluster_floor="0.5.24")) != hashed(GUARD)
    unguarded = builders.deployment(make_md(), REV, "decode", replicas=1)
    assert unguarded["metadata"]["annotations"][labels.TEMPLATE_HASH] != hashed(GUARD)


# --- engine.transfer: what each KV transfer backend gets in the engine pod ---

RDMA_PLUGIN = {
    "backend": "mooncake",
    "rdma": {"resourceName": "rdma/hca_shared_devices_a", "count": 1},
    "ibDevices": ["mlx5_0", "mlx5_1"],
    "shmSize": "32Gi",
    "hostNetwork": True,
}
RDMA_HOSTPATH = {
    "backend": "mooncake",
    "rdma": {"hostPath": "/dev/infiniband"},
    "ibDevices": ["mlx5_bond_0"],
}
API_KEY = {"name": "engine-api-key", "key": "token"}


def _engine(template: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = template["spec"]["containers"][0]
    return container


def _template(md: Any, role: str = "prefill", guard: Any = None) -> dict[str, Any]:
    body = builders.deployment(md, REV, role, replicas=1, guard=guard)
    template: dict[str, Any] = body["spec"]["template"]
    return template


def test_mooncake_over_rdma_prefill_deployment_matches_golden_file() -> None:
    check_golden(
        "prefill-deployment-mooncake-rdma",
        builders.deployment(
            make_md(engine__transfer=RDMA_PLUGIN), REV, "prefill", replicas=1, guard=GUARD
        ),
    )


def test_rdma_from_a_hostpath_decode_deployment_matches_golden_file() -> None:
    check_golden(
        "decode-deployment-rdma-hostpath",
        builders.deployment(make_md(engine__transfer=RDMA_HOSTPATH), REV, "decode", replicas=1),
    )


@pytest.mark.parametrize(
    "transfer",
    [{}, {"backend": "mooncake_tcp"}, {"backend": "nixl"}, {"shmSize": "64Gi"}],
    ids=["default mooncake", "mooncake_tcp", "nixl over tcp", "bigger shm"],
)
def test_backends_without_rdma_keep_the_restricted_profile(transfer: dict[str, Any]) -> None:
    for role in ("prefill", "decode"):
        template = _template(make_md(engine__transfer=transfer), role)
        engine = _engine(template)
        assert engine["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        }
        assert set(engine["resources"]["limits"]) == {"nvidia.com/gpu"}
        assert "hostNetwork" not in template["spec"]
        assert [v["name"] for v in template["spec"]["volumes"]] == ["dshm"]


def test_rdma_from_a_device_plugin_adds_only_ipc_lock_and_the_device() -> None:
    template = _template(make_md(engine__transfer=RDMA_PLUGIN, prefill__tensorParallel=8))
    engine = _engine(template)
    assert engine["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
        "runAsUser": 0,
        "runAsNonRoot": False,
    }
    for kind in ("limits", "requests"):
        assert engine["resources"][kind] == {"nvidia.com/gpu": 8, "rdma/hca_shared_devices_a": 1}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in template[
        "spec"
    ]["volumes"]


def test_a_hostpath_rdma_device_runs_privileged_with_dev_infiniband_mounted() -> None:
    template = _template(make_md(engine__transfer=RDMA_HOSTPATH))
    engine = _engine(template)
    assert engine["securityContext"] == {"privileged": True, "runAsUser": 0, "runAsNonRoot": False}
    assert {"name": "infiniband", "mountPath": "/dev/infiniband"} in engine["volumeMounts"]
    assert {
        "name": "infiniband",
        "hostPath": {"path": "/dev/infiniband", "type": "Directory"},
    } in template["spec"]["volumes"]


def test_the_guard_sidecar_stays_restricted_whatever_the_engine_needs() -> None:
    template = _template(make_md(engine__transfer=RDMA_HOSTPATH), guard=GUARD)
    (sidecar,) = template["spec"]["initContainers"]
    assert sidecar["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
    }
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True


def test_mooncake_rdma_pod_has_what_sglangs_own_kubernetes_pd_example_has() -> None:
    # SGLang's PD example (docs/references/multi_node_deployment/lws_pd/lws-examples/p.yaml and
    # d.yaml): IPC_LOCK, the RDMA devices, /dev/shm as a memory emptyDir, hostNetwork with
    # ClusterFirstWithHostNet, --disaggregation-ib-device. kvgate takes the device from a device
    # plugin instead of privileged + hostPath, and leaves out hostIPC (DeepEP/NVSHMEM, not KV
    # transfer) and the model-specific flags.
    template = _template(make_md(engine__transfer=RDMA_PLUGIN), "prefill")
    engine, pod = _engine(template), template["spec"]
    assert "IPC_LOCK" in engine["securityContext"]["capabilities"]["add"]
    assert engine["resources"]["limits"]["rdma/hca_shared_devices_a"] == 1
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in engine["volumeMounts"]
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    args = engine["args"]
    assert args[args.index("--disaggregation-ib-device") + 1] == "mlx5_0,mlx5_1"
    assert args[args.index("--disaggregation-transfer-backend") + 1] == "mooncake"


# --- engine.apiKeySecretRef: the key reaches engine, guard and router only through the Secret ---


def test_api_key_decode_deployment_and_router_match_golden_files() -> None:
    md = make_md(engine__apiKeySecretRef=API_KEY)
    check_golden(
        "decode-deployment-api-key",
        builders.deployment(md, REV, "decode", replicas=1, guard=GUARD),
    )
    check_golden("router-deployment-api-key", builders.deployment(md, REV, "router", replicas=1))


def test_api_key_goes_to_engine_guard_and_router_from_the_secret() -> None:
    md = make_md(engine__apiKeySecretRef=API_KEY)
    from_secret = {
        "name": "KVGATE_ENGINE_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "engine-api-key", "key": "token"}},
    }
    template = _template(md, "decode", guard=GUARD)
    engine, (sidecar,) = _engine(template), template["spec"]["initContainers"]
    assert from_secret in engine["env"] and sidecar["env"] == [from_secret]
    args = engine["args"]
    assert args[args.index("--api-key") + 1] == "$(KVGATE_ENGINE_API_KEY)"
    router = builders.deployment(md, REV, "router", replicas=1)["spec"]["template"]
    (container,) = router["spec"]["containers"]
    assert from_secret in container["env"]
    assert container["args"][container["args"].index("--api-key") + 1] == (
        "$(KVGATE_ENGINE_API_KEY)"
    )


def test_without_an_api_key_nobody_gets_one() -> None:
    md = make_md()
    text = json.dumps(
        [builders.deployment(md, REV, c, replicas=1, guard=GUARD) for c in builders.COMPONENTS]
    )
    assert "--api-key" not in text and "KVGATE_ENGINE_API_KEY" not in text
