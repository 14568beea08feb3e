"""A work area's results: which files are runs' results, the float64 reference's file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_check import results
from engine_results import REFERENCE


def test_load_results_skips_ranks_and_deploy_reports(tmp_path: Path) -> None:
    for name in ("pristine-x.json", "pristine-x.rank0.json", "deploy-apply.json", "overlay-y.json"):
        (tmp_path / name).write_text(json.dumps({"name": name}))
    assert sorted(results.load_results(tmp_path)) == ["overlay-y", "pristine-x"]


def test_load_results_skips_the_reference(tmp_path: Path) -> None:
    (tmp_path / "pristine-x.json").write_text("{}")
    (tmp_path / "reference-fp64-nvfp4-L2.json").write_text(json.dumps(REFERENCE))
    assert sorted(results.load_results(tmp_path)) == ["pristine-x"]
    assert results.load_references(tmp_path) == {"nvfp4-L2": REFERENCE}
    (tmp_path / "reference-fp64-nvfp4-L12.json").write_text(json.dumps({"w4a4": []}))
    assert results.load_references(tmp_path) == {"nvfp4-L12": {"w4a4": []}, "nvfp4-L2": REFERENCE}


MEASURED_CASES = [  # (a run's result, measured, its line)
    (
        {"name": "r", "finished": True, "startup_s": 40.0},
        True,
        "r: ok, start-up 40.0 s",
    ),
    (
        {
            "name": "r",
            "finished": True,
            "startup_s": 1.5,
            "throughput": {"1": {"median": 99.6}, "8": {"median": 700.2}},
        },
        True,
        "r: ok, start-up 1.5 s; bs1 100 tok/s, bs8 700 tok/s",
    ),
    (
        {"name": "r", "startup_error": "RuntimeError: no GPU", "capture_errors": ["x", "y"]},
        False,
        "r: FAILED (RuntimeError: no GPU); capture failed: x, y",
    ),
    ({"name": "r", "exit_code": -9}, False, "r: FAILED (exit code -9)"),
    (  # one rank of two did not finish: the run did not
        {"name": "r", "finished": True, "ranks": [{"finished": True}, {"exit_code": 1}]},
        False,
        "r: FAILED (exit code None)",
    ),
]


@pytest.mark.parametrize(("result", "ok", "line"), MEASURED_CASES)
def test_measured_and_summary_line(result: dict[str, Any], ok: bool, line: str) -> None:
    assert (results.measured(result), results.summary_line(result)) == (ok, line)
