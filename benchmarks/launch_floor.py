"""What kernel launches cost in a CUDA graph on this GPU with no work in them, and what grid-wide
barriers cost inside one kernel: the floor under a fused MoE layer's time at 1 token, by
bench_nvfp4_moe.py's measure (the median µs of single graph replays between CUDA events, L2
flushed before each: the flush also keeps the GPU busy while the host submits the graph, whose
submission an idle GPU's timing would include, about 12.7 µs whatever the graph holds).

    python benchmarks/launch_floor.py [--out DIR] [--name NAME] [--reps N]

Rows (each a graph of its own, replayed ``--reps`` times):
- ``chain``: n = 1 ... 6 launches, one after the other in the stream, of a kernel whose one
  program stores one value; plain launches, and with programmatic dependent launch (``pdl``:
  each kernel lets the next one launch at once and waits for the one before it before it
  stores, as patch 0002's kernels do on sm_90).
- ``wide chain``: the same with one program per SM (the grid of a 1-token GEMM).
- ``barriers``: one kernel of one program per SM (all resident at once) whose programs meet at
  b = 0 ... 4 grid-wide barriers (an atomic count of arrivals per barrier, each program spinning
  until every one has arrived): what ordering the phases of a layer (quantize, w13, w2, top-k
  sum) inside one kernel would cost instead of launches.
- ``mma chain``: one kernel of one program (one warp) whose n tensor-core MMAs (m16n8k16, FP16
  operands, FP32 accumulator) each add to the one before: what one output's sum over K costs
  at 1 token in a GEMM that sums K in one order (a fused GEMM's K loop issues K / 16 of them,
  one after the other, whatever its tiles), so that the slope is one MMA's latency.

The fit per series: µs = intercept + slope * n, least squares; the slope is what one more
launch (or barrier) costs, the intercept what a graph of that series costs without it.

Output: the table on stdout; ``NAME.json`` (every row, the fits, the GPU) and ``NAME.md`` under
--out. Needs a CUDA GPU (sm_90 or later for ``pdl``) and triton; not vLLM.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import stops
from results_names import by_gpu

REPO = Path(__file__).resolve().parent.parent
CHAIN_LENGTHS = (1, 2, 3, 4, 5, 6)
BARRIER_COUNTS = (0, 1, 2, 3, 4)
MMA_CHAIN = (0, 128, 512, 1024, 2048, 4096)  # dependent MMAs (multiples of MMA_STEP // 16)
MMA_STEP = 128  # the depth of one dot of the chain: MMA_STEP // 16 dependent MMAs

try:
    import triton
    import triton.language as tl
except ImportError:  # the fit and the report need neither (tests/test_launch_floor.py)
    triton = tl = None


@dataclass(frozen=True)
class Row:
    series: str  # "chain", "chain, pdl", "wide chain", "wide chain, pdl", "barriers",
    # "mma chain"
    n: int  # launches, barriers, or MMAs
    grid: int
    us: float


@dataclass(frozen=True)
class Fit:
    series: str
    intercept_us: float
    slope_us: float


def fit(rows: list[Row]) -> list[Fit]:
    """Least-squares line µs = intercept + slope * n per series (rows' order of first sight)."""
    fits = []
    for series in dict.fromkeys(r.series for r in rows):
        points = [(r.n, r.us) for r in rows if r.series == series]
        mean_n = sum(n for n, _ in points) / len(points)
        mean_us = sum(us for _, us in points) / len(points)
        spread = sum((n - mean_n) ** 2 for n, _ in points)
        slope = sum((n - mean_n) * (us - mean_us) for n, us in points) / spread
        fits.append(Fit(series, mean_us - slope * mean_n, slope))
    return fits


def markdown(rows: list[Row], fits: list[Fit], meta: dict[str, object]) -> str:
    """The rows as one table (series by n), then the fits."""
    ns = sorted({r.n for r in rows})
    series = list(dict.fromkeys(r.series for r in rows))
    us = {(r.series, r.n): r.us for r in rows}
    grid = {r.series: r.grid for r in rows}
    lines = [
        f"# Launch floor on {meta['gpu']}",
        "",
        f"One run of `benchmarks/launch_floor.py --reps {meta['reps']}`, {meta['when']}"
        f" (torch {meta['torch']}, Triton {meta['triton']}): median µs of single CUDA graph"
        " replays between CUDA events, L2 flushed before each, as bench_nvfp4_moe.py times a"
        " layer.",
        "",
        "| series | programs | " + " | ".join(f"n={n}" for n in ns) + " |",
        "|---|---:|" + "---:|" * len(ns),
    ]
    for s in series:
        cells = [f"{us[s, n]:.2f}" if (s, n) in us else "—" for n in ns]
        lines.append(f"| {s} | {grid[s]} | " + " | ".join(cells) + " |")
    lines += ["", "| series | intercept µs | µs per launch, barrier or MMA |", "|---|---:|---:|"]
    lines += [f"| {f.series} | {f.intercept_us:.2f} | {f.slope_us:.4f} |" for f in fits]
    return "\n".join(lines) + "\n"


if triton is not None:

    @triton.jit
    def _store_one(x_ptr, PDL: tl.constexpr):
        """Each program stores 1 at its index; PDL: the next kernel may launch at once, and this
        one waits for the one before it before it stores."""
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        tl.store(x_ptr + tl.program_id(0), 1)

    @triton.jit
    def _barriers(x_ptr, count_ptr, epoch_ptr, BARRIERS: tl.constexpr):
        """The programs (all resident) meet BARRIERS times: each adds its arrival to count_ptr
        (an acq_rel atomic) and spins on volatile loads of it until every program's has
        arrived. The count only grows: this launch's targets start at epoch * BARRIERS *
        programs (epoch_ptr, read before the first arrival and raised by the last arrival at
        the last barrier, when every program has read it)."""
        n = tl.num_programs(0)
        if BARRIERS > 0:
            # Volatile loads, not atomic adds of 0: triton 3.6 drops those from the loop.
            epoch = tl.load(epoch_ptr, volatile=True)
            base = epoch * BARRIERS * n
            for b in tl.static_range(BARRIERS):
                target = base + (b + 1) * n
                arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel") + 1
                if b == BARRIERS - 1 and arrived == target:
                    tl.atomic_add(epoch_ptr, 1, sem="release")
                while arrived < target:
                    arrived = tl.load(count_ptr, volatile=True)
        tl.store(x_ptr + tl.program_id(0), 1)

    @triton.jit
    def _mma_chain(w_ptr, a_ptr, out_ptr, steps, BLOCK_K: tl.constexpr):
        """steps dots of [16, BLOCK_K] by [BLOCK_K, 8] (FP16) into one FP32 accumulator, each
        adding to the last (steps is a runtime count: no unrolling); the sum is stored."""
        w = tl.load(w_ptr + tl.arange(0, 16)[:, None] * BLOCK_K + tl.arange(0, BLOCK_K)[None, :])
        a = tl.load(a_ptr + tl.arange(0, BLOCK_K)[:, None] * 8 + tl.arange(0, 8)[None, :])
        acc = tl.zeros((16, 8), dtype=tl.float32)
        for _ in range(steps):
            acc = tl.dot(w, a, acc)
        tl.store(out_ptr + tl.arange(0, 16)[:, None] * 8 + tl.arange(0, 8)[None, :], acc)


def measure(reps: int) -> tuple[list[Row], dict[str, object]]:
    import torch

    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    from cuda_graphs import l2_flush_buffer, time_us

    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    pdl = torch.cuda.get_device_capability(0) >= (9, 0)
    x = torch.zeros(sms, dtype=torch.int32, device="cuda")
    count = torch.zeros(1, dtype=torch.int32, device="cuda")
    epoch = torch.zeros(1, dtype=torch.int32, device="cuda")
    # The L2 flush before each replay, as bench_nvfp4_moe.py times a layer: it also keeps the
    # GPU busy while the host submits the graph, which an idle GPU's timing would include.
    flush = l2_flush_buffer()
    rows = []
    for series, grid, with_pdl in (
        ("chain", 1, False),
        ("chain, pdl", 1, True),
        ("wide chain", sms, False),
        ("wide chain, pdl", sms, True),
    ):
        if with_pdl and not pdl:
            continue
        for n in CHAIN_LENGTHS:

            def chain(n: int = n, grid: int = grid, with_pdl: bool = with_pdl) -> None:
                for i in range(n):
                    launch = {"launch_pdl": True} if with_pdl and i > 0 else {}
                    _store_one[(grid,)](x, PDL=with_pdl, num_warps=1, **launch)

            rows.append(Row(series, n, grid, time_us(chain, reps, flush=flush)))
    for b in BARRIER_COUNTS:
        # The count's targets are a function of BARRIERS: from zero for each kernel.
        count.zero_()
        epoch.zero_()

        def one(b: int = b) -> None:
            _barriers[(sms,)](x, count, epoch, BARRIERS=b, num_warps=1)

        rows.append(Row("barriers", b, sms, time_us(one, reps, flush=flush)))
    w = torch.full((16, MMA_STEP), 2.0**-7, dtype=torch.float16, device="cuda")
    a = torch.full((MMA_STEP, 8), 2.0**-7, dtype=torch.float16, device="cuda")
    out = torch.empty(16, 8, dtype=torch.float32, device="cuda")
    for n in MMA_CHAIN:

        def dots(steps: int = n // (MMA_STEP // 16)) -> None:
            _mma_chain[(1,)](w, a, out, steps, BLOCK_K=MMA_STEP, num_warps=1)

        rows.append(Row("mma chain", n, 1, time_us(dots, reps, flush=flush)))
    meta = {
        "gpu": props.name,
        "sms": sms,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "reps": reps,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return rows, meta


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--name", help="file name stem under --out (default launch_floor_<GPU>)")
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args(argv)
    rows, meta = measure(args.reps)
    args.name = args.name or by_gpu("launch_floor", str(meta["gpu"]))
    fits = fit(rows)
    text = markdown(rows, fits, meta)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "rows": [asdict(r) for r in rows], "fits": [asdict(f) for f in fits]}
    (args.out / f"{args.name}.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(text)
    print(f"wrote {args.out / args.name}.json and .md")


if __name__ == "__main__":
    raise SystemExit(stops.main(main, "launch_floor"))
