"""Today's real series on real vLLM releases from PyPI: every fact here changes when the series
changes (a patch added, refreshed, archived or parked), and this is the one module to update
then. The mechanics behind these facts are tested on synthetic upstreams elsewhere.

The series: fix 1 (archived in patches/upstreamed/: vLLM PR #41630, upstream since 0.21.0; it
lived on nightlies only, after PR #40033), fix 2 (0001, a backport of PR #46735: 0.24.0 shipped
the bug of PR #46254, 0.25.0 has the fix; 0.23.0 does not have the line at all) and the fused
NVFP4 emulation kernel (0002, local, written for 0.24.0: releases from 0.20.0 have the
emulation it replaces in other text, a conflict; 0.25.0 rewrote that code with a kernel of its
own, a conflict whose verdict is "rewritten"). From the pin, every rebase onto 0.25.0 or later
stops for a decision on 0002 before it writes anything.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from support import (
    NIGHTLY_LINE_BUGGY,
    NIGHTLY_LINE_FIXED,
    ORACLE,
    cli,
    committed,
    export_committed,
    git,
    rebase_json,
)
from vllm_patchset.cli import main
from vllm_patchset.gpu.validate import NEW_PATH_TESTS, build_trees
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.hashes import sha256_file
from vllm_patchset.overlay.build import build_overlay, patches_for
from vllm_patchset.overlay.lock import Lock
from vllm_patchset.overlay.upstream import Mirror
from vllm_patchset.series.classify import classify
from vllm_patchset.series.patches import parse_patch_bytes
from vllm_patchset.sync.rebase_rules import options
from vllm_patchset.sync.rebase_state import Choice, Section

FIX1 = "0001-nvfp4-oracle-take-the-E2M1-table-s-device-from-w13.patch"
FIX2 = "0001-triton_moe-no-tensor-truthiness-when-quantizing-defe.patch"
NVFP4 = "0002-nvfp4_emulation_moe-fused-NVFP4-GEMMs-over-the-route.patch"
ARCHIVED_FIX1 = f"upstreamed/{FIX1}"
TRITON = "vllm/model_executor/layers/fused_moe/experts/triton_moe.py"
EMULATION = "vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py"
# Files 0002 adds beside it: its kernels' module, the H200's tile table and the H200's and
# H100's tables of the shapes (experts held, hidden, intermediate) tuned on their own.
KERNELS = "vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_kernels.py"
H200_TABLE = (
    "vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe_tiles.NVIDIA_H200.json"
)


def shape_tables(device: str, *sizes: tuple[int, int, int]) -> tuple[str, ...]:
    """The table files of shapes (experts held, hidden, intermediate) on a device."""
    experts = "vllm/model_executor/layers/fused_moe/experts"
    return tuple(
        f"{experts}/nvfp4_emulation_moe_tiles.E{e}_H{h}_I{i}.{device}.json" for e, h, i in sizes
    )


H200_SHAPE_TABLES = shape_tables(
    "NVIDIA_H200",
    (128, 2048, 96),  # Qwen3-30B-A3B TP8
    (128, 2048, 192),  # Qwen3-30B-A3B TP4
    (128, 2048, 384),  # Qwen3-30B-A3B TP2
    (128, 2048, 768),  # Qwen3-30B-A3B
    (128, 2688, 464),  # Nemotron-3-Nano-30B-A3B TP4
    (128, 2688, 928),  # Nemotron-3-Nano-30B-A3B TP2
    (128, 2688, 1856),  # Nemotron-3-Nano-30B-A3B
    (128, 2816, 176),  # Gemma-4-26B-A4B TP4
    (128, 2816, 352),  # Gemma-4-26B-A4B TP2
    (128, 2816, 704),  # Gemma-4-26B-A4B
    (128, 4096, 192),  # Qwen3-235B-A22B TP8
    (128, 4096, 1536),  # Qwen3-235B-A22B (its predecode entry)
    (128, 4096, 384),  # Qwen3-235B-A22B TP4
    (128, 5120, 1024),  # Llama-4-Maverick TP8
    (128, 5120, 2048),  # Llama-4-Maverick TP4
    (128, 5120, 4096),  # Llama-4-Maverick TP2
    (128, 5120, 8192),  # Llama-4-Maverick
    (16, 5120, 1024),  # Llama-4-Scout TP8
    (16, 5120, 2048),  # Llama-4-Scout TP4
    (16, 5120, 4096),  # Llama-4-Scout TP2
    (16, 5120, 8192),  # Llama-4-Scout
    (256, 2048, 64),  # Qwen3.6-35B-A3B TP8
    (256, 2048, 128),  # Qwen3.6-35B-A3B TP4
    (256, 2048, 256),  # Qwen3.6-35B-A3B TP2
    (256, 2048, 512),  # Qwen3.6-35B-A3B
    (256, 3072, 192),  # MiniMax-M2.5 TP8
    (256, 3072, 384),  # MiniMax-M2.5 TP4
    (256, 3072, 768),  # MiniMax-M2.5 TP2
    (256, 6144, 256),  # GLM-5 TP8
    (256, 6144, 512),  # GLM-5 TP4
    (256, 6144, 1024),  # GLM-5 TP2
    (256, 7168, 256),  # DeepSeek-R1 TP8
    (256, 7168, 512),  # DeepSeek-R1 TP4
    (256, 7168, 1024),  # DeepSeek-R1 TP2
    (32, 7168, 2048),  # DeepSeek-R1 EP8 rank (32 of 256 experts)
    (384, 7168, 1024),  # Kimi-K2 TP2
    (384, 7168, 2048),  # Kimi-K2
    (384, 7168, 256),  # Kimi-K2 TP8
    (384, 7168, 512),  # Kimi-K2 TP4
    (48, 7168, 2048),  # Kimi-K2 EP8 rank (48 of 384 experts)
    (512, 4096, 1024),  # Qwen3.5-397B-A17B
    (512, 4096, 128),  # Qwen3.5-397B-A17B TP8
    (512, 4096, 256),  # Qwen3.5-397B-A17B TP4
    (512, 4096, 512),  # Qwen3.5-397B-A17B TP2
    (64, 4096, 1024),  # Qwen3.5-397B-A17B EP8 rank (64 of 512 experts)
)
# The H100's tables, one for every shape of moe_setup.SHAPES: the shapes tuned on it, and the H200's
# tables (whole, or in the buckets noted) found faster there.
H100_SHAPE_TABLES = shape_tables(
    "NVIDIA_H100_80GB_HBM3",
    (128, 2048, 96),  # Qwen3-30B-A3B TP8
    (128, 2048, 192),  # Qwen3-30B-A3B TP4 (1-token bucket)
    (128, 2048, 384),  # Qwen3-30B-A3B TP2
    (128, 2048, 768),  # Qwen3-30B-A3B
    (128, 2688, 464),  # Nemotron-3-Nano-30B-A3B TP4 (1-token bucket)
    (128, 2688, 928),  # Nemotron-3-Nano-30B-A3B TP2 (tuned at 32 tokens)
    (128, 2688, 1856),  # Nemotron-3-Nano-30B-A3B (tuned at 1 token)
    (128, 2816, 176),  # Gemma-4-26B-A4B TP4 (1- and 512-token buckets)
    (128, 2816, 352),  # Gemma-4-26B-A4B TP2 (1- and 512-token buckets)
    (128, 2816, 704),  # Gemma-4-26B-A4B (tuned at 1 token)
    (128, 4096, 192),  # Qwen3-235B-A22B TP8
    (128, 4096, 384),  # Qwen3-235B-A22B TP4 (1-token bucket)
    (128, 4096, 768),  # Qwen3-235B-A22B TP2 (tuned at 32 tokens)
    (128, 4096, 1536),  # Qwen3-235B-A22B (tuned at 1 token)
    (128, 5120, 1024),  # Llama-4-Maverick TP8
    (128, 5120, 2048),  # Llama-4-Maverick TP4
    (128, 5120, 4096),  # Llama-4-Maverick TP2
    (128, 5120, 8192),  # Llama-4-Maverick
    (16, 5120, 1024),  # Llama-4-Scout TP8 (1-token bucket)
    (16, 5120, 2048),  # Llama-4-Scout TP4
    (16, 5120, 4096),  # Llama-4-Scout TP2
    (16, 5120, 8192),  # Llama-4-Scout (1-token bucket)
    (256, 2048, 64),  # Qwen3.6-35B-A3B TP8 (1-, 128-, 256- and 512-token buckets)
    (256, 2048, 128),  # Qwen3.6-35B-A3B TP4 (1-token bucket)
    (256, 2048, 256),  # Qwen3.6-35B-A3B TP2
    (256, 2048, 512),  # Qwen3.6-35B-A3B
    (256, 3072, 192),  # MiniMax-M2.5 TP8 (1-token bucket)
    (256, 3072, 384),  # MiniMax-M2.5 TP4
    (256, 3072, 768),  # MiniMax-M2.5 TP2
    (256, 3072, 1536),  # MiniMax-M2.5 (tuned at 1 token)
    (256, 6144, 256),  # GLM-5 TP8 (1-token bucket)
    (256, 6144, 512),  # GLM-5 TP4
    (256, 6144, 1024),  # GLM-5 TP2
    (256, 6144, 2048),  # GLM-5 (tuned at 1 token)
    (256, 7168, 256),  # DeepSeek-R1 TP8
    (256, 7168, 512),  # DeepSeek-R1 TP4
    (256, 7168, 1024),  # DeepSeek-R1 TP2
    (256, 7168, 2048),  # DeepSeek-R1 (tuned at 1 token)
    (32, 7168, 2048),  # DeepSeek-R1 EP8 rank (32 of 256 experts)
    (384, 7168, 256),  # Kimi-K2 TP8
    (384, 7168, 512),  # Kimi-K2 TP4
    (384, 7168, 1024),  # Kimi-K2 TP2
    (384, 7168, 2048),  # Kimi-K2 (512-token bucket)
    (48, 7168, 2048),  # Kimi-K2 EP8 rank (48 of 384 experts)
    (512, 4096, 128),  # Qwen3.5-397B-A17B TP8
    (512, 4096, 256),  # Qwen3.5-397B-A17B TP4
    (512, 4096, 512),  # Qwen3.5-397B-A17B TP2
    (512, 4096, 1024),  # Qwen3.5-397B-A17B
    (64, 4096, 1024),  # Qwen3.5-397B-A17B EP8 rank (64 of 512 experts)
)
TOUCHED_BY = {
    EMULATION: (FIX2, NVFP4),
    TRITON: (FIX2,),
    KERNELS: (NVFP4,),
    H200_TABLE: (NVFP4,),
    **{table: (NVFP4,) for table in (*H200_SHAPE_TABLES, *H100_SHAPE_TABLES)},
}
GPU_FIX1 = "tests/gpu/test_fix1_e2m1_device.py::test_emulation_convert_without_weight_attr_then_graph_capture"
GPU_FIX2 = (
    "tests/gpu/test_fix2_deferred_quant_capture.py::test_deferred_fp8_static_scale_graph_capture"
)

# (state, verdict) per patch (fix 1, fix 2, 0002) on each release:
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


# -- states ----------------------------------------------------------------------------------------
def test_states_on_the_releases(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    versions = [v for v, *_ in RELEASE_STATES]
    doc = run_json(capsys, "--project", str(project.root), "matrix", *versions, "--json")
    assert doc["versions"] == {
        v: {ARCHIVED_FIX1: s1[0], FIX2: s2[0], NVFP4: s3[0]} for v, s1, s2, s3 in RELEASE_STATES
    }
    details = doc["details"]
    assert isinstance(details, dict)
    patches = (ARCHIVED_FIX1, FIX2, NVFP4)
    assert {v: tuple(details[v][p]["verdict"] for p in patches) for v in versions} == {
        v: (s1[1], s2[1], s3[1]) for v, s1, s2, s3 in RELEASE_STATES
    }
    # Where the text and the trailers disagree, both are reported: a decision-changing warning.
    assert details["0.23.0"][NVFP4]["warnings"] == []
    assert details["0.33.0"][NVFP4]["warnings"] == [
        "text says absent, trailers say applies: the code it changes is gone (rewritten or"
        " removed upstream)"
    ]
    on_025 = details["0.25.0"][FIX2]
    assert (on_025["text_state"], on_025["trailer_state"]) == ("upstream", "upstream")
    # The backport's comments are its own: the code is upstream's, the comments differ.
    assert on_025["disagreements"] == [
        f"hunk 1 ({EMULATION}): code present, surrounding text differs",
        f"hunk 3 ({TRITON}): code matches upstream, comment lines differ",
    ]
    on_024 = details["0.24.0"][FIX2]
    assert on_024["disagreements"] == []
    assert [h["offset"] for h in on_024["hunks"]] == [0, 0, 0]
    assert {h["offset"] for h in details["0.24.0"][NVFP4]["hunks"]} == {0}


def test_the_matrix_of_the_issue_fits_80_columns(
    project: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`COLUMNS=80 vllm-patchset matrix 0.21.0 0.24.0 0.25.0 0.33.0`: the archived fix's
    legend line took 82 columns (`U0001  patches/upstreamed/<its 72 characters>`)."""
    monkeypatch.setenv("COLUMNS", "80")
    assert (
        main(["--project", str(project.root), "matrix", "0.21.0", "0.24.0", "0.25.0", "0.33.0"])
        == 0
    )
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if len(line) > 80] == []
    assert f"U0001  {ARCHIVED_FIX1}" in out.splitlines()


def test_states_on_a_nightly_like_base(
    project: Project, nightly_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = run_json(
        capsys,
        *("--project", str(project.root), "matrix", "--json"),
        *("--git", str(nightly_repo), "--ref", "nightly", "--ref", "v0.21.0"),
    )
    # A ref with no release version is classified against the pin, as a rebase onto it
    # would: fix 2 applied on the pin and its code is not there, a stop (`rewritten`), where a
    # ref named like a release has the trailers to say "never there".
    assert doc["versions"] == {
        "git:nightly": {ARCHIVED_FIX1: "applies", FIX2: "conflict", NVFP4: "conflict"},
        "git:v0.21.0": {ARCHIVED_FIX1: "upstream", FIX2: "absent", NVFP4: "conflict"},
    }
    details = doc["details"]
    assert isinstance(details, dict)
    assert details["git:nightly"][FIX2]["verdict"] == "rewritten"
    assert details["git:v0.21.0"][FIX2]["verdict"] == "never-there"


def test_status_and_check_on_the_pin(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--project", str(project.root), "status", "--json")
    assert doc == {
        "ok": True,
        "command": "status",
        "exit_code": 0,
        "pin": "0.24.0",
        "patches": {ARCHIVED_FIX1: "upstream", FIX2: "applies", NVFP4: "applies"},
        "warnings": {ARCHIVED_FIX1: [], FIX2: [], NVFP4: []},
        "disagreements": {ARCHIVED_FIX1: [], FIX2: [], NVFP4: []},
        "parked": {},
        "lock": "fresh",
    }
    assert main(["--project", str(project.root), "check"]) == 0
    assert capsys.readouterr().out == "check: 3 patches, 0 problem(s)\n"


# -- the overlay and its lock ----------------------------------------------------------------------
def overlay_files(root: Path) -> dict[str, bytes]:
    base = root / "overlay"
    return {
        str(p.relative_to(base)): p.read_bytes()
        for p in sorted(base.rglob("*"))
        if p.is_file() and p.name != "overlay.lock.json"
    }


def test_overlay_matches_the_committed_lock(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--project", str(project.root), "overlay", "build"]) == 0
    files = overlay_files(project.root)
    assert sorted(files) == sorted(
        [KERNELS, EMULATION, H200_TABLE, *H200_SHAPE_TABLES, *H100_SHAPE_TABLES, TRITON]
    )
    lock = Lock.load(project.lock_path)
    assert project.lock_path.read_bytes() == committed("overlay/overlay.lock.json")
    assert (lock.version, lock.patches) == ("0.24.0", (FIX2, NVFP4))
    for entry in lock.entries:
        assert sha256_file(project.overlay_dir / entry.path) == entry.patched_sha256
        assert entry.patches == TOUCHED_BY[entry.path]
    text = files[TRITON].decode()
    assert "                self.a1_scale,\n" in text
    assert "self.a1_scale or self.a1_gscale" not in text
    assert "    def a1_scale(self) -> torch.Tensor:\n" in files[EMULATION].decode()
    # Rebuilding gives byte-identical files.
    assert main(["--project", str(project.root), "overlay", "build"]) == 0
    assert overlay_files(project.root) == files
    capsys.readouterr()


def test_overlay_for_a_nightly_like_base(
    project: Project, nightly_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = project.root / "nightly-overlay"
    argv = ["--project", str(project.root), "overlay", "build", "--out", str(out)]
    # The fused kernel (0002) is written for 0.24.0 and conflicts with this older base.
    assert main([*argv, "--git", str(nightly_repo), "--ref", "nightly"]) == 1
    assert capsys.readouterr().err == (
        f"vllm-patchset: {NVFP4} does not apply to git:nightly: hunk 3 ({EMULATION} @@ -20 +33 @@)"
        f" differs at line 20 (leave it out with --skip {NVFP4})\n"
    )
    assert not out.exists()
    assert main([*argv, "--git", str(nightly_repo), "--ref", "nightly", "--skip", NVFP4]) == 0
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == [".vllm-patchset-owned", "overlay.lock.json", ORACLE]
    text = (out / ORACLE).read_text()
    assert NIGHTLY_LINE_FIXED in text
    assert "layer.weight.device" not in text
    lock = Lock.load(out / "overlay.lock.json")
    assert (lock.version, lock.patches) == ("git:nightly", (ARCHIVED_FIX1,))
    assert not (project.overlay_dir / "vllm").exists()  # the pin's overlay: untouched
    capsys.readouterr()


def test_queue_round_trip_of_the_real_series(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p: p.read_bytes() for p in sorted(project.patches_dir.rglob("*")) if p.is_file()}
    root = str(project.root)
    assert main(["--project", root, "queue", "import"]) == 0
    log = git(project.root / ".queue", "log", "--format=%s", "refs/vllm-patchset/base..HEAD")
    assert log == (
        "nvfp4_emulation_moe: fused NVFP4 GEMMs over the routed experts only\n"
        "triton_moe: no tensor truthiness when quantizing deferred inputs\n"
    )
    assert main(["--project", root, "queue", "export", "--drop"]) == 0
    after = {p: p.read_bytes() for p in sorted(project.patches_dir.rglob("*")) if p.is_file()}
    assert after == before
    capsys.readouterr()


# -- GPU validation's trees ------------------------------------------------------------------------
def test_reversed_fix1_on_0_21_0_is_the_nightly_bug(mirror: Mirror, project: Project) -> None:
    (fix1,) = (p for p in patches_for(project) if p.key == ARCHIVED_FIX1)
    release = mirror.release("0.21.0")
    pristine = mirror.repo.tree_of(release.commit)
    buggy = mirror.repo.apply_to_tree(pristine, fix1.raw, reverse=True)
    text = mirror.repo.read_blob(buggy, ORACLE)
    assert text is not None
    assert text.decode().count(NIGHTLY_LINE_BUGGY) == 1
    assert NIGHTLY_LINE_FIXED not in text.decode()
    # Re-applying the fix gives back v0.21.0 exactly.
    assert mirror.repo.apply_to_tree(buggy, fix1.raw) == pristine


def test_validation_trees_and_expectations(project: Project, tmp_path: Path) -> None:
    export_committed(["tests/gpu"], project.root)
    built = build_trees(project, tmp_path / "gpu")
    specs = {s.name: s for s in built.specs}
    assert list(specs) == [
        "pristine-0.24.0",
        "overlay-0.24.0",
        "buggy-0001-0.21.0",
        "fixed-0001-0.21.0",
    ]
    expect = {name: {e.test: e.expect for e in s.expectations} for name, s in specs.items()}
    assert expect["pristine-0.24.0"][GPU_FIX1] == "green"  # upstream since 0.21.0
    assert expect["pristine-0.24.0"][GPU_FIX2] == "red"
    assert expect["overlay-0.24.0"][GPU_FIX2] == "green"
    why = {name: {e.test: e.why for e in s.expectations} for name, s in specs.items()}
    # The overlay carries fix 1 as the pin's own code (upstream since 0.21.0), not as a patch.
    assert why["overlay-0.24.0"][GPU_FIX1] == f"upstreamed/{FIX1}: upstream on 0.24.0"
    assert why["overlay-0.24.0"][GPU_FIX2] == f"{FIX2} applied"
    # Tests of patch 0002's new path, named by validate's table (no trailer names them); their
    # reasons name patch 0002, whose module holds that path (they named patch 0001, the first
    # patch touching nvfp4_emulation_moe.py).
    for test, _, reason in NEW_PATH_TESTS:
        assert (expect["pristine-0.24.0"][test], expect["overlay-0.24.0"][test]) == ("red", "green")
        assert why["pristine-0.24.0"][test] == f"{NVFP4}: {reason}"
        assert why["overlay-0.24.0"][test] == f"{NVFP4} applied"
    assert expect["buggy-0001-0.21.0"] == {GPU_FIX1: "red"}
    assert expect["fixed-0001-0.21.0"] == {GPU_FIX1: "green"}
    oracle = {name: (built.root / "trees" / name / ORACLE).read_text() for name in specs}
    assert NIGHTLY_LINE_BUGGY in oracle["buggy-0001-0.21.0"]
    assert NIGHTLY_LINE_FIXED in oracle["fixed-0001-0.21.0"]
    info = json.loads((built.root / "trees/overlay-0.24.0/vllm-patchset-tree.json").read_text())
    assert info["patches"] == [FIX2, NVFP4]


# -- the rebase --------------------------------------------------------------------------------------
EPOCH = "1782518400"  # SOURCE_DATE_EPOCH: 2026-06-27
DATE = "2026-06-27"
PR_41630 = "[#41630](https://github.com/vllm-project/vllm/pull/41630)"
PR_46735 = "[#46735](https://github.com/vllm-project/vllm/pull/46735)"
HEADER = (
    "# Changelog\n\n"
    "All notable changes to this patch set are documented in this file.\n"
    "The format is based on [Keep a Changelog](https://keepachangelog.com/en/1.1.0/).\n\n"
    "## [Unreleased]\n\n"
)
ENTRY_0_24_0 = f"""## [vllm-0.24.0] - {DATE}

Rebased onto vLLM 0.24.0 (from git:nightly) by `vllm-patchset rebase`.

### Changed

- Pin: vLLM git:nightly -> 0.24.0.
- Still carried: none.

### Removed

- Dropped as upstream: `{FIX1}`, merged in vLLM 0.21.0 by {PR_41630}; archived in `patches/upstreamed/`.
"""
PARKED_LINE = "- Parked `{name}` (--keep): conflict (rewritten) on vLLM {v}; kept in `patches/parked/`, not applied."
DROPPED_LINE = "- Dropped `{name}` (--drop): conflict (rewritten) on vLLM {v}."


def entry(new: str, old: str, rule: str, *, fix2: bool = True, images: bool = True) -> str:
    """The CHANGELOG section of a rebase from the pin's series (fix 2 archived there, 0002
    parked or dropped)."""
    changed = f"- Pin: vLLM {old} -> {new}" + (
        f" (`vllm=={new}`, GPU validation images `v{new}`)." if images else "."
    )
    lines = [
        f"## [vllm-{new}] - {DATE}",
        "",
        f"Rebased onto vLLM {new} (from {old}) by `vllm-patchset rebase`.",
        "",
        "### Changed",
        "",
        changed,
    ]
    if rule == "--keep":
        lines.append(PARKED_LINE.format(name=NVFP4, v=new))
    lines.append("- Still carried: none.")
    removed = []
    if fix2:
        removed.append(
            f"- Dropped as upstream: `{FIX2}`, merged in vLLM 0.25.0 by {PR_46735}; archived in `patches/upstreamed/`."
        )
    if rule == "--drop":
        removed.append(DROPPED_LINE.format(name=NVFP4, v=new))
    if removed:
        lines += ["", "### Removed", "", *removed]
    return "\n".join(lines) + "\n"


def parked_series(old: str, new: str) -> str:
    return f"{NVFP4}  # kept by `rebase` {old} -> {new} on {DATE}: conflict (rewritten) there\n"


# -- helpers -------------------------------------------------------------------------------------
def sha256s(root: Path) -> dict[str, str]:
    """Every file of the checkout (git's own and the rebase's state dirs aside)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] not in (".git", ".rebase")
    }


def commit_all(root: Path, message: str) -> None:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)


def check(capsys: pytest.CaptureFixture[str], root: Path, patches: int) -> None:
    """`check` passes: what every finished rebase must leave."""
    assert cli(capsys, root, "check") == (0, f"check: {patches} patches, 0 problem(s)\n", "")
    assert not (root / ".rebase").exists()


@pytest.fixture(autouse=True)
def _fixed_date(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)


@pytest.fixture
def pinned(project: Project) -> Project:
    """The project as it is (pin 0.24.0), with its .gitignore and no CHANGELOG yet."""
    (project.root / ".gitignore").write_bytes(committed(".gitignore"))
    (project.root / "CHANGELOG.md").unlink(missing_ok=True)
    commit_all(project.root, "gitignore, no changelog")
    return project


def expect_decision_on_0002(capsys: pytest.CaptureFixture[str], root: Path, version: str) -> None:
    """The rebase onto `version` stops before it writes anything: 0002 needs a decision."""
    before = sha256s(root)
    doc = rebase_json(capsys, root, "--onto", version, code=1)
    assert (doc["status"], doc["started"]) == ("stopped", False)
    assert doc["decisions"] == [
        {
            "patch": NVFP4,
            "state": "conflict",
            "verdict": "rewritten",
            "options": ["--keep 0002", "--drop 0002", "--resolve-upstream 0002"],
            "means": [
                "park it in patches/parked/ (kept, not applied; port it later)",
                "remove it",
                "archive it in patches/upstreamed/ as fixed upstream (its regression test keeps"
                " guarding)",
            ],
        }
    ]
    assert sha256s(root) == before
    assert not (root / ".rebase").exists()


def test_rebase_chain_nightly_to_0_24_0_to_0_25_0_to_0_33_0(
    pinned: Project, nightly_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The series as it grew: fix 1 on a nightly pin, archived on 0.24.0; fix 2 and 0002
    joined there; 0.25.0 merged fix 2 and rewrote what 0002 replaces (parked, `--keep`);
    0.33.0 needs no decision. (`--drop` on the real series: test_rebase_pin_to_0_33_0.)"""
    root = pinned.root
    real = {name: committed(f"patches/{name}") for name in (FIX2, NVFP4)}
    real_fix1 = committed(f"patches/upstreamed/{FIX1}")
    real_pyproject = (root / "pyproject.toml").read_bytes()
    real_ci = {
        path: (root / path).read_text()
        for path in (".github/workflows/gpu-validation.yml", ".buildkite/gpu-validation.yml")
    }
    # On the nightly pin, fix 1 is carried and pending (Applied-upstream empty); no fix 2, no
    # NVFP4 kernel (both written for 0.24.0).
    pending_fix1 = real_fix1.replace(b"\nApplied-upstream: 0.21.0\n", b"\nApplied-upstream:\n")
    assert pending_fix1 != real_fix1
    patches = root / "patches"
    (patches / FIX2).unlink()
    (patches / NVFP4).unlink()
    (patches / "upstreamed" / FIX1).unlink()
    (patches / FIX1).write_bytes(pending_fix1)
    (patches / "series").write_text(f"{FIX1}\n")
    (patches / "upstreamed" / "series").write_text("")
    pyproject = real_pyproject.decode()
    assert pyproject.count('pin = "0.24.0"\n') == 1
    (root / "pyproject.toml").write_text(
        pyproject.replace(
            'pin = "0.24.0"\n',
            f'pin = "git:nightly"\npin-git = "{nightly_repo}"\npin-ref = "nightly"\n',
        )
    )
    build_overlay(Project.load(root, pinned.cache_dir), update_lock=True)
    assert Lock.load(pinned.lock_path).patches == (FIX1,)
    commit_all(root, "nightly pin")

    # 1. nightly -> 0.24.0: fix 1 is upstream (first release with it: 0.21.0), archived.
    doc = rebase_json(capsys, root, "--onto", "0.24.0")
    assert (doc["versions"], doc["status"], doc["pin"]) == (
        {"0.24.0": {FIX1: "upstream"}},
        "done",
        "0.24.0",
    )
    fix1 = doc["patches"][FIX1]  # type: ignore[index]
    assert (fix1["action"], fix1["applied_upstream"], fix1["three_way"]) == (
        "archived",
        "0.21.0",
        "no change",
    )
    assert doc["changelog"] == ENTRY_0_24_0
    assert (patches / "upstreamed" / FIX1).read_bytes() == real_fix1
    assert not (patches / FIX1).exists()
    assert (patches / "series").read_text() == ""
    assert (patches / "upstreamed" / "series").read_text() == f"{FIX1}\n"
    assert (root / "pyproject.toml").read_bytes() == real_pyproject
    assert {path: (root / path).read_text() for path in real_ci} == real_ci
    assert (root / "CHANGELOG.md").read_text() == HEADER + ENTRY_0_24_0
    assert Lock.load(pinned.lock_path).patches == ()
    check(capsys, root, 1)
    commit_all(root, "rebase onto 0.24.0")

    # The edit loop: fix 2, then the NVFP4 kernel on top of it, join as commits in the queue,
    # exported to patches/: the project as it is.
    assert cli(capsys, root, "queue", "import")[0] == 0
    for name in (FIX2, NVFP4):
        (root.parent / name).write_bytes(committed(f"patches/{name}"))
    git(root / ".queue", "am", "-q", str(root.parent / FIX2), str(root.parent / NVFP4))
    assert cli(capsys, root, "queue", "export", "--drop")[0] == 0
    assert cli(capsys, root, "overlay", "build", "--update-lock")[0] == 0
    assert {n: (patches / n).read_bytes() for n in real} == real
    assert pinned.lock_path.read_bytes() == committed("overlay/overlay.lock.json")
    check(capsys, root, 3)
    commit_all(root, "fix 2, NVFP4 kernel")

    # 2. 0.24.0 -> 0.25.0: fix 2 is upstream (trailer 0.25.0 kept), archived byte-identical;
    # 0.25.0 rewrote the emulation 0002 replaces: a stop for a decision, then the decision.
    expect_decision_on_0002(capsys, root, "0.25.0")
    doc = rebase_json(capsys, root, "--onto", "0.25.0", "--keep", "0002")
    assert doc["versions"] == {
        "0.25.0": {f"upstreamed/{FIX1}": "upstream", FIX2: "upstream", NVFP4: "conflict"}
    }
    # Every patch archived or parked: the overlay is empty, said so; every file changed named.
    assert doc["overlay_empty"] is True
    assert doc["changed_files"] == [
        "D patches/0001-triton_moe-no-tensor-truthiness-when-quantizing-defe.patch",
        f"D patches/{NVFP4}",
        f"A patches/parked/{NVFP4}",
        "A patches/parked/series",
        "M patches/series",
        f"A patches/upstreamed/{FIX2}",
        "M patches/upstreamed/series",
        "M pyproject.toml",
        "M overlay/overlay.lock.json",
        "M CHANGELOG.md",
        "M .github/workflows/gpu-validation.yml",
        "M .buildkite/gpu-validation.yml",
    ]
    fix2 = doc["patches"][FIX2]  # type: ignore[index]
    assert (fix2["action"], fix2["applied_upstream"], fix2["verdict"]) == (
        "archived",
        "0.25.0",
        "upstream",
    )
    assert fix2["notes"] == ["Applied-upstream: 0.25.0 (trailer kept)"]
    assert fix2["warnings"] == []
    assert fix2["disagreements"] == [
        "hunk 1 (vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py):"
        " code present, surrounding text differs",
        "hunk 3 (vllm/model_executor/layers/fused_moe/experts/triton_moe.py):"
        " code matches upstream, comment lines differ",
        "3-way merge: conflict (the release's code differs from the patch's)",
    ]
    nvfp4 = doc["patches"][NVFP4]  # type: ignore[index]
    assert (nvfp4["verdict"], nvfp4["action"], nvfp4["decision"], nvfp4["trailer_state"]) == (
        "rewritten",
        "parked",
        "keep",
        "applies",
    )
    assert doc["warnings"] == [
        f"{NVFP4}: it applied on the old pin; the code it changes is gone from 0.25.0"
        " (rewritten or removed upstream)"
    ]
    assert doc["changelog"] == entry("0.25.0", "0.24.0", "--keep")
    assert (patches / "upstreamed" / FIX2).read_bytes() == real[FIX2]
    assert (patches / "upstreamed" / FIX1).read_bytes() == real_fix1
    assert (patches / "upstreamed" / "series").read_text() == f"{FIX1}\n{FIX2}\n"
    assert (patches / "series").read_text() == ""
    assert sorted(p.relative_to(patches).as_posix() for p in patches.rglob("*.patch")) == [
        f"parked/{NVFP4}",
        f"upstreamed/{FIX1}",
        f"upstreamed/{FIX2}",
    ]
    assert (patches / "parked" / NVFP4).read_bytes() == real[NVFP4]
    assert (patches / "parked" / "series").read_text() == parked_series("0.24.0", "0.25.0")
    assert (root / "CHANGELOG.md").read_text() == (
        HEADER + entry("0.25.0", "0.24.0", "--keep") + "\n" + ENTRY_0_24_0
    )
    assert '"vllm==0.25.0"' in (root / "pyproject.toml").read_text()
    # The torch comment follows the pin, from 0.25.0's own requirements/cuda.txt.
    assert "(0.25.0: torch 2.11.0)" in (root / "pyproject.toml").read_text()
    for path, text in real_ci.items():
        assert (root / path).read_text() == text.replace("0.24.0", "0.25.0")
    lock = Lock.load(pinned.lock_path)
    assert (lock.version, lock.patches, lock.entries) == ("0.25.0", (), ())
    check(capsys, root, 3)
    commit_all(root, "rebase onto 0.25.0")

    # 3. 0.25.0 -> 0.33.0: no decision left to make; the archive keeps guarding, a parked
    # kernel stays parked (its reason kept).
    code, out, err = cli(capsys, root, "rebase", "--onto", "0.33.0")
    assert (code, err) == (0, "")
    width = len(f"upstreamed/{FIX2}")
    assert out == "\n".join(
        [
            "rebase 0.25.0 -> 0.33.0: done",
            f"  {f'upstreamed/{FIX1}'.ljust(width)}  upstream  stays in patches/upstreamed/",
            f"  {f'upstreamed/{FIX2}'.ljust(width)}  upstream  stays in patches/upstreamed/",
            f"  {f'parked/{NVFP4}'.ljust(width)}  conflict  stays in patches/parked/",
            f"WARNING: parked/{NVFP4}: text says absent, trailers say applies: the code it"
            " changes is gone (rewritten or removed upstream)",
            "3 cosmetic note(s) on upstreamed code (--verbose shows them)",
            "pin: vllm 0.33.0 (was 0.25.0); patches/, overlay/overlay.lock.json and CHANGELOG.md"
            " rewritten, `check` passes; review and commit them",
            "changed: 5 file(s)",
            "  M pyproject.toml",
            "  M overlay/overlay.lock.json",
            "  M CHANGELOG.md",
            "  M .github/workflows/gpu-validation.yml",
            "  M .buildkite/gpu-validation.yml",
            "WARNING: the overlay is empty: no patch of the series applies on 0.33.0"
            " (`overlay apply` changes nothing)",
            "",
            entry("0.33.0", "0.25.0", "", fix2=False),
        ]
    )
    assert (root / "CHANGELOG.md").read_text() == (
        HEADER
        + entry("0.33.0", "0.25.0", "", fix2=False)
        + "\n"
        + entry("0.25.0", "0.24.0", "--keep")
        + "\n"
        + ENTRY_0_24_0
    )
    pyproject = (root / "pyproject.toml").read_text()
    assert 'pin = "0.33.0"\n' in pyproject
    assert '"vllm==0.33.0"' in pyproject
    assert "(0.33.0: torch 2.14.0)" in pyproject  # 0.33.0 requires torch 2.14
    for path, text in real_ci.items():
        assert (root / path).read_text() == text.replace("0.24.0", "0.33.0")
    assert (patches / "upstreamed" / "series").read_text() == f"{FIX1}\n{FIX2}\n"
    assert (patches / "parked" / NVFP4).read_bytes() == real[NVFP4]
    assert (patches / "parked" / "series").read_text() == parked_series("0.24.0", "0.25.0")
    lock = Lock.load(pinned.lock_path)
    assert (lock.version, lock.patches, lock.entries) == ("0.33.0", (), ())
    check(capsys, root, 3)


def test_rebase_pin_to_0_33_0(pinned: Project, capsys: pytest.CaptureFixture[str]) -> None:
    """The daily sync's next run, `--drop` (`--keep`: the chain above). Before: it exited 0 with "done", CHANGELOG.md said 0002 was
    "still carried", the rebuilt lock was empty and `check` failed."""
    root = pinned.root
    before = sha256s(root)
    code, out, err = cli(capsys, root, "rebase", "--onto", "0.33.0")
    assert (code, err) == (1, "")
    width = len(f"upstreamed/{FIX1}")
    assert out == "\n".join(
        [
            "rebase 0.24.0 -> 0.33.0: stopped, 1 decision(s) needed (nothing has changed)",
            f"  upstreamed/{FIX1}  upstream  stays in patches/upstreamed/",
            f"  {FIX2.ljust(width)}  upstream  -> patches/upstreamed/ (Applied-upstream: 0.25.0)",
            "    * Applied-upstream: 0.25.0 (trailer kept)",
            f"  {NVFP4.ljust(width)}  conflict  DECISION NEEDED (rewritten)",
            f"WARNING: {NVFP4}: it applied on the old pin; the code it changes is gone from 0.33.0"
            " (rewritten or removed upstream)",
            "3 cosmetic note(s) on upstreamed code (--verbose shows them)",
            "decisions needed (rerun with one option per patch; nothing has changed):",
            f"  {NVFP4} (conflict, rewritten):",
            "    --keep 0002: park it in patches/parked/ (kept, not applied; port it later)",
            "    --drop 0002: remove it",
            "    --resolve-upstream 0002: archive it in patches/upstreamed/ as fixed upstream (its"
            " regression test keeps guarding)",
            "  rerun: vllm-patchset rebase --onto 0.33.0 <an option per patch above>",
            "  No rebase is in progress: nothing was written.",
            "",
        ]
    )
    assert sha256s(root) == before
    assert not (root / ".rebase").exists()
    doc = rebase_json(capsys, root, "--onto", "0.33.0", "--drop", "0002")
    assert doc["versions"] == {
        "0.33.0": {f"upstreamed/{FIX1}": "upstream", FIX2: "upstream", NVFP4: "conflict"}
    }
    assert doc["changelog"] == entry("0.33.0", "0.24.0", "--drop")
    assert (root / "CHANGELOG.md").read_text() == HEADER + entry("0.33.0", "0.24.0", "--drop")
    check(capsys, root, 2)


def test_fix2_reverted_on_0_33_0_with_its_fix_in_a_comment(
    mirror: Mirror, project: Project, tmp_path: Path
) -> None:
    """0.33.0 plus one commit: fix 2 reverted (the bug line back verbatim), the fixed line left
    in a comment beside it. Before: "neither its fix nor the code it changes is there", only
    `--drop` offered (which finished with the bug live)."""
    up = tmp_path / "upstream"
    up.mkdir()
    tar = subprocess.run(
        ["git", "--git-dir", str(mirror.repo.path), "archive", "v0.33.0", "vllm"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(up, filter="data")
    text = (up / TRITON).read_text()
    fixed = "                self.a1_scale,\n                self.quant_dtype,\n"
    assert text.count(fixed) == 1
    reverted = (
        "                self.a1_scale or self.a1_gscale,\n"
        "                # self.a1_scale,  (the fix, for later)\n"
        "                self.quant_dtype,\n"
    )
    (up / TRITON).write_text(text.replace(fixed, reverted))
    git(up, "init", "-q", "-b", "main")
    git(up, "add", "-A")
    git(up, "commit", "-q", "-m", "revert fix 2")
    git(up, "tag", "v0.33.1")
    base = mirror.git_ref(str(up), "v0.33.1")
    path = project.patches_dir / FIX2
    patch = parse_patch_bytes(path.read_bytes(), path, f"upstreamed/{FIX2}")
    verdict = classify(
        mirror.repo, mirror.repo.tree_of(base.commit), patch, base=base.label, version="0.33.1"
    )
    assert (verdict.words, verdict.bug_present, verdict.candidates) == (
        "conflict",
        True,
        (f"{TRITON}:308 (TritonExperts.apply)",),
    )
    assert verdict.warnings[0].startswith(
        f"the bug (`or self.a1_gscale`) is live at {TRITON}:308 (TritonExperts.apply); its fix:"
    )
    assert f"hunk 2 only in a comment at {TRITON}:309 (TritonExperts.apply)" in verdict.warnings[0]
    assert options(Section.UPSTREAMED, verdict, patch) == (Choice.KEEP, Choice.DROP)
