"""The engine's MoE layers as the worker records them."""

from __future__ import annotations

import types

from engine_check import moe


def test_moe_layers_reads_each_layers_record() -> None:
    """What the worker records of a model's MoE layers: patch 0002's experts with their
    records (a layer whose weights took the tiles, one whose did not), other experts with
    none, and modules without forward_modular skipped."""
    import torch

    class Tiled:
        tiled_weights = ("w13", "w2")
        fast_scales = True

    class Rows:
        tiled_weights = None
        fast_scales = False

    class Other:
        pass

    class Layer(torch.nn.Module):
        def __init__(self, experts: object) -> None:
            super().__init__()
            kernel = types.SimpleNamespace(fused_experts=experts)
            self.quant_method = types.SimpleNamespace(moe_kernel=kernel)

        def forward_modular(self) -> None:
            pass

    model = torch.nn.ModuleDict(
        {"a": Layer(Tiled()), "b": Layer(Rows()), "c": Layer(Other()), "d": torch.nn.Linear(1, 1)}
    )
    assert moe.moe_layers(model) == {
        "a": {"experts": "Tiled", "tiled": True, "fast_scales": True},
        "b": {"experts": "Rows", "tiled": False, "fast_scales": False},
        "c": {"experts": "Other", "tiled": None, "fast_scales": None},
    }
