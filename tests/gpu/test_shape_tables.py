"""Patch 0002's tile tables of single shapes (``nvfp4_emulation_moe_tiles.E<experts held>_H<hidden>
_I<intermediate>.<GPU>.json``, shipped beside its kernels): on the GPU a file is named for, each
shape's layer

- takes its file's table (nvfp4_moe_configs), not the GPU's table for any shape;
- agrees with the pure-torch reference (exact W4A4) at each token count whose bucket the
  file tunes (its entries that differ from the GPU's table for any shape), under
  test_fused_nvfp4_emulation.py's tolerance;
- keeps batch invariance, bitwise: a token alone and at a random row of batches whose token
  counts fall in every bucket of the file (the tuned ones among them), through the experts'
  apply and FusedMoEKernel.apply, eager and replayed from CUDA graphs.

Shapes are those of tests/gpu/moe_setup.SHAPES whose experts held, hidden and intermediate
sizes a file names. On a GPU without such files, or a vLLM without patch 0002's tables, the
module is skipped, saying why.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA or ROCm GPU", allow_module_level=True)
pytest.importorskip("vllm", reason="no vllm importable (set VLLM_PATCHSET_VLLM_TREE)")

import moe_setup
from nvfp4_reference import nvfp4_moe_reference
from test_fused_nvfp4_emulation import assert_agree  # one tolerance for every path
from test_fused_nvfp4_ragged import MODES, probe_outputs

kernels = pytest.importorskip(
    "vllm.model_executor.layers.fused_moe.experts.nvfp4_emulation_kernels",
    reason="the vLLM under test has no kernel module of patch 0002",
)
if not hasattr(kernels, "table_file_names"):
    pytest.skip("the vLLM under test reads no tile table files", allow_module_level=True)

pytestmark = pytest.mark.gpu

DEVICE = kernels.device_table_name(kernels.nvfp4_platform())
FILE = re.compile(
    re.escape(kernels.TABLE_PREFIX) + r"E(\d+)_H(\d+)_I(\d+)\." + re.escape(DEVICE) + r"\.json"
)


def shipped() -> dict[str, tuple[moe_setup.MoeShape, Path]]:
    """Shape name -> (shape, its table file), for each file shipped for this GPU."""
    found = {}
    for path in sorted(Path(kernels.TABLES_DIR).iterdir()):
        match = FILE.fullmatch(path.name)
        if match is None:
            continue
        held, hidden, inter = map(int, match.groups())
        shapes = [
            s
            for s in moe_setup.SHAPES
            if (s.held_experts, s.hidden, s.intermediate) == (held, hidden, inter)
        ]
        assert shapes, f"{path.name}: no shape of moe_setup.SHAPES holds it"
        found[shapes[0].name] = (shapes[0], path)
    return found


SHIPPED = shipped()
if not SHIPPED:
    pytest.skip(f"no tile table of a single shape for {DEVICE}", allow_module_level=True)


def bucket_counts(table: dict[int, object]) -> tuple[int, ...]:
    """A token count in each bucket of ``table`` (its largest), and one past the last bound
    short of "any count" (the open bucket)."""
    bounds = sorted(table)
    counts = [*bounds[:-1], bounds[-2] + 1 if len(bounds) > 1 else 1]
    return tuple(sorted({c for c in counts if c > 1}))


def device_table() -> dict:
    """The GPU's table for any shape (the file beside the kernels), else the generic one."""
    path = Path(kernels.TABLES_DIR) / kernels.table_file_names(0, 0, 0, DEVICE)[1]
    if path.is_file():
        return kernels.parse_table(path.read_text(), str(path))
    return kernels.GENERIC_CONFIGS[kernels.nvfp4_platform()]


def tuned_counts(path: Path) -> tuple[int, ...]:
    """The bounds of the file's buckets whose entry is not the one the GPU's table gives that
    token count: the counts the file was tuned at."""
    table, generic = kernels.parse_table(path.read_text(), str(path)), device_table()

    def generic_entry(count: int) -> object:
        return generic[next((b for b in sorted(generic) if count <= b), max(generic))]

    return tuple(b for b in sorted(table) if b < 1 << 40 and table[b] != generic_entry(b))


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shape_table_taken(name: str) -> None:
    shape, path = SHIPPED[name]
    taken = kernels.nvfp4_moe_configs(shape.held_experts, shape.hidden, shape.intermediate)
    assert taken == kernels.parse_table(path.read_text(), str(path))


@pytest.mark.parametrize(
    ("name", "tokens"),
    [(name, t) for name in sorted(SHIPPED) for t in tuned_counts(SHIPPED[name][1])],
)
def test_shape_table_matches_reference(name: str, tokens: int) -> None:
    shape = SHIPPED[name][0]
    moe = moe_setup.held_moe(shape)
    experts = moe_setup.nvfp4_emulation_experts(moe, shape, tokens)
    layer = moe_setup.MoeLayer(moe, shape, tokens, experts)
    tw, tids = layer.topk_weights, layer.topk_ids
    if moe_setup.expert_map(shape) is not None:
        # The busiest rank's routing, as the tuner timed it: rank 0's may hold none of a
        # decode token's experts, and then no tile of the table runs (and the reference is 0).
        rank = moe_setup.busiest_rank(shape, tids)
        tids.copy_(moe_setup.rank_routing(shape, tids, rank))
        assert moe_setup.active_experts(shape, tids) > 0
        tw, tids = moe_setup.local_routing(shape, tw, tids)  # what the rank's experts see
    want = nvfp4_moe_reference(moe, layer.hidden, tw, tids, exact=True)
    assert_agree(layer.apply(), want)


@pytest.mark.parametrize(("entry", "graph"), MODES)
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shape_table_batch_invariant(name: str, entry: str, graph: bool) -> None:
    shape, path = SHIPPED[name]
    batches = bucket_counts(kernels.parse_table(path.read_text(), str(path)))
    alone, outputs = probe_outputs(shape, moe_setup.held_moe(shape), entry, graph, batches)
    assert not alone.isnan().any()
    differ = [
        f"{tokens} tokens, row {row}: {int((out != alone).sum())} elements differ"
        for tokens, row, out in outputs
        if not torch.equal(out, alone)
    ]
    assert not differ, f"{name}, {entry}.apply, graph={graph}: " + "; ".join(differ)
