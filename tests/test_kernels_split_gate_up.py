"""Patch 0002's w13 tile option ``split_gate_up`` under Triton's interpreter (TRITON_INTERPRET=1)
on the CPU: the gate and up rows of a program in one tile of 2 * block_n rows and one product
(so that on a GPU each warp walks K over 16 rows of one of them, half the chain of a warp that
holds 16 of each), against the same layer with the table's own tiles.

Every row sums the same K steps in the same order either way, so the outputs are the same bits
(``torch.equal``): at 1 token (one block per pair), at 5 and 40 (sorted blocks), on the tiled
layout and the checkpoint's rows, at a depth with a masked step (hidden 144), in FP16
and BF16, and as an expert-parallel rank. The experts' own ``apply`` runs, as in
tests/test_kernels_ragged.py (the portable kernels, ROCm's tiles, the interpreter's faults
mended).

No table takes the option yet (it is to be measured on a GPU first), so the compile tests of
the tables do not reach it: here every gated launch of both platforms' tables, with the option
on and a warp for each 16 rows of gate or up, compiles for gfx942, gfx950 and sm_90 with matrix
instructions and no spill, and on sm_90 each warp's code has half the HMMAs of the table's tile
of the same width (16 rows of one of gate or up, not 16 of each).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the kernels run on torch tensors (pip install torch)")
pytest.importorskip("triton", reason="triton's interpreter runs the kernels (pip install triton)")
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import overlay_kernels as kernels
from vllm_install import Overlay, Pristine

pytestmark = pytest.mark.usefixtures("triton_cache")

# name -> (experts, hidden, intermediate, top-k, tokens, dtype, expert parallelism)
CASES = {
    "t1": (4, 256, 64, 2, 1, "fp16", False),
    "t5": (4, 256, 64, 2, 5, "fp16", False),
    "t40-bf16": (8, 256, 96, 2, 40, "bf16", False),
    "h144-tail": (4, 144, 192, 2, 5, "fp16", False),
    "t5-ep": (4, 256, 64, 2, 5, "bf16", True),
}


# Every case run once, under the interpreter, in a child process (kernels.run_interpreted).
results = kernels.interpreted_results_fixture()


@pytest.mark.parametrize("layout", ["tiled", "rows"])
@pytest.mark.parametrize("case", CASES)
def test_split_gate_up_gives_the_same_bits(results: dict[str, Any], case: str, layout: str) -> None:
    got = results["outputs"][case]
    split, tables = got[f"{layout}-split"], got[f"{layout}-table"]
    assert not split.isnan().any(), "output elements left unwritten (NaN)"
    assert torch.equal(split, tables), f"{int((split != tables).sum())} elements differ"


@pytest.fixture(scope="module")
def gated(overlay: Overlay, full_pristine: Pristine) -> dict[str, list[Any]]:
    """The fused experts' gated (w13) launches of the fused GEMM (the kernel with SPLIT_GU) on
    each platform ("hip", "cuda")."""
    paths = (overlay.project.overlay_dir / "vllm", full_pristine.root / "vllm")
    return {
        p: [
            launch
            for launch in kernels.fused_launches(*paths, rocm=p == "hip")[0]
            if launch.kwargs.get("GATED") and "SPLIT_GU" in launch.kernel.arg_names
        ]
        for p in ("hip", "cuda")
    }


def split(launch: kernels.Launch) -> kernels.Launch:
    """The launch with split_gate_up on: a warp for each 16 rows of gate or up."""
    kw = {**launch.kwargs, "SPLIT_GU": True, "num_warps": 2 * launch.kwargs["BLOCK_N"] // 16}
    return kernels.Launch(launch.kernel, launch.args, kw)


@pytest.mark.parametrize("target", kernels.TARGETS)
def test_split_gate_up_compiles(target: str, gated: dict[str, list[Any]]) -> None:
    launches = gated[str(kernels.TARGETS[target].backend)]
    specs = kernels.unique([kernels.specialize(split(x), target) for x in launches])
    assert specs
    for spec in specs:
        facts = kernels.isa_facts(kernels.compile_for(spec), target)
        if kernels.TARGETS[target].backend == "hip":
            assert (facts["mfma"] > 0, facts["vgpr_spills"], facts["scratch_bytes"]) == (
                True,
                0,
                0,
            ), spec.label()
        else:
            assert (facts["mma"] > 0, facts["local_bytes"]) == (True, 0), spec.label()


def test_split_gate_up_halves_each_warps_mma(gated: dict[str, list[Any]]) -> None:
    """sm_90, the decode tile (one block per pair: 16 gate and 16 up rows, one warp): with the
    option, two warps, each with half the HMMAs (and half the decode's packed multiplies)."""
    decode = [x for x in gated["cuda"] if x.kwargs["NAIVE"] and x.kwargs["PTX"]]
    assert decode
    for launch in decode:
        assert (launch.kwargs["BLOCK_N"], launch.kwargs["num_warps"]) == (16, 1)
        table, halved = (
            kernels.isa_facts(kernels.compile_for(kernels.specialize(x, "sm90")), "sm90")
            for x in (launch, split(launch))
        )
        assert (halved["mma"] * 2, halved["sass_mix"]["HMUL2"] * 2) == (
            table["mma"],
            table["sass_mix"]["HMUL2"],
        )


def test_split_gate_up_was_launched(results: dict[str, Any]) -> None:
    """Each split run launched its w13 GEMM with SPLIT_GU and its w2 GEMM without; each run
    on the table's tiles launched neither with it."""
    for case in CASES:
        assert results["launches"][case] == {"split": [True, False], "table": [False, False]}


# -- the child process ------------------------------------------------------------------------


def split_gate_up(table: Mapping[int, Any]) -> dict[int, Any]:
    """The table with split_gate_up on for every w13 tile, a warp for each 16 rows of gate or
    up."""
    return {
        bound: dataclasses.replace(
            c, w13=dataclasses.replace(c.w13, split_gate_up=True, num_warps=2 * c.w13.block_n // 16)
        )
        for bound, c in table.items()
    }


def main(overlay_vllm: str, pristine_vllm: str, out: str) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    fused = kernels.interpreted_fused(overlay_vllm, pristine_vllm)
    original = InterpretedFunction.run
    outputs: dict[str, dict[str, torch.Tensor]] = {}
    launches: dict[str, dict[str, list[bool]]] = {}
    for case, layer in CASES.items():
        moe, hidden, weights, ids = kernels.case_layer(case, layer)
        ep = layer[-1]
        outputs[case], launches[case] = {}, {}
        for kind, retile in (("split", split_gate_up), ("table", None)):
            seen: list[bool] = []

            def spy(self: Any, *args: Any, _seen: list[bool] = seen, **kw: Any) -> Any:
                if "SPLIT_GU" in kw:
                    _seen.append(bool(kw["SPLIT_GU"]))
                return original(self, *args, **kw)

            InterpretedFunction.run = spy  # type: ignore[method-assign]
            try:
                for layout in ("tiled", "rows"):
                    outputs[case][f"{layout}-{kind}"] = kernels.run_experts(
                        fused,
                        moe,
                        hidden,
                        weights,
                        ids,
                        ep=ep,
                        layout=layout == "tiled",
                        retile=retile,
                    )
            finally:
                InterpretedFunction.run = original  # type: ignore[method-assign]
            launches[case][kind] = seen[:2]  # the first apply's w13 and w2 GEMMs
    torch.save({"outputs": outputs, "launches": launches}, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
