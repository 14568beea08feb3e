"""Per-patch states on real vLLM releases from PyPI and on a nightly-like git base."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_patchset.cli import main
from vllm_patchset.config import Project

FIX1 = "upstreamed/0001-nvfp4-oracle-take-the-E2M1-table-s-device-from-w13.patch"
FIX2 = "0001-triton_moe-no-tensor-truthiness-when-quantizing-defe.patch"
FUSED = "0002-nvfp4_emulation_moe-fused-NVFP4-GEMMs-over-the-route.patch"

# Fix 1 lived on nightlies only (fixed in 0.21.0: vLLM PR #41630); fix 2 shipped in 0.24.0
# and was fixed in 0.25.0 (PR #46735); 0.23.0 does not have fix 2's line at all. The fused
# kernel (0002) is written for 0.24.0: releases from 0.20.0 have the emulation it replaces, in
# other text (conflict); 0.25.0 rewrote that code with a kernel of its own: not "absent" (the
# code was there), a conflict whose verdict is "rewritten". (state, verdict) per patch:
RELEASE_STATES = [
    ("0.20.2", ("absent", "never-there"), ("absent", "never-there"), ("conflict", "conflict")),
    ("0.21.0", ("upstream", "upstream"), ("absent", "never-there"), ("conflict", "conflict")),
    ("0.23.0", ("upstream", "upstream"), ("absent", "never-there"), ("conflict", "conflict")),
    ("0.24.0", ("upstream", "upstream"), ("applies", "applies"), ("applies", "applies")),
    ("0.25.0", ("upstream", "upstream"), ("upstream", "upstream"), ("conflict", "rewritten")),
    ("0.33.0", ("upstream", "upstream"), ("upstream", "upstream"), ("conflict", "rewritten")),
]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(list(argv)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


def test_matrix_states_on_releases(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    versions = [v for v, *_ in RELEASE_STATES]
    # Given in any order, the columns come in PEP 440 order.
    doc = run_json(capsys, "--project", str(project.root), "matrix", *versions[::-1], "--json")
    assert list(doc["versions"]) == versions  # type: ignore[call-overload]
    assert doc["versions"] == {
        v: {FIX1: s1[0], FIX2: s2[0], FUSED: s3[0]} for v, s1, s2, s3 in RELEASE_STATES
    }
    details = doc["details"]
    assert isinstance(details, dict)
    assert {v: tuple(details[v][p]["verdict"] for p in (FIX1, FIX2, FUSED)) for v in versions} == {
        v: (s1[1], s2[1], s3[1]) for v, s1, s2, s3 in RELEASE_STATES
    }
    # Where the text and the trailers disagree, both are reported: a decision-changing warning.
    assert details["0.23.0"][FUSED]["warnings"] == []
    assert details["0.33.0"][FUSED]["warnings"] == [
        "text says absent, trailers say applies: the code it changes is gone (rewritten or"
        " removed upstream)"
    ]


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
    assert {h["offset"] for h in details["0.24.0"][FUSED]["hunks"]} == {0}


def test_matrix_on_nightly_like_base(
    project: Project, nightly_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = run_json(
        capsys,
        *("--project", str(project.root), "matrix", "--json"),
        *("--git", str(nightly_repo), "--ref", "nightly", "--ref", "v0.21.0"),
    )
    assert doc["versions"] == {
        "git:nightly": {FIX1: "applies", FIX2: "absent", FUSED: "conflict"},
        "git:v0.21.0": {FIX1: "upstream", FIX2: "absent", FUSED: "conflict"},
    }


def test_status_on_pin(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--project", str(project.root), "status", "--json")
    assert doc == {
        "ok": True,
        "command": "status",
        "exit_code": 0,
        "pin": "0.24.0",
        "patches": {FIX1: "upstream", FIX2: "applies", FUSED: "applies"},
        "disagreements": {FIX1: [], FIX2: [], FUSED: []},
        "parked": {},
        "lock": "fresh",
    }


def test_check_passes_on_pin(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--project", str(project.root), "check"]) == 0
    assert capsys.readouterr().out == "check: 3 patches, 0 problem(s)\n"
