"""The MoE dump's comparison (batch run vs one by one) on tensors shaped like a dump's."""

from __future__ import annotations

from typing import Any

import pytest
from engine_check import dump

torch = pytest.importorskip("torch", reason="the dump comparison runs torch")


def _calls(rows: list[int], outputs: dict[str, Any], split: int) -> list[dict[str, Any]]:
    """Calls of two MoE layers over token rows ``rows`` (ids of a token, its data made from
    it), ``split`` rows a call, as one forward pass after another; ``outputs`` change a
    layer's output of some tokens."""
    calls = []
    for start in range(0, len(rows), split):
        ids = torch.tensor(rows[start : start + split])
        for layer in ("model.layers.0.mlp.experts", "model.layers.1.mlp.experts"):
            x = ids[:, None].float() * torch.ones(len(ids), 4) + (layer[13] == "1")
            out = x * 2
            for token in outputs.get(layer, ()):
                out[ids == token] += 0.5
            calls.append(
                {
                    "layer": layer,
                    "x": x.bfloat16(),
                    "topk_ids": (ids[:, None] % 3).int().expand(-1, 2),
                    "topk_weights": torch.full((len(ids), 2), 0.5),
                    "out": out.bfloat16(),
                }
            )
    return calls


def test_compare_dumps_finds_the_first_difference() -> None:
    batch = _calls([0, 1, 2, 3, 4, 5], {"model.layers.1.mlp.experts": [4]}, split=6)
    single = _calls([3, 4, 0, 1, 2, 5], {}, split=2)  # one prompt after the other
    report = dump.compare_dumps({"batch": batch, "single": single})
    assert (report["rows_batch"], report["rows_single"]) == (6, 6)
    assert report["first_layer_input_matched_exactly"] == 1.0
    assert report["first_difference"] == {
        "layer": "model.layers.1.mlp.experts",
        "op": "out",
        "what": "the routed experts' output",
        "identical_rows": pytest.approx(5 / 6),
        "max_abs": 0.5,
    }
    layer0, layer1 = report["per_layer"]
    assert [layer0[op]["identical_rows"] for op, _ in dump.DUMP_OPS] == [1.0, 1.0, 1.0, 1.0]
    assert layer1["output_differs_with_same_inputs"] == 1


def test_compare_dumps_without_calls() -> None:
    assert dump.compare_dumps({"batch": [], "single": []}) == {
        "error": "no MoE call recorded in the batch or the one-by-one runs"
    }
