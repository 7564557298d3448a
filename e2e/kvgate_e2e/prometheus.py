"""A real Prometheus server in the e2e world: the chart's monitors as scrape jobs, its alerts as
rules, and a client that reads ``ALERTS`` (no Alertmanager).

The server is built from its Go module by ``e2e/prometheus/build.sh`` (cached outside the clone,
like promtool) and runs as a host process inside the world's network namespace (as the
LeaderWorkerSet controller does, ``kvgate_e2e.lws``), listening on the control-plane address on
a port of its own (several servers may run at once, one per test module), with its TSDB, config
and log in the run directory; all of it is removed on the way out.

What it scrapes comes from what the chart ships (``helm template`` with the monitors on):
``monitor_scrape_configs`` translates the ServiceMonitor (the operator's and the webhook's
metrics Services), the engines' PodMonitor and the routers' (smg's Prometheus listener, port
``metrics`` 29000) into ``kubernetes_sd_configs`` jobs the way the Prometheus Operator does
(select by label, keep the named port, label each series with its namespace, pod, service and
container), so a test that reads a series through this server proves the chart's monitors select
the right targets. Service discovery asks the world's API server with the admin client
certificate of the world's in-namespace kubeconfig.

Rules: the chart's PrometheusRule (``metrics.prometheusRule.enabled=true``), rendered with the
values a test passes (short ``for:`` values), its ``spec.groups`` written as a rule file.

Usage (a pytest fixture in ``e2e/tests/conftest.py`` gives one per module: ``prometheus``)::

    with Prometheus(world.cluster, rule_values={"kvUsageFor": "2s"}) as prom:
        prom.query('up{job="kvgate-system/kvgate-metrics"}')  # -> [Series(labels, value)]
        prom.alerts()                                       # -> [Alert(name, state, labels)]
        prom.wait_firing("KvgateEngineHeadroomLow", {"namespace": ns}, 60)  # -> Alert
        prom.wait_resolved("KvgateEngineHeadroomLow", {"namespace": ns}, 60)
        prom.set_rules(values) / prom.reload()
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from kvgate_e2e.build_artifacts import find_binaries
from kvgate_e2e.cluster_like import ClusterLike
from kvgate_e2e.deadlines import BUILD_QUERY_TIMEOUT, METRICS_TIMEOUT
from kvgate_e2e.lifecycle import Started
from kvgate_e2e.polling import Deadline, poll_until
from kvgate_e2e.server_process import ServerProcess

E2E_DIR = Path(__file__).resolve().parent.parent
REPO = E2E_DIR.parent
CHART = REPO / "charts" / "kvgate"
BUILD_SCRIPT = E2E_DIR / "prometheus" / "build.sh"
RELEASE, RELEASE_NAMESPACE = "kvgate", "kvgate-system"  # as the world installs the chart
MONITORING_APIS = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
)
FIRST_PORT = 19090  # the server's port on the control-plane address: the first free from here
PORT_TRIES = 50
INTERVAL_SECONDS = 1.0  # scrape and rule evaluation
HELM_TEMPLATE_TIMEOUT = 60  # helm template of the chart, local (no cluster): a second or two
READY_PROBE_TIMEOUT = 2  # one GET /-/ready while the server starts (polled again on a failure)
RELOAD_TIMEOUT = 30  # POST /-/reload: Prometheus re-reads its config and rule files first


class PrometheusError(RuntimeError):
    """Prometheus is not built, did not come up, or answered an error."""


# ---------------------------------------------------------------------------- build artifacts
def server_binary() -> Path | None:
    """The built server, or None when ``e2e/prometheus/build.sh`` has not built it."""
    try:
        proc = subprocess.run(
            [str(BUILD_SCRIPT), "--print-path"],
            capture_output=True,
            text=True,
            timeout=BUILD_QUERY_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = Path(proc.stdout.strip()) if proc.returncode == 0 else None
    return path if path is not None and path.is_file() else None


def missing_server_reason() -> str:
    return (
        f"Prometheus is not built; build it with `{BUILD_SCRIPT}` or `make prometheus` "
        "(minutes on 2 cores, then cached)"
    )


# ---------------------------------------------------------------------------- config (pure)
def sanitize(name: str) -> str:
    """A Kubernetes label name as kubernetes_sd puts it in a meta label."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _selector_relabels(kind: str, match_labels: Mapping[str, str]) -> list[dict[str, Any]]:
    return [
        {
            "source_labels": [
                f"__meta_kubernetes_{kind}_labelpresent_{sanitize(k)}",
                f"__meta_kubernetes_{kind}_label_{sanitize(k)}",
            ],
            "regex": f"true;{re.escape(v)}",
            "action": "keep",
        }
        for k, v in sorted(match_labels.items())
    ]


def _namespaces(selector: Mapping[str, Any], own: str) -> dict[str, Any]:
    if selector.get("any"):
        return {}
    return {"namespaces": {"names": list(selector.get("matchNames") or [own])}}


def _copy(source: str, target: str) -> dict[str, Any]:
    return {"source_labels": [source], "target_label": target, "action": "replace"}


_RELABEL_KEYS = {
    "sourceLabels": "source_labels",
    "separator": "separator",
    "targetLabel": "target_label",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}


def relabel_config(relabeling: Mapping[str, Any]) -> dict[str, Any]:
    """A monitor's RelabelConfig (camelCase, action in any case) as Prometheus writes it."""
    unknown = set(relabeling) - set(_RELABEL_KEYS)
    if unknown:
        raise ValueError(f"relabeling fields this translation does not know: {sorted(unknown)}")
    config = {_RELABEL_KEYS[key]: value for key, value in relabeling.items()}
    if "action" in config:
        config["action"] = str(config["action"]).lower()
    return config


def _job(
    name: str,
    role: str,
    namespaces: Mapping[str, Any],
    relabels: list[dict[str, Any]],
    endpoint: Mapping[str, Any],
    sd: Mapping[str, Any],
) -> dict[str, Any]:
    """The scrape job; the endpoint's own relabelings come after the operator's (so they may
    set ``job``), its metricRelabelings become ``metric_relabel_configs``."""
    job: dict[str, Any] = {
        "job_name": name,
        "metrics_path": endpoint.get("path", "/metrics"),
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "kubernetes_sd_configs": [{**sd, "role": role, **namespaces}],
        "relabel_configs": relabels + [relabel_config(r) for r in endpoint.get("relabelings", [])],
    }
    metric_relabels = [relabel_config(r) for r in endpoint.get("metricRelabelings", [])]
    if metric_relabels:
        job["metric_relabel_configs"] = metric_relabels
    return job


def service_monitor_jobs(monitor: Mapping[str, Any], sd: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One ``endpointslice`` job per endpoint of a ServiceMonitor, as the Prometheus Operator
    writes it: Services selected by label, the named port kept, ``job`` the Service's name
    (unless the endpoint's relabelings set it), ``namespace``/``service``/``pod``/``container``/
    ``endpoint`` from the target."""
    meta, spec = monitor["metadata"], monitor["spec"]
    namespaces = _namespaces(spec.get("namespaceSelector") or {}, meta["namespace"])
    match = (spec.get("selector") or {}).get("matchLabels") or {}
    jobs = []
    for i, endpoint in enumerate(spec.get("endpoints") or []):
        relabels = [
            *_selector_relabels("service", match),
            {
                "source_labels": ["__meta_kubernetes_endpointslice_port_name"],
                "regex": re.escape(str(endpoint["port"])),
                "action": "keep",
            },
            _copy("__meta_kubernetes_namespace", "namespace"),
            _copy("__meta_kubernetes_service_name", "service"),
            _copy("__meta_kubernetes_pod_name", "pod"),
            _copy("__meta_kubernetes_pod_container_name", "container"),
            _copy("__meta_kubernetes_service_name", "job"),
            {"target_label": "endpoint", "replacement": str(endpoint["port"])},
        ]
        name = f"serviceMonitor/{meta['namespace']}/{meta['name']}/{i}"
        jobs.append(_job(name, "endpointslice", namespaces, relabels, endpoint, sd))
    return jobs


def pod_monitor_jobs(monitor: Mapping[str, Any], sd: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One ``pod`` job per endpoint of a PodMonitor, as the Prometheus Operator writes it: pods
    selected by label, finished pods dropped, the named container port kept, ``job``
    ``<namespace>/<name>``, ``namespace``/``pod``/``container``/``endpoint`` from the target."""
    meta, spec = monitor["metadata"], monitor["spec"]
    namespaces = _namespaces(spec.get("namespaceSelector") or {}, meta["namespace"])
    match = (spec.get("selector") or {}).get("matchLabels") or {}
    jobs = []
    for i, endpoint in enumerate(spec.get("podMetricsEndpoints") or []):
        relabels = [
            {
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
                "action": "drop",
            },
            *_selector_relabels("pod", match),
            {
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": re.escape(str(endpoint["port"])),
                "action": "keep",
            },
            _copy("__meta_kubernetes_namespace", "namespace"),
            _copy("__meta_kubernetes_pod_name", "pod"),
            _copy("__meta_kubernetes_pod_container_name", "container"),
            {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
            {"target_label": "endpoint", "replacement": str(endpoint["port"])},
        ]
        name = f"podMonitor/{meta['namespace']}/{meta['name']}/{i}"
        jobs.append(_job(name, "pod", namespaces, relabels, endpoint, sd))
    return jobs


def monitor_scrape_configs(
    documents: Iterable[Mapping[str, Any]], sd: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The scrape jobs of every ServiceMonitor and PodMonitor in ``documents``; ``sd`` is what
    each ``kubernetes_sd_configs`` entry needs to reach the API server (api_server, tls_config)."""
    jobs: list[dict[str, Any]] = []
    for doc in documents:
        if doc.get("kind") == "ServiceMonitor":
            jobs += service_monitor_jobs(doc, sd)
        elif doc.get("kind") == "PodMonitor":
            jobs += pod_monitor_jobs(doc, sd)
    return jobs


def rule_groups(documents: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``spec.groups`` of every PrometheusRule in ``documents`` (a rule file's ``groups``)."""
    return [
        group
        for doc in documents
        if doc.get("kind") == "PrometheusRule"
        for group in doc["spec"]["groups"]
    ]


def sd_config(kubeconfig: Mapping[str, Any]) -> dict[str, Any]:
    """``api_server`` and ``tls_config`` of a kubeconfig's first cluster and user (files)."""
    cluster = kubeconfig["clusters"][0]["cluster"]
    user = kubeconfig["users"][0]["user"]
    return {
        "api_server": cluster["server"],
        "tls_config": {
            "ca_file": cluster["certificate-authority"],
            "cert_file": user["client-certificate"],
            "key_file": user["client-key"],
        },
    }


def server_config(
    scrape_configs: Sequence[Mapping[str, Any]], rule_file: Path, interval: float
) -> dict[str, Any]:
    every = f"{int(interval * 1000)}ms"
    return {
        "global": {
            "scrape_interval": every,
            "scrape_timeout": every,
            "evaluation_interval": every,
        },
        "rule_files": [str(rule_file)],
        "scrape_configs": list(scrape_configs),
    }


def chart_values_args(rule_values: Mapping[str, str], sets: Sequence[str] = ()) -> list[str]:
    """``helm template`` arguments: the monitors and the rule on, ``rule_values`` under
    ``metrics.prometheusRule``, then ``sets`` (more ``--set`` values)."""
    args = [
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.enginePodMonitor.enabled=true",
        "--set",
        "metrics.routerPodMonitor.enabled=true",
        "--set",
        "metrics.prometheusRule.enabled=true",
    ]
    for key, value in sorted(rule_values.items()):
        args += ["--set-string", f"metrics.prometheusRule.{key}={value}"]
    for value in sets:
        args += ["--set", value]
    for api in MONITORING_APIS:
        args += ["--api-versions", api]
    return args


def render_chart(
    rule_values: Mapping[str, str] | None = None, sets: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The chart as the world installs it (release ``kvgate`` in ``kvgate-system``) with the
    monitors and the PrometheusRule on: its documents."""
    binaries = find_binaries()
    if binaries is None:
        raise PrometheusError("helm is not built (e2e/controlplane/build.sh)")
    argv = [
        str(binaries.helm),
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        RELEASE_NAMESPACE,
        *chart_values_args(rule_values or {}, sets),
    ]
    with tempfile.TemporaryDirectory(prefix="kvgate-helm-") as home:
        env = {"HOME": home, "KUBECONFIG": "/dev/null", "PATH": os.environ.get("PATH", "")}
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=HELM_TEMPLATE_TIMEOUT, env=env
        )
    if proc.returncode != 0:
        raise PrometheusError(f"helm template failed: {proc.stderr.strip()}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


# ---------------------------------------------------------------------------- answers (pure)
@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Alert:
    name: str
    state: str  # "pending" or "firing"
    labels: dict[str, str]

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        return self.name == name and all(self.labels.get(k) == v for k, v in labels.items())


def vector(answer: Mapping[str, Any]) -> list[Series]:
    """The series of an instant-query answer (``/api/v1/query``)."""
    if answer.get("status") != "success":
        raise PrometheusError(f"query failed: {answer.get('errorType')}: {answer.get('error')}")
    data = answer["data"]
    if data["resultType"] == "scalar":
        return [Series({}, float(data["result"][1]))]
    return [Series(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]


def alerts_of(series: Iterable[Series]) -> list[Alert]:
    """``ALERTS`` series as alerts."""
    out = []
    for s in series:
        labels = {k: v for k, v in s.labels.items() if k not in ("__name__", "alertstate")}
        out.append(Alert(labels.pop("alertname"), s.labels["alertstate"], labels))
    return out


def unix_time(text: str) -> float:
    """An RFC 3339 time as Prometheus writes it (nanoseconds, ``Z``) as Unix seconds."""
    match = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if match is None:
        raise PrometheusError(f"not an RFC 3339 time: {text!r}")
    base, fraction, zone = match.groups()
    moment = datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone))
    return moment.timestamp() + float(f"0.{fraction or 0}")


# ---------------------------------------------------------------------------- the server
@dataclass(frozen=True)
class Cadence:
    """How late Prometheus ran on this machine, by its own count: the longest actual scrape
    interval (p99 of ``prometheus_target_interval_length_seconds``) and the longest rule group
    evaluation (``prometheus_rule_group_last_duration_seconds``)."""

    interval: float
    scrape_interval_p99: float
    rule_evaluation_seconds: float

    @property
    def lateness(self) -> float:
        """Seconds one scrape and one evaluation took beyond ``interval`` each."""
        late_scrape = max(self.scrape_interval_p99 - self.interval, 0.0)
        return late_scrape + self.rule_evaluation_seconds


def cadence_of(metrics_text: str, interval: float) -> Cadence:
    """The ``Cadence`` in Prometheus' own ``/metrics``; a summary with no observation yet (NaN)
    counts as on time."""
    p99 = interval
    evaluation = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if math.isnan(sample.value):
                continue
            if (
                sample.name == "prometheus_target_interval_length_seconds"
                and sample.labels.get("quantile") == "0.99"
            ):
                p99 = max(p99, sample.value)
            elif sample.name == "prometheus_rule_group_last_duration_seconds":
                evaluation = max(evaluation, sample.value)
    return Cadence(interval, p99, evaluation)


class Prometheus(Started):
    """The server, its config and rules, and the client; a context manager."""

    def __init__(
        self,
        cluster: ClusterLike,
        *,
        rule_values: Mapping[str, str] | None = None,
        interval: float = INTERVAL_SECONDS,
        extra_monitors: Sequence[Mapping[str, Any]] = (),
        progress: IO[str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.interval = interval
        self.rule_values = dict(rule_values or {})
        self.extra_monitors = list(extra_monitors)
        self.host = "198.18.0.1"  # the control-plane address: on lo from the start
        self.port: int | None = None
        self._url: str | None = None
        self._server: ServerProcess | None = None
        self._progress = progress
        self.dir: Path | None = None

    # -- lifecycle
    @property
    def log_path(self) -> Path:
        assert self.dir is not None, "not started"
        return self.dir / "prometheus.log"

    @property
    def url(self) -> str:
        """The server's API from the test process (a relay into the namespace)."""
        if self._url is None:
            raise PrometheusError("Prometheus is not running")
        return self._url

    def start(self, timeout: float = 90.0) -> None:
        binary = server_binary()
        if binary is None:
            raise PrometheusError(missing_server_reason())
        deadline = Deadline(timeout)
        documents = render_chart(self.rule_values)
        kubeconfig = yaml.safe_load(self.cluster.kubeconfig.read_text())
        scrape = monitor_scrape_configs([*documents, *self.extra_monitors], sd_config(kubeconfig))
        for port in range(FIRST_PORT, FIRST_PORT + PORT_TRIES):
            directory = self.cluster.run_dir / f"prometheus-{port}"
            try:
                directory.mkdir()  # claims the port among this world's servers
            except FileExistsError:
                continue
            self.dir, self.port = directory, port
            self._write_rules(rule_groups(documents))
            config = server_config(scrape, directory / "rules.yaml", self.interval)
            (directory / "prometheus.yaml").write_text(yaml.safe_dump(config))
            if self._launch(binary, deadline):
                return
        raise PrometheusError(f"no free port for Prometheus in {FIRST_PORT}+{PORT_TRIES}")

    def _launch(self, binary: Path, deadline: Deadline) -> bool:
        """Start the server; True once it is ready, False if its port was taken."""
        assert self.dir is not None and self.port is not None
        server = ServerProcess(
            "prometheus", self.log_path, error=PrometheusError, stop_seconds=15.0
        )
        self._server = server
        server.start(
            self.cluster,
            [
                str(binary),
                f"--config.file={self.dir / 'prometheus.yaml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address={self.host}:{self.port}",
                "--web.enable-lifecycle",
                "--storage.tsdb.retention.time=2h",
                "--log.level=info",
            ],
            cwd=self.dir,
        )
        self._url = f"http://127.0.0.1:{self.cluster.forward(self.host, self.port)}"

        def ready() -> bool:
            if server.exited():
                return True  # exited: decided below
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(
                    f"{self.url}/-/ready", timeout=READY_PROBE_TIMEOUT
                ) as answer,
            ):
                return int(answer.status) == 200
            return False

        poll_until("Prometheus /-/ready", ready, deadline, period=0.2, error=PrometheusError)
        if not server.exited():
            self._say(f"Prometheus at {self.host}:{self.port} (pid {server.pid})")
            return True
        log = self.log_tail()
        server.stop()
        self._server, self._url = None, None
        if "address already in use" in log:
            return False
        raise PrometheusError(f"Prometheus exited at start-up\n{log}")

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        self._url = None

    # -- rules
    def _write_rules(self, groups: Sequence[Mapping[str, Any]]) -> None:
        assert self.dir is not None
        tmp = self.dir / ".rules.yaml.tmp"
        tmp.write_text(yaml.safe_dump({"groups": list(groups)}))
        tmp.replace(self.dir / "rules.yaml")

    def set_rules(self, rule_values: Mapping[str, str]) -> None:
        """Render the chart's rules again with ``rule_values`` and load them (``reload``)."""
        self.rule_values = dict(rule_values)
        self._write_rules(rule_groups(render_chart(self.rule_values)))
        self.reload()

    def reload(self) -> None:
        """Re-read config and rule files (``POST /-/reload``); raises if they do not load."""
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST", data=b"")
        try:
            with urllib.request.urlopen(request, timeout=RELOAD_TIMEOUT):
                pass
        except urllib.error.HTTPError as exc:
            raise PrometheusError(f"reload failed: {exc.read().decode(errors='replace')}") from exc

    # -- reading
    def api(self, path: str, **params: str) -> dict[str, Any]:
        query = urllib.parse.urlencode(params)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT) as answer:
                return dict(json.load(answer))
        except urllib.error.HTTPError as exc:
            return dict(json.loads(exc.read() or b"{}") or {"status": "error", "error": str(exc)})

    def cadence(self) -> Cadence:
        """How late scrapes and rule evaluations ran so far (Prometheus' own metrics)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=METRICS_TIMEOUT) as answer:
            return cadence_of(answer.read().decode(), self.interval)

    def query(self, expr: str) -> list[Series]:
        """An instant query now: its series."""
        return vector(self.api("query", query=expr))

    def alerts(self) -> list[Alert]:
        """Pending and firing alerts, from ``ALERTS``."""
        return alerts_of(self.query("ALERTS"))

    def active_since(self, alertname: str, labels: Mapping[str, str] | None = None) -> float | None:
        """Unix time the alert with ``labels`` turned pending (``activeAt`` of
        ``/api/v1/alerts``); it fires at the first evaluation ``for:`` later. None if none."""
        want = dict(labels or {})
        for alert in self.api("alerts")["data"]["alerts"]:
            found = dict(alert["labels"])
            if found.get("alertname") == alertname and all(
                found.get(k) == v for k, v in want.items()
            ):
                return unix_time(str(alert["activeAt"]))
        return None

    def resolved_at(
        self, alertname: str, labels: Mapping[str, str], since: float, step: float = 0.2
    ) -> float | None:
        """Unix time ``alertname`` with ``labels`` left ``ALERTS`` after ``since`` (the first
        evaluation step, every ``step`` seconds, without it: Prometheus' own record, however
        late a test looks), or None while it is still pending or firing."""
        matchers = ",".join(
            f'{k}="{v}"' for k, v in sorted({**labels, "alertname": alertname}.items())
        )
        now = time.time()
        answer = self.api(
            "query_range",
            query=f"ALERTS{{{matchers}}}",
            start=f"{since:.3f}",
            end=f"{now:.3f}",
            step=f"{step}",
        )
        if answer.get("status") != "success":
            raise PrometheusError(f"query_range failed: {answer.get('error')}")
        stamps = [float(t) for series in answer["data"]["result"] for t, _ in series["values"]]
        if not stamps:
            return since
        last = max(stamps)
        return None if last >= now - 2 * step else last + step

    def rules(self) -> list[dict[str, Any]]:
        """The loaded rules (``/api/v1/rules``), each with its group's name under ``group``."""
        answer = self.api("rules")
        return [
            {**rule, "group": group["name"]}
            for group in answer["data"]["groups"]
            for rule in group["rules"]
        ]

    def targets(self) -> list[dict[str, Any]]:
        """The active targets (``/api/v1/targets``): labels, health, lastError."""
        return list(self.api("targets", state="active")["data"]["activeTargets"])

    def wait_firing(
        self, alertname: str, labels: Mapping[str, str] | None = None, deadline: float = 60.0
    ) -> Alert:
        """Wait until ``alertname`` with ``labels`` fires; the first matching alert."""
        want = dict(labels or {})

        def firing() -> Alert | None:
            return next(
                (a for a in self.alerts() if a.state == "firing" and a.matches(alertname, want)),
                None,
            )

        return poll_until(
            f"alert {alertname} {want} firing",
            firing,
            deadline,
            period=0.2,
            details=self._story,
        )

    def wait_resolved(
        self, alertname: str, labels: Mapping[str, str] | None = None, deadline: float = 60.0
    ) -> None:
        """Wait until no ``alertname`` alert with ``labels`` is pending or firing."""
        want = dict(labels or {})
        poll_until(
            f"alert {alertname} {want} resolved",
            lambda: not any(a.matches(alertname, want) for a in self.alerts()),
            deadline,
            period=0.2,
            details=self._story,
        )

    def _story(self) -> str:
        with contextlib.suppress(Exception):
            alerts = "\n".join(f"  {a}" for a in self.alerts()) or "  (none)"
            down = [
                f"  {t['labels'].get('job')} {t['scrapeUrl']}: {t['lastError']}"
                for t in self.targets()
                if t.get("health") != "up"
            ]
            return f"ALERTS now:\n{alerts}\ntargets not up:\n" + ("\n".join(down) or "  (none)")
        return self.log_tail()

    def log_tail(self, lines: int = 40) -> str:
        if self.dir is None or not self.log_path.exists():
            return "(no Prometheus log)"
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return "--- prometheus log (tail) ---\n" + "\n".join(text)

    def _say(self, text: str) -> None:
        if self._progress is not None:
            self._progress.write(f"[prometheus] {text}\n")
            self._progress.flush()


def wait_scraped(prom: Prometheus, expr: str, deadline: float = 60.0) -> list[Series]:
    """Wait until ``expr`` returns series (a target scraped); returns them."""
    return poll_until(f"{expr} to return series", lambda: prom.query(expr), deadline, period=0.5)
