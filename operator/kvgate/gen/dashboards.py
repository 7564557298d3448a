"""Write the chart's Grafana dashboards: ``python -m kvgate.gen.dashboards``.

Three dashboards (Grafana JSON, ``charts/kvgate/dashboards/*.json``), shipped as ConfigMaps in the
Grafana sidecar convention by ``templates/dashboards.yaml`` (``dashboards.enabled``):

- Fleet: every ModelDeployment's advertised context, smallest verified pool per role, headroom,
  serving and target revision, traffic split, refused rollouts by reason.
- ModelDeployment: one ModelDeployment's engines: pool per pod against the context, the gate,
  KV usage against the alert's 80 % line, queues, time to first token, KV transfer queues,
  content checks, KV canary violations, the admission estimate's drift.
- Operator: pass and engine-read latency, the verification backlog, the leader, the webhook.

The queries read kvgate's series, SGLang's (the engine PodMonitor) and smg's (a router
PodMonitor, docs/observability.md), and the chart's recording rules (group kvgate-recording).
``tests/chart/test_chart_dashboards.py`` parses every query and checks the files match this
module; ``e2e/tests/test_dashboards_query.py`` runs every query against a real Prometheus.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvgate.gen.outputs import check_or_write

DEFAULT_DIR = Path("charts/kvgate/dashboards")
SCHEMA_VERSION = 41  # Grafana 12
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Every kvgate series of a ModelDeployment, filtered by the dashboard's variables.
MD = 'namespace=~"$namespace", deployment=~"$deployment"'
MD_ROLE = MD + ', role=~"$role"'
LEADER = "and on (instance) (kvgate_leader == 1)"
# smg's series carry the router pod's name, <deployment>-<revision>-router-<replica set>-<id>.
ROUTER = 'namespace=~"$namespace", pod=~"($deployment)-[0-9a-f]{10}-router-.+"'
VERIFIED_PODS = f"namespace_deployment_pod_role:kvgate_engine_verified:max{{{MD_ROLE}}}"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 12
    threshold: float | None = None  # a red line (and above it red) at this value
    extra: dict[str, Any] = field(default_factory=dict)


def _q(expr: str, legend: str) -> Query:
    return Query(" ".join(expr.split()), legend)


def _quantiles(histogram: str, selector: str = "") -> tuple[Query, ...]:
    return tuple(
        _q(
            f"histogram_quantile({q}, sum by (le) "
            f"(rate({histogram}_bucket{selector}[$__rate_interval])))",
            f"p{round(q * 100)}",
        )
        for q in (0.5, 0.95)
    )


def _counted(counter: str, by: str, fallback_label: str) -> str:
    """The leading replica's count since it started, by ``by`` (a series is created at its first
    count, so increase() over it would miss that one); a ModelDeployment without any counts 0 (a
    row per ModelDeployment, ``fallback_label`` set to "none") instead of no data."""
    return (
        f"sum by ({by}) ({counter}{{{MD}}} {LEADER}) or on (namespace, deployment) "
        f"label_replace(0 * namespace_deployment:kvgate_context_length_tokens:max{{{MD}}}, "
        f'"{fallback_label}", "none", "", "")'
    )


def fleet_panels() -> list[Panel]:
    return [*_pool_panels(), *_revision_panels(), _kv_usage_panel()]


def _pool_panels() -> list[Panel]:
    """The advertised context against each role's verified pools."""
    return [
        Panel(
            "Advertised context",
            "spec.model.contextLength of each ModelDeployment's current spec (tokens).",
            (
                _q(
                    f"namespace_deployment:kvgate_context_length_tokens:max{{{MD}}}",
                    "{{namespace}}/{{deployment}}",
                ),
            ),
            kind="bargauge",
        ),
        Panel(
            "Smallest verified KV pool per role",
            "The smallest KV pool (tokens) among the role's engines whose readiness gate is "
            "True: what the advertised context is guaranteed against.",
            (
                _q(
                    f"namespace_deployment_role:kvgate_verified_kv_pool_tokens:min{{{MD_ROLE}}}",
                    "{{namespace}}/{{deployment}} {{role}}",
                ),
            ),
        ),
        Panel(
            "Headroom: smallest verified pool / context",
            "Below 1 (safety.headroom) no engine of the role can verify; near it, a smaller GPU "
            "or a larger model revision will be refused.",
            (
                _q(
                    f"namespace_deployment_role:kvgate_headroom:ratio{{{MD_ROLE}}}",
                    "{{namespace}}/{{deployment}} {{role}}",
                ),
            ),
            threshold=1.0,
        ),
        Panel(
            "Verified engines per role",
            "Engine pods whose kvgate.io/engine-verified gate is True.",
            (
                _q(
                    f"namespace_deployment_role:kvgate_verified_replicas:count{{{MD_ROLE}}}",
                    "{{namespace}}/{{deployment}} {{role}}",
                ),
            ),
        ),
    ]


def _revision_panels() -> list[Panel]:
    """Which revision serves, the traffic split and the refusals."""
    return [
        Panel(
            "Serving and target revision",
            "status.servingRevision (takes traffic) and status.targetRevision (the current "
            "spec's); different while a rollout runs or after a refusal.",
            (
                _q(
                    "max by (namespace, deployment, state, revision) "
                    f"(kvgate_revision_info{{{MD}}} {LEADER})",
                    "{{namespace}}/{{deployment}} {{state}} {{revision}}",
                ),
            ),
            kind="table",
        ),
        Panel(
            "Traffic split",
            "Each revision's share of the Service's ready routers (status.trafficSplit).",
            (
                _q(
                    "max by (namespace, deployment, revision) "
                    f"(kvgate_revision_traffic_ratio{{{MD}}} {LEADER})",
                    "{{namespace}}/{{deployment}} {{revision}}",
                ),
            ),
            unit="percentunit",
        ),
        Panel(
            "Refused rollouts by reason (since the leader started)",
            "Revisions refused because an engine failed live verification or did not verify in "
            "time; the serving revision kept serving. reason none: nothing refused.",
            (
                _q(
                    _counted(
                        "kvgate_rollouts_refused_total", "namespace, deployment, reason", "reason"
                    ),
                    "{{namespace}}/{{deployment}} {{reason}}",
                ),
            ),
            kind="table",
        ),
    ]


def _kv_usage_panel() -> Panel:
    return Panel(
        "KV in use / verified pool per role",
        "SGLang's KV tokens in use over the role's verified pools: what an autoscaler "
        "scales on. The engine alert fires per pod above 80 %.",
        (
            _q(
                f"namespace_deployment_role:kvgate_kv_usage:ratio{{{MD_ROLE}}}",
                "{{namespace}}/{{deployment}} {{role}}",
            ),
        ),
        unit="percentunit",
        threshold=0.8,
    )


def _engine(metric: str) -> str:
    """An SGLang series of the role's verified engines, summed, with the role."""
    return (
        f"sum by (namespace, deployment, role) (sum by (namespace, pod) ({metric}) "
        f"* on (namespace, pod) group_left (deployment, role) {VERIFIED_PODS})"
    )


def _gate_panels() -> list[Panel]:
    """The pool, the gate and KV usage of one ModelDeployment's engines."""
    return [
        Panel(
            "KV pool per pod vs advertised context",
            "The KV pool each engine reported to kvgate (tokens; refused engines too) against "
            "the context it must hold.",
            (
                _q(
                    f"max by (role, pod) (kvgate_engine_kv_pool_tokens{{{MD_ROLE}}} {LEADER})",
                    "{{role}} {{pod}}",
                ),
                _q(
                    f"namespace_deployment:kvgate_context_length_tokens:max{{{MD}}}",
                    "context length",
                ),
            ),
        ),
        Panel(
            "Readiness gate per pod (1: verified)",
            "kvgate.io/engine-verified: only a verified engine is in its Service and router.",
            (
                _q(
                    f"max by (role, pod) (kvgate_engine_verified{{{MD_ROLE}}} {LEADER})",
                    "{{role}} {{pod}}",
                ),
            ),
            kind="state-timeline",
        ),
        Panel(
            "Gate transitions (dashboard range)",
            "How often each pod's gate turned True or False.",
            (
                _q(
                    "sum by (role, pod) (changes(kvgate_engine_verified"
                    f"{{{MD_ROLE}}}[$__range]) {LEADER})",
                    "{{role}} {{pod}}",
                ),
            ),
            kind="table",
        ),
        Panel(
            "KV in use / verified pool per pod (alert at 80 %)",
            "sglang:num_used_tokens over the pool kvgate verified; KvgateEngineKvUsageHigh fires "
            "above metrics.prometheusRule.kvUsageThreshold (0.8).",
            (
                _q(
                    f"namespace_deployment_pod_role:kvgate_kv_usage:ratio{{{MD_ROLE}}}",
                    "{{role}} {{pod}}",
                ),
            ),
            unit="percentunit",
            threshold=0.8,
        ),
    ]


def _traffic_panels() -> list[Panel]:
    """Requests and KV transfers of one ModelDeployment."""
    return [
        Panel(
            "Queued requests per role",
            "sglang:num_queue_reqs of the verified engines.",
            (
                _q(
                    f"namespace_deployment_role:sglang_num_queue_reqs:sum{{{MD_ROLE}}}",
                    "{{role}}",
                ),
            ),
        ),
        Panel(
            "Running requests per role",
            "sglang:num_running_reqs of the verified engines.",
            (
                _q(
                    f"namespace_deployment_role:sglang_num_running_reqs:sum{{{MD_ROLE}}}",
                    "{{role}}",
                ),
            ),
        ),
        Panel(
            "Time to first token at the routers",
            "smg_pd_ttft_seconds of the ModelDeployment's routers (every revision): from a "
            "request's arrival to its first token through prefill and decode.",
            _quantiles("smg_pd_ttft_seconds", f"{{{ROUTER}}}"),
            unit="s",
        ),
        Panel(
            "KV transfer queues",
            "Prefill requests waiting for decode to take their KV (bootstrap), decode requests "
            "waiting for KV pages (prealloc) and for their KV transfer.",
            (
                _q(_engine("sglang:num_prefill_bootstrap_queue_reqs"), "bootstrap {{role}}"),
                _q(_engine("sglang:num_decode_prealloc_queue_reqs"), "prealloc {{role}}"),
                _q(_engine("sglang:num_decode_transfer_queue_reqs"), "transfer {{role}}"),
            ),
        ),
    ]


def _check_panels() -> list[Panel]:
    """The checks beside the gate of one ModelDeployment: content, KV canary, estimate drift."""
    return [
        Panel(
            "Content checks at maximum length (since the leader started)",
            "safety.contentProbe checks that decided, by result; result none: none ran.",
            (
                _q(
                    _counted(
                        "kvgate_content_checks_total", "namespace, deployment, result", "result"
                    ),
                    "{{result}}",
                ),
            ),
            kind="table",
        ),
        Panel(
            "KV canary violations (since the leader started)",
            "Engine pods whose log showed an SGLang KV canary violation (safety.kvCanary); "
            "each one's gate turned False. pod none: no violation.",
            (
                _q(
                    _counted(
                        "kvgate_kv_canary_violations_total", "namespace, deployment, pod", "pod"
                    ),
                    "{{pod}}",
                ),
            ),
            kind="table",
        ),
        Panel(
            "Admission estimate vs live pool (drift)",
            "(live KV pool - admission estimate) / estimate of the role's worst verified engine; "
            "below -estimator.optimisticDriftPercent admission is optimistic.",
            (
                _q(
                    f"max by (role) (kvgate_kv_pool_estimate_drift_ratio{{{MD_ROLE}}} {LEADER})",
                    "{{role}}",
                ),
            ),
            unit="percentunit",
        ),
    ]


def deployment_panels() -> list[Panel]:
    return _gate_panels() + _traffic_panels() + _check_panels()


def operator_panels() -> list[Panel]:
    return [*_operator_loop_panels(), *_webhook_panels(), _api_requests_panel()]


def _operator_loop_panels() -> list[Panel]:
    """The operator's passes, engine reads and leadership."""
    return [
        Panel(
            "Reconcile pass latency",
            "One ModelDeployment pass: gather, plan, apply.",
            _quantiles("kvgate_reconcile_duration_seconds"),
            unit="s",
        ),
        Panel(
            "Engine read (probe) latency",
            "From asking for a probe slot to the verdict on one live engine.",
            _quantiles("kvgate_verification_duration_seconds"),
            unit="s",
        ),
        Panel(
            "Verification backlog",
            "Engine reads waiting for a probe slot (KVGATE_MAX_CONCURRENT_PROBES): urgent ones "
            "(the pod changed) go first.",
            (
                _q(
                    f"sum by (priority) (kvgate_verification_backlog_reads {LEADER})",
                    "{{priority}}",
                ),
            ),
        ),
        Panel(
            "Leader",
            "1 on the operator replica that runs kvgate's handlers, 0 on a standby.",
            (_q("max by (pod) (kvgate_leader)", "{{pod}}"),),
            kind="state-timeline",
        ),
        Panel(
            "Verifications by outcome",
            "Live engine reads by verdict (Safe, Unsafe, CannotTell) and reason, per second.",
            (
                _q(
                    "sum by (result, reason) (rate(kvgate_verifications_total[$__rate_interval]))",
                    "{{result}} {{reason}}",
                ),
            ),
            unit="reqps",
        ),
    ]


def _webhook_panels() -> list[Panel]:
    """The admission webhook's answers and their latency."""
    return [
        Panel(
            "Webhook admissions by result",
            "Admission requests answered per second, by result: allowed, denied (unsafe), "
            "rejected (not an AdmissionReview for this webhook), error (a kvgate bug).",
            (
                _q(
                    "sum by (result) (rate(kvgate_admission_requests_total[$__rate_interval]))",
                    "{{result}}",
                ),
            ),
            unit="reqps",
        ),
        Panel(
            "Webhook admission latency",
            "Reading, checking and answering one AdmissionReview.",
            _quantiles("kvgate_admission_duration_seconds"),
            unit="s",
        ),
    ]


def _api_requests_panel() -> Panel:
    return Panel(
        "Kubernetes API requests by verb",
        "Requests kvgate's own client sent, per second (kopf's watches not counted).",
        (
            _q(
                "sum by (verb) (rate(kvgate_api_requests_total[$__rate_interval]))",
                "{{verb}}",
            ),
        ),
        unit="reqps",
    )


def _variable(name: str, label: str, query: str, *, multi: bool) -> dict[str, Any]:
    definition = f"label_values({query}, {name})"
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": definition,
        "query": {"qryType": 1, "query": definition, "refId": "PrometheusVariableQueryEditor"},
        "refresh": 2,
        "sort": 1,
        "multi": multi,
        "includeAll": multi,
        **({"allValue": ".*", "current": {"text": "All", "value": "$__all"}} if multi else {}),
    }


def variables(*, multi: bool) -> list[dict[str, Any]]:
    """datasource, namespace, deployment (one each on the ModelDeployment dashboard), role."""
    return [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "refresh": 1,
        },
        _variable("namespace", "Namespace", "kvgate_context_length_tokens", multi=multi),
        _variable(
            "deployment",
            "ModelDeployment",
            'kvgate_context_length_tokens{namespace=~"$namespace"}',
            multi=multi,
        ),
        _variable("role", "Role", f"kvgate_engine_kv_pool_tokens{{{MD}}}", multi=True),
    ]


def _field_config(panel: Panel) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    custom: dict[str, Any] = {}
    if panel.threshold is not None:
        steps.append({"color": "red", "value": panel.threshold})
        custom = {"thresholdsStyle": {"mode": "line+area"}}
    return {
        "defaults": {
            "unit": panel.unit,
            "thresholds": {"mode": "absolute", "steps": steps},
            "custom": custom,
        },
        "overrides": [],
    }


def panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    table = panel.kind in ("table", "bargauge")
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": _field_config(panel),
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": query.expr,
                "legendFormat": query.legend,
                "range": not table,
                "instant": table,
                **({"format": "table"} if panel.kind == "table" else {}),
            }
            for i, query in enumerate(panel.queries)
        ],
        **panel.extra,
    }


def dashboard(uid: str, title: str, panels: list[Panel], templating: list[Any]) -> dict[str, Any]:
    laid_out = []
    x = y = 0
    for number, panel in enumerate(panels, start=1):
        if x + panel.width > 24:
            x, y = 0, y + 8
        laid_out.append(panel_json(panel, number, x, y))
        x += panel.width
    return {
        "uid": uid,
        "title": title,
        "description": "Shipped with the kvgate chart (dashboards.enabled); docs/observability.md.",
        "tags": ["kvgate"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "links": [],
        "annotations": {"list": []},
        "templating": {"list": templating},
        "panels": laid_out,
    }


def dashboards() -> dict[str, dict[str, Any]]:
    """File name -> dashboard."""
    return {
        "kvgate-fleet.json": dashboard(
            "kvgate-fleet", "kvgate / Fleet", fleet_panels(), variables(multi=True)
        ),
        "kvgate-modeldeployment.json": dashboard(
            "kvgate-modeldeployment",
            "kvgate / ModelDeployment",
            deployment_panels(),
            variables(multi=False),
        ),
        "kvgate-operator.json": dashboard(
            "kvgate-operator", "kvgate / Operator", operator_panels(), variables(multi=True)[:1]
        ),
    }


def render(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=2) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate.gen.dashboards", description=__doc__)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a dashboard is out of date; write nothing"
    )
    args = parser.parse_args(argv)
    wanted = {args.dir / name: render(board) for name, board in dashboards().items()}
    return check_or_write(wanted, check=args.check, command="python -m kvgate.gen.dashboards")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
