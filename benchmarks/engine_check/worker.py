"""The worker: one engine in a process of its own (the parent starts it as `engine_e2e.py
worker`), measuring what its run asks for: teacher-forced logprobs, greedy tokens, a few
generated tokens, throughput and the GPU's busy time per step under torch's profiler.

It imports vLLM; nothing else in the package does."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import os
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .dump import MoeDump
from .moe import moe_layers
from .runs import (
    GREEDY_TOKENS,
    LOGPROB_LEN,
    LOGPROB_PROMPTS,
    REPEATS,
    THROUGHPUT_PROMPT,
    THROUGHPUT_TOKENS,
    Run,
    engine_kwargs,
    profiler_dir,
    prompts,
)

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


def worker(run: Run, model: Path, out: Path) -> None:
    """Start the engine, measure what the run asks for, write the result to `out`."""
    result: dict[str, Any] = {"run": dataclasses.asdict(run), "kwargs": engine_kwargs(run, model)}
    started = time.monotonic()
    if run.hooks_moe:  # the engine core in this process: the hooks run where the model is
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    traces = profiler_dir(model)
    if run.profile:
        shutil.rmtree(traces, ignore_errors=True)
        traces.mkdir(parents=True)
    # apply_model sends moe_layers to the engine core's process (pickled: vLLM asks for this)
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    from vllm import LLM
    from vllm.platforms import current_platform

    # The GPU, as vLLM names it (NVML or amdsmi: no CUDA context before the engine's), for the
    # report's default name.
    result["gpu"] = current_platform.get_device_name()

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
    if run.logprobs:
        result.update(logprob_check(llm, dump, out))
    if run.layers:
        result.update(layer_check(llm, model, run.backend))
    if run.greedy:
        result["greedy"] = greedy_tokens(llm)
    if run.dp > 1 or not (run.logprobs or run.greedy or run.batches or run.layers):
        result["generated"] = generated_tokens(llm)
    result.update(throughput(llm, run, traces))
    result["finished"] = True
    out.write_text(json.dumps(result, indent=2) + "\n")


def generate(llm: Any, batch: list[list[int]], params: Any) -> list[Any]:
    """The engine's outputs for prompts given as token ids."""
    return list(llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False))


def logprob_batch(llm: Any) -> tuple[list[list[int]], Any, list[list[float]]]:
    """The logprob check's prompts, its sampling parameters, and the prompts' teacher-forced
    logprobs run as one batch."""
    from vllm import SamplingParams

    texts = prompts(LOGPROB_PROMPTS, LOGPROB_LEN, seed=1)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    outputs = generate(llm, texts, params)
    return texts, params, [prompt_logprobs(o, p) for o, p in zip(outputs, texts, strict=True)]


def logprob_check(llm: Any, dump: MoeDump | None, out: Path) -> dict[str, Any]:
    """Teacher-forced logprobs of the logprob check's prompts, as a batch and one by one (and
    the MoE dump's comparison of the two, where the run dumps)."""
    texts, params, batch = logprob_batch(llm)
    result: dict[str, Any] = {"logprobs_batch": batch}
    if dump is not None:
        dump.phase = "single"
    result["logprobs_single"] = [prompt_logprobs(generate(llm, [p], params)[0], p) for p in texts]
    if dump is not None:
        result["moe_dump"] = dump.finish(out.with_suffix(".dump.pt"))
    return result


def layer_check(llm: Any, model: Path, backend: str) -> dict[str, Any]:
    """The logprob check's batch with every MoE layer call recorded (MoeDump, batch phase
    only), each call compared on this GPU with the float64 experts on its inputs (layers.py);
    the figures, not the tensors, kept (and the batch's logprobs)."""
    from .layers import RESULT_KEY, layer_figures

    dump = MoeDump.install(llm)
    result: dict[str, Any] = {"logprobs_batch": logprob_batch(llm)[2]}
    calls, dump.calls = dump.calls["batch"], {"batch": [], "single": []}
    dump.phase = "single"  # what runs after this is not recorded in ``calls``
    result[RESULT_KEY] = layer_figures(dump, calls, model, backend)
    return result


def greedy_tokens(llm: Any) -> list[list[int]]:
    """GREEDY_TOKENS greedy tokens after each of the logprob check's prompts."""
    from vllm import SamplingParams

    texts = prompts(LOGPROB_PROMPTS, LOGPROB_LEN, seed=1)
    params = SamplingParams(
        temperature=0.0, max_tokens=GREEDY_TOKENS, ignore_eos=True, detokenize=False
    )
    return [list(o.outputs[0].token_ids) for o in generate(llm, texts, params)]


def generated_tokens(llm: Any) -> list[list[int]]:
    """16 greedy tokens after each of 4 short prompts: the engine ran (every data-parallel
    rank generates)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, detokenize=False)
    return [list(o.outputs[0].token_ids) for o in generate(llm, prompts(4, 32, 3), params)]


def throughput(llm: Any, run: Run, traces: Path) -> dict[str, Any]:
    """Per batch size of the run: tokens/s of REPEATS generations (after a warm-up), and with
    `profile` the GPU's busy time of one more under torch's profiler."""
    from vllm import SamplingParams

    result: dict[str, Any] = {}
    speeds, profiles = {}, {}
    for batch in run.batches:
        texts = prompts(batch, THROUGHPUT_PROMPT, seed=100 + batch)
        params = SamplingParams(
            temperature=0.0, max_tokens=THROUGHPUT_TOKENS, ignore_eos=True, detokenize=False
        )
        generate(
            llm, texts, params
        )  # warm-up: the first call of a batch size pays for Triton's JIT
        rates = []
        for _ in range(REPEATS):
            begin = time.perf_counter()
            outputs = generate(llm, texts, params)
            seconds = time.perf_counter() - begin
            rates.append(sum(len(o.outputs[0].token_ids) for o in outputs) / seconds)
        speeds[str(batch)] = {"median": statistics.median(rates), "repeats": rates}
        if run.profile:
            try:
                run_once = functools.partial(generate, llm, texts, params)
                profiles[str(batch)] = profiled(llm, run_once, traces, THROUGHPUT_TOKENS)
            except Exception as exc:  # recorded: the throughput stands without it
                result["profile_error"] = f"{type(exc).__name__}: {exc}"
    if speeds:
        result["throughput"] = speeds
    if profiles:
        result["gpu_profile"] = profiles
    return result


def prompt_logprobs(output: Any, prompt: list[int]) -> list[float]:
    """The logprob of each prompt token after the first, given the tokens before it."""
    logprobs = output.prompt_logprobs
    return [float(logprobs[i][prompt[i]].logprob) for i in range(1, len(prompt))]
