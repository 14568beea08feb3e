"""NVFP4 MoE, side by side: the pinned vLLM's emulation (pristine), the overlay's (patched pin),
the overlay's portable path forced, Marlin (W4A16, the pin's default NVFP4 MoE backend on
Hopper), BF16 TritonExperts, an upstream release's emulation, and the NVFP4 weight-read bound.

    python benchmarks/bench_nvfp4_moe.py --pristine DIR --overlay DIR [--upstream DIR ...]
    python benchmarks/bench_nvfp4_moe.py --replot benchmarks/results/nvfp4_moe_h200.json
    python benchmarks/bench_nvfp4_moe.py --merge A.json B.json   (runs of other --columns)

Each DIR holds a pure-Python (or installed-layout) ``vllm/`` package, with vLLM's compiled
extensions beside its Python files where the real ops are to run (a native-ops kit's ``.so``
files: ops ``native``), else the capture-safe stand-ins of tests/gpu/standins.py (ops
``standin``; Marlin has no stand-in, so its column is skipped, with the reason, in such a run).
Two vLLM trees cannot be one ``vllm`` package in one process, so every tree runs in its own
subprocess (this file with ``--worker``) and the parent merges their rows. The overlay's
portable path is a second subprocess on the overlay tree with VLLM_PATCHSET_NVFP4_PORTABLE=1
in its environment (a tree that does not read that switch has one path: the column says so).
The layer, its weights and the capture come from tests/gpu (moe_setup.py, cuda_graphs.py), the
reference from tests/gpu/nvfp4_reference.py: what the GPU tests check is what is timed here.

Method: each implementation's ``FusedMoEKernel.apply`` (the no-DP/EP prepare/finalize around
its experts, as a single-GPU FusedMoE layer calls it) for one MoE layer (E experts, top-k, BF16
input), same random NVFP4 weights and routing (seeded) in every tree; Marlin's weights are
repacked from the same NVFP4 tensors by 0.24.0's own oracle. Before each timed call the L2
cache is flushed (the weights of one layer would otherwise stay in the 60 MB L2 from the
previous call, which a real model's other layers prevent); median over --reps calls.
``graph_us``: replay of a captured CUDA graph, the GPU time alone. ``eager_us``: a plain call
after a device sync, so the host's launch overhead counts. ``experts_graph_us``: the experts'
own ``apply`` alone, replayed likewise. The bound is the bytes of the routed experts' packed
weights and block scales over the copy bandwidth measured in the same run (read + write bytes
of a 2 GiB device copy). Numerics: each column's output against the W4A4 reference (the
pristine emulation's arithmetic in plain torch: weights dequantized, NVFP4 quantize-dequantize
of both activations); W4A16 (Marlin) and BF16 skip the activation quantization, so they sit at
NVFP4's own activation error from it. Per-kernel breakdown: each kernel (memset, memcpy) of
one ``FusedMoEKernel.apply``, replayed alone from the call's own CUDA graph with the others
disabled, L2 flushed, median; ``floor_us`` is that graph with every launch disabled.

Output: tables on stdout; under --out a JSON of every row, a Markdown of the tables and a PNG
(``--name``: the headline name when every tree ran the real ops, with ``_standin`` appended
otherwise). Without matplotlib the PNG is skipped with a line; ``--replot`` makes it (and the
Markdown) from the JSON where matplotlib is.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GPU_TESTS = REPO / "tests" / "gpu"
DEFAULT_OUT = REPO / "benchmarks" / "results"
DEFAULT_NAME = "nvfp4_moe_h200"
BOUND = "NVFP4 weight-read bound"
BF16 = "BF16 TritonExperts"
PORTABLE_ENV = "VLLM_PATCHSET_NVFP4_PORTABLE"  # tests/gpu/moe_setup.py names it too
# What --columns picks from: the trees' implementations.
COLUMNS = ("pristine", "bf16", "marlin", "overlay", "portable", "upstream")
# Breakdowns shown in the Markdown (every one is in the JSON).
MARKDOWN_BREAKDOWN = ("portable", "marlin")  # kinds, besides the overlay's default column


@dataclasses.dataclass(frozen=True)
class Tree:
    role: str  # "pristine", "overlay", "portable" (the overlay tree, switch set) or "upstream"
    path: Path

    def impls(self, version: str, columns: tuple[str, ...]) -> dict[str, str]:
        """Implementation label -> kind of experts this tree runs, for the columns asked."""
        by_column = {
            "pristine": {
                "pristine": (f"{version} emulation (pristine)", "emulation"),
                "bf16": (f"{BF16} ({version})", "bf16"),
                "marlin": (f"Marlin W4A16 ({version})", "marlin"),
            },
            "overlay": {"overlay": (f"{version} emulation + patches (overlay)", "emulation")},
            "portable": {
                "portable": (f"{version} + patches, portable path forced", "portable"),
            },
            "upstream": {"upstream": (f"{version} emulation (upstream)", "emulation")},
        }[self.role]
        return {label: kind for column, (label, kind) in by_column.items() if column in columns}

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != PORTABLE_ENV}
        if self.role == "portable":
            env[PORTABLE_ENV] = "1"
        return env


# --------------------------------------------------------------------------- worker


class ColumnSkipped(Exception):
    """This tree cannot run this column (the reason goes into the results)."""


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
    if kind == "portable":
        if os.environ.get(PORTABLE_ENV) != "1":
            raise ColumnSkipped(f"{PORTABLE_ENV} is not set in this worker")
        if not moe_setup.has_portable_switch(vllm.package_dir):
            raise ColumnSkipped(
                f"this vLLM does not read {PORTABLE_ENV}: its default path (the overlay"
                " column) is its only one"
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


def worker(
    tree: Path,
    kinds: dict[str, str],
    tokens: list[int],
    shapes: list[str],
    reps: int,
    out: Path,
    measure_bandwidth: bool,
    breakdown_tokens: list[int],
) -> None:
    sys.path.insert(0, str(GPU_TESTS))
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
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "rows": [],
        "skipped": {},
        "failed": [],
        "breakdown": [],
    }

    def save() -> None:  # after every row: a crash later leaves what was measured
        out.write_text(json.dumps(result))

    if measure_bandwidth:
        result["bandwidth"] = _copy_bandwidth()
    for shape in (s for s in moe_setup.SHAPES if s.name in shapes):
        moe = moe_setup.make_moe(shape)
        references: dict[int, Any] = {}
        for label, kind in kinds.items():
            try:
                kernel = build_kernel(kind, moe, shape, max(tokens), vllm)
            except ColumnSkipped as exc:
                result["skipped"][label] = str(exc)
                print(f"[{label}] skipped: {exc}", flush=True)
                save()
                continue
            except Exception as exc:
                traceback.print_exc()
                result["failed"].append({"impl": label, "shape": shape.name, "error": repr(exc)})
                save()
                continue
            fallback = FallbackCounter(kernel.experts.experts)
            for t in tokens:
                try:
                    row = measure(kernel, moe, shape, t, reps, flush, fallback, references)
                except Exception as exc:
                    traceback.print_exc()
                    failure = {"impl": label, "shape": shape.name, "tokens": t, "error": repr(exc)}
                    result["failed"].append(failure)
                    save()
                    continue
                row.update(impl=label, kind=kind, ops=vllm.mode)
                result["rows"].append(row)
                print(
                    f"[{label}] {shape.name} tokens={t}: graph {row['graph_us']:.1f} us, eager"
                    f" {row['eager_us']:.1f} us, experts.apply {row['experts_graph_us']:.1f} us,"
                    f" vs W4A4 reference max {row['max_abs_err']:.2e} mean"
                    f" {row['mean_abs_err']:.2e} ({vllm.mode} ops)",
                    flush=True,
                )
                if t in breakdown_tokens:
                    try:
                        layer = moe_setup.MoeLayer(moe, shape, t, kernel.experts, seed=t)
                        parts = breakdown(moe_setup.KernelCall(kernel, layer), reps, flush)
                        del layer
                    except Exception as exc:  # an extra of the run: it must not end the run
                        traceback.print_exc()
                        parts = {"error": f"{type(exc).__name__}: {exc}"}
                    parts.update(shape=shape.name, tokens=t, impl=label, kind=kind, ops=vllm.mode)
                    result["breakdown"].append(parts)
                save()
                torch.cuda.empty_cache()
            del kernel
            torch.cuda.empty_cache()
        del moe, references
        torch.cuda.empty_cache()
    save()


def measure(
    kernel: Any,
    moe: Any,
    shape: Any,
    tokens: int,
    reps: int,
    flush: Any,
    fallback: FallbackCounter,
    references: dict[int, Any],
) -> dict[str, Any]:
    """One (column, shape, tokens) row: numerics, then timings."""
    import moe_setup
    from cuda_graphs import time_us
    from nvfp4_reference import nvfp4_moe_reference

    layer = moe_setup.MoeLayer(moe, shape, tokens, kernel.experts, seed=tokens)
    call = moe_setup.KernelCall(kernel, layer)
    before = fallback.calls
    output = call.run().float()
    unfused = fallback.calls > before
    if tokens not in references:
        # Exact W4A4 (unrounded weights, every activation rounding): the arithmetic of a
        # Blackwell NVFP4 GEMM, which the emulation exists to reproduce.
        references[tokens] = nvfp4_moe_reference(
            moe, layer.hidden, layer.topk_weights, layer.topk_ids, exact_weights=True
        ).float()
    numerics = errors(output, references[tokens])
    experts_out = layer.apply().float()
    numerics["experts_vs_kernel_max_abs"] = (experts_out - output).abs().max().item()
    row = dict(
        shape=shape.name,
        experts=shape.experts,
        hidden=shape.hidden,
        intermediate=shape.intermediate,
        top_k=shape.top_k,
        tokens=tokens,
        graph_us=time_us(call.run, reps, graph=True, flush=flush),
        eager_us=time_us(call.run, reps, graph=False, flush=flush),
        experts_graph_us=time_us(layer.run, reps, graph=True, flush=flush),
        active_experts=layer.topk_ids.unique().numel(),
        ran_unfused_fallback=unfused,
        **numerics,
    )
    return row


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


def _tree_version(tree: Path) -> str:
    ns: dict[str, object] = {}
    exec((tree / "vllm" / "_version.py").read_text(), ns)
    return str(ns.get("__version__") or ns.get("version"))


def _nvfp4_layer_bytes(hidden: int, intermediate: int) -> int:
    """One expert's packed E2M1 weights (1/2 byte each) and FP8 block scales (1/16 byte)."""
    return 3 * hidden * intermediate * 9 // 16


@dataclasses.dataclass(frozen=True)
class Options:
    tokens: list[int]
    shapes: list[str]
    reps: int
    columns: tuple[str, ...]
    breakdown_tokens: list[int]


def run_trees(
    trees: list[Tree],
    opts: Options,
    meta: dict[str, Any],
    after_each: Callable[[dict[str, Any]], None] = lambda data: None,
) -> dict[str, Any]:
    """Every tree's worker, one after the other; the merged results (rows, bounds, ``meta``
    with the trees'), given to ``after_each`` after every tree (a run cut short keeps them)."""
    rows: list[dict[str, Any]] = []
    meta.update(trees={}, skipped={}, failed=[], bandwidth_bytes_per_s=None)
    parts: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, tree in enumerate(trees):
            version = _tree_version(tree.path)
            kinds = tree.impls(version, opts.columns)
            if not kinds:
                continue
            out = Path(tmp) / f"{i}.json"
            cmd = [sys.executable, __file__, "--worker", str(tree.path)]
            cmd += ["--kinds", json.dumps(kinds), "--reps", str(opts.reps)]
            cmd += ["--tokens", *map(str, opts.tokens), "--shapes", *opts.shapes]
            cmd += ["--breakdown-tokens", *map(str, opts.breakdown_tokens)]
            cmd += ["--worker-out", str(out)]
            if meta["bandwidth_bytes_per_s"] is None:
                cmd.append("--bandwidth")
            print(f"== {tree.role}: vLLM {version} from {tree.path}", flush=True)
            done = subprocess.run(cmd, env=tree.env())
            if not out.is_file():
                meta["failed"].append({"tree": tree.role, "error": f"exit {done.returncode}"})
                continue
            result = json.loads(out.read_text())
            if done.returncode != 0:
                meta["failed"].append({"tree": tree.role, "error": f"exit {done.returncode}"})
            meta["trees"][tree.role] = {
                "path": str(tree.path),
                "vllm": result["vllm"],
                "ops": result["mode"],
                "impls": list(kinds),
                **({PORTABLE_ENV: result["portable_env"]} if tree.role == "portable" else {}),
            }
            meta["bandwidth_bytes_per_s"] = meta["bandwidth_bytes_per_s"] or result.get("bandwidth")
            for key in ("device", "torch", "triton"):
                meta.setdefault(key, result.get(key))
            meta["skipped"].update(result["skipped"])
            meta["failed"] += result["failed"]
            rows += result["rows"]
            parts += result["breakdown"]
            after_each({"meta": meta, "rows": rows + bound_rows(rows, meta), "breakdown": parts})
    return {"meta": meta, "rows": rows + bound_rows(rows, meta), "breakdown": parts}


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


def print_table(data: dict[str, Any]) -> None:
    rows = data["rows"]
    impls, tokens = _impls(rows), _tokens(rows)
    by = {(r["shape"], r["tokens"], r["impl"]): r for r in rows}
    overlay = next((i for i in impls if "overlay" in i), None)
    for shape in _shapes(rows):
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
                    cells.append(f"{r['graph_us']:8.1f} /{r['eager_us']:7.1f} ({frac:4.2f})")
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
                f"{r['max_abs_err']:9.2e} /{r['mean_abs_err']:9.2e}" if r else f"{'-':>20s}"
                for r in (by.get((shape, t, impl)) for t in tokens)
            ]
            print(f"  {impl:55s}" + "  ".join(cells))
    print("\n  tokens: " + ", ".join(map(str, tokens)))
    for label, why in data["meta"].get("skipped", {}).items():
        print(f"  {label}: skipped: {why}")
    for failure in data["meta"].get("failed", []):
        print(f"  FAILED: {failure}")
    for part in shown_breakdowns(data):
        print("\n" + "\n".join(breakdown_lines(part)))


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
    impls, tokens = _impls(rows), _tokens(rows)
    by = {(r["shape"], r["tokens"], r["impl"]): r for r in rows}
    lines = [f"# {title}", ""]
    bandwidth = meta.get("bandwidth_bytes_per_s") or 0.0
    lines.append(
        f"One run of `benchmarks/bench_nvfp4_moe.py --reps {meta.get('reps')}` on"
        f" {meta.get('device')} (torch {meta.get('torch')}, Triton {meta.get('triton')}),"
        f" {meta.get('date')}; copy bandwidth measured in the same run:"
        f" {bandwidth / 1e12:.2f} TB/s (the bound's denominator). Ops per tree:"
    )
    lines.append("")
    for role, tree in meta.get("trees", {}).items():
        env = f", {PORTABLE_ENV}={tree[PORTABLE_ENV]}" if PORTABLE_ENV in tree else ""
        lines.append(
            f"- {role}: vLLM {tree['vllm']}, ops `{tree['ops']}`{env}: {', '.join(tree['impls'])}"
        )
    for label, why in meta.get("skipped", {}).items():
        lines.append(f"- {label}: skipped: {why}")
    for failure in meta.get("failed", []):
        lines.append(f"- FAILED: {failure}")
    lines.append("")
    for shape in _shapes(rows):
        head = "| implementation | ops | " + " | ".join(f"{t} tok" for t in tokens) + " |"
        rule = "|---|---|" + "---:|" * len(tokens)
        lines += [f"### {shape}", ""]
        lines += ["FusedMoEKernel.apply: CUDA graph replay µs / eager µs (fraction of the bound)"]
        lines += ["", head, rule]
        for impl in impls:
            cells = []
            for t in tokens:
                r = by.get((shape, t, impl))
                if r is None:
                    cells.append("—")
                elif impl == BOUND:
                    cells.append(f"{r['graph_us']:.1f}")
                else:
                    frac = r.get("bound_fraction", float("nan"))
                    cells.append(f"{r['graph_us']:.1f} / {r['eager_us']:.0f} ({frac:.2f})")
            ops = next((r["ops"] for r in rows if r["impl"] == impl and "ops" in r), "—")
            lines.append(f"| {impl} | {ops} | " + " | ".join(cells) + " |")
        lines += ["", "The experts' own `apply` alone, CUDA graph replay µs:", "", head, rule]
        for impl in impls:
            if impl == BOUND:
                continue
            cells = [
                f"{by[shape, t, impl]['experts_graph_us']:.1f}" if (shape, t, impl) in by else "—"
                for t in tokens
            ]
            ops = next((r["ops"] for r in rows if r["impl"] == impl and "ops" in r), "—")
            lines.append(f"| {impl} | {ops} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "Against the W4A4 reference: max |Δ| / mean |Δ| (outputs of RMS about"
            f" {_rms(rows, shape):.2f}); † the unfused fallback ran:",
            "",
            head,
            rule,
        ]
        for impl in impls:
            if impl == BOUND:
                continue
            cells = []
            for t in tokens:
                r = by.get((shape, t, impl))
                if r is None:
                    cells.append("—")
                else:
                    mark = " †" if r.get("ran_unfused_fallback") else ""
                    cells.append(f"{r['max_abs_err']:.1e} / {r['mean_abs_err']:.1e}{mark}")
            ops = next((r["ops"] for r in rows if r["impl"] == impl and "ops" in r), "—")
            lines.append(f"| {impl} | {ops} | " + " | ".join(cells) + " |")
        lines.append("")
    shown = shown_breakdowns(data)
    if shown:
        lines += ["## Per-kernel breakdown", ""]
        lines += [str(meta.get("breakdown_method", "")), ""]
        for part in shown:
            lines += [*breakdown_lines(part, markdown=True), ""]
    if meta.get("method"):
        lines += ["## Method", "", meta["method"], ""]
    return "\n".join(lines)


def _rms(rows: list[dict[str, Any]], shape: str) -> float:
    values = [r["reference_rms"] for r in rows if r["shape"] == shape and "reference_rms" in r]
    return sum(values) / len(values) if values else float("nan")


def plot(data: dict[str, Any], path: Path, title: str) -> bool:
    """The PNG; False (and a line) where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        print(f"no matplotlib here: {path} not written (run --replot where it is)")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    shapes = _shapes(rows)
    fig, axes = plt.subplots(1, len(shapes), figsize=(6.5 * len(shapes), 5), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
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
        ax.set_ylabel("FusedMoEKernel.apply, CUDA graph replay, µs (L2 flushed)")
        ax.set_title(shape)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def title_of(meta: dict[str, Any]) -> str:
    return f"NVFP4 MoE on {meta.get('device', '?')} (E=128, top-8, BF16 input)"


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
    meta["trees"], meta["skipped"], meta["failed"] = {}, {}, []
    rows, breakdowns = [], []
    for part in parts:
        for role, tree in part["meta"]["trees"].items():
            meta["trees"][role if role not in meta["trees"] else f"{role}+"] = tree
        meta["skipped"].update(part["meta"].get("skipped", {}))
        meta["failed"] += part["meta"].get("failed", [])
        rows += [r for r in part["rows"] if r["impl"] != BOUND]
        breakdowns += part.get("breakdown", [])
    meta["merged_from"] = [p["meta"].get("date") for p in parts]
    return {"meta": meta, "rows": rows + bound_rows(rows, meta), "breakdown": breakdowns}


def output_name(name: str, meta: dict[str, Any]) -> str:
    """The headline name when every tree ran vLLM's real ops, else ``<name>_standin``."""
    ops = {tree["ops"] for tree in meta["trees"].values()}
    return name if ops == {"native"} else f"{name}_standin"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pristine", type=Path, help="tree of the pinned vLLM, unpatched")
    parser.add_argument("--overlay", type=Path, help="the same tree with patches/series applied")
    parser.add_argument(
        "--upstream",
        type=Path,
        action="append",
        default=[],
        help="a later vLLM release's tree (its own emulation), repeatable",
    )
    parser.add_argument(
        "--columns",
        nargs="+",
        choices=COLUMNS,
        default=list(COLUMNS),
        help="the implementations to run (default: all the trees given have)",
    )
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32, 128, 512])
    parser.add_argument(
        "--shapes", nargs="+", default=["qwen3-30b-a3b", "e128-h4096-i1536"], help="MoE shapes"
    )
    parser.add_argument(
        "--breakdown-tokens",
        type=int,
        nargs="*",
        help="token counts with a per-kernel breakdown (default: every one; none: no breakdown)",
    )
    parser.add_argument("--reps", type=int, default=25)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--name",
        default=DEFAULT_NAME,
        help="file name stem under --out (with _standin appended unless every tree had the"
        " real ops)",
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
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--bandwidth", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.breakdown_tokens is None:
        args.breakdown_tokens = list(args.tokens)
    if args.replot is None and args.worker is None and args.merge is None:
        needs_pristine = {"pristine", "bf16", "marlin"} & set(args.columns)
        needs_overlay = {"overlay", "portable"} & set(args.columns)
        if (needs_pristine and args.pristine is None) or (needs_overlay and args.overlay is None):
            parser.error(
                "--pristine and --overlay are required for the columns asked"
                " (--columns picks fewer)"
            )
    return args


def trees_of(args: argparse.Namespace) -> list[Tree]:
    trees = []
    if args.pristine is not None:
        trees.append(Tree("pristine", args.pristine.resolve()))
    if args.overlay is not None:
        trees += [Tree("overlay", args.overlay.resolve()), Tree("portable", args.overlay.resolve())]
    return trees + [Tree("upstream", p.resolve()) for p in args.upstream]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot is not None:
        for path in replot(args.replot):
            print(f"wrote {path}")
        return 0
    if args.merge is not None:
        data = merge([json.loads(p.read_text()) for p in args.merge])
        for path in write_reports(data, args.out, output_name(args.name, data["meta"])):
            print(f"wrote {path}")
        return 0
    if args.worker:
        worker(
            args.worker.resolve(),
            json.loads(args.kinds),
            args.tokens,
            args.shapes,
            args.reps,
            args.worker_out,
            args.bandwidth,
            args.breakdown_tokens,
        )
        return 0
    opts = Options(args.tokens, args.shapes, args.reps, tuple(args.columns), args.breakdown_tokens)
    doc = __doc__ or ""
    meta: dict[str, Any] = dict(
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        reps=args.reps,
        method=doc.split("Method: ")[1].split("\n\nOutput")[0],
        breakdown_method=(
            "Each launch of one `FusedMoEKernel.apply` replayed alone from the call's own"
            " CUDA graph (every other kernel, memset and memcpy node disabled), L2 flushed"
            " before each replay, median µs."
        ),
    )

    def save(data: dict[str, Any]) -> None:  # after every tree: a run cut short keeps them
        write_reports(data, args.out, output_name(args.name, data["meta"]), quiet=True)

    data = run_trees(trees_of(args), opts, meta, save)
    print_table(data)
    for path in write_reports(data, args.out, output_name(args.name, data["meta"])):
        print(f"wrote {path}")
    return 1 if data["meta"]["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
