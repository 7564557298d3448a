"""Bare numeric timing bounds in e2e code (``kvgate_e2e.bounds_audit``): the tool finds them, and
the files whose bounds were derived or named keep none (no cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvgate_e2e.bounds_audit import bare_bounds

TESTS = Path(__file__).resolve().parent
# Files whose every bound is measured in the run or a named deadline; add a file once it is.
CLEAN = (
    "attack_helpers.py",
    "plugin_helpers.py",
    "scenario_helpers.py",
    "test_alerts_fire.py",
    "test_attack_canary_log.py",
    "test_attack_engine_window.py",
    "test_attack_host_paths.py",
    "test_attack_inputs.py",
    "test_attack_pods.py",
    "test_attack_probe.py",
    "test_attack_role_scales.py",
    "test_attack_secrets.py",
    "test_attack_step_dilution.py",
    "test_attack_tenant.py",
    "test_attack_tenant_addresses.py",
    "test_attack_worker_url.py",
    "test_chaos.py",
    "test_cluster_smoke.py",
    "test_cpu_load_unit.py",
    "test_dashboards_query.py",
    "test_e2e_required_unit.py",
    "test_helm_install.py",
    "test_kubelet_logs_unit.py",
    "test_kubelet_runtime.py",
    "test_kubelet_smoke.py",
    "test_kubelet_unit.py",
    "test_md_events_and_drift.py",
    "test_metrics_pipeline.py",
    "test_model_sources_unit.py",
    "test_network_policies.py",
    "test_quick_start.py",
    "test_real_engine_cache_unit.py",
    "test_real_node.py",
    "test_scenario_autoscaling.py",
    "test_scenario_content_check.py",
    "test_scenario_engine_restart.py",
    "test_scenario_incident.py",
    "test_scenario_kv_canary.py",
    "test_scenario_lost_objects.py",
    "test_scenario_mass_deletion.py",
    "test_scenario_model_download.py",
    "test_scenario_multinode.py",
    "test_scenario_operator_down.py",
    "test_scenario_platform_fit.py",
    "test_scenario_progressive.py",
    "test_scenario_real_engine.py",
    "test_scenario_real_incident.py",
    "test_scenario_refused_rollout.py",
    "test_scenario_rollback.py",
    "test_scenario_safe_deployment.py",
    "test_scenario_small_gpu.py",
    "test_server_process_unit.py",
    "test_shared_world_unit.py",
)
# The same for the harness (paths under e2e/kvgate_e2e).
HARNESS = TESTS.parent / "kvgate_e2e"
HARNESS_CLEAN = (
    "build_artifacts.py",
    "cluster.py",
    "deadlines.py",
    "demo.py",
    "kubelet/agent.py",
    "kubelet/log_server.py",
    "kubelet/runtime.py",
    "lws.py",
    "netns.py",
    "prometheus.py",
    "prometheus_adapter.py",
    "realnode/node.py",
    "sampler.py",
    "sglang_inputs.py",
    "standin.py",
    "world.py",
)

SAMPLE = """
poll_until("the pod Ready", ready, 30)
poll_until("the pod Ready", ready, READY_DEADLINE)
poll_until("the pod Ready", ready, 30)  # the kubelet's 10 s probe period, three times
# the gate's own period, twice
deadline_loop("gate False", gate_false, 4)
wait_md_ready(world, "md", ns, 120, "the revision")
urllib.request.urlopen(url, timeout=2)
http_json(url, timeout=0)
Deadline(15)
seen.wait(probe, 90)
fired_after(prometheus, "Alert", labels, cause, deadline=60)
"""


def test_the_audit_finds_bare_numbers_given_as_wait_deadlines_and_timeouts(
    tmp_path: Path,
) -> None:
    found = bare_bounds(tmp_path / "sample.py", SAMPLE)
    assert [(b.line, b.value) for b in found] == [
        (2, 30),
        (7, 120),
        (8, 2),
        (10, 15),
        (11, 90),
        (12, 60),
    ]
    assert "poll_until" in found[0].code


@pytest.mark.parametrize("name", CLEAN)
def test_a_cleaned_file_has_no_bare_bound(name: str) -> None:
    assert [str(b) for b in bare_bounds(TESTS / name)] == []


@pytest.mark.parametrize("name", HARNESS_CLEAN)
def test_a_cleaned_harness_module_has_no_bare_bound(name: str) -> None:
    assert [str(b) for b in bare_bounds(HARNESS / name)] == []
