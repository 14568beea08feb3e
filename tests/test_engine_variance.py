"""The engine check's batch-variance controls on the CPU: the engine arguments of each control,
and the comparison of dumped MoE layer tensors (batch run vs one by one) and its report, on
tensors shaped like a dump's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import engine_e2e as e2e  # noqa: E402

CAPTURE = {"cudagraph_capture_sizes": e2e.CAPTURE_SIZES}
CONTROL_CASES = [
    ("emulation-L2", {"compilation_config": CAPTURE}),
    ("emulation-L2-eager", {"compilation_config": CAPTURE, "enforce_eager": True}),
    ("emulation-L2-nocompile", {"compilation_config": {**CAPTURE, "mode": 0}}),
    ("emulation-L2-nographs", {"compilation_config": {**CAPTURE, "cudagraph_mode": "NONE"}}),
    ("emulation-L2-dump", {"compilation_config": CAPTURE}),
    (
        "emulation-L2-eager-dump",
        {"compilation_config": CAPTURE, "enforce_eager": True},
    ),
]


@pytest.mark.parametrize(("name", "controls"), CONTROL_CASES)
def test_control_kwargs(name: str, controls: dict[str, Any]) -> None:
    run = next(r for r in e2e.VARIANCE_RUNS if r.name == name)
    kwargs = e2e.engine_kwargs(run, Path("/m"))
    plain = e2e.engine_kwargs(e2e.VARIANCE_RUNS[0], Path("/m"))
    assert {k: v for k, v in kwargs.items() if plain.get(k) != v} == {
        k: v for k, v in controls.items() if plain.get(k) != v
    }
    assert (run.logprobs, run.model) == (True, "nvfp4-L2")


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
    report = e2e.compare_dumps({"batch": batch, "single": single})
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
    assert [layer0[op]["identical_rows"] for op, _ in e2e.DUMP_OPS] == [1.0, 1.0, 1.0, 1.0]
    assert layer1["output_differs_with_same_inputs"] == 1


def test_compare_dumps_without_calls() -> None:
    assert e2e.compare_dumps({"batch": [], "single": []}) == {
        "error": "no MoE call recorded in the batch or the one-by-one runs"
    }


def test_variance_report() -> None:
    same = [[-1.0, -2.0]]
    results = {
        "overlay-emulation-L2-eager": {
            "finished": True,
            "kwargs": {"enforce_eager": True, "compilation_config": CAPTURE},
            "logprobs_batch": same,
            "logprobs_single": [[-1.0, -2.5]],
        },
        "pristine-emulation-L2-dump": {
            "finished": True,
            "kwargs": {"compilation_config": CAPTURE},
            "logprobs_batch": same,
            "logprobs_single": same,
            "moe_dump": {"first_difference": None, "per_layer": [], "layers": {}},
        },
    }
    rows = e2e.variance_summary(results)
    assert [r["run"] for r in rows] == ["pristine-emulation-L2-dump", "overlay-emulation-L2-eager"]
    lines = e2e.variance_markdown(rows).splitlines()
    assert lines[4:] == [
        "| pristine-emulation-L2-dump | 100.0% | 0.0000 | 0.0000 | none: every layer's inputs"
        " and output identical |",
        "| overlay-emulation-L2-eager | 50.0% | 0.2500 | 0.5000 | — |",
    ]
