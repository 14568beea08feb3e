"""The report from results shaped like a run's: the summary and its Markdown."""

from __future__ import annotations

from engine_check import report
from engine_results import (
    REFERENCE,
    RESULTS,
    ROUND_RESULTS,
    logprob_runs,
    run_result,
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
    summary = report.summarize(logprob_runs(), REFERENCE)
    lines = report.markdown(summary, "T").splitlines()
    head = "| engine | runs | vs W4A4: mean |Δ| | max |Δ| | vs W4A16: mean |Δ| | max |Δ| |"
    table = lines.index(head)
    assert lines[table : table + 9] == [
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
    ]
    assert "over 4 positions" in lines[table - 2]
    assert report.summarize(logprob_runs())["reference"] == []  # no reference: no section
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
