"""kvgate's alerts fire and resolve in a real Prometheus, from real metrics.

The world's Prometheus (``kvgate_e2e.prometheus``, the ``prometheus`` fixture) scrapes what the
chart's monitors select and evaluates the chart's PrometheusRule, rendered with short ``for:``
values (PROMETHEUS_RULE_VALUES); alerts are read from ``ALERTS`` (no Alertmanager).

Run: ``KVGATE_REQUIRE_E2E=1 .venv/bin/pytest -q -s e2e/tests/test_alerts_fire.py`` (root).
"""

from __future__ import annotations

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.prometheus import Prometheus, wait_scraped
from kvgate_e2e.world import OPERATOR_NAMESPACE, World

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
INTERVAL = 1.0  # the fixture's scrape and evaluation interval
PROMETHEUS_RULE_VALUES = {
    "headroomFor": "2s",
    "kvUsageFor": "2s",
    "refusedRolloutWindow": "20s",
}


def test_the_charts_service_monitor_scrapes_the_operator_and_the_webhook(
    world: World, prometheus: Prometheus
) -> None:
    """Both metrics Services of the release are targets, up, with the Service as ``job``; the
    operator's series keep their own labels (honorLabels) and the webhook's are there."""
    leader = wait_scraped(prometheus, f'kvgate_leader{{namespace="{OPERATOR_NAMESPACE}"}} == 1')
    assert leader[0].labels["job"] == "kvgate-metrics", leader
    webhook = wait_scraped(prometheus, 'up{job="kvgate-webhook-metrics"} == 1')
    assert webhook[0].labels["namespace"] == OPERATOR_NAMESPACE, webhook
