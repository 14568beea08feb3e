"""benchmarks/launch_floor.py's CPU side: the fit and the report from rows shaped like a run's,
and its kernels compiled for sm_90 as the GPU runs them (the PDL chain's griddepcontrol, each
barrier's one atomic arrival and a spin loop that reads the count again on every turn)."""

from __future__ import annotations

import os
import re
import sys

import pytest
from support import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
# Triton 3.9 warns when this is unset, and warnings fail the tests (as in tests/overlay_kernels.py).
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import launch_floor as lf

META = {"gpu": "NVIDIA H200", "reps": 200, "when": "2026-12-03T00:00:00Z", "torch": "2.11.0",
        "triton": "3.6.0"}  # fmt: skip


def test_fit_is_the_least_squares_line() -> None:
    rows = [lf.Row("chain", n, 1, 5.0 + 2.5 * n) for n in (1, 2, 3, 4)]
    rows += [lf.Row("barriers", 0, 132, 8.0), lf.Row("barriers", 2, 132, 9.0)]
    assert lf.fit(rows) == [lf.Fit("chain", 5.0, 2.5), lf.Fit("barriers", 8.0, 0.5)]


def test_markdown_has_every_cell_and_fit() -> None:
    rows = [
        lf.Row("chain", 1, 1, 7.5),
        lf.Row("chain", 2, 1, 10.0),
        lf.Row("barriers", 0, 132, 8.0),
    ]
    text = lf.markdown(rows, lf.fit(rows[:2]), META)
    assert "| series | programs | n=0 | n=1 | n=2 |" in text
    assert "| chain | 1 | — | 7.50 | 10.00 |" in text
    assert "| barriers | 132 | 8.00 | — | — |" in text
    assert "| chain | 5.00 | 2.5000 |" in text


@pytest.mark.usefixtures("triton_cache")
@pytest.mark.parametrize("barriers", [1, 3])
def test_barrier_kernel_spins_on_fresh_reads(barriers: int) -> None:
    """One acq_rel atomic arrival per barrier, and each spin loop reloads the count (volatile):
    triton 3.6 drops an atomic add of 0 from such a loop, which would spin forever."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"x_ptr": "*i32", "count_ptr": "*i32", "epoch_ptr": "*i32", "BARRIERS": "constexpr"}
    source = ASTSource(lf._barriers, signature, {"BARRIERS": barriers})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    assert len(re.findall(r"atom\.global\.gpu\.acq_rel\.add", ptx)) == barriers
    loops = re.findall(
        r"^\$L__BB\d+_\d+:[^\n]*\n[^\n]*Inner Loop Header(.*?)bra\s", ptx, re.M | re.S
    )
    assert len(loops) == barriers and all("ld.volatile.global" in body for body in loops)


@pytest.mark.usefixtures("triton_cache")
def test_pdl_chain_kernel_waits_and_triggers() -> None:
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(lf._store_one, {"x_ptr": "*i32", "PDL": "constexpr"}, {"PDL": True})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx


@pytest.mark.usefixtures("triton_cache")
def test_mma_chain_loop_is_one_dot_of_dependent_mmas() -> None:
    """Compiled for sm_90, the MMA chain's loop issues whole dots of MMA_STEP / 16 tensor-core
    MMAs (m16n8k16: one warp's [16, 8] output over 16 of K; triton unrolls the loop by a few
    dots) and touches no global or local memory (its operands are reread from shared memory,
    as a fused GEMM's are), so a turn is its MMAs, each adding to the one before."""
    triton = pytest.importorskip("triton")
    import overlay_kernels as kernels
    from triton.compiler import ASTSource

    signature = {"w_ptr": "*fp16", "a_ptr": "*fp16", "out_ptr": "*fp32", "steps": "i32",
                 "BLOCK_K": "constexpr"}  # fmt: skip
    source = ASTSource(lf._mma_chain, signature, {"BLOCK_K": lf.MMA_STEP})
    compiled = triton.compile(source, target=kernels.TARGETS["sm90"], options={"num_warps": 1})
    loop = kernels.isa_facts(compiled, "sm90")["k_loop_mix"]
    assert loop["HMMA"] > 0 and loop["HMMA"] % (lf.MMA_STEP // 16) == 0
    assert not {"LDG", "STG", "LDL", "STL"} & set(loop)
    assert all(n % (lf.MMA_STEP // 16) == 0 for n in lf.MMA_CHAIN)
