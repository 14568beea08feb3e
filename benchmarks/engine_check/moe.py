"""The engine's MoE layers, read inside the engine (``LLM.apply_model``): which modules run
the routed experts, which experts class each holds, and what patch 0002's experts record."""

from __future__ import annotations

from typing import Any


def moe_layers(model: Any) -> dict[str, dict[str, Any]]:
    """Each MoE layer's experts class and, where patch 0002's experts record them, whether
    loading laid the weights out in tiles (``tiled_weights``) and found every block scale fit
    for the PTX decode's one-operation conversion (``fast_scales``); None where not recorded."""
    layers = {}
    for name, module in moe_modules(model):
        experts = fused_experts(module)
        if experts is None:
            continue
        layers[name] = {
            "experts": type(experts).__name__,
            "tiled": (
                experts.tiled_weights is not None if hasattr(experts, "tiled_weights") else None
            ),
            "fast_scales": getattr(experts, "fast_scales", None),
        }
    return layers


def fused_experts(module: Any) -> Any:
    """The experts object a MoE module's quant method runs (None where there is none)."""
    kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
    return getattr(kernel, "fused_experts", None)


def moe_modules(model: Any) -> list[tuple[str, Any]]:
    """(name, module) of the model's modules that have ``forward_modular``: sub-modules, and
    attributes of modules (a runner may hold its RoutedExperts outside ``_modules``)."""
    found: dict[int, tuple[str, Any]] = {}
    for name, module in model.named_modules():
        candidates = [(name, module)] + [
            (f"{name}.{attr}", value)
            for attr, value in vars(module).items()
            if attr != "_modules" and hasattr(value, "forward_modular")
        ]
        for label, candidate in candidates:
            if hasattr(candidate, "forward_modular"):
                found.setdefault(id(candidate), (label, candidate))
    return list(found.values())
