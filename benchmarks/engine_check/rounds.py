"""The `rounds` command's runs read back: per model depth and round, the overlay's and
Marlin's median tokens/s, and the rounds taken together."""

from __future__ import annotations

import collections
import re
import statistics
from typing import Any

ROUND_NAME = re.compile(
    r"(?P<engine>overlay-emulation|pristine-marlin)-L(?P<layers>\d+)-r(?P<round>\d+)"
)


def round_pairs(ok: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The `rounds` command's pairs, per model depth and round: each batch's median tokens/s
    of the overlay's run and of Marlin's run after it."""
    found: dict[tuple[int, int], dict[str, Any]] = {}
    for name, result in ok.items():
        m = ROUND_NAME.fullmatch(name)
        if m is None or "throughput" not in result:
            continue
        key = "overlay" if m["engine"] == "overlay-emulation" else "marlin"
        medians = {b: t["median"] for b, t in result["throughput"].items()}
        found.setdefault((int(m["layers"]), int(m["round"])), {})[key] = medians
    return [
        {"layers": layers, "round": i, **pair}
        for (layers, i), pair in sorted(found.items())
        if len(pair) == 2
    ]


def round_spread(pairs: list[dict[str, Any]]) -> dict[tuple[int, str], dict[str, dict[str, float]]]:
    """The rounds taken together, per model depth and engine ("overlay", "marlin"): each
    batch's median tokens/s over the rounds, the slowest and the fastest."""
    values: dict[tuple[int, str], dict[str, list[float]]] = {}
    for pair in pairs:
        for engine in ("overlay", "marlin"):
            for b, v in pair[engine].items():
                values.setdefault((pair["layers"], engine), {}).setdefault(b, []).append(v)
    return {
        key: {
            b: {"median": statistics.median(v), "worst": min(v), "best": max(v)}
            for b, v in row.items()
        }
        for key, row in values.items()
    }


def round_medians(pairs: list[dict[str, Any]]) -> list[tuple[list[str], dict[str, str]]]:
    """The rounds table's closing rows: per model depth with two rounds or more, each batch's
    medians over its rounds, and the range of the overlay / Marlin ratio over them."""
    rows = []
    spread = round_spread(pairs)
    for layers, count in sorted(collections.Counter(p["layers"] for p in pairs).items()):
        if count < 2:
            continue
        mine = [p for p in pairs if p["layers"] == layers]
        overlay, marlin = spread[(layers, "overlay")], spread[(layers, "marlin")]
        cells = {}
        for b in overlay.keys() & marlin.keys():
            ratios = [
                p["overlay"][b] / p["marlin"][b]
                for p in mine
                if b in p["overlay"].keys() & p["marlin"].keys()
            ]
            cells[b] = (
                f"{overlay[b]['median']:.0f} / {marlin[b]['median']:.0f}"
                f" ({min(ratios):.2f}x to {max(ratios):.2f}x)"
            )
        rows.append(([str(layers), f"median of {count}"], cells))
    return rows
