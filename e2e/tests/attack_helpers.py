"""Shared pieces of the tenant attack tests (``test_attack_*.py``): a serving ModelDeployment a
tenant applied, known-answer traffic and the invariant sampler around an attack, the check that
one of the chart's ValidatingAdmissionPolicies denied a request with its message, tenant copies of
live pods, and a policy binding lifted for one step (what a cluster without the policies does)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import yaml
from kvgate_e2e.deadlines import REVISION_DEADLINE, STEP_DEADLINE
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import World
from scenario_helpers import (
    GATE,
    Tenant,
    TrafficLoop,
    deadline_loop,
    known_answer,
    make_tenant,
    sample_md,
    wait_known_answer,
    wait_md_ready,
)

MD = "llama"
MODEL = "llama-3.1-8b"
POLICY = "kvgate-kvgate-system"  # kvgate.clusterName of the e2e release: <fullname>-<namespace>
# A deadline, not a bound: the API server type-checking a policy's current generation (its
# controller runs on the watch event). The first revision Ready uses REVISION_DEADLINE, 300 s,
# like every other file (it was 240 s here).
TYPE_CHECK_DEADLINE = 30


@dataclass(frozen=True)
class Serving:
    """A Ready ModelDeployment the tenant applied, and its serving revision's pods."""

    tenant: Tenant
    revision: str
    prefill: dict[str, Any]
    decode: dict[str, Any]
    router: dict[str, Any]


def serve(world: World, namespace: str) -> Serving:
    tenant = make_tenant(world, namespace)
    # `edit` covers ModelDeployments through the chart's aggregated ClusterRoles.
    applied = tenant.kubectl("apply", "-f", "-", input=yaml.safe_dump(sample_md(MD)))
    assert applied.returncode == 0, applied.stderr
    wait_md_ready(world, MD, namespace, REVISION_DEADLINE)
    md = world.get_md(MD, namespace)
    assert md is not None
    revision = md["status"]["servingRevision"]

    def pod(role: str) -> dict[str, Any]:
        selector = f"kvgate.io/deployment={MD},kvgate.io/revision={revision},kvgate.io/role={role}"
        (found,) = world.list("pods", namespace, selector)
        return found

    wait_known_answer(
        world, MD, namespace, STEP_DEADLINE, "a known-answer request through the Service"
    )
    return Serving(tenant, revision, pod("prefill"), pod("decode"), pod("router"))


@contextmanager
def under_attack(world: World, namespace: str, name: str) -> Iterator[TrafficLoop]:
    """The invariant sampler and known-answer traffic through the ``<md>`` Service around an
    attack; afterwards every request must have been answered right."""
    with (
        InvariantSampler(world.cluster, namespace, name=name),
        TrafficLoop(partial(known_answer, world, MD, namespace)) as traffic,
    ):
        yield traffic
    print(f"MEASURED {name}: {len(traffic.results)} known-answer requests during the attack")
    assert traffic.results, "no request was sent during the attack"
    assert traffic.failures == [], traffic.failures[:5]


def assert_denied(result: Any, policy: str, *phrases: str) -> str:
    """kubectl failed because the named kvgate ValidatingAdmissionPolicy denied the request, and
    its message says each of ``phrases``."""
    err = str(result.stderr)
    assert result.returncode != 0, f"the API server admitted it:\n{result.stdout}"
    assert f"ValidatingAdmissionPolicy '{POLICY}-{policy}'" in err, err
    for phrase in phrases:
        assert phrase in err, f"{phrase!r} not in: {err}"
    print(f"DENIED ({policy}): {err.strip()}")
    return err


def copy_of(pod: dict[str, Any], name: str, *, gate: bool, **metadata: Any) -> dict[str, Any]:
    """A tenant's pod copied from a live one: same labels, annotations and containers."""
    spec = {
        k: v
        for k, v in pod["spec"].items()
        if k
        in (
            "containers",
            "nodeSelector",
            "securityContext",
            "volumes",
            "automountServiceAccountToken",
            "serviceAccountName",
            "terminationGracePeriodSeconds",
        )
    }
    if gate:
        spec["readinessGates"] = [{"conditionType": GATE}]
    labels = {k: v for k, v in pod["metadata"]["labels"].items() if k != "pod-template-hash"}
    meta = {
        "name": name,
        "labels": labels,
        "annotations": pod["metadata"].get("annotations") or {},
        **metadata,
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def admitted(proc: Any) -> bool:
    """kubectl succeeded; else its error, raised for ``deadline_loop`` to retry and report."""
    if proc.returncode == 0:
        return True
    raise AssertionError(str(proc.stderr).strip())


@contextmanager
def policy_lifted(world: World, binding: str, namespace: str) -> Iterator[None]:
    """For the duration, one ValidatingAdmissionPolicyBinding no longer applies in
    ``namespace`` (what a cluster without that policy admits there, for the steps inside); every
    other namespace keeps it, so tests running beside this one in the shared world see the
    policy they expect. Put back as it was afterwards.

    The binding's ``matchResources.namespaceSelector`` gets ``kubernetes.io/metadata.name NotIn
    [namespace]`` ANDed to what it had (the chart sets one only with ``watchNamespaces``)."""
    saved = world.get("validatingadmissionpolicybinding", binding, None)
    assert saved is not None, f"no ValidatingAdmissionPolicyBinding {binding}"
    meta = saved["metadata"]
    kept = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
    original = {**saved, "metadata": kept}
    lifted = json.loads(json.dumps(original))
    selector = lifted["spec"].setdefault("matchResources", {}).setdefault("namespaceSelector", {})
    selector.setdefault("matchExpressions", []).append(
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [namespace]}
    )
    lifted["metadata"]["resourceVersion"] = meta["resourceVersion"]  # a conditional update
    world.kubectl("replace", "-f", "-", input=json.dumps(lifted))
    try:
        yield
    finally:
        now = world.get("validatingadmissionpolicybinding", binding, None)
        assert now is not None, f"ValidatingAdmissionPolicyBinding {binding} vanished"
        back = {
            **original,
            "metadata": {**kept, "resourceVersion": now["metadata"]["resourceVersion"]},
        }
        world.kubectl("replace", "-f", "-", input=json.dumps(back))


def assert_bound_and_type_checked(world: World, policy: str) -> dict[str, Any]:
    """The chart's ValidatingAdmissionPolicy ``<POLICY>-<policy>`` exists, the API server has
    type-checked its current generation (CEL against the schemas of the kinds it matches) and
    found nothing to warn about; returns its binding (same name), which must exist."""
    name = f"{POLICY}-{policy}"

    def checked() -> dict[str, Any] | None:
        found = world.get("validatingadmissionpolicy", name)
        assert found is not None, f"no ValidatingAdmissionPolicy {name}"
        status = found.get("status") or {}
        current = status.get("observedGeneration") == found["metadata"].get("generation")
        return found if current and status.get("typeChecking") is not None else None

    checked_policy = deadline_loop(
        f"the API server to type-check {name}", checked, TYPE_CHECK_DEADLINE
    )
    warnings = checked_policy["status"]["typeChecking"].get("expressionWarnings") or []
    assert warnings == [], json.dumps(warnings, indent=1)
    binding = world.get("validatingadmissionpolicybinding", name)
    assert binding is not None, f"no ValidatingAdmissionPolicyBinding {name}"
    return dict(binding)


def can_i(tenant: Tenant, *args: str) -> str:
    """``kubectl auth can-i ARGS`` as ``tenant``: "yes" or "no"."""
    return str(tenant.kubectl("auth", "can-i", *args).stdout.strip())
