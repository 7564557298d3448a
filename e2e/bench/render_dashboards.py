"""Pictures of the chart's Grafana dashboards with real data (run as root; ``make
dashboard-images``): docs/images/dashboard-<name>.png.

There is no Grafana here. The script starts its own e2e world (a real control plane, kvgate
installed by Helm, the reference engine) and the world's real Prometheus
(``kvgate_e2e.prometheus``: the chart's monitors and rules, smg's routers), runs one
ModelDeployment through a day in its life, then asks Prometheus for every panel's query
(``kvgate_e2e.dashboards``: the variables replaced as Grafana would) over the whole run
(``query_range``, one point every ``--step`` seconds) and draws each panel with matplotlib in
the dashboard's order: a line per series named by the panel's legend, the panel's threshold as
a red dashed line, tables as an instant query at the end (as Grafana's tables do).

The day: the sample (llama-3.1-8b, 131,072 tokens, 80 GiB GPUs) with two decode replicas
becomes Ready and serves requests from 4 clients the whole time (known-answer prompts and
2,000-token prompts, one in three streamed); a rollout to a new revision
(decode memFractionStatic 0.80) that verifies and takes over; a rollout to a revision whose
engines come up with a KV pool of 100,000 tokens (the big pool's node capped, as a node with less
free GPU memory would), refused while the previous revision keeps serving.

    python e2e/bench/render_dashboards.py [--out docs/images] [--phase-seconds 60] [--step 5]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import random
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kvgate_e2e import dashboards
from kvgate_e2e.kubelet.node import MAX_TOTAL_TOKENS_ANNOTATION
from kvgate_e2e.polling import poll_until
from kvgate_e2e.prometheus import Prometheus
from kvgate_e2e.world import (
    BIG_POOL,
    REPO,
    World,
    WorldConfig,
    is_ready,
    known_answer_body,
    load_sample,
)
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

NAMESPACE, MD = "dashboards", "llama-8b"
MODEL = "llama-3.1-8b"
CAPPED_POOL = 100_000  # below the 131,072-token context: the third revision is refused
CLIENTS = 4
MAX_LEGEND = 8


def sample() -> dict[str, Any]:
    md = copy.deepcopy(load_sample("llama-8b"))
    md["metadata"] = {"name": MD}
    for role in ("prefill", "decode"):
        md["spec"][role]["nodeSelector"] = {"kvgate.io/pool": BIG_POOL}
    md["spec"]["decode"]["replicas"] = 2
    return md


def request(url: str, rng: random.Random) -> None:
    if rng.random() < 0.5:
        body = known_answer_body(MODEL, max_new_tokens=16)
    else:
        ids = [rng.randrange(100, 30_000) for _ in range(2_000)]
        body = {"model": MODEL, "input_ids": ids, "sampling_params": {"max_new_tokens": 64}}
    if rng.random() < 1 / 3:
        body["stream"] = True
    req = urllib.request.Request(
        url, json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with contextlib.suppress(OSError), urllib.request.urlopen(req, timeout=120) as answer:
        answer.read()


@contextlib.contextmanager
def clients(world: World) -> Iterator[None]:
    """CLIENTS threads sending one request after another to the ModelDeployment's Service."""
    stop = threading.Event()
    url = world.service_url(MD, NAMESPACE) + "/generate"

    def loop(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            request(url, rng)
            stop.wait(rng.uniform(0.1, 0.5))

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=130)


def serving(world: World, revision_not: str | None) -> str | None:
    md = world.get_md(MD, NAMESPACE) or {}
    status = md.get("status") or {}
    rev = status.get("servingRevision")
    done = is_ready(md) and rev and rev != revision_not and rev == status.get("targetRevision")
    return str(rev) if done else None


def refused(world: World) -> bool:
    status = (world.get_md(MD, NAMESPACE) or {}).get("status") or {}
    return bool(status.get("refusedRevision")) and (
        status.get("refusedRevision") == status.get("targetRevision")
    )


def big_nodes(world: World) -> list[str]:
    out = world.kubectl("get", "nodes", "-l", f"kvgate.io/pool={BIG_POOL}", "-o", "name")
    return [line.removeprefix("node/") for line in out.stdout.split()]


def run_day(world: World, phase: float, say: Any) -> None:
    world.create_namespace(NAMESPACE)
    md = sample()
    world.apply(md, NAMESPACE)
    first = poll_until("the sample to serve", lambda: serving(world, None), 300)
    say(f"revision {first} serves")
    with clients(world):
        time.sleep(phase)
        md["spec"]["decode"]["memFractionStatic"] = 0.80
        world.apply(md, NAMESPACE)
        second = poll_until("the second revision to serve", lambda: serving(world, first), 300)
        say(f"revision {second} verified and serves")
        time.sleep(phase)
        nodes = big_nodes(world)
        for node in nodes:
            world.kubectl("annotate", "node", node, f"{MAX_TOTAL_TOKENS_ANNOTATION}={CAPPED_POOL}")
        try:
            md["spec"]["decode"]["memFractionStatic"] = 0.82
            world.apply(md, NAMESPACE)
            poll_until("the third revision to be refused", lambda: refused(world), 300)
            say("the third revision was refused; the second keeps serving")
        finally:
            for node in nodes:
                world.kubectl("annotate", "node", node, f"{MAX_TOTAL_TOKENS_ANNOTATION}-")
        time.sleep(phase)


# ------------------------------------------------------------------------------- drawing


def legend(fmt: str, labels: Mapping[str, str]) -> str:
    text = fmt
    for name in dashboards.legend_labels(fmt):
        text = text.replace("{{" + name + "}}", labels.get(name, ""))
    return text.strip() or "value"


def query_range(prom: Prometheus, expr: str, start: float, end: float, step: float) -> list[Any]:
    answer = prom.api("query_range", query=expr, start=str(start), end=str(end), step=str(step))
    if answer.get("status") != "success":
        raise RuntimeError(f"{expr}: {answer}")
    return list(answer["data"]["result"])


def query_at(prom: Prometheus, expr: str, at: float) -> list[Any]:
    """An instant query at ``at`` (what a Grafana table shows), each result as one point."""
    answer = prom.api("query", query=expr, time=str(at))
    if answer.get("status") != "success":
        raise RuntimeError(f"{expr}: {answer}")
    return [{"metric": r["metric"], "values": [r["value"]]} for r in answer["data"]["result"]]


def threshold(panel: Mapping[str, Any]) -> float | None:
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    values = [s["value"] for s in steps if s.get("value") is not None]
    return values[0] if values else None


def draw_states(ax: Any, results: list[tuple[str, list[Any]]], start: float) -> None:
    """A state timeline: a bar per series, green while its value is 1, red while 0."""
    rows = [(legend(fmt, row["metric"]), row["values"]) for fmt, rs in results for row in rs]
    for index, (_, values) in enumerate(rows):
        for (t, v), (t_next, _) in zip(values, [*values[1:], values[-1]], strict=True):
            width = max((float(t_next) - float(t)) / 60, 0.05)
            color = "tab:green" if float(v) >= 1 else "tab:red"
            ax.broken_barh([((float(t) - start) / 60, width)], (index - 0.4, 0.8), color=color)
    ax.set_yticks(range(len(rows)), [name[-34:] for name, _ in rows], fontsize=5.5)
    ax.set_xlabel("minutes (green: 1, red: 0)", fontsize=7)
    ax.tick_params(axis="x", labelsize=7)


def draw_lines(
    ax: Any, panel: Mapping[str, Any], results: list[tuple[str, list[Any]]], start: float
) -> None:
    for fmt, rows in results:
        for row in rows:
            xs = [(float(t) - start) / 60 for t, _ in row["values"]]
            ys = [float(v) for _, v in row["values"]]
            ax.plot(xs, ys, linewidth=1.2, label=legend(fmt, row["metric"]))
    if (line := threshold(panel)) is not None:
        ax.axhline(line, color="red", linestyle="--", linewidth=1)
    unit = panel["fieldConfig"]["defaults"]["unit"]
    if unit == "percentunit":
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylim(bottom=0)
    elif unit == "s":
        ax.set_ylabel("seconds", fontsize=7)
    ax.set_xlabel("minutes", fontsize=7)
    ax.tick_params(labelsize=7)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        shown = MAX_LEGEND if len(handles) > MAX_LEGEND + 1 else len(handles)
        names = [n[-48:] for n in labels[:shown]]
        if shown < len(handles):
            names[-1] += f" (+{len(handles) - shown} more)"
        ax.legend(handles[:shown], names, fontsize=5.5, loc="upper left", framealpha=0.6)


def number(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:.4g}"


def draw_table(ax: Any, results: list[tuple[str, list[Any]]]) -> None:
    rows = [
        [legend(fmt, row["metric"]), number(float(row["values"][-1][1]))]
        for fmt, rs in results
        for row in rs
    ]
    ax.axis("off")
    if rows:
        table = ax.table(
            cellText=[[name[-60:], value] for name, value in rows[:8]],
            colLabels=["series", "last value"],
            colWidths=[0.8, 0.2],
            loc="center",
        )
        table.auto_set_font_size(False)
        table.set_fontsize(6.5)


def render(
    prom: Prometheus, board: Mapping[str, Any], window: tuple[float, float, float]
) -> Figure:
    start, end, step = window
    minutes = max(1, math.ceil((end - start) / 60))
    values = {
        "namespace": NAMESPACE,
        "deployment": MD,
        "role": ".*",
        "__rate_interval": "1m",
        "__range": f"{minutes}m",
    }
    panels = board["panels"]
    rows = math.ceil(len(panels) / 2)
    fig = Figure(figsize=(11, 2.2 * rows))
    axes = fig.subplots(rows, 2, squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        table = panel["type"] in ("table", "bargauge")
        results = [
            (
                t.get("legendFormat", ""),
                query_range(prom, dashboards.substitute(t["expr"], values), start, end, step)
                if not table
                else query_at(prom, dashboards.substitute(t["expr"], values), end),
            )
            for t in panel["targets"]
        ]
        ax.set_title(panel["title"], fontsize=8)
        if table:
            draw_table(ax, results)
        elif panel["type"] == "state-timeline":
            draw_states(ax, results, start)
        else:
            draw_lines(ax, panel, results, start)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"{board['title']} (ModelDeployment {NAMESPACE}/{MD}, real data)", fontsize=10)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    parser.add_argument("--phase-seconds", type=float, default=60.0)
    parser.add_argument("--step", type=float, default=5.0)
    parser.add_argument("--dpi", type=int, default=72)
    args = parser.parse_args(argv)

    def say(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    with World(WorldConfig(progress=sys.stdout)) as world, Prometheus(world.cluster) as prom:
        start = time.time()
        run_day(world, args.phase_seconds, say)
        end = time.time()
        for name, board in dashboards.load().items():
            fig = render(prom, board, (start, end, args.step))
            path = args.out / f"dashboard-{name.removeprefix('kvgate-').removesuffix('.json')}.png"
            fig.savefig(path, dpi=args.dpi)
            say(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
