"""A work area's results: which files are runs' results, the float64 reference's file."""

from __future__ import annotations

import json
from pathlib import Path

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
    assert results.load_reference(tmp_path) == REFERENCE
    assert results.load_reference(tmp_path, "nvfp4-L12") is None
