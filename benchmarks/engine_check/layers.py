"""Each engine's MoE layers on its own inputs: every call of a MoE layer the engine made in the
logprob check's batch (MoeDump records its hidden states, top-k ids and weights, and output),
against the float64 experts (reference.py ``experts_forward``) on exactly that call's inputs,
W4A4 and W4A16; beside it the floor a BF16 output cannot go below (the float64 output rounded
to BF16). The router is not judged: the engine's top-k ids and weights are taken as it gave
them (vLLM's router already renormalised them where the config says so, as reference.py
``route`` does).

The comparison runs in the worker, on its GPU, call by call (``compare_calls``); only the
figures come back. ``layer_rows`` and ``layer_lines`` are the report's part (no torch)."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

# The float64 experts each engine is judged against: activations quantized (W4A4, what the
# emulations compute) and not (W4A16, what Marlin computes).
KINDS = ("w4a4", "w4a16")
# The engines of the layer check (`layers`): (label, result name, its own reference kind).
LAYER_ENGINES = (
    ("0.24.0 emulation, pristine", "pristine-emulation-L2-layers", "w4a4"),
    ("0.24.0 emulation + overlay", "overlay-emulation-L2-layers", "w4a4"),
    ("Marlin W4A16", "pristine-marlin-L2-layers", "w4a16"),
)
RESULT_KEY = "moe_layers_vs_float64"
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_index(module: str) -> int:
    """The decoder layer a vLLM MoE module belongs to: ``model.layers.1.mlp.experts`` -> 1."""
    found = _LAYER_INDEX.search(module)
    if found is None:
        raise ValueError(f"no decoder layer in the module name {module!r}")
    return int(found.group(1))


@dataclasses.dataclass(frozen=True)
class Sums:
    """What the figures of a layer's calls add up from: sum of squared differences, sum of the
    reference's squares, sum of |differences|, the largest |difference|, elements."""

    squared: float = 0.0
    reference: float = 0.0
    absolute: float = 0.0
    largest: float = 0.0
    elements: int = 0

    def __add__(self, other: Sums) -> Sums:
        return Sums(
            self.squared + other.squared,
            self.reference + other.reference,
            self.absolute + other.absolute,
            max(self.largest, other.largest),
            self.elements + other.elements,
        )

    def figures(self) -> dict[str, float]:
        """Relative Frobenius error ||out - ref|| / ||ref||, mean and max |out - ref|."""
        return {
            "rel_frobenius": math.sqrt(self.squared / self.reference) if self.reference else 0.0,
            "mean_abs": self.absolute / self.elements if self.elements else 0.0,
            "max_abs": self.largest,
        }


def sums(out: Any, ref: Any) -> Sums:
    """The Sums of one call: ``out`` against ``ref`` (float64 tensors of one shape)."""
    delta = out - ref
    return Sums(
        float(delta.square().sum()),
        float(ref.square().sum()),
        float(delta.abs().sum()),
        float(delta.abs().max()) if delta.numel() else 0.0,
        delta.numel(),
    )


def compare_calls(ckpt: Any, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per MoE layer (in the order of its first call): its calls and token rows, and per kind
    of KINDS the engine's outputs against the float64 experts on each call's inputs and the
    float64 output rounded to BF16 against itself (``bf16_floor``). ``ckpt`` is a
    reference.Checkpoint on the device the comparison runs on; one layer's experts of one
    kind at a time, one call at a time there."""
    import torch

    from .reference import experts_forward

    rows = []
    for module in dict.fromkeys(c["layer"] for c in calls):
        mine = [c for c in calls if c["layer"] == module]
        index = layer_index(module)
        row: dict[str, Any] = {
            "layer": module,
            "index": index,
            "calls": len(mine),
            "tokens": sum(int(c["x"].shape[0]) for c in mine),
        }
        for kind in KINDS:
            experts = ckpt.experts(index, kind)
            engine, floor = Sums(), Sums()
            for call in mine:
                x, ids = call["x"].to(ckpt.device), call["topk_ids"].to(ckpt.device)
                weights = call["topk_weights"].to(ckpt.device).double()
                ref = experts_forward(experts, x.double(), weights, ids.long())
                engine += sums(call["out"].to(ckpt.device).double(), ref)
                floor += sums(ref.bfloat16().double(), ref)
                del x, ids, weights, ref
            row[kind] = {**engine.figures(), "bf16_floor": floor.figures()}
            del experts
            if ckpt.device.startswith("cuda"):
                torch.cuda.empty_cache()
        rows.append(row)
    return rows


def layer_figures(
    dump: Any, calls: list[dict[str, Any]], model: Path, backend: str, device: str = "cuda"
) -> dict[str, Any]:
    """What a `layers` run keeps: the reference kind its engine approximates (``own``: W4A16
    for Marlin), the MoE layers' classes as the dump saw them, and compare_calls' rows; or why
    there are none."""
    from .reference import Checkpoint

    if dump.error or not calls:
        return {"error": dump.error or "no MoE layer call recorded"}
    try:
        rows = compare_calls(Checkpoint(model, device), calls)
    except Exception as exc:  # the figures are a diagnosis: the run's logprobs stand
        return {"error": f"comparison failed: {type(exc).__name__}: {exc}"}
    own = "w4a16" if backend == "marlin" else "w4a4"
    return {"own": own, "experts": dump.layers, "layers": rows}


def layer_rows(ok: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The report's rows: per engine of LAYER_ENGINES that ran, per layer, its figures."""
    rows = []
    for label, name, own in LAYER_ENGINES:
        found = ok.get(name, {}).get(RESULT_KEY)
        if found is None:
            continue
        if "error" in found:
            rows.append({"engine": label, "name": name, "own": own, "error": found["error"]})
            continue
        rows += [{"engine": label, "name": name, "own": own, **layer} for layer in found["layers"]]
    return rows


def _pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def layer_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The report's section: the table, then per layer which emulation is closer to W4A4."""
    if not rows:
        return []
    lines = [
        "MoE layers on each engine's own inputs (`layers`): every call of each MoE layer in the"
        " logprob check's batch, the engine's output against the float64 experts on exactly"
        " that call's hidden states, top-k ids and weights (W4A4: activations quantized as"
        " vLLM's reference quantization defines it; W4A16: not); relative Frobenius error"
        " ||out - ref|| / ||ref|| over the layer's calls, mean |Δ|, and the floor of a BF16"
        " output (the float64 W4A4 output rounded to BF16):",
        "",
        "| engine | layer | calls | tokens | vs W4A4: rel. Frobenius | mean |Δ| | max |Δ|"
        " | vs W4A16: rel. Frobenius | mean |Δ| | BF16 floor: rel. Frobenius | mean |Δ| |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['engine']} | — | — | — | {r['error'][:120]} |||||||")
            continue
        a4, a16, floor = r["w4a4"], r["w4a16"], r["w4a4"]["bf16_floor"]
        lines.append(
            f"| {r['engine']} | {r['index']} | {r['calls']} | {r['tokens']}"
            f" | {_pct(a4['rel_frobenius'])} | {a4['mean_abs']:.2e} | {a4['max_abs']:.2e}"
            f" | {_pct(a16['rel_frobenius'])} | {a16['mean_abs']:.2e}"
            f" | {_pct(floor['rel_frobenius'])} | {floor['mean_abs']:.2e} |"
        )
    return [*lines, "", *closer_lines(rows)]


def closer_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per layer both emulations measured: which is closer to the float64 W4A4 experts on its
    own inputs, with both figures."""
    by = {(r["name"], r["index"]): r for r in rows if "error" not in r}
    lines = []
    for (name, index), overlay in by.items():
        if name != "overlay-emulation-L2-layers":
            continue
        pristine = by.get(("pristine-emulation-L2-layers", index))
        if pristine is None:
            continue
        o, p = overlay["w4a4"]["rel_frobenius"], pristine["w4a4"]["rel_frobenius"]
        closer = "the overlay" if o < p else "the pristine emulation" if p < o else "neither"
        lines.append(
            f"- Layer {index}: closer to the float64 W4A4 experts on its own inputs: {closer}"
            f" ({_pct(o)} the overlay, {_pct(p)} the pristine emulation)."
        )
    return [*lines, ""] if lines else []
