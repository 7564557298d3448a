"""The chart's hostPaths values reach the webhook and the operator as the JSON lists they read
(KVGATE_MODEL_HOST_PATH_PREFIXES, KVGATE_RDMA_HOST_PATHS), and a list that would allow the node's
root, or a path not in normal form, fails `helm template` before anything is installed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helm_runner import Helm
from kvgate.admission.host_paths import (
    MODEL_PREFIXES_ENV,
    RDMA_DEVICES_ENV,
    HostPathPolicy,
    host_path_policy,
)

APIS = ("admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",)


def _env(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_the_default_lists_reach_both_deployments_as_the_policys_defaults(helm: Helm) -> None:
    rendered = helm.template(api_versions=APIS)
    for deployment in (rendered.webhook(), rendered.controller()):
        env = _env(deployment)
        assert json.loads(env[MODEL_PREFIXES_ENV]) == []
        assert json.loads(env[RDMA_DEVICES_ENV]) == ["/dev/infiniband"]
        assert host_path_policy(env[MODEL_PREFIXES_ENV], env[RDMA_DEVICES_ENV]) == (
            HostPathPolicy()
        )


def test_the_admins_prefixes_reach_the_webhook_as_written(helm: Helm) -> None:
    rendered = helm.template(
        "hostPaths.modelPrefixes={/mnt/models,/data/weights}", api_versions=APIS
    )
    env = _env(rendered.webhook())
    policy = host_path_policy(env[MODEL_PREFIXES_ENV], env[RDMA_DEVICES_ENV])
    assert policy.model_prefixes == ("/mnt/models", "/data/weights")
    assert _env(rendered.controller())[MODEL_PREFIXES_ENV] == env[MODEL_PREFIXES_ENV]


@pytest.mark.parametrize(
    "value",
    [
        "hostPaths.modelPrefixes={/}",
        "hostPaths.modelPrefixes={/mnt/models/}",
        "hostPaths.modelPrefixes={/mnt/../etc}",
        "hostPaths.modelPrefixes={mnt/models}",
        "hostPaths.rdmaDevices={/}",
        "hostPaths.rdmaDevices={/dev/./infiniband}",
    ],
)
def test_a_list_that_would_allow_the_root_or_an_escape_fails_the_install(
    helm: Helm, value: str
) -> None:
    result = helm.template_result(value, api_versions=APIS)
    assert result.returncode != 0
    assert "hostPaths" in result.stderr, result.stderr
