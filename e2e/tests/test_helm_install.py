"""Issue 7 on the real control plane: ``helm install kvgate charts/kvgate`` gives a running
operator with its own ServiceAccount and RBAC that serves the webhook and manages a
ModelDeployment to Ready; ``helm upgrade`` keeps the webhook's CA valid; ``helm uninstall``
leaves users' ModelDeployments (and the CRD) in place.

The session's ``world`` installed the release; the lifecycle test upgrades, uninstalls and
reinstalls it, and leaves it installed with the world's values.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_helm_install.py -v -s`` (root).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from kvgate_e2e.world import (
    BIG_POOL,
    OPERATOR_NAMESPACE,
    RELEASE,
    World,
    is_ready,
    load_sample,
)

pytestmark = pytest.mark.e2e

SA = f"system:serviceaccount:{OPERATOR_NAMESPACE}:kvgate"
WEBHOOK_SELECTOR = f"app.kubernetes.io/instance={RELEASE}"


def good_md(name: str) -> dict[str, Any]:
    md = copy.deepcopy(load_sample("llama-8b"))
    md["metadata"] = {"name": name}
    for role in ("prefill", "decode"):
        md["spec"][role]["nodeSelector"] = {"kvgate.io/pool": BIG_POOL}
    return md


def bad_md(name: str) -> dict[str, Any]:
    md = good_md(name)
    md["spec"]["decode"]["gpuMemoryGiB"] = 24
    return md


def apply(world: World, md: dict[str, Any], namespace: str, *extra: str) -> Any:
    return world.kubectl(
        "apply",
        *extra,
        f"--namespace={namespace}",
        "-f",
        "-",
        input=yaml.safe_dump(md),
        check=False,
    )


def can_i(world: World, verb: str, resource: str, *extra: str) -> bool:
    proc = world.kubectl("auth", "can-i", verb, resource, f"--as={SA}", *extra, check=False)
    return proc.stdout.strip() == "yes"


def webhook_ca(world: World) -> str:
    configs = world.kubectl(
        "get", "validatingwebhookconfigurations", f"--selector={WEBHOOK_SELECTOR}", "-o", "json"
    ).stdout
    (config,) = yaml.safe_load(configs)["items"]
    (hook,) = config["webhooks"]
    assert hook["clientConfig"]["service"]["namespace"] == OPERATOR_NAMESPACE
    return str(hook["clientConfig"]["caBundle"])


def assert_denies_bad_and_admits_good(world: World, namespace: str) -> None:
    denied = apply(world, bad_md("bad"), namespace, "--dry-run=server")
    assert denied.returncode != 0
    assert "denied the request" in denied.stderr
    assert "spec.decode: estimated KV pool 44,236 tokens < contextLength 131,072" in denied.stderr
    admitted = apply(world, good_md("good-probe"), namespace, "--dry-run=server")
    assert admitted.returncode == 0, admitted.stderr


def test_operator_runs_from_the_chart_with_its_own_service_account_and_least_privilege_rbac(
    world: World,
) -> None:
    pod = world.operator_pod()
    assert pod is not None and is_ready(pod)
    assert pod["spec"]["serviceAccountName"] == "kvgate"
    (container,) = pod["spec"]["containers"]
    assert container["image"].startswith("ghcr.io/kvgate/kvgate-operator:")
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The kubelet ran the image's entry point, `kvgate operator`, with the chart's flags.
    assert "kvgate operator --metrics-port=8080" in world.operator_log(400)
    # What the operator needs ...
    assert can_i(world, "patch", "pods", "--subresource=status", "--all-namespaces")
    assert can_i(world, "create", "deployments.apps", "--all-namespaces")
    assert can_i(world, "patch", "modeldeployments.kvgate.io", "--subresource=status", "-A")
    assert can_i(world, "create", "events", "--all-namespaces")
    # Secrets: create and get (the router's control-plane key Secret, checked to be the MD's
    # own) but never list or watch them.
    assert can_i(world, "get", "secrets", "--all-namespaces")
    # ... and nothing it does not.
    assert not can_i(world, "list", "secrets", "--all-namespaces")
    assert not can_i(world, "watch", "secrets", "--all-namespaces")
    assert not can_i(world, "delete", "namespaces")
    assert not can_i(world, "create", "clusterrolebindings.rbac.authorization.k8s.io")


def test_helm_install_upgrade_and_uninstall_keep_the_webhook_valid_and_users_deployments(
    world: World, namespace: str
) -> None:
    # install (by the world): the webhook denies a bad MD with its message, a good one gets Ready.
    denied = apply(world, bad_md("bad"), namespace)
    assert denied.returncode != 0 and "denied the request" in denied.stderr, denied.stderr
    assert world.get_md("bad", namespace) is None
    assert apply(world, good_md("good"), namespace).returncode == 0
    world.wait_for(
        "the good ModelDeployment to be Ready",
        lambda: (m := world.get_md("good", namespace)) and is_ready(m),
        timeout=240,
    )

    # upgrade with a changed value: a new operator pod, the same CA and serving certificate.
    ca_before = webhook_ca(world)
    old_pod = world.operator_pod()
    assert old_pod is not None
    world.upgrade({"logLevel": "DEBUG"})
    new_pod = world.operator_pod()
    assert new_pod is not None and new_pod["metadata"]["uid"] != old_pod["metadata"]["uid"]
    assert webhook_ca(world) == ca_before
    history = world.helm("history", RELEASE, f"--namespace={OPERATOR_NAMESPACE}")
    assert "upgrade complete" in history.lower(), history
    assert_denies_bad_and_admits_good(world, namespace)
    world.wait_for(
        "the good ModelDeployment to stay Ready under the new operator",
        lambda: (m := world.get_md("good", namespace)) and is_ready(m),
        timeout=60,
    )

    # uninstall: the CRD and the user's ModelDeployment stay; the operator and webhook go.
    try:
        world.uninstall()
        assert world.get("crd", "modeldeployments.kvgate.io") is not None
        kept = world.get_md("good", namespace)
        assert kept is not None and not kept["metadata"].get("deletionTimestamp")
        assert world.operator_pod() is None
        hooks = world.kubectl(
            "get", "validatingwebhookconfigurations", f"--selector={WEBHOOK_SELECTOR}", "-o", "name"
        ).stdout
        assert hooks.strip() == ""
        print(world.kubectl("get", "md", f"--namespace={namespace}").stdout)
    finally:
        # Reinstall with the world's values: the kept CRD is adopted, the operator resumes
        # from cluster state.
        world.install()
    assert_denies_bad_and_admits_good(world, namespace)
    world.wait_for(
        "the kept ModelDeployment to be Ready under the reinstalled operator",
        lambda: (m := world.get_md("good", namespace)) and is_ready(m),
        timeout=120,
    )
