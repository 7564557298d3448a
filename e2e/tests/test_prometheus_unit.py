"""The e2e world's Prometheus (kvgate_e2e.prometheus) without a cluster: the chart's monitors,
rendered by the real helm, as scrape jobs, and the config and rules Prometheus' own promtool
loads."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kvgate_e2e.build_artifacts import find_binaries
from kvgate_e2e.prometheus import (
    Alert,
    Series,
    alerts_of,
    cadence_of,
    monitor_scrape_configs,
    render_chart,
    rule_groups,
    sd_config,
    server_config,
    unix_time,
    vector,
)

REPO = Path(__file__).resolve().parents[2]
PROMTOOL_BUILD = REPO / "tests" / "chart" / "promtool" / "build.sh"
SD = {"api_server": "https://198.18.0.1:6443", "tls_config": {"ca_file": "/x/ca.crt"}}
needs_helm = pytest.mark.skipif(find_binaries() is None, reason="helm not built")


def _keep_values(job: dict[str, Any]) -> dict[str, str]:
    """source label(s) -> regex of the job's keep rules."""
    return {
        ";".join(r["source_labels"]): r["regex"]
        for r in job["relabel_configs"]
        if r.get("action") == "keep"
    }


def _jobs(*sets: str) -> dict[str, dict[str, Any]]:
    return {j["job_name"]: j for j in monitor_scrape_configs(render_chart(sets=sets), SD)}


@needs_helm
def test_the_service_monitor_scrapes_both_metrics_services_of_the_release_with_their_labels() -> (
    None
):
    jobs = _jobs()
    job = jobs["serviceMonitor/kvgate-system/kvgate/0"]
    sd = job["kubernetes_sd_configs"][0]
    assert sd["role"] == "endpointslice"
    assert sd["namespaces"] == {"names": ["kvgate-system"]}
    assert sd["api_server"] == SD["api_server"]
    keep = _keep_values(job)
    label = "__meta_kubernetes_service_labelpresent_{0};__meta_kubernetes_service_label_{0}"
    assert keep[label.format("app_kubernetes_io_name")] == "true;kvgate"
    assert keep[label.format("app_kubernetes_io_instance")] == "true;kvgate"
    assert keep[label.format("app_kubernetes_io_service")] == "true;metrics"
    assert keep["__meta_kubernetes_endpointslice_port_name"] == "metrics"
    # No target chooses its own job: the job is the Service's namespace and name, set by
    # Prometheus after the Prometheus Operator's own (the Service's name).
    assert job["honor_labels"] is False
    jobs_set = [r for r in job["relabel_configs"] if r.get("target_label") == "job"]
    assert jobs_set[-1] == {
        "source_labels": ["__meta_kubernetes_namespace", "__meta_kubernetes_service_name"],
        "separator": "/",
        "target_label": "job",
    }
    # kvgate's per-pod series name the engine pod: its namespace and pod come back from the
    # exported_ labels Prometheus renamed them to; the operator's series keep the target's.
    assert job["metric_relabel_configs"] == [
        {"source_labels": ["exported_namespace"], "regex": "(.+)", "target_label": "namespace"},
        {"source_labels": ["exported_pod"], "regex": "(.+)", "target_label": "pod"},
        {"action": "labeldrop", "regex": "exported_(namespace|pod)"},
    ]


@needs_helm
def test_the_engine_pod_monitor_scrapes_every_kvgate_engine_on_its_http_port() -> None:
    job = _jobs()["podMonitor/kvgate-system/kvgate-engines/0"]
    sd = job["kubernetes_sd_configs"][0]
    assert sd["role"] == "pod" and "namespaces" not in sd  # every namespace
    keep = _keep_values(job)
    label = "__meta_kubernetes_pod_labelpresent_{0};__meta_kubernetes_pod_label_{0}"
    assert keep[label.format("app_kubernetes_io_managed_by")] == "true;kvgate"
    assert keep[label.format("kvgate_io_component")] == "true;engine"
    assert keep["__meta_kubernetes_pod_container_port_name"] == "http"
    # Engines are tenant-controlled: their series never choose their namespace and pod.
    assert job["honor_labels"] is False
    replaced = {r.get("target_label"): r for r in job["relabel_configs"]}
    assert replaced["namespace"]["source_labels"] == ["__meta_kubernetes_namespace"]
    assert replaced["pod"]["source_labels"] == ["__meta_kubernetes_pod_name"]
    assert replaced["job"]["replacement"] == "kvgate-system/kvgate-engines"


@needs_helm
def test_watch_namespaces_limit_the_engine_job_to_them() -> None:
    jobs = _jobs("watchNamespaces={team-a,team-b}")
    sd = jobs["podMonitor/kvgate-system/kvgate-engines/0"]["kubernetes_sd_configs"][0]
    assert sd["namespaces"] == {"names": ["team-a", "team-b"]}


@needs_helm
def test_the_charts_router_monitor_keeps_smgs_metrics_port_on_router_pods() -> None:
    job = _jobs()["podMonitor/kvgate-system/kvgate-routers/0"]
    keep = _keep_values(job)
    assert keep["__meta_kubernetes_pod_container_port_name"] == "metrics"
    assert (
        keep[
            "__meta_kubernetes_pod_labelpresent_kvgate_io_component;"
            "__meta_kubernetes_pod_label_kvgate_io_component"
        ]
        == "true;router"
    )


def test_service_discovery_uses_the_kubeconfigs_server_and_client_certificate() -> None:
    kubeconfig = {
        "clusters": [{"cluster": {"server": "https://s:6443", "certificate-authority": "/ca"}}],
        "users": [{"user": {"client-certificate": "/crt", "client-key": "/key"}}],
    }
    assert sd_config(kubeconfig) == {
        "api_server": "https://s:6443",
        "tls_config": {"ca_file": "/ca", "cert_file": "/crt", "key_file": "/key"},
    }


@needs_helm
def test_the_generated_config_and_the_charts_rules_load_in_promtool(tmp_path: Path) -> None:
    promtool = Path(
        subprocess.run(
            ["bash", str(PROMTOOL_BUILD), "--print-path"], capture_output=True, text=True
        ).stdout.strip()
    )
    if not os.access(promtool, os.X_OK):
        pytest.skip(f"promtool not built at {promtool} (make promtool)")
    for name in ("ca.crt", "admin.crt", "admin.key"):
        (tmp_path / name).write_text("")
    sd = sd_config(
        {
            "clusters": [
                {"cluster": {"server": "https://s", "certificate-authority": f"{tmp_path}/ca.crt"}}
            ],
            "users": [
                {
                    "user": {
                        "client-certificate": f"{tmp_path}/admin.crt",
                        "client-key": f"{tmp_path}/admin.key",
                    }
                }
            ],
        }
    )
    documents = render_chart({"headroomFor": "2s", "kvUsageFor": "2s"})
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups(documents)}))
    jobs = monitor_scrape_configs(documents, sd)
    config = tmp_path / "prometheus.yaml"
    config.write_text(yaml.safe_dump(server_config(jobs, rules, 1.0)))
    proc = subprocess.run(
        [str(promtool), "check", "config", str(config)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr
    assert len(jobs) == 3


def test_alerts_are_read_from_the_alerts_series() -> None:
    answer = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {
                    "metric": {
                        "__name__": "ALERTS",
                        "alertname": "KvgateEngineHeadroomLow",
                        "alertstate": "firing",
                        "namespace": "ns",
                    },
                    "value": [1.0, "1"],
                }
            ],
        },
    }
    (alert,) = alerts_of(vector(answer))
    assert alert == Alert("KvgateEngineHeadroomLow", "firing", {"namespace": "ns"})
    assert alert.matches("KvgateEngineHeadroomLow", {"namespace": "ns"})
    assert not alert.matches("KvgateEngineHeadroomLow", {"namespace": "other"})


def test_a_failed_query_raises_with_prometheus_error() -> None:
    with pytest.raises(RuntimeError, match="bad_data: parse error"):
        vector({"status": "error", "errorType": "bad_data", "error": "parse error"})
    assert vector({"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}) == [
        Series({}, 2.0)
    ]


def test_prometheus_times_are_read_to_the_nanosecond() -> None:
    assert unix_time("1970-01-01T00:01:40.123456789Z") == pytest.approx(100.123456789)
    assert unix_time("1970-01-01T01:00:00+01:00") == 0.0


PROMETHEUS_OWN_METRICS = """\
# HELP prometheus_target_interval_length_seconds Actual intervals between scrapes.
# TYPE prometheus_target_interval_length_seconds summary
prometheus_target_interval_length_seconds{interval="1s",quantile="0.01"} 0.98
prometheus_target_interval_length_seconds{interval="1s",quantile="0.5"} 1.0
prometheus_target_interval_length_seconds{interval="1s",quantile="0.99"} 1.4
prometheus_target_interval_length_seconds_sum{interval="1s"} 300.2
prometheus_target_interval_length_seconds_count{interval="1s"} 300
# HELP prometheus_rule_group_last_duration_seconds The duration of the last rule group evaluation.
# TYPE prometheus_rule_group_last_duration_seconds gauge
prometheus_rule_group_last_duration_seconds{rule_group="/r/rules.yaml;kvgate.engines"} 0.012
prometheus_rule_group_last_duration_seconds{rule_group="/r/rules.yaml;kvgate.rollouts"} 0.25
"""


def test_cadence_is_how_late_prometheus_own_metrics_say_it_scraped_and_evaluated() -> None:
    cadence = cadence_of(PROMETHEUS_OWN_METRICS, 1.0)
    assert cadence.scrape_interval_p99 == 1.4
    assert cadence.rule_evaluation_seconds == 0.25
    assert cadence.lateness == pytest.approx(0.4 + 0.25)


def test_cadence_before_any_scrape_counts_as_on_time() -> None:
    text = PROMETHEUS_OWN_METRICS.replace('quantile="0.99"} 1.4', 'quantile="0.99"} NaN').replace(
        "0.25\n", "NaN\n"
    )
    cadence = cadence_of(text, 1.0)
    assert (cadence.scrape_interval_p99, cadence.rule_evaluation_seconds) == (1.0, 0.012)
    assert cadence_of("", 1.0).lateness == 0.0
