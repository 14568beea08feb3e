"""What each engine run is: the engine arguments of each run and control, the plan of phases,
rounds and numerics, a run through JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from engine_check import runs as engine_runs
from engine_results import CAPTURE

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
        engine_runs.Run("emulation-L2", "nvfp4-L2", logprobs=True),
        {"tensor_parallel_size": 1, "enable_expert_parallel": False, "moe_backend": "emulation"},
    ),
    (
        engine_runs.Run("bf16-L12", "bf16-L12", backend="auto", batches=(1, 8, 32)),
        {"tensor_parallel_size": 1, "enable_expert_parallel": False},
    ),
    (
        engine_runs.Run("marlin-L12", "nvfp4-L12", backend="marlin", batches=(1,), profile=True),
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
        engine_runs.Run("emulation-L2-ep2", "nvfp4-L2", tp=2, ep=True),
        {"tensor_parallel_size": 2, "enable_expert_parallel": True, "moe_backend": "emulation"},
    ),
    (
        engine_runs.Run("fix2", "fp8-L2", backend="triton", ep=True, dp=2, lora=True),
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
def test_engine_kwargs(run: engine_runs.Run, expected: dict[str, object]) -> None:
    assert engine_runs.engine_kwargs(run, Path("/m") / run.model) == {
        "model": f"/m/{run.model}",
        **COMMON,
        **expected,
    }


def test_phases() -> None:
    assert {
        name: (state, [r.name for r in runs]) for name, (state, runs) in engine_runs.PHASES.items()
    } == {
        "emulation": ("any", ["emulation-L2", "emulation-L12"]),
        "baselines": ("pristine", ["marlin-L2", "marlin-L12", "bf16-L12"]),
        "fix2": ("any", ["fix2-fp8-lora-dp2-ep"]),
        "parallel": ("any", ["emulation-L2-ep2", "emulation-L2-tp2", "emulation-L12-ep2"]),
        "nopdl": ("overlay", ["emulation-L12-nopdl"]),
    }
    # Every speed run is profiled; the control run turns patch 0002's PDL off.
    assert all(r.profile for _, rs in engine_runs.PHASES.values() for r in rs if r.batches)
    (nopdl,) = engine_runs.PHASES["nopdl"][1]
    assert (nopdl.model, nopdl.backend, nopdl.env) == (
        "nvfp4-L12",
        "emulation",
        (("VLLM_PATCHSET_NVFP4_NO_PDL", "1"),),
    )
    assert [
        (state, r.name, r.model, r.backend) for state, r in engine_runs.round_runs("nvfp4-L48")
    ] == [
        ("overlay", "emulation-L48", "nvfp4-L48", "emulation"),
        ("pristine", "marlin-L48", "nvfp4-L48", "marlin"),
    ]
    # The 48-layer checkpoint (16 GB) is written only when named.
    assert "nvfp4-L48" in engine_runs.MODELS and "nvfp4-L48" not in engine_runs.DEFAULT_MODELS
    runs = [r for _, runs in engine_runs.PHASES.values() for r in runs]
    assert {r.model for r in runs} <= set(engine_runs.MODELS)
    # Fix 2's path in vLLM 0.24.0: TritonExperts.expects_unquantized_inputs needs a LoRA
    # context, a quantized activation dtype and all2all kernels (data parallel > 1 with expert
    # parallel); the FP8 checkpoint's static input scale makes a1_scale a tensor.
    (fix2,) = engine_runs.PHASES["fix2"][1]
    assert (fix2.model, fix2.backend, fix2.lora, fix2.dp, fix2.ep) == (
        "fp8-L2",
        "triton",
        True,
        2,
        True,
    )
    assert engine_runs.MODELS["fp8-L2"] == ("fp8", 2)


def test_a_run_through_json_is_the_same_run() -> None:
    """What the parent hands the worker process: a run, with its environment, as JSON."""
    (run,) = engine_runs.PHASES["nopdl"][1]
    assert engine_runs.run_from_json(json.dumps(dataclasses.asdict(run))) == run


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
    run = next(r for r in engine_runs.VARIANCE_RUNS if r.name == name)
    kwargs = engine_runs.engine_kwargs(run, Path("/m"))
    plain = engine_runs.engine_kwargs(engine_runs.VARIANCE_RUNS[0], Path("/m"))
    assert {k: v for k, v in kwargs.items() if plain.get(k) != v} == {
        k: v for k, v in controls.items() if plain.get(k) != v
    }
    assert (run.logprobs, run.model) == (True, "nvfp4-L2")


HOOK_CASES = [
    (engine_runs.Run("a", "nvfp4-L2"), False),
    (engine_runs.Run("a", "nvfp4-L2", dump=True), True),
    (engine_runs.Run("a", "nvfp4-L2", layers=True), True),
]


@pytest.mark.parametrize(("run", "hooks"), HOOK_CASES)
def test_the_runs_that_hook_the_moe_layers(run: engine_runs.Run, hooks: bool) -> None:
    """A dump or a layer check hooks the MoE layers: the engine core runs in the worker."""
    assert run.hooks_moe is hooks


def test_layer_runs() -> None:
    assert engine_runs.layer_runs("nvfp4-L2") == (
        ("overlay", engine_runs.Run("emulation-L2-layers", "nvfp4-L2", layers=True)),
        ("pristine", engine_runs.Run("emulation-L2-layers", "nvfp4-L2", layers=True)),
        (
            "pristine",
            engine_runs.Run("marlin-L2-layers", "nvfp4-L2", backend="marlin", layers=True),
        ),
    )


@pytest.mark.parametrize(
    ("engines", "names"),
    [
        (("overlay",), [("overlay", "emulation-L2-layers")]),
        (
            ("marlin", "pristine"),
            [("pristine", "emulation-L2-layers"), ("pristine", "marlin-L2-layers")],
        ),
        (("marlin",), [("pristine", "marlin-L2-layers")]),
    ],
)
def test_layer_runs_of_some_engines(engines: tuple[str, ...], names: list[tuple[str, str]]) -> None:
    """`layers --engines`: those engines only, in the order all three run."""
    runs = engine_runs.layer_runs("nvfp4-L2", engines)
    assert [(state, run.name) for state, run in runs] == names
