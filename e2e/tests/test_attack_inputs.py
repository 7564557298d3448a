"""Bounded tenant inputs, as a tenant would try them with ``kubectl`` on the real API server: inputs
kvgate cannot build or run from are denied at admission with the rule, the numbers and the way
out — never admitted to fail later — and a ModelDeployment at every limit is admitted, reconciled
and serves.

- a name that is a valid object but an invalid Service (``llama-3.1-8b``) or too long for a
  derived name: refused by the CRD's CEL rule (schema validation runs before webhooks);
- a ~600 KiB object: refused (webhook on ``kubectl create``; the API server's own annotation
  limit on client-side ``kubectl apply``), and a 150 KiB one that the API server would store
  but kvgate could not reconcile: refused by the webhook;
- ``router.args`` that add a static worker: refused by the webhook, also as an abbreviation;
- ``safety.minEngineVersion`` below the chart's ``engineVersionFloor``: refused by the webhook;
- edits of a serving ModelDeployment that try the same: refused while the invariant sampler and
  known-answer traffic run, and the deployment keeps serving its revision.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_attack_inputs.py -v -s`` (root).
"""

from __future__ import annotations

import copy
import json
from functools import partial
from typing import Any

import pytest
import yaml
from kvgate.admission.limits import MAX_SPEC_BYTES, spec_bytes
from kvgate.objects.names import max_name_length

# Deadlines, not bounds (kvgate_e2e.deadlines); the first revision Ready was 240 s here.
from kvgate_e2e.deadlines import REVISION_DEADLINE, STEP_DEADLINE
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import (
    OPERATOR_NAMESPACE,
    RELEASE,
    World,
)
from scenario_helpers import TrafficLoop, known_answer, sample_md, wait_known_answer, wait_md_ready

pytestmark = pytest.mark.e2e

WEBHOOK = 'admission webhook "validate-modeldeployment.kvgate.io" denied the request'


def tenant(world: World, verb: str, namespace: str, doc: dict[str, Any]) -> Any:
    """``kubectl <verb> -f -`` of one ModelDeployment, as a tenant runs it (never raises)."""
    text = json.dumps(doc) if verb == "create" else yaml.safe_dump(doc)
    return world.kubectl(verb, f"--namespace={namespace}", "-f", "-", input=text, check=False)


def assert_denied(result: Any, *phrases: str) -> str:
    err = str(result.stderr)
    assert result.returncode != 0, f"the API server admitted it:\n{result.stdout}"
    for phrase in phrases:
        assert phrase in err, f"{phrase!r} not in: {err[-2000:]}"
    # kubectl apply prints the whole patch before the reason: show the reason.
    starts = [err.find(m) for m in ("denied the request", "is invalid") if m in err]
    print(f"DENIED: {err[min(starts) if starts else 0 :].strip()[:700]}")
    return err


def padded(md: dict[str, Any], spec_size: int) -> dict[str, Any]:
    """``md`` with ``spec.model.config`` padded so that the spec is ``spec_size`` bytes."""
    out = copy.deepcopy(md)
    out["spec"]["model"]["config"]["padding"] = ""
    out["spec"]["model"]["config"]["padding"] = "x" * (spec_size - spec_bytes(out["spec"]))
    assert spec_bytes(out["spec"]) == spec_size
    return out


def chart_floor(world: World) -> str:
    """The engine version floor the chart gave the operator pod (engineVersionFloor)."""
    deployment = world.get("deployment", RELEASE, OPERATOR_NAMESPACE)  # the controller's
    assert deployment is not None
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    return str(env["KVGATE_MIN_ENGINE_VERSION_FLOOR"])


# ------------------------------------------------------------------------------------- names
def test_name_that_is_a_valid_object_but_not_a_valid_service_is_denied_with_the_rule(
    world: World, namespace: str
) -> None:
    for name in ("llama-3.1-8b", "8b-llama"):
        denied = tenant(world, "apply", namespace, sample_md(name))
        assert_denied(denied, "DNS-1035", "Service", "e.g. llama-3-1-8b")
        assert world.get_md(name, namespace) is None


def test_name_too_long_for_a_derived_name_is_denied(world: World, namespace: str) -> None:
    name = "m" * (max_name_length() + 1)  # a valid object name (<= 253), not a Service name
    denied = tenant(world, "apply", namespace, sample_md(name))
    assert_denied(denied, "DNS-1035", f"at most {max_name_length()} characters", "Service")
    assert world.get_md(name, namespace) is None


# -------------------------------------------------------------------------------------- size
def test_oversized_model_deployment_is_denied_with_a_clear_message(
    world: World, namespace: str
) -> None:
    huge = padded(sample_md("huge"), 600 * 1024)
    # kubectl create (no last-applied annotation): only kvgate's webhook stands in the way.
    denied = tenant(world, "create", namespace, huge)
    assert_denied(denied, WEBHOOK, "spec: 614,400 bytes", f"> {MAX_SPEC_BYTES:,}", "model.config")
    # Client-side apply copies the object into an annotation: the API server refuses it first.
    assert_denied(tenant(world, "apply", namespace, huge), "Too long", "262144 bytes")
    # 150 KiB: small enough for the API server to store, too large for kvgate to keep.
    big = padded(sample_md("big"), 150 * 1024)
    assert_denied(tenant(world, "apply", namespace, big), WEBHOOK, "spec: 153,600 bytes")
    assert world.list("modeldeployments.kvgate.io", namespace) == []


# ------------------------------------------------------------------------------- router.args
@pytest.mark.parametrize(
    "args",
    [["--worker-urls", "http://198.18.0.250:30000"], ["--worker-u=http://198.18.0.250:30000"]],
    ids=["exact", "abbreviated"],
)
def test_router_args_that_add_a_static_worker_are_denied(
    world: World, namespace: str, args: list[str]
) -> None:
    md = sample_md("llama")
    md["spec"]["router"] = {"args": ["--policy", "round_robin", *args]}
    denied = tenant(world, "apply", namespace, md)
    assert_denied(denied, WEBHOOK, "spec.router.args[2]", "--worker-urls", "adds workers", "remove")
    assert world.get_md("llama", namespace) is None


# ----------------------------------------------------------------------------- version floor
def test_min_engine_version_below_the_chart_floor_is_denied(world: World, namespace: str) -> None:
    floor = chart_floor(world)
    assert floor == "0.5.22"  # the chart's default
    md = sample_md("llama")
    md["spec"]["safety"]["minEngineVersion"] = "0.5.21"
    denied = tenant(world, "apply", namespace, md)
    assert_denied(
        denied,
        WEBHOOK,
        f"spec.safety.minEngineVersion: 0.5.21 < the cluster's engine version floor {floor}",
        "engineVersionFloor",
        f"set spec.safety.minEngineVersion to {floor} or later",
    )
    assert world.get_md("llama", namespace) is None


# ---------------------------------------------------------------- at the limits, then attacked
def at_the_limits(floor: str) -> dict[str, Any]:
    """A ModelDeployment at every limit a real deployment meets: the longest name, a spec of
    96 KiB less 1 KiB of slack for the edits below, the cluster floor, allowed router flags."""
    name = ("llama-" + "x" * 64)[: max_name_length()]
    md = sample_md(name)
    md["spec"]["safety"]["minEngineVersion"] = floor
    md["spec"]["router"] = {"args": ["--policy", "round_robin", "--log-level=info"]}
    return padded(md, MAX_SPEC_BYTES - 1024)


def test_model_deployment_at_the_limits_serves_and_input_attacks_on_it_are_denied(
    world: World, namespace: str
) -> None:
    md = at_the_limits(chart_floor(world))
    name = md["metadata"]["name"]
    assert len(name) == max_name_length() == 63
    applied = tenant(world, "apply", namespace, md)
    assert applied.returncode == 0, applied.stderr
    wait_md_ready(world, name, namespace, REVISION_DEADLINE)
    stored = world.get_md(name, namespace)
    assert stored is not None
    # Admission measures the spec as the API server stores it (its defaults filled in), from
    # the file as well as in the webhook.
    assert spec_bytes(stored["spec"]) == spec_bytes(md["spec"]) == MAX_SPEC_BYTES - 1024
    annotations = stored["metadata"].get("annotations") or {}
    total = sum(len(k) + len(v) for k, v in annotations.items())
    print(
        f"MEASURED annotations of a {spec_bytes(stored['spec']):,}-byte spec applied with "
        f"kubectl: {total:,} bytes of the API server's 262,144 ({sorted(annotations)})"
    )
    assert world.get("service", name, namespace) is not None  # the Service <md> exists
    wait_known_answer(
        world, name, namespace, STEP_DEADLINE, "a known-answer request through the Service"
    )
    generation = stored["metadata"]["generation"]
    revision = stored["status"]["servingRevision"]

    edits: list[tuple[str, Any, list[str]]] = [
        ("router.args", ["--worker-urls", "http://198.18.0.250:30000"], ["adds workers"]),
        ("router.args", ["--decode-sel", "app=evil"], ["--decode-selector"]),
        ("router.args", ["--control-plane-api-keys", "k:n:admin:s"], ["control plane"]),
        ("safety.minEngineVersion", "0.5.21", ["engine version floor"]),
        # The CRD's schema refuses these before the webhook runs.
        ("decode.replicas", 1025, ["spec.decode.replicas", "less than or equal to 1024"]),
        ("decode.tensorParallel", 513, ["spec.decode.tensorParallel", "less than or equal to 512"]),
        ("model.config.padding", "x" * (MAX_SPEC_BYTES + 1), ["bytes", "model.config"]),
    ]
    with (
        InvariantSampler(world.cluster, namespace, name="input-attacks"),
        TrafficLoop(partial(known_answer, world, name, namespace)) as traffic,
    ):
        for field, value, phrases in edits:
            attack = copy.deepcopy(md)
            *parents, last = field.split(".")
            node = attack["spec"]
            for key in parents:
                node = node[key]
            node[last] = value
            assert_denied(tenant(world, "apply", namespace, attack), *phrases)
    print(f"MEASURED input attacks: {len(traffic.results)} known-answer requests during them")
    assert traffic.results and traffic.failures == [], traffic.failures[:5]
    after = world.get_md(name, namespace)
    assert after is not None
    assert after["metadata"]["generation"] == generation  # no edit got through
    assert after["status"]["servingRevision"] == revision
