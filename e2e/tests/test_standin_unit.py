"""The scale benchmark's stand-in pods (kvgate_e2e.standin), pure parts: what an engine pod
reports from its own flags, and Ready from containers and readinessGates as the kubelet rules.

No cluster needed.
"""

from __future__ import annotations

import copy
from typing import Any

from kvgate.api.models import ModelDeployment
from kvgate.api.revision import revision_of
from kvgate.objects import builders
from kvgate_e2e.standin import flag, needs_write, pod_status, stages, stand_in_for
from kvgate_e2e.world import load_sample

GATE = "kvgate.io/engine-verified"


def engine_pod(role: str = "decode") -> dict[str, Any]:
    doc = copy.deepcopy(load_sample("llama-8b"))
    doc["metadata"] = {"name": "llama", "namespace": "bench", "uid": "md-uid"}
    md = ModelDeployment.model_validate(doc)
    template = builders.deployment(md, revision_of(md.spec), role, replicas=1)["spec"]["template"]
    return {
        "metadata": {**template["metadata"], "name": "p", "namespace": "bench", "uid": "u1"},
        "spec": template["spec"],
        "status": {},
    }


def test_flag_reads_both_spellings() -> None:
    assert flag(["--a", "1", "--b=2"], "--a") == "1"
    assert flag(["--a", "1", "--b=2"], "--b") == "2"
    assert flag(["--a"], "--a") is None


def test_engine_reports_its_own_flags_and_a_pool_of_factor_times_context() -> None:
    s = stand_in_for(engine_pod("prefill"), "198.18.128.9", 2.0)
    info = s.server_info()
    assert (s.role, s.context_length, info["max_total_num_tokens"]) == ("prefill", 131_072, 262_144)
    assert info["version"] == "0.5.23" and info["served_model_name"] == "llama-3.1-8b"
    assert info["max_req_input_len"] == 131_071 - 5
    assert 30000 in s.ports and "engine" in s.containers


def test_an_engine_env_pool_factor_overrides_the_nodes_for_its_pod() -> None:
    """The fairness benchmark's never-verified engines: half their context."""
    pod = engine_pod()
    engine = next(c for c in pod["spec"]["containers"] if c["name"] == "engine")
    engine.setdefault("env", []).append({"name": "KVGATE_STANDIN_POOL_FACTOR", "value": "0.5"})
    assert stand_in_for(pod, "198.18.128.9", 2.0).server_info()["max_total_num_tokens"] == 65_536


def test_ready_only_when_every_readiness_gate_is_true() -> None:
    pod = engine_pod()
    s = stand_in_for(pod, "198.18.128.9", 2.0)
    status, ready = pod_status(pod, s, "198.18.0.200")
    assert not ready and status["podIP"] == "198.18.128.9"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "False"
    pod["status"]["conditions"] = [{"type": GATE, "status": "True"}]
    _, ready = pod_status(pod, s, "198.18.0.200")
    assert ready
    s.restart_count = 3
    status, _ = pod_status(pod, s, "198.18.0.200")
    engine = next(c for c in status["containerStatuses"] if c["name"] == "engine")
    assert engine["restartCount"] == 3 and engine["ready"] is True


def test_stages_count_each_engine_by_how_far_it_got_and_routers_only_as_pods() -> None:
    bound = stand_in_for(engine_pod(), "198.18.128.1", 2.0)  # no status written yet
    running = stand_in_for(engine_pod(), "198.18.128.2", 2.0)
    running.ready = False  # Running written, gate not yet True
    verified = stand_in_for(engine_pod(), "198.18.128.3", 2.0)
    verified.ready, verified.gate = False, True  # gate True seen, Ready not yet rewritten
    serving = stand_in_for(engine_pod(), "198.18.128.4", 2.0)
    serving.ready, serving.gate, serving.probes = True, True, 3
    router = stand_in_for({**engine_pod(), "spec": {"containers": []}}, "198.18.128.5", 2.0)
    router.ready = True
    assert stages([bound, running, verified, serving, router]) == {
        "pods": 5,
        "engines": 4,
        "engines_running": 3,
        "engines_verified": 2,
        "engines_ready": 1,
        "probes": 3,
    }


def test_a_status_write_is_needed_only_when_ready_or_the_address_would_change() -> None:
    pod = engine_pod()
    s = stand_in_for(pod, "198.18.128.9", 2.0)
    assert needs_write(pod, s)  # never written
    status, ready = pod_status(pod, s, "198.18.0.200")
    pod["status"], s.ready = status, ready
    assert not needs_write(pod, s)  # an echo of its own write
    pod["status"]["conditions"].append({"type": GATE, "status": "True"})
    assert needs_write(pod, s)  # kvgate verified it: Ready turns True
    s.ready = True
    assert not needs_write(pod, s)
