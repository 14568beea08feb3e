"""NVFP4 emulation MoE, side by side: pristine pin, overlay (patched pin), BF16 TritonExperts,
an upstream release's emulation, and the NVFP4 weight-read bound.

    python benchmarks/bench_nvfp4_moe.py --pristine DIR --overlay DIR [--upstream DIR ...]

Each DIR holds a pure-Python (or installed-layout) ``vllm/`` package. Two vLLM trees cannot
be one ``vllm`` package in one process, so every tree runs in its own subprocess (this file
with ``--worker``) and the parent merges their rows. Without vLLM's compiled extensions the
workers use the capture-safe stand-ins of tests/gpu/standins.py, for every tree alike. The layer,
its weights and the capture come from tests/gpu (moe_setup.py, cuda_graphs.py), the reference
from tests/gpu/nvfp4_reference.py: what the GPU tests check is what is timed here.

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
import json
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


def worker(
    tree: Path,
    kinds: dict[str, str],
    tokens: list[int],
    reps: int,
    out: Path,
    measure_bandwidth: bool,
) -> None:
    sys.path.insert(0, str(GPU_TESTS))
    import moe_setup
    import torch
    from cuda_graphs import l2_flush_buffer, time_us
    from nvfp4_reference import nvfp4_moe_reference

    vllm = moe_setup.import_vllm(tree)
    flush = l2_flush_buffer()
    result = {"vllm": vllm.module.__version__, "mode": vllm.mode, "rows": []}
    if measure_bandwidth:
        result["bandwidth"] = _copy_bandwidth()
    for shape in moe_setup.SHAPES:
        moe = moe_setup.make_moe(shape)
        for label, kind in kinds.items():
            if kind == "bf16":
                experts = moe_setup.bf16_triton_experts(moe, shape, max(tokens))
            else:
                experts = moe_setup.nvfp4_emulation_experts(moe, shape, max(tokens))
            for t in tokens:
                layer = moe_setup.MoeLayer(moe, shape, t, experts, seed=t)
                output = layer.apply().float()
                want = nvfp4_moe_reference(moe, layer.hidden, layer.topk_weights, layer.topk_ids)
                rel_err = ((output - want.float()).norm() / want.float().norm()).item()
                eager = time_us(layer.run, reps, graph=False, flush=flush)
                graph = time_us(layer.run, reps, graph=True, flush=flush)
                active = layer.topk_ids.unique().numel()
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
                del layer
                torch.cuda.empty_cache()
    out.write_text(json.dumps(result))


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
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
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
