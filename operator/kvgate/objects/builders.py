"""Pure builders: ModelDeployment + revision -> the Kubernetes objects kvgate owns (plain dicts).

Per revision: ``<md>-<rev>-prefill`` and ``<md>-<rev>-decode`` engine Deployments and a
``<md>-<rev>-router`` smg Deployment whose service discovery selects only that revision's pods
(so a prefill pod is never paired with a decode pod of another revision). Per ModelDeployment:
the router's ServiceAccount/Role/RoleBinding and the stable Service ``<md>`` whose selector names
the serving revision's routers (switching traffic is a selector change).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate_engine.launcher import API_KEY_ENV, engine_argv, engine_env
from kvgate_engine.verdict import Requirement

from kvgate.api import labels, multinode, requirements
from kvgate.api.models import (
    INFINIBAND_DEVICE_DIR,
    MODEL_MOUNT_PATH,
    EngineSpec,
    LocalObjectReference,
    ModelDeployment,
    ModelDeploymentSpec,
    Role,
    RoleSpec,
    Toleration,
)
from kvgate.objects import model_source, router_auth
from kvgate.objects.engine_launch import engine_launch

# Non-root UID/GID for engine and router containers. NVIDIA's container toolkit creates the
# /dev/nvidia* device nodes world read-writable, so CUDA works without root; the image's own
# HOME (often /root) is not writable by this UID, so HOME points at /tmp (HF, Triton and
# FlashInfer caches land there).
RUN_AS_USER = 1000
TERMINATION_GRACE_SECONDS = 60
ROUTER_METRICS_PORT = 29000  # smg's Prometheus listener (its default port), read by the step check

Body = dict[str, Any]

# The pod-local guard (kvgate.cmd.guard), a native sidecar of every engine pod.
GUARD_CONTAINER = "kvgate-guard"
GUARD_PORT = 8471  # the next free one when the engine uses it (guard_port)
GUARD_PORT_NAME = "kvgate-guard"
GUARD_PERIOD_SECONDS = 2  # engine read interval; NotReady within 2 x this of a shrunk pool
GUARD_RESOURCES: Body = {
    # Measured: ~38 MiB RSS, ~3 millicores reading a 33 KB /server_info every 2 s. No CPU
    # limit: throttling would only make its reads late (and the pod NotReady). The chart's
    # guard.resources default is this (KVGATE_GUARD_RESOURCES).
    "requests": {"cpu": "10m", "memory": "64Mi"},
    "limits": {"memory": "128Mi"},
}


# The engine pod's volumes and the engine container's mount paths that are kvgate's: a role's
# extraVolumes and extraVolumeMounts never take these (kvgate.admission.pod_fit).
SHM_VOLUME = "dshm"
INFINIBAND_VOLUME = "infiniband"
KVGATE_VOLUMES: tuple[str, ...] = (SHM_VOLUME, model_source.MODEL_VOLUME, INFINIBAND_VOLUME)
KVGATE_MOUNT_PATHS: tuple[str, ...] = ("/dev/shm", MODEL_MOUNT_PATH, INFINIBAND_DEVICE_DIR)


# kvgate's own image where the operator knows none (KVGATE_GUARD_IMAGE unset, i.e. outside the
# chart): the chart's default, which the download init container (kvgate fetch-model) runs.
DEFAULT_KVGATE_IMAGE = "ghcr.io/kvgate/kvgate-operator:0.1.0"


@dataclass(frozen=True)
class Guard:
    """What engine pods' guard sidecar needs from the operator's settings."""

    image: str  # kvgate's own image (KVGATE_GUARD_IMAGE, set by the chart)
    cluster_floor: str | None = None  # KVGATE_MIN_ENGINE_VERSION_FLOOR
    # KVGATE_GUARD_RESOURCES (chart value guard.resources); None: GUARD_RESOURCES. Part of the
    # template hash, so a change rolls every revision's engine pods once.
    resources: Mapping[str, Any] | None = None
    # KVGATE_ENGINE_IMAGE_PULL_SECRETS (the chart's imagePullSecrets): the guard and the model
    # download run kvgate's own image, so every engine pod may need them to pull it.
    pull_secrets: tuple[str, ...] = ()


def component_name(md_name: str, revision: str, component: str) -> str:
    """``<md>-<rev>-prefill|decode|router``."""
    return f"{md_name}-{revision}-{component}"


def router_account_name(md_name: str) -> str:
    return f"{md_name}-router"


def router_control_secret_name(md_name: str) -> str:
    """The Secret holding the router's control-plane key (``<md>-router-control``)."""
    return f"{md_name}-router-control"


def selector_labels(md_name: str, revision: str, component: str) -> dict[str, str]:
    """Labels that identify one revision's prefill, decode or router pods."""
    is_router = component == labels.ROLE_ROUTER
    return {
        labels.DEPLOYMENT: md_name,
        labels.REVISION: revision,
        labels.ROLE: component,
        labels.COMPONENT: labels.COMPONENT_ROUTER if is_router else labels.COMPONENT_ENGINE,
    }


def object_labels(md_name: str, revision: str, component: str) -> dict[str, str]:
    return {
        **selector_labels(md_name, revision, component),
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
    }


def owner_reference(md: ModelDeployment) -> Body:
    return {
        "apiVersion": md.api_version,
        "kind": md.kind,
        "name": md.metadata.name,
        "uid": md.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(md: ModelDeployment, name: str, obj_labels: dict[str, str]) -> Body:
    return {
        "name": name,
        "namespace": md.metadata.namespace,
        "labels": obj_labels,
        "ownerReferences": [owner_reference(md)],
    }


def engine_requirement(
    md: ModelDeployment, role: Role, revision: str, cluster_floor: str | None
) -> Requirement:
    """What ``revision``'s ``role`` engines must prove: the spec's requirement with the cluster
    floor (kvgate.api.requirements), the one the operator verifies them against."""
    requirement = requirements.requirement_for(
        spec=md.spec,
        target_revision=revision,
        status=None,
        revision=revision,
        role=role.value,
        cluster_floor=cluster_floor,
    )
    assert requirement is not None  # the target revision's requirement is the spec's
    return requirement


def requirement_annotation(requirement: Requirement) -> str:
    """The requirement the guard holds the pod's engine to, as JSON for people and tools reading
    the pod. Nothing in kvgate reads it back (a namespace editor may annotate pods): the
    verifier derives the requirement from the ModelDeployment, the guard from its arguments."""
    return json.dumps(
        {
            "contextLength": requirement.context_length,
            "headroom": requirement.headroom,
            "minEngineVersion": requirement.min_version,
            "role": requirement.role,
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """``python3 -m sglang.launch_server --flag ...`` -> (command, args) at the first flag."""
    for i, item in enumerate(argv):
        if item.startswith("--"):
            return argv[:i], argv[i:]
    return argv, []


def _quantities(
    values: dict[str, int | str], gpus: int, accelerator: str, engine: EngineSpec
) -> dict[str, int | str]:
    """The user's quantities with kvgate's accelerator count (admission denies another count
    for it; a spec that skipped admission still gets kvgate's) and the RDMA device."""
    quantities: dict[str, int | str] = {**values, accelerator: gpus}
    rdma = engine.transfer.rdma
    if rdma is not None and rdma.resource_name is not None:
        quantities[rdma.resource_name] = rdma.count
    return quantities


def _engine_security(engine: EngineSpec) -> Body:
    """The engine container's securityContext for its transfer backend.

    Without RDMA (mooncake_tcp, nixl over TCP): the restricted profile. With an RDMA device from
    a device plugin: IPC_LOCK (RDMA registers, so pins, the KV pool's memory) and nothing else;
    the container runs as root because Kubernetes puts added capabilities in the effective set
    of root processes only (no ambient capabilities). With /dev/infiniband from a hostPath:
    privileged, as in SGLang's own PD examples
    (docs/references/multi_node_deployment/lws_pd/lws-examples/p.yaml), because the device
    cgroup admits hostPath device nodes only to privileged containers."""
    rdma = engine.transfer.rdma
    if rdma is None:
        return _restricted_container_security()
    if rdma.host_path is not None:
        return {"privileged": True, "runAsUser": 0, "runAsNonRoot": False}
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
        "runAsUser": 0,
        "runAsNonRoot": False,
    }


def api_key_env(engine: EngineSpec) -> list[Body]:
    """``KVGATE_ENGINE_API_KEY`` from spec.engine.apiKeySecretRef (empty without one)."""
    ref = engine.api_key_secret_ref
    if ref is None:
        return []
    return [
        {
            "name": API_KEY_ENV,
            "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
        }
    ]


def _restricted_container_security() -> Body:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }


def _pod_security() -> Body:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def guard_port(engine: EngineSpec) -> int:
    """The guard's port: GUARD_PORT, or the next one the engine does not use."""
    taken = {engine.port, engine.bootstrap_port}
    port = GUARD_PORT
    while port in taken:
        port += 1
    return port


def guard_container(md: ModelDeployment, role: Role, revision: str, guard: Guard) -> Body:
    """The guard sidecar of ``revision``'s ``role`` pods: an init container with
    ``restartPolicy: Always`` whose readiness is "the engine on localhost meets this revision's
    requirement" (kvgate.cmd.guard). The requirement is the one the operator verifies the target
    revision against (spec + cluster floor), written here as arguments: never read from the
    engine."""
    requirement = engine_requirement(md, role, revision, guard.cluster_floor)
    port = guard_port(md.spec.engine)
    return {
        "name": GUARD_CONTAINER,
        "image": guard.image,
        # Native sidecar (KEP-753): started before the engine, restarted when it exits, stopped
        # after it, and its readiness counts toward the pod's Ready condition.
        "restartPolicy": "Always",
        "command": ["kvgate"],  # the image's ENTRYPOINT is `kvgate operator`
        "args": [
            "guard",
            "--engine-port",
            str(md.spec.engine.port),
            "--role",
            role.value,
            "--context-length",
            str(requirement.context_length),
            "--headroom",
            repr(float(requirement.headroom)),
            "--min-version",
            requirement.min_version,
            "--port",
            str(port),
            "--period",
            str(GUARD_PERIOD_SECONDS),
        ],
        "ports": [{"name": GUARD_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": GUARD_PORT_NAME},
            "periodSeconds": 1,
            "timeoutSeconds": 1,
            "successThreshold": 1,
            "failureThreshold": 1,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": GUARD_PORT_NAME},
            "periodSeconds": 10,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        "resources": copy.deepcopy(
            GUARD_RESOURCES if guard.resources is None else dict(guard.resources)
        ),
        "securityContext": {**_restricted_container_security(), "readOnlyRootFilesystem": True},
        **({"env": api_key_env(md.spec.engine)} if md.spec.engine.api_key_secret_ref else {}),
    }


def _engine_volumes(
    spec: ModelDeploymentSpec, role_spec: RoleSpec
) -> tuple[list[Body], list[Body]]:
    """The engine container's volume mounts and the pod's volumes, in the same order: /dev/shm,
    the model's weights (spec.model.source), the host's InfiniBand devices (RDMA), then the
    role's extraVolumes and extraVolumeMounts."""
    transfer = spec.engine.transfer
    mounts: list[Body] = [{"name": SHM_VOLUME, "mountPath": KVGATE_MOUNT_PATHS[0]}]
    volumes: list[Body] = [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": transfer.shm_size}}
    ]
    weights = model_source.model_volume(spec.model)
    weights_mount = model_source.engine_mount(spec.model)
    if weights is not None and weights_mount is not None:
        mounts.append(weights_mount)
        volumes.append(weights)
    if transfer.rdma is not None and transfer.rdma.host_path is not None:
        mounts.append({"name": INFINIBAND_VOLUME, "mountPath": INFINIBAND_DEVICE_DIR})
        volumes.append(
            {
                "name": INFINIBAND_VOLUME,
                "hostPath": {"path": transfer.rdma.host_path, "type": "Directory"},
            }
        )
    # Admission denies extra volumes that take kvgate's names or mount over its paths; one that
    # skipped it never replaces kvgate's own.
    own = {v["name"] for v in volumes}
    extra = [copy.deepcopy(v) for v in role_spec.extra_volumes if v.get("name") not in own]
    extra_names = {v.get("name") for v in extra}
    volumes += extra
    mounts += [
        m.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)
        | {"name": m.name, "mountPath": m.mount_path}
        for m in role_spec.extra_volume_mounts
        if m.name in extra_names
    ]
    return mounts, volumes


def user_pod_metadata(role_spec: RoleSpec) -> tuple[dict[str, str], dict[str, str]]:
    """The role's podLabels and podAnnotations without any key kvgate keeps for itself
    (admission denies those; a spec that skipped it never sets them)."""
    return (
        {k: v for k, v in role_spec.pod_labels.items() if not labels.reserved_key(k)},
        {k: v for k, v in role_spec.pod_annotations.items() if not labels.reserved_key(k)},
    )


def pull_secrets(given: list[LocalObjectReference], guard: Guard | None) -> list[Body]:
    """The spec's imagePullSecrets, then the operator's (for kvgate's own image), each once."""
    names = [ref.name for ref in given] + list(guard.pull_secrets if guard else ())
    return [{"name": n} for n in dict.fromkeys(names)]


def _engine_env(
    spec: ModelDeploymentSpec, role_spec: RoleSpec, launch_env: dict[str, str]
) -> list[Body]:
    """engine.env, then the role's extraEnv (a name in both takes the role's value), HOME, the
    launcher's SGLang settings (spec.safety's, whatever the spec's env says) and the API key from
    its Secret (kvgate's, whatever the spec's env says)."""
    role_env = [e.model_dump(by_alias=True, exclude_none=True) for e in role_spec.extra_env]
    overridden = {e["name"] for e in role_env}
    env: list[Body] = [
        e.model_dump(by_alias=True, exclude_none=True)
        for e in spec.engine.env
        if e.name not in overridden
    ] + role_env
    env = [e for e in env if e["name"] != API_KEY_ENV and e["name"] not in launch_env]
    if not any(e["name"] == "HOME" for e in env):
        env.append({"name": "HOME", "value": "/tmp"})
    env += [{"name": name, "value": value} for name, value in launch_env.items()]
    return env + api_key_env(spec.engine)


def _engine_init_containers(
    md: ModelDeployment, role: Role, revision: str, guard: Guard | None
) -> list[Body]:
    """The model download (spec.model.source.download), then the guard sidecar."""
    init_containers: list[Body] = []
    fetch = model_source.fetch_container(
        md.spec.model,
        guard.image if guard else DEFAULT_KVGATE_IMAGE,
        _restricted_container_security(),
    )
    if fetch is not None:
        # Before the guard: the weights must be in place before anything waits for the engine.
        init_containers.append(fetch)
    if guard:
        init_containers.append(guard_container(md, role, revision, guard))
    return init_containers


def engine_pod_template(
    md: ModelDeployment, role: Role, revision: str, guard: Guard | None = None
) -> Body:
    spec = md.spec
    role_spec: RoleSpec = spec.prefill if role is Role.PREFILL else spec.decode
    name = md.metadata.name or ""
    user_labels, user_annotations = user_pod_metadata(role_spec)
    requirement = engine_requirement(md, role, revision, guard.cluster_floor if guard else None)
    annotations = {**user_annotations, labels.REQUIREMENT: requirement_annotation(requirement)}
    if role is Role.PREFILL:
        annotations[labels.BOOTSTRAP_PORT] = str(spec.engine.bootstrap_port)
    container = _engine_container(spec, role_spec, role)
    container["volumeMounts"], volumes = _engine_volumes(spec, role_spec)
    init_containers = _engine_init_containers(md, role, revision, guard)
    pod_spec: Body = {
        "containers": [container],
        "readinessGates": [{"conditionType": labels.ENGINE_VERIFIED}],
        # Without a guard image (kvgate run outside its chart) there is no second key: the gate
        # alone decides, and goes stale while the operator is down.
        **({"initContainers": init_containers} if init_containers else {}),
        "securityContext": _pod_security(),
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "volumes": volumes,
        # The engine needs no API access; only the router (smg discovery) does.
        "automountServiceAccountToken": False,
    }
    _engine_platform_fields(pod_spec, spec, role_spec, guard)
    return {
        "metadata": {
            "labels": {**user_labels, **object_labels(name, revision, role.value)},
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


def _engine_container(spec: ModelDeploymentSpec, role_spec: RoleSpec, role: Role) -> Body:
    """The engine container (without its mounts): SGLang's exact command line, its ports,
    resources, readiness probe and security context."""
    launch = engine_launch(spec, role)
    command, args = split_command(engine_argv(launch))
    ports: list[Body] = [{"name": "http", "containerPort": spec.engine.port, "protocol": "TCP"}]
    if role is Role.PREFILL:
        ports.append(
            {"name": "bootstrap", "containerPort": spec.engine.bootstrap_port, "protocol": "TCP"}
        )
    return {
        "name": "engine",
        "image": spec.engine.image,
        "command": command,
        "args": args,
        "env": _engine_env(spec, role_spec, engine_env(launch)),
        "ports": ports,
        "resources": {
            # tensorParallel / nodes: a multi-node engine's GPUs are spread over its pods.
            "limits": _quantities(
                role_spec.resources.limits,
                multinode.gpus_per_pod(role_spec),
                role_spec.accelerator_resource,
                spec.engine,
            ),
            "requests": _quantities(
                role_spec.resources.requests,
                multinode.gpus_per_pod(role_spec),
                role_spec.accelerator_resource,
                spec.engine,
            ),
        },
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": spec.engine.port},
            "periodSeconds": 5,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "securityContext": _engine_security(spec.engine),
    }


def _engine_platform_fields(
    pod_spec: Body, spec: ModelDeploymentSpec, role_spec: RoleSpec, guard: Guard | None
) -> None:
    """What the spec asks of the platform: the host network for RDMA, placement, the
    ServiceAccount, the priority and the pull secrets (none of it touches the gate)."""
    if spec.engine.transfer.host_network:
        # As SGLang's RDMA examples run (RoCE over the host's interfaces); the cluster DNS stays
        # reachable only with this dnsPolicy.
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    _place(pod_spec, role_spec.node_selector, role_spec.tolerations, role_spec.affinity)
    if role_spec.topology_spread_constraints:
        pod_spec["topologySpreadConstraints"] = copy.deepcopy(role_spec.topology_spread_constraints)
    if role_spec.service_account_name:
        pod_spec["serviceAccountName"] = role_spec.service_account_name
    if role_spec.priority_class_name:
        pod_spec["priorityClassName"] = role_spec.priority_class_name
    secrets = pull_secrets(role_spec.image_pull_secrets, guard)
    if secrets:
        pod_spec["imagePullSecrets"] = secrets


def _place(
    pod_spec: Body,
    node_selector: Mapping[str, str],
    tolerations: list[Toleration],
    affinity: Mapping[str, Any] | None,
) -> None:
    """A pod's nodeSelector, tolerations and affinity, each only when set."""
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        pod_spec["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in tolerations
        ]
    if affinity:
        pod_spec["affinity"] = copy.deepcopy(dict(affinity))


def router_argv(md: ModelDeployment, revision: str) -> list[str]:
    """smg flags: PD mode, Kubernetes discovery of this revision's engine pods only."""
    spec = md.spec
    name = md.metadata.name or ""

    def selector(role: Role) -> list[str]:
        return [f"{k}={v}" for k, v in selector_labels(name, revision, role.value).items()]

    return [
        "--pd-disaggregation",
        "--service-discovery",
        "--service-discovery-namespace",
        md.metadata.namespace or "default",
        "--service-discovery-port",
        str(spec.engine.port),
        "--prefill-selector",
        *selector(Role.PREFILL),
        "--decode-selector",
        *selector(Role.DECODE),
        "--host",
        "0.0.0.0",
        "--port",
        str(spec.router.port),
        # Its Prometheus listener, read by the operator's progressive step check.
        "--prometheus-port",
        str(ROUTER_METRICS_PORT),
        # A discovered pod is Ready only once kvgate verified it, so its /health already
        # answers; if smg's first start-up check still misses, its default 30 s retry would
        # keep a verified engine out of traffic that long (and after every re-verification).
        "--worker-startup-check-interval",
        "1",
        # smg drains in-flight requests for up to 180 s on SIGTERM by default; finish within
        # the pod's grace period instead of being SIGKILLed mid-drain.
        "--shutdown-grace-period-secs",
        str(TERMINATION_GRACE_SECONDS - 10),
        # Worker API (/workers ...) only with the operator's key: nobody who merely reaches the
        # Service can add an engine kvgate did not verify (router_auth).
        "--control-plane-api-keys",
        router_auth.smg_key_argument(),
        # smg sends it as a Bearer token to the engines (registration reads /server_info and
        # /v1/models) and then also requires it from clients on the data path.
        *(["--api-key", f"$({API_KEY_ENV})"] if spec.engine.api_key_secret_ref else []),
        *spec.router.args,
    ]


def router_pod_template(
    md: ModelDeployment, revision: str, key_fingerprint: str | None = None
) -> Body:
    spec = md.spec
    name = md.metadata.name or ""
    container = _router_container(md, revision)
    router_resources = spec.router.resources
    if router_resources.limits or router_resources.requests:
        container["resources"] = router_resources.model_dump(by_alias=True, exclude_defaults=True)
    template_meta: Body = {"labels": object_labels(name, revision, labels.ROLE_ROUTER)}
    if key_fingerprint:
        # A new key (new operator seed) changes the template, so the routers roll onto it.
        template_meta["annotations"] = {labels.ROUTER_KEY_FINGERPRINT: key_fingerprint}
    pod_spec: Body = {
        "serviceAccountName": router_account_name(name),
        "containers": [container],
        "securityContext": _pod_security(),
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
    }
    router = spec.router
    _place(pod_spec, router.node_selector, router.tolerations, router.affinity)
    secrets = pull_secrets(router.image_pull_secrets, None)
    if secrets:
        pod_spec["imagePullSecrets"] = secrets
    return {"metadata": template_meta, "spec": pod_spec}


def _router_container(md: ModelDeployment, revision: str) -> Body:
    """The smg router container: its command line, the control-plane key from its Secret, its
    ports and probes."""
    spec, port = md.spec, md.spec.router.port
    return {
        "name": "router",
        "image": spec.router.image,
        "command": ["smg", "launch"],
        "args": router_argv(md, revision),
        "env": [
            {
                "name": router_auth.ENV_VAR,
                "valueFrom": {
                    "secretKeyRef": {
                        "name": router_control_secret_name(md.metadata.name or ""),
                        "key": router_auth.SECRET_KEY,
                    }
                },
            },
            *api_key_env(spec.engine),
        ],
        "ports": [
            {"name": "http", "containerPort": port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"},
        ],
        # /readiness is 503 unless the router holds a ready prefill AND a ready decode worker,
        # and engine pods are Ready only once verified: a router is Ready only when both roles
        # of its revision have verified pods.
        "readinessProbe": {
            "httpGet": {"path": "/readiness", "port": port},
            "periodSeconds": 2,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/liveness", "port": port},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "securityContext": {**_restricted_container_security(), "readOnlyRootFilesystem": True},
    }


def template_hash(body: Body) -> str:
    """Hash of a built object; stored on it so a changed builder output can be detected.

    The images of the guard sidecar and the download init container are left out: they are the
    operator's own image, so counting them would restart every engine (and drop a one-replica
    role's traffic while it reloads) on each operator upgrade. A revision keeps the images it
    was created with; new revisions, and any builder change that alters the template, take the
    current one."""
    view = copy.deepcopy(body)
    for container in view.get("spec", {}).get("initContainers", []):
        if container.get("name") in (GUARD_CONTAINER, model_source.FETCH_CONTAINER):
            container.pop("image", None)
    canonical = json.dumps(view, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def deployment(
    md: ModelDeployment,
    revision: str,
    component: str,
    *,
    replicas: int,
    annotations: dict[str, str] | None = None,
    router_key_fingerprint: str | None = None,
    guard: Guard | None = None,
) -> Body:
    """The Deployment of one revision's prefill, decode or router pods (engine pods carry the
    guard sidecar when ``guard`` is given)."""
    name = md.metadata.name or ""
    if component == labels.ROLE_ROUTER:
        template = router_pod_template(md, revision, router_key_fingerprint)
        strategy: Body = {"type": "RollingUpdate"}
    else:
        template = engine_pod_template(md, Role(component), revision, guard)
        # A revision's template only changes when kvgate itself is upgraded; never ask for a
        # spare GPU to surge into.
        strategy = {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
        }
    spec: Body = {
        "replicas": replicas,
        "selector": {"matchLabels": selector_labels(name, revision, component)},
        "strategy": strategy,
        "template": template,
    }
    meta = _metadata(
        md, component_name(name, revision, component), object_labels(name, revision, component)
    )
    meta["annotations"] = {
        labels.TEMPLATE_HASH: template_hash(spec["template"]),
        **(annotations or {}),
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


def service(md: ModelDeployment, serving_revision: str, *, split: bool = False) -> Body:
    """The stable Service ``<md>`` in front of the serving revision's routers (``split``: of
    every router of the ModelDeployment, a progressive step; see kvgate.rollout.progressive)."""
    name = md.metadata.name or ""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            **_metadata(
                md,
                name,
                {labels.DEPLOYMENT: name, labels.MANAGED_BY: labels.MANAGED_BY_VALUE},
            ),
        },
        "spec": {
            "type": "ClusterIP",
            "selector": split_selector(name) if split else service_selector(name, serving_revision),
            "ports": [
                {
                    "name": "http",
                    "port": md.spec.router.port,
                    "targetPort": "http",
                    "protocol": "TCP",
                }
            ],
        },
    }


def service_url(md: ModelDeployment) -> str:
    """The in-cluster URL of the Service ``service`` builds (``status.url``): cluster DNS
    resolves ``<service>.<namespace>.svc`` from any pod, whatever the cluster's domain."""
    return f"http://{md.metadata.name}.{md.metadata.namespace}.svc:{md.spec.router.port}"


def split_selector(md_name: str) -> dict[str, str]:
    """Every router of the ModelDeployment: the planner runs routers only for the revisions in
    the traffic set while the Service selects this."""
    return {labels.DEPLOYMENT: md_name, labels.COMPONENT: labels.COMPONENT_ROUTER}


def service_selector(md_name: str, revision: str) -> dict[str, str]:
    return {
        labels.DEPLOYMENT: md_name,
        labels.COMPONENT: labels.COMPONENT_ROUTER,
        labels.REVISION: revision,
    }


def router_service_account(md: ModelDeployment) -> Body:
    name = md.metadata.name or ""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(md, router_account_name(name), _md_labels(name)),
    }


def router_control_secret(md: ModelDeployment, key: str) -> Body:
    """The router's control-plane key, owned by the ModelDeployment."""
    name = md.metadata.name or ""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(md, router_control_secret_name(name), _md_labels(name)),
        "type": "Opaque",
        "data": {router_auth.SECRET_KEY: base64.b64encode(key.encode()).decode()},
    }


def router_role(md: ModelDeployment) -> Body:
    """smg's Kubernetes discovery lists and watches pods in its namespace; nothing else."""
    name = md.metadata.name or ""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(md, router_account_name(name), _md_labels(name)),
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }


def router_role_binding(md: ModelDeployment) -> Body:
    name = md.metadata.name or ""
    account = router_account_name(name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(md, account, _md_labels(name)),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
        "subjects": [
            {"kind": "ServiceAccount", "name": account, "namespace": md.metadata.namespace}
        ],
    }


def _md_labels(md_name: str) -> dict[str, str]:
    return {
        labels.DEPLOYMENT: md_name,
        labels.COMPONENT: labels.COMPONENT_ROUTER,
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
    }


COMPONENTS: tuple[str, ...] = (Role.PREFILL.value, Role.DECODE.value, labels.ROLE_ROUTER)
