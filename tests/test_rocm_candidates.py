"""The tuner's ROCm candidates under ROCm's ISA rules, on the CPU:

- benchmarks/rocm_table_isa.py --candidates drives every tile benchmarks/tune_nvfp4_moe.py may
  time with ROCm's configuration (fused GEMMs from blocks of 16 tokens, predecoded GEMMs), and
  each launch counts for the candidate its own constants name: every candidate, nothing else;
- the committed benchmarks/results/rocm_tile_candidates.json is of the overlay's kernels, covers
  exactly the candidates, says what each breaks by the rules, and two of its verdicts (one
  broken, one kept) are what compiling them here again gives; with ROCm's configuration every
  tile has its two-stage twin and ROCm's generic table's tiles are candidates;
- every predecoded candidate fits a Hopper block's shared memory (compiled for sm_90);
- the tuner, sweeping ROCm's configuration, leaves out the candidates that break a rule (in its
  tasks, its picks, its predecode tiles) and stops in one line where the file is missing,
  unreadable, of other kernels or silent on a candidate (or the tree has no kernels file), or
  where the rules leave a token count nothing to pick.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from support import REPO

pytest.importorskip("torch", reason="the launchers run on torch tensors (pip install torch)")
pytest.importorskip("triton", reason="triton binds the launches (pip install triton)")
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests" / "gpu"))
import overlay_kernels as kernels
import rocm_table_isa
import tune_nvfp4_moe
from vllm_install import Overlay, Pristine

pytestmark = pytest.mark.usefixtures("triton_cache")  # compiled kernels kept in the test cache
COMMITTED = REPO / "benchmarks" / "results" / "rocm_tile_candidates.json"
CANDIDATES = 178  # 165 fused GEMM tiles (blocks of 16 to 128 tokens), 13 predecoded


@pytest.fixture(scope="module")
def fused(overlay: Overlay, full_pristine: Pristine) -> Any:
    return kernels.overlay_fused(overlay, full_pristine, rocm=True)


@pytest.fixture
def tune(fused: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The tuner with ROCm's token blocks, on copies of its candidate lists (the test's own)."""
    for name in ("GROUPS", "BUCKETS", "W13", "W2"):
        monkeypatch.setattr(tune_nvfp4_moe, name, dict(getattr(tune_nvfp4_moe, name)))
    monkeypatch.setattr(tune_nvfp4_moe, "RULED_OUT", set())
    return rocm_table_isa.tuner(rocm_table_isa.kernels_module(fused), wide=False)


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(COMMITTED.read_text())
    return document


def test_every_candidate_launched_as_itself(fused: Any, tune: Any) -> None:
    wanted = rocm_table_isa.tuner_candidates(tune)
    assert len(wanted) == len(set(wanted)) == CANDIDATES
    assert min(c[1] for c in wanted) == 16
    launches = rocm_table_isa.candidate_launches(fused, tune)
    found = {rocm_table_isa.candidate_of(kernels.specialize(x, "gfx942")) for x in launches}
    assert found == set(wanted)


def test_rocm_candidates_have_two_stages_and_rocms_own_tiles(fused: Any, tune: Any) -> None:
    """With ROCm's configuration every fused candidate has its two-stage twin, and the tiles of
    ROCm's generic table are candidates of their groups (a sweep may keep them)."""
    wanted = rocm_table_isa.tuner_candidates(tune)
    for gemm, bm, naive, qdq, (n, k, warps, _, *more) in wanted:
        if not gemm.startswith("predecoded"):
            assert (gemm, bm, naive, qdq, (n, k, warps, 2, *more)) in wanted
    generic = rocm_table_isa.kernels_module(fused).GENERIC_CONFIGS["rocm"]
    for config in generic.values():
        naive, bm, qdq, w13, w2 = tune.config_tuple(config)
        assert ("w13", bm, naive, qdq, w13) in wanted
        assert ("w2", bm, naive, False, w2) in wanted


def test_committed_file_is_of_the_overlay_and_every_candidate(
    overlay: Overlay, fused: Any, tune: Any, committed: dict[str, Any]
) -> None:
    """The file pins the overlay's kernels and has every candidate, each verdict the rules'
    reading of its facts; ROCm's generic tiles keep every rule (patch 0002's comment on its
    ROCm table says so, for the tiled weights)."""
    kernels_file = overlay.project.overlay_dir / kernels.FUSED_KERNELS
    assert committed["kernels_sha256"] == hashlib.sha256(kernels_file.read_bytes()).hexdigest()
    assert committed["kernels_sha256"] == tune.kernels_sha256(overlay.project.overlay_dir)
    assert (committed["wide"], committed["targets"]) == (False, ["gfx942", "gfx950"])
    rows = committed["candidates"]
    assert [tune.candidate_key(r) for r in rows] == rocm_table_isa.tuner_candidates(tune)
    for row in rows:
        rules = [
            f"{target}: {rule}"
            for target in rocm_table_isa.TARGETS
            for rule in rocm_table_isa.Row(table="t", target=target, **row[target]).broken()
        ]
        assert row["broken"] == rules
    verdicts = {tune.candidate_key(r): r["broken"] for r in rows}
    for config in rocm_table_isa.kernels_module(fused).GENERIC_CONFIGS["rocm"].values():
        naive, bm, qdq, w13, w2 = tune.config_tuple(config)
        assert verdicts["w13", bm, naive, qdq, w13] == verdicts["w2", bm, naive, False, w2] == []


def test_committed_verdicts_compile_again(fused: Any, tune: Any, committed: dict[str, Any]) -> None:
    """One broken and one kept candidate, those of fewest configurations, compiled again."""
    rows = committed["candidates"]

    def fewest(broken: bool) -> dict[str, Any]:
        some = [r for r in rows if bool(r["broken"]) is broken]
        return min(some, key=lambda r: int(r["gfx942"]["config"].split()[0]))

    again = [tune.candidate_key(fewest(True)), tune.candidate_key(fewest(False))]
    launches = rocm_table_isa.candidate_launches(fused, tune)
    got, silent = rocm_table_isa.candidate_rows(launches, again)
    assert silent == []
    assert got == [fewest(True), fewest(False)]


def test_predecoded_candidates_fit_hopper(fused: Any, tune: Any) -> None:
    """Every predecoded tile the tuner may time (CUDA's sweep times the same ones) compiles for
    sm_90 within a Hopper block's shared memory: a tile above it fails at launch in every
    timing of a CUDA sweep (w13 over 256 rows at three stages, 240 KiB, did until 2026-12-05)."""
    wanted = tune.predecode_candidates(tune.PREDECODE_TILES)
    specs = [kernels.specialize(x, "sm90") for x in rocm_table_isa.predecode_launches(fused, tune)]
    over, seen = [], set()
    for spec in kernels.unique(specs):
        key = rocm_table_isa.candidate_of(spec)
        seen.add(key)
        shared = kernels.compile_for(spec).metadata.shared  # isa_facts' shared_bytes_triton
        if shared > kernels.HOPPER_SHARED_BYTES:
            over.append((key, shared))
    assert seen == set(wanted)
    assert over == []


# -- the tuner's side ----------------------------------------------------------------------


def candidates_file(tmp_path: Path, rows: list[dict[str, Any]], sha256: str) -> Path:
    path = tmp_path / "rocm_tile_candidates.json"
    path.write_text(json.dumps({"kernels_sha256": sha256, "candidates": rows}))
    return path


def tree_with_kernels(tmp_path: Path, text: bytes) -> tuple[Path, str]:
    kernels_file = tmp_path / "tree" / tune_nvfp4_moe.KERNELS_FILE
    kernels_file.parent.mkdir(parents=True)
    kernels_file.write_bytes(text)
    return tmp_path / "tree", hashlib.sha256(text).hexdigest()


def row_of(key: tuple[Any, ...], broken: list[str]) -> dict[str, Any]:
    gemm, bm, naive, qdq, tile = key
    return {"gemm": gemm, "block_m": bm, "naive": naive, "qdq_a": qdq, "tile": list(tile),
            "broken": broken}  # fmt: skip


def test_tuner_takes_the_verdicts(tmp_path: Path, tune: Any) -> None:
    tree, sha256 = tree_with_kernels(tmp_path, b"kernels")
    wanted = tune.every_candidate([1, 512])
    broken = set(wanted[::3])
    rows = [row_of(c, ["gfx942: VGPR spill"] if c in broken else []) for c in wanted]
    path = candidates_file(tmp_path, rows, sha256)
    assert tune.rocm_isa_rules(tree, wanted, path) == broken
    assert tune.rocm_isa_rules(tree, wanted[1:2], path) == set()


def test_tuner_refuses_what_it_cannot_judge(tmp_path: Path, tune: Any) -> None:
    tree, sha256 = tree_with_kernels(tmp_path, b"kernels")
    wanted = tune.every_candidate([1])
    where = f"tune_nvfp4_moe: {tmp_path / 'rocm_tile_candidates.json'}"
    how = "python benchmarks/rocm_table_isa.py --candidates (--wide for a --wide sweep)"
    again = f"write it again with {how}"
    cases = [
        (None, f"{where}: no ROCm ISA facts to read (FileNotFoundError(2, 'No such file or"
               f" directory')); write them with {how}"),
        ({"kernels_sha256": sha256}, f"{where}: no ROCm ISA facts to read (KeyError("
         f"'candidates')); write them with {how}"),
        ({"kernels_sha256": "0" * 64, "candidates": []},
         f"{where}: compiled from other kernels (sha256 000000000000, this tree's"
         f" {sha256[:12]}); {again}"),
        ({"kernels_sha256": sha256, "candidates": [row_of(c, []) for c in wanted[1:]]},
         f"{where}: no ISA facts of 1 candidates (the first: {wanted[0]}); {again}"),
    ]  # fmt: skip
    path = tmp_path / "rocm_tile_candidates.json"
    for document, line in cases:
        if document is not None:
            path.write_text(json.dumps(document))
        with pytest.raises(SystemExit) as stopped:
            tune.rocm_isa_rules(tree, wanted, path)
        assert str(stopped.value) == line
    path.write_text("{not json")
    with pytest.raises(SystemExit) as unreadable:
        tune.rocm_isa_rules(tree, wanted, path)
    assert str(unreadable.value).startswith(f"{where}: no ROCm ISA facts to read (JSONDecodeError")
    path.write_text(json.dumps({"kernels_sha256": sha256, "candidates": []}))
    with pytest.raises(SystemExit) as no_kernels:
        tune.rocm_isa_rules(tmp_path / "elsewhere", wanted, path)
    assert str(no_kernels.value) == (
        f"tune_nvfp4_moe: {tmp_path / 'elsewhere'}: no kernels file to judge (FileNotFoundError(2,"
        " 'No such file or directory'))"
    )


def test_tuner_leaves_out_what_breaks_a_rule(tune: Any) -> None:
    shape = tune.shape_named("qwen3-30b-a3b")
    everything = tune.all_tasks([shape], [32])
    w13 = tune.W13[16]
    assert tune.GROUPS[32] == [(16, False, True), (16, False, False), (32, False, False)]
    out = {("w13", 16, False, False, g) for g in w13[1:]}  # the first tile stays
    out |= {("w13", 16, False, True, g) for g in w13}  # QDQ inside: none left
    out |= {("w2", 32, False, False, g) for g in tune.W2[32]}  # block 32: no w2 left
    tune.RULED_OUT |= out
    tasks = tune.all_tasks([shape], [32])
    assert tasks == [t for t in everything if t[2:] not in out]
    assert tune.tiles_for("w13", 16, False, False) == w13[:1]
    assert tune.tiles_for("w2", 16, False, True) == tune.W2[16]  # w2 has no QDQ inside
    results = {task: float(i + 1) for i, task in enumerate(tasks)}
    _, choice = tune.pick(results, [shape.name], 32, tune.GROUPS[32])
    assert choice == (False, 16, False, w13[0], tune.W2[16][0])  # the one group left
    tune.refuse_empty_buckets([32], predecode=False)
    tune.RULED_OUT |= {c for c in tune.group_candidates(tune.GROUPS[32]) if c[0] == "w2"}
    with pytest.raises(SystemExit) as stopped:
        tune.refuse_empty_buckets([1, 32], predecode=False)
    assert str(stopped.value) == "tune_nvfp4_moe: ROCm's ISA rules leave no candidate for 32 tokens"


def test_tuner_leaves_out_predecode_tiles(tune: Any) -> None:
    entries = tune.PREDECODE_TILES
    assert tune.predecode_tiles() == entries
    tune.RULED_OUT.add(tune.predecode_candidates(entries[:1])[1])  # the first entry's w2
    # The last entry has that w2 tile over blocks of 64 pairs: another candidate, kept.
    assert entries[-1][0] == 64 and entries[-1][2] == entries[0][2]
    assert tune.predecode_tiles() == entries[1:]
    tune.refuse_empty_buckets([], predecode=True)
    tune.RULED_OUT |= set(tune.predecode_candidates(entries))
    with pytest.raises(SystemExit) as stopped:
        tune.refuse_empty_buckets([], predecode=True)
    assert str(stopped.value) == (
        "tune_nvfp4_moe: ROCm's ISA rules leave no candidate for the predecoded GEMMs"
    )
