"""The report from results shaped like a run's: the summary and its Markdown."""

from __future__ import annotations

from engine_check import report
from engine_results import (
    REFERENCE,
    REFERENCE_L12,
    RESULTS,
    ROUND_RESULTS,
    logprob_runs,
    run_result,
    two_model_runs,
)

MARKDOWN = """\
# T

Note: n

Teacher-forced logprobs, 2-layer model, 32 prompts of 96 tokens (nats; |Δ| per prompt position):

| comparison | positions | identical | mean abs Δ | max abs Δ |
|---|---:|---:|---:|---:|
| pristine: batch of 32 vs one by one | 2 | 100.0% | 0.0000 | 0.0000 |
| overlay: batch of 32 vs one by one | 2 | 50.0% | 0.2500 | 0.5000 |
| pristine vs overlay | 2 | 50.0% | 0.2500 | 0.5000 |

Greedy tokens, 2-layer model (32 tokens after each prompt):

| comparison | identical sequences | mean common prefix |
|---|---:|---:|
| pristine vs overlay | 0% | 2.0 / 3 |

Generation throughput, 12-layer model, 128 greedy tokens after a 32-token prompt, CUDA graphs, tokens/s: median of 3 (slowest to fastest):

| engine | batch 1 |
|---|---:|
| 0.24.0 emulation, pristine | 100 (99 to 101) |

Fix 2 in the engine: an FP8 model with static per-tensor activation scales, LoRA enabled, data parallel 2 with expert parallel (TritonExperts defers the input quantization to apply(), with a tensor a1_scale):

- pristine-fix2-fp8-lora-dp2-ep: start-up failed: operation not permitted when stream is capturing, at vllm/model_executor/layers/fused_moe/experts/triton_moe.py:248 (apply): self.a1_scale or self.a1_gscale,

Runs:

| run | GPUs | outcome | start-up (s) | guard plugin | MoE layers |
|---|---|---|---:|---|---|
| pristine-emulation-L2 | 0 | ok | 40.0 | g | 2 Nvfp4QuantizationEmulationTritonExperts |
| overlay-emulation-L2 | 0 | ok | 40.0 | g | 2 Nvfp4QuantizationEmulationTritonExperts, 2 tiled, 1 fast scales |
| pristine-emulation-L12 | 0 | ok | 40.0 | g | not recorded: RuntimeError: no pickling |
| pristine-fix2-fp8-lora-dp2-ep | 0,1 | FAILED: operation not permitted when stream is capturing | — | — | — |
"""


def test_summary_and_markdown() -> None:
    summary = report.summarize(RESULTS)
    assert summary["throughput"] == {
        "0.24.0 emulation, pristine": {"1": {"median": 100.0, "best": 101.0, "worst": 99.0}}
    }
    assert [r["ok"] for r in summary["runs"].values()] == [True, True, True, False]
    assert report.markdown(summary, "T", ["n"]) == MARKDOWN


def test_rounds_and_gpu_time_in_the_report() -> None:
    """Round 1 has both runs and is reported; round 2 lacks Marlin's and is not. Each
    profiled run's GPU busy time per step stands beside its wall time per step."""
    summary = report.summarize(ROUND_RESULTS)
    assert summary["rounds"] == [
        {"layers": 12, "round": 1, "overlay": {"1": 500.0}, "marlin": {"1": 400.0}}
    ]
    assert summary["gpu"]["pristine-marlin-L12-r1"] == {
        "1": {"busy_us_per_step": 1000.0, "kernels_per_step": 100.0, "wall_us_per_step": 2500.0}
    }
    text = report.markdown(summary, "T")
    assert (
        "| layers | round | batch 1 |\n|---:|---:|---:|\n| 12 | 1 | 500 / 400 (1.25x) |\n" in text
    )
    assert (
        "| run | batch 1 |\n|---|---:|\n| overlay-emulation-L12-r1 | 800 / 2000 |\n"
        "| pristine-marlin-L12-r1 | 1000 / 2500 |\n| overlay-emulation-L12-r2 | 790 / 2222 |\n"
    ) in text


def test_the_reference_in_the_report() -> None:
    summary = report.summarize(logprob_runs(), {"nvfp4-L2": REFERENCE})
    lines = report.markdown(summary, "T").splitlines()
    head = "| engine | runs | vs W4A4: mean |Δ| | max |Δ| | vs W4A16: mean |Δ| | max |Δ| |"
    table = lines.index(head)
    assert lines[table : table + 11] == [
        head,
        "|---|---:|---:|---:|---:|---:|",
        "| 0.24.0 emulation, pristine | 2 | 0.1125 (0.1000 to 0.1250) | 0.500 | 0.1125 (0.0625"
        " to 0.1625) | 0.400 |",
        "| 0.24.0 emulation + overlay | 1 | 0.0625 (0.0625 to 0.0625) | 0.250 | 0.1250 (0.1250"
        " to 0.1250) | 0.250 |",
        "| Marlin W4A16 (0.24.0's default on Hopper) | 1 | 0.0625 (0.0625 to 0.0625) | 0.250 |"
        " 0.0000 (0.0000 to 0.0000) | 0.000 |",
        "",
        "The overlay against the W4A4 reference, beside the pristine emulation: at least as"
        " close (0.0625 vs 0.1125 nats, mean over runs).",
        "",
        "Paired over the 2 prompts (per position, each engine's |Δ| averaged over its runs, the"
        " overlay's minus the pristine emulation's): mean -0.0500 nats, 95% bootstrap interval"
        " -0.1000 to +0.0000 (2000 resamples of the prompts, seed 0); the overlay closer on 1 of"
        " the 2 prompts, the pristine emulation on 0.",
        "",
        # the overlay's run against each of the pristine emulation's two: 0.1875 and 0.1625
        "Engine vs engine: the overlay's logprobs against the pristine emulation's themselves,"
        " mean |Δ| 0.1750 nats (max 0.500; mean over 2 pairs of runs, each with each), beside"
        " their distances from the W4A4 reference: 0.0625 (overlay) and 0.1125 (pristine"
        " emulation) nats.",
    ]
    assert "the 2-layer checkpoint's" in lines[table - 2]
    assert "over 4 positions" in lines[table - 2]
    assert report.summarize(logprob_runs())["references"] == []  # no reference: no section
    assert head not in report.markdown(report.summarize(logprob_runs()), "T").splitlines()


def test_the_layer_check_in_the_report() -> None:
    """A `layers` run's figures: in the summary (JSON) as rows, in the Markdown after the
    logprob table; a run that failed (not measured) gives none."""
    figures = {"rel_frobenius": 0.025, "mean_abs": 0.001, "max_abs": 0.05}
    floor = {"rel_frobenius": 0.0011, "mean_abs": 1e-05, "max_abs": 0.0039}
    row = {
        "layer": "model.layers.0.mlp.experts",
        "index": 0,
        "calls": 1,
        "tokens": 3072,
        "w4a4": {**figures, "bf16_floor": floor},
        "w4a16": {**figures, "bf16_floor": floor},
    }
    results = {
        **RESULTS,
        "overlay-emulation-L2-layers": run_result(
            "overlay-emulation-L2-layers", moe_layers_vs_float64={"own": "w4a4", "layers": [row]}
        ),
        "pristine-emulation-L2-layers": {
            "name": "pristine-emulation-L2-layers",
            "startup_error": "x",
            "moe_layers_vs_float64": {"own": "w4a4", "layers": [row]},
        },
    }
    summary = report.summarize(results)
    assert summary["layers"] == [
        {
            "engine": "0.24.0 emulation + overlay",
            "name": "overlay-emulation-L2-layers",
            "own": "w4a4",
            **row,
        }
    ]
    text = report.markdown(summary, "T")
    assert (
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        "| 0.24.0 emulation + overlay | 0 | 1 | 3072 | 2.50% | 1.00e-03 | 5.00e-02 | 2.50%"
        " | 1.00e-03 | 0.11% | 1.00e-05 |\n\nGreedy tokens"
    ) in text
    assert report.summarize(RESULTS)["layers"] == []


L12_SECTION = [
    "Against the float64 reference (benchmarks/engine_check/reference.py: the 12-layer checkpoint's"
    " exact forward in float64, W4A4 as vLLM's reference quantization defines it, W4A16 without"
    " activation quantization): each engine's teacher-forced logprobs of the batch of 32, mean"
    " |Δ| in nats over 4 positions; over the runs: their mean (lowest to highest), and the"
    " largest |Δ| of any run:",
    "",
    "| engine | runs | vs W4A4: mean |Δ| | max |Δ| | vs W4A16: mean |Δ| | max |Δ| |",
    "|---|---:|---:|---:|---:|---:|",
    "| 0.24.0 emulation, pristine | 1 | 0.1250 (0.1250 to 0.1250) | 0.500 | 0.2500 (0.2500 to"
    " 0.2500) | 0.500 |",
    "| 0.24.0 emulation + overlay | 2 | 0.0938 (0.0625 to 0.1250) | 0.500 | 0.0938 (0.0000 to"
    " 0.1875) | 0.500 |",
    "| Marlin W4A16 (0.24.0's default on Hopper) | 1 | 0.1250 (0.1250 to 0.1250) | 0.500 |"
    " 0.0000 (0.0000 to 0.0000) | 0.000 |",
    "",
    "The overlay against the W4A4 reference, beside the pristine emulation: at least as close"
    " (0.0938 vs 0.1250 nats, mean over runs).",
    "",
    "Paired over the 2 prompts (per position, each engine's |Δ| averaged over its runs, the"
    " overlay's minus the pristine emulation's): mean -0.0312 nats, 95% bootstrap interval"
    " -0.1250 to +0.0625 (2000 resamples of the prompts, seed 0); the overlay closer on 1 of the"
    " 2 prompts, the pristine emulation on 1.",
    "",
    # the overlay's two runs against the pristine emulation's one: 0.25 and 0.1875
    "Engine vs engine: the overlay's logprobs against the pristine emulation's themselves, mean"
    " |Δ| 0.2188 nats (max 0.500; mean over 2 pairs of runs, each with each), beside their"
    " distances from the W4A4 reference: 0.0938 (overlay) and 0.1250 (pristine emulation) nats.",
    "",
]


def test_each_model_against_its_own_reference() -> None:
    """Two models, each with its float64 reference: a section each, the 2-layer model's first
    (as before), then the 12-layer model's from its `numerics` runs alone (not its throughput
    run without logprobs, not the 2-layer `layers` runs with theirs)."""
    references = {"nvfp4-L12": REFERENCE_L12, "nvfp4-L2": REFERENCE}
    summary = report.summarize(two_model_runs(), references)
    sections = summary["references"]
    assert [(s["model"], s["layers"]) for s in sections] == [("nvfp4-L2", 2), ("nvfp4-L12", 12)]
    assert [r["runs"] for r in sections[1]["engines"]] == [
        ["pristine-emulation-L12-n1"],
        ["overlay-emulation-L12-n1", "overlay-emulation-L12-n2"],
        ["pristine-marlin-L12-n1"],
    ]
    assert sections[1]["apart"] == {
        "a": "overlay-emulation-L12",
        "b": "pristine-emulation-L12",
        "pairs": 2,
        "mean_abs": 0.21875,
        "max_abs": 0.5,
        "positions": 4,
    }
    assert sections[0] == report.summarize(logprob_runs(), {"nvfp4-L2": REFERENCE})["references"][0]
    lines = report.markdown(summary, "T").splitlines()
    start = lines.index(L12_SECTION[0])
    assert lines[start : start + len(L12_SECTION)] == L12_SECTION
    assert lines.index(L12_SECTION[0].replace("12-layer", "2-layer")) < start


def test_a_reference_without_its_engines_runs_has_no_section() -> None:
    """The 12-layer reference alone, with only 2-layer runs (and `layers` runs): no section;
    a reference whose model name has no layer count: none either."""
    runs = {n: r for n, r in two_model_runs().items() if "-L12" not in n}
    summary = report.summarize(runs, {"nvfp4-L12": REFERENCE_L12, "other": REFERENCE})
    assert summary["references"] == []
    assert "Against the float64 reference" not in report.markdown(summary, "T")
