"""NVFP4 MoE, side by side: the pinned vLLM's emulation (pristine), the overlay's (patched pin),
the overlay before a kernel change, the overlay's portable path forced, the configuration ROCm
runs forced (rocm), Marlin (W4A16, the pin's default NVFP4 MoE backend on Hopper), BF16
TritonExperts, an upstream release's emulation (its tree, or its emulation files grafted onto
the pin's tree: benchmarks/upstream_graft.py), and the NVFP4 weight-read bound.

    python benchmarks/bench_nvfp4_moe.py --pristine DIR --overlay DIR [--before DIR]
        [--upstream DIR ...] [--shapes NAME|all|required|test ...] [--cells required]
    python benchmarks/bench_nvfp4_moe.py --replot benchmarks/results/nvfp4_moe_h200.json
    python benchmarks/bench_nvfp4_moe.py --merge A.json B.json   (runs of other --columns)

The shapes are tests/gpu/moe_setup.SHAPES: released MoE checkpoints' routed-expert layers,
each whole, at each tensor-parallel degree that leaves a multiple of 16, and at expert
parallelism where the table asks (an EP rank: E / N local experts and vLLM's expert map); a
checkpoint the table lacks by its layer's sizes, e64-h3584-i1280-k6 (I as one GPU holds it).
``--cells required`` runs each shape at its required token counts (1, 32 and 512; the detailed
shapes from 1 to 8192), not a cross product. The run ends with a summary per cell: the
overlay against Marlin and the pristine emulation, its share of the weight-read bound, the
1-token latency where the floor is small, rocm / overlay, before / overlay, and each goal's
verdict. A cell a column cannot run (too little GPU memory, no switch in the tree, the time of
``--budget-s`` spent) is listed as skipped with the reason, never left out silently.

Each DIR holds a pure-Python (or installed-layout) ``vllm/`` package, with vLLM's compiled
extensions beside its Python files where the real ops are to run (a native-ops kit's ``.so``
files: ops ``native``), else the capture-safe stand-ins of tests/gpu/standins.py (ops
``standin``; Marlin has no stand-in, so its column is skipped, with the reason, in such a run).
Two vLLM trees cannot be one ``vllm`` package in one process, so every tree runs in its own
subprocess (this file with ``--worker``) and the parent merges their rows. The overlay's
portable path is a second subprocess on the overlay tree with VLLM_PATCHSET_NVFP4_PORTABLE=1
in its environment, the rocm column a third with that and VLLM_PATCHSET_NVFP4_PLATFORM=rocm (a
tree that does not read a switch has one path: the column says so).
The layer, its weights and the capture come from tests/gpu (moe_setup.py, cuda_graphs.py), the
reference from tests/gpu/nvfp4_reference.py: what the GPU tests check is what is timed here.

Method: each implementation's ``FusedMoEKernel.apply`` (the no-DP/EP prepare/finalize around
its experts, as a single-GPU FusedMoE layer calls it) for one MoE layer (E experts, top-k, BF16
input), same random NVFP4 weights and routing (seeded) in every tree; Marlin's weights are
repacked from the same NVFP4 tensors by 0.24.0's own oracle. Before each timed call the L2
cache is flushed (the weights of one layer would otherwise stay in the 60 MB L2 from the
previous call, which a real model's other layers prevent); median over the reps (--reps at
most, fewer where a call is slow: about --rep-budget-ms of calls, --min-reps at least). An
expert-parallel shape's call is its rank's: the local experts' weights, vLLM's expert map and
the router's global ids, as an EP rank's FusedMoE layer calls it; every rank is timed on the
same tokens (its own experts local: moe_setup.rank_routing) and the cell's ``graph_us`` is the
slowest rank's (``rank``; ``rank_graph_us`` and ``rank_active_experts`` per rank), since the
layer waits for it: one rank alone may hold none of a decode token's experts.
``graph_us``: replay of a captured CUDA graph, the GPU time alone. ``eager_us``: a plain call
after a device sync, so the host's launch overhead counts. ``experts_graph_us``: the experts'
own ``apply`` alone, replayed likewise. ``tiles``: the tile table entry patch 0002's experts
take for the call (tiles_taken; absent for a column without tile tables). The bound is the
bytes of the routed experts' packed weights and block scales over the copy bandwidth measured
in the same run (read + write bytes of a 2 GiB device copy). Numerics: each column's output
against the exact W4A4 reference (plain torch, tests/gpu/nvfp4_reference.py with exact=True:
the NVFP4 weights and both activations' NVFP4 quantization unrounded, FP32 between the GEMMs);
W4A16 (Marlin) and BF16 skip the activation quantization, so they sit at NVFP4's own activation
error from it. Per-kernel breakdown: each kernel (memset, memcpy) of one
``FusedMoEKernel.apply``, replayed alone from the call's own CUDA graph with the others
disabled, L2 flushed, median; ``floor_us`` is that graph with every launch disabled.

Output: tables on stdout; under --out a JSON of every row, a Markdown of the tables and a PNG
(``--name``, by default ``nvfp4_moe_<GPU>`` as the run names its GPU, ``nvfp4_moe_h200`` on an
H200: a run on another GPU never writes over its results; with ``_standin`` appended unless
every tree ran the real ops). Without matplotlib the PNG is skipped with a line; ``--replot``
makes it (and the Markdown) from the JSON where matplotlib is. The JSON and Markdown are
written after every tree's worker; Ctrl-C or kill (SIGTERM) stops the worker running and says
in one line what was kept (exit 130 or 143); the reader of stdout gone (``| head``): exit 141,
the reports whole.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import stops
from results_names import by_gpu
from upstream_graft import GraftError, grafted_release, tree_version
from upstream_graft import label as graft_label

REPO = Path(__file__).resolve().parent.parent
GPU_TESTS = REPO / "tests" / "gpu"
DEFAULT_OUT = REPO / "benchmarks" / "results"
BOUND = "NVFP4 weight-read bound"
BF16 = "BF16 TritonExperts"
PORTABLE_ENV = "VLLM_PATCHSET_NVFP4_PORTABLE"  # tests/gpu/moe_setup.py names it too
PLATFORM_ENV = "VLLM_PATCHSET_NVFP4_PLATFORM"  # likewise
CONTEXT_LOST = 3  # a worker's exit status after a CUDA error that poisons its process
SWITCHES = (PORTABLE_ENV, PLATFORM_ENV)
# What --columns picks from: the trees' implementations.
COLUMNS = ("pristine", "bf16", "marlin", "overlay", "portable", "rocm", "before", "upstream")
# --shapes groups (besides every shape's name): every shape, the required ones (every shape
# and shard, at the tokens of required_cells), the GPU tests' two.
SHAPE_GROUPS = ("all", "required", "test")
# The required cells (issue 33): every shape and shard at these token counts ...
REQUIRED_TOKENS = (1, 32, 512)
# ... and these shapes at every token count from decode to long prefill.
DETAILED_SHAPES = ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-r1-tp8")
DETAILED_TOKENS = (1, 8, 32, 128, 512, 2048, 8192)
TIMINGS = ("graph", "eager", "experts")
# The goals a cell is judged by (summary): overlay at or below Marlin and the pristine
# emulation; at 1 token at most DECODE_US where the weight-read floor is under DECODE_FLOOR_US;
# at least BOUND_SHARE of the weight-read bound from BOUND_TOKENS[0] to BOUND_TOKENS[1] tokens;
# the ROCm configuration within ROCM_RATIO of the overlay's CUDA path.
DECODE_US, DECODE_FLOOR_US = 15.0, 6.0
BOUND_SHARE, BOUND_TOKENS = 0.5, (32, 128)
ROCM_RATIO = 1.25
# Breakdowns shown in the Markdown (every one is in the JSON).
MARKDOWN_BREAKDOWN = ("portable", "rocm", "marlin")
PLOT_COLUMNS = 6  # panels a row in the PNG  # kinds, besides the overlay's default column


@dataclasses.dataclass(frozen=True)
class Tree:
    """A vLLM tree and what its worker runs: "pristine", "overlay", "portable" and "rocm" (the
    overlay tree, switches set), "before" (the overlay as it was before a kernel change) or
    "upstream"."""

    role: str
    path: Path
    graft: str | None = None  # an upstream tree's: the release whose emulation it runs

    def by_column(self, version: str) -> dict[str, tuple[str, str]]:
        """Column -> (implementation label, kind of experts) of this tree."""
        upstream = f"{version} emulation"
        if self.graft is not None:
            upstream = graft_label(self.graft, version)
        return {
            "pristine": {
                "pristine": (f"{version} emulation (pristine)", "emulation"),
                "bf16": (f"{BF16} ({version})", "bf16"),
                "marlin": (f"Marlin W4A16 ({version})", "marlin"),
            },
            "overlay": {"overlay": (f"{version} emulation + patches (overlay)", "emulation")},
            "portable": {
                "portable": (f"{version} + patches, portable path forced", "portable"),
            },
            "rocm": {"rocm": (f"{version} + patches, ROCm configuration forced (rocm)", "rocm")},
            "before": {"before": (f"{version} emulation + patches (overlay before)", "emulation")},
            "upstream": {"upstream": (f"{upstream} (upstream)", "emulation")},
        }[self.role]

    def impls(self, version: str, columns: tuple[str, ...]) -> dict[str, str]:
        """Implementation label -> kind of experts this tree runs, for the columns asked."""
        by_column = self.by_column(version)
        return {label: kind for column, (label, kind) in by_column.items() if column in columns}

    def env(self) -> dict[str, str]:
        """The worker's environment: the switches only where the role sets them (portable:
        the portable path; rocm: the portable path and ROCm's tile table and token block)."""
        env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
        if self.role in ("portable", "rocm"):
            env[PORTABLE_ENV] = "1"
        if self.role == "rocm":
            env[PLATFORM_ENV] = "rocm"
        return env


def shape_table() -> Any:
    """tests/gpu/moe_setup.py (imports torch, no vLLM): the shapes' one table."""
    if str(GPU_TESTS) not in sys.path:
        sys.path.insert(0, str(GPU_TESTS))
    import moe_setup

    return moe_setup


class UnknownShape(ValueError):
    pass


def resolve_shapes(names: list[str]) -> list[str]:
    """--shapes: shape names, aliases, groups (SHAPE_GROUPS) and layers named by their sizes ->
    canonical names, in the table's order then the sized ones as given, each once. Raises
    UnknownShape naming what is known, or why sizes make no layer."""
    table = shape_table()
    wanted: dict[str, None] = {}  # in the order given
    for name in names:
        if name in ("all", "required"):
            wanted.update(dict.fromkeys(s.name for s in table.SHAPES))
        elif name == "test":
            wanted.update(dict.fromkeys(s.name for s in table.TEST_SHAPES))
        else:
            try:
                wanted[table.shape_named(name).name] = None
            except KeyError:
                known = ", ".join([*SHAPE_GROUPS, *(s.name for s in table.SHAPES)])
                raise UnknownShape(
                    f"unknown shape {name!r} (known: {known}, or sizes e<E>-h<H>-i<I>-k<top-k>"
                    "[-ep<N>])"
                ) from None
            except ValueError as exc:  # a layer named by sizes that make none
                raise UnknownShape(str(exc)) from None
    listed = [s.name for s in table.SHAPES if s.name in wanted]
    return listed + [name for name in wanted if name not in listed]  # then those named by sizes


def required_tokens(shape: str) -> tuple[int, ...]:
    """The token counts of ``shape``'s required cells (an alias's: its shape's)."""
    with contextlib.suppress(ImportError):  # no torch where a report is redrawn: names as given
        shape = shape_table().ALIASES.get(shape, shape)
    return DETAILED_TOKENS if shape in DETAILED_SHAPES else REQUIRED_TOKENS


def cells_of(shapes: list[str], tokens: list[int], mode: str | None) -> dict[str, list[int]]:
    """Shape -> token counts to run: ``mode`` "required": each shape's required ones (per-shape
    lists, not a cross product); else every shape at ``tokens``."""
    if mode == "required":
        return {shape: list(required_tokens(shape)) for shape in shapes}
    return {shape: list(tokens) for shape in shapes}


# --------------------------------------------------------------------------- worker


class ColumnSkipped(Exception):
    """This tree cannot run this column (the reason goes into the results)."""


class CellSkipped(Exception):
    """This column cannot run this shape here (the reason goes into the results, per cell)."""


GIB = 1 << 30


def nvfp4_bytes(experts: int, hidden: int, intermediate: int) -> int:
    """NVFP4 weights and block scales of ``experts`` experts (w13 and w2)."""
    return experts * _nvfp4_layer_bytes(hidden, intermediate)


def bytes_needed(kind: str, shape: Any, max_tokens: int, fused: bool) -> int:
    """What one column of ``shape`` takes on the GPU beyond the checkpoint's NVFP4 tensors
    (already there), an upper estimate: the emulation's laid-out copy of them, plus, where it
    dequantizes every expert per call (0.24.0's path, or the overlay's unfused fallback), their
    BF16 copies twice (an eager call's, and the CUDA graph's own pool); BF16 TritonExperts'
    weights; Marlin's repacked copy; and the activations and
    workspaces of ``max_tokens`` tokens (BF16 and FP32, a few of each)."""
    weights = shape.held_experts * 3 * shape.hidden * shape.intermediate
    nvfp4 = nvfp4_bytes(shape.held_experts, shape.hidden, shape.intermediate)
    unfused = nvfp4 + (0 if fused else 4 * weights)
    extra = {"bf16": 2 * weights, "marlin": nvfp4}.get(kind, unfused)
    width = max(2 * shape.intermediate, shape.hidden)
    return extra + 24 * max_tokens * shape.top_k * width


def check_memory(kind: str, shape: Any, max_tokens: int, fused: bool) -> None:
    """CellSkipped where the column would not fit in the GPU's free memory."""
    import torch

    free, _total = torch.cuda.mem_get_info()
    need = bytes_needed(kind, shape, max_tokens, fused)
    if need > 0.9 * free:
        raise CellSkipped(
            f"needs about {need / GIB:.1f} GiB beyond the NVFP4 weights; {free / GIB:.1f} GiB free"
        )


def build_kernel(kind: str, moe: Any, shape: Any, max_tokens: int, vllm: Any) -> Any:
    """The FusedMoEKernel of one column (a moe_setup.Kernel)."""
    import moe_setup

    if kind == "marlin":
        if vllm.mode != "native":
            raise ColumnSkipped(
                "Marlin needs vLLM's compiled ops (gptq_marlin_repack, the Marlin MoE GEMM);"
                " this tree ran with the stand-ins"
            )
        return moe_setup.marlin_kernel(moe, shape, max_tokens)
    if kind in ("portable", "rocm"):
        if os.environ.get(PORTABLE_ENV) != "1":
            raise ColumnSkipped(f"{PORTABLE_ENV} is not set in this worker")
        if not moe_setup.reads_switch(vllm.package_dir, PORTABLE_ENV):
            raise ColumnSkipped(
                f"this vLLM does not read {PORTABLE_ENV}: its default path (the overlay"
                " column) is its only one"
            )
    if kind == "rocm":
        if os.environ.get(PLATFORM_ENV) != "rocm":
            raise ColumnSkipped(f"{PLATFORM_ENV}=rocm is not set in this worker")
        if not moe_setup.reads_switch(vllm.package_dir, PLATFORM_ENV):
            raise ColumnSkipped(
                f"this vLLM does not read {PLATFORM_ENV}: it has no platform tile table to force"
            )
    if kind == "bf16":
        experts = moe_setup.bf16_triton_experts(moe, shape, max_tokens)
    else:
        experts = moe_setup.nvfp4_emulation_experts(moe, shape, max_tokens)
    return moe_setup.emulation_or_bf16_kernel(experts)


def errors(got: Any, want: Any) -> dict[str, float]:
    """How far ``got`` is from ``want`` (FP32): relative Frobenius, max and mean |difference|,
    and the reference's RMS (the outputs' scale)."""
    diff = (got.float() - want.float()).abs()
    return {
        "rel_err_vs_reference": (diff.norm() / want.float().norm()).item(),
        "max_abs_err": diff.max().item(),
        "mean_abs_err": diff.mean().item(),
        "reference_rms": want.float().pow(2).mean().sqrt().item(),
    }


class FallbackCounter:
    """Counts calls of the overlay's unfused fallback (``_apply_dequantized``) on one experts
    object, where it has one: a column must say when it did not run its fused path."""

    def __init__(self, experts: Any) -> None:
        self.calls = 0
        original = getattr(experts, "_apply_dequantized", None)
        if original is None:
            return

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(*args, **kwargs)

        experts._apply_dequantized = counted


# The default breakdown's largest token count. It was set when replaying one launch alone ended
# the worker on the H200 (Qwen3-235B TP8 at 8192 tokens, Llama-4-Scout TP4 at 1024): vLLM's
# counting alignment launch replayed on its own last state, fixed since in
# cuda_graphs.kernel_breakdown (1024 tokens ran; 8192 not measured since).
BREAKDOWN_MAX = 2048


def breakdown(call: Any, reps: int, flush: Any) -> dict[str, Any]:
    """Each launch of one FusedMoEKernel.apply timed alone (cuda_graphs.kernel_breakdown),
    names filled from torch.profiler where the driver gives none; an error as a reason."""
    import cuda_graphs

    try:
        launches, whole, floor = cuda_graphs.kernel_breakdown(call.run, reps, flush)
    except cuda_graphs.BreakdownUnavailable as exc:
        return {"error": str(exc)}
    except Exception as exc:  # an extra of the run: it must not end the run
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"}
    rows = [dataclasses.asdict(launch) for launch in launches]
    try:
        profiled = cuda_graphs.profiled_kernels(call.run)
    except Exception as exc:  # the profiler is a cross-check only
        profiled, note = [], f"torch.profiler: {type(exc).__name__}: {exc}"
    else:
        note = ""
    kernels = [r for r in rows if r["kind"] == "kernel"]
    if len(profiled) == len(kernels):
        for row, (name, us) in zip(kernels, profiled, strict=True):
            if row["name"] == "?":
                row["name"] = name
            row["profiled_eager_us"] = us
    elif profiled:
        note = f"torch.profiler saw {len(profiled)} kernels, the graph has {len(kernels)}"
    return {"launches": rows, "whole_us": whole, "floor_us": floor, "note": note}


@dataclasses.dataclass(frozen=True)
class WorkerPlan:
    """What one tree's worker runs: the cells (shape -> token counts), the timings, the reps
    (at most ``reps`` and at least ``min_reps`` a timing, fewer where a call is slow:
    ``rep_budget_ms`` of calls a timing), the largest token count with a reference, and the
    token counts with a per-kernel breakdown."""

    cells: dict[str, list[int]]
    reps: int
    min_reps: int = 5
    rep_budget_ms: float = 150.0
    timings: tuple[str, ...] = TIMINGS
    reference_max_tokens: int = 1 << 30
    breakdown_tokens: tuple[int, ...] = ()
    deadline: float = 0.0  # time.time() after which no shape starts (0: none)


def plan_to_json(plan: WorkerPlan) -> str:
    return json.dumps(dataclasses.asdict(plan))


def plan_from_json(text: str) -> WorkerPlan:
    """The inverse of plan_to_json (JSON lists back to the plan's tuples)."""
    f = json.loads(text)
    return WorkerPlan(
        cells={str(k): [int(t) for t in v] for k, v in f["cells"].items()},
        reps=int(f["reps"]),
        min_reps=int(f["min_reps"]),
        rep_budget_ms=float(f["rep_budget_ms"]),
        timings=tuple(f["timings"]),
        reference_max_tokens=int(f["reference_max_tokens"]),
        breakdown_tokens=tuple(f["breakdown_tokens"]),
        deadline=float(f.get("deadline", 0.0)),
    )


def reps_for(plan: WorkerPlan, call_us: float) -> int:
    """The reps of one timing for calls of about ``call_us``."""
    fit = int(plan.rep_budget_ms * 1000.0 / max(call_us, 1e-3))
    return max(plan.min_reps, min(plan.reps, fit))


def worker(
    tree: Path,
    kinds: dict[str, str],
    plan: WorkerPlan,
    out: Path,
    measure_bandwidth: bool,
) -> None:
    sys.path.insert(0, str(GPU_TESTS))
    import gc

    import moe_setup
    import torch
    from cuda_graphs import l2_flush_buffer

    vllm = moe_setup.import_vllm(tree)
    moe_setup.init_workspace()
    flush = l2_flush_buffer()
    result: dict[str, Any] = {
        "vllm": vllm.module.__version__,
        "mode": vllm.mode,
        "portable_env": os.environ.get(PORTABLE_ENV),
        "platform_env": os.environ.get(PLATFORM_ENV),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "rows": [],
        "skipped": {},
        "skipped_cells": [],
        "failed": [],
        "breakdown": [],
        "started": [],  # the shapes begun, in order: where a worker that ends early ended
    }

    def save() -> None:  # after every row: a crash later leaves what was measured
        out.write_text(json.dumps(result))

    def skip_cells(label: str, shape: str, tokens: list[int], why: str) -> None:
        result["skipped_cells"].append(
            {"impl": label, "shape": shape, "tokens": tokens, "reason": why}
        )
        print(f"[{label}] {shape} tokens={tokens}: skipped: {why}", flush=True)
        save()

    if measure_bandwidth:
        result["bandwidth"] = _copy_bandwidth()

    def end_if_context_lost() -> None:
        """After a failure: a CUDA error that poisons the process (an illegal memory access)
        fails every later call, so the worker ends here and the parent starts a new one on
        the shapes after this one."""
        try:
            torch.cuda.synchronize()
        except Exception:
            save()
            raise SystemExit(CONTEXT_LOST) from None

    for name, tokens in plan.cells.items():
        if plan.deadline and time.time() > plan.deadline:
            for label in kinds:
                skip_cells(label, name, tokens, "this tree's share of --budget-s was spent")
            continue
        result["started"].append(name)
        save()
        shape = moe_setup.shape_named(name)
        moe = moe_setup.make_moe(shape)
        references: dict[int, Any] = {}
        for label, kind in kinds.items():
            if label in result["skipped"]:
                skip_cells(label, shape.name, tokens, result["skipped"][label])
                continue
            try:
                fused = vllm_fused(kind, vllm)
                check_memory(kind, shape, max(tokens), fused)
                kernel = build_kernel(kind, moe, shape, max(tokens), vllm)
            except ColumnSkipped as exc:
                result["skipped"][label] = str(exc)
                skip_cells(label, shape.name, tokens, str(exc))
                continue
            except CellSkipped as exc:
                skip_cells(label, shape.name, tokens, str(exc))
                continue
            except Exception as exc:
                traceback.print_exc()
                failure = {"impl": label, "shape": shape.name, "tokens": tokens, "error": repr(exc)}
                result["failed"].append(failure)
                save()
                end_if_context_lost()
                continue
            fallback = FallbackCounter(kernel.experts.experts)
            for t in tokens:
                try:
                    row = measure(kernel, moe, shape, t, plan, flush, fallback, references)
                except Exception as exc:
                    traceback.print_exc()
                    failed = {"impl": label, "shape": shape.name, "tokens": t, "error": repr(exc)}
                    result["failed"].append(failed)
                    save()
                    end_if_context_lost()
                    torch.cuda.empty_cache()
                    continue
                row.update(impl=label, kind=kind, ops=vllm.mode)
                result["rows"].append(row)
                print(row_line(row), flush=True)
                if t in plan.breakdown_tokens:
                    try:
                        layer = moe_setup.MoeLayer(moe, shape, t, kernel.experts, seed=t)
                        parts = breakdown(moe_setup.KernelCall(kernel, layer), plan.reps, flush)
                        del layer
                    except Exception as exc:  # an extra of the run: it must not end the run
                        traceback.print_exc()
                        parts = {"error": f"{type(exc).__name__}: {exc}"}
                    parts.update(shape=shape.name, tokens=t, impl=label, kind=kind, ops=vllm.mode)
                    result["breakdown"].append(parts)
                save()
            del kernel, fallback
            gc.collect()
            torch.cuda.empty_cache()
        # One shape's tensors at a time: the largest layers take tens of GB with their copies.
        del moe, references
        gc.collect()
        torch.cuda.empty_cache()
    save()


def vllm_fused(kind: str, vllm: Any) -> bool:
    """Whether the column's experts run a fused path (no per-call dequantization of every
    expert): Marlin and BF16 do; an emulation where it has patch 0002's fallback hook."""
    if kind in ("marlin", "bf16"):
        return True
    from vllm.model_executor.layers.fused_moe.experts import nvfp4_emulation_moe

    experts = nvfp4_emulation_moe.Nvfp4QuantizationEmulationTritonExperts
    return hasattr(experts, "_apply_dequantized")


def row_line(row: dict[str, Any]) -> str:
    """One measured row, as the worker prints it."""
    times = [f"graph {row['graph_us']:.1f} us"]
    if "rank" in row:
        ranks = " / ".join(f"{us:.1f}" for us in row["rank_graph_us"])
        times[0] += f" (EP rank {row['rank']}, the slowest: {ranks})"
    if "eager_us" in row:
        times.append(f"eager {row['eager_us']:.1f} us")
    if "experts_graph_us" in row:
        times.append(f"experts.apply {row['experts_graph_us']:.1f} us")
    numerics = (
        f"vs W4A4 reference max {row['max_abs_err']:.2e} mean {row['mean_abs_err']:.2e}"
        if "max_abs_err" in row
        else "no reference at this token count"
    )
    return (
        f"[{row['impl']}] {row['shape']} tokens={row['tokens']}: {', '.join(times)}"
        f" ({row['reps']} reps), {numerics} ({row['ops']} ops)"
    )


def measure(
    kernel: Any,
    moe: Any,
    shape: Any,
    tokens: int,
    plan: WorkerPlan,
    flush: Any,
    fallback: FallbackCounter,
    references: dict[int, Any],
) -> dict[str, Any]:
    """One (column, shape, tokens) row: numerics (up to plan.reference_max_tokens), then
    timings (plan.timings), the reps fitted to the call's time."""
    import moe_setup
    import torch
    from cuda_graphs import time_us
    from nvfp4_reference import nvfp4_moe_reference

    layer = moe_setup.MoeLayer(moe, shape, tokens, kernel.experts, seed=tokens)
    call = moe_setup.KernelCall(kernel, layer)
    before = fallback.calls
    output = call.run().float()
    unfused = fallback.calls > before
    # One more eager call, timed, for the reps (the first paid for compiling).
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call.run()
    end.record()
    torch.cuda.synchronize()
    reps = reps_for(plan, start.elapsed_time(end) * 1000.0)
    numerics: dict[str, Any] = {}
    if tokens <= plan.reference_max_tokens:
        if tokens not in references:
            # Exact W4A4 (unrounded weights and activations, FP32 between the GEMMs): that of a
            # Blackwell NVFP4 GEMM, which the emulation exists to reproduce. Other ranks'
            # experts (expert parallelism) contribute nothing.
            weights, ids = moe_setup.local_routing(shape, layer.topk_weights, layer.topk_ids)
            references[tokens] = nvfp4_moe_reference(
                moe, layer.hidden, weights, ids, exact=True
            ).float()
        numerics = errors(output, references[tokens])
    if "experts" in plan.timings or numerics:
        experts_out = layer.apply().float()
        numerics["experts_vs_kernel_max_abs"] = (experts_out - output).abs().max().item()
    del output
    row: dict[str, Any] = dict(
        shape=shape.name,
        checkpoint=shape.checkpoint,
        shard=shape.shard,
        experts=shape.experts,
        local_experts=shape.local_experts,
        hidden=shape.hidden,
        intermediate=shape.intermediate,
        top_k=shape.top_k,
        tokens=tokens,
        reps=reps,
        graph_us=time_us(call.run, reps, graph=True, flush=flush),
    )
    if "eager" in plan.timings:
        row["eager_us"] = time_us(call.run, reps, graph=False, flush=flush)
    if "experts" in plan.timings:
        row["experts_graph_us"] = time_us(layer.run, reps, graph=True, flush=flush)
    row.update(
        active_experts=moe_setup.active_experts(shape, layer.topk_ids),
        ran_unfused_fallback=unfused,
        **numerics,
    )
    tiles = (
        None if unfused else tiles_taken(getattr(kernel.experts, "experts", None), shape, tokens)
    )
    if tiles is not None:
        row["tiles"] = tiles
    row.update(rank_times(call, layer, shape, reps, flush, row["graph_us"]))
    return row


def tiles_taken(experts: Any, shape: Any, tokens: int) -> str | None:
    """The tiles patch 0002's experts take for a call of ``tokens`` on ``shape``, chosen as its
    apply chooses them from the shape's table and predecode entry it read at load: "predecode"
    and the predecode entry where the call decodes the weights once, else the bucket's entry of
    the table. None for experts without tile tables (the pristine emulation, Marlin, patch
    0002 before its tables)."""
    configs = getattr(experts, "configs", None)
    if configs is None:
        return None
    names = type(experts).apply.__globals__  # the functions apply itself calls
    predecode = experts.predecode_config
    sizes = (shape.held_experts, shape.hidden, shape.intermediate, 2)  # BF16 activations
    if (
        experts.tiled_weights is not None
        and experts.predecode
        and predecode is not None
        and names["predecodes"](tokens * shape.top_k, shape.experts, *sizes, predecode)
    ):
        return f"predecode {predecode}"
    config = names["get_nvfp4_moe_config"](
        tokens, shape.top_k, shape.experts, experts.min_block_m, configs
    )
    return repr(config)


def rank_times(
    call: Any, layer: Any, shape: Any, reps: int, flush: Any, rank0_us: float
) -> dict[str, Any]:
    """An expert-parallel cell's every rank (rank 0's time given), on the same tokens: the
    slowest rank's graph time and routed experts, with each rank's; nothing where one GPU holds
    every expert. The layer's routing is back as it was after."""
    import moe_setup
    from cuda_graphs import time_us

    n = moe_setup.ranks(shape)
    if n == 1:
        return {}
    ids = layer.topk_ids.clone()
    times, active = [rank0_us], [moe_setup.active_experts(shape, ids)]
    for rank in range(1, n):
        layer.topk_ids.copy_(moe_setup.rank_routing(shape, ids, rank))
        times.append(time_us(call.run, reps, graph=True, flush=flush))
        active.append(moe_setup.active_experts(shape, layer.topk_ids))
    layer.topk_ids.copy_(ids)
    slowest = max(range(n), key=times.__getitem__)
    return dict(
        graph_us=times[slowest],
        active_experts=active[slowest],
        rank=slowest,
        rank_graph_us=times,
        rank_active_experts=active,
    )


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)


def _copy_bandwidth() -> float:
    import torch

    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return 2 * src.numel() * 10 / (start.elapsed_time(end) / 1000.0)


# --------------------------------------------------------------------------- parent


def _nvfp4_layer_bytes(hidden: int, intermediate: int) -> int:
    """One expert's packed E2M1 weights (1/2 byte each) and FP8 block scales (1/16 byte)."""
    return 3 * hidden * intermediate * 9 // 16


@dataclasses.dataclass(frozen=True)
class Options:
    plan: WorkerPlan
    columns: tuple[str, ...]
    budget_s: float = 0.0  # the whole run's, shared by the trees left by columns (0: none)


def run_trees(
    trees: list[Tree],
    opts: Options,
    meta: dict[str, Any],
    after_each: Callable[[dict[str, Any]], None] = lambda data: None,
) -> dict[str, Any]:
    """Every tree's worker, one after the other; the merged results (rows, bounds, ``meta``
    with the trees'), given to ``after_each`` after every worker (a run cut short keeps them).
    A worker that ends early (a CUDA error that poisons its process, a crash) is followed by a
    new one on the shapes it had not begun; the shape it ended in is in ``meta["failed"]``."""
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    meta.update(trees={}, skipped={}, skipped_cells=[], failed=[], bandwidth_bytes_per_s=None)
    parts: list[dict[str, Any]] = []

    def merged() -> dict[str, Any]:
        return {"meta": meta, "rows": rows + bound_rows(rows, meta), "breakdown": parts}

    with tempfile.TemporaryDirectory() as tmp:
        todo = [(tree, tree_version(tree.path)) for tree in trees]
        todo = [(tree, version) for tree, version in todo if tree.impls(version, opts.columns)]
        for i, (tree, version) in enumerate(todo):
            kinds = tree.impls(version, opts.columns)
            plan = opts.plan
            if opts.budget_s:  # a share of what is left, by the columns this tree runs
                left = opts.budget_s - (time.monotonic() - started)
                share = budget_share(left, [len(t.impls(v, opts.columns)) for t, v in todo[i:]])
                plan = dataclasses.replace(plan, deadline=time.time() + share)
            print(f"== {tree.role}: vLLM {version} from {tree.path}", flush=True)
            attempt = 0
            while plan.cells:
                out = Path(tmp) / f"{i}-{attempt}.json"
                code, result = run_worker(tree, kinds, plan, out, meta["bandwidth_bytes_per_s"])
                attempt += 1
                if result is None:
                    meta["failed"].append({"tree": tree.role, "error": f"exit {code}"})
                    break
                begun = result.get("started", [])
                if code != 0:
                    failure = {"tree": tree.role, "error": f"exit {code}"}
                    meta["failed"].append(failure | ({"shape": begun[-1]} if begun else {}))
                merge_worker(tree, version, kinds, result, meta, rows, parts)
                after_each(merged())
                plan = dataclasses.replace(plan, cells=not_begun(plan.cells, begun, code))
                if plan.cells:
                    print(
                        f"== {tree.role}: the worker ended (exit {code}) in {begun[-1]}; a new"
                        f" one runs the {len(plan.cells)} shapes after it",
                        flush=True,
                    )
    return merged()


def not_begun(cells: dict[str, list[int]], begun: list[str], code: int) -> dict[str, list[int]]:
    """The cells a new worker runs after one that exited with ``code`` having begun the shapes
    ``begun``: none after a clean exit, or where it began none (no progress to build on)."""
    if code == 0 or not begun:
        return {}
    return {shape: tokens for shape, tokens in cells.items() if shape not in begun}


def run_worker(
    tree: Tree, kinds: dict[str, str], plan: WorkerPlan, out: Path, bandwidth: float | None
) -> tuple[int, dict[str, Any] | None]:
    """One worker process on ``plan``: its exit status and what it saved (None: nothing)."""
    cmd = [sys.executable, __file__, "--worker", str(tree.path)]
    cmd += ["--kinds", json.dumps(kinds), "--plan", plan_to_json(plan), "--worker-out", str(out)]
    if bandwidth is None:
        cmd.append("--bandwidth")
    done = subprocess.run(cmd, env=tree.env())
    return done.returncode, json.loads(out.read_text()) if out.is_file() else None


def merge_worker(
    tree: Tree,
    version: str,
    kinds: dict[str, str],
    result: dict[str, Any],
    meta: dict[str, Any],
    rows: list[dict[str, Any]],
    parts: list[dict[str, Any]],
) -> None:
    """One worker's results into the run's ``meta``, ``rows`` and ``parts`` (breakdowns)."""
    switches = {
        PORTABLE_ENV: result.get("portable_env"),
        PLATFORM_ENV: result.get("platform_env"),
    }
    meta["trees"][tree.role] = {
        "path": str(tree.path),
        "vllm": result["vllm"],
        "ops": result["mode"],
        "impls": list(kinds),
        **{k: v for k, v in switches.items() if v is not None},
    }
    columns = {label: column for column, (label, _) in tree.by_column(version).items()}
    for row in result["rows"]:
        row["column"] = columns[row["impl"]]
    meta["bandwidth_bytes_per_s"] = meta["bandwidth_bytes_per_s"] or result.get("bandwidth")
    for key in ("device", "torch", "triton"):
        meta.setdefault(key, result.get(key))
    meta["skipped"].update(result["skipped"])
    meta["skipped_cells"] += result.get("skipped_cells", [])
    meta["failed"] += result["failed"]
    rows += result["rows"]
    parts += result["breakdown"]


def budget_share(left_s: float, columns: list[int]) -> float:
    """The next tree's time out of ``left_s``: its share by columns (``columns``: the number
    each tree left to run has, the next first)."""
    return max(left_s, 0.0) * columns[0] / sum(columns)


def bound_rows(rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The weight-read bound per (shape, tokens); each row's fraction of it."""
    bandwidth = meta["bandwidth_bytes_per_s"]
    if not bandwidth:
        return []
    bounds: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        nbytes = r["active_experts"] * _nvfp4_layer_bytes(r["hidden"], r["intermediate"])
        bound_us = nbytes / bandwidth * 1e6
        r["bound_us"] = bound_us
        r["bound_fraction"] = bound_us / r["graph_us"]
        keys = ("shape", "experts", "hidden", "intermediate", "top_k", "tokens", "active_experts")
        bounds[r["shape"], r["tokens"]] = {k: r[k] for k in keys} | dict(
            impl=BOUND,
            graph_us=bound_us,
            eager_us=bound_us,
            bound_us=bound_us,
            bound_fraction=1.0,
            weight_bytes=nbytes,
        )
    return list(bounds.values())


# --------------------------------------------------------------------------- reports


def _impls(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["impl"] for r in rows))


def _tokens(rows: list[dict[str, Any]]) -> list[int]:
    return sorted({r["tokens"] for r in rows})


def _shapes(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["shape"] for r in rows))


def summary(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (shape, tokens) cell: every column's graph-replay µs side by side, the ratios the
    goals are stated in, and each goal's verdict (True: met, False: missed, None: not
    applicable or a column missing), ``passed`` over the applicable ones (None where none is).

    Goals: ``marlin``: overlay ≤ Marlin; ``pristine``: overlay ≤ the pristine emulation;
    ``decode``: at 1 token, where the weight-read floor is under DECODE_FLOOR_US, overlay ≤
    DECODE_US; ``bound``: from 32 to 128 tokens (BOUND_TOKENS), overlay ≥ BOUND_SHARE of the
    weight-read bound; ``rocm``: rocm / overlay ≤ ROCM_RATIO. before / overlay and upstream /
    overlay (a later release's emulation: upstream_graft.py) are figures, not goals."""
    rows = data["rows"]
    us: dict[tuple[str, int], dict[str, float]] = {}
    for r in rows:
        column = BOUND if r["impl"] == BOUND else r.get("column") or column_of_label(r["impl"])
        if column is not None:
            us.setdefault((r["shape"], r["tokens"]), {})[column] = r["graph_us"]
    out = []
    for (shape, tokens), cols in us.items():
        overlay, bound = cols.get("overlay"), cols.get(BOUND)

        def ratio(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else a / b

        row: dict[str, Any] = {
            "shape": shape,
            "tokens": tokens,
            "required": tokens in required_tokens(shape),
            "us": {k: cols[k] for k in (*COLUMNS, BOUND) if k in cols},
            "overlay_vs_marlin": ratio(overlay, cols.get("marlin")),
            "overlay_vs_pristine": ratio(overlay, cols.get("pristine")),
            "bound_fraction": ratio(bound, overlay),
            "rocm_vs_overlay": ratio(cols.get("rocm"), overlay),
            "before_vs_overlay": ratio(cols.get("before"), overlay),
            "upstream_vs_overlay": ratio(cols.get("upstream"), overlay),
        }
        floor_small = tokens == 1 and bound is not None and bound < DECODE_FLOOR_US

        def at_most(x: float | None, limit: float) -> bool | None:
            return None if x is None else x <= limit

        goals = {
            "marlin": at_most(row["overlay_vs_marlin"], 1.0),
            "pristine": at_most(row["overlay_vs_pristine"], 1.0),
            "decode": at_most(overlay, DECODE_US) if floor_small else None,
            "bound": (
                None
                if not BOUND_TOKENS[0] <= tokens <= BOUND_TOKENS[1] or row["bound_fraction"] is None
                else row["bound_fraction"] >= BOUND_SHARE
            ),
            "rocm": at_most(row["rocm_vs_overlay"], ROCM_RATIO),
        }
        verdicts = [v for v in goals.values() if v is not None]
        row["goals"] = goals
        row["passed"] = all(verdicts) if verdicts else None
        out.append(row)
    order = {name: i for i, name in enumerate(_shapes(rows))}
    return sorted(out, key=lambda r: (order[r["shape"]], r["tokens"]))


# Results written before rows carried their column: the column by the label's ending.
_LABEL_ENDINGS = {
    "(pristine)": "pristine",
    "(overlay)": "overlay",
    "(overlay before)": "before",
    "(rocm)": "rocm",
    "portable path forced": "portable",
    "(upstream)": "upstream",
}


def column_of_label(impl: str) -> str | None:
    """The column of an implementation label (Tree.by_column's), for rows without one."""
    if impl.startswith("Marlin W4A16"):
        return "marlin"
    if impl.startswith(BF16):
        return "bf16"
    return next((c for end, c in _LABEL_ENDINGS.items() if impl.endswith(end)), None)


def _x(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _verdict(value: bool | None) -> str:
    return {True: "pass", False: "FAIL", None: "—"}[value]


def summary_lines(cells: list[dict[str, Any]]) -> list[str]:
    """The summary as a Markdown table, then a count of the required cells that pass."""
    head = (
        "| shape | tokens | overlay µs | Marlin µs | overlay/Marlin | pristine µs |"
        " overlay/pristine | bound µs | % of bound | rocm/overlay | before/overlay |"
        " upstream/overlay | missed | verdict |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for c in cells:
        us = c["us"]
        missed = ", ".join(goal for goal, ok in c["goals"].items() if ok is False) or "—"
        share = None if c["bound_fraction"] is None else 100 * c["bound_fraction"]
        mark = "" if c["required"] else " (extra)"
        lines.append(
            f"| {c['shape']} | {c['tokens']}{mark} | {_x(us.get('overlay'), 1)} |"
            f" {_x(us.get('marlin'), 1)} | {_x(c['overlay_vs_marlin'])} |"
            f" {_x(us.get('pristine'), 1)} | {_x(c['overlay_vs_pristine'])} |"
            f" {_x(us.get(BOUND), 1)} | {_x(share, 0)} | {_x(c['rocm_vs_overlay'])} |"
            f" {_x(c['before_vs_overlay'])} | {_x(c['upstream_vs_overlay'])} | {missed} |"
            f" {_verdict(c['passed'])} |"
        )
    required = [c for c in cells if c["required"]]
    passed = sum(c["passed"] is True for c in required)
    judged = sum(c["passed"] is not None for c in required)
    lines += [
        "",
        f"{passed} of {judged} required cells judged pass every applicable goal"
        f" ({len(required)} required cells measured).",
    ]
    return lines


def skipped_cell_lines(meta: dict[str, Any], shape: str | None = None) -> list[str]:
    return [
        f"- {s['impl']}, {s['shape']}, tokens {', '.join(map(str, s['tokens']))}:"
        f" skipped: {s['reason']}"
        for s in meta.get("skipped_cells", [])
        if shape is None or s["shape"] == shape
    ]


def print_table(data: dict[str, Any]) -> None:
    rows = data["rows"]
    impls = _impls(rows)
    by = {(r["shape"], r["tokens"], r["impl"]): r for r in rows}
    overlay = next((r["impl"] for r in rows if r.get("column") == "overlay"), None)
    for shape in _shapes(rows):
        tokens = _tokens([r for r in rows if r["shape"] == shape])
        print(f"\n{shape}: FusedMoEKernel.apply, graph replay / eager µs (fraction of the bound)")
        for impl in impls:
            cells = []
            for t in tokens:
                r = by.get((shape, t, impl))
                if r is None:
                    cells.append(f"{'-':>24s}")
                elif impl == BOUND:
                    cells.append(f"{r['graph_us']:>24.1f}")
                else:
                    frac = r.get("bound_fraction", float("nan"))
                    eager = f"{r['eager_us']:7.1f}" if "eager_us" in r else f"{'-':>7s}"
                    cells.append(f"{r['graph_us']:8.1f} /{eager} ({frac:4.2f})")
            ops = next((f" [{r['ops']}]" for r in rows if r["impl"] == impl and "ops" in r), "")
            print(f"  {impl + ops:55s}" + "".join(cells))
        if overlay:
            for impl in impls:
                if impl in (overlay, BOUND):
                    continue
                ratios = [
                    by[shape, t, impl]["graph_us"] / by[shape, t, overlay]["graph_us"]
                    for t in tokens
                    if (shape, t, impl) in by and (shape, t, overlay) in by
                ]
                print(f"  {impl} / overlay: " + ", ".join(f"{x:.2f}x" for x in ratios))
        print(f"\n{shape}: against the W4A4 reference, max |Δ| / mean |Δ|")
        for impl in impls:
            if impl == BOUND:
                continue
            cells = [
                f"{r['max_abs_err']:9.2e} /{r['mean_abs_err']:9.2e}"
                if r and "max_abs_err" in r
                else f"{'-':>20s}"
                for r in (by.get((shape, t, impl)) for t in tokens)
            ]
            print(f"  {impl:55s}" + "  ".join(cells))
    print("\n  tokens: " + ", ".join(map(str, _tokens(rows))))
    for label, why in data["meta"].get("skipped", {}).items():
        print(f"  {label}: skipped: {why}")
    for line in skipped_cell_lines(data["meta"]):
        print(f"  {line[2:]}")
    for failure in data["meta"].get("failed", []):
        print(f"  FAILED: {failure}")
    for part in shown_breakdowns(data):
        print("\n" + "\n".join(breakdown_lines(part)))
    judged = summary(data)
    if judged:
        print("\nSummary (graph replay):")
        for line in summary_lines(judged):
            print(f"  {line}")


def shown_breakdowns(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The breakdowns printed and in the Markdown (every one is in the JSON): the overlay's
    columns and Marlin's."""
    parts = data.get("breakdown", [])
    return [p for p in parts if "overlay" in p["impl"] or p["kind"] in MARKDOWN_BREAKDOWN]


def breakdown_lines(part: dict[str, Any], markdown: bool = False) -> list[str]:
    head = f"{part['impl']}, {part['shape']}, {part['tokens']} tokens ({part['ops']} ops)"
    if "error" in part:
        return [f"{head}: per-kernel breakdown not available: {part['error']}"]
    total = sum(launch["us"] for launch in part["launches"])
    summary = (
        f"whole graph {part['whole_us']:.1f} µs; each launch alone, summed, {total:.1f} µs;"
        f" an empty graph {part['floor_us']:.1f} µs (in every launch's figure)"
    )
    if markdown:
        lines = [f"#### {head}", "", summary + ".", ""]
        lines += ["| # | kind | kernel | grid | block | µs alone |", "|---:|---|---|---|---|---:|"]
        lines += [
            f"| {x['index']} | {x['kind']} | `{x['name']}` | {_dims(x['grid'])} |"
            f" {_dims(x['block'])} | {x['us']:.1f} |"
            for x in part["launches"]
        ]
        return lines + (["", f"Note: {part['note']}"] if part.get("note") else [])
    lines = [f"{head}: {summary}"]
    lines += [
        f"  {x['index']:3d} {x['kind']:6s} {x['us']:8.1f} µs  grid {_dims(x['grid']):>12s}"
        f"  {x['name']}"
        for x in part["launches"]
    ]
    return lines + ([f"  note: {part['note']}"] if part.get("note") else [])


def _dims(dims: list[int]) -> str:
    return "x".join(map(str, dims)) or "-"


def markdown(data: dict[str, Any], title: str) -> str:
    meta, rows = data["meta"], data["rows"]
    impls = _impls(rows)
    by = {(r["shape"], r["tokens"], r["impl"]): r for r in rows}
    lines = [f"# {title}", ""]
    bandwidth = meta.get("bandwidth_bytes_per_s") or 0.0
    wall = f" in {meta['wall_s']:.0f} s" if meta.get("wall_s") else ""
    runs, when, same = "One run", f"{meta.get('date')}{wall}", "in the same run"
    if merged := meta.get("merged_from"):  # --merge: each cell's columns are of one run
        runs, when, same = (
            f"{len(merged)} runs, merged,",
            ", ".join(map(str, merged)),
            "in the first",
        )
    lines.append(
        f"{runs} of `benchmarks/bench_nvfp4_moe.py --reps {meta.get('reps')}` on"
        f" {meta.get('device')} (torch {meta.get('torch')}, Triton {meta.get('triton')}),"
        f" {when}; copy bandwidth measured {same}:"
        f" {bandwidth / 1e12:.2f} TB/s (the bound's denominator). Ops per tree:"
    )
    lines.append("")
    for role, tree in meta.get("trees", {}).items():
        env = "".join(f", {k}={tree[k]}" for k in SWITCHES if k in tree)
        lines.append(
            f"- {role}: vLLM {tree['vllm']}, ops `{tree['ops']}`{env}: {', '.join(tree['impls'])}"
        )
    for label, why in meta.get("skipped", {}).items():
        lines.append(f"- {label}: skipped: {why}")
    for failure in meta.get("failed", []):
        lines.append(f"- FAILED: {failure}")
    lines.append("")
    if plan := meta.get("plan"):
        reference = plan["reference_max_tokens"]
        lines += [
            f"Timings: {', '.join(plan['timings'])}; reps per timing at most {plan['reps']},"
            f" at least {plan['min_reps']}, about {plan['rep_budget_ms']:g} ms of calls;"
            " the W4A4 reference "
            + (f"up to {reference} tokens." if reference < 1 << 30 else "at every token count."),
            "",
        ]
    cells = summary(data)
    if cells:
        lines += ["## Summary", ""]
        lines += [
            "Per cell, FusedMoEKernel.apply by CUDA graph replay (L2 flushed), µs; the goals:"
            f" overlay at or below Marlin and the pristine emulation; at 1 token at most"
            f" {DECODE_US:g} µs where the weight-read floor is under {DECODE_FLOOR_US:g} µs;"
            f" at least {100 * BOUND_SHARE:.0f}% of the weight-read bound at"
            f" {BOUND_TOKENS[0]} to {BOUND_TOKENS[1]} tokens; rocm within {ROCM_RATIO}x of the"
            " overlay. `missed` names the goals a cell misses; a goal whose columns did not run"
            " is not judged.",
            "",
        ]
        lines += [*summary_lines(cells), ""]
    for shape in _shapes(rows):
        tokens = _tokens([r for r in rows if r["shape"] == shape])
        head = "| implementation | ops | " + " | ".join(f"{t} tok" for t in tokens) + " |"
        rule = "|---|---|" + "---:|" * len(tokens)
        lines += [f"### {shape}", ""]
        lines += ["FusedMoEKernel.apply: CUDA graph replay µs / eager µs (fraction of the bound)"]
        lines += ["", head, rule]
        for impl in impls:
            if not any(key[0] == shape and key[2] == impl for key in by):
                continue
            cells_ = []
            for t in tokens:
                r = by.get((shape, t, impl))
                if r is None:
                    cells_.append("—")
                elif impl == BOUND:
                    cells_.append(f"{r['graph_us']:.1f}")
                else:
                    frac = r.get("bound_fraction", float("nan"))
                    eager = f"{r['eager_us']:.0f}" if "eager_us" in r else "—"
                    cells_.append(f"{r['graph_us']:.1f} / {eager} ({frac:.2f})")
            ops = next((r["ops"] for r in rows if r["impl"] == impl and "ops" in r), "—")
            lines.append(f"| {impl} | {ops} | " + " | ".join(cells_) + " |")
        skipped = skipped_cell_lines(meta, shape)
        if skipped:
            lines += ["", *skipped]
        shown = [i for i in impls if i != BOUND and any(k[0] == shape and k[2] == i for k in by)]
        if any("experts_graph_us" in by[k] for k in by if k[0] == shape):
            lines += ["", "The experts' own `apply` alone, CUDA graph replay µs:", "", head, rule]
            for impl in shown:
                cells_ = [
                    f"{by[shape, t, impl]['experts_graph_us']:.1f}"
                    if "experts_graph_us" in by.get((shape, t, impl), {})
                    else "—"
                    for t in tokens
                ]
                ops = next((r["ops"] for r in rows if r["impl"] == impl and "ops" in r), "—")
                lines.append(f"| {impl} | {ops} | " + " | ".join(cells_) + " |")
        lines += [
            "",
            "Against the W4A4 reference: max |Δ| / mean |Δ| (outputs of RMS about"
            f" {_rms(rows, shape):.2f}); † the unfused fallback ran:",
            "",
            head,
            rule,
        ]
        for impl in shown:
            cells_ = []
            for t in tokens:
                r = by.get((shape, t, impl))
                if r is None:
                    cells_.append("—")
                else:
                    mark = " †" if r.get("ran_unfused_fallback") else ""
                    errs = (
                        f"{r['max_abs_err']:.1e} / {r['mean_abs_err']:.1e}"
                        if "max_abs_err" in r
                        else "no reference"
                    )
                    cells_.append(errs + mark)
            ops = next((r["ops"] for r in rows if r["impl"] == impl and "ops" in r), "—")
            lines.append(f"| {impl} | {ops} | " + " | ".join(cells_) + " |")
        lines.append("")
    shown_parts = shown_breakdowns(data)
    if shown_parts:
        lines += ["## Per-kernel breakdown", ""]
        lines += [str(meta.get("breakdown_method", "")), ""]
        for part in shown_parts:
            lines += [*breakdown_lines(part, markdown=True), ""]
    if meta.get("method"):
        lines += ["## Method", "", meta["method"], ""]
    return "\n".join(lines)


def _rms(rows: list[dict[str, Any]], shape: str) -> float:
    values = [r["reference_rms"] for r in rows if r["shape"] == shape and "reference_rms" in r]
    return sum(values) / len(values) if values else float("nan")


def plot(data: dict[str, Any], path: Path, title: str) -> bool:
    """The PNG; False (and a line) where matplotlib is missing or no cell ran."""
    if not _shapes(data["rows"]):
        print(f"no cell ran: {path} not written")
        return False
    try:
        import matplotlib
    except ImportError:
        print(f"no matplotlib here: {path} not written (run --replot where it is)")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    shapes = _shapes(rows)
    ncols = min(len(shapes), PLOT_COLUMNS)
    nrows = -(-len(shapes) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4.2 * nrows), squeeze=False)
    flat = [ax for line in axes for ax in line]
    for ax in flat[len(shapes) :]:
        ax.set_visible(False)
    for ax, shape in zip(flat, shapes, strict=False):
        for impl in _impls(rows):
            pts = sorted(
                (r["tokens"], r["graph_us"])
                for r in rows
                if r["shape"] == shape and r["impl"] == impl
            )
            if not pts:
                continue
            style = "k--" if impl == BOUND else "o-"
            ops = next((f" [{r['ops']}]" for r in rows if r["impl"] == impl and "ops" in r), "")
            ax.plot(*zip(*pts, strict=True), style, label=impl + ops)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("FusedMoEKernel.apply, graph replay, µs")
        ax.set_title(shape_title(rows, shape), fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    flat[0].legend(fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def shape_title(rows: list[dict[str, Any]], shape: str) -> str:
    """A plot's title: the shape and its sizes (E experts, local ones where fewer, H, I, top-k)."""
    r = next(r for r in rows if r["shape"] == shape)
    local = f"/{r['local_experts']} local" if r.get("local_experts") else ""
    sizes = f"H={r['hidden']}, I={r['intermediate']}, top-{r['top_k']}"
    return f"{shape} (E={r['experts']}{local}, {sizes})"


def title_of(meta: dict[str, Any]) -> str:
    return (
        f"NVFP4 MoE layers on {meta.get('device', '?')} (BF16 input; CUDA graph replay, L2"
        " flushed; panels: E experts, hidden H, intermediate I per GPU)"
    )


def write_reports(data: dict[str, Any], out: Path, name: str, quiet: bool = False) -> list[Path]:
    """JSON, Markdown and PNG (``quiet``: JSON and Markdown only, no line)."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / f"{name}.json", out / f"{name}.md"]
    written[0].write_text(json.dumps(data, indent=1) + "\n")
    written[1].write_text(markdown(data, title_of(data["meta"])))
    if not quiet and plot(data, out / f"{name}.png", title_of(data["meta"])):
        written.append(out / f"{name}.png")
    return written


def replot(path: Path) -> list[Path]:
    """The Markdown and PNG of a results JSON, written beside it."""
    data = json.loads(path.read_text())
    written = [path.with_suffix(".md")]
    written[0].write_text(markdown(data, title_of(data["meta"])))
    if plot(data, path.with_suffix(".png"), title_of(data["meta"])):
        written.append(path.with_suffix(".png"))
    return written


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs of the same benchmark on other columns (one GPU command each, say) as one run:
    rows, breakdowns, trees, skipped and failed columns together, the first run's meta
    otherwise (its copy bandwidth), the bound recomputed."""
    meta = dict(parts[0]["meta"])
    meta["trees"], meta["skipped"], meta["skipped_cells"], meta["failed"] = {}, {}, [], []
    rows, breakdowns = [], []
    for part in parts:
        for role, tree in part["meta"]["trees"].items():
            meta["trees"][role if role not in meta["trees"] else f"{role}+"] = tree
        meta["skipped"].update(part["meta"].get("skipped", {}))
        meta["skipped_cells"] += part["meta"].get("skipped_cells", [])
        meta["failed"] += part["meta"].get("failed", [])
        rows += [r for r in part["rows"] if r["impl"] != BOUND]
        breakdowns += part.get("breakdown", [])
    meta["merged_from"] = [p["meta"].get("date") for p in parts]
    cells = [(r["shape"], r["tokens"], r["impl"]) for r in rows]
    if twice := sorted({c for c in cells if cells.count(c) > 1}):
        shape, tokens, impl = twice[0]
        raise ValueError(
            f"{len(twice)} cells are in more than one of the runs, the first {impl} on {shape}"
            f" at {tokens} tokens: keep each cell in one run"
        )
    return {"meta": meta, "rows": rows + bound_rows(rows, meta), "breakdown": breakdowns}


def output_name(name: str | None, meta: dict[str, Any]) -> str:
    """The headline name when every tree ran vLLM's real ops, else ``<name>_standin``; without
    a name, ``nvfp4_moe_<GPU>`` (it was nvfp4_moe_h200 on every GPU: a run elsewhere wrote over
    the H200's results)."""
    name = name or by_gpu("nvfp4_moe", meta.get("device"))
    ops = {tree["ops"] for tree in meta["trees"].values()}
    return name if ops == {"native"} else f"{name}_standin"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pristine", type=Path, help="tree of the pinned vLLM, unpatched")
    parser.add_argument("--overlay", type=Path, help="the same tree with patches/series applied")
    parser.add_argument(
        "--before",
        type=Path,
        help="the overlay as it was before a kernel change: its own column (overlay before)",
    )
    parser.add_argument(
        "--upstream",
        type=Path,
        action="append",
        default=[],
        help="a later vLLM release's tree (its own emulation), or the pin's with a later"
        " release's emulation grafted (benchmarks/upstream_graft.py); repeatable",
    )
    parser.add_argument(
        "--columns",
        nargs="+",
        choices=COLUMNS,
        help="the implementations to run (default: every one of the trees given)",
    )
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32, 128, 512])
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=["qwen3-30b-a3b", "e128-h4096-i1536"],
        help="MoE shapes (tests/gpu/moe_setup.SHAPES names, or a layer's sizes:"
        " e<E>-h<H>-i<I per GPU>-k<top-k>[-ep<N>]) or groups: " + ", ".join(SHAPE_GROUPS),
    )
    parser.add_argument(
        "--cells",
        choices=["required"],
        help="required: each shape at its required token counts (1, 32, 512; "
        + ", ".join(DETAILED_SHAPES)
        + f": {', '.join(map(str, DETAILED_TOKENS))}) instead of --tokens; --shapes defaults"
        " to all",
    )
    parser.add_argument(
        "--timings",
        nargs="+",
        choices=TIMINGS,
        default=list(TIMINGS),
        help="graph: FusedMoEKernel.apply replayed; eager: plain calls; experts: the experts'"
        " apply replayed (default: all three)",
    )
    parser.add_argument(
        "--breakdown-tokens",
        type=int,
        nargs="*",
        help=f"token counts with a per-kernel breakdown (default: every one up to {BREAKDOWN_MAX}"
        " without --cells, none with it; none given: no breakdown)",
    )
    parser.add_argument("--reps", type=int, default=25, help="reps of a timing, at most")
    parser.add_argument("--min-reps", type=int, default=5, help="reps of a timing, at least")
    parser.add_argument(
        "--rep-budget-ms",
        type=float,
        default=150.0,
        help="fewer reps where a call is slow: about this much of calls a timing",
    )
    parser.add_argument(
        "--reference-max-tokens",
        type=int,
        default=1 << 30,
        help="the W4A4 reference (numerics) only up to this many tokens (default: all)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="the run's time: each tree's worker gets a share of what is left (by its columns)"
        " and starts no shape after it (those cells are listed as skipped, with the reason)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--name",
        help="file name stem under --out (default nvfp4_moe_<GPU>, the GPU as the run names it:"
        " nvfp4_moe_h200 on an H200; with _standin appended unless every tree had the real ops)",
    )
    parser.add_argument(
        "--replot", type=Path, metavar="JSON", help="only write the Markdown and PNG of JSON"
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="only merge these results (runs of other columns) into one, under --out/--name",
    )
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--kinds", help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--bandwidth", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.columns is None:
        args.columns = [c for c in COLUMNS if c != "before" or args.before is not None]
    if args.breakdown_tokens is None:
        args.breakdown_tokens = [] if args.cells else [t for t in args.tokens if t <= BREAKDOWN_MAX]
    if args.replot is None and args.worker is None and args.merge is None:
        needs_pristine = {"pristine", "bf16", "marlin"} & set(args.columns)
        needs_overlay = {"overlay", "portable", "rocm"} & set(args.columns)
        if (needs_pristine and args.pristine is None) or (needs_overlay and args.overlay is None):
            parser.error(
                "--pristine and --overlay are required for the columns asked"
                " (--columns picks fewer)"
            )
        if "before" in args.columns and args.before is None:
            parser.error("the before column needs --before DIR")
        for tree in args.upstream:  # a vLLM tree, and where grafted a whole note
            try:
                tree_version(tree), grafted_release(tree)
            except GraftError as exc:
                parser.error(str(exc))
        if args.cells and "--shapes" not in (argv if argv is not None else sys.argv[1:]):
            args.shapes = ["required"]
        try:
            args.shapes = resolve_shapes(args.shapes)
        except UnknownShape as exc:
            parser.error(str(exc))
    return args


def plan_of(args: argparse.Namespace) -> WorkerPlan:
    return WorkerPlan(
        cells=cells_of(args.shapes, args.tokens, args.cells),
        reps=args.reps,
        min_reps=min(args.min_reps, args.reps),
        rep_budget_ms=args.rep_budget_ms,
        timings=tuple(args.timings),
        reference_max_tokens=args.reference_max_tokens,
        breakdown_tokens=tuple(args.breakdown_tokens),
    )


def trees_of(args: argparse.Namespace) -> list[Tree]:
    trees = []
    if args.pristine is not None:
        trees.append(Tree("pristine", args.pristine.resolve()))
    if args.overlay is not None:
        overlay = args.overlay.resolve()
        trees += [Tree(role, overlay) for role in ("overlay", "portable", "rocm")]
    if args.before is not None:
        trees.append(Tree("before", args.before.resolve()))
    return trees + [Tree("upstream", p.resolve(), grafted_release(p)) for p in args.upstream]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot is not None:
        for path in replot(args.replot):
            print(f"wrote {path}")
        return 0
    if args.merge is not None:
        try:
            data = merge([json.loads(p.read_text()) for p in args.merge])
        except (OSError, ValueError, KeyError) as exc:
            print(f"bench_nvfp4_moe: --merge: {exc}", file=sys.stderr)
            return 2
        for path in write_reports(data, args.out, output_name(args.name, data["meta"])):
            print(f"wrote {path}")
        return 0
    if args.worker:
        plan = plan_from_json(args.plan)
        try:
            worker(
                args.worker.resolve(), json.loads(args.kinds), plan, args.worker_out, args.bandwidth
            )
        except KeyboardInterrupt as exc:  # Ctrl-C reaches the worker too: its parent says it
            return stops.status(exc)
        except BrokenPipeError:  # so does the reader's going: the parent says it
            return stops.reader_gone()
        return 0
    opts = Options(plan_of(args), tuple(args.columns), args.budget_s)
    doc = __doc__ or ""
    meta: dict[str, Any] = dict(
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        reps=args.reps,
        plan={k: v for k, v in dataclasses.asdict(opts.plan).items() if k != "cells"},
        cells=opts.plan.cells,
        method=doc.split("Method: ")[1].split("\n\nOutput")[0],
        breakdown_method=(
            "Each launch of one `FusedMoEKernel.apply` replayed alone from the call's own"
            " CUDA graph (every other kernel, memset and memcpy node disabled), L2 flushed"
            " before each replay, median µs."
        ),
    )

    saved: list[Path] = []

    def save(data: dict[str, Any]) -> None:  # after every tree: a run cut short keeps them
        saved[:] = write_reports(data, args.out, output_name(args.name, data["meta"]), quiet=True)

    started = time.monotonic()
    try:
        with stops.raised():  # a worker running is killed (subprocess.run)
            data = run_trees(trees_of(args), opts, meta, save)
    except (KeyboardInterrupt, BrokenPipeError) as exc:
        kept = f"what ran before is in {', '.join(map(str, saved))}" if saved else "nothing saved"
        if isinstance(exc, BrokenPipeError):
            code = stops.reader_gone()
            print(f"bench_nvfp4_moe: the output's reader went away: {kept}", file=sys.stderr)
            return code
        print(f"bench_nvfp4_moe: interrupted: {kept}", file=sys.stderr)
        return stops.status(exc)
    meta["wall_s"] = round(time.monotonic() - started, 1)
    written = write_reports(data, args.out, output_name(args.name, data["meta"]))
    try:
        print_table(data)
        for path in written:
            print(f"wrote {path}")
        sys.stdout.flush()  # a pipe buffers: its error here, not at exit
    except BrokenPipeError:  # the reader went away (`| head`): the reports are written
        return stops.reader_gone()
    return 1 if data["meta"]["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(stops.main(main, "bench_nvfp4_moe"))
