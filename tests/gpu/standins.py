"""Capture-safe stand-ins for the few compiled vLLM ops the Triton MoE path calls.

Used only when the vLLM under test is a pure-Python tree (no ``_C*.so``): the GPU
host of issue 5 has torch and Triton but no vLLM build. Where a real vLLM build is
installed (users' CI), none of this is used and the real ops run.

Each op registers under vLLM's own namespace and schema (``csrc/libtorch_stable/
torch_bindings.cpp`` and ``csrc/libtorch_stable/moe/torch_bindings.cpp`` in the
sdist) and is written in plain torch with no host sync (no ``.item()``, no
``nonzero``/boolean indexing, no data-dependent output size), so that it can be
captured in a CUDA or HIP graph like the real kernel.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F

# The extension modules vLLM imports (0.21.0 .. 0.24.0, CUDA and ROCm).
EXTENSION_MODULES = (
    "_C",
    "_C_stable_libtorch",
    "_moe_C",
    "_moe_C_stable_libtorch",
    "_rocm_C",
)

# Ops whose only job at import time is to say whether a CUTLASS kernel exists.
# Stand-in mode has no CUTLASS, so they all answer False.
CAPABILITY_OPS = (
    "cutlass_scaled_mm_supports_fp8",
    "cutlass_scaled_mm_supports_block_fp8",
    "cutlass_scaled_mm_supports_fp4",
    "cutlass_group_gemm_supported",
    "mxfp4_experts_quant_supported",
)

# A torch.library.Library deregisters its ops when it is garbage-collected:
# keep every one we create for the life of the process.
_LIBRARIES: list[torch.library.Library] = []


def has_compiled_extensions(vllm_dir: Path) -> bool:
    """True when the vllm package at ``vllm_dir`` ships its compiled ``_C`` ops."""
    return any(vllm_dir.glob("_C.*so")) or any(vllm_dir.glob("_C_stable_libtorch*.so"))


def fp8_max(dtype: torch.dtype) -> float:
    # vLLM clamps to 224, not torch's 240, for the fnuz type on ROCm
    # (quant_utils.get_fp8_min_max): the stand-ins do the same.
    return 224.0 if dtype == torch.float8_e4m3fnuz else torch.finfo(dtype).max


def silu_and_mul(result: torch.Tensor, input: torch.Tensor) -> None:
    d = input.shape[-1] // 2
    # The CUDA kernel rounds silu(x) to the input dtype, then multiplies by y.
    gate = F.silu(input[..., :d].float()).to(input.dtype)
    result.copy_(gate * input[..., d:])


def _quantize_fp8(result: torch.Tensor, input: torch.Tensor, scale: torch.Tensor) -> None:
    limit = fp8_max(result.dtype)
    # The CUDA kernel multiplies by the reciprocal of the scale.
    scaled = input.float() * (1.0 / scale.float())
    result.copy_(scaled.clamp(-limit, limit).to(result.dtype))


def static_scaled_fp8_quant(
    result: torch.Tensor,
    input: torch.Tensor,
    scale: torch.Tensor,
    group_shape: list[int] | None = None,
) -> None:
    if scale.numel() != 1:
        raise NotImplementedError("stand-in static_scaled_fp8_quant: per-tensor scales only")
    _quantize_fp8(result, input, scale.reshape(()))


def dynamic_scaled_fp8_quant(
    result: torch.Tensor, input: torch.Tensor, scale: torch.Tensor
) -> None:
    amax = input.abs().amax().float()
    # Guard an all-zero input the way a division by a tiny scale does: zeros stay zero.
    scale.copy_((amax / fp8_max(result.dtype)).clamp(min=torch.finfo(torch.float32).tiny))
    _quantize_fp8(result, input, scale.reshape(()))


def dynamic_per_token_scaled_fp8_quant(
    result: torch.Tensor,
    input: torch.Tensor,
    scale: torch.Tensor,
    scale_ub: torch.Tensor | None,
) -> None:
    amax = input.abs().amax(dim=-1, keepdim=True).float()
    if scale_ub is not None:
        amax = torch.minimum(amax, scale_ub.float())
    limit = fp8_max(result.dtype)
    # vLLM's kernel floors the per-token scale at 1 / (fp8_max * 512).
    token_scale = torch.maximum(amax / limit, torch.full_like(amax, 1.0 / (limit * 512.0)))
    scale.copy_(token_scale.reshape(scale.shape))
    _quantize_fp8(result, input, token_scale)


def moe_sum(input: torch.Tensor, output: torch.Tensor) -> None:
    output.copy_(input.sum(dim=1))


def moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: torch.Tensor,
    experts_ids: torch.Tensor,
    num_tokens_post_pad: torch.Tensor,
    maybe_expert_map: torch.Tensor | None,
) -> None:
    """The contract of vLLM's ``moe_align_block_size.py`` docstring, exactly.

    Flat token slots are grouped by expert (ascending expert, ascending slot within
    an expert), each expert's group is padded to a multiple of ``block_size`` with
    the sentinel ``topk_ids.numel()``, ``experts_ids`` names each block's expert
    (-1 past the last block) and ``num_tokens_post_pad`` holds the padded total.
    Ids >= num_experts, and ids that ``maybe_expert_map`` maps to -1, are dropped.
    """
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    numel = flat.numel()
    in_range = (flat >= 0) & (flat < num_experts)
    expert = flat.clamp(0, num_experts - 1)
    if maybe_expert_map is not None:
        expert = maybe_expert_map.long()[expert]
        in_range &= expert >= 0
    # Dropped slots get the key num_experts: they sort last and land in a dump slot.
    key = torch.where(in_range, expert, torch.full_like(expert, num_experts))

    # Per-expert counts without bincount (which syncs to size its output).
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:num_experts]
    padded = (counts + block_size - 1) // block_size * block_size
    padded_end = padded.cumsum(0)
    padded_start = padded_end - padded
    count_start = counts.cumsum(0) - counts

    sorted_key, slot = torch.sort(key, stable=True)
    rank = torch.arange(numel, device=device)
    kept = sorted_key < num_experts
    safe_key = sorted_key.clamp(max=num_experts - 1)
    dump = sorted_token_ids.numel()
    dest = torch.where(kept, padded_start[safe_key] + rank - count_start[safe_key], dump)

    out = torch.full((dump + 1,), numel, dtype=sorted_token_ids.dtype, device=device)
    out.scatter_(0, dest, slot.to(out.dtype))
    sorted_token_ids.copy_(out[:dump])

    total = padded_end[-1]
    block_start = torch.arange(experts_ids.numel(), device=device) * block_size
    block_expert = torch.searchsorted(padded_end, block_start, right=True)
    experts_ids.copy_(torch.where(block_start < total, block_expert, -1).to(experts_ids.dtype))
    num_tokens_post_pad.copy_(total.reshape(1).to(num_tokens_post_pad.dtype))


C_OPS = {
    "silu_and_mul(Tensor! result, Tensor input) -> ()": silu_and_mul,
    "static_scaled_fp8_quant(Tensor! result, Tensor input, Tensor scale, "
    "int[]? group_shape=None) -> ()": static_scaled_fp8_quant,
    "dynamic_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale) -> ()": (
        dynamic_scaled_fp8_quant
    ),
    "dynamic_per_token_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale, "
    "Tensor? scale_ub) -> ()": dynamic_per_token_scaled_fp8_quant,
}
MOE_OPS = {
    "moe_sum(Tensor input, Tensor! output) -> ()": moe_sum,
    "moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, "
    "Tensor! sorted_token_ids, Tensor! experts_ids, Tensor! num_tokens_post_pad, "
    "Tensor? maybe_expert_map) -> ()": moe_align_block_size,
}


def _register(namespace: str, ops: Mapping[str, object], dispatch_key: str) -> None:
    lib = torch.library.Library(namespace, "FRAGMENT")
    _LIBRARIES.append(lib)
    for schema, fn in ops.items():
        name = schema.split("(", 1)[0]
        lib.define(schema)
        lib.impl(name, fn, dispatch_key)


def install() -> list[str]:
    """Stand in for vLLM's missing extension modules and ops; return the op names.

    Call before the first ``import vllm``: vLLM's platform modules import the
    extension modules unconditionally.
    """
    for name in EXTENSION_MODULES:
        sys.modules.setdefault(f"vllm.{name}", types.ModuleType(f"vllm.{name}"))
    _register("_C", C_OPS, "CUDA")
    _register("_moe_C", MOE_OPS, "CUDA")
    # No tensor argument to dispatch on: these need a backend-independent kernel.
    _register(
        "_C",
        {f"{op}(int cuda_device_capability) -> bool": _no for op in CAPABILITY_OPS},
        "CompositeExplicitAutograd",
    )
    return [s.split("(", 1)[0] for s in (*C_OPS, *MOE_OPS)] + list(CAPABILITY_OPS)


def _no(cuda_device_capability: int) -> bool:
    return False
