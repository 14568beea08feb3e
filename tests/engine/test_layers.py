"""The MoE layer check (benchmarks/engine_check/layers.py) on the CPU: recorded calls of a tiny
NVFP4 checkpoint's MoE layers against its float64 experts, and the report's table."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the layer check runs torch (pip install torch)")
pytest.importorskip("safetensors.torch", reason="it reads safetensors files")
import torch
from engine_check import checkpoint as ckpt
from engine_check import dump, layers
from engine_check import reference as ref

TINY = ckpt.MoeModel(
    layers=2, experts=8, hidden=64, intermediate=32, top_k=3, vocab=256, heads=4, kv_heads=2,
    head_dim=16,
)  # fmt: skip
MODULES = ("model.layers.0.mlp.experts", "model.layers.1.mlp.experts")

LAYER_NAMES = [
    ("model.layers.0.mlp.experts", 0),
    ("model.layers.11.mlp.experts", 11),
    ("layers.3.mlp.experts.runner", 3),
]


@pytest.mark.parametrize(("module", "index"), LAYER_NAMES)
def test_layer_index(module: str, index: int) -> None:
    assert layers.layer_index(module) == index


def test_a_module_without_a_layer_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^no decoder layer in the module name 'lm_head'$"):
        layers.layer_index("lm_head")


def test_sums_add_up_to_the_figures() -> None:
    """out [3, 0] against ref [0, 4]: ||Δ|| = 5, ||ref|| = 4; then [1] against [1]."""
    first = layers.sums(torch.tensor([3.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 4.0]))
    total = first + layers.sums(torch.tensor([1.0]), torch.tensor([1.0]))
    assert total == layers.Sums(squared=25.0, reference=17.0, absolute=7.0, largest=4.0, elements=3)
    assert total.figures() == {
        "rel_frobenius": math.sqrt(25.0 / 17.0),
        "mean_abs": 7.0 / 3.0,
        "max_abs": 4.0,
    }
    assert layers.Sums().figures() == {"rel_frobenius": 0.0, "mean_abs": 0.0, "max_abs": 0.0}


def recorded_calls(folder: Path, kind: str, rows: tuple[int, ...]) -> list[dict[str, Any]]:
    """Calls as MoeDump records them (both layers per forward, ``rows`` tokens each): BF16
    hidden states, int32 ids and FP32 weights of the float64 router, and as output the
    float64 ``kind`` experts' rounded to BF16 (a perfect BF16 engine)."""
    model = ref.Checkpoint(folder, "cpu")
    gen = torch.Generator().manual_seed(3)
    calls = []
    for count in rows:
        for index, module in enumerate(MODULES):
            x = torch.randn(count, TINY.hidden, generator=gen).bfloat16()
            logits = x.double() @ model.f64(f"model.layers.{index}.mlp.gate.weight").T
            weights, ids = ref.route(logits, TINY.top_k, renormalize=True)
            weights, ids = weights.float(), ids.int()
            experts = model.experts(index, kind)
            out = ref.experts_forward(experts, x.double(), weights.double(), ids.long())
            calls.append(
                {
                    "layer": module,
                    "x": x,
                    "topk_ids": ids,
                    "topk_weights": weights,
                    "out": out.bfloat16(),
                }
            )
    return calls


@pytest.mark.parametrize("kind", layers.KINDS)
def test_a_bf16_engine_exact_but_for_rounding_sits_on_the_floor(tmp_path: Path, kind: str) -> None:
    """An engine whose output is its own reference kind's float64 output rounded to BF16 is
    exactly at the BF16 floor against that kind, below 2^-8 relative, and further off
    against the other kind (the activations' E2M1 rounding)."""
    folder = ckpt.write_model(TINY, "nvfp4", tmp_path / "nvfp4")
    calls = recorded_calls(folder, kind, rows=(5, 7))
    rows = layers.compare_calls(ref.Checkpoint(folder, "cpu"), calls)
    assert [(r["layer"], r["index"], r["calls"], r["tokens"]) for r in rows] == [
        (MODULES[0], 0, 2, 12),
        (MODULES[1], 1, 2, 12),
    ]
    other = "w4a16" if kind == "w4a4" else "w4a4"
    for row in rows:
        own = row[kind]
        assert {k: own[k] for k in ("rel_frobenius", "mean_abs", "max_abs")} == own["bf16_floor"]
        assert 0.0 < own["rel_frobenius"] < 2**-8
        assert row[other]["rel_frobenius"] > 10 * own["rel_frobenius"]
        # The floor is that of the other kind's float64 output: as small, not the same.
        assert 0.0 < row[other]["bf16_floor"]["rel_frobenius"] < 2**-8


def test_the_float64_output_itself_is_exact(tmp_path: Path) -> None:
    folder = ckpt.write_model(TINY, "nvfp4", tmp_path / "nvfp4")
    calls = recorded_calls(folder, "w4a4", rows=(4,))
    model = ref.Checkpoint(folder, "cpu")
    for index, call in enumerate(calls):
        experts = model.experts(index, "w4a4")
        weights = call["topk_weights"].double()
        call["out"] = ref.experts_forward(experts, call["x"].double(), weights, call["topk_ids"])
    rows = layers.compare_calls(model, calls)
    assert [r["w4a4"]["max_abs"] for r in rows] == [0.0, 0.0]
    assert [r["w4a4"]["rel_frobenius"] for r in rows] == [0.0, 0.0]


def figures(rel: float, mean: float, peak: float) -> dict[str, float]:
    return {"rel_frobenius": rel, "mean_abs": mean, "max_abs": peak}


def layer(index: int, w4a4: float, w4a16: float) -> dict[str, Any]:
    return {
        "layer": f"model.layers.{index}.mlp.experts",
        "index": index,
        "calls": 1,
        "tokens": 3072,
        "w4a4": {**figures(w4a4, 0.001, 0.05), "bf16_floor": figures(0.0011, 1e-5, 0.0039)},
        "w4a16": {**figures(w4a16, 0.002, 0.1), "bf16_floor": figures(0.0011, 1e-5, 0.0039)},
    }


RESULTS = {
    "pristine-emulation-L2-layers": {
        "finished": True,
        layers.RESULT_KEY: {"own": "w4a4", "layers": [layer(0, 0.03, 0.05), layer(1, 0.02, 0.06)]},
    },
    "overlay-emulation-L2-layers": {
        "finished": True,
        layers.RESULT_KEY: {"own": "w4a4", "layers": [layer(0, 0.025, 0.05), layer(1, 0.02, 0.07)]},
    },
    "pristine-marlin-L2-layers": {
        "finished": True,
        layers.RESULT_KEY: {"error": "no MoE layer call recorded"},
    },
}
HEAD = (
    "| engine | layer | calls | tokens | vs W4A4: rel. Frobenius | mean |Δ| | max |Δ|"
    " | vs W4A16: rel. Frobenius | mean |Δ| | BF16 floor: rel. Frobenius | mean |Δ| |"
)


def test_the_table_and_which_emulation_is_closer() -> None:
    rows = layers.layer_rows(RESULTS)
    assert [(r["name"], r.get("index")) for r in rows] == [
        ("pristine-emulation-L2-layers", 0),
        ("pristine-emulation-L2-layers", 1),
        ("overlay-emulation-L2-layers", 0),
        ("overlay-emulation-L2-layers", 1),
        ("pristine-marlin-L2-layers", None),
    ]
    lines = layers.layer_lines(rows)
    table = lines.index(HEAD)
    assert lines[table:] == [
        HEAD,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| 0.24.0 emulation, pristine | 0 | 1 | 3072 | 3.00% | 1.00e-03 | 5.00e-02 | 5.00%"
        " | 2.00e-03 | 0.11% | 1.00e-05 |",
        "| 0.24.0 emulation, pristine | 1 | 1 | 3072 | 2.00% | 1.00e-03 | 5.00e-02 | 6.00%"
        " | 2.00e-03 | 0.11% | 1.00e-05 |",
        "| 0.24.0 emulation + overlay | 0 | 1 | 3072 | 2.50% | 1.00e-03 | 5.00e-02 | 5.00%"
        " | 2.00e-03 | 0.11% | 1.00e-05 |",
        "| 0.24.0 emulation + overlay | 1 | 1 | 3072 | 2.00% | 1.00e-03 | 5.00e-02 | 7.00%"
        " | 2.00e-03 | 0.11% | 1.00e-05 |",
        "| Marlin W4A16 | — | — | — | no MoE layer call recorded |||||||",
        "",
        "- Layer 0: closer to the float64 W4A4 experts on its own inputs: the overlay (2.50% the"
        " overlay, 3.00% the pristine emulation).",
        "- Layer 1: closer to the float64 W4A4 experts on its own inputs: neither (2.00% the"
        " overlay, 2.00% the pristine emulation).",
        "",
    ]
    assert layers.layer_lines([]) == []


class Experts(torch.nn.Module):
    """A MoE layer's routed experts as vLLM 0.24.0's runner calls them (``forward_modular``
    with keywords, on the router's top k): the float64 W4A4 experts, output in BF16."""

    def __init__(self, experts: ref.Experts) -> None:
        super().__init__()
        self.experts, self.quant_method = experts, object()

    def forward_modular(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, **_: Any
    ) -> torch.Tensor:
        out = ref.experts_forward(self.experts, x.double(), topk_weights.double(), topk_ids)
        return out.bfloat16()


class Engine:
    """What MoeDump.install needs of vLLM's LLM: ``apply_model`` on the model in this process."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def apply_model(self, func: Any) -> Any:
        return func(self.model)


def test_the_calls_a_dump_records_are_compared(tmp_path: Path) -> None:
    """End to end on the CPU but for vLLM: MoeDump's hooks record the calls of the batch,
    layer_figures compares them with the checkpoint's float64 experts (the worker's path)."""
    folder = ckpt.write_model(TINY, "nvfp4", tmp_path / "nvfp4")
    model = ref.Checkpoint(folder, "cpu")
    routed = [Experts(model.experts(0, "w4a4")), Experts(model.experts(1, "w4a4"))]
    layer_list = torch.nn.ModuleList(
        torch.nn.ModuleDict({"mlp": torch.nn.ModuleDict({"experts": experts})})
        for experts in routed
    )
    net = torch.nn.ModuleDict({"model": torch.nn.ModuleDict({"layers": layer_list})})
    recorder = dump.MoeDump.install(Engine(net))
    assert (recorder.error, sorted(recorder.layers)) == ("", list(MODULES))
    for call in recorded_calls(folder, "w4a4", rows=(6,)):  # one forward: layer 0, then 1
        routed[layers.layer_index(call["layer"])].forward_modular(
            x=call["x"], topk_weights=call["topk_weights"], topk_ids=call["topk_ids"],
            shared_experts=None, shared_experts_input=None,
        )  # fmt: skip
    result = layers.layer_figures(recorder, recorder.calls["batch"], folder, "emulation", "cpu")
    assert result["own"] == "w4a4"
    assert result["experts"][MODULES[0]]["quant_method"] == "object"
    assert [(r["index"], r["calls"], r["tokens"]) for r in result["layers"]] == [
        (0, 1, 6),
        (1, 1, 6),
    ]
    for row in result["layers"]:
        own = {k: row["w4a4"][k] for k in ("rel_frobenius", "mean_abs", "max_abs")}
        assert own == row["w4a4"]["bf16_floor"]
    assert layers.layer_figures(recorder, [], folder, "marlin", "cpu") == {
        "error": "no MoE layer call recorded"
    }
    stray = [{**recorder.calls["batch"][0], "layer": "lm_head"}]
    assert layers.layer_figures(recorder, stray, folder, "emulation", "cpu") == {
        "error": "comparison failed: ValueError: no decoder layer in the module name 'lm_head'"
    }
