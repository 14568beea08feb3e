"""The report's figure: tokens/s per batch size of the phases' engines on one GPU and of the
rounds, the median with the slowest and the fastest (matplotlib, imported when drawn)."""

from __future__ import annotations

import collections
import textwrap
from pathlib import Path
from typing import Any

from .rounds import round_spread


def plot_rows(summary: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """The bars of the report's figure: the phases' engines on one GPU, then the rounds',
    per model depth (the median over the rounds, the slowest to the fastest)."""
    rows = {k: v for k, v in summary["throughput"].items() if "2 GPUs" not in k}
    counts = collections.Counter(r["layers"] for r in summary["rounds"])
    spread = round_spread(summary["rounds"])
    for layers in sorted(counts):
        for engine, name in (("overlay", "overlay"), ("marlin", "Marlin")):
            n = counts[layers]
            rows[f"{name}, {layers} layers ({n} round{'s' * (n > 1)})"] = spread[(layers, engine)]
    return rows


def figure_title(title: str) -> str:
    """The title on lines that fit the figure's width (one long line runs off its edges)."""
    return textwrap.fill(title, 88)


def plot(rows: dict[str, dict[str, dict[str, float]]], path: Path, title: str) -> None:
    """The PNG; a line instead where matplotlib is missing: the report's JSON and Markdown are
    written before it, and `report` on a host with matplotlib draws it from the same results."""
    try:
        import matplotlib
    except ImportError:
        print(f"no matplotlib here: {path} not written (run report where it is)")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({int(b) for row in rows.values() for b in row})
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(rows))
    for i, (label, row) in enumerate(rows.items()):
        xs = [j + i * width for j in range(len(batches))]
        cells = [row.get(str(b), {"median": 0.0, "worst": 0.0, "best": 0.0}) for b in batches]
        medians = [c["median"] for c in cells]
        spread = [[m - c["worst"] for m, c in zip(medians, cells, strict=True)],
                  [c["best"] - m for m, c in zip(medians, cells, strict=True)]]  # fmt: skip
        ax.bar(xs, medians, width, yerr=spread, capsize=2, label=label)
    ax.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(len(batches))])
    ax.set_xticklabels([f"batch {b}" for b in batches])
    ax.set_ylabel("tokens/s")
    ax.set_yscale("log")
    ax.set_title(figure_title(title), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
