"""A tenant's attacks on RoleScales, the scale objects kvgate creates for autoscaled roles
(docs/autoscaling.md), as a namespace editor (the built-in ``edit`` role) would try them: remove
kvgate's labels or the owner reference, rewrite the bounds kvgate copied; and what must keep
working: ``kubectl scale`` (the scale subresource an HPA or KEDA drives), a count that reaches
kvgate at once even on a RoleScale without labels, and a disowned RoleScale that the tenant can
clear.

Run (root): ``.venv/bin/pytest -q -s -m e2e e2e/tests/test_attack_role_scales.py``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml
from attack_helpers import admitted, assert_bound_and_type_checked, assert_denied
from kvgate_e2e.deadlines import (
    EVENT_DEADLINE,
    PASS_DEADLINE,
    REVISION_DEADLINE,
    ROLE_SCALE_DEADLINE,
)
from kvgate_e2e.world import OPERATOR_NAMESPACE, RELEASE, World, manifest_text
from scenario_helpers import (
    Tenant,
    deadline_loop,
    engine_pods,
    make_tenant,
    md_condition,
    md_story,
    sample_md,
    wait_md_ready,
)

pytestmark = pytest.mark.e2e

POLICY = "role-scales"
# The operator's own identity: the policy lets it write RoleScales, as on a cluster without the
# policy (or with a RoleScale from before it) anyone could.
OPERATOR = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{RELEASE}"
STEADY_SECONDS = 5.0  # KVGATE_STEADY_RECONCILE_SECONDS of the e2e world (kvgate_e2e.world)
# Speed claim, derived from the steady period: a count asked of a RoleScale without labels is
# answered within half of it (a watched request waits for one pass, a missed one for about a whole
# period). It holds while one pass takes well under 2.5 s; the run prints the delays measured.
WATCHED_ANSWER_BOUND = STEADY_SECONDS / 2
# Deadlines, not bounds: only a step that never happens reaches one. Shared ones come from
# kvgate_e2e.deadlines (the first revision Ready uses REVISION_DEADLINE, 300 s, like every other
# file; it was 240 s here).
# The tenant's delete of the disowned RoleScale admitted (retried while a denial still comes).
DELETE_ADMITTED_DEADLINE = 30


def autoscaled(name: str, *, prefill: bool = False) -> dict[str, Any]:
    """The sample with decode autoscaled 1..2 (and prefill too, one prefill per decode)."""
    md = sample_md(name)
    bounds = {"minReplicas": 1, "maxReplicas": 2, "drainTimeoutSeconds": 60}
    md["spec"]["decode"]["autoscaling"] = dict(bounds)
    if prefill:
        md["spec"]["prefill"]["autoscaling"] = dict(bounds)
        md["spec"]["prefillPerDecode"] = {"min": 1, "max": 1}
    return md


def apply_as(tenant: Tenant, md: dict[str, Any]) -> None:
    applied = tenant.kubectl("apply", "-f", "-", input=yaml.safe_dump(md))
    assert applied.returncode == 0, applied.stderr


def rolescale(world: World, ns: str, name: str) -> dict[str, Any]:
    found = world.get("rolescale", name, ns)
    assert found is not None, f"no RoleScale {name}"
    return found


def test_a_tenant_scales_a_role_scale_but_cannot_relabel_disown_or_rebound_it(
    world: World, namespace: str
) -> None:
    ns, md = namespace, "scaled"
    scale = f"{md}-decode"
    tenant = make_tenant(world, ns)
    apply_as(tenant, autoscaled(md))
    wait_md_ready(world, md, ns, REVISION_DEADLINE)
    before = deadline_loop(
        "kvgate's RoleScale", lambda: world.get("rolescale", scale, ns), EVENT_DEADLINE
    )

    # 1. What kvgate's RoleScale watch and ownership rest on: denied to the tenant.
    for attempt, phrase in (
        (("label", "rolescale", scale, "kvgate.io/deployment-", "kvgate.io/role-"),
         "metadata.labels"),
        (("label", "rolescale", scale, "app.kubernetes.io/managed-by-"), "metadata.labels"),
        (
            ("patch", "rolescale", scale, "--type=json",
             "-p=" + json.dumps([{"op": "remove", "path": "/metadata/ownerReferences"}])),
            "metadata.ownerReferences",
        ),
        (
            ("patch", "rolescale", scale, "--type=merge",
             "-p=" + json.dumps({"spec": {"maxReplicas": 64, "replicas": 64}})),
            "spec.maxReplicas",
        ),
    ):  # fmt: skip
        assert_denied(
            tenant.kubectl(*attempt),
            POLICY,
            f"RoleScale {scale}",
            phrase,
            "kubectl scale rolescale",
            f"not by {tenant.user}",
        )
    # A RoleScale under another ModelDeployment's name is kvgate's to create, even for an admin
    # (`edit` grants no create at all).
    squat = {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "RoleScale",
        "metadata": {"name": "next-decode", "namespace": ns},
        "spec": {
            "replicas": 1,
            "modelDeployment": "next",
            "role": "decode",
            "minReplicas": 1,
            "maxReplicas": 2,
        },
    }
    created = world.kubectl("create", "-f", "-", input=manifest_text(squat), check=False)
    assert_denied(created, POLICY, "RoleScale next-decode may be created only by")
    assert_bound_and_type_checked(world, POLICY)
    after = rolescale(world, ns, scale)
    for key in ("labels", "ownerReferences"):
        assert after["metadata"][key] == before["metadata"][key], key
    assert after["spec"]["maxReplicas"] == 2

    # 2. What the tenant may do: ask for a count, through the scale subresource or the object.
    scaled = tenant.kubectl("scale", "rolescale", scale, "--replicas=2")
    assert scaled.returncode == 0, scaled.stderr
    deadline_loop(
        "2 verified decode engines after the tenant's kubectl scale",
        lambda: (
            (rolescale(world, ns, scale).get("status") or {}).get("replicas") == 2
            and len(engine_pods(world, ns, md, "decode")) == 2
        ),
        ROLE_SCALE_DEADLINE,
        details=lambda: md_story(world, md, ns),
    )
    patched = tenant.kubectl(
        "patch", "rolescale", scale, "--type=merge", "-p=" + json.dumps({"spec": {"replicas": 1}})
    )
    assert patched.returncode == 0, patched.stderr
    deadline_loop(
        "1 decode engine after the tenant's patch of spec.replicas",
        lambda: (
            (rolescale(world, ns, scale).get("status") or {}).get("effectiveReplicas") == 1
            and len(engine_pods(world, ns, md, "decode")) == 1
        ),
        ROLE_SCALE_DEADLINE,
        details=lambda: md_story(world, md, ns),
    )
    degraded = md_condition(world, md, ns, "Degraded")
    assert degraded is not None and degraded["status"] == "False", degraded

    # 3. A RoleScale kvgate does not own (its owner removed where the policy does not hold: as
    # the operator's identity here) is a Conflict; its way out, deleting it, is the tenant's.
    world.kubectl(
        f"--as={OPERATOR}", "patch", "rolescale", scale, f"--namespace={ns}", "--type=json",
        "-p=" + json.dumps([{"op": "remove", "path": "/metadata/ownerReferences"}]),
    )  # fmt: skip

    def conflict() -> dict[str, Any] | None:
        cond = md_condition(world, md, ns, "Degraded")
        named = cond and cond.get("reason") == "Conflict" and scale in cond.get("message", "")
        return cond if named else None

    cond = deadline_loop(
        "a Conflict naming the disowned RoleScale",
        conflict,
        PASS_DEADLINE,
        details=lambda: md_story(world, md, ns),
    )
    print(f"Degraded: {cond['reason']}: {cond['message']}")
    assert "delete it and kvgate creates its own" in cond["message"]
    deleted = time.monotonic()
    deadline_loop(
        "the tenant's delete of the disowned RoleScale",
        lambda: admitted(tenant.kubectl("delete", "rolescale", scale)),
        DELETE_ADMITTED_DEADLINE,
    )

    def own_again() -> bool:
        found = world.get("rolescale", scale, ns)
        owners = (found or {}).get("metadata", {}).get("ownerReferences") or []
        cond = md_condition(world, md, ns, "Degraded") or {}
        return any(o.get("kind") == "ModelDeployment" for o in owners) and (
            cond.get("reason") != "Conflict"
        )

    deadline_loop("kvgate's own RoleScale again, and no Conflict", own_again, PASS_DEADLINE)
    print(f"MEASURED Conflict cleared {time.monotonic() - deleted:.2f} s after the delete")
    wait_md_ready(world, md, ns, PASS_DEADLINE)


def test_a_count_asked_of_a_role_scale_without_labels_reaches_kvgate_at_once(
    world: World, namespace: str
) -> None:
    """kvgate reads a RoleScale by name; its watch must not miss one whose labels are gone.
    Prefill asks for 2 beside 1 decode at one prefill per decode: kvgate keeps 1 and says why,
    so every request is seen in the RoleScale's status and no engine starts or stops: the loop
    stays settled, and a request its watch missed waits for the next timer pass (every
    STEADY_SECONDS ± 10 %)."""
    ns, md = namespace, "unlabelled"
    scale = f"{md}-prefill"
    tenant = make_tenant(world, ns)
    apply_as(tenant, autoscaled(md, prefill=True))
    wait_md_ready(world, md, ns, REVISION_DEADLINE)
    deadline_loop("kvgate's RoleScale", lambda: world.get("rolescale", scale, ns), EVENT_DEADLINE)
    world.kubectl(
        f"--as={OPERATOR}", "label", "rolescale", scale, f"--namespace={ns}",
        "kvgate.io/deployment-", "kvgate.io/role-", "app.kubernetes.io/managed-by-",
    )  # fmt: skip
    assert not (rolescale(world, ns, scale)["metadata"].get("labels") or {})

    def answered(want: int) -> bool:
        found = rolescale(world, ns, scale)
        status = found.get("status") or {}
        return (
            found["spec"]["replicas"] == want
            and status.get("observedGeneration") == found["metadata"]["generation"]
            and status.get("effectiveReplicas") == 1
            and (want == 1) == ("moves prefill to 1" not in status.get("message", ""))
        )

    delays: list[float] = []
    for want in (2, 1, 2, 1):
        scaled = tenant.kubectl("scale", "rolescale", scale, f"--replicas={want}")
        assert scaled.returncode == 0, scaled.stderr
        asked = time.monotonic()
        deadline_loop(
            f"the RoleScale's status to answer the request for {want}",
            lambda want=want: answered(want),
            EVENT_DEADLINE,
            period=0.05,
            details=lambda: json.dumps(rolescale(world, ns, scale), default=str)[:2000],
        )
        delays.append(time.monotonic() - asked)
    print(
        "MEASURED kubectl scale -> RoleScale status, no labels: "
        + ", ".join(f"{d:.2f} s" for d in delays)
    )
    # Each request follows the pass that answered the last one, so a missed one would wait
    # about a whole steady period; a watched one waits for one pass. Half the period between.
    assert max(delays) < WATCHED_ANSWER_BOUND, delays
    assert len(engine_pods(world, ns, md, "prefill")) == 1
