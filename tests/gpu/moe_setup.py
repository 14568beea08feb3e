"""One MoE layer for the GPU tests, the benchmark and the tuner, set up one way.

- the vLLM under test, picked before its first import (``import_vllm``): a pure-Python tree
  first on sys.path, or the installed vllm; vLLM's compiled ops where the package has them
  (mode ``native``), else the capture-safe stand-ins of ``standins.py`` (mode ``standin``);
- random NVFP4 weights, activation scales and routing, seeded (``make_moe``, ``random_inputs``);
- vLLM's experts and ``FusedMoEKernel`` built as a single-GPU ``FusedMoE`` layer builds them
  (``moe_config``, ``modular_kernel``, ``kernel_forward``), the workspace manager that
  ``FusedMoEKernel.apply`` takes its buffers from (``init_workspace``), and one experts'
  ``apply`` on static buffers, graph-capturable (``MoeLayer``), and ``FusedMoEKernel.apply`` on
  the same buffers (``KernelCall``);
- Marlin (W4A16) over the same NVFP4 weights, built by 0.24.0's oracle as its ModelOpt method
  builds it on Hopper (``marlin_kernel``), and the overlay's portable-path switch
  (``PORTABLE_ENV``, ``has_portable_switch``).

vLLM is imported inside the functions that use it, never when this module is imported: the
caller picks the tree and the ops first (tests/gpu/conftest.py does it for pytest, the
benchmark's and the tuner's workers call ``import_vllm``), and the CPU tests import this module
where there is no vLLM at all. Works on vLLM 0.21.0 (the nightly-like base of fix 1) and 0.24.0.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import re
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import standins
import torch
from nvfp4_reference import BLOCK, E2M1_VALUES, Nvfp4Moe, activation_global_scale

# The vLLM modules the tests import, imported once by import_vllm (see its docstring).
VLLM_MODULES = (
    "vllm.model_executor.layers.fused_moe",
    "vllm.model_executor.layers.fused_moe.oracle.nvfp4",
    "vllm.model_executor.layers.fused_moe.experts.triton_moe",
    "vllm.model_executor.layers.fused_moe.experts.nvfp4_emulation_moe",
    "vllm.v1.worker.workspace",
)


@dataclasses.dataclass(frozen=True)
class MoeShape:
    """One MoE layer as one GPU holds it: E experts in all (the router's), hidden size, the
    intermediate size of this GPU's shard, top-k; ``local_experts`` where expert parallelism
    leaves this GPU only some of the E experts (0: all of them), ``checkpoint`` and ``shard``
    where the shape comes from a released checkpoint (``checkpoint_shapes``)."""

    name: str
    experts: int
    hidden: int
    intermediate: int
    top_k: int
    local_experts: int = 0
    checkpoint: str = ""
    shard: str = "whole"  # "whole", "tp2", "tp4", "tp8", "ep8"
    shared_experts: int = 0  # the checkpoint's shared experts (not in this layer: dense MLP)

    @property
    def held_experts(self) -> int:
        """The experts whose weights this GPU holds."""
        return self.local_experts or self.experts


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A released MoE checkpoint's routed-expert layer, from its published config.json:
    experts (``num_experts`` / ``n_routed_experts`` / ``num_local_experts``), hidden size,
    the experts' intermediate size (``moe_intermediate_size``), top-k, shared experts, and
    the expert-parallel degrees it is benchmarked at (E / degree local experts per GPU)."""

    name: str
    experts: int
    hidden: int
    intermediate: int
    top_k: int
    shared_experts: int = 0
    ep_degrees: tuple[int, ...] = ()


# Released NVFP4-servable MoE checkpoints (E, H, I, top-k, shared experts). A new one is a row.
CHECKPOINTS = (
    Checkpoint("qwen3-30b-a3b", 128, 2048, 768, 8),
    Checkpoint("qwen3-235b-a22b", 128, 4096, 1536, 8),
    Checkpoint("qwen3.5-397b-a17b", 512, 4096, 1024, 10, 1, ep_degrees=(8,)),
    Checkpoint("qwen3.6-35b-a3b", 256, 2048, 512, 8, 1),
    Checkpoint("deepseek-r1", 256, 7168, 2048, 8, 1, ep_degrees=(8,)),  # and DeepSeek-V3
    Checkpoint("kimi-k2", 384, 7168, 2048, 8, 1, ep_degrees=(8,)),
    Checkpoint("glm-5", 256, 6144, 2048, 8, 1),
    Checkpoint("minimax-m2.5", 256, 3072, 1536, 8),
    Checkpoint("gemma-4-26b-a4b", 128, 2816, 704, 8),
    Checkpoint("nemotron-3-nano-30b-a3b", 128, 2688, 1856, 6, 1),
    Checkpoint("llama-4-maverick", 128, 5120, 8192, 1, 1),
    Checkpoint("llama-4-scout", 16, 5120, 8192, 1, 1),
)
# Tensor-parallel degrees: each divides the intermediate size among the GPUs.
TP_DEGREES = (2, 4, 8)


def checkpoint_shapes(checkpoint: Checkpoint) -> tuple[MoeShape, ...]:
    """The layers one GPU runs of ``checkpoint``: the whole layer (name: the checkpoint's),
    each tensor-parallel shard ``-tp<N>`` whose intermediate size I / N is a multiple of 16
    (the NVFP4 block), and each expert-parallel rank ``-ep<N>`` (E / N local experts, the
    whole intermediate size)."""
    c = checkpoint

    def shape(suffix: str, intermediate: int, local: int = 0, shard: str = "whole") -> MoeShape:
        return MoeShape(
            c.name + suffix,
            c.experts,
            c.hidden,
            intermediate,
            c.top_k,
            local_experts=local,
            checkpoint=c.name,
            shard=shard,
            shared_experts=c.shared_experts,
        )

    shapes = [shape("", c.intermediate)]
    for tp in TP_DEGREES:
        if c.intermediate % (tp * BLOCK) == 0:
            shapes.append(shape(f"-tp{tp}", c.intermediate // tp, shard=f"tp{tp}"))
    for ep in c.ep_degrees:
        shapes.append(
            shape(f"-ep{ep}", c.intermediate, ep_rank_experts(c.name, c.experts, ep), f"ep{ep}")
        )
    return tuple(shapes)


def ep_rank_experts(name: str, experts: int, ep: int) -> int:
    """The E / N experts one rank of expert parallelism N holds; ValueError where the layer's
    experts do not split over N ranks (N from 2 to E, dividing E)."""
    if not 1 < ep <= experts or experts % ep:
        raise ValueError(f"{name}: {experts} experts do not split over EP{ep}")
    return experts // ep


# Every checkpoint's layers (the benchmark's and the tuner's --shapes), the first Qwen3-30B-A3B
# whole (tests/gpu/test_batch_invariance.py takes SHAPES[0]).
SHAPES = tuple(shape for c in CHECKPOINTS for shape in checkpoint_shapes(c))
# Names results and tools used before the table had checkpoints' names.
ALIASES = {"e128-h4096-i1536": "qwen3-235b-a22b"}
_BY_NAME = {s.name: s for s in SHAPES}


# A layer no checkpoint of CHECKPOINTS has, named by its sizes: e<E>-h<H>-i<I>-k<top-k>, I the
# intermediate size one GPU holds (a tensor-parallel shard's), and -ep<N> where expert
# parallelism leaves it E / N of the E experts: e64-h3584-i1280-k6, e256-h7168-i2048-k8-ep8.
SIZED = re.compile(r"e(\d+)-h(\d+)-i(\d+)-k(\d+)(?:-ep(\d+))?")


def sized_shape(name: str) -> MoeShape | None:
    """The layer a SIZED name gives (None: not such a name); ValueError where its sizes make
    no NVFP4 MoE layer."""
    found = SIZED.fullmatch(name)
    if found is None:
        return None
    experts, hidden, inter, top_k = (int(g) for g in found.groups()[:4])
    if hidden % BLOCK or inter % BLOCK or not hidden or not inter:
        raise ValueError(f"{name}: hidden and intermediate sizes are multiples of {BLOCK} (NVFP4)")
    if not 0 < top_k <= experts:
        raise ValueError(f"{name}: top-k is 1 to the {experts} experts")
    if found[5] is None:
        return MoeShape(name, experts, hidden, inter, top_k)
    ep = int(found[5])
    local = ep_rank_experts(name, experts, ep)
    return MoeShape(name, experts, hidden, inter, top_k, local, shard=f"ep{ep}")


def shape_named(name: str) -> MoeShape:
    """The shape of this name (or alias, or SIZED name); KeyError naming the known ones
    otherwise, ValueError for a SIZED name of no layer."""
    sized = sized_shape(name)
    if sized is not None:
        return sized
    try:
        return _BY_NAME[ALIASES.get(name, name)]
    except KeyError:
        known = ", ".join(_BY_NAME)
        raise KeyError(
            f"unknown MoE shape {name!r}; known: {known}, or sizes e<E>-h<H>-i<I>-k<top-k>[-ep<N>]"
        ) from None


# The GPU tests' shapes (tests/gpu/test_fused_nvfp4_emulation.py): the two the kernel was first
# tuned on, so that the suite's runtime stays what it was (the benchmark covers every shape).
TEST_SHAPES = (shape_named("qwen3-30b-a3b"), shape_named("e128-h4096-i1536"))
TOKENS = (1, 8, 32, 128, 512)

# The predecode entries of patch 0002's shipped H200 tables (benchmarks/tune_nvfp4_moe.py
# --predecode on an H200, kept where the layer with them was faster, 2026-12-05), by the shape
# whose table carries one: (routed pairs an expert from which, block of pairs, w13 tile, w2
# tile), each tile (block_n, block_k, num_warps, num_stages). Every other shape and device takes
# its platform's generic predecode.
H200_PREDECODE = {
    "qwen3-30b-a3b": (256, 128, (128, 64, 8, 3), (256, 64, 8, 3)),
    "qwen3-235b-a22b": (256, 128, (128, 64, 8, 3), (256, 64, 8, 3)),
    "deepseek-r1-tp8": (256, 128, (128, 64, 8, 3), (128, 64, 4, 3)),
}


def h200_predecode(module: Any, name: str) -> Any:
    """H200_PREDECODE[name] as patch 0002's PredecodeConfig (``module``: its experts' module or
    its kernels', which both hold PredecodeConfig and GemmConfig)."""
    pairs, block_m, w13, w2 = H200_PREDECODE[name]
    return module.PredecodeConfig(pairs, block_m, module.GemmConfig(*w13), module.GemmConfig(*w2))


# Activation amax the static scales are calibrated for: randn hidden states stay under 6,
# silu(gate) * up of unit-RMS rows under 8. Round on purpose, unlike a calibration's (and the
# engine check's checkpoints, 5.83 and 7.61): the global scales 448 and 336 put some activations
# exactly on E2M1 rounding thresholds (nvfp4_reference.activations_on_ties), which torch and
# Triton's interpreter decide alike (both divide exactly), so that the CPU kernel tests can ask
# for the reference's bits; on a GPU, whose division may round them apart, the layer tests
# (exact W4A4) passed on an H200 with both these and 5.83 / 7.61 (2026-12-02), and the
# end-to-end test moves its inputs off the thresholds (move_off_e2m1_ties).
HIDDEN_AMAX = 6.0
INTERMEDIATE_AMAX = 8.0
# RMS of random E2M1 codes (every byte equally likely), and of block scales uniform over
# [64, 256] (two binades of E4M3, as real checkpoints' are): sqrt(E[s^2]).
E2M1_RMS = (sum(v * v for v in E2M1_VALUES) / len(E2M1_VALUES)) ** 0.5
BLOCK_SCALES = (64.0, 256.0)
_LOW, _HIGH = BLOCK_SCALES
BLOCK_SCALE_RMS = ((_HIGH**3 - _LOW**3) / (3 * (_HIGH - _LOW))) ** 0.5


# -- the vLLM under test ------------------------------------------------------------------------
class WrongTree(ImportError):
    """vllm was imported from somewhere else than the tree asked for."""


@dataclasses.dataclass(frozen=True)
class ImportedVllm:
    module: types.ModuleType
    package_dir: Path
    mode: str  # "native" (the package's compiled ops) or "standin" (standins.py)
    standin_ops: tuple[str, ...]
    import_warnings: tuple[str, ...]


def import_vllm(tree: Path | None = None) -> ImportedVllm:
    """Import vLLM's MoE modules from ``tree`` (the folder holding a ``vllm/`` package, put
    first on sys.path) or, without one, the importable vllm; stand-in ops first where the
    package has no compiled extensions (vLLM imports them unconditionally).

    Importing vLLM 0.24.0 with torch 2.11 raises torch's own DeprecationWarnings (e.g.
    ``torch.jit.script_method`` when vLLM's import-time ``torch.compile`` loads inductor). They
    come from third-party import machinery, not from the code under test, so they are recorded
    (``import_warnings``, the pytest header shows them) instead of failing collection.
    Raises ModuleNotFoundError where no vllm is importable, WrongTree where it is not tree's.
    """
    if tree is not None and str(tree) not in sys.path:
        sys.path.insert(0, str(tree))
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("no vllm importable (set VLLM_PATCHSET_VLLM_TREE)")
    package_dir = Path(spec.origin).parent
    native = standins.has_compiled_extensions(package_dir)
    ops = () if native else tuple(standins.install())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import vllm

        for name in VLLM_MODULES:
            importlib.import_module(name)
    if tree is not None and not Path(vllm.__file__).is_relative_to(tree):
        raise WrongTree(f"vllm was imported from {vllm.__file__}, not from the tree {tree}")
    seen = dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught)
    return ImportedVllm(vllm, package_dir, "native" if native else "standin", ops, tuple(seen))


def init_workspace() -> None:
    """FusedMoEKernel.apply takes its buffers from vLLM's workspace manager: set it up once."""
    from vllm.v1.worker.workspace import init_workspace_manager

    init_workspace_manager(torch.device("cuda"))


# -- weights and inputs -------------------------------------------------------------------------
def random_nvfp4_weights(
    experts: int,
    rows: int,
    cols: int,
    rms: float,
    *,
    device: torch.device | str = "cuda",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random NVFP4 weights as a checkpoint holds them, dequantizing to an RMS of about ``rms``.

    Returns (packed uint8 [E, rows, cols / 2], E4M3 block scales [E, rows, cols / 16], FP32
    global dequantization factors [E], spread +-50% over the experts)."""
    packed = torch.randint(
        0, 256, (experts, rows, cols // 2), dtype=torch.uint8, generator=generator, device=device
    )
    block_scales = torch.empty(experts, rows, cols // BLOCK, device=device)
    block_scales.uniform_(*BLOCK_SCALES, generator=generator)
    spread = torch.empty(experts, device=device).uniform_(0.5, 1.5, generator=generator)
    global_scale = spread * (rms / (BLOCK_SCALE_RMS * E2M1_RMS))
    return packed, block_scales.to(torch.float8_e4m3fn), global_scale


def make_moe(shape: MoeShape, seed: int = 0, device: torch.device | str = "cuda") -> Nvfp4Moe:
    """Seeded random NVFP4 experts of ``shape`` (the ones its GPU holds: ``held_experts``),
    every row of unit RMS norm (weights of RMS 1 / sqrt(K)), and the activation scales the
    oracle leaves for HIDDEN_AMAX and INTERMEDIATE_AMAX (oracle/nvfp4.py: 1 / input_scale,
    input_scale = amax / (448 * 6))."""
    gen = torch.Generator(device=device).manual_seed(seed)
    e, h, i = shape.held_experts, shape.hidden, shape.intermediate
    w13 = random_nvfp4_weights(e, 2 * i, h, h**-0.5, device=device, generator=gen)
    w2 = random_nvfp4_weights(e, h, i, i**-0.5, device=device, generator=gen)
    return Nvfp4Moe(
        *w13,
        *w2,
        a13_gscale=activation_global_scale(HIDDEN_AMAX, device),
        a2_gscale=activation_global_scale(INTERMEDIATE_AMAX, device),
    )


_HELD: dict[tuple[MoeShape, str], Nvfp4Moe] = {}


def held_moe(shape: MoeShape, device: torch.device | str = "cuda") -> Nvfp4Moe:
    """make_moe(shape) (seed 0), kept for the next call with the same shape: the GPU tests
    ask for one shape's layer many times in a row. One shape's weights at a time (the largest
    layers take gigabytes)."""
    key = (shape, str(device))
    if key not in _HELD:
        _HELD.clear()
        _HELD[key] = make_moe(shape, device=device)
    return _HELD[key]


def expert_map(shape: MoeShape, device: torch.device | str = "cuda") -> torch.Tensor | None:
    """vLLM's expert map of an expert-parallel shape's rank 0 (global expert id -> local index,
    -1 for the other ranks' experts; the first E / N experts are rank 0's, vLLM's linear
    placement); None where the GPU holds every expert."""
    if not shape.local_experts:
        return None
    out = torch.full((shape.experts,), -1, dtype=torch.int32, device=device)
    out[: shape.local_experts] = torch.arange(shape.local_experts, dtype=torch.int32, device=device)
    return out


def local_routing(
    shape: MoeShape, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing as the experts ``make_moe`` gives ``shape`` see it: global ids mapped to
    local indices, and the weights of experts other ranks hold zeroed (their id set to local
    expert 0, contributing nothing). The routing itself where the GPU holds every expert."""
    emap = expert_map(shape, topk_ids.device)
    if emap is None:
        return topk_weights, topk_ids
    local = emap[topk_ids.long()]
    held = local >= 0
    return topk_weights * held, torch.where(held, local, 0).to(topk_ids.dtype)


def ranks(shape: MoeShape) -> int:
    """How many expert-parallel ranks share the layer's experts (1 where one GPU holds all)."""
    return shape.experts // shape.held_experts


def rank_routing(shape: MoeShape, topk_ids: torch.Tensor, rank: int) -> torch.Tensor:
    """The routing as rank ``rank`` sees it, in the ids that rank 0's expert map reads: the
    global ids moved down by the rank's first expert (modulo E), so that the experts rank
    ``rank`` holds (vLLM's linear placement: ``rank * E / N`` on) are the local ones. Timing
    rank 0's layer on it times that rank's: an EP layer waits for its slowest rank."""
    return ((topk_ids.long() - rank * shape.held_experts) % shape.experts).to(topk_ids.dtype)


def busiest_rank(shape: MoeShape, topk_ids: torch.Tensor) -> int:
    """The rank that routes the most of its experts (the first of them): the tuner's stand-in
    for the slowest rank, which it cannot time tile by tile on every rank. 0 on one GPU."""
    views = [rank_routing(shape, topk_ids, r) for r in range(ranks(shape))]
    counts = [active_experts(shape, v) for v in views]
    return counts.index(max(counts))


def active_experts(shape: MoeShape, topk_ids: torch.Tensor) -> int:
    """How many of the experts this GPU holds the routing picks (whose weights a call reads)."""
    emap = expert_map(shape, topk_ids.device)
    if emap is None:
        return int(topk_ids.unique().numel())
    local = emap[topk_ids.long()]
    return int(local[local >= 0].unique().numel())


def route(
    tokens: int,
    experts: int,
    top_k: int,
    *,
    device: torch.device | str = "cuda",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing of random logits: (FP32 weights, the softmax over the top k; int32 ids,
    distinct per token)."""
    logits = torch.randn(tokens, experts, generator=generator, device=device)
    top_logits, ids = logits.topk(top_k, dim=-1)
    return top_logits.softmax(dim=-1), ids.to(torch.int32)


def random_inputs(
    tokens: int,
    shape: MoeShape,
    seed: int,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cuda",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded hidden states (randn, in ``dtype``), top-k weights and ids."""
    gen = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(tokens, shape.hidden, generator=gen, device=device).to(dtype)
    weights, ids = route(tokens, shape.experts, shape.top_k, device=device, generator=gen)
    return hidden, weights, ids


# -- vLLM's experts and kernel ------------------------------------------------------------------
def moe_config(
    experts: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    dtype: torch.dtype = torch.bfloat16,
    *,
    local_experts: int | None = None,
    max_num_tokens: int | None = None,
) -> Any:
    """A single-GPU (no TP/DP/EP) FusedMoEConfig for a SiLU-gated MoE layer."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )

    fields = {f.name for f in dataclasses.fields(FusedMoEConfig)}
    # 0.24.0 takes the full intermediate size; 0.21.0 the per-partition one (same with TP=1).
    size_field = (
        "intermediate_size" if "intermediate_size" in fields else "intermediate_size_per_partition"
    )
    optional = {} if max_num_tokens is None else {"max_num_tokens": max(max_num_tokens, 1)}
    return FusedMoEConfig(
        num_experts=experts,
        experts_per_token=top_k,
        hidden_dim=hidden,
        num_local_experts=experts if local_experts is None else local_experts,
        num_logical_experts=experts,
        activation=MoEActivation.SILU,
        device="cuda",
        routing_method=RoutingMethodType.TopK,
        moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
        in_dtype=dtype,
        **{size_field: intermediate},
        **optional,
    )


def modular_kernel(experts: Any) -> Any:
    """The no-DP/EP prepare/finalize (what a single-GPU FusedMoE uses) around ``experts``."""
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.prepare_finalize import (
        make_moe_prepare_and_finalize_no_dp_ep,
    )

    return mk.FusedMoEKernel(make_moe_prepare_and_finalize_no_dp_ep(use_monolithic=False), experts)


def kernel_forward(
    kernel: Any,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """``FusedMoEKernel.apply`` as a SiLU FusedMoE layer calls it (``expert_map``: global expert
    id -> local index, -1 elsewhere, as an expert-parallel rank's layer passes it)."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    return kernel.apply(
        hidden_states=x,
        w1=w1,
        w2=w2,
        topk_weights=topk_weights,
        topk_ids=topk_ids,
        activation=MoEActivation.SILU,
        global_num_experts=w1.shape[0] if expert_map is None else expert_map.numel(),
        expert_map=expert_map,
        apply_router_weight_on_input=False,
    )


def nvfp4_quant_config(moe: Nvfp4Moe, local: torch.Tensor | slice = slice(None)) -> Any:
    """vLLM's NVFP4 quant config for ``moe``'s experts ``local`` (all by default)."""
    from vllm.model_executor.layers.fused_moe.config import nvfp4_moe_quant_config

    return nvfp4_moe_quant_config(
        g1_alphas=moe.w13_gscale[local],
        g2_alphas=moe.w2_gscale[local],
        a1_gscale=moe.a13_gscale,
        a2_gscale=moe.a2_gscale,
        w1_scale=moe.w13_scale[local],
        w2_scale=moe.w2_scale[local],
    )


@dataclasses.dataclass(frozen=True)
class Experts:
    """A vLLM experts object and the weights its ``apply`` takes."""

    experts: Any  # a FusedMoEExpertsModular
    w1: torch.Tensor
    w2: torch.Tensor
    expert_map: torch.Tensor | None = None  # global expert id -> local index, -1 elsewhere


def weight_copies(moe: Nvfp4Moe) -> Nvfp4Moe:
    """``moe`` with copies of its packed weights and block scales (for code that changes them
    in place)."""
    return dataclasses.replace(
        moe,
        w13=moe.w13.clone(),
        w2=moe.w2.clone(),
        w13_scale=moe.w13_scale.clone(),
        w2_scale=moe.w2_scale.clone(),
    )


def with_block_scale_kinds(moe: Nvfp4Moe, general: bool) -> Nvfp4Moe:
    """A copy of ``moe`` whose block scales hold, beside E4M3 normals, the kinds a real
    checkpoint may hold (each tensor's blocks in flat order, a block's scale and its 8 bytes
    of codes at the same index): every 13th block a zero scale over zero codes; with
    ``general`` also subnormal scales (bytes 1-7) at the blocks 5 after those, and zero
    scales over the random codes at the blocks 9 after them. Patch 0002's PTX decode converts
    the first kind with one integer operation, the other two only with the general FP8
    conversion."""
    out = weight_copies(moe)
    for w, scale in ((out.w13, out.w13_scale), (out.w2, out.w2_scale)):
        scale_bytes = scale.view(torch.uint8).view(-1)
        codes = w.view(-1, BLOCK // 2)
        index = torch.arange(scale_bytes.numel(), device=scale_bytes.device)
        zero = index % 13 == 0
        scale_bytes[zero] = 0
        codes[zero] = 0
        if general:
            subnormal = index % 13 == 5
            scale_bytes[subnormal] = (index[subnormal] % 7 + 1).to(torch.uint8)
            scale_bytes[index % 13 == 9] = 0
    return out


def nvfp4_emulation_experts(
    moe: Nvfp4Moe,
    shape: MoeShape,
    max_num_tokens: int,
    local: torch.Tensor | None = None,
    loaded: bool = True,
) -> Experts:
    """vLLM's NVFP4 emulation experts over ``moe`` (the overlay's fused kernel where patch 0002
    is applied); with ``local``, only those experts, as one rank of expert parallelism (``moe``
    holds every expert); an expert-parallel ``shape`` without ``local``: ``moe`` holds the
    rank's experts (``make_moe``), mapped by ``expert_map``.
    ``loaded``: the weights as vLLM's loading leaves them, i.e. after the experts'
    ``process_weights_after_loading`` (patch 0002 lays copies of the weights and scales out in
    tiles there; ``moe``'s own are never changed), else the checkpoint's rows as they are."""
    from vllm.model_executor.layers.fused_moe.experts.nvfp4_emulation_moe import (
        Nvfp4QuantizationEmulationTritonExperts,
    )

    pick: torch.Tensor | slice = slice(None) if local is None else local
    held = (shape.local_experts or None) if local is None else local.numel()
    config = moe_config(
        shape.experts,
        shape.top_k,
        shape.hidden,
        shape.intermediate,
        local_experts=held,
        max_num_tokens=max_num_tokens,
    )
    weights = weight_copies(moe) if loaded else moe  # the hook may lay them out in place
    experts = Nvfp4QuantizationEmulationTritonExperts(config, nvfp4_quant_config(weights, pick))
    layer = types.SimpleNamespace(w13_weight=weights.w13[pick], w2_weight=weights.w2[pick])
    if loaded:
        experts.process_weights_after_loading(layer)
    emap = expert_map(shape)
    if local is not None:
        emap = torch.full((shape.experts,), -1, dtype=torch.int32, device="cuda")
        emap[local] = torch.arange(local.numel(), dtype=torch.int32, device="cuda")
    return Experts(experts, layer.w13_weight, layer.w2_weight, emap)


def bf16_triton_experts(moe: Nvfp4Moe, shape: MoeShape, max_num_tokens: int) -> Experts:
    """vLLM's unquantized TritonExperts over ``moe``'s weights dequantized to BF16."""
    from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts

    config = moe_config(
        shape.experts,
        shape.top_k,
        shape.hidden,
        shape.intermediate,
        local_experts=shape.local_experts or None,
        max_num_tokens=max_num_tokens,
    )
    e, h, i = shape.held_experts, shape.hidden, shape.intermediate
    w1 = torch.empty(e, 2 * i, h, dtype=torch.bfloat16, device=moe.w13.device)
    w2 = torch.empty(e, h, i, dtype=torch.bfloat16, device=moe.w2.device)
    for expert in range(e):  # one at a time: all experts' FP32 weights take gigabytes
        w1[expert], w2[expert] = moe.dequantized(expert, torch.bfloat16)
    experts = TritonExperts(config, FUSED_MOE_UNQUANTIZED_CONFIG)
    return Experts(experts, w1, w2, expert_map(shape))


class MoeLayer:
    """One MoE layer's experts and its static buffers: ``apply`` calls the experts' own
    ``apply`` and then the finalize (what FusedMoEKernel calls after its prepare step) on the
    same tensors every time, so that it can be captured in a CUDA graph and replayed after
    ``refill``."""

    def __init__(
        self, moe: Nvfp4Moe, shape: MoeShape, tokens: int, experts: Experts, seed: int = 1
    ) -> None:
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation

        self.moe, self.shape, self.experts = moe, shape, experts
        self.hidden, self.topk_weights, self.topk_ids = random_inputs(tokens, shape, seed)
        # The sizes FusedMoEKernel reads off the tensors (Marlin's repacked w1 has its own).
        _, m, n, k, top_k = experts.experts.moe_problem_size(
            self.hidden, experts.w1, experts.w2, self.topk_ids
        )
        ws13, ws2, out = experts.experts.workspace_shapes(
            m, n, k, top_k, shape.experts, experts.w1.shape[0], None, MoEActivation.SILU
        )
        # The experts' output over the first workspace's start, as FusedMoEKernel lays them
        # out (it reuses that memory): a kernel that writes that output while another still
        # reads its first workspace shows here. The layer's output is a tensor of its own.
        common = torch.empty(max(math.prod(ws13), math.prod(out)), dtype=torch.bfloat16,
                             device="cuda")  # fmt: skip
        self.ws13 = common[: math.prod(ws13)].view(ws13)
        self.ws2 = torch.empty(ws2, dtype=torch.bfloat16, device="cuda")
        self.fused_out = common[: math.prod(out)].view(out)
        self.output = torch.empty_like(self.hidden)

    def refill(self, seed: int) -> None:
        """New hidden states and routing in the same tensors."""
        hidden, weights, ids = random_inputs(self.hidden.size(0), self.shape, seed)
        self.hidden.copy_(hidden)
        self.topk_weights.copy_(weights)
        self.topk_ids.copy_(ids)

    def apply(self, unfused: bool = False) -> torch.Tensor:
        """``run``, the output filled with NaN first: every element must be written."""
        self.output.fill_(float("nan"))
        return self.run(unfused)

    def run(self, unfused: bool = False) -> torch.Tensor:
        """The layer's output; ``unfused``: patch 0002's fallback, 0.24.0's dequantize-all path
        (which writes the layer's output itself)."""
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation
        from vllm.model_executor.layers.fused_moe.prepare_finalize import (
            make_moe_prepare_and_finalize_no_dp_ep,
        )

        kwargs: dict[str, Any] = dict(
            output=self.output if unfused else self.fused_out,
            hidden_states=self.hidden,
            w1=self.experts.w1,
            w2=self.experts.w2,
            topk_weights=self.topk_weights,
            topk_ids=self.topk_ids,
            activation=MoEActivation.SILU,
            global_num_experts=self.shape.experts,
            expert_map=self.experts.expert_map,
            workspace13=self.ws13,
            workspace2=self.ws2,
            expert_tokens_meta=None,
            apply_router_weight_on_input=False,
        )
        if unfused:
            self.experts.experts._apply_dequantized(**kwargs)
            return self.output
        self.experts.experts.apply(a1q_scale=None, a2_scale=None, **kwargs)
        # FusedMoEKernel's finalize on a single GPU: the experts' weight-and-reduce step.
        make_moe_prepare_and_finalize_no_dp_ep(use_monolithic=False).finalize(
            self.output,
            self.fused_out,
            self.topk_weights,
            self.topk_ids,
            False,
            self.experts.experts.finalize_weight_and_reduce_impl(),
        )
        return self.output


# -- Marlin, as vLLM 0.24.0 builds it on Hopper ------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Kernel:
    """A FusedMoEKernel, the experts inside it and the weights its ``apply`` takes."""

    kernel: Any  # a FusedMoEKernel
    experts: Experts


def emulation_or_bf16_kernel(experts: Experts) -> Kernel:
    """``experts`` inside the no-DP/EP FusedMoEKernel a single-GPU FusedMoE layer builds."""
    return Kernel(modular_kernel(experts.experts), experts)


class _MarlinLayer(torch.nn.Module):
    """What the oracle's Marlin conversion reads of a FusedMoE layer (it also leaves a
    ``workspace`` on it)."""

    def __init__(self, shape: MoeShape) -> None:
        super().__init__()
        self.num_experts = shape.held_experts
        self.hidden_size = shape.hidden
        self.intermediate_size_per_partition = shape.intermediate
        self.params_dtype = torch.bfloat16


def marlin_kernel(moe: Nvfp4Moe, shape: MoeShape, max_num_tokens: int) -> Kernel:
    """vLLM's Marlin NVFP4 MoE (W4A16) over ``moe``'s weights, built the way 0.24.0's ModelOpt
    NVFP4 MoE method builds it on Hopper (its default NVFP4 MoE backend there):
    ``oracle.convert_to_nvfp4_moe_kernel_format(NvFp4MoeBackend.MARLIN, layer, ...)`` repacks
    the weights and scales (``layer`` carries the sizes and dtype it reads), then
    ``make_nvfp4_moe_quant_config`` and ``make_nvfp4_moe_kernel`` with ``MarlinExperts``, and
    the experts' ``process_weights_after_loading``. Needs vLLM's compiled ops
    (``gptq_marlin_repack``, ``moe_wna16_marlin_gemm``): the stand-ins have no Marlin."""
    from vllm.model_executor.layers.fused_moe.experts.marlin_moe import MarlinExperts
    from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle

    layer = _MarlinLayer(shape)
    held = shape.held_experts
    backend = oracle.NvFp4MoeBackend.MARLIN
    w13, w13_scale, w13_scale_2, a13_scale, w2, w2_scale, w2_scale_2, a2_scale = (
        oracle.convert_to_nvfp4_moe_kernel_format(
            backend,
            layer,
            w13=moe.w13,
            w13_scale=moe.w13_scale,
            w13_scale_2=moe.w13_gscale,
            # The checkpoint's input_scale (amax / (448 * 6)); Marlin drops it (W4A16).
            a13_scale=(1.0 / moe.a13_gscale).expand(held).contiguous(),
            w2=moe.w2,
            w2_scale=moe.w2_scale,
            w2_scale_2=moe.w2_gscale,
            a2_scale=(1.0 / moe.a2_gscale).expand(held).contiguous(),
            is_act_and_mul=True,
        )
    )
    quant_config = oracle.make_nvfp4_moe_quant_config(
        backend=backend,
        w13_scale=w13_scale,
        w2_scale=w2_scale,
        w13_scale_2=w13_scale_2,
        w2_scale_2=w2_scale_2,
        a13_scale=a13_scale,
        a2_scale=a2_scale,
    )
    config = moe_config(
        shape.experts,
        shape.top_k,
        shape.hidden,
        shape.intermediate,
        local_experts=shape.local_experts or None,
        max_num_tokens=max_num_tokens,
    )
    kernel = oracle.make_nvfp4_moe_kernel(
        moe_quant_config=quant_config, moe_config=config, experts_cls=MarlinExperts
    )
    kernel.fused_experts.process_weights_after_loading(layer)
    experts = Experts(kernel.fused_experts, w13, w2, expert_map(shape))
    return Kernel(kernel, experts)


# -- the overlay's portable path ----------------------------------------------------------------
# Set to 1, the overlay's NVFP4 emulation takes its portable Triton path where it also has a
# CUDA-only one (chosen by platform otherwise).
PORTABLE_ENV = "VLLM_PATCHSET_NVFP4_PORTABLE"
# Set to "rocm", the overlay's NVFP4 emulation takes ROCm's tile table and token block on any
# GPU (with PORTABLE_ENV: the path ROCm runs, measurable on an NVIDIA GPU).
PLATFORM_ENV = "VLLM_PATCHSET_NVFP4_PLATFORM"
# Set to 1, the overlay's kernels launch without programmatic dependent launch (sm_90+).
NO_PDL_ENV = "VLLM_PATCHSET_NVFP4_NO_PDL"
_FUSED_MOE_DIR = Path("model_executor", "layers", "fused_moe")


def reads_switch(package_dir: Path, name: str) -> bool:
    """Whether the vllm package at ``package_dir`` reads the environment switch ``name``
    anywhere in its fused MoE code (the overlay's patch 0002 names PORTABLE_ENV where it has a
    CUDA-only path beside the portable one, and PLATFORM_ENV where it keeps a tile table per
    platform). Without it, the default path is the only one."""
    return any(
        name in p.read_text(encoding="utf-8", errors="replace")
        for p in (package_dir / _FUSED_MOE_DIR).rglob("*.py")
    )


def has_portable_switch(package_dir: Path) -> bool:
    """``reads_switch`` of PORTABLE_ENV."""
    return reads_switch(package_dir, PORTABLE_ENV)


class KernelCall:
    """``FusedMoEKernel.apply`` (what a FusedMoE layer calls) on static input tensors, so that
    it can be captured in a CUDA graph; the inputs are a MoeLayer's (same seed, same data)."""

    def __init__(self, kernel: Kernel, layer: MoeLayer) -> None:
        self.kernel, self.layer = kernel, layer

    def run(self) -> torch.Tensor:
        e = self.kernel.experts
        return kernel_forward(
            self.kernel.kernel,
            self.layer.hidden,
            e.w1,
            e.w2,
            self.layer.topk_weights,
            self.layer.topk_ids,
            e.expert_map,
        )
