"""Every panel of the chart's Grafana dashboards shows data from a real Prometheus.

The world's Prometheus (``prometheus`` fixture, ``kvgate_e2e.prometheus``) scrapes the operator
and the webhook through the chart's ServiceMonitor, the engines through its PodMonitor and smg's
routers, and evaluates the chart's rules (the recording rules the dashboards read among them).
One ModelDeployment runs and serves a few requests (one streamed, for the routers' time to first
token); then every query of every panel (``kvgate_e2e.dashboards``: variables replaced for that
namespace, ModelDeployment and every role) must return at least one series carrying the labels
its legend shows. A query that returns nothing fails, naming its dashboard and panel. The
variables offer the ModelDeployment's values and filter by role; an update only the live check can
refuse then shows on the Fleet dashboard by its reason, its revision as the target.

Run: ``KVGATE_REQUIRE_E2E=1 .venv/bin/pytest -q -s e2e/tests/test_dashboards_query.py`` (root).
"""

from __future__ import annotations

import time

import pytest
from kvgate_e2e import dashboards
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import RESET_RETRY_DEADLINE, REVISION_DEADLINE
from kvgate_e2e.polling import poll_until
from kvgate_e2e.prometheus import Prometheus
from kvgate_e2e.world import SMALL_POOL, World, known_answer_body
from scenario_helpers import (
    SERVED_MODEL,
    on_pool_without_estimate,
    sample_md,
    stream_generate,
    wait_md_ready,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
MD = "dash"
# Grafana's built-ins as a one-hour dashboard would pass them, widened so a rate over the
# webhook's one admission (when the ModelDeployment was applied) still sees it.
WINDOWS = {"__rate_interval": "5m", "__range": "15m"}
# Deadlines, not bounds (the run prints when every panel answered): only a step that never
# happens reaches one. Shared ones come from kvgate_e2e.deadlines (the first revision Ready uses
# REVISION_DEADLINE, 300 s, like every other file; it was 240 s here).
# Every panel's series in Prometheus: the engines' and the operator's metrics scraped after the
# first requests, enough samples for each rate.
PANELS_DEADLINE = 90
# The update on the small pool refused: its engines started and gated False, then a pass.
REFUSED_DEADLINE = 120
SHOWN_DEADLINE = 30  # the refusal's series in Prometheus: the operator's next scrapes


def missing(prometheus: Prometheus, query: dashboards.PanelQuery) -> str | None:
    """Why ``query`` does not show what its panel needs, or None when it does."""
    series = prometheus.query(query.expr)
    if not series:
        return f"{query.where()} returned nothing: {query.expr}"
    if not any(query.legend_labels <= s.labels.keys() for s in series):
        labels = sorted({k for s in series for k in s.labels})
        return (
            f"{query.where()}: no series carries the legend's labels "
            f"{sorted(query.legend_labels)} (they carry {labels}): {query.expr}"
        )
    return None


def test_every_dashboard_panel_returns_series_with_its_legends_labels(
    world: World, namespace: str, prometheus: Prometheus
) -> None:
    started = time.monotonic()
    world.apply(sample_md(MD), namespace)
    wait_md_ready(world, MD, namespace, REVISION_DEADLINE)
    ready = time.monotonic()
    url = world.service_url(MD, namespace) + "/generate"

    last = ["no answer yet"]

    def answered() -> bool:
        code, answer = world.router_request(MD, known_answer_body(SERVED_MODEL), namespace)
        last[0] = f"HTTP {code}: {str(answer)[:200]}"
        return code == 200

    # A router that just turned Ready may reset the first connections through its Service.
    for _ in range(3):
        poll_until(
            "a request through the router",
            answered,
            RESET_RETRY_DEADLINE,
            retry_on=(OSError,),
            details=lambda: last[0],
        )
    streamed = poll_until(
        "a streamed request through the router",
        lambda: stream_generate(url, known_answer_body(SERVED_MODEL)),
        RESET_RETRY_DEADLINE,
        retry_on=(OSError,),
    )
    assert streamed.output_ids, streamed

    values = {"namespace": namespace, "deployment": MD, "role": ".*", **WINDOWS}
    queries = list(dashboards.panel_queries(dashboards.load(), values))
    assert len({q.dashboard for q in queries}) == 3 and len(queries) >= 27, len(queries)
    problems: list[str] = []

    def every_panel_has_data() -> bool:
        problems[:] = [p for q in queries if (p := missing(prometheus, q)) is not None]
        return not problems

    poll_until(
        f"every one of the {len(queries)} dashboard queries to return its series",
        every_panel_has_data,
        PANELS_DEADLINE,
        period=1.0,
        details=lambda: "\n".join(problems),
    )
    print(
        f"\nMEASURED {len(queries)} dashboard queries all answered "
        f"{time.monotonic() - ready:.1f}s after the ModelDeployment was Ready "
        f"({ready - started:.1f}s to Ready)"
    )
    choices_offered(prometheus, values)
    only_the_chosen_role(prometheus, {**values, "role": "decode"})
    refusals_shown_by_reason(world, namespace, prometheus, values)


def refusals_shown_by_reason(
    world: World, namespace: str, prometheus: Prometheus, values: dict[str, str]
) -> None:
    """An update only the live check can refuse (both roles on the 24 GiB pool, nothing for
    admission to estimate from): the Fleet's refusals panel shows it by its reason, and the
    revision panel the refused target beside the serving revision."""
    started = time.monotonic()
    world.apply(on_pool_without_estimate(sample_md(MD), SMALL_POOL), namespace)

    def refused() -> str | None:
        status = (world.get_md(MD, namespace) or {}).get("status") or {}
        target = status.get("targetRevision")
        return str(target) if target and status.get("refusedRevision") == target else None

    target = poll_until("the update on the small pool to be refused", refused, REFUSED_DEADLINE)
    panels = {q.panel: q for q in dashboards.panel_queries(dashboards.load(), values)}

    def shown() -> bool:
        refusals = prometheus.query(
            panels["Refused rollouts by reason (since the leader started)"].expr
        )
        revisions = prometheus.query(panels["Serving and target revision"].expr)
        return {s.labels["reason"] for s in refusals} - {"none"} != set() and any(
            s.labels.get("state") == "target" and s.labels.get("revision") == target
            for s in revisions
        )

    poll_until("the refusal on the Fleet dashboard", shown, SHOWN_DEADLINE, period=1.0)
    reasons = prometheus.query(panels["Refused rollouts by reason (since the leader started)"].expr)
    print(
        f"MEASURED refused update shown by reason {sorted(s.labels['reason'] for s in reasons)} "
        f"{time.monotonic() - started:.1f}s after it was applied"
    )


def choices_offered(prometheus: Prometheus, values: dict[str, str]) -> None:
    """Each variable's ``label_values(selector, label)`` offers this ModelDeployment's value
    (every role: both) once the variables before it are chosen."""
    for board in dashboards.load().values():
        for variable in board["templating"]["list"]:
            if variable["type"] != "query":
                continue
            selector, label = dashboards.label_values(variable["definition"])
            expr = f"group by ({label}) ({dashboards.substitute(selector, values)})"
            offered = {s.labels.get(label) for s in prometheus.query(expr)}
            wanted = {"prefill", "decode"} if label == "role" else {values[label]}
            assert wanted <= offered, f"{board['title']} variable {label}: {expr} -> {offered}"


def only_the_chosen_role(prometheus: Prometheus, values: dict[str, str]) -> None:
    """With role=decode every panel still shows data, and none of it is another role's."""
    for query in dashboards.panel_queries(dashboards.load(), values):
        series = prometheus.query(query.expr)
        assert series, f"{query.where()} returned nothing for role decode: {query.expr}"
        roles = {s.labels["role"] for s in series if "role" in s.labels}
        assert roles <= {"decode"}, f"{query.where()} with role decode shows {roles}"
