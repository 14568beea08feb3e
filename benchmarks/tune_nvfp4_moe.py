"""Tile sweep for the fused NVFP4 emulation MoE kernel (patch 0002), and its bucket table.

    python benchmarks/tune_nvfp4_moe.py --tree DIR [--shapes NAME,...] [--tokens N ...]
                                        [--write-table [DIR]] [--out DIR] [--wide]
                                        [--split-gate-up] [--three-stages] [--predecode]

DIR holds a vLLM tree with patch 0002 applied (the kernels live in
vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_kernels.py, imported by
nvfp4_emulation_moe.py; without vLLM's compiled extensions the stand-ins of
tests/gpu/standins.py are installed). The weights are laid out as the experts'
process_weights_after_loading leaves them (the module's tiles, where it has them;
``laid_out``), the reference reads the checkpoint's rows. Times each GEMM (w13 with
silu_and_mul and QDQ, w2 with the router weight) for each candidate tile on the --shapes
(tests/gpu/moe_setup.SHAPES names; default the two the generic table was tuned on) and token
counts 1, 8, 32, 128, 256, 512 (or those of --tokens; CUDA graph replay, L2 flushed before each
replay, median of 20),
checks the picked configs against the pure-torch reference (tests/gpu/nvfp4_reference.py),
and with --write-table writes the picks as the kernel module's tile tables (JSON, as its
nvfp4_moe_configs reads them) into DIR (default benchmarks/results/nvfp4_moe_tables/): one per
shape, ``nvfp4_emulation_moe_tiles.E<experts held>_H<hidden>_I<intermediate>.<GPU>.json``,
and one for any shape of this GPU, ``nvfp4_emulation_moe_tiles.<GPU>.json`` (the
pick over all the shapes; only when every token count was swept). With --tokens, a shape's
table takes the picks for the buckets of the token counts swept and, for the other buckets,
the entries the tree's kernel module takes today for that shape (a table shipped beside it,
else the platform's generic one): the pick for a token count t becomes a bucket of its own,
bound t (the counts above the bucket below, up to t), and the entry that covered the counts
above t stays, so that retuning one token count of a shape changes only the counts it
measured. The files are named as the kernel module names this GPU's (with
VLLM_PATCHSET_NVFP4_PLATFORM=rocm on another GPU: rocm_generic, what that configuration
reads). The
kernel reads them from the folder named by VLLM_PATCHSET_NVFP4_CONFIG_DIR, then from its own
folder, where patch 0002 ships them.
Candidates compile in parallel processes first, once per variant (variant_key: token counts and
sizes do not specialize the kernel; a depth's masked step, w13's top-k and expert
parallelism do), each on the shape that takes the least memory to build; each process holds one
shape's weights at a time, and no more processes start than the GPU's free memory holds
(compile_jobs; --jobs at most). The timings then take one shape's weights at a time too. About
310 timings per shape.

2048 and 8192 tokens are swept only when --tokens names them, each a bucket of its own in the
table written, with blocks of up to 128 tokens.

Pick per token bucket: for each GEMM the tile with the least sum over the shapes of
(time / that shape's best time), then the group (token block, naive blocks, QDQ of the hidden
states inside the GEMM or in a pass of its own) with the least such sum. Output:
``tune.json`` (every timing) under --out. Ctrl-C, kill (SIGTERM) or a closed pipe stop it in
one line: the compile processes killed, the timings taken so far saved there (marked
``stopped``), no table written.

--predecode sweeps the predecoded GEMMs instead (patch 0002 decodes each GEMM's weights once
for the call from a threshold of routed pairs per expert): for each shape whose depths are
whole K steps, the whole layer at PREDECODE_PAIRS pairs an expert, fused (the tiles the shape's
table gives that count) beside predecoded with each of PREDECODE_TILES, every predecoded
output first checked bit for bit against the fused one (the same bits is the predecode's
contract: a candidate that differs stops the sweep, no table written). The pick
(predecode_pick): the tiles with the least time summed over the counts, and the threshold the
least count from which they are faster than the fused layer at every count swept (none: a
threshold no call reaches, PREDECODE_NEVER). --write-table writes each shape's table as the
kernel module takes it today (its buckets) with that "predecode" entry. Without --predecode a
table written keeps the predecode entry of the shape's shipped table.

With ROCm's configuration (VLLM_PATCHSET_NVFP4_PLATFORM=rocm on an NVIDIA GPU, or an AMD GPU)
the candidates are the tiles above, each also with two stages, and ROCm's generic table's tiles
(rocm_tiles); a sweep times only those that keep ROCm's ISA rules on gfx942 and gfx950 (MFMA, no
VGPR spill or scratch, two waves per SIMD, no more LDS than the target has: 64 KiB on gfx942, 160
KiB on gfx950): benchmarks/results/rocm_tile_candidates.json, which
``benchmarks/rocm_table_isa.py --candidates`` writes on a CPU machine for the kernels file whose
sha256 it names. An NVIDIA GPU would pick what runs fastest there, such as three stages, which
leave an MI300 one wave per SIMD. The sweep stops, in one line and before any timing, where that
file is missing, of other kernels, or silent on a candidate; a written table's note says how
many candidates the rules left out.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import json
import math
import multiprocessing as mp
import re
import signal
import sys
import time
import types
from pathlib import Path

import stops
import torch
import triton
from bench_nvfp4_moe import nvfp4_bytes

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "gpu"))
import moe_setup  # noqa: E402
import standins  # noqa: E402
from cuda_graphs import l2_flush_buffer, time_us  # noqa: E402
from nvfp4_reference import REL_FROBENIUS, Nvfp4Moe, nvfp4_moe_reference  # noqa: E402

# The shapes tuned without --shapes: the two the generic table was tuned on.
DEFAULT_SHAPES = ("qwen3-30b-a3b", "e128-h4096-i1536")
DEFAULT_TABLES = REPO / "benchmarks" / "results" / "nvfp4_moe_tables"


def shape_named(name: str) -> moe_setup.MoeShape:
    """A moe_setup shape by name (its shape_named where it has one: aliases, a layer named by
    its sizes, e64-h3584-i1280-k6); an unknown or impossible one stops here in one line."""
    if hasattr(moe_setup, "shape_named"):
        try:
            return moe_setup.shape_named(name)  # type: ignore[no-any-return]
        except (KeyError, ValueError) as exc:
            raise SystemExit(f"--shapes: {exc.args[0]}") from None
    for shape in moe_setup.SHAPES:
        if shape.name == name:
            return shape
    known = ", ".join(s.name for s in moe_setup.SHAPES)
    raise SystemExit(f"unknown MoE shape {name!r}; known: {known}")


def held_experts(shape: moe_setup.MoeShape) -> int:
    """The experts whose weights one GPU holds (expert parallelism: fewer than E)."""
    return int(getattr(shape, "held_experts", shape.experts))


def expert_map(shape: moe_setup.MoeShape) -> torch.Tensor | None:
    """moe_setup's expert map for an expert-parallel shape (None: every expert held)."""
    make = getattr(moe_setup, "expert_map", None)
    return None if make is None else make(shape)


# Token count swept -> the groups (block_m, naive, QDQ of the hidden states in the w13 GEMM;
# with naive blocks the kernel quantizes the token's row alone, whatever block_m).
GROUPS = {
    1: [(8, True, False), (8, True, True), (16, True, True), (16, True, False)],
    8: [
        (8, False, False),
        (8, True, False),
        (8, True, True),
        (16, False, True),
        (16, True, True),
        (16, False, False),
        (16, True, False),
    ],
    32: [(8, False, False), (16, False, True), (16, False, False), (32, False, False)],
    128: [(8, False, False), (16, False, False), (32, False, False), (64, False, False)],
    256: [(16, False, False), (32, False, False), (64, False, False)],
    512: [(16, False, False), (32, False, False), (64, False, False)],
    # Counts swept only when asked (--tokens): each a bucket of its own in the table it writes.
    2048: [(32, False, False), (64, False, False), (128, False, False)],
    8192: [(32, False, False), (64, False, False), (128, False, False)],
}
# Bucket bound (largest token count) -> (token count swept, groups it may pick). Naive blocks
# (no moe_align_block_size) only where the kernel module allows them (few tokens per expert).
BUCKETS = {
    4: (1, GROUPS[1]),
    16: (8, [g for g in GROUPS[8] if not g[1]]),
    64: (32, GROUPS[32]),
    128: (128, GROUPS[128]),
    256: (256, GROUPS[256]),
    1 << 62: (512, GROUPS[512]),
}
# The counts a sweep of every bucket times (the default); 2048 and 8192 only when asked.
SWEPT = [t for t, _ in BUCKETS.values()]
# Every token block a group may take: each is aligned for every case (Case.aligned), and each
# has candidate tiles for both GEMMs (W13, W2).
BLOCK_MS = sorted({bm for groups in GROUPS.values() for bm, _, _ in groups})
# A group that quantize-dequantizes the hidden states in a pass of its own pays one more small
# kernel (the patch's QDQ pass), not timed here: count it as this much.
SEPARATE_QDQ_US = 4.0
# Candidate tiles (block_n, block_k, num_warps, num_stages) per token block. Every tile has
# the kernel's one K step (GEMM_BLOCK_K = 128: a token's output is then the same bits in any
# batch); deeper steps spilled registers on sm_90 (ptxas -v), shallower ones were slower up to
# 128 tokens on an H200.
BLOCK_K = 128


def _tiles(*tiles: tuple[int, int, int]) -> list[tuple[int, ...]]:
    return [(block_n, BLOCK_K, warps, stages) for block_n, warps, stages in tiles]


# Narrow programs (one to four warps) won at every size on an H200 (2026-12-01 sweeps), with four
# stages up to 256 tokens for most tiles (six and eight were slower everywhere), and blocks of 8
# tokens up to 64 tokens; the wide ones stay as candidates for other GPUs.
W13 = {
    8: _tiles((16, 1, 3), (16, 1, 4), (32, 1, 4), (32, 2, 3), (32, 2, 4), (64, 2, 4), (64, 4, 3)),
    16: _tiles(
        (16, 1, 3),
        (16, 1, 4),
        (32, 1, 3),
        (16, 2, 3),
        (32, 2, 2),
        (32, 2, 3),
        (32, 2, 4),
        (64, 2, 3),
        (64, 2, 4),
        (64, 4, 3),
        (128, 8, 3),
    ),
    32: _tiles(
        (32, 1, 3),
        (32, 1, 4),
        (32, 2, 3),
        (64, 2, 2),
        (64, 2, 3),
        (64, 2, 4),
        (32, 4, 3),
        (64, 4, 3),
        (128, 4, 3),
        (128, 4, 4),
        (128, 8, 3),
    ),
    64: _tiles((32, 4, 3), (64, 4, 3), (64, 2, 3), (128, 8, 2), (128, 8, 3)),
    128: _tiles((64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 3), (128, 8, 4)),
}
W2 = {
    8: _tiles((32, 1, 4), (32, 2, 4), (64, 1, 4), (64, 2, 3), (64, 2, 4), (128, 2, 4), (128, 4, 3)),
    16: _tiles(
        (32, 2, 3),
        (32, 1, 4),
        (64, 2, 3),
        (64, 2, 4),
        (128, 2, 3),
        (32, 1, 3),
        (64, 1, 3),
        (128, 4, 3),
        (64, 4, 3),
    ),
    32: _tiles(
        (32, 1, 3),
        (64, 1, 3),
        (32, 2, 3),
        (64, 2, 3),
        (64, 2, 4),
        (128, 2, 3),
        (64, 4, 3),
        (128, 4, 3),
        (128, 4, 4),
    ),
    64: _tiles((64, 4, 3), (64, 2, 3), (128, 4, 3), (128, 8, 3)),
    128: _tiles((64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 3), (128, 8, 4)),
}

# --wide adds these tiles to the sweep (one K step still): more warps over 16 rows for the
# latency-bound 1-token GEMMs, and wider or deeper programs for the shapes whose 512-token
# cells the tiles above left slower than Marlin (top-1 over few experts; small intermediate
# sizes at TP4/TP8). Not in the default sweep: they add about 40% more timings.
WIDE_W13 = {
    8: _tiles((16, 2, 4), (16, 4, 4)),
    16: _tiles((16, 4, 4), (128, 4, 4)),
    32: _tiles((64, 8, 3), (128, 8, 4), (256, 8, 3)),
    64: _tiles((64, 4, 4), (128, 4, 3), (128, 4, 4), (256, 8, 3)),
}
WIDE_W2 = {
    8: _tiles((16, 1, 4), (16, 2, 4), (32, 4, 4)),
    16: _tiles((128, 4, 4), (256, 8, 3)),
    32: _tiles((64, 4, 4), (128, 8, 3), (256, 8, 3)),
    64: _tiles((64, 4, 4), (128, 4, 4), (128, 8, 4), (256, 8, 3)),
}


def widen() -> None:
    """--wide: the WIDE_ tiles join each token block's candidates."""
    for tiles, extra in ((W13, WIDE_W13), (W2, WIDE_W2)):
        for bm, more in extra.items():
            tiles[bm] = list(dict.fromkeys(tiles[bm] + more))


def three_stages() -> None:
    """--three-stages: beside each tile of blocks of 8 tokens with four stages, its twin with
    three. Where K is one or two steps (a shallow w2), the stages have little to overlap and
    their shared memory limits the programs an SM holds: w2's 64-row tile on one warp at four
    stages holds 19,968 bytes on sm_90 (11 programs an SM), at three 13,312 (14, then bound by
    its registers); on an H100 (2026-12-07) a twin was w2's 32-token pick in six of the 12
    released layers swept. Blocks of 8 only: ROCm runs none (platform_min_block_m)."""
    for tiles in (W13, W2):
        twins = [(n, k, w, 3, *more) for n, k, w, s, *more in tiles[8] if s == 4]
        tiles[8] = list(dict.fromkeys(tiles[8] + twins))


def split_gate_up() -> None:
    """--split-gate-up: beside each w13 tile with one warp for each 16 rows (gate and up rows in
    each warp), the same tile with the gate and up rows in one product and twice the warps, a
    warp for each 16 rows of one of them (patch 0002's split_gate_up: half each warp's walk
    over K, for the latency-bound 1-token GEMM; the same bits)."""
    for bm, tiles in W13.items():
        more: list[tuple[int, ...]] = [
            (n, k, 2 * w, s, True) for n, k, w, s in tiles if w == n // 16
        ]
        W13[bm] = list(dict.fromkeys(tiles + more))


def keep_blocks_from(least: int) -> None:
    """Only the groups whose token block the platform runs (the kernel module's
    platform_min_block_m: ROCm's 16): it raises a smaller block to that at run time, so a
    timing at the smaller one would be of a tile that never runs."""
    for t, groups in GROUPS.items():
        GROUPS[t] = [g for g in groups if g[0] >= least]
    for bound, (t, groups) in BUCKETS.items():
        BUCKETS[bound] = (t, [g for g in groups if g[0] >= least])


def rocm_tiles(generic: dict) -> None:
    """ROCm's configuration: beside each tile its twin with two stages (the AMD pipeliner
    holds the stages in registers: three leave 8 of the 40 configurations of ROCm's table at
    one wave per SIMD on gfx942 and 21 on gfx950, benchmarks/results/rocm_table_isa.md), and
    the tiles of ROCm's generic table ``generic`` (the kernel module's MoeConfig by bucket),
    so that a sweep can keep them or beat them."""
    for tiles in (W13, W2):
        for bm, some in tiles.items():
            twins = [(n, k, w, 2, *more) for n, k, w, _, *more in some]
            tiles[bm] = list(dict.fromkeys(some + twins))
    for config in generic.values():
        _, bm, _, w13, w2 = config_tuple(config)
        for tiles, tile in ((W13, w13), (W2, w2)):
            tiles[bm] = list(dict.fromkeys([*tiles.get(bm, []), tile]))


def platform_candidates(module, platform: str) -> None:
    """The candidates as the kernel module ``module`` runs them on ``platform``: its token
    blocks (keep_blocks_from), and on ROCm the tiles' two-stage twins and ROCm's generic
    table's tiles (rocm_tiles)."""
    keep_blocks_from(module.platform_min_block_m(platform))
    if platform == "rocm":
        rocm_tiles(module.GENERIC_CONFIGS["rocm"])


KERNEL_MODULE = "vllm.model_executor.layers.fused_moe.experts.nvfp4_emulation_moe"


def load_kernel_module(tree: Path) -> types.ModuleType:
    moe_setup.import_vllm(tree)
    return importlib.import_module(KERNEL_MODULE)


K: types.ModuleType  # the kernel module, set by main() and by each compile process


def align(topk_ids: torch.Tensor, block_m: int, num_experts: int, emap=None):
    """moe_align_block_size as the experts call vLLM's wrapper, through the stand-in op (same
    buffers): with an expert map every pair is aligned, then the blocks of other ranks'
    experts are named -1 (w2 writes their pairs as zeros, which the top-k sum needs).
    The op itself would drop those pairs, leaving their rows of the per-pair output unwritten."""
    numel = topk_ids.numel()
    padded = numel + num_experts * (block_m - 1)
    if numel < num_experts:
        padded = min(numel * block_m, padded)
    dev = topk_ids.device
    sorted_ids = torch.empty(padded, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(triton.cdiv(padded, block_m), dtype=torch.int32, device=dev)
    post_pad = torch.empty(1, dtype=torch.int32, device=dev)
    standins.moe_align_block_size(
        topk_ids, num_experts, block_m, sorted_ids, expert_ids, post_pad, None
    )
    if emap is not None:
        expert_ids = emap[expert_ids.long()]
    return sorted_ids, expert_ids, post_pad


def aligned_ids(topk_ids, block_m, experts, emap, aligned=None):
    """align's blocks, or aligned[block_m] where given (aligned before: Case.aligned, so that
    a timing leaves the alignment out, as the sweep of buckets does)."""
    if aligned is not None:
        return aligned[block_m]
    return align(topk_ids, block_m, experts, emap)


def fused_forward(moe, hidden, topk_weights, topk_ids, cfg, experts, emap, aligned=None):
    """The MoE as Nvfp4QuantizationEmulationTritonExperts.apply runs it (the QDQ pass for the
    hidden states where the config does not fuse it); experts: E (the router's), emap: the
    expert map of an expert-parallel shape (naive blocks then aligned, as apply does);
    aligned: aligned_ids'."""
    tokens, top_k = topk_ids.shape
    pairs = tokens * top_k
    if cfg.naive and emap is None:
        sorted_ids, expert_ids, post_pad = None, topk_ids.view(-1), None
    else:
        sorted_ids, expert_ids, post_pad = aligned_ids(
            topk_ids, cfg.block_m, experts, emap, aligned
        )
    a1 = hidden if cfg.fuse_a1_qdq else K.invoke_nvfp4_qdq(hidden, moe.a13_gscale)
    act = torch.empty(pairs, moe.w2.size(2) * 2, dtype=hidden.dtype, device=hidden.device)
    K.invoke_nvfp4_moe_gemm(
        a1,
        moe.a13_gscale,
        moe.w13,
        moe.w13_scale,
        moe.w13_gscale,
        act,
        moe.a2_gscale,
        None,
        sorted_ids,
        expert_ids,
        post_pad,
        pairs,
        top_k,
        True,
        cfg.block_m,
        cfg.w13,
        quantize_a=cfg.fuse_a1_qdq,
        **layout_kwargs(),
    )
    out = torch.empty(tokens, top_k, hidden.size(1), dtype=hidden.dtype, device=hidden.device)
    K.invoke_nvfp4_moe_gemm(
        act,
        moe.a2_gscale,
        moe.w2,
        moe.w2_scale,
        moe.w2_gscale,
        out.view(pairs, -1),
        None,
        topk_weights,
        sorted_ids,
        expert_ids,
        post_pad,
        pairs,
        1,
        False,
        cfg.block_m,
        cfg.w2,
        **layout_kwargs(),
    )
    summed = torch.empty(tokens, hidden.size(1), dtype=hidden.dtype, device=hidden.device)
    K.invoke_topk_sum(out, summed)
    return summed


# --predecode: the routed pairs per expert of the layer swept, and the candidate tiles of the
# predecoded GEMMs (block_m, w13 tile, w2 tile; each tile's K step divides 64, half of the fused
# kernel's K step, and w13's rows are whole steps of 128: the kernel module refuses others).
# The first is CUDA's generic one, the fourth ROCm's (the second was ROCm's until 2026-12-05).
# w13 over 256 rows at three stages is not one (it was until 2026-12-05): it asks for 240 KiB of
# shared memory, where an H100's or H200's block has 227 KiB (every CUDA sweep's timing of it
# failed), and spills VGPRs on gfx942 and gfx950, whose LDS (64, 160 KiB) it overflows too.
PREDECODE_PAIRS = (64, 128, 256, 512, 1024)
PREDECODE_TILES = [
    (128, (128, 64, 8, 3), (128, 64, 4, 3)),
    (128, (128, 64, 8, 2), (128, 64, 4, 2)),
    (128, (128, 64, 8, 4), (128, 64, 4, 4)),
    (128, (128, 32, 8, 3), (128, 32, 4, 3)),
    (128, (128, 64, 4, 3), (64, 64, 4, 3)),
    (128, (128, 64, 8, 3), (256, 64, 8, 3)),
    (64, (128, 64, 4, 3), (128, 64, 4, 3)),
]
# The threshold written where no count swept was faster predecoded: no call reaches it.
PREDECODE_NEVER = 1 << 40


def predecode_config(pairs: int, tiles: tuple):
    """PREDECODE_TILES' entry with a threshold of `pairs` pairs an expert, as the kernel
    module's PredecodeConfig."""
    block_m, w13, w2 = tiles
    return K.PredecodeConfig(pairs, block_m, K.GemmConfig(*w13), K.GemmConfig(*w2))


def predecoded_forward(moe, hidden, topk_weights, topk_ids, config, experts, emap, aligned=None):
    """The MoE as Nvfp4QuantizationEmulationTritonExperts._apply_predecoded runs it with the
    kernel module's PredecodeConfig `config`: each GEMM's weights (tiled, fast scales: laid_out)
    decoded once into one buffer, plain GEMMs over blocks of config.block_m pairs; aligned:
    aligned_ids'."""
    tokens, top_k = topk_ids.shape
    pairs = tokens * top_k
    ptx = K.use_ptx_decode() and hidden.dtype == torch.bfloat16
    sorted_ids, expert_ids, post_pad = aligned_ids(topk_ids, config.block_m, experts, emap, aligned)
    a1 = K.invoke_nvfp4_qdq(hidden, moe.a13_gscale)
    a1 = a1.index_select(1, K.gemm_order(hidden.size(1), hidden.device))
    dtype = torch.bfloat16 if ptx else torch.float16
    buffer = torch.empty(moe.w13.numel() * 2, dtype=dtype, device=hidden.device)
    act = torch.empty(pairs, moe.w2.size(2) * 2, dtype=hidden.dtype, device=hidden.device)
    d = K.predecode_nvfp4_weights(moe.w13, moe.w13_scale, buffer, ptx, True)
    K.invoke_predecoded_moe_gemm(
        a1, moe.a13_gscale, d, moe.w13_gscale, act, moe.a2_gscale, None, sorted_ids, expert_ids,
        post_pad, pairs, top_k, True, config.block_m, config.w13, ptx, True,
    )  # fmt: skip
    out = torch.empty(tokens, top_k, hidden.size(1), dtype=hidden.dtype, device=hidden.device)
    d = K.predecode_nvfp4_weights(moe.w2, moe.w2_scale, buffer, ptx, True)
    K.invoke_predecoded_moe_gemm(
        act, moe.a2_gscale, d, moe.w2_gscale, out.view(pairs, -1), None, topk_weights,
        sorted_ids, expert_ids, post_pad, pairs, 1, False, config.block_m, config.w2, ptx,
        False,
    )  # fmt: skip
    summed = torch.empty(tokens, hidden.size(1), dtype=hidden.dtype, device=hidden.device)
    K.invoke_topk_sum(out, summed)
    return summed


def predecode_tokens(shape: moe_setup.MoeShape, pairs_per_expert: int) -> int:
    """The token count that routes at least pairs_per_expert pairs to each of the layer's
    experts on average (the count the kernel module's rule compares: over all its experts)."""
    return -(-pairs_per_expert * shape.experts // shape.top_k)


def predecode_pick(
    fused_us: dict[int, float], predecoded_us: dict[tuple, dict[int, float]]
) -> tuple[tuple, int]:
    """(tiles, threshold) from the whole layer's µs at each pairs-an-expert count swept:
    fused_us[count], predecoded_us[tiles][count] (inf: failed). The tiles: the least sum over
    the counts (the first of equals). The threshold: the least count from which those tiles
    are faster than the fused layer at every count above it swept too; PREDECODE_NEVER where
    they are not faster at the largest."""
    counts = sorted(fused_us)
    tiles = min(predecoded_us, key=lambda t: sum(predecoded_us[t][c] for c in counts))
    threshold = PREDECODE_NEVER
    for count in reversed(counts):
        if not predecoded_us[tiles][count] < fused_us[count]:
            break
        threshold = count
    return tiles, threshold


class Case:
    """One shape and token count: weights, routing, aligned ids, static buffers."""

    def __init__(
        self, moe: Nvfp4Moe, shape: moe_setup.MoeShape, tokens: int, rows: Nvfp4Moe
    ) -> None:
        # moe: as the GEMMs read it (laid_out); rows: the checkpoint's, for the reference.
        self.moe, self.shape, self.tokens, self.rows = moe, shape, tokens, rows
        self.hidden, self.tw, self.tids = moe_setup.random_inputs(tokens, shape, seed=tokens)
        # An expert-parallel layer waits for its slowest rank: tune the rank that routes the
        # most of its experts (rank 0's routing may hold none of a decode token's experts).
        self.rank = moe_setup.busiest_rank(shape, self.tids)
        self.tids = moe_setup.rank_routing(shape, self.tids, self.rank)
        self.emap = expert_map(shape)
        # The w13 GEMM's input where the hidden states are quantized in a pass of their own.
        self.hidden_q = K.invoke_nvfp4_qdq(self.hidden, moe.a13_gscale)
        self.pairs = tokens * shape.top_k
        self.act = torch.randn(self.pairs, shape.intermediate, device="cuda").to(torch.bfloat16)
        self.act_out = torch.empty_like(self.act)
        self.y = torch.empty(self.pairs, shape.hidden, dtype=torch.bfloat16, device="cuda")
        self.aligned = {bm: align(self.tids, bm, shape.experts, self.emap) for bm in BLOCK_MS}

    def gemm(self, kind, bm, naive, qdq, tile):
        m, g = self.moe, K.GemmConfig(*tile)
        if naive and self.emap is None:
            sorted_ids, expert_ids, post_pad = None, self.tids.view(-1), None
        else:
            sorted_ids, expert_ids, post_pad = self.aligned[bm]
        if kind == "w13":
            a = self.hidden if qdq else self.hidden_q
            return lambda: K.invoke_nvfp4_moe_gemm(
                a,
                m.a13_gscale,
                m.w13,
                m.w13_scale,
                m.w13_gscale,
                self.act_out,
                m.a2_gscale,
                None,
                sorted_ids,
                expert_ids,
                post_pad,
                self.pairs,
                self.shape.top_k,
                True,
                bm,
                g,
                quantize_a=qdq,
                **layout_kwargs(),
            )
        return lambda: K.invoke_nvfp4_moe_gemm(
            self.act,
            m.a2_gscale,
            m.w2,
            m.w2_scale,
            m.w2_gscale,
            self.y,
            None,
            self.tw,
            sorted_ids,
            expert_ids,
            post_pad,
            self.pairs,
            1,
            False,
            bm,
            g,
            **layout_kwargs(),
        )


def laid_out(moe: Nvfp4Moe) -> Nvfp4Moe:
    """Copies of ``moe``'s weights and scales in the layout the experts'
    process_weights_after_loading gives them (the tiles of the kernel module's
    tile_nvfp4_weights), which the GEMMs then read; as it is for a module without tiles."""
    if not hasattr(K, "tile_nvfp4_weights"):
        return moe
    out = moe_setup.weight_copies(moe)
    for w, scale in ((out.w13, out.w13_scale), (out.w2, out.w2_scale)):
        # moe_setup's block scales are E4M3 normals: the hook would record fast scales.
        assert not hasattr(K, "fast_nvfp4_scales") or K.fast_nvfp4_scales(w, scale)
        K.tile_nvfp4_weights(w, scale)
    return out


def layout_kwargs() -> dict[str, bool]:
    """invoke_nvfp4_moe_gemm's layout arguments for weights from ``laid_out``."""
    kwargs = {"tiled": True} if hasattr(K, "tile_nvfp4_weights") else {}
    if hasattr(K, "fast_nvfp4_scales"):
        kwargs["fast_scales"] = True
    return kwargs


def group_candidates(groups: list[tuple]) -> list[tuple]:
    """(gemm, block_m, naive, qdq, tile) of each GEMM the groups time (w13's candidates and
    w2's; the QDQ of the hidden states is w13's alone: False for w2)."""
    found = []
    for bm, naive, qdq in groups:
        found += [("w13", bm, naive, qdq, g) for g in W13[bm]]
        found += [("w2", bm, naive, False, g) for g in W2[bm]]
    return list(dict.fromkeys(found))


def every_candidate(tokens: list[int]) -> list[tuple]:
    """group_candidates of the groups of every token count in tokens."""
    return list(dict.fromkeys(c for t in tokens for c in group_candidates(GROUPS[t])))


# Candidates a sweep leaves out (group_candidates' keys): with ROCm's configuration forced, those
# that break ROCm's ISA rules on gfx942 or gfx950 (rocm_isa_rules).
RULED_OUT: set[tuple] = set()


def tiles_for(kind: str, bm: int, naive: bool, qdq: bool) -> list[tuple[int, ...]]:
    """The tiles a group times for one GEMM, those RULED_OUT left out."""
    tiles, qdq = (W13[bm], qdq) if kind == "w13" else (W2[bm], False)
    return [g for g in tiles if (kind, bm, naive, qdq, g) not in RULED_OUT]


def predecode_candidates(entries: list[tuple]) -> list[tuple]:
    """group_candidates' keys of the predecoded GEMMs of PREDECODE_TILES-like entries
    (gemm "predecoded w13" or "predecoded w2", not naive, no QDQ inside)."""
    return list(
        dict.fromkeys(
            (f"predecoded {kind}", bm, False, False, tile)
            for bm, w13, w2 in entries
            for kind, tile in (("w13", w13), ("w2", w2))
        )
    )


def predecode_tiles() -> list[tuple]:
    """PREDECODE_TILES but those whose GEMMs are RULED_OUT."""
    return [e for e in PREDECODE_TILES if not RULED_OUT.intersection(predecode_candidates([e]))]


# ROCm's ISA rules (benchmarks/rocm_table_isa.py --candidates: every candidate compiled for
# gfx942 and gfx950 on a CPU machine; broken: a VGPR spill, scratch, no MFMA, fewer than two
# waves per SIMD, or more LDS than the target has), for the kernels file whose sha256 it names.
ROCM_CANDIDATES = REPO / "benchmarks" / "results" / "rocm_tile_candidates.json"
KERNELS_FILE = "vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_kernels.py"
WRITE_CANDIDATES = "python benchmarks/rocm_table_isa.py --candidates (--wide for a --wide sweep)"


def kernels_sha256(tree: Path) -> str:
    """The sha256 of the kernels file of a vLLM tree (or of an overlay: the same paths)."""
    return hashlib.sha256((tree / KERNELS_FILE).read_bytes()).hexdigest()


def candidate_key(row: dict) -> tuple:
    """A row of the candidates file as group_candidates' key."""
    return (row["gemm"], row["block_m"], row["naive"], row["qdq_a"], tuple(row["tile"]))


def rocm_isa_rules(tree: Path, wanted: list[tuple], path: Path = ROCM_CANDIDATES) -> set[tuple]:
    """The candidates of ``wanted`` that break ROCm's ISA rules on gfx942 or gfx950, as the
    file at ``path`` has them compiled from this tree's kernels. Stops in one line where the
    file is missing or unreadable, was compiled from other kernels (another sha256), or has no
    facts of a candidate wanted: a sweep must not pick a tile nobody compiled for an AMD GPU."""
    where = f"tune_nvfp4_moe: {path}"
    try:
        document = json.loads(path.read_text())
        sha256 = document["kernels_sha256"]
        rows = {candidate_key(row): bool(row["broken"]) for row in document["candidates"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"{where}: no ROCm ISA facts to read ({exc!r}); write them with {WRITE_CANDIDATES}"
        ) from None
    try:
        own = kernels_sha256(tree)
    except OSError as exc:
        raise SystemExit(f"tune_nvfp4_moe: {tree}: no kernels file to judge ({exc!r})") from None
    if sha256 != own:
        raise SystemExit(
            f"{where}: compiled from other kernels (sha256 {str(sha256)[:12]}, this tree's"
            f" {own[:12]}); write it again with {WRITE_CANDIDATES}"
        )
    missing = [c for c in wanted if c not in rows]
    if missing:
        raise SystemExit(
            f"{where}: no ISA facts of {len(missing)} candidates (the first: {missing[0]});"
            f" write it again with {WRITE_CANDIDATES}"
        )
    return {c for c in wanted if rows[c]}


def refuse_empty_buckets(tokens: list[int], predecode: bool) -> None:
    """Stop in one line where RULED_OUT leaves a token count swept (or the predecode sweep)
    without a group whose two GEMMs both keep a tile: there would be nothing to pick."""
    if predecode:
        empty = [] if predecode_tiles() else ["the predecoded GEMMs"]
    else:
        empty = [
            f"{t} tokens"
            for t in tokens
            if not any(
                tiles_for("w13", bm, naive, qdq) and tiles_for("w2", bm, naive, qdq)
                for bm, naive, qdq in GROUPS[t]
            )
        ]
    if empty:
        raise SystemExit(
            f"tune_nvfp4_moe: ROCm's ISA rules leave no candidate for {', '.join(empty)}"
        )


def all_tasks(shapes: list[moe_setup.MoeShape], tokens: list[int]) -> list[tuple]:
    tasks = []
    for shape in shapes:
        for t in tokens:
            tasks += [
                (shape.name, t, *c) for c in group_candidates(GROUPS[t]) if c not in RULED_OUT
            ]
    return list(dict.fromkeys(tasks))


def make_cases(names, tokens) -> dict:
    cases = {}
    for name in names:
        shape = shape_named(name)
        rows = moe_setup.make_moe(shape)
        moe = laid_out(rows)
        for t in tokens:
            cases[shape.name, t] = Case(moe, shape, t, rows)
    return cases


def shape_cases(shape: moe_setup.MoeShape, tokens: list[int]) -> dict:
    """make_cases for one shape, saying how much GPU memory building them took at its peak,
    beside case_bytes' bound."""
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    cases = make_cases([shape.name], tokens)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    bound = case_bytes(shape, tokens) / 2**30
    print(f"{shape.name}: {peak:.2f} GiB at the peak of building (bound {bound:.2f})", flush=True)
    return cases


# A process's own GPU memory beside its cases: its CUDA context, torch's and Triton's.
PROCESS_BYTES = 1 << 30


def case_bytes(shape: moe_setup.MoeShape, tokens: list[int]) -> int:
    """An upper bound on the GPU memory make_cases([shape.name], tokens) holds at its peak:
    twice the NVFP4 weights with their E4M3 block scales (the checkpoint's rows and laid_out's
    copy), eight times one expert's w13 (the relayout's temporaries, one expert at a time),
    and each Case's inputs, outputs and aligned ids."""
    e, h, i = held_experts(shape), shape.hidden, shape.intermediate
    buffers = sum(
        t * 4 * h + t * shape.top_k * (4 * i + 2 * h + 8) + (16 << 20)  # 16 MiB: the ids
        for t in tokens
    )
    return 2 * nvfp4_bytes(e, h, i) + 8 * i * h + buffers


def variant_key(task: tuple) -> tuple:
    """What a compiled GEMM variant depends on besides its candidate: the GEMM, whether its
    depth has a masked step and how wide (the depth's remainder after whole K steps),
    the top-k w13 reads its rows by (a constexpr; w2's is 1), and whether the GPU holds
    every expert (an expert-parallel rank runs a naive candidate on aligned blocks: Case.gemm).
    Token counts, sizes and expert counts are not specialized on."""
    name, _, kind, *candidate = task
    shape = shape_named(name)
    depth = shape.hidden if kind == "w13" else shape.intermediate
    top_k = shape.top_k if kind == "w13" else 1
    every_expert = held_experts(shape) == shape.experts
    return (kind, depth % K.GEMM_BLOCK_K, top_k, every_expert, *candidate)


def compile_variants(tasks: list[tuple]) -> list[tuple]:
    """One task for each variant_key, on the shape and token count that take the least
    memory to build (case_bytes)."""
    cheapest = sorted(tasks, key=lambda t: case_bytes(shape_named(t[0]), [t[1]]))
    variants: dict[tuple, tuple] = {}
    for task in cheapest:
        variants.setdefault(variant_key(task), task)
    return list(variants.values())


def compile_some(tree: Path, tasks: list[tuple]) -> None:
    global K
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the parent stops us
    K = load_kernel_module(tree)
    for name in sorted({t[0] for t in tasks}):  # one shape's weights on the GPU at a time
        mine = [t for t in tasks if t[0] == name]
        cases = make_cases([name], sorted({t[1] for t in mine}))
        for _, t, kind, bm, naive, qdq, tile in mine:
            try:
                cases[name, t].gemm(kind, bm, naive, qdq, tile)()
            except Exception as e:  # reported again by the timing pass
                print("compile failed", name, t, kind, bm, tile, repr(e)[:300], flush=True)
        torch.cuda.synchronize()
        del cases
        torch.cuda.empty_cache()


def free_gpu_bytes() -> int:
    return torch.cuda.mem_get_info()[0]


def compile_jobs(jobs: int, need: int, free: int) -> int:
    """How many of ``jobs`` compile processes fit in ``free`` bytes of GPU memory when each
    holds up to ``need`` bytes of cases (and PROCESS_BYTES of its own); at least one."""
    return max(1, min(jobs, free // (need + PROCESS_BYTES)))


def compile_all(tree: Path, variants: list[tuple], jobs: int) -> None:
    """Compile each variant once, in up to ``jobs`` processes, as many as the GPU's free
    memory holds. Stopped (Ctrl-C, kill, an error), the processes still compiling are killed:
    none is left on the GPU."""
    if not variants:
        return
    shapes = {t[0] for t in variants}
    need = max(
        case_bytes(shape_named(n), sorted({t[1] for t in variants if t[0] == n})) for n in shapes
    )
    free = free_gpu_bytes()
    fit = compile_jobs(min(jobs, len(variants)), need, free)
    if fit < min(jobs, len(variants)):
        print(
            f"compile processes: {fit} of {jobs}, each holding up to {need / 2**30:.1f} GiB of"
            f" weights and buffers ({free / 2**30:.1f} GiB of the GPU free)",
            flush=True,
        )
    jobs = fit
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=compile_some, args=(tree, variants[i::jobs])) for i in range(jobs)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    finally:
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                p.kill()
                p.join()


_FLUSH: torch.Tensor | None = None


def time_graph(fn, reps: int = 20) -> float:
    """Median µs of a CUDA graph replay of fn, the L2 flushed before each replay."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = l2_flush_buffer()
    return time_us(fn, reps, graph=True, flush=_FLUSH)


def pick(results: dict, shapes: list[str], t: int, groups: list[tuple]):
    def us(shape, kind, bm, naive, qdq, tile):
        return results[shape, t, kind, bm, naive, qdq if kind == "w13" else False, tile]

    options = []
    for bm, naive, qdq in groups:
        chosen = {}
        if not tiles_for("w13", bm, naive, qdq) or not tiles_for("w2", bm, naive, qdq):
            continue  # every tile of a GEMM RULED_OUT: the group is not an option
        for kind in ("w13", "w2"):
            tiles = tiles_for(kind, bm, naive, qdq)
            floor = {sh: min(us(sh, kind, bm, naive, qdq, g) for g in tiles) for sh in shapes}
            cost = {
                g: sum(us(sh, kind, bm, naive, qdq, g) / floor[sh] for sh in shapes) for g in tiles
            }
            chosen[kind] = min(tiles, key=cost.__getitem__)
        totals = {
            sh: us(sh, "w13", bm, naive, qdq, chosen["w13"])
            + us(sh, "w2", bm, naive, qdq, chosen["w2"])
            + (0.0 if qdq else SEPARATE_QDQ_US)
            for sh in shapes
        }
        options.append((totals, (naive, bm, qdq, chosen["w13"], chosen["w2"])))
    floor = {sh: min(o[0][sh] for o in options) for sh in shapes}
    return min(options, key=lambda o: sum(o[0][sh] / floor[sh] for sh in shapes))


def pick_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """A pick's layer against exact W4A4: the relative Frobenius error; where the reference is
    all zeros (an expert-parallel rank that holds none of the tokens' experts) 0.0 for zeros and
    inf for anything else."""
    got, want = got.float(), want.float()
    if not want.any():
        return 0.0 if not got.any() else math.inf
    return ((got - want).norm() / want.norm()).item()


def pick_row(shape: moe_setup.MoeShape, c: Case, bound: int, us: float, choice: tuple) -> dict:
    """A pick as tune.json keeps it: its bucket, count and tiles, the GEMMs' time ``us``, and
    the layer's error against exact W4A4 with those tiles on case c (pick_error)."""
    naive, bm, qdq, w13, w2 = choice
    got = fused_forward(c.moe, c.hidden, c.tw, c.tids, moe_config(choice), shape.experts, c.emap)
    tw, tids = c.tw, c.tids
    if c.emap is not None:  # the ids and weights the rank's experts see
        local_routing = getattr(moe_setup, "local_routing", None)
        assert local_routing is not None  # moe_setup's expert_map comes with it
        tw, tids = local_routing(shape, tw, tids)
    want = nvfp4_moe_reference(c.rows, c.hidden, tw, tids, exact=True)
    row = dict(
        bucket=bound,
        shape=shape.name,
        tokens=c.tokens,
        naive=naive,
        block_m=bm,
        qdq_a=qdq,
        w13=w13,
        w2=w2,
        gemms_us=us,
        rel_err=pick_error(got, want),
    )
    if moe_setup.ranks(shape) > 1:  # which rank's routing the picks were timed on
        row.update(rank=c.rank, active_experts=moe_setup.active_experts(shape, c.tids))
    return row


def pick_line(p: dict) -> str:
    """One pick, as the sweep prints it; an expert-parallel shape's names the rank it was timed
    on and how many of that rank's experts the tokens route."""
    rank = f" (EP rank {p['rank']}: {p['active_experts']} experts routed)" if "rank" in p else ""
    return (
        f"<= {p['bucket']:>19} {p['shape']:18s} t={p['tokens']:4d} naive={int(p['naive'])} "
        f"bm={p['block_m']} qdq={int(p['qdq_a'])} w13 {p['w13']} w2 {p['w2']}: both GEMMs "
        f"{p['gemms_us']:7.1f} us, rel err {p['rel_err']:.1e}{rank}"
    )


def refuse_wrong_picks(picks: list[dict]) -> None:
    """Stop, in one line and before any table is written, where a pick's layer is not within
    REL_FROBENIUS of exact W4A4 (NaN included): a table must not ship a tile that computes
    something else."""
    wrong = [p for p in picks if not p["rel_err"] < REL_FROBENIUS]
    if wrong:
        cells = ", ".join(
            f"{p['shape']} at {p['tokens']} tokens ({p['rel_err']:.1e})" for p in wrong
        )
        raise SystemExit(
            f"tune_nvfp4_moe: picks off exact W4A4 by {REL_FROBENIUS:g} or more: {cells};"
            " no table written (the sweep's timings are in tune.json)"
        )


def config_tuple(config) -> tuple:
    """A kernel module MoeConfig as a pick: (naive, block_m, fuse_a1_qdq, w13, w2)."""
    tiles = [
        (g.block_n, g.block_k, g.num_warps, g.num_stages)
        + ((True,) if getattr(g, "split_gate_up", False) else ())
        for g in (config.w13, config.w2)
    ]
    return (config.naive, config.block_m, config.fuse_a1_qdq, *tiles)


def moe_config(choice: tuple):
    """A pick (config_tuple's) as the kernel module's MoeConfig."""
    naive, bm, qdq, w13, w2 = choice
    return K.MoeConfig(naive, bm, qdq, K.GemmConfig(*w13), K.GemmConfig(*w2))


def device_name() -> str:
    """This GPU's name as the kernel module names its table files: its own device_table_name
    where it has one ("NVIDIA_H200"; "rocm_generic" where VLLM_PATCHSET_NVFP4_PLATFORM=rocm
    forces ROCm's configuration on another GPU, the tables that configuration reads)."""
    named = getattr(sys.modules.get(K.nvfp4_moe_configs.__module__), "device_table_name", None)
    if named is not None:
        return str(named(K.nvfp4_platform()))
    return re.sub(r"[^A-Za-z0-9_-]", "_", torch.cuda.get_device_name())


def shipped_file(shape: moe_setup.MoeShape) -> Path | None:
    """The first of the kernel module's table_file_names for shape on this GPU shipped beside
    it (the shape's, then the GPU's), or None."""
    names = K.table_file_names(held_experts(shape), shape.hidden, shape.intermediate, device_name())
    return next((f for f in (Path(K.TABLES_DIR) / n for n in names) if f.is_file()), None)


def shipped_table(shape: moe_setup.MoeShape) -> tuple[dict[int, tuple], str]:
    """The table the tree's kernel module takes for shape on this GPU (the first of its
    table_file_names shipped beside it, else the platform's generic table), as picks, and where it
    came from: its file's "_tuned" note (with the file's name where it is the GPU's table for
    any shape)."""
    shipped = shipped_file(shape)
    if shipped is None:
        platform = K.nvfp4_platform() if hasattr(K, "GENERIC_CONFIGS") else "cuda"
        generic = getattr(K, "GENERIC_CONFIGS", {"cuda": K.CUDA_CONFIGS})[platform]
        return {b: config_tuple(c) for b, c in generic.items()}, f"the generic {platform} table"
    text = shipped.read_text()
    table = K.parse_table(text, str(shipped))
    note = str(json.loads(text).get("_tuned", "no note"))
    own = K.table_file_names(held_experts(shape), shape.hidden, shape.intermediate, device_name())
    origin = note if shipped.name == own[0] else f"{shipped.name} ({note})"
    return {bound: config_tuple(config) for bound, config in table.items()}, origin


def shipped_predecode(shape: moe_setup.MoeShape):
    """The predecode entry of the table the tree's kernel module takes for shape on this GPU
    (shipped_table's file), or None (that file has none, or there is no file)."""
    shipped = shipped_file(shape)
    return None if shipped is None else K.parse_predecode(shipped.read_text(), str(shipped))


def sweep_note(sweep: str, origin: str | None) -> str:
    """A written table's "_tuned" note: the sweep, after where the table it changes came from
    (a sweep of some token counts keeps that table's other buckets)."""
    if origin is None:
        return sweep
    return f"{origin}; then {sweep}: the buckets of the token counts swept are its picks"


def moe_configs(table: dict[int, tuple]) -> dict:
    """The picks as the kernel module's table: bucket bound -> MoeConfig."""
    return {bound: moe_config(choice) for bound, choice in table.items()}


def write_tables(
    folder: Path,
    tables: dict[str, dict[int, tuple]],
    notes: dict[str, dict],
    predecode: dict[str, object] | None = None,
) -> list[Path]:
    """Each table as the JSON file the kernel module reads (its table_json, with the notes of
    its name and its predecode entry where `predecode` has one), named as the module's
    table_file_names: the shape's, and (key "") the one for any shape of this GPU."""
    device = device_name()
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, table in tables.items():
        if name:
            shape = shape_named(name)
            file = K.table_file_names(
                held_experts(shape), shape.hidden, shape.intermediate, device
            )[0]
        else:
            file = K.table_file_names(0, 0, 0, device)[1]  # any shape of this GPU
        entry = (predecode or {}).get(name)
        text = K.table_json(
            moe_configs(table), {**notes[name], "shapes": name or "all tuned"}, entry
        )
        K.parse_table(text, file)  # what the kernel will read: refused here first
        K.parse_predecode(text, file)
        (folder / file).write_text(text)
        written.append(folder / file)
    return written


def predecode_line(
    name: str, tiles: tuple, threshold: int, fused_us: dict, predecoded_us: dict
) -> str:
    """A shape's predecode pick, as --predecode prints it."""
    start = "never" if threshold == PREDECODE_NEVER else f"from {threshold} pairs an expert"
    times = ", ".join(
        f"{c}: {fused_us[c]:.1f}/{predecoded_us[tiles][c]:.1f}" for c in sorted(fused_us)
    )
    return f"predecode {name}: {start}, tiles {tiles}; us fused/predecoded at {times}"


def refuse_other_bits(wrong: list[str]) -> None:
    """Stop, in one line and before any table is written, where predecoded tiles gave other
    bits than the fused kernel: the predecode must not change a token's output."""
    if wrong:
        raise SystemExit(
            "tune_nvfp4_moe: predecoded tiles off the fused kernel's bits: "
            + ", ".join(wrong)
            + "; no table written (the sweep's timings are in tune_predecode.json)"
        )


def sweep_predecode(
    shapes: list[moe_setup.MoeShape], args: argparse.Namespace, rows: list[dict], rules: str = ""
) -> None:
    """--predecode (the module's docstring): each eligible shape's whole layer, fused and
    predecoded with each of predecode_tiles() at PREDECODE_PAIRS pairs an expert; the picks
    printed, every timing in tune_predecode.json, and with --write-table the tables (their
    note ends with ``rules``: what ROCm's ISA rules left out, where they applied)."""
    wrong: list[str] = []
    entries, tables, origins = {}, {}, {}
    for shape in shapes:
        held = held_experts(shape)
        sizes = (shape.experts, held, shape.hidden, shape.intermediate, 2)
        if not K.predecodes(1 << 62, *sizes, predecode_config(1, PREDECODE_TILES[0])):
            print(
                f"predecode {shape.name}: not at any count (a depth not whole steps of"
                f" {K.GEMM_BLOCK_K}, or the rank's w13 above {K.PREDECODE_MAX_BYTES >> 30} GiB)",
                flush=True,
            )
            continue
        table, origins[shape.name] = shipped_table(shape)
        configs = moe_configs(table)
        rows_moe = moe_setup.make_moe(shape)
        moe = laid_out(rows_moe)
        fused_us: dict[int, float] = {}
        candidates = predecode_tiles()
        predecoded_us: dict[tuple, dict[int, float]] = {tiles: {} for tiles in candidates}
        for count in PREDECODE_PAIRS:
            t = predecode_tokens(shape, count)
            c = Case(moe, shape, t, rows_moe)
            config = K.get_nvfp4_moe_config(
                t, shape.top_k, shape.experts, K.platform_min_block_m(), configs
            )
            layer = (c.moe, c.hidden, c.tw, c.tids)
            # The alignment done before (Case.aligned): not timed, as in the sweep of buckets.
            fused = functools.partial(
                fused_forward, *layer, config, shape.experts, c.emap, c.aligned
            )
            want = fused().view(torch.int16)
            fused_us[count] = time_graph(fused)
            for tiles in candidates:
                predecoded = functools.partial(
                    predecoded_forward, *layer, predecode_config(count, tiles), shape.experts,
                    c.emap, c.aligned,
                )  # fmt: skip
                failure: dict[str, str] = {}
                try:
                    if not torch.equal(predecoded().view(torch.int16), want):
                        wrong.append(f"{shape.name} at {count} pairs an expert, tiles {tiles}")
                    us = time_graph(predecoded)
                except Exception as e:  # a tile that does not compile or run here
                    print("FAIL", shape.name, count, tiles, repr(e)[:300], flush=True)
                    us, failure = math.inf, {"error": repr(e)[:1000]}
                predecoded_us[tiles][count] = us
                rows.append(
                    dict(
                        shape=shape.name,
                        pairs_per_expert=count,
                        tokens=t,
                        tiles=tiles,
                        us=us,
                        fused_us=fused_us[count],
                        **failure,
                    )
                )
            del c, layer, fused, predecoded
            torch.cuda.empty_cache()
        tiles, threshold = predecode_pick(fused_us, predecoded_us)
        entries[shape.name] = predecode_config(threshold, tiles)
        tables[shape.name] = table
        print(predecode_line(shape.name, tiles, threshold, fused_us, predecoded_us), flush=True)
    write_timings(args.out / "tune_predecode.json", rows)
    refuse_other_bits(wrong)
    if args.write_table is not None:
        sweep = f"benchmarks/tune_nvfp4_moe.py --predecode on {torch.cuda.get_device_name()}{rules}"
        notes = {
            name: {
                "tuned": f"{origins[name]}; then {sweep}: its predecode entry",
                "torch": torch.__version__,
                "triton": triton.__version__,
            }
            for name in tables
        }
        for path in write_tables(args.write_table, tables, notes, entries):
            print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, required=True, help="vLLM tree with patch 0002")
    parser.add_argument(
        "--shapes",
        default=",".join(DEFAULT_SHAPES),
        help="comma-separated tests/gpu/moe_setup.SHAPES names, or a layer's sizes:"
        " e<E>-h<H>-i<I per GPU>-k<top-k>[-ep<N>] (default: %(default)s)",
    )
    parser.add_argument(
        "--write-table",
        type=Path,
        nargs="?",
        const=DEFAULT_TABLES,
        default=None,
        metavar="DIR",
        help=f"write the JSON tile tables into DIR (default {DEFAULT_TABLES.relative_to(REPO)})",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        default=SWEPT,
        choices=list(GROUPS),
        help="token counts to sweep (default: each bucket's, %(default)s; 2048 and 8192 only"
        " when named); the other buckets of a shape's table stay as the kernel module takes"
        " them today",
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument(
        "--jobs",
        type=int,
        default=14,
        help="compile processes at most (fewer where the GPU's free memory holds fewer)",
    )
    parser.add_argument(
        "--wide", action="store_true", help="sweep the WIDE_W13 / WIDE_W2 tiles too"
    )
    parser.add_argument(
        "--split-gate-up",
        action="store_true",
        help="sweep the w13 tiles with split_gate_up too (a warp for each 16 rows of gate or up)",
    )
    parser.add_argument(
        "--three-stages",
        action="store_true",
        help="sweep each four-stage tile of blocks of 8 tokens with three stages too",
    )
    parser.add_argument(
        "--predecode",
        action="store_true",
        help="sweep the predecoded GEMMs' tiles and threshold instead (each shape's table keeps"
        " its buckets and gets a predecode entry)",
    )
    args = parser.parse_args(argv)
    rows: list[dict] = []  # every timing so far: a run stopped early saves them
    try:
        with stops.raised():
            return sweep(args, rows)
    except (KeyboardInterrupt, BrokenPipeError) as exc:
        if isinstance(exc, BrokenPipeError):
            code, how = stops.reader_gone(), "the output's reader went away"
        else:
            code, how = stops.status(exc), "interrupted"
        kept = "nothing saved"
        if rows:
            out = args.out / ("tune_predecode.json" if args.predecode else "tune.json")
            write_timings(out, rows, stopped=True)
            kept = f"{len(rows)} timing{'s' * (len(rows) > 1)} saved in {out}"
        print(f"tune_nvfp4_moe: {how}: {kept} (no table written)", file=sys.stderr)
        return code


def write_timings(path: Path, rows: list[dict], stopped: bool = False, **more: object) -> None:
    """Every timing (and ``more``) as JSON at ``path``; ``stopped``: the sweep did not end."""
    doc = dict(device=torch.cuda.get_device_name(), results=rows, **more)
    if stopped:
        doc["stopped"] = "interrupted before the end: no pick, no table"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def sweep(args: argparse.Namespace, rows: list[dict]) -> int:
    """The sweep main() asked for; each timing appended to ``rows`` as it is taken."""
    global K
    if args.wide:
        widen()
    if args.three_stages:
        three_stages()
    if args.split_gate_up:
        split_gate_up()
    tree = args.tree.resolve()
    if not (tree / "vllm" / "__init__.py").is_file():
        raise SystemExit(f"{tree}: no vllm package here (--tree: a vLLM tree with patch 0002)")
    shapes = [shape_named(n) for n in args.shapes.split(",") if n]
    K = load_kernel_module(tree)
    if not hasattr(K, "table_json"):
        raise SystemExit(f"{tree}: patch 0002's module reads no JSON tile tables")
    if args.split_gate_up and "split_gate_up" not in K.GemmConfig.__dataclass_fields__:
        raise SystemExit(f"{tree}: patch 0002's module has no split_gate_up tile option")
    if args.predecode and not hasattr(K, "parse_predecode"):
        raise SystemExit(f"{tree}: patch 0002's module reads no predecode entry in its tables")
    platform = K.nvfp4_platform() if hasattr(K, "nvfp4_platform") else "cuda"
    if hasattr(K, "platform_min_block_m"):
        platform_candidates(K, platform)
    tokens = sorted(set(args.tokens))
    rules = ""
    if platform == "rocm":
        wanted = (
            predecode_candidates(PREDECODE_TILES) if args.predecode else every_candidate(tokens)
        )
        RULED_OUT.update(rocm_isa_rules(tree, wanted))
        refuse_empty_buckets(tokens, args.predecode)
        said = f"ROCm's ISA rules left out {len(RULED_OUT)} of {len(wanted)} candidates"
        print(said, flush=True)
        rules = f" ({said})"
    t0 = time.time()
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    if args.predecode:
        sweep_predecode(shapes, args, rows, rules)
        print(f"done in {time.time() - t0:.0f}s")
        return 0

    every_bucket = tokens == sorted(SWEPT)
    tasks = all_tasks(shapes, tokens)

    variants = compile_variants(tasks)
    compile_all(tree, variants, args.jobs)
    print(f"compiled {len(variants)} variants in {time.time() - t0:.0f}s", flush=True)

    names = [s.name for s in shapes]
    # "" -> the pick over every shape (the GPU's table); each shape -> its own pick.
    tables: dict[str, dict[int, tuple]] = {n: {} for n in names}
    origins: dict[str, str | None]
    if every_bucket:
        tables[""] = {}
        origins = {n: None for n in tables}
    else:  # the buckets not swept: as the kernel module takes them today
        shipped = {s.name: shipped_table(s) for s in shapes}
        tables = {name: table for name, (table, _) in shipped.items()}
        origins = {name: origin for name, (_, origin) in shipped.items()}
    # The buckets' swept counts, then those swept only when asked (each a bucket of its own).
    swept = list(BUCKETS.items()) + [(t, (t, GROUPS[t])) for t in tokens if t not in SWEPT]
    swept = [(bound, (t, groups)) for bound, (t, groups) in swept if t in tokens]
    results: dict[tuple, float] = {}
    picks = []
    for shape in shapes:  # one shape's weights on the GPU at a time
        cases = shape_cases(shape, tokens)
        for name, t, kind, bm, naive, qdq, tile in tasks:
            if name != shape.name:
                continue
            failure: dict[str, str] = {}  # a failed timing keeps its error in tune.json
            try:
                us = time_graph(cases[name, t].gemm(kind, bm, naive, qdq, tile))
            except Exception as e:
                print("FAIL", name, t, kind, bm, naive, qdq, tile, repr(e)[:300], flush=True)
                us, failure = float("inf"), {"error": repr(e)[:1000]}
            results[name, t, kind, bm, naive, qdq, tile] = us
            rows.append(
                dict(
                    shape=name,
                    tokens=t,
                    gemm=kind,
                    block_m=bm,
                    naive=naive,
                    qdq_a=qdq,
                    tile=list(tile),
                    us=us,
                    **failure,
                )
            )
        for bound, (t, groups) in swept:
            totals, choice = pick(results, [shape.name], t, groups)
            # A partial sweep changes the table only up to the count it measured: its pick
            # covers the counts from the bucket below up to t, the entry above t stays.
            tables[shape.name][bound if every_bucket else t] = choice
            row = pick_row(shape, cases[shape.name, t], bound, totals[shape.name], choice)
            picks.append(row)
            print(pick_line(row), flush=True)
        del cases  # the shape's tensors go before the next shape's are built
        torch.cuda.empty_cache()
    print(f"timed {len(tasks)} tasks in {time.time() - t0:.0f}s", flush=True)
    if every_bucket:
        for bound, (t, groups) in swept:
            tables[""][bound] = pick(results, names, t, groups)[1]
    write_timings(
        args.out / "tune.json",
        rows,
        picks=picks,
        tables={n or "all": {str(k): v for k, v in t.items()} for n, t in tables.items()},
    )
    refuse_wrong_picks(picks)
    if args.write_table is not None:
        options = (
            ("wide", args.wide),
            ("split-gate-up", args.split_gate_up),
            ("three-stages", args.three_stages),
        )
        flags = "".join(f" --{flag}" for flag, on in options if on)
        counts = "" if every_bucket else f" --tokens {' '.join(map(str, tokens))}"
        sweep = (
            f"benchmarks/tune_nvfp4_moe.py{flags}{counts} on {torch.cuda.get_device_name()}{rules}"
        )
        notes = {
            name: {
                "tuned": sweep_note(sweep, origins[name]),
                "torch": torch.__version__,
                "triton": triton.__version__,
            }
            for name in tables
        }
        # A shape's table keeps the predecode entry of the table it replaces.
        kept = {s.name: shipped_predecode(s) for s in shapes}
        for path in write_tables(args.write_table, tables, notes, kept):
            print(f"wrote {path}")
    if every_bucket:
        print(K.table_json(moe_configs(tables[""])))
    print(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(stops.main(main, "tune_nvfp4_moe"))
