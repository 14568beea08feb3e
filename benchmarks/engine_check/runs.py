"""What each engine run is: the checkpoints, the runs of every phase, of `rounds`, `numerics`
and `variance`, the prompts, and the `LLM(...)` arguments a run gets.

Pure data and pure functions: the parent (schedule.py, cli.py) plans with them, the worker
(worker.py) starts its engine from them."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
VOCAB = 32768
LOGPROB_PROMPTS, LOGPROB_LEN = 32, 96
GREEDY_TOKENS = 32
THROUGHPUT_PROMPT, THROUGHPUT_TOKENS, REPEATS = 32, 128, 3
CAPTURE_SIZES = [1, 2, 4, 8, 16, 24, 32]


@dataclasses.dataclass(frozen=True)
class Run:
    """One engine: a checkpoint, a MoE backend, a parallel layout and what to measure."""

    name: str
    model: str  # the checkpoint's folder under WORK/models
    backend: str = "emulation"  # moe_backend ("auto" for BF16 and the fix-2 model)
    tp: int = 1
    ep: bool = False
    dp: int = 1
    lora: bool = False
    logprobs: bool = False
    greedy: bool = False
    batches: tuple[int, ...] = ()
    # Controls of the logprob check (VARIANCE_RUNS): no torch.compile and no CUDA graphs
    # (enforce_eager), torch.compile off (compilation mode 0), CUDA graphs off, and a dump of
    # every MoE layer's inputs and outputs in the batch and the one-by-one runs.
    eager: bool = False
    compile: bool = True
    graphs: bool = True
    dump: bool = False
    # The logprob check's batch alone, every MoE layer call compared in the worker with the
    # float64 experts on that call's inputs (`layers`, layers.py).
    layers: bool = False
    # One more generation per batch under torch's profiler (gpu_busy), and the environment
    # the engine gets beside ENGINE_ENV ((name, value) pairs).
    profile: bool = False
    env: tuple[tuple[str, str], ...] = ()

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def hooks_moe(self) -> bool:
        """Whether the worker hooks the MoE layers (MoeDump): the engine core must then run
        in the worker's process."""
        return self.dump or self.layers


MODELS = {  # folder -> (format, layers)
    "nvfp4-L2": ("nvfp4", 2),
    "nvfp4-L12": ("nvfp4", 12),
    "bf16-L12": ("bf16", 12),
    "fp8-L2": ("fp8", 2),
    # Qwen3-30B-A3B's depth (about 16 GB): there the GPU's share of a step outweighs the
    # host's. Written only when named (`checkpoints nvfp4-L48`), for `rounds --model`.
    "nvfp4-L48": ("nvfp4", 48),
}
DEFAULT_MODELS = tuple(name for name in MODELS if name != "nvfp4-L48")
NUMERICS: dict[str, Any] = {"logprobs": True, "greedy": True}
SPEED: dict[str, Any] = {"batches": (1, 8, 32), "profile": True}
# The overlay's speed run without programmatic dependent launch (patch 0002's switch;
# tests/gpu/moe_setup.py names it too).
NO_PDL_ENV = "VLLM_PATCHSET_NVFP4_NO_PDL"
# A phase: runs one after the other on GPUs of their own, and the state the vLLM install must
# be in ("pristine", "overlay" or "any"). Phases given together run side by side when there
# are GPUs enough.
PHASES: dict[str, tuple[str, tuple[Run, ...]]] = {
    "emulation": (
        "any",
        (
            Run("emulation-L2", "nvfp4-L2", **NUMERICS),
            Run("emulation-L12", "nvfp4-L12", **SPEED),
        ),
    ),
    "baselines": (
        "pristine",
        (
            Run("marlin-L2", "nvfp4-L2", backend="marlin", **NUMERICS),
            Run("marlin-L12", "nvfp4-L12", backend="marlin", **SPEED),
            Run("bf16-L12", "bf16-L12", backend="auto", **SPEED),
        ),
    ),
    "fix2": (
        "any",
        (Run("fix2-fp8-lora-dp2-ep", "fp8-L2", backend="triton", ep=True, dp=2, lora=True),),
    ),
    "parallel": (
        "any",
        (
            Run("emulation-L2-ep2", "nvfp4-L2", tp=2, ep=True, **NUMERICS),
            Run("emulation-L2-tp2", "nvfp4-L2", tp=2, **NUMERICS),
            Run("emulation-L12-ep2", "nvfp4-L12", tp=2, ep=True, **SPEED),
        ),
    ),
    "nopdl": (
        "overlay",
        (Run("emulation-L12-nopdl", "nvfp4-L12", env=((NO_PDL_ENV, "1"),), **SPEED),),
    ),
}


def round_runs(model: str) -> tuple[tuple[str, Run], tuple[str, Run]]:
    """`rounds`: one round is the overlay's speed run on ``model`` (the overlay applied), then
    Marlin's (reverted)."""
    layers = MODELS[model][1]
    return (
        ("overlay", Run(f"emulation-L{layers}", model, **SPEED)),
        ("pristine", Run(f"marlin-L{layers}", model, backend="marlin", **SPEED)),
    )


def numerics_runs(model: str, i: int) -> tuple[tuple[str, Run], ...]:
    """`numerics`: one run is the overlay's emulation (the overlay applied), then the pristine
    emulation's and Marlin's (reverted), teacher-forced logprobs only, named ``...-nI``."""
    layers = MODELS[model][1]
    return (
        ("overlay", Run(f"emulation-L{layers}-n{i}", model, logprobs=True)),
        ("pristine", Run(f"emulation-L{layers}-n{i}", model, logprobs=True)),
        ("pristine", Run(f"marlin-L{layers}-n{i}", model, backend="marlin", logprobs=True)),
    )


# `layers`' engines, in the order they run: the overlay's emulation, the pristine one, Marlin.
LAYER_ENGINES = ("overlay", "pristine", "marlin")


def layer_runs(model: str, engines: tuple[str, ...] = LAYER_ENGINES) -> tuple[tuple[str, Run], ...]:
    """`layers`: the overlay's emulation (the overlay applied), then the pristine emulation's
    and Marlin's (reverted), those of ``engines``, each MoE layer call compared with the
    float64 experts."""
    layers = MODELS[model][1]
    runs = {
        "overlay": ("overlay", Run(f"emulation-L{layers}-layers", model, layers=True)),
        "pristine": ("pristine", Run(f"emulation-L{layers}-layers", model, layers=True)),
        "marlin": (
            "pristine",
            Run(f"marlin-L{layers}-layers", model, backend="marlin", layers=True),
        ),
    }
    return tuple(runs[e] for e in LAYER_ENGINES if e in engines)


# On the 2-layer model, each the logprob check (batch of 32 vs one by one) with one control;
# `variance` runs them on the install as it is (pristine or overlay) beside the plain check.
VARIANCE_RUNS = (
    Run("emulation-L2", "nvfp4-L2", logprobs=True),
    Run("emulation-L2-eager", "nvfp4-L2", logprobs=True, eager=True),
    Run("emulation-L2-nocompile", "nvfp4-L2", logprobs=True, compile=False),
    Run("emulation-L2-nographs", "nvfp4-L2", logprobs=True, graphs=False),
    Run("emulation-L2-dump", "nvfp4-L2", logprobs=True, dump=True),
    Run("emulation-L2-eager-dump", "nvfp4-L2", logprobs=True, eager=True, dump=True),
)


def prompts(count: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(length)] for _ in range(count)]


def engine_kwargs(run: Run, model: Path) -> dict[str, Any]:
    """The LLM(...) arguments of a run: CUDA graphs on (vLLM's default FULL_AND_PIECEWISE,
    captured for the batch sizes measured), no tokenizer, no prefix cache (prompt logprobs
    are computed, not looked up)."""
    kwargs: dict[str, Any] = {
        "model": str(model),
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "seed": 0,
        "max_model_len": 1024,
        "max_num_seqs": max(CAPTURE_SIZES),
        "gpu_memory_utilization": 0.6,
        "enable_prefix_caching": False,
        "attention_backend": "TRITON_ATTN",
        "compilation_config": {"cudagraph_capture_sizes": CAPTURE_SIZES},
        "tensor_parallel_size": run.tp,
        "enable_expert_parallel": run.ep,
    }
    if run.backend != "auto":
        kwargs["moe_backend"] = run.backend
    if run.lora:
        kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=8)
    if run.profile:  # traces next to the run's result (profiler_dir); no stacks: smaller
        kwargs["profiler_config"] = {
            "profiler": "torch",
            "torch_profiler_dir": str(profiler_dir(model)),
            "torch_profiler_with_stack": False,
            "torch_profiler_dump_cuda_time_total": False,
        }
    return control_kwargs(run, kwargs)


def profiler_dir(model: Path) -> Path:
    """Where a profiled run's traces go: a folder of the work area, emptied by the worker."""
    return model.parent.parent / "profiles" / model.name


def control_kwargs(run: Run, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the run's controls: ``enforce_eager=True`` (no torch.compile, no CUDA
    graphs), compilation ``mode`` 0 (CompilationMode.NONE in 0.24.0's config/compilation.py:
    the model runs as plain PyTorch; ``level`` is its deprecated name), ``cudagraph_mode``
    NONE (torch.compile kept)."""
    compilation = dict(kwargs["compilation_config"])
    if not run.compile:
        compilation["mode"] = 0
    if not run.graphs:
        compilation["cudagraph_mode"] = "NONE"
    kwargs = {**kwargs, "compilation_config": compilation}
    if run.eager:
        kwargs["enforce_eager"] = True
    return kwargs


def run_from_json(spec: str) -> Run:
    """A run as the parent hands it to the worker process (``dataclasses.asdict`` as JSON)."""
    data = json.loads(spec)
    data["batches"] = tuple(data["batches"])
    data["env"] = tuple(tuple(pair) for pair in data.get("env", ()))
    return Run(**data)
