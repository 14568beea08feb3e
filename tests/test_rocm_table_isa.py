"""benchmarks/rocm_table_isa.py's CPU side without compiling: the rules a configuration is judged
by, the launches a candidate table makes the fused experts record (its tiles, token blocks and
stages, and the shipped table back afterwards), and the one-line errors for a table it cannot
read. What the compiled code objects say is benchmarks/results/rocm_table_isa.md."""

from __future__ import annotations

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
from vllm_install import Overlay, Pristine

CANDIDATES = REPO / "benchmarks" / "rocm_tables"
TABLE_NAME = "nvfp4_emulation_moe_tiles.rocm_generic.json"
GOOD = {"vgprs": 128, "vgpr_spills": 0, "sgpr_spills": 3, "scratch_bytes": 0,
        "occupancy_waves": 2, "mfma": 32, "lds_bytes": 4096}  # fmt: skip
# (a change to a good configuration's facts, the rules it then breaks)
RULE_CASES = [
    ({}, []),
    ({"sgpr_spills": 20}, []),  # SGPR spills go to VGPR lanes: not a rule
    ({"vgpr_spills": 1}, ["VGPR spill"]),
    ({"scratch_bytes": 16}, ["scratch"]),
    ({"mfma": 0}, ["no MFMA"]),
    ({"occupancy_waves": 1}, ["fewer than 2 waves"]),
    ({"occupancy_waves": 1, "vgpr_spills": 4}, ["VGPR spill", "fewer than 2 waves"]),
    ({"lds_bytes": 64 << 10}, []),  # all of MI300's LDS: it launches
    ({"lds_bytes": (64 << 10) + 1}, ["LDS over 64 KiB"]),
    ({"lds_bytes": 147456, "occupancy_waves": 1}, ["fewer than 2 waves", "LDS over 64 KiB"]),
]
# The same rules on gfx950, whose LDS is 160 KiB (the worst facts of two predecoded tiles).
RULE_CASES_GFX950 = [
    ({"lds_bytes": 148208}, []),
    ({"lds_bytes": 160 << 10}, []),
    ({"lds_bytes": 197616}, ["LDS over 160 KiB"]),
]


@pytest.mark.parametrize(
    ("target", "change", "broken"),
    [("gfx942", *case) for case in RULE_CASES] + [("gfx950", *case) for case in RULE_CASES_GFX950],
)
def test_rules(target: str, change: dict[str, int], broken: list[str]) -> None:
    row = rocm_table_isa.Row(table="t", target=target, config="c", **(GOOD | change))
    assert row.broken() == broken


@pytest.fixture(scope="module")
def fused(overlay: Overlay, full_pristine: Pristine) -> Any:
    return kernels.overlay_fused(overlay, full_pristine, rocm=True)


def tiles(launches: list[Any]) -> set[tuple[int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of each recorded GEMM launch."""
    found = set()
    for launch in launches:
        kw = launch.kwargs
        found.add((kw["BLOCK_M"], kw["BLOCK_N"], kw["num_warps"], kw["num_stages"]))
    return found


def table_tiles(table: dict[str, Any]) -> set[tuple[int, int, int, int]]:
    return {
        (entry["block_m"], entry[gemm]["block_n"], entry[gemm]["num_warps"],
         entry[gemm]["num_stages"])
        for key, entry in table.items() if not key.startswith("_")
        for gemm in ("w13", "w2")
    }  # fmt: skip


@pytest.mark.parametrize("candidate", ["three_stages", "cuda_tiles", "rules_six"])
def test_candidate_launches_its_tiles(fused: Any, candidate: str) -> None:
    """The GEMMs launched with a candidate as ROCm's generic table take exactly its tiles; the
    shipped table is back afterwards, and takes its own."""
    path = CANDIDATES / candidate / TABLE_NAME
    module = rocm_table_isa.kernels_module(fused)
    shipped = module.GENERIC_CONFIGS["rocm"]
    table = rocm_table_isa.read_table(module, str(path))
    assert tiles(rocm_table_isa.gemm_launches(fused, table)) == table_tiles(
        json.loads(path.read_text())
    )
    assert module.GENERIC_CONFIGS["rocm"] is shipped
    want = {(c.block_m, g.block_n, g.num_warps, g.num_stages)
            for c in shipped.values() for g in (c.w13, c.w2)}  # fmt: skip
    assert tiles(rocm_table_isa.gemm_launches(fused, None)) == want


def test_unreadable_tables(fused: Any, tmp_path: Path) -> None:
    module = rocm_table_isa.kernels_module(fused)
    with pytest.raises(rocm_table_isa.BadTable) as missing:
        rocm_table_isa.read_table(module, str(tmp_path / "none.json"))
    assert str(missing.value) == f"{tmp_path / 'none.json'}: no such table file (or say 'shipped')"
    bad = tmp_path / "bad.json"
    entry = {"naive": False, "block_m": 16, "fuse_a1_qdq": False,
             "w13": {"block_n": 32, "block_k": 64, "num_warps": 2, "num_stages": 2},
             "w2": {"block_n": 64, "block_k": 128, "num_warps": 2, "num_stages": 2}}  # fmt: skip
    bad.write_text(json.dumps({"16": entry}))
    with pytest.raises(rocm_table_isa.BadTable) as refused:
        rocm_table_isa.read_table(module, str(bad))
    assert str(refused.value).startswith(f"{bad}: entry '16' w13: K step 64;")


def test_missing_trees_refused_in_one_line(
    tmp_path: Path, full_pristine: Pristine, capsys: pytest.CaptureFixture[str]
) -> None:
    """An --overlay or --pristine without the files the script loads: one line, exit 2, nothing
    written (before: a traceback from the loader)."""
    out = tmp_path / "out"
    pristine = str(full_pristine.root / "vllm")
    cases = [
        (["--overlay", str(tmp_path / "vllm"), "--pristine", pristine],
         f"no {tmp_path / kernels.FUSED_MOE} (--overlay: patch 0002's experts)"),
        (["--pristine", str(tmp_path)], f"no {tmp_path / '__init__.py'} (--pristine: vLLM 0.24.0's"
         " package)"),
    ]  # fmt: skip
    for options, line in cases:
        assert rocm_table_isa.main(["shipped", "--out", str(out), *options]) == 2
        assert capsys.readouterr().err == f"rocm_table_isa: {line}\n"
    assert not out.exists()
