"""Host paths and pods that cannot be created, as a tenant (``kubectl --as`` a ServiceAccount bound
to ``edit``) meets them in a namespace without Pod Security labels, where nothing but kvgate's
webhook stands between a ModelDeployment and the node's files:

- ``spec.model.source.hostPath`` outside the directories the cluster admin allows (the chart
  value ``hostPaths.modelPrefixes``; the e2e release allows one, ``MODEL_HOST_PATH_PREFIX``), e.g.
  the node's ``/etc`` with ``DirectoryOrCreate``: denied, naming the field, the path and the value;
- ``spec.engine.transfer.rdma.hostPath: /`` (the node's whole root in a privileged engine):
  denied, naming the field, the path and ``hostPaths.rdmaDevices``;
- a hostPath under the allowed prefix: admitted, and its Deployments mount exactly that path;
- engine pods a ResourceQuota of the namespace forbids (the cluster admin's): the
  ModelDeployment says so within seconds with the ReplicaSet's own reason (``FailedCreate``) and
  message, instead of "0/1 verified" until the verification deadline.

Run (root): ``flock /tmp/kvgate-e2e.lock .venv/bin/pytest -q -s -m e2e
e2e/tests/test_attack_host_paths.py``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml
from kvgate_e2e.deadlines import EVENT_DEADLINE, PASS_DEADLINE, QUOTA_DEADLINE
from kvgate_e2e.world import MODEL_HOST_PATH_PREFIX, OPERATOR_NAMESPACE, RELEASE, World, condition
from scenario_helpers import (
    deadline_loop,
    events,
    make_tenant,
    md_condition,
    md_story,
    sample_md,
)

pytestmark = pytest.mark.e2e

WEBHOOK = 'admission webhook "validate-modeldeployment.kvgate.io" denied the request'
# The e2e release's webhook Deployment: <fullname>-webhook.
WEBHOOK_DEPLOYMENT = f"{RELEASE}-webhook"
# Deadlines, not bounds (the run prints how soon FailedCreate was said): only a step that never
# happens reaches one. Shared ones come from kvgate_e2e.deadlines.
# EnginesVerified saying FailedCreate: the ReplicaSet's first create fails at once and that wakes
# the operator's pass (seconds); what the test asserts is elapsed < half verifyTimeoutSeconds.
FAILED_CREATE_DEADLINE = 120


def assert_denied(result: Any, *phrases: str) -> str:
    err = str(result.stderr)
    assert result.returncode != 0, f"the API server admitted it:\n{result.stdout}"
    for phrase in phrases:
        assert phrase in err, f"{phrase!r} not in: {err[-2000:]}"
    start = err.find("denied the request")
    print(f"DENIED: {err[max(start, 0) :].strip()[:900]}")
    return err


def webhook_env(world: World) -> dict[str, str]:
    """The environment the chart gave the webhook pods (what the release was installed with)."""
    deployment = world.get("deployment", WEBHOOK_DEPLOYMENT, OPERATOR_NAMESPACE)
    assert deployment is not None
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: str(e.get("value")) for e in container["env"] if "value" in e}


def with_model_host_path(name: str, path: str, kind: str) -> dict[str, Any]:
    md = sample_md(name)
    md["spec"]["model"]["source"] = {"hostPath": {"path": path, "type": kind}}
    return md


def test_a_model_host_path_outside_the_allowed_prefixes_is_denied_naming_the_chart_value(
    world: World, namespace: str
) -> None:
    tenant = make_tenant(world, namespace)
    for path, kind in (("/etc", "DirectoryOrCreate"), ("/var/lib/kubelet", "Directory")):
        md = with_model_host_path("llama", path, kind)
        denied = tenant.kubectl("apply", "-f", "-", input=yaml.safe_dump(md))
        assert_denied(
            denied,
            WEBHOOK,
            f"spec.model.source.hostPath.path: {path} ",
            "hostPaths.modelPrefixes",
            MODEL_HOST_PATH_PREFIX,
        )
        assert world.get_md("llama", namespace) is None
    # A path that only looks like it is under the prefix.
    escape = f"{MODEL_HOST_PATH_PREFIX}/../../../etc"
    denied = tenant.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump(with_model_host_path("llama", escape, "Directory"))
    )
    assert_denied(denied, WEBHOOK, "spec.model.source.hostPath.path", "'..'")
    assert world.list("deployments", namespace) == []


def test_an_rdma_host_path_other_than_the_infiniband_directory_is_denied(
    world: World, namespace: str
) -> None:
    tenant = make_tenant(world, namespace)
    md = sample_md("llama")
    md["spec"]["engine"]["transfer"] = {"backend": "mooncake", "rdma": {"hostPath": "/"}}
    denied = tenant.kubectl("apply", "-f", "-", input=yaml.safe_dump(md))
    assert_denied(
        denied,
        WEBHOOK,
        "spec.engine.transfer.rdma.hostPath: / ",
        "hostPaths.rdmaDevices",
        "/dev/infiniband",
    )
    assert world.get_md("llama", namespace) is None
    assert world.list("deployments", namespace) == []


def test_a_model_host_path_under_an_allowed_prefix_is_admitted_and_mounted_as_written(
    world: World, namespace: str
) -> None:
    env = webhook_env(world)
    assert MODEL_HOST_PATH_PREFIX in env.get("KVGATE_MODEL_HOST_PATH_PREFIXES", ""), env
    tenant = make_tenant(world, namespace)
    path = f"{MODEL_HOST_PATH_PREFIX}/llama-3.1-8b"
    md = with_model_host_path("llama", path, "DirectoryOrCreate")
    applied = tenant.kubectl("apply", "-f", "-", input=yaml.safe_dump(md))
    assert applied.returncode == 0, applied.stderr
    # kubectl prints the webhook's warnings: a hostPath still needs the privileged Pod Security
    # level, and the same weights on every node.
    assert "Pod Security" in str(applied.stderr), applied.stderr

    def engine_volumes() -> list[dict[str, Any]] | None:
        found = world.list("deployments", namespace, "kvgate.io/deployment=llama")
        engines = [d for d in found if d["metadata"]["labels"]["kvgate.io/role"] != "router"]
        if len(engines) < 2:
            return None
        return [v for d in engines for v in d["spec"]["template"]["spec"].get("volumes") or []]

    volumes = deadline_loop(
        "kvgate to build the engine Deployments", engine_volumes, PASS_DEADLINE, period=0.5
    )
    host_paths = [v["hostPath"] for v in volumes if "hostPath" in v]
    assert host_paths == [{"path": path, "type": "DirectoryOrCreate"}] * 2, volumes


def test_engine_pods_a_quota_forbids_are_reported_at_once_with_the_replica_sets_reason(
    world: World, namespace: str
) -> None:
    # The cluster admin's quota: no GPUs in this namespace, so no engine pod can be created
    # (the router needs none and runs).
    world.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "no-gpus"},
            "spec": {"hard": {"requests.nvidia.com/gpu": "0"}},
        },
        namespace,
    )
    # The quota admission needs the quota controller's first count before it admits anything.
    deadline_loop(
        "the quota controller to count the namespace's usage",
        lambda: (
            (world.get("resourcequota", "no-gpus", namespace) or {}).get("status", {}).get("hard")
        ),
        QUOTA_DEADLINE,
    )
    tenant = make_tenant(world, namespace)
    applied_at = time.monotonic()
    applied = tenant.kubectl("apply", "-f", "-", input=yaml.safe_dump(sample_md("llama")))
    assert applied.returncode == 0, applied.stderr

    def says_failed_create() -> dict[str, Any] | None:
        verified = md_condition(world, "llama", namespace, "EnginesVerified")
        if verified is None or verified.get("reason") != "FailedCreate":
            return None
        return verified

    # The ReplicaSet controller's first create fails at once, the Deployment controller copies
    # its ReplicaFailure condition, and that event wakes the operator's pass: seconds. The bound
    # is the old answer's distance: the sample's verification deadline is 900 s.
    verified = deadline_loop(
        "EnginesVerified to say the engine pods cannot be created",
        says_failed_create,
        FAILED_CREATE_DEADLINE,
        details=lambda: md_story(world, "llama", namespace),
    )
    elapsed = time.monotonic() - applied_at
    print(f"MEASURED FailedCreate on the ModelDeployment {elapsed:.1f} s after kubectl apply")
    print(f"EnginesVerified: {verified['message']}")
    message = verified["message"]
    assert verified["status"] == "False"
    assert "exceeded quota: no-gpus" in message, message
    assert "requests.nvidia.com/gpu" in message, message
    assert "Deployment llama-" in message and "cannot create its pods" in message, message
    md = world.get_md("llama", namespace)
    assert md is not None
    ready = condition(md, "Ready")
    assert ready is not None and ready["status"] == "False", ready
    assert "exceeded quota: no-gpus" in ready["message"], ready
    progressing = condition(md, "Progressing")
    assert progressing is not None and "exceeded quota: no-gpus" in progressing["message"]
    warned = deadline_loop(
        "a FailedCreate Event on the ModelDeployment",
        lambda: [
            e
            for e in events(world, namespace, "FailedCreate")
            if e["involvedObject"].get("kind") == "ModelDeployment"
        ],
        EVENT_DEADLINE,
    )
    assert "exceeded quota: no-gpus" in warned[0]["message"], warned
    assert len(warned) == 1, warned  # on the transition only
    assert elapsed < 0.5 * md["spec"]["rollout"]["verifyTimeoutSeconds"]
