"""NVFP4 emulation MoE, side by side: pristine pin, overlay (patched pin), BF16 TritonExperts,
an upstream release's emulation, and the NVFP4 weight-read bound.

    python benchmarks/bench_nvfp4_moe.py --pristine DIR --overlay DIR [--upstream DIR ...]

Each DIR holds a pure-Python (or installed-layout) ``vllm/`` package. Two vLLM trees cannot
be one ``vllm`` package in one process, so every tree runs in its own subprocess (this file
with ``--worker``) and the parent merges their rows. Without vLLM's compiled extensions the
workers use the capture-safe stand-ins of tests/gpu/standins.py, for every tree alike.

Method: each implementation's ``experts.apply`` for one MoE layer (E experts, top-k, BF16
input), same random NVFP4 weights and routing (seeded) in every tree. Before each timed call
the L2 cache is flushed (the weights of one layer would otherwise stay in the 60 MB L2 from
the previous call, which a real model's other layers prevent); median over --reps calls.
``graph_us``: replay of a captured CUDA graph, the GPU time alone. ``eager_us``: a plain call
after a device sync, so the host's launch overhead counts. The bound is the bytes of the
routed experts' packed weights and block scales over the copy bandwidth measured in the same
run (read + write bytes of a 2 GiB device copy).

Output: a table on stdout, JSON rows (one per shape, tokens, implementation) and a PNG plot.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GPU_TESTS = REPO / "tests" / "gpu"
DEFAULT_OUT = REPO / "benchmarks" / "results"
BOUND = "NVFP4 weight-read bound"
BF16 = "BF16 TritonExperts"


@dataclasses.dataclass(frozen=True)
class Tree:
    role: str  # "pristine", "overlay" or "upstream"
    path: Path

    def impls(self, version: str) -> dict[str, str]:
        """Implementation label -> kind of experts this tree runs."""
        if self.role == "pristine":
            return {f"{version} emulation (pristine)": "emulation", f"{BF16} ({version})": "bf16"}
        if self.role == "overlay":
            return {f"{version} emulation + patches (overlay)": "emulation"}
        return {f"{version} emulation (upstream)": "emulation"}


# --------------------------------------------------------------------------- worker


def _import_vllm(tree: Path):
    sys.path.insert(0, str(GPU_TESTS))
    import standins

    sys.path.insert(0, str(tree))
    native = standins.has_compiled_extensions(tree / "vllm")
    if not native:
        standins.install()
    import vllm

    assert Path(vllm.__file__).is_relative_to(tree), vllm.__file__
    return vllm, "native" if native else "standin"


def _time_us(fn, reps: int, graph: bool, flush) -> float:
    import torch

    fn()  # compile, autotune, grow caches: outside the timing and the capture
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        fn = g.replay
    times = []
    for _ in range(reps):
        flush.zero_()
        if not graph:
            torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1000.0 for s, e in times)


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


def worker(
    tree: Path,
    kinds: dict[str, str],
    tokens: list[int],
    reps: int,
    out: Path,
    measure_bandwidth: bool,
) -> None:
    import torch

    vllm, mode = _import_vllm(tree)
    import nvfp4_moe_reference as ref
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FUSED_MOE_UNQUANTIZED_CONFIG,
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
        nvfp4_moe_quant_config,
    )
    from vllm.model_executor.layers.fused_moe.experts.nvfp4_emulation_moe import (
        Nvfp4QuantizationEmulationTritonExperts,
    )
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    result = {"vllm": vllm.__version__, "mode": mode, "rows": []}
    if measure_bandwidth:
        result["bandwidth"] = _copy_bandwidth()
    for shape in ref.SHAPES:
        moe = ref.make_moe(shape)
        moe_config = FusedMoEConfig(
            num_experts=shape.experts,
            experts_per_token=shape.top_k,
            hidden_dim=shape.hidden,
            intermediate_size=shape.intermediate,
            num_local_experts=shape.experts,
            num_logical_experts=shape.experts,
            moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
            activation=MoEActivation.SILU,
            in_dtype=torch.bfloat16,
            device="cuda",
            routing_method=RoutingMethodType.TopK,
            max_num_tokens=max(tokens),
        )
        for label, kind in kinds.items():
            if kind == "bf16":
                w1 = torch.stack(
                    [
                        ref.dequantize(moe.w13[e], moe.w13_scale[e], moe.w13_gscale[e]).to(
                            torch.bfloat16
                        )
                        for e in range(shape.experts)
                    ]
                )
                w2 = torch.stack(
                    [
                        ref.dequantize(moe.w2[e], moe.w2_scale[e], moe.w2_gscale[e]).to(
                            torch.bfloat16
                        )
                        for e in range(shape.experts)
                    ]
                )
                experts = TritonExperts(moe_config, FUSED_MOE_UNQUANTIZED_CONFIG)
            else:
                w1, w2 = moe.w13, moe.w2
                quant_config = nvfp4_moe_quant_config(
                    g1_alphas=moe.w13_gscale,
                    g2_alphas=moe.w2_gscale,
                    a1_gscale=moe.a13_gscale,
                    a2_gscale=moe.a2_gscale,
                    w1_scale=moe.w13_scale,
                    w2_scale=moe.w2_scale,
                )
                experts = Nvfp4QuantizationEmulationTritonExperts(moe_config, quant_config)
            for t in tokens:
                hidden, topk_weights, topk_ids = ref.make_routing(t, shape, seed=t)
                ws13, ws2, out_shape = experts.workspace_shapes(
                    t,
                    2 * shape.intermediate,
                    shape.hidden,
                    shape.top_k,
                    shape.experts,
                    shape.experts,
                    None,
                    MoEActivation.SILU,
                )
                ws13 = torch.empty(ws13, dtype=torch.bfloat16, device="cuda")
                ws2 = torch.empty(ws2, dtype=torch.bfloat16, device="cuda")
                output = torch.empty(out_shape, dtype=torch.bfloat16, device="cuda")

                call = functools.partial(
                    experts.apply,
                    output=output,
                    hidden_states=hidden,
                    w1=w1,
                    w2=w2,
                    topk_weights=topk_weights,
                    topk_ids=topk_ids,
                    activation=MoEActivation.SILU,
                    global_num_experts=shape.experts,
                    expert_map=None,
                    a1q_scale=None,
                    a2_scale=None,
                    workspace13=ws13,
                    workspace2=ws2,
                    expert_tokens_meta=None,
                    apply_router_weight_on_input=False,
                )
                call()
                want = ref.reference_moe(moe, hidden, topk_weights, topk_ids).float()
                rel_err = ((output.float() - want).norm() / want.norm()).item()
                eager = _time_us(call, reps, graph=False, flush=flush)
                graph = _time_us(call, reps, graph=True, flush=flush)
                active = topk_ids.unique().numel()
                result["rows"].append(
                    dict(
                        shape=shape.name,
                        experts=shape.experts,
                        hidden=shape.hidden,
                        intermediate=shape.intermediate,
                        top_k=shape.top_k,
                        tokens=t,
                        impl=label,
                        graph_us=graph,
                        eager_us=eager,
                        rel_err_vs_reference=rel_err,
                        active_experts=active,
                    )
                )
                print(
                    f"[{label}] {shape.name} tokens={t}: graph {graph:.1f} us, "
                    f"eager {eager:.1f} us, rel err {rel_err:.1e}",
                    flush=True,
                )
                torch.cuda.empty_cache()
    out.write_text(json.dumps(result))


# --------------------------------------------------------------------------- parent


def _tree_version(tree: Path) -> str:
    ns: dict[str, object] = {}
    exec((tree / "vllm" / "_version.py").read_text(), ns)
    return str(ns.get("__version__") or ns.get("version"))


def _nvfp4_layer_bytes(hidden: int, intermediate: int) -> int:
    """One expert's packed E2M1 weights (1/2 byte each) and FP8 block scales (1/16 byte)."""
    return 3 * hidden * intermediate * 9 // 16


def run_trees(trees: list[Tree], tokens: list[int], reps: int) -> tuple[list[dict], dict]:
    rows: list[dict] = []
    meta: dict = {"trees": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for i, tree in enumerate(trees):
            version = _tree_version(tree.path)
            kinds = tree.impls(version)
            out = Path(tmp) / f"{i}.json"
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                str(tree.path),
                "--kinds",
                json.dumps(kinds),
                "--tokens",
                *map(str, tokens),
                "--reps",
                str(reps),
                "--worker-out",
                str(out),
            ]
            if i == 0:
                cmd.append("--bandwidth")
            print(f"== {tree.role}: vLLM {version} from {tree.path}", flush=True)
            subprocess.run(cmd, check=True)
            result = json.loads(out.read_text())
            meta["trees"][tree.role] = {
                "path": str(tree.path),
                "vllm": result["vllm"],
                "ops": result["mode"],
                "impls": list(kinds),
            }
            meta.setdefault("bandwidth_bytes_per_s", result.get("bandwidth"))
            rows += result["rows"]
    bandwidth = meta["bandwidth_bytes_per_s"]
    bounds = {}
    for r in rows:
        nbytes = r["active_experts"] * _nvfp4_layer_bytes(r["hidden"], r["intermediate"])
        bound_us = nbytes / bandwidth * 1e6
        r["bound_us"] = bound_us
        r["bound_fraction"] = bound_us / r["graph_us"]
        bounds[r["shape"], r["tokens"]] = {
            k: r[k]
            for k in (
                "shape",
                "experts",
                "hidden",
                "intermediate",
                "top_k",
                "tokens",
                "active_experts",
            )
        }
        bounds[r["shape"], r["tokens"]].update(
            impl=BOUND,
            graph_us=bound_us,
            eager_us=bound_us,
            bound_us=bound_us,
            bound_fraction=1.0,
            weight_bytes=nbytes,
        )
    return rows + list(bounds.values()), meta


def print_table(rows: list[dict]) -> None:
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    by = {(r["shape"], r["tokens"], r["impl"]): r for r in rows}
    overlay = next((i for i in impls if "overlay" in i), None)
    for shape in dict.fromkeys(r["shape"] for r in rows):
        print(f"\n{shape}: graph replay / eager, microseconds (fraction of the bound)")
        for impl in impls:
            cells = []
            for t in sorted({r["tokens"] for r in rows}):
                r = by.get((shape, t, impl))
                if r is None:
                    cells.append(f"{'-':>24s}")
                elif impl == BOUND:
                    cells.append(f"{r['graph_us']:>24.1f}")
                else:
                    cells.append(
                        f"{r['graph_us']:8.1f} /{r['eager_us']:7.1f} ({r['bound_fraction']:4.2f})"
                    )
            print(f"  {impl:45s}" + "".join(cells))
        if overlay:
            for impl in impls:
                if impl in (overlay, BOUND):
                    continue
                ratios = [
                    by[shape, t, impl]["graph_us"] / by[shape, t, overlay]["graph_us"]
                    for t in sorted({r["tokens"] for r in rows})
                    if (shape, t, impl) in by and (shape, t, overlay) in by
                ]
                print(f"  overlay speed-up over {impl}: " + ", ".join(f"{x:.1f}x" for x in ratios))
    print("\n  tokens: " + ", ".join(str(t) for t in sorted({r["tokens"] for r in rows})))


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(6.5 * len(shapes), 5), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        for impl in dict.fromkeys(r["impl"] for r in rows):
            pts = sorted(
                (r["tokens"], r["graph_us"])
                for r in rows
                if r["shape"] == shape and r["impl"] == impl
            )
            style = "k--" if impl == BOUND else "o-"
            ax.plot(*zip(*pts, strict=True), style, label=impl)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("CUDA graph replay, µs (L2 flushed)")
        ax.set_title(shape)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pristine", type=Path, help="tree of the pinned vLLM, unpatched")
    parser.add_argument("--overlay", type=Path, help="the same tree with patches/series applied")
    parser.add_argument(
        "--upstream",
        type=Path,
        action="append",
        default=[],
        help="a later vLLM release's tree (its own emulation), repeatable",
    )
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32, 128, 512])
    parser.add_argument("--reps", type=int, default=25)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--name", default="nvfp4_moe", help="file name stem under --out")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--kinds", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--bandwidth", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        worker(
            args.worker.resolve(),
            json.loads(args.kinds),
            args.tokens,
            args.reps,
            args.worker_out,
            args.bandwidth,
        )
        return 0
    if args.pristine is None or args.overlay is None:
        parser.error("--pristine and --overlay are required")
    trees = [Tree("pristine", args.pristine.resolve()), Tree("overlay", args.overlay.resolve())]
    trees += [Tree("upstream", p.resolve()) for p in args.upstream]
    rows, meta = run_trees(trees, args.tokens, args.reps)

    import torch
    import triton

    meta.update(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        reps=args.reps,
        method=__doc__.split("Method: ")[1].split("\n\nOutput")[0],
    )
    print_table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / f"{args.name}.json"
    json_path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    png_path = args.out / f"{args.name}.png"
    plot(rows, png_path, f"NVFP4 emulation MoE on {meta['device']} (E=128, top-8, BF16 input)")
    print(f"\nwrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
