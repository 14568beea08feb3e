"""A work area's results (WORK/results): each run's result file, the float64 reference's,
and whether a run measured what it had to, in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The float64 reference's file in WORK/results: REFERENCE_PREFIX + the checkpoint's folder name.
REFERENCE_PREFIX = "reference-fp64-"
REFERENCE_MODEL = "nvfp4-L2"


def load_results(folder: Path) -> dict[str, dict[str, Any]]:
    """Each run's result (not the per-rank files, the deploy reports, the float64 reference)."""
    return {
        p.stem: json.loads(p.read_text())
        for p in sorted(folder.glob("*.json"))
        if ".rank" not in p.stem and not p.stem.startswith(("deploy-", REFERENCE_PREFIX))
    }


def load_references(folder: Path) -> dict[str, dict[str, Any]]:
    """Every model's float64 reference in ``folder``, by the model's folder name."""
    return {
        p.stem.removeprefix(REFERENCE_PREFIX): json.loads(p.read_text())
        for p in sorted(folder.glob(f"{REFERENCE_PREFIX}*.json"))
    }


def recorded_gpus(results: dict[str, dict[str, Any]]) -> list[str]:
    """The GPUs the runs (each rank of them) recorded running on, sorted; none for results
    written before a run recorded it."""
    ranks = (r for result in results.values() for r in result.get("ranks", [result]))
    return sorted({r["gpu"] for r in ranks if r.get("gpu")})


def measured(result: dict[str, Any]) -> bool:
    """Every rank started and measured all it had to (its exit, after that, is not judged)."""
    ranks = result.get("ranks", [result])
    return all(r.get("finished") and "startup_error" not in r for r in ranks)


def summary_line(result: dict[str, Any]) -> str:
    """A run's outcome in one line: its start-up and speeds, or why it failed."""
    if not measured(result):
        what = result.get("startup_error") or f"exit code {result.get('exit_code')}"
        capture = (
            "; capture failed: " + ", ".join(result["capture_errors"])
            if result.get("capture_errors")
            else ""
        )
        return f"{result['name']}: FAILED ({str(what)[:200]}){capture}"
    speed = ", ".join(
        f"bs{b} {t['median']:.0f} tok/s" for b, t in result.get("throughput", {}).items()
    )
    return (
        f"{result['name']}: ok, start-up {result.get('startup_s')} s{'; ' + speed if speed else ''}"
    )
