"""A platform team's namespace, as a tenant meets it: a ResourceQuota on CPU and memory requests
(so BestEffort pods are refused), a PriorityClass the cluster admin made for inference, and a
ModelDeployment that asks for it, for its own ServiceAccount, an image pull Secret, its team's
labels and annotations, and gives its routers requests. It becomes Ready through kvgate's gate
like any other, and every pod carries what was asked. The loopback kubelet runs containers as
local processes, so no image is pulled: the pod specs are what a kubelet would pull with.

Run (root): ``.venv/bin/pytest -m e2e -s e2e/tests/test_scenario_platform_fit.py``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml

# Deadlines, not bounds (kvgate_e2e.deadlines); the first revision Ready was 240 s here.
from kvgate_e2e.deadlines import QUOTA_DEADLINE, REVISION_DEADLINE
from kvgate_e2e.world import World
from scenario_helpers import (
    GATE,
    deadline_loop,
    engine_pods,
    known_answer,
    make_tenant,
    sample_md,
    wait_md_ready,
)

pytestmark = pytest.mark.e2e

QUOTA = "requests-only"
PRIORITY_VALUE = 100_000
LABELS = {"team": "search", "example.com/cost-centre": "4711"}
ANNOTATIONS = {"example.com/owner": "search-infra@example.com"}
ENGINE_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi"}}
ROUTER_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}


def best_effort_pod() -> dict[str, Any]:
    """A pod without requests (what kvgate's routers were): the quota must refuse it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "best-effort"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["true"]}]},
    }


def adapted_md(name: str, priority_class: str) -> dict[str, Any]:
    md = sample_md(name)
    for role in ("prefill", "decode"):
        md["spec"][role].update(
            {
                "resources": ENGINE_RESOURCES,
                "priorityClassName": priority_class,
                "serviceAccountName": "engines",
                "imagePullSecrets": [{"name": "regcred"}],
                "podLabels": LABELS,
                "podAnnotations": ANNOTATIONS,
            }
        )
    md["spec"]["router"] = {"resources": ROUTER_RESOURCES}
    return md


def test_a_deployment_adapted_to_a_quota_priority_and_pull_secret_becomes_ready(
    world: World, namespace: str
) -> None:
    priority_class = f"{namespace}-inference"
    world.apply(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": priority_class},
            "value": PRIORITY_VALUE,
            "description": "inference engines (e2e)",
        }
    )
    try:
        _run(world, namespace, priority_class)
    finally:
        world.kubectl("delete", "priorityclass", priority_class, "--ignore-not-found", check=False)


def _run(world: World, namespace: str, priority_class: str) -> None:
    world.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": QUOTA},
            "spec": {"hard": {"requests.cpu": "32", "requests.memory": "128Gi"}},
        },
        namespace,
    )
    # The quota admission needs the quota controller's first count before it admits anything.
    deadline_loop(
        "the quota controller to count the namespace's usage",
        lambda: (world.get("resourcequota", QUOTA, namespace) or {}).get("status", {}).get("hard"),
        QUOTA_DEADLINE,
    )
    tenant = make_tenant(world, namespace)
    refused = tenant.create(best_effort_pod())
    assert refused.returncode != 0 and "must specify" in refused.stderr, refused.stderr
    for obj in (
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "engines"}},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "regcred"},
            "type": "kubernetes.io/dockerconfigjson",
            "stringData": {".dockerconfigjson": '{"auths": {}}'},
        },
    ):
        created = tenant.create(obj)
        assert created.returncode == 0, created.stderr

    applied_at = time.monotonic()
    applied = tenant.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump(adapted_md("fit", priority_class))
    )
    assert applied.returncode == 0, applied.stderr
    md = wait_md_ready(world, "fit", namespace, REVISION_DEADLINE)
    print(f"MEASURED platform-fit Ready {time.monotonic() - applied_at:.1f}s after apply")

    engines = engine_pods(world, namespace, "fit")
    assert sorted(p["metadata"]["labels"]["kvgate.io/role"] for p in engines) == [
        "decode",
        "prefill",
    ]
    for pod in engines:
        meta, spec = pod["metadata"], pod["spec"]
        assert LABELS.items() <= meta["labels"].items(), meta["labels"]
        assert ANNOTATIONS.items() <= meta["annotations"].items(), meta["annotations"]
        assert "kvgate.io/requirement" in meta["annotations"]  # kvgate's own, beside them
        assert spec["priorityClassName"] == priority_class
        assert spec["priority"] == PRIORITY_VALUE  # resolved by the API server's admission
        assert spec["serviceAccountName"] == "engines"
        assert spec["automountServiceAccountToken"] is False
        assert {"name": "regcred"} in spec["imagePullSecrets"], spec["imagePullSecrets"]
        assert spec["readinessGates"] == [{"conditionType": GATE}]
        gate = [c for c in pod["status"]["conditions"] if c["type"] == GATE]
        assert gate and gate[0]["status"] == "True", pod["status"]["conditions"]
        (engine,) = spec["containers"]
        assert engine["resources"]["requests"]["cpu"] == "1"
        assert engine["resources"]["requests"]["nvidia.com/gpu"] == "1"
        assert pod["status"]["qosClass"] == "Burstable"

    routers = [
        p
        for p in world.list(
            "pods", namespace, "kvgate.io/deployment=fit,kvgate.io/component=router"
        )
        if not p["metadata"].get("deletionTimestamp")
    ]
    assert routers, "no router pod"
    for pod in routers:
        (router,) = pod["spec"]["containers"]
        assert router["resources"] == ROUTER_RESOURCES
        assert pod["status"]["qosClass"] == "Burstable"

    used = (world.get("resourcequota", QUOTA, namespace) or {})["status"]["used"]
    print(f"MEASURED quota used: {used}")
    assert used["requests.cpu"] != "0" and used["requests.memory"] != "0", used
    answered, detail = known_answer(world, "fit", namespace)
    assert answered, detail
    assert md["status"]["prefill"]["verifiedReplicas"] == 1
    assert md["status"]["decode"]["verifiedReplicas"] == 1
