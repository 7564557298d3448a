"""The custom-metrics pipeline an HPA on kvgate's roles stands on, end to end and all real:
pods export ``sglang:num_queue_reqs`` -> the world's Prometheus scrapes them (a PodMonitor in the
engines' PodMonitor's shape) -> prometheus-adapter serves it as ``sglang_num_queue_reqs`` on
``custom.metrics.k8s.io`` behind the API server's aggregation layer (rules:
docs/autoscaling/prometheus-adapter-rules.yaml) -> the world's kube-controller-manager's HPA
controller scales a plain Deployment with an ``autoscaling/v2`` Pods metric.

The pods are a few lines of Python serving the gauge on ``/metrics``; a ``PUT`` sets its value.

Run: ``KVGATE_REQUIRE_E2E=1 .venv/bin/pytest -q -s e2e/tests/test_metrics_pipeline.py`` (root).
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.polling import poll_until
from kvgate_e2e.prometheus import Prometheus, wait_scraped
from kvgate_e2e.prometheus_adapter import GROUP, LABELS, VERSIONS, PrometheusAdapter
from kvgate_e2e.world import World, is_ready

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
APP = "queue"
METRIC = "sglang_num_queue_reqs"
APP_LABELS = {"e2e.kvgate.io/metrics-pipeline": APP}
# Scraped like the engines: the chart's engine PodMonitor's shape, selecting these pods, and its
# job (the adapter rules read SGLang's series of that job only). And the same pods again by a
# monitor of another job, as a tenant's own PodMonitor would: its series, with the same name,
# namespace and pod, must not add to the custom metric.
ENGINE_JOB = "kvgate-system/kvgate-engines"
LOOKALIKE_JOB = "default/lookalike"
# Deadlines, not bounds (the run prints how long the HPA took each way): only a step that never
# happens reaches one.
QUEUE_POD_DEADLINE = 90  # a python:3.11-slim queue pod scheduled, started and Ready
# The HPA setting the replicas once the adapter serves the new value: its 2 s sync period and a
# scale policy at once.
HPA_DEADLINE = 60
SCRAPE_DEADLINE = 30  # a new value scraped by Prometheus (a 1 s interval)
# The adapter serving a series or value Prometheus has (it relists every 2 s, RELIST_SECONDS).
ADAPTER_DEADLINE = 30
QUEUE_PUT_TIMEOUT = 10  # one PUT to a queue pod's server: it answers 204 at once
PROMETHEUS_EXTRA_MONITORS = [
    {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "metrics-pipeline", "namespace": "kvgate-system"},
        "spec": {
            "selector": {"matchLabels": APP_LABELS},
            "namespaceSelector": {"any": True},
            "podMetricsEndpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "relabelings": [{"targetLabel": "job", "replacement": ENGINE_JOB}],
                }
            ],
        },
    },
    {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "lookalike", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": APP_LABELS},
            "namespaceSelector": {"any": True},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics"}],
        },
    },
]
QUEUE_SERVER = r"""
import http.server, os
value = [0.0]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("# TYPE sglang:num_queue_reqs gauge\n"
                f'sglang:num_queue_reqs{{model_name="m",engine_type="unified"}} {value[0]}\n')
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body.encode())
    def do_PUT(self):
        value[0] = float(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(204)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((os.environ["POD_IP"], 8080), Handler).serve_forever()
"""


def deployment(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": APP, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": APP_LABELS},
            "template": {
                "metadata": {"labels": APP_LABELS},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "server",
                            "image": "python:3.11-slim",
                            "command": ["python3", "-c", QUEUE_SERVER],
                            "env": [
                                {
                                    "name": "POD_IP",
                                    "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                                }
                            ],
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                        }
                    ],
                },
            },
        },
    }


def hpa(namespace: str, target: str) -> dict[str, Any]:
    """Scale ``APP`` between 1 and 3 replicas on the pods' average queue, at once both ways."""
    at_once = {"stabilizationWindowSeconds": 0, "policies": [
        {"type": "Percent", "value": 200, "periodSeconds": 1}
    ]}  # fmt: skip
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": APP, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": APP},
            "minReplicas": 1,
            "maxReplicas": 3,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": METRIC},
                        "target": {"type": "AverageValue", "averageValue": target},
                    },
                }
            ],
            "behavior": {"scaleUp": at_once, "scaleDown": at_once},
        },
    }


def set_queue(world: World, pod: dict[str, Any], value: float) -> None:
    url = f"http://127.0.0.1:{world.forward(pod['status']['podIP'], 8080)}/"
    request = urllib.request.Request(url, data=str(value).encode(), method="PUT")
    with urllib.request.urlopen(request, timeout=QUEUE_PUT_TIMEOUT) as answer:
        assert answer.status == 204


def ready_pods(world: World, namespace: str) -> list[dict[str, Any]]:
    selector = ",".join(f"{k}={v}" for k, v in APP_LABELS.items())
    pods = world.list("pods", namespace, selector)
    return [p for p in pods if is_ready(p) and not p["metadata"].get("deletionTimestamp")]


def wait_replicas(world: World, namespace: str, want: int, timeout: float) -> float:
    """Wait until the HPA has set the Deployment's replicas to ``want``; the seconds it took."""
    started = time.monotonic()

    def story() -> str:
        state = world.get("hpa", APP, namespace) or {}
        return f"HPA status: {state.get('status')}"

    poll_until(
        f"the HPA to set {namespace}/{APP} to {want} replicas",
        lambda: (
            (world.get("deployment", APP, namespace) or {}).get("spec", {}).get("replicas") == want
        ),
        timeout,
        period=0.5,
        details=story,
    )
    return time.monotonic() - started


def test_a_stopped_adapter_leaves_nothing_registered_and_discovery_whole(
    world: World, prometheus: Prometheus
) -> None:
    """Runs before the module's ``metrics_adapter`` starts the next adapter in the same world."""
    with PrometheusAdapter(world.cluster, prometheus) as adapter:
        assert adapter.raw(f"/apis/{GROUP}")["preferredVersion"]["version"] == "v1beta2"
    selector = ",".join(f"{k}={v}" for k, v in LABELS.items())
    left = world.kubectl(
        "get", "apiservice,clusterrole,clusterrolebinding,service,endpointslice,rolebinding",
        "--all-namespaces", f"--selector={selector}", "-o", "name",
    ).stdout  # fmt: skip
    assert left.strip() == ""
    for version in VERSIONS:
        assert world.get("apiservice", f"{version}.{GROUP}") is None
    # A registered but unreachable APIService would fail discovery for every client.
    assert world.kubectl("api-resources", "-o", "name").returncode == 0


def test_the_hpa_scales_a_deployment_on_a_pod_gauge_served_by_prometheus_adapter(
    world: World, prometheus: Prometheus, metrics_adapter: PrometheusAdapter, namespace: str
) -> None:
    world.apply(deployment(namespace))
    first = poll_until(
        "the first queue pod to be Ready",
        lambda: ready_pods(world, namespace),
        QUEUE_POD_DEADLINE,
        period=0.5,
    )[0]
    name = first["metadata"]["name"]
    for job in (ENGINE_JOB, LOOKALIKE_JOB):
        wait_scraped(
            prometheus, f'sglang:num_queue_reqs{{job="{job}",namespace="{namespace}",pod="{name}"}}'
        )

    # The API server answers the custom metric for the pods, through the adapter (once its
    # relist has seen the series).
    values = metrics_adapter.wait_pod_metrics(
        namespace, METRIC, lambda v: name in v, ADAPTER_DEADLINE
    )
    assert values == {name: 0.0}
    discovery = metrics_adapter.raw(f"/apis/{GROUP}/v1beta1")
    assert f"pods/{METRIC}" in {r["name"] for r in discovery["resources"]}
    assert metrics_adapter.pod_metrics(namespace, METRIC, version="v1beta2") == {name: 0.0}

    world.apply(hpa(namespace, target="2"))
    set_queue(world, first, 6)
    both = f'sglang:num_queue_reqs{{namespace="{namespace}",pod="{name}"}} == 6'
    # Both jobs scraped the 6 (one scrape interval, 1 s, apart at most).
    poll_until(
        f"{both} from both jobs",
        lambda: len(prometheus.query(both)) == 2,
        SCRAPE_DEADLINE,
        period=0.5,
    )
    # 6, not 12: the adapter sums the pod's series of the engine job only.
    seen = metrics_adapter.wait_pod_metrics(
        namespace, METRIC, lambda v: v.get(name) == 6.0, ADAPTER_DEADLINE
    )
    assert seen == {name: 6.0}
    # 6 queued on 1 pod against an average target of 2: ceil(1 * 6 / 2) = 3 (the maximum).
    up = wait_replicas(world, namespace, want=3, timeout=HPA_DEADLINE)
    print(f"\nMEASURED queue 6 on 1 pod -> HPA sets 3 replicas: {up:.1f}s")
    poll_until(
        "3 queue pods Ready", lambda: len(ready_pods(world, namespace)) == 3, QUEUE_POD_DEADLINE
    )
    state = world.get("hpa", APP, namespace)
    assert state is not None
    assert state["status"]["currentMetrics"][0]["pods"]["metric"]["name"] == METRIC
    active = next(c for c in state["status"]["conditions"] if c["type"] == "ScalingActive")
    assert (active["status"], active["reason"]) == ("True", "ValidMetricFound")

    set_queue(world, first, 0)
    down = wait_replicas(world, namespace, want=1, timeout=HPA_DEADLINE)
    print(f"MEASURED queue 0 on 3 pods -> HPA sets 1 replica: {down:.1f}s")
