"""The engines against the float64 reference: per engine and run, the spread, the verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_check import numerics, report, results
from engine_check.runs import RESULTS
from engine_results import REFERENCE, logprob_runs, run_result


def test_engines_against_the_float64_reference() -> None:
    ok = {n: r for n, r in logprob_runs().items() if results.measured(r)}
    rows = numerics.against_reference(ok, REFERENCE)
    assert [(r["engine"], r["runs"]) for r in rows] == [
        ("0.24.0 emulation, pristine", ["pristine-emulation-L2", "pristine-emulation-L2-n1"]),
        ("0.24.0 emulation + overlay", ["overlay-emulation-L2-n1"]),
        ("Marlin W4A16 (0.24.0's default on Hopper)", ["pristine-marlin-L2-n1"]),
    ]
    pristine, overlay, marlin = rows
    assert pristine["w4a4"] == {
        "mean": pytest.approx(0.1125),  # runs of 0.125 and 0.1
        "lowest": pytest.approx(0.1),
        "highest": pytest.approx(0.125),
        "stdev": pytest.approx(0.025 / 2**0.5),
        "max_abs": pytest.approx(0.5),
        "positions": 4,
    }
    assert (overlay["w4a4"]["mean"], overlay["w4a4"]["stdev"]) == (0.0625, 0.0)
    assert (marlin["w4a4"]["mean"], marlin["w4a16"]["mean"]) == (0.0625, 0.0)
    assert numerics.closer_verdict(rows) == (
        "The overlay at least as close to the W4A4 reference as the pristine emulation: yes"
        " (0.0625 vs 0.1125 nats, mean over runs)."
    )
    assert numerics.closer_verdict(rows[:1]) is None


ENGINE_RUN_CASES = [  # (a run's name, whether it is a run of pristine-emulation-L12)
    ("pristine-emulation-L12", True),  # a phase's run with batch logprobs
    ("pristine-emulation-L12-n1", True),
    ("pristine-emulation-L12-n10", True),
    ("pristine-emulation-L2-n1", False),  # another model
    ("pristine-emulation-L1", False),
    ("pristine-emulation-L12-layers", False),  # the `layers` check
    ("pristine-emulation-L12-r1", False),  # a round
    ("pristine-emulation-L12-ep2", False),
    ("overlay-emulation-L12-n1", False),  # another engine
    ("pristine-emulation-L12-n", False),
]


@pytest.mark.parametrize(("name", "ok"), ENGINE_RUN_CASES)
def test_engine_runs_are_the_runs_and_repeats_of_one_model(name: str, ok: bool) -> None:
    runs = {name: run_result(name, logprobs_batch=[[-1.0]])}
    assert numerics.engine_runs(runs, "pristine-emulation-L12") == ([name] if ok else [])


def test_a_run_without_batch_logprobs_is_not_judged() -> None:
    runs = {"pristine-emulation-L12": run_result("pristine-emulation-L12")}
    assert numerics.engine_runs(runs, "pristine-emulation-L12") == []


@pytest.mark.parametrize(
    ("model", "layers"), [("nvfp4-L2", 2), ("nvfp4-L12", 12), ("nvfp4-L48", 48), ("nvfp4", None)]
)
def test_model_layers(model: str, layers: int | None) -> None:
    assert numerics.model_layers(model) == layers


def test_reference_logprobs_of_a_checkpoint(tmp_path: Path) -> None:
    """`reference`'s computation on a small NVFP4 checkpoint: W4A4 and W4A16 logprobs, one per
    prompt token after the first."""
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from engine_check import checkpoint as engine_checkpoint

    model = engine_checkpoint.MoeModel(
        layers=1, experts=4, hidden=64, intermediate=32, top_k=2, vocab=64, heads=2, kv_heads=1,
        head_dim=16,
    )  # fmt: skip
    folder = engine_checkpoint.write_model(model, "nvfp4", tmp_path / "nvfp4-L2")
    texts = [[3, 9, 27, 50], [4, 8, 15, 16]]
    got = numerics.reference_logprobs(folder, texts, "cpu")
    assert (got["model"], got["device"], got["prompts"]) == ("nvfp4-L2", "cpu", 2)
    assert [len(p) for p in got["w4a4"]] == [3, 3]
    assert [len(p) for p in got["w4a16"]] == [3, 3]
    assert all(x < 0 for p in got["w4a4"] for x in p)


def test_per_position_kept_and_paired_with_the_pristine_emulation() -> None:
    """Each run's |Δ| against W4A4 per prompt and position; the overlay's (one run) minus the
    pristine emulation's (two runs, averaged per position): prompt 1 level (-0.25 + 0.25),
    prompt 2 the overlay closer (0 - 0.2)."""
    ok = {n: r for n, r in logprob_runs().items() if results.measured(r)}
    rows = numerics.against_reference(ok, REFERENCE)
    pristine, overlay, _ = rows
    assert pristine["w4a4_per_position"] == {
        "pristine-emulation-L2": [[0.5, 0.0], [0.0, 0.0]],
        "pristine-emulation-L2-n1": [[0.0, 0.0], [0.0, 0.4]],
    }
    assert overlay["w4a4_per_position"] == {"overlay-emulation-L2-n1": [[0.0, 0.25], [0.0, 0.0]]}
    result = numerics.paired_with_pristine(rows)
    assert result is not None
    assert (result["mean"], result["first_closer"], result["second_closer"]) == (-0.05, 1, 0)
    assert numerics.paired_with_pristine(rows[:1]) is None


def test_a_summary_without_per_position_data_says_the_paired_comparison_is_missing() -> None:
    """A summary `report` wrote before the per-position |Δ| were kept (the committed one of
    the float64 comparison, its per-position data and pairing taken out) renders: the means'
    verdict, then that the paired one is missing."""
    summary = json.loads((RESULTS / "engine_e2e_h200_fp64.json").read_text())
    del summary["paired"]
    for row in summary["reference"]:
        row.pop("w4a4_per_position", None)
    lines = report.markdown(summary, "T").splitlines()
    verdict = lines.index(
        "The overlay at least as close to the W4A4 reference as the pristine emulation: NO"
        " (0.1591 vs 0.1545 nats, mean over runs)."
    )
    assert lines[verdict + 2] == (
        "The paired comparison (the overlay minus the pristine emulation, prompt by prompt) is"
        " missing: these results keep no per-position |Δ|."
    )
    rows = [{k: v for k, v in r.items() if k != "w4a4_per_position"} for r in summary["reference"]]
    assert numerics.paired_with_pristine(rows) is None


def test_the_committed_summary_pairs_the_two_emulations() -> None:
    """The committed float64 comparison (two runs of each engine on the H200) renders its
    paired verdict and figures."""
    summary = json.loads((RESULTS / "engine_e2e_h200_fp64.json").read_text())
    lines = report.markdown(summary, "T").splitlines()
    verdict = lines.index(
        "The overlay against the W4A4 reference, beside the pristine emulation: not as close"
        " (the interval excludes 0) (0.1591 vs 0.1545 nats, mean over runs)."
    )
    assert lines[verdict + 2] == (
        "Paired over the 32 prompts (per position, each engine's |Δ| averaged over its runs, the"
        " overlay's minus the pristine emulation's): mean +0.0046 nats, 95% bootstrap interval"
        " +0.0012 to +0.0084 (2000 resamples of the prompts, seed 0); the overlay closer on 12 of"
        " the 32 prompts, the pristine emulation on 20."
    )
