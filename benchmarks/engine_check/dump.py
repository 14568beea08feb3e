"""The MoE dump of the `variance` runs: every MoE layer's inputs and output, call by call, in
the batch run and in the one-by-one runs of the logprob check, and their comparison row by
row (where batch and one by one first differ)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .moe import fused_experts, moe_modules

# (name, what it rules in or out) of the MoE layer's dumped tensors, in the order they are made.
DUMP_OPS = (
    ("x", "the MoE layer's input hidden states"),
    ("topk_ids", "the router's expert ids"),
    ("topk_weights", "the router's weights"),
    ("out", "the routed experts' output"),
)


class MoeDump:
    """Every MoE layer's inputs and output (hidden states, top-k ids and weights, the routed
    experts' output), call by call, in the batch run and in the one-by-one runs of the logprob
    check; the two compared row by row (``compare_dumps``).

    The hooks wrap each RoutedExperts module's ``forward_modular`` (vLLM 0.24.0: what the MoE
    runner calls, inside the ``moe_forward`` custom op, so Python runs it even with
    torch.compile on; calls inside a CUDA graph capture are not recorded, and replays run no
    Python: prefill of more tokens than the largest capture size runs outside graphs), and
    count the calls of the overlay's unfused fallback (``_apply_dequantized``)."""

    def __init__(self) -> None:
        self.error = ""
        self.phase = "batch"
        self.calls: dict[str, list[dict[str, Any]]] = {"batch": [], "single": []}
        self.layers: dict[str, dict[str, Any]] = {}

    @classmethod
    def install(cls, llm: Any) -> MoeDump:
        dump = cls()
        try:
            llm.apply_model(dump.hook)  # in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0
        except Exception as exc:  # the dump is a diagnosis: the logprob check goes on
            dump.error = f"hooks not installed: {type(exc).__name__}: {exc}"
        return dump

    def hook(self, model: Any) -> int:
        for name, module in moe_modules(model):
            forward = getattr(module, "forward_modular", None)
            method = getattr(module, "quant_method", None)
            if forward is None or method is None:
                continue
            module.forward_modular = self._recorded(name, forward)
            experts = fused_experts(module)
            self.layers[name] = {
                "quant_method": type(method).__name__,
                "experts": type(experts).__name__,
                "unfused_calls": {"batch": 0, "single": 0},
            }
            if experts is not None and hasattr(experts, "_apply_dequantized"):
                experts._apply_dequantized = self._counted(name, experts._apply_dequantized)
        return len(self.layers)

    def _recorded(self, name: str, forward: Any) -> Any:
        import torch

        def recorded(*args: Any, **kwargs: Any) -> Any:
            out = forward(*args, **kwargs)
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return out
            given = dict(zip(("x", "topk_weights", "topk_ids"), args, strict=False)) | kwargs
            result = out[0] if isinstance(out, tuple) else out
            tensors = {k: given[k] for k in ("x", "topk_weights", "topk_ids")} | {"out": result}
            call = {k: t.detach().cpu().clone() for k, t in tensors.items()}
            info = self.layers[name]
            info.setdefault("x_layout", f"{tuple(given['x'].stride())} {given['x'].dtype}")
            self.calls[self.phase].append({"layer": name, **call})
            return out

        return recorded

    def _counted(self, name: str, fallback: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.layers[name]["unfused_calls"][self.phase] += 1
            return fallback(*args, **kwargs)

        return counted

    def finish(self, path: Path) -> dict[str, Any]:
        import torch

        if self.error:
            return {"error": self.error}
        torch.save({"layers": self.layers, "calls": self.calls}, path)
        try:
            summary = compare_dumps(self.calls)
        except Exception as exc:  # the tensors are saved: compare them offline
            summary = {"error": f"comparison failed: {type(exc).__name__}: {exc}"}
        return {"file": str(path), "layers": self.layers, **summary}


def _rows(calls: list[dict[str, Any]], layer: str, key: str) -> Any:
    import torch

    return torch.cat([c[key].reshape(c[key].shape[0], -1) for c in calls if c["layer"] == layer])


def nearest_rows(single: Any, batch: Any) -> tuple[Any, float]:
    """For each row of ``single``, the index of the nearest row of ``batch`` (L2, FP32), and
    the fraction matched exactly: a token's row of the batch run is the one closest to its
    row in its own run (different tokens' hidden states are far apart)."""
    import torch

    batch = batch.float()
    index, exact = [], 0
    for chunk in single.float().split(256):
        distance = torch.cdist(chunk, batch)
        best = distance.min(dim=1)
        index.append(best.indices)
        exact += int((best.values == 0).sum())
    return torch.cat(index), exact / max(1, single.shape[0])


def compare_dumps(calls: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Batch vs one by one, layer by layer (in the order the batch run called them) and op by
    op (DUMP_OPS): the fraction of token rows bitwise identical, the largest |Δ|, the rows
    whose MoE output differs although all its inputs are identical, and the first (layer, op)
    where any row differs."""
    layers = list(dict.fromkeys(c["layer"] for c in calls["batch"]))
    if not layers or not calls["single"]:
        return {"error": "no MoE call recorded in the batch or the one-by-one runs"}
    match, exact = nearest_rows(
        _rows(calls["single"], layers[0], "x"), _rows(calls["batch"], layers[0], "x")
    )
    report: list[dict[str, Any]] = []
    first = None
    for layer in layers:
        row: dict[str, Any] = {"layer": layer}
        same = {}
        for op, what in DUMP_OPS:
            b, s = _rows(calls["batch"], layer, op), _rows(calls["single"], layer, op)
            if b.shape[0] <= int(match.max()) or s.shape[0] != match.shape[0]:
                row[op] = {"error": f"{b.shape[0]} batch rows, {s.shape[0]} single rows"}
                continue
            b = b[match]
            same[op] = (b == s).all(dim=1)
            delta = (b.float() - s.float()).abs().max().item() if b.numel() else 0.0
            row[op] = {"identical_rows": same[op].float().mean().item(), "max_abs": delta}
            if first is None and not bool(same[op].all()):
                first = {"layer": layer, "op": op, "what": what, **row[op]}
        if len(same) == len(DUMP_OPS):
            inputs = same["x"] & same["topk_ids"] & same["topk_weights"]
            row["output_differs_with_same_inputs"] = int((inputs & ~same["out"]).sum())
        report.append(row)
    return {
        "rows_batch": int(_rows(calls["batch"], layers[0], "x").shape[0]),
        "rows_single": int(match.shape[0]),
        "first_layer_input_matched_exactly": exact,
        "per_layer": report,
        "first_difference": first,
    }
