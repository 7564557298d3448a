"""The `kvgate plan --plot` picture: a bar per shape (its KV pool), a line at context × headroom.

matplotlib is an optional extra (`pip install '.[plot]'` in a clone: kvgate is not on PyPI); it
is imported only here, and
only when a picture is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = "pip install '.[plot]' in a clone of the kvgate repository (it is not on PyPI)"
SAFE_COLOUR = "#2b7bba"
UNSAFE_COLOUR = "#d62728"


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


@dataclass(frozen=True)
class Bar:
    label: str
    kv_pool_tokens: int
    safe: bool


def render(bars: Sequence[Bar], required_pool_tokens: int, title: str, path: Path) -> None:
    """Write a PNG: one bar per shape, unsafe ones red, hatched and marked, the requirement a line.

    Raises PlotUnavailable without matplotlib, OSError when the file cannot be written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: write files only
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise PlotUnavailable(
            f"needs matplotlib, which is not installed ({error}); {INSTALL_HINT}"
        ) from error

    width = max(6.0, 0.55 * len(bars) + 2.5)
    figure, axes = plt.subplots(figsize=(width, 4.8), dpi=100)
    try:
        positions = range(len(bars))
        heights = [bar.kv_pool_tokens for bar in bars]
        colours = [SAFE_COLOUR if bar.safe else UNSAFE_COLOUR for bar in bars]
        drawn = axes.bar(positions, heights, color=colours, edgecolor="black", linewidth=0.5)
        for patch, bar in zip(drawn.patches, bars, strict=True):
            if not bar.safe:
                patch.set_hatch("//")
        # Log scale: a pool a tenth of the context and one forty times it both stay readable.
        axes.set_yscale("log")
        positive = [h for h in heights if h > 0]
        bottom = max(1.0, min([*positive, required_pool_tokens]) / 4)
        top = max([*heights, required_pool_tokens]) * 3
        axes.set_ylim(bottom, top)
        for position, bar in zip(positions, bars, strict=True):
            if bar.safe:
                continue
            if bar.kv_pool_tokens > 0:
                axes.text(
                    position,
                    bar.kv_pool_tokens * 1.1,
                    "✗",
                    ha="center",
                    va="bottom",
                    color=UNSAFE_COLOUR,
                    fontsize=12,
                    fontweight="bold",
                )
            else:
                axes.text(
                    position,
                    bottom * 1.15,
                    "✗ no room",
                    ha="center",
                    va="bottom",
                    rotation=90,
                    color=UNSAFE_COLOUR,
                    fontsize=8,
                    fontweight="bold",
                )
        axes.axhline(required_pool_tokens, color="black", linestyle="--", linewidth=1.2)
        axes.annotate(
            f"context × headroom = {required_pool_tokens:,} tokens",
            xy=(1.0, required_pool_tokens),
            xycoords=("axes fraction", "data"),
            xytext=(-4, 3),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
        )
        axes.set_xticks(list(positions), [bar.label for bar in bars], rotation=60, ha="right")
        for tick, bar in zip(axes.get_xticklabels(), bars, strict=True):
            if not bar.safe:
                tick.set_color(UNSAFE_COLOUR)
        axes.tick_params(axis="x", labelsize=7)
        axes.set_ylabel("estimated KV pool per engine (tokens, log scale)")
        axes.yaxis.set_major_formatter(
            matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:,.0f}")
        )
        axes.set_title(title, fontsize=10)
        handles = [matplotlib.patches.Patch(color=SAFE_COLOUR, label="holds the context")]
        if not all(bar.safe for bar in bars):  # red appears only where a shape is unsafe
            handles.append(
                matplotlib.patches.Patch(
                    facecolor=UNSAFE_COLOUR, hatch="//", label="unsafe: pool < context × headroom"
                )
            )
        axes.legend(handles=handles, loc="upper left", fontsize=8)
        figure.tight_layout()
        # No timestamp in the file: the same plan draws the same bytes.
        figure.savefig(path, format="png", metadata={"Software": None})
    finally:
        plt.close(figure)
