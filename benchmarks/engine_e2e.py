"""The engine end-to-end check: the overlay inside vLLM's `LLM` engine, on a GPU host.

vLLM 0.24.0's engine (CUDA graphs on: piecewise and full decode graphs) serves generated
Qwen3-MoE checkpoints (engine_checkpoint.py: ModelOpt NVFP4 at Qwen3-30B-A3B's MoE sizes, the
same weights in BF16, and an FP8 variant), prompts given as token ids (no tokenizer):

- teacher-forced logprobs (`prompt_logprobs=0`) of 32 prompts of 96 tokens on a 2-layer model,
  compared pristine vs overlay, with the scale to judge them by: the pristine batch of 32 vs
  the same prompts one by one, and the pristine emulation vs Marlin (0.24.0's default NVFP4
  MoE backend on Hopper); greedy tokens where the model is shallow enough for them to agree;
- the same logprobs against the model's exact forward: `reference` computes the 2-layer
  checkpoint's teacher-forced logprobs in float64 (engine_reference.py: W4A4 as vLLM's
  reference quantization defines it, and W4A16), `numerics --runs N` repeats the overlay's,
  the pristine emulation's and Marlin's logprob runs (interleaved, as `rounds` does), and the
  report gives each engine's mean |Δ| in nats against the reference, with the spread over its
  runs (the `emulation`/`baselines` phases' runs count as one each);
- generation throughput (tokens/s at batch 1, 8 and 32, 128 greedy tokens, median of
  repeats) on a 12-layer model, where the MoE dominates the step: pristine emulation, the
  overlay's emulation, Marlin and the BF16 model; then one more generation per batch under
  torch's profiler, for the GPU's busy time per step (kernels, copies and memsets, their
  union): what the step costs the GPU, apart from the host's share, which drifts between
  runs on a shared host; `rounds` interleaves overlay and Marlin runs, so that the drift
  falls on both alike (`--model nvfp4-L48`: Qwen3-30B-A3B's 48 layers, where the GPU's share
  of a step is four times the 12-layer model's, the host's about the same), and the `nopdl`
  phase runs the overlay without programmatic dependent launch (VLLM_PATCHSET_NVFP4_NO_PDL=1);
- fix 2 at engine level: an FP8 (static per-tensor scales) model with LoRA enabled, data
  parallel 2 and expert parallel: the configuration in which TritonExperts defers the input
  quantization to apply() with a tensor a1_scale; CUDA graph capture fails at start-up on the
  pristine pin and passes with the overlay;
- with two GPUs: expert parallel 2 and tensor parallel 2, so that the fused kernel's expert
  map runs inside the engine.

The overlay is applied with `vllm-patchset overlay apply` to the very vLLM install the
pristine runs used (and reverted at the end); each engine's output shows the guard plugin's
start-up line. One command on a host with vLLM installed:

    python benchmarks/engine_e2e.py all --work /tmp/engine-e2e

and on a host with torch but no vLLM, with a native-ops kit (`vllm-patchset kit build`):

    python benchmarks/engine_e2e.py all --work /tmp/engine-e2e --kit KIT

Results (JSON per run, logs) go to WORK/results; `report` writes
benchmarks/results/engine_e2e_h200.{json,md,png}. Every engine runs in a process of its own.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import gzip
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
VOCAB = 32768
LOGPROB_PROMPTS, LOGPROB_LEN = 32, 96
GREEDY_TOKENS = 32
THROUGHPUT_PROMPT, THROUGHPUT_TOKENS, REPEATS = 32, 128, 3
CAPTURE_SIZES = [1, 2, 4, 8, 16, 24, 32]
RUN_TIMEOUT = 480  # seconds: a hung engine must not eat a whole GPU visit
RANK_GRACE = 45  # seconds the other data-parallel ranks get once one has ended
# What a failed CUDA graph capture says (CUDA, then HIP).
CAPTURE_ERRORS = re.compile(
    r"operation not permitted when stream is capturing|cudaErrorStreamCaptureInvalidated"
    r"|capture.*(invalidated|unsupported)|hipErrorStreamCaptureUnsupported",
    re.IGNORECASE,
)
TRACEBACK_FRAME = re.compile(r'\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')
# The environment every engine gets: no flashinfer sampler, no DeepGEMM (neither is in the
# kit), nothing from a hub, NVLink multicast off (it can wedge a shared host's GPUs).
ENGINE_ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_USE_DEEP_GEMM": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "GIT_PYTHON_REFRESH": "quiet",
    "PYTHONUNBUFFERED": "1",
}


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
    # One more generation per batch under torch's profiler (gpu_busy), and the environment
    # the engine gets beside ENGINE_ENV ((name, value) pairs).
    profile: bool = False
    env: tuple[tuple[str, str], ...] = ()

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


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


# GPU activity in a torch profiler trace (Kineto's categories).
GPU_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")


def gpu_busy(events: Sequence[dict[str, Any]], steps: int) -> dict[str, float]:
    """The GPU's busy time per step from a trace's events: the union of its kernels', copies'
    and memsets' intervals (overlapping ones, as programmatic dependent launch makes them,
    counted once), and its kernels per step."""
    spans = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("cat") in GPU_EVENTS and "dur" in e
    )
    busy, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    kernels = sum(e.get("cat") == "kernel" for e in events)
    return {"busy_us_per_step": busy / steps, "kernels_per_step": kernels / steps}


def profiled(llm: Any, generate: Any, traces: Path, steps: int) -> dict[str, float]:
    """gpu_busy of one call of ``generate`` under torch's profiler, from the trace it leaves
    in ``traces``."""
    before = set(traces.glob("*.pt.trace.json*"))
    llm.start_profile()
    generate()
    llm.stop_profile()
    new = sorted(set(traces.glob("*.pt.trace.json*")) - before)
    if not new:
        raise RuntimeError(f"the profiler left no trace in {traces}")
    found = []
    for path in new:  # the engine core's (GPU) trace, where a front end left one beside it
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            found.append(gpu_busy(json.load(f)["traceEvents"], steps))
    return max(found, key=lambda g: g["busy_us_per_step"])


# -- the worker: one engine, in a process of its own -------------------------------------------
def worker(run: Run, model: Path, out: Path) -> None:
    """Start the engine, measure what the run asks for, write the result to `out`."""
    result: dict[str, Any] = {"run": dataclasses.asdict(run), "kwargs": engine_kwargs(run, model)}
    started = time.monotonic()
    if run.dump:  # the engine core in this process: the dump's hooks run where the model is
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    traces = profiler_dir(model)
    if run.profile:
        shutil.rmtree(traces, ignore_errors=True)
        traces.mkdir(parents=True)
    # apply_model sends moe_layers to the engine core's process (pickled: vLLM asks for this)
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    from vllm import LLM, SamplingParams

    try:
        llm = LLM(**engine_kwargs(run, model))
    except Exception as exc:  # the run's outcome: recorded, not raised
        result["startup_error"] = f"{type(exc).__name__}: {exc}"
        out.write_text(json.dumps(result, indent=2) + "\n")
        return
    result["startup_s"] = round(time.monotonic() - started, 1)
    try:
        result["moe_layers"] = llm.apply_model(moe_layers)  # one dict per worker
    except Exception as exc:  # a record of the run: the measurement goes on without it
        result["moe_layers_error"] = f"{type(exc).__name__}: {exc}"
    dump = MoeDump.install(llm) if run.dump else None

    def generate(batch: list[list[int]], params: Any) -> list[Any]:
        return list(llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False))

    if run.logprobs:
        texts = prompts(LOGPROB_PROMPTS, LOGPROB_LEN, seed=1)
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
        result["logprobs_batch"] = [
            _prompt_logprobs(o, p) for o, p in zip(generate(texts, params), texts, strict=True)
        ]
        if dump is not None:
            dump.phase = "single"
        result["logprobs_single"] = [_prompt_logprobs(generate([p], params)[0], p) for p in texts]
        if dump is not None:
            result["moe_dump"] = dump.finish(out.with_suffix(".dump.pt"))
    if run.greedy:
        texts = prompts(LOGPROB_PROMPTS, LOGPROB_LEN, seed=1)
        params = SamplingParams(
            temperature=0.0, max_tokens=GREEDY_TOKENS, ignore_eos=True, detokenize=False
        )
        result["greedy"] = [list(o.outputs[0].token_ids) for o in generate(texts, params)]
    if run.dp > 1 or not (run.logprobs or run.greedy or run.batches):
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, detokenize=False)
        result["generated"] = [
            list(o.outputs[0].token_ids) for o in generate(prompts(4, 32, 3), params)
        ]
    throughput, profiles = {}, {}
    for batch in run.batches:
        texts = prompts(batch, THROUGHPUT_PROMPT, seed=100 + batch)
        params = SamplingParams(
            temperature=0.0, max_tokens=THROUGHPUT_TOKENS, ignore_eos=True, detokenize=False
        )
        generate(texts, params)  # warm-up: the first call of a batch size pays for Triton's JIT
        rates = []
        for _ in range(REPEATS):
            begin = time.perf_counter()
            outputs = generate(texts, params)
            seconds = time.perf_counter() - begin
            rates.append(sum(len(o.outputs[0].token_ids) for o in outputs) / seconds)
        throughput[str(batch)] = {"median": statistics.median(rates), "repeats": rates}
        if run.profile:
            try:
                run_once = functools.partial(generate, texts, params)
                profiles[str(batch)] = profiled(llm, run_once, traces, THROUGHPUT_TOKENS)
            except Exception as exc:  # recorded: the throughput stands without it
                result["profile_error"] = f"{type(exc).__name__}: {exc}"
    if throughput:
        result["throughput"] = throughput
    if profiles:
        result["gpu_profile"] = profiles
    result["finished"] = True
    out.write_text(json.dumps(result, indent=2) + "\n")


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


# (name, what it rules in or out) of the MoE layer's dumped tensors, in the order they are made.
DUMP_OPS = (
    ("x", "the MoE layer's input hidden states"),
    ("topk_ids", "the router's expert ids"),
    ("topk_weights", "the router's weights"),
    ("out", "the routed experts' output"),
)


class MoeDump:
    """Every MoE layer's inputs and output (hidden states, top-k ids and weights, the routed
    experts' output), call by call, in the batch run and in the one-by-one runs of the logprob
    check; the two compared row by row (``compare_dumps``).

    The hooks wrap each RoutedExperts module's ``forward_modular`` (vLLM 0.24.0: what the MoE
    runner calls, inside the ``moe_forward`` custom op, so Python runs it even with
    torch.compile on; calls inside a CUDA graph capture are not recorded, and replays run no
    Python: prefill of more tokens than the largest capture size runs outside graphs), and
    count the calls of the overlay's unfused fallback (``_apply_dequantized``)."""

    def __init__(self) -> None:
        self.error = ""
        self.phase = "batch"
        self.calls: dict[str, list[dict[str, Any]]] = {"batch": [], "single": []}
        self.layers: dict[str, dict[str, Any]] = {}

    @classmethod
    def install(cls, llm: Any) -> MoeDump:
        dump = cls()
        try:
            llm.apply_model(dump.hook)  # in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0
        except Exception as exc:  # the dump is a diagnosis: the logprob check goes on
            dump.error = f"hooks not installed: {type(exc).__name__}: {exc}"
        return dump

    def hook(self, model: Any) -> int:
        for name, module in _moe_modules(model):
            forward = getattr(module, "forward_modular", None)
            method = getattr(module, "quant_method", None)
            if forward is None or method is None:
                continue
            module.forward_modular = self._recorded(name, forward)
            experts = _fused_experts(module)
            self.layers[name] = {
                "quant_method": type(method).__name__,
                "experts": type(experts).__name__,
                "unfused_calls": {"batch": 0, "single": 0},
            }
            if experts is not None and hasattr(experts, "_apply_dequantized"):
                experts._apply_dequantized = self._counted(name, experts._apply_dequantized)
        return len(self.layers)

    def _recorded(self, name: str, forward: Any) -> Any:
        import torch

        def recorded(*args: Any, **kwargs: Any) -> Any:
            out = forward(*args, **kwargs)
            if torch.cuda.is_current_stream_capturing():
                return out
            given = dict(zip(("x", "topk_weights", "topk_ids"), args, strict=False)) | kwargs
            result = out[0] if isinstance(out, tuple) else out
            tensors = {k: given[k] for k in ("x", "topk_weights", "topk_ids")} | {"out": result}
            call = {k: t.detach().cpu().clone() for k, t in tensors.items()}
            info = self.layers[name]
            info.setdefault("x_layout", f"{tuple(given['x'].stride())} {given['x'].dtype}")
            self.calls[self.phase].append({"layer": name, **call})
            return out

        return recorded

    def _counted(self, name: str, fallback: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.layers[name]["unfused_calls"][self.phase] += 1
            return fallback(*args, **kwargs)

        return counted

    def finish(self, path: Path) -> dict[str, Any]:
        import torch

        if self.error:
            return {"error": self.error}
        torch.save({"layers": self.layers, "calls": self.calls}, path)
        try:
            summary = compare_dumps(self.calls)
        except Exception as exc:  # the tensors are saved: compare them offline
            summary = {"error": f"comparison failed: {type(exc).__name__}: {exc}"}
        return {"file": str(path), "layers": self.layers, **summary}


def moe_layers(model: Any) -> dict[str, dict[str, Any]]:
    """Each MoE layer's experts class and, where patch 0002's experts record them, whether
    loading laid the weights out in tiles (``tiled_weights``) and found every block scale fit
    for the PTX decode's one-operation conversion (``fast_scales``); None where not recorded."""
    layers = {}
    for name, module in _moe_modules(model):
        experts = _fused_experts(module)
        if experts is None:
            continue
        layers[name] = {
            "experts": type(experts).__name__,
            "tiled": (
                experts.tiled_weights is not None if hasattr(experts, "tiled_weights") else None
            ),
            "fast_scales": getattr(experts, "fast_scales", None),
        }
    return layers


def layers_line(result: dict[str, Any]) -> str:
    """A run's MoE layers in a few words: each experts class with its count, and how many
    of its layers are tiled and have fast scales where the experts record it."""
    if "moe_layers_error" in result:
        return "not recorded: " + result["moe_layers_error"][:80]
    per_worker = result.get("moe_layers") or []
    if not per_worker:
        return "—"
    counts: dict[str, list[int]] = {}
    for layer in per_worker[0].values():  # the first worker (every rank builds the same)
        count = counts.setdefault(layer["experts"], [0, 0, 0])
        count[0] += 1
        count[1] += layer["tiled"] is True
        count[2] += layer["fast_scales"] is True
    return "; ".join(
        f"{n} {name}" + (f", {tiled} tiled, {fast} fast scales" if tiled or fast else "")
        for name, (n, tiled, fast) in counts.items()
    )


def _fused_experts(module: Any) -> Any:
    """The experts object a MoE module's quant method runs (None where there is none)."""
    kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
    return getattr(kernel, "fused_experts", None)


def _moe_modules(model: Any) -> list[tuple[str, Any]]:
    """(name, module) of the model's modules that have ``forward_modular``: sub-modules, and
    attributes of modules (a runner may hold its RoutedExperts outside ``_modules``)."""
    found: dict[int, tuple[str, Any]] = {}
    for name, module in model.named_modules():
        candidates = [(name, module)] + [
            (f"{name}.{attr}", value)
            for attr, value in vars(module).items()
            if attr != "_modules" and hasattr(value, "forward_modular")
        ]
        for label, candidate in candidates:
            if hasattr(candidate, "forward_modular"):
                found.setdefault(id(candidate), (label, candidate))
    return list(found.values())


def _rows(calls: list[dict[str, Any]], layer: str, key: str) -> Any:
    import torch

    return torch.cat([c[key].reshape(c[key].shape[0], -1) for c in calls if c["layer"] == layer])


def nearest_rows(single: Any, batch: Any) -> tuple[Any, float]:
    """For each row of ``single``, the index of the nearest row of ``batch`` (L2, FP32), and
    the fraction matched exactly: a token's row of the batch run is the one closest to its
    row in its own run (different tokens' hidden states are far apart)."""
    import torch

    batch = batch.float()
    index, exact = [], 0
    for chunk in single.float().split(256):
        distance = torch.cdist(chunk, batch)
        best = distance.min(dim=1)
        index.append(best.indices)
        exact += int((best.values == 0).sum())
    return torch.cat(index), exact / max(1, single.shape[0])


def compare_dumps(calls: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Batch vs one by one, layer by layer (in the order the batch run called them) and op by
    op (DUMP_OPS): the fraction of token rows bitwise identical, the largest |Δ|, the rows
    whose MoE output differs although all its inputs are identical, and the first (layer, op)
    where any row differs."""
    layers = list(dict.fromkeys(c["layer"] for c in calls["batch"]))
    if not layers or not calls["single"]:
        return {"error": "no MoE call recorded in the batch or the one-by-one runs"}
    match, exact = nearest_rows(
        _rows(calls["single"], layers[0], "x"), _rows(calls["batch"], layers[0], "x")
    )
    report: list[dict[str, Any]] = []
    first = None
    for layer in layers:
        row: dict[str, Any] = {"layer": layer}
        same = {}
        for op, what in DUMP_OPS:
            b, s = _rows(calls["batch"], layer, op), _rows(calls["single"], layer, op)
            if b.shape[0] <= int(match.max()) or s.shape[0] != match.shape[0]:
                row[op] = {"error": f"{b.shape[0]} batch rows, {s.shape[0]} single rows"}
                continue
            b = b[match]
            same[op] = (b == s).all(dim=1)
            delta = (b.float() - s.float()).abs().max().item() if b.numel() else 0.0
            row[op] = {"identical_rows": same[op].float().mean().item(), "max_abs": delta}
            if first is None and not bool(same[op].all()):
                first = {"layer": layer, "op": op, "what": what, **row[op]}
        if len(same) == len(DUMP_OPS):
            inputs = same["x"] & same["topk_ids"] & same["topk_weights"]
            row["output_differs_with_same_inputs"] = int((inputs & ~same["out"]).sum())
        report.append(row)
    return {
        "rows_batch": int(_rows(calls["batch"], layers[0], "x").shape[0]),
        "rows_single": int(match.shape[0]),
        "first_layer_input_matched_exactly": exact,
        "per_layer": report,
        "first_difference": first,
    }


def _prompt_logprobs(output: Any, prompt: list[int]) -> list[float]:
    """The logprob of each prompt token after the first, given the tokens before it."""
    logprobs = output.prompt_logprobs
    return [float(logprobs[i][prompt[i]].logprob) for i in range(1, len(prompt))]


# -- the parent: lanes of runs, each run a process ---------------------------------------------
@dataclasses.dataclass(frozen=True)
class Host:
    site: Path | None  # an assembled kit's site/ (PYTHONPATH), or None for the installed vllm
    models: Path
    results: Path
    python: str = sys.executable

    def env(self, gpus: Sequence[int]) -> dict[str, str]:
        env = {**os.environ, **ENGINE_ENV, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
        env.setdefault("VLLM_CACHE_ROOT", str(self.results.parent / "vllm-cache"))
        if self.site is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, (str(self.site), env.get("PYTHONPATH")))
            )
        return env

    def packed(self) -> bool:
        """The site's vllm-patchset is a wheel `overlay pack` built: it carries its overlay."""
        lock = Path("vllm_patchset", "_overlay", "overlay.lock.json")
        return self.site is not None and (self.site / lock).is_file()

    def patchset(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`vllm-patchset ARGS` on this host's vLLM (the kit's site, or the installed one).

        With the packed wheel in the site (`setup --project WHEEL`), the site's vllm-patchset
        deploys the overlay it carries: run outside the checkout, whose overlay/vllm/** a GPU
        host without network has not built. Otherwise the checkout's overlay."""
        target = ["--target", str(self.site)] if self.site is not None else []
        project = [] if self.packed() else ["--project", str(REPO)]
        command = [self.python, "-m", "vllm_patchset", *project, *args, *target]
        cwd = self.results.parent if self.packed() else None
        if cwd is not None:
            cwd.mkdir(parents=True, exist_ok=True)
        return subprocess.run(command, env=self.env([]), capture_output=True, text=True, cwd=cwd)

    def state(self) -> str:
        result = self.patchset("overlay", "status", "--json")
        if result.returncode != 0:
            raise SystemExit(f"overlay status failed: {result.stderr.strip()}")
        outcome = json.loads(result.stdout)["outcome"]
        states = {"applied": "overlay", "not applied": "pristine"}
        if outcome not in states:
            raise SystemExit(
                f"the vLLM install holds neither the pristine files nor the overlay: {outcome}"
            )
        return states[outcome]


def run_engine(host: Host, run: Run, state: str, gpus: Sequence[int]) -> dict[str, Any]:
    """One run in processes of its own (one per data-parallel rank); its result, with the
    guard plugin's lines and what a failed capture said."""
    name = f"{state}-{run.name}"
    model = host.models / run.model
    spec = json.dumps(dataclasses.asdict(run))
    port = _free_port()
    procs = []
    for rank in range(run.dp):
        out = host.results / f"{name}.rank{rank}.json"
        out.unlink(missing_ok=True)
        log = (host.results / f"{name}.rank{rank}.log").open("w")
        env = {**host.env(gpus), **dict(run.env)}
        if run.dp > 1:  # vLLM's offline data parallel: one engine per rank, told by env
            env.update(
                VLLM_DP_RANK=str(rank),
                VLLM_DP_RANK_LOCAL=str(rank),
                VLLM_DP_SIZE=str(run.dp),
                VLLM_DP_MASTER_IP="127.0.0.1",
                VLLM_DP_MASTER_PORT=str(port),
            )
        command = [host.python, __file__, "worker", spec, str(model), str(out)]
        # A session of its own: a timeout kills the engine's own processes with it.
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        procs.append((proc, log, out))
    begin = time.monotonic()
    _wait_all([proc for proc, _, _ in procs], begin)
    for proc, _, _ in procs:  # what the engine left running (compile workers, a stuck core)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    ranks = []
    for proc, log, out in procs:
        log.close()
        text = Path(log.name).read_text(errors="replace")
        report: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
        report["exit_code"] = proc.returncode
        report["guard"] = sorted(
            {
                line.split("vllm-patchset: ", 1)[1]
                for line in text.splitlines()
                if "vllm-patchset: " in line
            }
        )
        report["capture_errors"] = sorted({m.group(0) for m in CAPTURE_ERRORS.finditer(text)})
        if frame := failing_frame(text):
            report["failing_frame"] = frame
        if proc.returncode != 0 and "startup_error" not in report:
            report["error_tail"] = text.splitlines()[-15:]
        ranks.append(report)
    result = {
        **ranks[0],
        "name": name,
        "state": state,
        "gpus": list(gpus),
        "seconds": round(time.monotonic() - begin, 1),
    }
    if run.dp > 1:
        result["ranks"] = ranks
        result["guard"] = sorted({line for r in ranks for line in r["guard"]})
        result["capture_errors"] = sorted({e for r in ranks for e in r["capture_errors"]})
        frames = sorted({r["failing_frame"] for r in ranks if "failing_frame" in r})
        if frames:
            result["failing_frame"] = frames[0]
    (host.results / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def failing_frame(log: str) -> str | None:
    """The innermost traceback frame logged before the first capture error: where it broke."""
    lines = [line.split("] ", 1)[-1] for line in log.splitlines()]
    first = next((i for i, line in enumerate(lines) if CAPTURE_ERRORS.search(line)), None)
    frames = [i for i in range(first or 0) if lines[i].lstrip().startswith('File "')]
    if not frames or frames[-1] + 1 >= len(lines):
        return None
    frame = TRACEBACK_FRAME.match(lines[frames[-1]])
    if frame is None:
        return None
    path = frame["path"][frame["path"].rfind("/vllm/") + 1 :]  # the path inside the package
    return f"{path}:{frame['line']} ({frame['fn']}): {lines[frames[-1] + 1].strip()}"


def _wait_all(procs: list[subprocess.Popen[bytes]], begin: float) -> None:
    """Wait for every rank, at most RUN_TIMEOUT; once one has ended, the others get
    RANK_GRACE seconds (a rank whose engine failed leaves the others waiting in a collective)."""
    first_end: float | None = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if first_end is None and any(p.poll() is not None for p in procs):
            first_end = now
        late = first_end is not None and now - first_end > RANK_GRACE
        if now - begin > RUN_TIMEOUT or late:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            return
        time.sleep(1.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpu_blocks(needs: Sequence[int], gpus: int) -> list[list[int]] | None:
    """Consecutive GPUs for phases side by side, or None when there are not enough."""
    if sum(needs) > gpus:
        return None
    starts = [sum(needs[:i]) for i in range(len(needs))]
    return [list(range(start, start + need)) for start, need in zip(starts, needs, strict=True)]


def run_phases(host: Host, names: Sequence[str], gpus: int) -> list[dict[str, Any]]:
    """The phases `names`, side by side when there are GPUs enough, else one after another.
    Refused in one line, before any engine starts, when a checkpoint they read is not
    written (`checkpoints` writes them)."""
    missing = list(dict.fromkeys(r.model for n in names for r in PHASES[n][1]))
    missing = [m for m in missing if not (host.models / m).is_dir()]
    if missing:
        raise SystemExit(
            f"no checkpoint {host.models / missing[0]}"
            + (f" (nor {', '.join(missing[1:])})" if missing[1:] else "")
            + f": run `checkpoints {' '.join(missing)}`"
        )
    state = host.state()
    for name in names:
        required = PHASES[name][0]
        if required not in ("any", state):
            raise SystemExit(f"phase {name} needs the {required} install; it holds the {state}")
    host.results.mkdir(parents=True, exist_ok=True)
    needs = [max(r.gpus for r in PHASES[name][1]) for name in names]
    # Throughput is measured with no other engine on the host: one starting beside it (its
    # torch.compile workers, its Triton JIT) slowed some repeats by up to 5x on the H200 host.
    timed = any(r.batches for name in names for r in PHASES[name][1])
    blocks = None if timed and len(names) > 1 else gpu_blocks(needs, gpus)
    results: list[dict[str, Any]] = []

    def lane(name: str, devices: list[int]) -> None:
        for run in PHASES[name][1]:
            if run.gpus > gpus:
                print(f"{state}-{run.name}: not run ({run.gpus} GPUs needed, {gpus} here)")
                continue
            result = run_engine(host, run, state, devices[: run.gpus])
            results.append(result)
            print(_summary(result), flush=True)
            if not _ok(result) and name != "fix2":  # the rest would fail alike: save the time
                print(f"phase {name}: stopped after {result['name']} failed", flush=True)
                break

    if blocks is None:
        for name, need in zip(names, needs, strict=True):
            lane(name, list(range(min(need, gpus))))
        return results
    threads = [
        threading.Thread(target=lane, args=(n, b)) for n, b in zip(names, blocks, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _ok(result: dict[str, Any]) -> bool:
    """Every rank started and measured all it had to (its exit, after that, is not judged)."""
    ranks = result.get("ranks", [result])
    return all(r.get("finished") and "startup_error" not in r for r in ranks)


def _summary(result: dict[str, Any]) -> str:
    if not _ok(result):
        what = result.get("startup_error") or f"exit code {result.get('exit_code')}"
        capture = (
            "; capture failed: " + ", ".join(result["capture_errors"])
            if result.get("capture_errors")
            else ""
        )
        return f"{result['name']}: FAILED ({str(what)[:200]}){capture}"
    speed = ", ".join(
        f"bs{b} {t['median']:.0f} tok/s" for b, t in result.get("throughput", {}).items()
    )
    return (
        f"{result['name']}: ok, start-up {result.get('startup_s')} s{'; ' + speed if speed else ''}"
    )


# -- the report ---------------------------------------------------------------------------------
# (what, run a, series a, run b, series b): logprob series compared position by position.
LOGPROB_PAIRS = (
    (
        "pristine: batch of 32 vs one by one",
        "pristine-emulation-L2",
        "batch",
        "pristine-emulation-L2",
        "single",
    ),
    (
        "overlay: batch of 32 vs one by one",
        "overlay-emulation-L2",
        "batch",
        "overlay-emulation-L2",
        "single",
    ),
    ("pristine vs overlay", "pristine-emulation-L2", "batch", "overlay-emulation-L2", "batch"),
    (
        "pristine emulation vs Marlin",
        "pristine-emulation-L2",
        "batch",
        "pristine-marlin-L2",
        "batch",
    ),
    (
        "overlay vs overlay EP2",
        "overlay-emulation-L2",
        "batch",
        "overlay-emulation-L2-ep2",
        "batch",
    ),
    (
        "overlay vs overlay TP2",
        "overlay-emulation-L2",
        "batch",
        "overlay-emulation-L2-tp2",
        "batch",
    ),
    (
        "pristine vs pristine EP2",
        "pristine-emulation-L2",
        "batch",
        "pristine-emulation-L2-ep2",
        "batch",
    ),
    (
        "pristine EP2 vs overlay EP2",
        "pristine-emulation-L2-ep2",
        "batch",
        "overlay-emulation-L2-ep2",
        "batch",
    ),
)
THROUGHPUT_ROWS = (
    ("0.24.0 emulation, pristine", "pristine-emulation-L12"),
    ("0.24.0 emulation + overlay", "overlay-emulation-L12"),
    ("Marlin (0.24.0's default on Hopper)", "pristine-marlin-L12"),
    ("BF16 model", "pristine-bf16-L12"),
    ("emulation, pristine, EP2 (2 GPUs)", "pristine-emulation-L12-ep2"),
    ("emulation + overlay, EP2 (2 GPUs)", "overlay-emulation-L12-ep2"),
    ("0.24.0 emulation + overlay, PDL off", "overlay-emulation-L12-nopdl"),
)
ROUND_NAME = re.compile(
    r"(?P<engine>overlay-emulation|pristine-marlin)-L(?P<layers>\d+)-r(?P<round>\d+)"
)


def compare_logprobs(a: list[list[float]], b: list[list[float]]) -> dict[str, float | int]:
    pairs = [(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    diffs = [abs(x - y) for x, y in pairs]
    return {
        "positions": len(pairs),
        "identical": sum(d == 0.0 for d in diffs) / len(pairs),
        "mean_abs": statistics.fmean(diffs),
        "max_abs": max(diffs),
    }


def compare_greedy(a: list[list[int]], b: list[list[int]]) -> dict[str, float | int]:
    prefixes = []
    for x, y in zip(a, b, strict=True):
        same = next((i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q), len(x))
        prefixes.append(same)
    return {
        "sequences": len(a),
        "identical": sum(p == len(x) for p, x in zip(prefixes, a, strict=True)) / len(a),
        "mean_common_prefix": statistics.fmean(prefixes),
        "tokens": len(a[0]) if a else 0,
    }


def load_results(folder: Path) -> dict[str, dict[str, Any]]:
    """Each run's result (not the per-rank files, the deploy reports, the float64 reference)."""
    return {
        p.stem: json.loads(p.read_text())
        for p in sorted(folder.glob("*.json"))
        if ".rank" not in p.stem and not p.stem.startswith(("deploy-", REFERENCE_PREFIX))
    }


# The float64 reference's file in WORK/results: REFERENCE_PREFIX + the checkpoint's folder name.
REFERENCE_PREFIX = "reference-fp64-"
REFERENCE_MODEL = "nvfp4-L2"
# The engines judged against it: (label, the run's name; its repeats add "-nI").
REFERENCE_ENGINES = (
    ("0.24.0 emulation, pristine", "pristine-emulation-L2"),
    ("0.24.0 emulation + overlay", "overlay-emulation-L2"),
    ("Marlin W4A16 (0.24.0's default on Hopper)", "pristine-marlin-L2"),
)


def reference_logprobs(model: Path, texts: list[list[int]], device: str) -> dict[str, Any]:
    """The float64 forward's teacher-forced logprobs of ``texts`` (engine_reference.py): W4A4
    and W4A16 (no activation quantization), one batch."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import engine_reference

    ckpt = engine_reference.Checkpoint(model, device)
    result: dict[str, Any] = {"model": model.name, "device": device, "prompts": len(texts)}
    for kind in ("w4a4", "w4a16"):
        begin = time.monotonic()
        result[kind] = engine_reference.prompt_logprobs(ckpt, texts, kind, batch=len(texts))
        result[f"{kind}_seconds"] = round(time.monotonic() - begin, 1)
    return result


def load_reference(folder: Path, model: str = REFERENCE_MODEL) -> dict[str, Any] | None:
    path = folder / f"{REFERENCE_PREFIX}{model}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "lowest": min(values),
        "highest": max(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def against_reference(
    ok: dict[str, dict[str, Any]], reference: dict[str, Any]
) -> list[dict[str, Any]]:
    """Per engine of REFERENCE_ENGINES, each run's batch logprobs against the float64
    reference's (W4A4 and W4A16): mean and max |Δ| per run, the runs' spread."""
    out = []
    for label, name in REFERENCE_ENGINES:
        repeat = re.compile(re.escape(name) + r"(-n\d+)?")
        runs = sorted(n for n in ok if repeat.fullmatch(n) and ok[n].get("logprobs_batch"))
        if not runs:
            continue
        row: dict[str, Any] = {"engine": label, "name": name, "runs": runs}
        for kind in ("w4a4", "w4a16"):
            compared = [compare_logprobs(ok[n]["logprobs_batch"], reference[kind]) for n in runs]
            row[kind] = {
                **_spread([float(c["mean_abs"]) for c in compared]),
                "max_abs": max(float(c["max_abs"]) for c in compared),
                "positions": int(compared[0]["positions"]),
            }
        out.append(row)
    return out


def closer_verdict(rows: list[dict[str, Any]]) -> str | None:
    """Whether the overlay is at least as close to the W4A4 reference as the pristine
    emulation, in one line with the figures (None without both)."""
    by = {r["name"]: r for r in rows}
    pristine, overlay = by.get("pristine-emulation-L2"), by.get("overlay-emulation-L2")
    if pristine is None or overlay is None:
        return None
    p, o = pristine["w4a4"]["mean"], overlay["w4a4"]["mean"]
    answer = "yes" if o <= p else "NO"
    return (
        f"The overlay at least as close to the W4A4 reference as the pristine emulation:"
        f" {answer} ({o:.4f} vs {p:.4f} nats, mean over runs)."
    )


def summarize(
    results: dict[str, dict[str, Any]], reference: dict[str, Any] | None = None
) -> dict[str, Any]:
    ok = {n: r for n, r in results.items() if _ok(r)}
    logprobs = []
    for what, ra, sa, rb, sb in LOGPROB_PAIRS:
        a, b = ok.get(ra, {}).get(f"logprobs_{sa}"), ok.get(rb, {}).get(f"logprobs_{sb}")
        if a and b:
            logprobs.append({"what": what, "a": ra, "b": rb, **compare_logprobs(a, b)})
    greedy = []
    for what, ra, _, rb, _ in LOGPROB_PAIRS[2:]:
        a, b = ok.get(ra, {}).get("greedy"), ok.get(rb, {}).get("greedy")
        if a and b:
            greedy.append({"what": what, "a": ra, "b": rb, **compare_greedy(a, b)})
    throughput = {
        label: {
            b: {"median": t["median"], "best": max(t["repeats"]), "worst": min(t["repeats"])}
            for b, t in ok[name]["throughput"].items()
        }
        for label, name in THROUGHPUT_ROWS
        if name in ok and "throughput" in ok[name]
    }
    gpu = {
        name: {
            b: {
                **p,
                "wall_us_per_step": 1e6 * int(b) / r["throughput"][b]["median"],
            }
            for b, p in r["gpu_profile"].items()
        }
        for name, r in ok.items()
        if "gpu_profile" in r
    }
    runs = {
        name: {
            "ok": name in ok,
            "startup_s": r.get("startup_s"),
            "seconds": r.get("seconds"),
            "gpus": r.get("gpus"),
            "guard": r.get("guard", []),
            "capture_errors": r.get("capture_errors", []),
            "failing_frame": r.get("failing_frame"),
            "error": r.get("startup_error") or (r.get("error_tail") or [None])[-1],
            "moe_layers": layers_line(r),
        }
        for name, r in results.items()
    }
    return {
        "logprobs": logprobs,
        "reference": against_reference(ok, reference) if reference else [],
        "greedy": greedy,
        "throughput": throughput,
        "rounds": rounds(ok),
        "gpu": gpu,
        "runs": runs,
    }


def rounds(ok: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The `rounds` command's pairs, per model depth and round: each batch's median tokens/s
    of the overlay's run and of Marlin's run after it."""
    found: dict[tuple[int, int], dict[str, Any]] = {}
    for name, result in ok.items():
        m = ROUND_NAME.fullmatch(name)
        if m is None or "throughput" not in result:
            continue
        key = "overlay" if m["engine"] == "overlay-emulation" else "marlin"
        medians = {b: t["median"] for b, t in result["throughput"].items()}
        found.setdefault((int(m["layers"]), int(m["round"])), {})[key] = medians
    return [
        {"layers": layers, "round": i, **pair}
        for (layers, i), pair in sorted(found.items())
        if len(pair) == 2
    ]


def round_spread(pairs: list[dict[str, Any]]) -> dict[tuple[int, str], dict[str, dict[str, float]]]:
    """The rounds taken together, per model depth and engine ("overlay", "marlin"): each
    batch's median tokens/s over the rounds, the slowest and the fastest."""
    values: dict[tuple[int, str], dict[str, list[float]]] = {}
    for pair in pairs:
        for engine in ("overlay", "marlin"):
            for b, v in pair[engine].items():
                values.setdefault((pair["layers"], engine), {}).setdefault(b, []).append(v)
    return {
        key: {
            b: {"median": statistics.median(v), "worst": min(v), "best": max(v)}
            for b, v in row.items()
        }
        for key, row in values.items()
    }


def _round_medians(pairs: list[dict[str, Any]]) -> list[tuple[list[str], dict[str, str]]]:
    """The rounds table's closing rows: per model depth with two rounds or more, each batch's
    medians over its rounds, and the range of the overlay / Marlin ratio over them."""
    rows = []
    spread = round_spread(pairs)
    for layers, count in sorted(collections.Counter(p["layers"] for p in pairs).items()):
        if count < 2:
            continue
        mine = [p for p in pairs if p["layers"] == layers]
        overlay, marlin = spread[(layers, "overlay")], spread[(layers, "marlin")]
        cells = {}
        for b in overlay.keys() & marlin.keys():
            ratios = [
                p["overlay"][b] / p["marlin"][b]
                for p in mine
                if b in p["overlay"].keys() & p["marlin"].keys()
            ]
            cells[b] = (
                f"{overlay[b]['median']:.0f} / {marlin[b]['median']:.0f}"
                f" ({min(ratios):.2f}x to {max(ratios):.2f}x)"
            )
        rows.append(([str(layers), f"median of {count}"], cells))
    return rows


def markdown(summary: dict[str, Any], title: str, notes: Sequence[str] = ()) -> str:
    lines = [f"# {title}", ""]
    lines += [f"Note: {note}\n" for note in notes]
    if summary["logprobs"]:
        lines += [
            f"Teacher-forced logprobs, 2-layer model, {LOGPROB_PROMPTS} prompts of"
            f" {LOGPROB_LEN} tokens (nats; |Δ| per prompt position):",
            "",
            "| comparison | positions | identical | mean abs Δ | max abs Δ |",
            "|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {c['what']} | {c['positions']} | {c['identical']:.1%} | {c['mean_abs']:.4f}"
            f" | {c['max_abs']:.4f} |"
            for c in summary["logprobs"]
        ]
        lines.append("")
    if summary.get("reference"):
        lines += reference_lines(summary["reference"])
    if summary["greedy"]:
        lines += [
            f"Greedy tokens, 2-layer model ({GREEDY_TOKENS} tokens after each prompt):",
            "",
            "| comparison | identical sequences | mean common prefix |",
            "|---|---:|---:|",
        ]
        lines += [
            f"| {c['what']} | {c['identical']:.0%}"
            f" | {c['mean_common_prefix']:.1f} / {c['tokens']} |"
            for c in summary["greedy"]
        ]
        lines.append("")
    if summary["throughput"]:
        intro = (
            f"Generation throughput, 12-layer model, {THROUGHPUT_TOKENS} greedy tokens after a"
            f" {THROUGHPUT_PROMPT}-token prompt, CUDA graphs, tokens/s: median of {REPEATS}"
            " (slowest to fastest):"
        )
        rows = [
            ([label], {b: _cell(t) for b, t in row.items()})
            for label, row in summary["throughput"].items()
        ]
        lines += _batch_table(intro, ["engine"], rows)
    if summary["rounds"]:
        intro = (
            "Interleaved rounds (`rounds`): in each, the overlay's run, then Marlin's on the"
            " reverted install, minutes apart; tokens/s, overlay / Marlin (ratio):"
        )
        rows = [
            (
                [str(r["layers"]), str(r["round"])],
                {
                    b: f"{o:.0f} / {r['marlin'][b]:.0f} ({o / r['marlin'][b]:.2f}x)"
                    for b, o in r["overlay"].items()
                    if b in r["marlin"]
                },
            )
            for r in summary["rounds"]
        ]
        rows += _round_medians(summary["rounds"])
        lines += _batch_table(intro, ["layers:", "round:"], rows)
    if summary["gpu"]:
        intro = (
            f"GPU time per step: one more generation per batch under torch's profiler, the"
            f" union of its kernels, copies and memsets on the GPU over {THROUGHPUT_TOKENS}"
            " steps; beside it the step's wall time from the median tokens/s above"
            " (µs per step, GPU busy / wall):"
        )
        rows = [
            (
                [name],
                {
                    b: f"{p['busy_us_per_step']:.0f} / {p['wall_us_per_step']:.0f}"
                    for b, p in row.items()
                },
            )
            for name, row in summary["gpu"].items()
        ]
        lines += _batch_table(intro, ["run"], rows)
    fix2 = {n: r for n, r in summary["runs"].items() if "fix2" in n}
    if fix2:
        lines += [
            "Fix 2 in the engine: an FP8 model with static per-tensor activation scales, LoRA"
            " enabled, data parallel 2 with expert parallel (TritonExperts defers the input"
            " quantization to apply(), with a tensor a1_scale):",
            "",
        ]
        for name, r in fix2.items():
            if r["ok"]:
                lines.append(f"- {name}: started (CUDA graphs captured) and generated")
            else:
                errors = "; ".join(r["capture_errors"]) or str(r["error"])[:160]
                lines.append(f"- {name}: start-up failed: {errors}, at {r['failing_frame']}")
        lines.append("")
    lines += [
        "Runs:",
        "",
        "| run | GPUs | outcome | start-up (s) | guard plugin | MoE layers |",
        "|---|---|---|---:|---|---|",
    ]
    for name, r in summary["runs"].items():
        if r["ok"]:
            outcome = "ok"
        else:
            outcome = "FAILED: " + ("; ".join(r["capture_errors"]) or str(r["error"])[:120])
        guard = "<br>".join(r["guard"]) or "—"
        gpus = ",".join(map(str, r["gpus"] or []))
        layers = r.get("moe_layers", "—")
        lines.append(
            f"| {name} | {gpus} | {outcome} | {r['startup_s'] or '—'} | {guard} | {layers} |"
        )
    return "\n".join(lines) + "\n"


def reference_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The report's section on the float64 reference."""
    positions = rows[0]["w4a4"]["positions"]
    lines = [
        "Against the float64 reference (benchmarks/engine_reference.py: the 2-layer"
        " checkpoint's exact forward in float64, W4A4 as vLLM's reference quantization defines"
        " it, W4A16 without activation quantization): each engine's teacher-forced logprobs"
        f" of the batch of {LOGPROB_PROMPTS}, mean |Δ| in nats over {positions} positions;"
        " over the runs: their mean (lowest to highest), and the largest |Δ| of any run:",
        "",
        "| engine | runs | vs W4A4: mean |Δ| | max |Δ| | vs W4A16: mean |Δ| | max |Δ| |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        a4, a16 = r["w4a4"], r["w4a16"]
        lines.append(
            f"| {r['engine']} | {len(r['runs'])} | {a4['mean']:.4f} ({a4['lowest']:.4f} to"
            f" {a4['highest']:.4f}) | {a4['max_abs']:.3f} | {a16['mean']:.4f}"
            f" ({a16['lowest']:.4f} to {a16['highest']:.4f}) | {a16['max_abs']:.3f} |"
        )
    verdict = closer_verdict(rows)
    return [*lines, "", *([verdict, ""] if verdict else [])]


def _batch_table(
    intro: str, head: list[str], rows: list[tuple[list[str], dict[str, str]]]
) -> list[str]:
    """A Markdown table of a column per batch size: ``head`` names the leading columns (a
    trailing ``:`` right-aligns one), each row its leading cells and its cells by batch."""
    batches = sorted({int(b) for _, cells in rows for b in cells})
    names = [h.rstrip(":") for h in head] + [f"batch {b}" for b in batches]
    aligns = ["---:" if h.endswith(":") else "---" for h in head] + ["---:"] * len(batches)
    lines = [intro, "", "| " + " | ".join(names) + " |", "|" + "|".join(aligns) + "|"]
    for lead, cells in rows:
        lines.append("| " + " | ".join(lead + [cells.get(str(b), "—") for b in batches]) + " |")
    return [*lines, ""]


def _cell(t: dict[str, float]) -> str:
    return f"{t['median']:.0f} ({t['worst']:.0f} to {t['best']:.0f})"


def plot_rows(summary: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """The bars of the report's figure: the phases' engines on one GPU, then the rounds',
    per model depth (the median over the rounds, the slowest to the fastest)."""
    rows = {k: v for k, v in summary["throughput"].items() if "2 GPUs" not in k}
    counts = collections.Counter(r["layers"] for r in summary["rounds"])
    spread = round_spread(summary["rounds"])
    for layers in sorted(counts):
        for engine, name in (("overlay", "overlay"), ("marlin", "Marlin")):
            n = counts[layers]
            rows[f"{name}, {layers} layers ({n} round{'s' * (n > 1)})"] = spread[(layers, engine)]
    return rows


def figure_title(title: str) -> str:
    """The title on lines that fit the figure's width (one long line runs off its edges)."""
    return textwrap.fill(title, 88)


def plot(rows: dict[str, dict[str, dict[str, float]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({int(b) for row in rows.values() for b in row})
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(rows))
    for i, (label, row) in enumerate(rows.items()):
        xs = [j + i * width for j in range(len(batches))]
        cells = [row.get(str(b), {"median": 0.0, "worst": 0.0, "best": 0.0}) for b in batches]
        medians = [c["median"] for c in cells]
        spread = [[m - c["worst"] for m, c in zip(medians, cells, strict=True)],
                  [c["best"] - m for m, c in zip(medians, cells, strict=True)]]  # fmt: skip
        ax.bar(xs, medians, width, yerr=spread, capsize=2, label=label)
    ax.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(len(batches))])
    ax.set_xticklabels([f"batch {b}" for b in batches])
    ax.set_ylabel("tokens/s")
    ax.set_yscale("log")
    ax.set_title(figure_title(title), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- the engine's batch variance: controls of the logprob check --------------------------------
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


def variance_summary(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variance run found (either install): batch vs one by one, and the dump's verdict."""
    rows = []
    for state in ("pristine", "overlay"):
        for run in VARIANCE_RUNS:
            r = results.get(f"{state}-{run.name}")
            if r is None:
                continue
            row: dict[str, Any] = {"run": f"{state}-{run.name}", "ok": _ok(r)}
            row["kwargs"] = {k: r.get("kwargs", {}).get(k) for k in ("enforce_eager",)}
            row["compilation_config"] = r.get("kwargs", {}).get("compilation_config")
            if r.get("logprobs_batch") and r.get("logprobs_single"):
                row.update(compare_logprobs(r["logprobs_batch"], r["logprobs_single"]))
            if "moe_dump" in r:
                row["moe_dump"] = {
                    k: r["moe_dump"].get(k)
                    for k in ("error", "first_difference", "per_layer", "layers", "file")
                }
            rows.append(row)
    return rows


def variance_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "Batch of 32 vs one by one, teacher-forced logprobs on the 2-layer model, per control"
        " (nats):",
        "",
        "| run | identical | mean abs Δ | max abs Δ | first MoE difference (dump) |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        if not r["ok"]:
            lines.append(f"| {r['run']} | FAILED | | | |")
            continue
        dump = r.get("moe_dump") or {}
        first = dump.get("first_difference")
        if dump.get("error"):
            verdict = dump["error"]
        elif first:
            verdict = (
                f"{first['layer']}: {first['what']} ({first['op']}),"
                f" {first['identical_rows']:.1%} of rows identical, max |Δ| {first['max_abs']:.3g}"
            )
        else:
            verdict = "none: every layer's inputs and output identical" if dump else "—"
        lines.append(
            f"| {r['run']} | {r.get('identical', 0.0):.1%} | {r.get('mean_abs', 0.0):.4f}"
            f" | {r.get('max_abs', 0.0):.4f} | {verdict} |"
        )
    for r in rows:
        for layer in (r.get("moe_dump") or {}).get("per_layer") or []:
            ops = ", ".join(
                f"{op} {layer[op]['identical_rows']:.1%}"
                for op, _ in DUMP_OPS
                if "identical_rows" in layer.get(op, {})
            )
            info = r["moe_dump"]["layers"].get(layer["layer"], {})
            lines.append(
                f"- {r['run']} {layer['layer']} ({info.get('experts')}, input"
                f" {info.get('x_layout')}, unfused calls {info.get('unfused_calls')}): rows"
                f" identical: {ops}; output differs with identical inputs in"
                f" {layer.get('output_differs_with_same_inputs')} rows"
            )
    return "\n".join(lines) + "\n"


def cmd_variance(args: argparse.Namespace) -> int:
    """The logprob check with each control, on the install as it is; the variance report of
    every variance run in WORK/results (both installs, where both ran)."""
    host = _host(args.work)
    state = host.state()
    cmd_checkpoints(argparse.Namespace(work=args.work, models=["nvfp4-L2"], device="cuda"))
    host.results.mkdir(parents=True, exist_ok=True)
    for run in VARIANCE_RUNS:
        if args.runs and run.name not in args.runs:
            continue
        print(_summary(run_engine(host, run, state, [0])), flush=True)
    rows = variance_summary(load_results(host.results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    text = variance_markdown(rows)
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0 if all(r["ok"] for r in rows) else 1


# -- commands -----------------------------------------------------------------------------------
def _host(work: Path) -> Host:
    site = work / "native" / "site"
    return Host(site if (site / "vllm").is_dir() else None, work / "models", work / "results")


def cmd_worker(args: argparse.Namespace) -> int:
    worker(_run_from_json(args.spec), args.model, args.out)
    return 0


def cmd_setup(args: argparse.Namespace) -> int:
    """Assemble a native-ops kit into WORK/native and install vllm-patchset into its site/."""
    sys.path.insert(0, str(REPO / "scripts"))  # stdlib-only modules: no install needed
    from vllm_patchset.gpu import kitparts

    dest = kitparts.assemble(args.kit, args.work / "native")
    site = dest / "site"
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    command += [
        "--no-build-isolation",
        "--upgrade",
        "--target",
        str(site),
        str(args.project or REPO),
    ]
    subprocess.run(command, check=True)
    print(f"vLLM with its compiled ops and vllm-patchset in {site}")
    return 0


def cmd_checkpoints(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from engine_checkpoint import MoeModel, write_model

    models = args.work / "models"
    # Deepest first: a shallower model of the same format links the deeper one's files.
    for name in sorted(args.models or DEFAULT_MODELS, key=lambda n: -MODELS[n][1]):
        fmt, layers = MODELS[name]
        dest = models / name
        if dest.is_dir():
            continue
        deeper = [
            n for n, (f, d) in MODELS.items() if f == fmt and d > layers and (models / n).is_dir()
        ]
        begin = time.monotonic()
        write_model(
            MoeModel(layers=layers),
            fmt,
            dest,
            device=args.device,
            reuse=models / deeper[0] if deeper else None,
        )
        print(f"{dest}: {time.monotonic() - begin:.0f} s", flush=True)
    return 0


def _gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return max(1, sum(line.startswith("GPU ") for line in out.splitlines()))


def cmd_phases(args: argparse.Namespace) -> int:
    results = run_phases(_host(args.work), args.names, args.gpus or _gpu_count())
    return 0 if results else 1


def cmd_overlay(args: argparse.Namespace) -> int:
    host = _host(args.work)
    host.results.mkdir(parents=True, exist_ok=True)
    result = host.patchset("overlay", args.action, "--json")
    (host.results / f"deploy-{args.action}.json").write_text(result.stdout)
    print(result.stdout.strip(), result.stderr.strip(), sep="\n")
    return result.returncode


def cmd_rounds(args: argparse.Namespace) -> int:
    """The overlay's and Marlin's speed runs on ``args.model``, interleaved ``args.rounds``
    times: the overlay applied and its run, then reverted and Marlin's, so that a host whose
    speed drifts between runs minutes apart slows both alike. Results named ``...-rN`` from
    N = ``args.first`` (a later call adds rounds); the install is left pristine."""

    def runs(i: int) -> tuple[tuple[str, Run], ...]:
        return tuple(
            (state, dataclasses.replace(run, name=f"{run.name}-r{i}"))
            for state, run in round_runs(args.model)
        )

    return _interleaved(args, runs, args.rounds)


def _interleaved(args: argparse.Namespace, runs_of: Any, count: int) -> int:
    """``count`` rounds from ``args.first`` of ``runs_of(i)``'s (state, run) pairs: the
    overlay applied for each overlay run and reverted after it."""
    host = _host(args.work)
    if not (host.models / args.model).is_dir():
        raise SystemExit(
            f"no checkpoint {host.models / args.model}: run `checkpoints {args.model}`"
        )
    if host.state() != "pristine":
        raise SystemExit("the vLLM install holds the overlay: revert it first (overlay revert)")
    host.results.mkdir(parents=True, exist_ok=True)
    for i in range(args.first, args.first + count):
        for state, run in runs_of(i):
            if state == "overlay" and cmd_overlay(
                argparse.Namespace(work=args.work, action="apply")
            ):
                raise SystemExit("overlay apply failed (above): no more rounds")
            try:
                result = run_engine(host, run, state, [0])
            finally:
                if state == "overlay":
                    cmd_overlay(argparse.Namespace(work=args.work, action="revert"))
            print(_summary(result), flush=True)
            if not _ok(result):
                return 1
    return 0


def cmd_reference(args: argparse.Namespace) -> int:
    """The float64 reference's logprobs of the logprob check's prompts, into WORK/results."""
    host = _host(args.work)
    model = host.models / args.model
    if not model.is_dir():
        raise SystemExit(f"no checkpoint {model}: run `checkpoints {args.model}`")
    begin = time.monotonic()
    texts = prompts(LOGPROB_PROMPTS, LOGPROB_LEN, seed=1)
    result = reference_logprobs(model, texts, args.device)
    result["seconds"] = round(time.monotonic() - begin, 1)
    host.results.mkdir(parents=True, exist_ok=True)
    out = host.results / f"{REFERENCE_PREFIX}{args.model}.json"
    out.write_text(json.dumps(result) + "\n")
    print(f"{out}: W4A4 and W4A16 in {result['seconds']} s")
    return 0


def cmd_numerics(args: argparse.Namespace) -> int:
    """The logprob check's engines (overlay, pristine emulation, Marlin) on ``args.model``,
    ``args.runs`` times, interleaved as `rounds` interleaves its runs; named ``...-nI`` from I =
    ``args.first``; the install is left pristine. `report` compares each run with the float64
    reference (`reference`)."""
    return _interleaved(args, lambda i: numerics_runs(args.model, i), args.runs)


def cmd_report(args: argparse.Namespace) -> int:
    results = load_results(args.work / "results")
    if not results:  # a mistyped --work must not overwrite a report with an empty one
        raise SystemExit(f"no run results in {args.work / 'results'}: nothing to report")
    summary = summarize(results, load_reference(args.work / "results"))
    summary["notes"] = list(args.note)
    title = args.title
    prefix = args.out
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    text = markdown(summary, title, args.note)
    prefix.with_suffix(".md").write_text(text)
    if rows := plot_rows(summary):
        plot(rows, prefix.with_suffix(".png"), title)
    print(text)
    return 0


def cmd_all(args: argparse.Namespace) -> int:
    """Everything, in order, on this host (kit or installed vLLM), the overlay reverted last."""
    work = args.work
    if args.kit is not None:
        cmd_setup(args)
    cmd_checkpoints(argparse.Namespace(work=work, models=None, device="cuda"))
    host, gpus = _host(work), args.gpus or _gpu_count()
    if host.state() != "pristine":
        raise SystemExit("the vLLM install holds the overlay: revert it first (overlay revert)")
    run_phases(host, ["emulation", "baselines"], gpus)
    if gpus >= 2:
        run_phases(host, ["fix2"], gpus)
        run_phases(host, ["parallel"], gpus)
    try:
        if cmd_overlay(argparse.Namespace(work=work, action="apply")) != 0:
            raise SystemExit("overlay apply failed (above): no overlay runs")
        run_phases(host, ["emulation"], gpus)
        if gpus >= 2:
            run_phases(host, ["fix2"], gpus)
            run_phases(host, ["parallel"], gpus)
    finally:
        cmd_overlay(argparse.Namespace(work=work, action="revert"))
    return cmd_report(argparse.Namespace(work=work, out=args.out, title=args.title, note=[]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    default_out = RESULTS / "engine_e2e_h200"
    default_title = "vLLM 0.24.0 engine, NVFP4 Qwen3-MoE (E=128, H=2048, I=768, top-8), H200"

    def work(p: argparse.ArgumentParser) -> None:
        p.add_argument("--work", type=Path, default=Path("/tmp/engine-e2e"), help="models, results")

    p = sub.add_parser("all", help="setup (with --kit), checkpoints, every phase, report")
    work(p)
    p.add_argument("--kit", type=Path, help="a native-ops kit, for a host without vLLM")
    p.add_argument("--project", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--gpus", type=int)
    p.add_argument("--out", type=Path, default=default_out)
    p.add_argument("--title", default=default_title)
    p.set_defaults(func=cmd_all)
    p = sub.add_parser("setup", help="assemble a kit into WORK/native, vllm-patchset into it")
    work(p)
    p.add_argument("--kit", type=Path, required=True)
    p.add_argument("--project", type=Path, help="vllm-patchset to install (a wheel or a folder)")
    p.set_defaults(func=cmd_setup)
    p = sub.add_parser("checkpoints", help="write the checkpoints into WORK/models")
    work(p)
    p.add_argument("models", nargs="*", metavar="MODEL", help=", ".join(MODELS))
    p.add_argument("--device", default="cuda")
    p.set_defaults(func=cmd_checkpoints)
    p = sub.add_parser("phases", help="run phases side by side: " + ", ".join(PHASES))
    work(p)
    p.add_argument("names", nargs="+", choices=list(PHASES))
    p.add_argument("--gpus", type=int)
    p.set_defaults(func=cmd_phases)
    p = sub.add_parser("rounds", help="overlay and Marlin speed runs, interleaved")
    work(p)
    p.add_argument("--rounds", type=_count, default=2)
    p.add_argument("--first", type=_count, default=1, help="the first round's number")
    nvfp4 = [name for name, (fmt, _) in MODELS.items() if fmt == "nvfp4"]
    p.add_argument("--model", choices=nvfp4, default="nvfp4-L12")
    p.set_defaults(func=cmd_rounds)
    p = sub.add_parser("reference", help="the float64 reference's logprobs into WORK/results")
    work(p)
    p.add_argument("--model", choices=nvfp4, default=REFERENCE_MODEL)
    p.add_argument("--device", default="cuda")
    p.set_defaults(func=cmd_reference)
    p = sub.add_parser(
        "numerics", help="the logprob check's engines, repeated, for the float64 comparison"
    )
    work(p)
    p.add_argument(
        "--runs",
        type=_count,
        default=2,
        help="runs of each engine (the emulation and baselines phases' count as one more)",
    )
    p.add_argument("--first", type=_count, default=1, help="the first run's number")
    p.add_argument("--model", choices=nvfp4, default=REFERENCE_MODEL)
    p.set_defaults(func=cmd_numerics)
    p = sub.add_parser(
        "overlay", help="vllm-patchset overlay apply|revert|status on the engine's vLLM"
    )
    work(p)
    p.add_argument("action", choices=["apply", "revert", "status"])
    p.set_defaults(func=cmd_overlay)
    p = sub.add_parser("report", help="WORK/results -> JSON, Markdown and PNG")
    work(p)
    p.add_argument("--note", action="append", default=[], help="a line for the Markdown")
    p.add_argument("--out", type=Path, default=default_out)
    p.add_argument("--title", default=default_title)
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("variance", help="the logprob check with controls, MoE layer dumps")
    work(p)
    names = [r.name for r in VARIANCE_RUNS]
    p.add_argument("--runs", nargs="+", choices=names, help="these only (default: all)")
    p.add_argument("--out", type=Path, default=RESULTS / "engine_variance_h200")
    p.set_defaults(func=cmd_variance)
    p = sub.add_parser("worker", help=argparse.SUPPRESS)
    p.add_argument("spec")
    p.add_argument("model", type=Path)
    p.add_argument("out", type=Path)
    p.set_defaults(func=cmd_worker)
    args = parser.parse_args(argv)
    return int(args.func(args))


def _count(text: str) -> int:
    """An argument that counts or numbers rounds: 1 or more."""
    value = int(text) if text.isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of 1 or more: {text!r}")
    return value


def _run_from_json(spec: str) -> Run:
    data = json.loads(spec)
    data["batches"] = tuple(data["batches"])
    data["env"] = tuple(tuple(pair) for pair in data.get("env", ()))
    return Run(**data)


if __name__ == "__main__":
    raise SystemExit(main())
