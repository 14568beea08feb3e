"""Build vLLM's modular MoE kernel the way a FusedMoE layer does, without a model or ranks.

Import only after conftest has chosen the vLLM under test. Works on 0.21.0 (the nightly-like
base) and 0.24.0: the one difference on this path is FusedMoEConfig's intermediate-size field.
"""

from __future__ import annotations

import dataclasses

import torch
import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.config import (
    FusedMoEConfig,
    FusedMoEParallelConfig,
    RoutingMethodType,
)
from vllm.model_executor.layers.fused_moe.prepare_finalize import (
    make_moe_prepare_and_finalize_no_dp_ep,
)


def moe_config(
    experts: int, topk: int, hidden: int, intermediate: int, dtype: torch.dtype
) -> FusedMoEConfig:
    """A single-GPU (no TP/DP/EP) config for a SiLU-gated MoE layer."""
    fields = {f.name for f in dataclasses.fields(FusedMoEConfig)}
    # 0.24.0 takes the full intermediate size; 0.21.0 the per-partition one (same with TP=1).
    size_field = (
        "intermediate_size" if "intermediate_size" in fields else "intermediate_size_per_partition"
    )
    return FusedMoEConfig(
        num_experts=experts,
        experts_per_token=topk,
        hidden_dim=hidden,
        num_local_experts=experts,
        num_logical_experts=experts,
        activation=MoEActivation.SILU,
        device="cuda",
        routing_method=RoutingMethodType.TopK,
        moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
        in_dtype=dtype,
        **{size_field: intermediate},
    )


def modular_kernel(experts: mk.FusedMoEExpertsModular) -> mk.FusedMoEKernel:
    """The no-DP/EP prepare/finalize (what a single-GPU FusedMoE uses) around ``experts``."""
    return mk.FusedMoEKernel(make_moe_prepare_and_finalize_no_dp_ep(use_monolithic=False), experts)


def apply(
    kernel: mk.FusedMoEKernel,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    return kernel.apply(
        hidden_states=x,
        w1=w1,
        w2=w2,
        topk_weights=topk_weights,
        topk_ids=topk_ids,
        activation=MoEActivation.SILU,
        global_num_experts=w1.shape[0],
        expert_map=None,
        apply_router_weight_on_input=False,
    )
