"""The engine check's CPU side: the engine arguments of each run, the plan of phases, and the
report (comparisons, Markdown, where a failed capture broke) from results shaped like a run's."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import engine_e2e as e2e  # noqa: E402

COMMON = {
    "skip_tokenizer_init": True,
    "dtype": "bfloat16",
    "seed": 0,
    "max_model_len": 1024,
    "max_num_seqs": 32,
    "gpu_memory_utilization": 0.6,
    "enable_prefix_caching": False,
    "attention_backend": "TRITON_ATTN",
    "compilation_config": {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24, 32]},
}
KWARGS_CASES = [
    (
        e2e.Run("emulation-L2", "nvfp4-L2", logprobs=True),
        {"tensor_parallel_size": 1, "enable_expert_parallel": False, "moe_backend": "emulation"},
    ),
    (
        e2e.Run("bf16-L12", "bf16-L12", backend="auto", batches=(1, 8, 32)),
        {"tensor_parallel_size": 1, "enable_expert_parallel": False},
    ),
    (
        e2e.Run("marlin-L12", "nvfp4-L12", backend="marlin", batches=(1,), profile=True),
        {
            "tensor_parallel_size": 1,
            "enable_expert_parallel": False,
            "moe_backend": "marlin",
            "profiler_config": {
                "profiler": "torch",
                "torch_profiler_dir": "/profiles/nvfp4-L12",
                "torch_profiler_with_stack": False,
                "torch_profiler_dump_cuda_time_total": False,
            },
        },
    ),
    (
        e2e.Run("emulation-L2-ep2", "nvfp4-L2", tp=2, ep=True),
        {"tensor_parallel_size": 2, "enable_expert_parallel": True, "moe_backend": "emulation"},
    ),
    (
        e2e.Run("fix2", "fp8-L2", backend="triton", ep=True, dp=2, lora=True),
        {
            "tensor_parallel_size": 1,
            "enable_expert_parallel": True,
            "moe_backend": "triton",
            "enable_lora": True,
            "max_loras": 1,
            "max_lora_rank": 8,
        },
    ),
]


@pytest.mark.parametrize(("run", "expected"), KWARGS_CASES, ids=lambda x: getattr(x, "name", ""))
def test_engine_kwargs(run: e2e.Run, expected: dict[str, object]) -> None:
    assert e2e.engine_kwargs(run, Path("/m") / run.model) == {
        "model": f"/m/{run.model}",
        **COMMON,
        **expected,
    }


def test_phases() -> None:
    assert {
        name: (state, [r.name for r in runs]) for name, (state, runs) in e2e.PHASES.items()
    } == {
        "emulation": ("any", ["emulation-L2", "emulation-L12"]),
        "baselines": ("pristine", ["marlin-L2", "marlin-L12", "bf16-L12"]),
        "fix2": ("any", ["fix2-fp8-lora-dp2-ep"]),
        "parallel": ("any", ["emulation-L2-ep2", "emulation-L2-tp2", "emulation-L12-ep2"]),
        "nopdl": ("overlay", ["emulation-L12-nopdl"]),
    }
    # Every speed run is profiled; the control run turns patch 0002's PDL off.
    assert all(r.profile for _, rs in e2e.PHASES.values() for r in rs if r.batches)
    (nopdl,) = e2e.PHASES["nopdl"][1]
    assert (nopdl.model, nopdl.backend, nopdl.env) == (
        "nvfp4-L12",
        "emulation",
        (("VLLM_PATCHSET_NVFP4_NO_PDL", "1"),),
    )
    assert [(state, r.name, r.model, r.backend) for state, r in e2e.round_runs("nvfp4-L48")] == [
        ("overlay", "emulation-L48", "nvfp4-L48", "emulation"),
        ("pristine", "marlin-L48", "nvfp4-L48", "marlin"),
    ]
    # The 48-layer checkpoint (16 GB) is written only when named.
    assert "nvfp4-L48" in e2e.MODELS and "nvfp4-L48" not in e2e.DEFAULT_MODELS
    runs = [r for _, runs in e2e.PHASES.values() for r in runs]
    assert {r.model for r in runs} <= set(e2e.MODELS)
    # Fix 2's path in vLLM 0.24.0: TritonExperts.expects_unquantized_inputs needs a LoRA
    # context, a quantized activation dtype and all2all kernels (data parallel > 1 with expert
    # parallel); the FP8 checkpoint's static input scale makes a1_scale a tensor.
    (fix2,) = e2e.PHASES["fix2"][1]
    assert (fix2.model, fix2.backend, fix2.lora, fix2.dp, fix2.ep) == (
        "fp8-L2",
        "triton",
        True,
        2,
        True,
    )
    assert e2e.MODELS["fp8-L2"] == ("fp8", 2)


GPU_BLOCKS = [
    ([1, 1], 2, [[0], [1]]),
    ([1, 1], 1, None),
    ([2], 2, [[0, 1]]),
    ([1, 2], 2, None),
    ([1, 2], 4, [[0], [1, 2]]),
]


@pytest.mark.parametrize(("needs", "gpus", "expected"), GPU_BLOCKS)
def test_gpu_blocks(needs: list[int], gpus: int, expected: list[list[int]] | None) -> None:
    assert e2e.gpu_blocks(needs, gpus) == expected


def test_compare_logprobs_and_greedy() -> None:
    a = [[-1.0, -2.0], [-3.0, -4.0]]
    b = [[-1.0, -2.5], [-3.0, -3.0]]
    assert e2e.compare_logprobs(a, b) == {
        "positions": 4,
        "identical": 0.5,
        "mean_abs": 0.375,
        "max_abs": 1.0,
    }
    assert e2e.compare_greedy([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]]) == {
        "sequences": 2,
        "identical": 0.5,
        "mean_common_prefix": 2.0,
        "tokens": 3,
    }


# The shape of what vLLM 0.24.0 logged when capture failed (one rank's worker, trimmed).
FAILED_LOG = """\
(Worker_DP0_EP0 pid=3969) ERROR 11-30 08:37:47 [multiproc_executor.py:1000]   File "/tmp/e2e/native/site/vllm/model_executor/layers/fused_moe/modular_kernel.py", line 1200, in apply
(Worker_DP0_EP0 pid=3969) ERROR 11-30 08:37:47 [multiproc_executor.py:1000]     self.fused_experts.apply(
(Worker_DP0_EP0 pid=3969) ERROR 11-30 08:37:47 [multiproc_executor.py:1000]   File "/tmp/e2e/native/site/vllm/model_executor/layers/fused_moe/experts/triton_moe.py", line 248, in apply
(Worker_DP0_EP0 pid=3969) ERROR 11-30 08:37:47 [multiproc_executor.py:1000]     self.a1_scale or self.a1_gscale,
(Worker_DP0_EP0 pid=3969) ERROR 11-30 08:37:47 [multiproc_executor.py:1000] torch.AcceleratorError: CUDA error: operation not permitted when stream is capturing
(Worker_DP0_EP0 pid=3969) ERROR 11-30 08:37:47 [multiproc_executor.py:1000] Search for `cudaErrorStreamCaptureInvalidated' in the CUDA docs.
"""
FRAME = "vllm/model_executor/layers/fused_moe/experts/triton_moe.py:248 (apply): self.a1_scale or self.a1_gscale,"


def test_failing_frame_and_capture_errors() -> None:
    assert e2e.failing_frame(FAILED_LOG) == FRAME
    assert e2e.failing_frame("all fine\n") is None
    assert sorted({m.group(0) for m in e2e.CAPTURE_ERRORS.finditer(FAILED_LOG)}) == [
        "cudaErrorStreamCaptureInvalidated",
        "operation not permitted when stream is capturing",
    ]


def _run(name: str, **extra: object) -> dict[str, Any]:
    return {"name": name, "finished": True, "startup_s": 40.0, "gpus": [0], "guard": ["g"], **extra}


EMULATION = "Nvfp4QuantizationEmulationTritonExperts"


def _layers(*records: tuple[bool | None, bool | None]) -> list[dict[str, Any]]:
    """moe_layers' answer from one worker: a layer per (tiled, fast_scales)."""
    return [
        {
            f"layers.{n}.mlp.experts": {"experts": EMULATION, "tiled": t, "fast_scales": f}
            for n, (t, f) in enumerate(records)
        }
    ]


RESULTS = {
    "pristine-emulation-L2": _run(
        "pristine-emulation-L2",
        logprobs_batch=[[-1.0, -2.0]],
        logprobs_single=[[-1.0, -2.0]],
        greedy=[[5, 6, 7]],
        moe_layers=_layers((None, None), (None, None)),
    ),
    "overlay-emulation-L2": _run(
        "overlay-emulation-L2",
        logprobs_batch=[[-1.0, -2.5]],
        logprobs_single=[[-1.0, -2.0]],
        greedy=[[5, 6, 8]],
        moe_layers=_layers((True, True), (True, False)),
    ),
    "pristine-emulation-L12": _run(
        "pristine-emulation-L12",
        throughput={"1": {"median": 100.0, "repeats": [99.0, 100.0, 101.0]}},
        moe_layers_error="RuntimeError: no pickling",
    ),
    "pristine-fix2-fp8-lora-dp2-ep": {
        "name": "pristine-fix2-fp8-lora-dp2-ep",
        "startup_error": "RuntimeError: Engine core initialization failed.",
        "gpus": [0, 1],
        "guard": [],
        "capture_errors": ["operation not permitted when stream is capturing"],
        "failing_frame": FRAME,
        "ranks": [{"startup_error": "RuntimeError: Engine core initialization failed."}],
    },
}
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
    summary = e2e.summarize(RESULTS)
    assert summary["throughput"] == {
        "0.24.0 emulation, pristine": {"1": {"median": 100.0, "best": 101.0, "worst": 99.0}}
    }
    assert [r["ok"] for r in summary["runs"].values()] == [True, True, True, False]
    assert e2e.markdown(summary, "T", ["n"]) == MARKDOWN


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
    assert e2e.moe_layers(model) == {
        "a": {"experts": "Tiled", "tiled": True, "fast_scales": True},
        "b": {"experts": "Rows", "tiled": False, "fast_scales": False},
        "c": {"experts": "Other", "tiled": None, "fast_scales": None},
    }


def test_report_without_results_writes_nothing(tmp_path: Path) -> None:
    """`report` on a work folder with no run results (a mistyped --work): one line, and no
    report written over the one at --out."""
    out = tmp_path / "out" / "report"
    out.parent.mkdir()
    out.with_suffix(".md").write_text("kept\n")
    (tmp_path / "work" / "results").mkdir(parents=True)
    (tmp_path / "work" / "results" / "deploy-apply.json").write_text("{}")
    for work in (tmp_path / "work", tmp_path / "missing"):
        with pytest.raises(SystemExit, match=r"^no run results in .*: nothing to report$"):
            e2e.main(["report", "--work", str(work), "--out", str(out)])
    assert sorted(p.name for p in out.parent.iterdir()) == ["report.md"]
    assert out.with_suffix(".md").read_text() == "kept\n"


def test_load_results_skips_ranks_and_deploy_reports(tmp_path: Path) -> None:
    for name in ("pristine-x.json", "pristine-x.rank0.json", "deploy-apply.json", "overlay-y.json"):
        (tmp_path / name).write_text(json.dumps({"name": name}))
    assert sorted(e2e.load_results(tmp_path)) == ["overlay-y", "pristine-x"]


# -- setup and the overlay on a kit's site (the README's engine check, on a host with torch only)
def test_setup_with_a_kit_and_the_packed_wheel_then_overlay_apply(
    overlay: Any,
    pristine: Any,
    cache_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`setup --kit KIT --project WHEEL`, then `overlay apply`: the site's vllm-patchset (the
    packed wheel) deploys the overlay it carries, not the checkout's (which a GPU host without
    network has not built: here a checkout with no overlay at all), with only the kit's wheels
    beside it (the tool's dependencies among them)."""
    import hashlib

    from test_pack import dependency_wheels
    from vllm_install import OVERLAID
    from vllm_patchset.cli import main
    from vllm_patchset.gpu.kitbuild import write_kit

    dist = tmp_path / "dist"
    assert (
        main(["--project", str(overlay.project.root), "overlay", "pack", "--out", str(dist)]) == 0
    )
    wheel = next(dist.glob("*.whl"))
    kit = tmp_path / "kit"
    digest = hashlib.sha256(pristine.wheel.read_bytes()).hexdigest()
    write_kit(pristine.wheel, digest, "0.24.0", kit, wheels=dependency_wheels(cache_dir), level=0)
    work = tmp_path / "work"
    capsys.readouterr()

    assert e2e.main(["setup", "--work", str(work), "--kit", str(kit), "--project", str(wheel)]) == 0
    site = work / "native" / "site"
    assert capsys.readouterr().out == f"vLLM with its compiled ops and vllm-patchset in {site}\n"
    assert e2e._host(work).packed()
    monkeypatch.setattr(e2e, "REPO", tmp_path / "unbuilt-checkout")  # no overlay built there

    assert e2e.main(["overlay", "apply", "--work", str(work)]) == 0
    for rel in OVERLAID:
        assert (site / rel).read_bytes() == overlay.patched(rel)
    report = json.loads((work / "results" / "deploy-apply.json").read_text())
    assert (report["outcome"], report["target"]) == ("applied", str(site / "vllm"))
    assert e2e._host(work).state() == "overlay"
    assert e2e.main(["overlay", "revert", "--work", str(work)]) == 0
    assert e2e._host(work).state() == "pristine"


def test_all_stops_after_a_failed_apply(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`all`: no overlay phase runs once `overlay apply` failed (they would measure the
    pristine install under the overlay's name); the revert still runs, no report is written."""
    calls: list[object] = []

    def called(value: object, code: int = 0) -> int:
        calls.append(value)
        return code

    monkeypatch.setattr(e2e, "cmd_checkpoints", lambda args: 0)
    monkeypatch.setattr(e2e.Host, "state", lambda self: "pristine")
    monkeypatch.setattr(e2e, "run_phases", lambda host, names, gpus: called(tuple(names)))
    monkeypatch.setattr(
        e2e, "cmd_overlay", lambda args: called(args.action, int(args.action == "apply"))
    )
    monkeypatch.setattr(e2e, "cmd_report", lambda args: called("report"))
    with pytest.raises(SystemExit, match=r"^overlay apply failed \(above\): no overlay runs$"):
        e2e.main(["all", "--work", str(tmp_path), "--gpus", "1"])
    assert calls == [("emulation", "baselines"), "apply", "revert"]


def test_a_run_through_json_is_the_same_run() -> None:
    """What the parent hands the worker process: a run, with its environment, as JSON."""
    (run,) = e2e.PHASES["nopdl"][1]
    assert e2e._run_from_json(json.dumps(dataclasses.asdict(run))) == run


def test_gpu_busy_counts_overlapping_spans_once() -> None:
    """The union of the GPU's kernels, copies and memsets (two kernels overlapping, as
    programmatic dependent launch overlaps them), per step; CPU events and instant events
    are not the GPU's."""
    events = [
        {"cat": "kernel", "ts": 100.0, "dur": 10.0},
        {"cat": "kernel", "ts": 105.0, "dur": 10.0},  # overlaps the first: 100-115
        {"cat": "gpu_memcpy", "ts": 120.0, "dur": 4.0},
        {"cat": "gpu_memset", "ts": 121.0, "dur": 1.0},  # inside the copy
        {"cat": "kernel", "ts": 130.0, "dur": 2.0},
        {"cat": "cpu_op", "ts": 0.0, "dur": 500.0},
        {"cat": "kernel", "ts": 200.0},  # no duration: not a span
    ]
    assert e2e.gpu_busy(events, steps=2) == {"busy_us_per_step": 10.5, "kernels_per_step": 2.0}


def _speed(name: str, medians: dict[str, float], busy: dict[str, float]) -> dict[str, Any]:
    return _run(
        name,
        throughput={b: {"median": m, "repeats": [m]} for b, m in medians.items()},
        gpu_profile={
            b: {"busy_us_per_step": u, "kernels_per_step": 100.0} for b, u in busy.items()
        },
    )


ROUND_RESULTS = {
    "overlay-emulation-L12-r1": _speed("overlay-emulation-L12-r1", {"1": 500.0}, {"1": 800.0}),
    "pristine-marlin-L12-r1": _speed("pristine-marlin-L12-r1", {"1": 400.0}, {"1": 1000.0}),
    "overlay-emulation-L12-r2": _speed("overlay-emulation-L12-r2", {"1": 450.0}, {"1": 790.0}),
}


def test_rounds_and_gpu_time_in_the_report() -> None:
    """Round 1 has both runs and is reported; round 2 lacks Marlin's and is not. Each
    profiled run's GPU busy time per step stands beside its wall time per step."""
    summary = e2e.summarize(ROUND_RESULTS)
    assert summary["rounds"] == [
        {"layers": 12, "round": 1, "overlay": {"1": 500.0}, "marlin": {"1": 400.0}}
    ]
    assert summary["gpu"]["pristine-marlin-L12-r1"] == {
        "1": {"busy_us_per_step": 1000.0, "kernels_per_step": 100.0, "wall_us_per_step": 2500.0}
    }
    text = e2e.markdown(summary, "T")
    assert (
        "| layers | round | batch 1 |\n|---:|---:|---:|\n| 12 | 1 | 500 / 400 (1.25x) |\n" in text
    )
    assert (
        "| run | batch 1 |\n|---|---:|\n| overlay-emulation-L12-r1 | 800 / 2000 |\n"
        "| pristine-marlin-L12-r1 | 1000 / 2500 |\n| overlay-emulation-L12-r2 | 790 / 2222 |\n"
    ) in text


def test_rounds_taken_together_in_the_table_and_the_figure() -> None:
    """With two rounds or more of a depth, the table ends in their medians and the range of
    the overlay / Marlin ratio over them; the figure's bars are those medians, slowest to
    fastest, after the phases' engines."""
    results = {
        f"{engine}-L48-r{i}": _speed(f"{engine}-L48-r{i}", {"1": value}, {"1": 1.0})
        for i, (overlay, marlin) in enumerate([(300.0, 240.0), (290.0, 250.0), (310.0, 245.0)], 1)
        for engine, value in (("overlay-emulation", overlay), ("pristine-marlin", marlin))
    }
    results["pristine-marlin-L12"] = _speed("pristine-marlin-L12", {"1": 400.0}, {"1": 1.0})
    summary = e2e.summarize(results)
    assert e2e.round_spread(summary["rounds"]) == {
        (48, "overlay"): {"1": {"median": 300.0, "worst": 290.0, "best": 310.0}},
        (48, "marlin"): {"1": {"median": 245.0, "worst": 240.0, "best": 250.0}},
    }
    assert (
        "| 48 | 3 | 310 / 245 (1.27x) |\n| 48 | median of 3 | 300 / 245 (1.16x to 1.27x) |\n"
        in (e2e.markdown(summary, "T"))
    )
    assert e2e.plot_rows(summary) == {
        "Marlin (0.24.0's default on Hopper)": {
            "1": {"median": 400.0, "best": 400.0, "worst": 400.0}
        },
        "overlay, 48 layers (3 rounds)": {"1": {"median": 300.0, "worst": 290.0, "best": 310.0}},
        "Marlin, 48 layers (3 rounds)": {"1": {"median": 245.0, "worst": 240.0, "best": 250.0}},
    }


def test_one_round_in_the_figure_and_a_long_title_wrapped() -> None:
    """One round of a depth is "1 round" in the figure's legend, and a title longer than the
    figure is wide goes on two lines instead of off the figure's edges."""
    results = {
        f"{engine}-L48-r1": _speed(f"{engine}-L48-r1", {"1": value}, {"1": 1.0})
        for engine, value in (("overlay-emulation", 296.0), ("pristine-marlin", 239.0))
    }
    rows = e2e.plot_rows(e2e.summarize(results))
    assert list(rows) == ["overlay, 48 layers (1 round)", "Marlin, 48 layers (1 round)"]
    title = "vLLM 0.24.0 engine, NVFP4 Qwen3-MoE at Qwen3-30B-A3B's 48 layers (E=128, H=2048,"
    title += " I=768, top-8), H200, the final kernel"
    assert e2e.figure_title(title) == (
        "vLLM 0.24.0 engine, NVFP4 Qwen3-MoE at Qwen3-30B-A3B's 48 layers (E=128, H=2048, I=768,"
        "\ntop-8), H200, the final kernel"
    )
    assert e2e.figure_title("NVFP4, H200") == "NVFP4, H200"


def test_rounds_interleave_the_overlay_and_marlin(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`rounds`: apply, the overlay's run, revert, Marlin's run, round after round, each run
    named for its round; a failed apply stops before its run."""
    calls: list[object] = []
    applies: list[int] = []

    def overlay(args: Any) -> int:
        calls.append(args.action)
        if args.action == "apply":
            applies.append(1)
            return int(len(applies) == 3)  # the third apply fails
        return 0

    def engine(host: Any, run: Any, state: str, gpus: list[int]) -> dict[str, Any]:
        calls.append(f"{state}-{run.name}")
        return _run(f"{state}-{run.name}")

    monkeypatch.setattr(e2e.Host, "state", lambda self: "pristine")
    monkeypatch.setattr(e2e, "cmd_overlay", overlay)
    monkeypatch.setattr(e2e, "run_engine", engine)
    for bad in (["--rounds", "0"], ["--first", "-1"], ["--rounds", "two"]):
        with pytest.raises(SystemExit) as exit_info:  # argparse: one line on stderr, exit 2
            e2e.main(["rounds", "--work", str(tmp_path), *bad])
        assert exit_info.value.code == 2
    with pytest.raises(SystemExit, match=r"^no checkpoint .*/models/nvfp4-L12: run `checkpoints"):
        e2e.main(["rounds", "--work", str(tmp_path)])
    assert calls == []
    (tmp_path / "models" / "nvfp4-L12").mkdir(parents=True)
    (tmp_path / "models" / "nvfp4-L48").mkdir()
    assert e2e.main(["rounds", "--work", str(tmp_path), "--rounds", "2"]) == 0
    assert calls == [
        "apply",
        "overlay-emulation-L12-r1",
        "revert",
        "pristine-marlin-L12-r1",
        "apply",
        "overlay-emulation-L12-r2",
        "revert",
        "pristine-marlin-L12-r2",
    ]
    calls.clear()
    with pytest.raises(SystemExit, match=r"^overlay apply failed \(above\): no more rounds$"):
        e2e.main(["rounds", "--work", str(tmp_path), "--rounds", "1"])
    assert calls == ["apply"]
    calls.clear()  # a later call adds round 3 on the 48-layer model
    args = ["rounds", "--work", str(tmp_path), "--model", "nvfp4-L48", "--rounds", "1"]
    assert e2e.main([*args, "--first", "3"]) == 0
    assert calls == ["apply", "overlay-emulation-L48-r3", "revert", "pristine-marlin-L48-r3"]


# -- the float64 reference -----------------------------------------------------------------------
REFERENCE = {"w4a4": [[-1.0, -2.0], [-3.0, -0.5]], "w4a16": [[-1.25, -2.0], [-3.0, -0.5]]}


def _logprob_runs() -> dict[str, dict[str, Any]]:
    """Two runs of the pristine emulation (the phase's and numerics' first), one of the overlay
    and of Marlin, a failed one (left out), and one of another check (not an engine judged)."""
    series = {
        "pristine-emulation-L2": [[-1.5, -2.0], [-3.0, -0.5]],  # |Δ| 0.5, 0, 0, 0
        "pristine-emulation-L2-n1": [[-1.0, -2.0], [-3.0, -0.1]],  # 0, 0, 0, 0.4
        "overlay-emulation-L2-n1": [[-1.0, -2.25], [-3.0, -0.5]],  # 0, 0.25, 0, 0
        "pristine-marlin-L2-n1": [[-1.25, -2.0], [-3.0, -0.5]],  # 0.25, 0, 0, 0
        "overlay-emulation-L2-ep2": [[-9.0, -9.0], [-9.0, -9.0]],
    }
    runs = {name: _run(name, logprobs_batch=s) for name, s in series.items()}
    runs["overlay-emulation-L2-n2"] = {"name": "overlay-emulation-L2-n2", "startup_error": "x"}
    return runs


def test_engines_against_the_float64_reference() -> None:
    ok = {n: r for n, r in _logprob_runs().items() if e2e._ok(r)}
    rows = e2e.against_reference(ok, REFERENCE)
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
    assert e2e.closer_verdict(rows) == (
        "The overlay at least as close to the W4A4 reference as the pristine emulation: yes"
        " (0.0625 vs 0.1125 nats, mean over runs)."
    )
    assert e2e.closer_verdict(rows[:1]) is None


def test_the_reference_in_the_report() -> None:
    summary = e2e.summarize(_logprob_runs(), REFERENCE)
    lines = e2e.markdown(summary, "T").splitlines()
    head = "| engine | runs | vs W4A4: mean |Δ| | max |Δ| | vs W4A16: mean |Δ| | max |Δ| |"
    table = lines.index(head)
    assert lines[table : table + 7] == [
        head,
        "|---|---:|---:|---:|---:|---:|",
        "| 0.24.0 emulation, pristine | 2 | 0.1125 (0.1000 to 0.1250) | 0.500 | 0.1125 (0.0625"
        " to 0.1625) | 0.400 |",
        "| 0.24.0 emulation + overlay | 1 | 0.0625 (0.0625 to 0.0625) | 0.250 | 0.1250 (0.1250"
        " to 0.1250) | 0.250 |",
        "| Marlin W4A16 (0.24.0's default on Hopper) | 1 | 0.0625 (0.0625 to 0.0625) | 0.250 |"
        " 0.0000 (0.0000 to 0.0000) | 0.000 |",
        "",
        "The overlay at least as close to the W4A4 reference as the pristine emulation: yes"
        " (0.0625 vs 0.1125 nats, mean over runs).",
    ]
    assert "over 4 positions" in lines[table - 2]
    assert e2e.summarize(_logprob_runs())["reference"] == []  # no reference: no section
    assert head not in e2e.markdown(e2e.summarize(_logprob_runs()), "T").splitlines()


def test_load_results_skips_the_reference(tmp_path: Path) -> None:
    (tmp_path / "pristine-x.json").write_text("{}")
    (tmp_path / "reference-fp64-nvfp4-L2.json").write_text(json.dumps(REFERENCE))
    assert sorted(e2e.load_results(tmp_path)) == ["pristine-x"]
    assert e2e.load_reference(tmp_path) == REFERENCE
    assert e2e.load_reference(tmp_path, "nvfp4-L12") is None


def test_reference_logprobs_of_a_checkpoint(tmp_path: Path) -> None:
    """`reference`'s computation on a small NVFP4 checkpoint: W4A4 and W4A16 logprobs, one per
    prompt token after the first."""
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    import engine_checkpoint

    model = engine_checkpoint.MoeModel(
        layers=1, experts=4, hidden=64, intermediate=32, top_k=2, vocab=64, heads=2, kv_heads=1,
        head_dim=16,
    )  # fmt: skip
    folder = engine_checkpoint.write_model(model, "nvfp4", tmp_path / "nvfp4-L2")
    texts = [[3, 9, 27, 50], [4, 8, 15, 16]]
    got = e2e.reference_logprobs(folder, texts, "cpu")
    assert (got["model"], got["device"], got["prompts"]) == ("nvfp4-L2", "cpu", 2)
    assert [len(p) for p in got["w4a4"]] == [3, 3]
    assert [len(p) for p in got["w4a16"]] == [3, 3]
    assert all(x < 0 for p in got["w4a4"] for x in p)


def test_reference_needs_the_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"^no checkpoint .*/models/nvfp4-L2: run `checkpoints"):
        e2e.main(["reference", "--work", str(tmp_path)])


def test_numerics_repeats_the_three_engines(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`numerics`: per run the overlay's engine (applied, then reverted), the pristine
    emulation's and Marlin's, teacher-forced logprobs only, each named for its run."""
    calls: list[object] = []

    def overlay(args: Any) -> int:
        calls.append(args.action)
        return 0

    def engine(host: Any, run: Any, state: str, gpus: list[int]) -> dict[str, Any]:
        calls.append((f"{state}-{run.name}", run.backend, run.logprobs, run.batches))
        return _run(f"{state}-{run.name}")

    monkeypatch.setattr(e2e.Host, "state", lambda self: "pristine")
    monkeypatch.setattr(e2e, "cmd_overlay", overlay)
    monkeypatch.setattr(e2e, "run_engine", engine)
    (tmp_path / "models" / "nvfp4-L2").mkdir(parents=True)
    assert e2e.main(["numerics", "--work", str(tmp_path), "--runs", "2", "--first", "2"]) == 0
    assert calls == [
        "apply",
        ("overlay-emulation-L2-n2", "emulation", True, ()),
        "revert",
        ("pristine-emulation-L2-n2", "emulation", True, ()),
        ("pristine-marlin-L2-n2", "marlin", True, ()),
        "apply",
        ("overlay-emulation-L2-n3", "emulation", True, ()),
        "revert",
        ("pristine-emulation-L2-n3", "emulation", True, ()),
        ("pristine-marlin-L2-n3", "marlin", True, ()),
    ]


def test_phases_refuse_a_checkpoint_not_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`phases baselines` without the BF16 checkpoint failed deep in transformers
    (`HFValidationError: Repo id must be ...`); refused in one line now, as `rounds` does,
    before any engine starts or the install is asked its state."""
    calls: list[str] = []

    def state(self: object) -> str:
        calls.append("state")
        return "pristine"

    def engine(*args: object) -> dict[str, object]:
        calls.append("engine")
        return {}

    monkeypatch.setattr(e2e.Host, "state", state)
    monkeypatch.setattr(e2e, "run_engine", engine)
    for name in ("nvfp4-L2", "nvfp4-L12"):
        (tmp_path / "models" / name).mkdir(parents=True)
    with pytest.raises(SystemExit) as refused:
        e2e.main(["phases", "baselines", "--work", str(tmp_path), "--gpus", "1"])
    assert str(refused.value) == (
        f"no checkpoint {tmp_path / 'models' / 'bf16-L12'}: run `checkpoints bf16-L12`"
    )
    with pytest.raises(SystemExit) as refused:
        e2e.main(["phases", "fix2", "parallel", "--work", str(tmp_path), "--gpus", "1"])
    assert str(refused.value) == (
        f"no checkpoint {tmp_path / 'models' / 'fp8-L2'}: run `checkpoints fp8-L2`"
    )
    assert calls == []
