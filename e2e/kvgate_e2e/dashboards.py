"""The chart's Grafana dashboards as queries to run: every panel's every target, with the
dashboard's variables replaced as Grafana would replace them for one namespace, ModelDeployment
and role, and the labels its legend shows. Pure: files in, plain data out.

Used by tests/chart/test_chart_dashboards.py (every query parses, every variable is defined),
e2e/tests/test_dashboards_query.py (every query returns series with those labels from a real
Prometheus) and e2e/bench/render_dashboards.py (the pictures in docs/observability.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARDS = Path(__file__).resolve().parents[2] / "charts" / "kvgate" / "dashboards"
# Grafana's own variables the queries use, and what a query of a one-hour dashboard gets.
BUILTIN = {"__rate_interval": "1m", "__range": "1h", "__interval": "15s"}
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_LABEL_VALUES = re.compile(r"label_values\((.+),\s*(\w+)\)", re.S)


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str  # the dashboard's title
    panel: str  # the panel's title
    ref: str  # the target's refId
    expr: str  # with every variable replaced
    legend_labels: frozenset[str]  # the labels {{label}} in the target's legend names

    def where(self) -> str:
        return f"dashboard {self.dashboard!r}, panel {self.panel!r}, query {self.ref}"


def load(directory: Path = DASHBOARDS) -> dict[str, dict[str, Any]]:
    """File name -> dashboard, for every ``*.json`` in ``directory``."""
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def variables_used(text: str) -> set[str]:
    """The names of the variables ``$name`` and ``${name}`` in ``text``."""
    return {a or b for a, b in _VARIABLE.findall(text)}


def defined_variables(board: Mapping[str, Any]) -> list[str]:
    return [v["name"] for v in board.get("templating", {}).get("list", [])]


def substitute(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each variable replaced by ``values`` or Grafana's built-in ones (BUILTIN);
    a variable in neither raises KeyError."""
    merged = {**BUILTIN, **values}

    def one(match: re.Match[str]) -> str:
        return merged[match.group(1) or match.group(2)]

    return _VARIABLE.sub(one, text)


def label_values(definition: str) -> tuple[str, str]:
    """(selector, label) of a query variable's ``label_values(selector, label)``."""
    match = _LABEL_VALUES.fullmatch(definition.strip())
    if match is None:
        raise ValueError(f"not label_values(selector, label): {definition!r}")
    return match.group(1).strip(), match.group(2)


def legend_labels(legend: str) -> frozenset[str]:
    return frozenset(_LEGEND_LABEL.findall(legend))


def panel_queries(
    boards: Mapping[str, Mapping[str, Any]], values: Mapping[str, str]
) -> Iterator[PanelQuery]:
    """Every target of every panel of ``boards``, its variables replaced by ``values`` (e.g.
    namespace, deployment, role, datasource; a built-in like __rate_interval overridden too)."""
    for board in boards.values():
        for panel in board.get("panels", []):
            for target in panel.get("targets", []):
                yield PanelQuery(
                    board["title"],
                    panel["title"],
                    target["refId"],
                    substitute(target["expr"], values),
                    legend_labels(target.get("legendFormat", "")),
                )
