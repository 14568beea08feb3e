"""Per-patch states on real vLLM releases from PyPI and on a nightly-like git base."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_patchset.cli import main
from vllm_patchset.config import Project

FIX1 = "upstreamed/0001-nvfp4-oracle-take-the-E2M1-table-s-device-from-w13.patch"
FIX2 = "0001-triton_moe-no-tensor-truthiness-when-quantizing-defe.patch"

# MISSION.md: fix 1 lived on nightlies only (fixed in 0.21.0); fix 2 shipped in 0.24.0 and
# was fixed in 0.25.0; 0.23.0 does not have fix 2's line at all.
RELEASE_STATES = [
    ("0.20.2", "absent", "absent"),
    ("0.21.0", "upstream", "absent"),
    ("0.23.0", "upstream", "absent"),
    ("0.24.0", "upstream", "applies"),
    ("0.25.0", "upstream", "upstream"),
    ("0.33.0", "upstream", "upstream"),
]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(list(argv)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


def test_matrix_states_on_releases(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    versions = [v for v, _, _ in RELEASE_STATES]
    doc = run_json(capsys, "--project", str(project.root), "matrix", *versions, "--json")
    assert doc["versions"] == {v: {FIX1: s1, FIX2: s2} for v, s1, s2 in RELEASE_STATES}


def test_matrix_reports_disagreements(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--project", str(project.root), "matrix", "0.25.0", "0.24.0", "--json")
    details = doc["details"]
    assert isinstance(details, dict)
    on_025 = details["0.25.0"][FIX2]
    assert on_025["text_state"] == "upstream"
    assert on_025["trailer_state"] == "upstream"
    # The backport's comments are its own: the code is upstream's, the comments differ.
    assert on_025["disagreements"] == [
        "hunk 1 (vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py): "
        "code present, surrounding text differs",
        "hunk 3 (vllm/model_executor/layers/fused_moe/experts/triton_moe.py): "
        "code matches upstream, comment lines differ",
    ]
    on_024 = details["0.24.0"][FIX2]
    assert on_024["disagreements"] == []
    assert [h["offset"] for h in on_024["hunks"]] == [0, 0, 0]


def test_matrix_on_nightly_like_base(
    project: Project, nightly_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = run_json(
        capsys,
        *("--project", str(project.root), "matrix", "--json"),
        *("--git", str(nightly_repo), "--ref", "nightly", "--ref", "v0.21.0"),
    )
    assert doc["versions"] == {
        "git:nightly": {FIX1: "applies", FIX2: "absent"},
        "git:v0.21.0": {FIX1: "upstream", FIX2: "absent"},
    }


def test_status_on_pin(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--project", str(project.root), "status", "--json")
    assert doc == {
        "pin": "0.24.0",
        "patches": {FIX1: "upstream", FIX2: "applies"},
        "disagreements": {FIX1: [], FIX2: []},
        "lock": "fresh",
    }


def test_check_passes_on_pin(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--project", str(project.root), "check"]) == 0
    assert capsys.readouterr().out == "check: 2 patches, 0 problem(s)\n"
