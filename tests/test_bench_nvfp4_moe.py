"""The NVFP4 MoE benchmark's CPU side: its columns per tree, its arguments, the bound, the
output name, and the reports (table, Markdown, --replot) from results shaped like a run's."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support import REPO, STOPPED, to_closed_pipe

sys.path.insert(0, str(REPO / "benchmarks"))

import bench_nvfp4_moe as bench

IMPL_CASES = [
    (
        "pristine",
        bench.COLUMNS,
        {
            "0.24.0 emulation (pristine)": "emulation",
            "BF16 TritonExperts (0.24.0)": "bf16",
            "Marlin W4A16 (0.24.0)": "marlin",
        },
    ),
    ("pristine", ("marlin", "overlay"), {"Marlin W4A16 (0.24.0)": "marlin"}),
    ("overlay", bench.COLUMNS, {"0.24.0 emulation + patches (overlay)": "emulation"}),
    ("portable", bench.COLUMNS, {"0.24.0 + patches, portable path forced": "portable"}),
    ("portable", ("overlay",), {}),
    ("upstream", ("upstream",), {"0.24.0 emulation (upstream)": "emulation"}),
]


@pytest.mark.parametrize(("role", "columns", "impls"), IMPL_CASES)
def test_tree_impls(role: str, columns: tuple[str, ...], impls: dict[str, str]) -> None:
    assert bench.Tree(role, Path("/t")).impls("0.24.0", columns) == impls


def test_only_the_portable_worker_gets_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(bench.PORTABLE_ENV, "1")  # set in the parent: no other worker sees it
    envs = {role: bench.Tree(role, Path("/t")).env() for role in ("overlay", "portable")}
    assert (envs["overlay"].get(bench.PORTABLE_ENV), envs["portable"][bench.PORTABLE_ENV]) == (
        None,
        "1",
    )


ARGS_CASES = [
    (["--overlay", "o", "--columns", "overlay", "portable"], ["overlay", "portable"], [1, 8]),
    (["--overlay", "o", "--columns", "overlay", "--breakdown-tokens"], ["overlay"], []),
    (
        ["--pristine", "p", "--overlay", "o", "--breakdown-tokens", "8"],
        [c for c in bench.COLUMNS if c != "before"],  # no --before: no before column
        [8],
    ),
    (["--pristine", "p", "--overlay", "o", "--before", "b"], list(bench.COLUMNS), [1, 8]),
    (["--overlay", "o", "--columns", "overlay", "--cells", "required"], ["overlay"], []),
]


@pytest.mark.parametrize(("argv", "columns", "breakdown"), ARGS_CASES)
def test_arguments(argv: list[str], columns: list[str], breakdown: list[int]) -> None:
    args = bench.parse_args([*argv, "--tokens", "1", "8"])
    assert (args.columns, args.breakdown_tokens) == (columns, breakdown)


def test_default_breakdown_stops_at_its_largest_count() -> None:
    args = bench.parse_args(
        ["--overlay", "o", "--columns", "overlay", "--tokens", "1", "2048", "8192"]
    )
    assert (bench.BREAKDOWN_MAX, args.breakdown_tokens) == (2048, [1, 2048])


def test_arguments_need_the_trees_of_the_columns(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--overlay", "o"])  # the default columns need --pristine too
    assert exc.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith(
            "error: --pristine and --overlay are required for the columns asked"
            " (--columns picks fewer)"
        )
    )


SHAPE = {"shape": "qwen3-30b-a3b", "experts": 128, "hidden": 2048, "intermediate": 768}
OVERLAY = "0.24.0 emulation + patches (overlay)"
MARLIN = "Marlin W4A16 (0.24.0)"


COLUMN_OF = {OVERLAY: "overlay", MARLIN: "marlin"}


def _row(impl: str, tokens: int, graph_us: float, kind: str = "emulation") -> dict[str, Any]:
    return {
        **SHAPE,
        "column": COLUMN_OF.get(impl, impl),
        "top_k": 8,
        "tokens": tokens,
        "impl": impl,
        "kind": kind,
        "ops": "native",
        "graph_us": graph_us,
        "eager_us": 2 * graph_us,
        "experts_graph_us": graph_us - 1,
        "active_experts": 8 * tokens,
        "ran_unfused_fallback": False,
        "rel_err_vs_reference": 1e-3,
        "max_abs_err": 4.5e-3,
        "mean_abs_err": 5.4e-5,
        "reference_rms": 1.0,
        "experts_vs_kernel_max_abs": 0.0,
    }


def fake_run() -> dict[str, Any]:
    meta: dict[str, Any] = {
        "trees": {
            "pristine": {"path": "/p", "vllm": "0.24.0", "ops": "native", "impls": [MARLIN]},
            "overlay": {"path": "/o", "vllm": "0.24.0", "ops": "native", "impls": [OVERLAY]},
        },
        "skipped": {"0.24.0 + patches, portable path forced": "no switch"},
        "failed": [],
        # 4.5e12 B/s: the bound of 8 experts is 8 * 2654208 B / 4.5e12 B/s = 4.72 µs.
        "bandwidth_bytes_per_s": 4.5e12,
        "device": "NVIDIA H200",
        "reps": 25,
    }
    rows = [_row(OVERLAY, 1, 50.0), _row(OVERLAY, 8, 150.0), _row(MARLIN, 1, 40.0, "marlin")]
    launch = {"index": 0, "kind": "kernel", "name": "_gemm", "grid": [96, 1, 1]}
    parts = [
        {
            **{"shape": SHAPE["shape"], "tokens": 1, "impl": OVERLAY, "kind": "emulation"},
            **{"ops": "native", "whole_us": 50.0, "floor_us": 4.5, "note": ""},
            "launches": [{**launch, "block": [128, 1, 1], "us": 38.4}],
        },
        {"shape": SHAPE["shape"], "tokens": 8, "impl": MARLIN, "kind": "marlin", "ops": "native"}
        | {"error": "the CUDA driver has no cuGraphNodeSetEnabled"},
    ]
    return {"meta": meta, "rows": rows + bench.bound_rows(rows, meta), "breakdown": parts}


def test_bound_rows() -> None:
    data = fake_run()
    bounds = {r["tokens"]: r["graph_us"] for r in data["rows"] if r["impl"] == bench.BOUND}
    assert bounds == pytest.approx({1: 8 * 2654208 / 4.5e12 * 1e6, 8: 64 * 2654208 / 4.5e12 * 1e6})
    overlay = next(r for r in data["rows"] if r["impl"] == OVERLAY and r["tokens"] == 1)
    assert overlay["bound_fraction"] == pytest.approx(bounds[1] / 50.0)


def test_rank_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """An EP cell's ranks, each timed on the same tokens with its own experts local: the cell
    is the slowest rank's (a stand-in timer: 10 us a routed expert, the routing the layer holds
    when it is timed), the routing back as it was; a shape on one GPU has no ranks."""
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    import cuda_graphs
    import moe_setup
    import torch

    shape = moe_setup.MoeShape("ep", experts=8, hidden=64, intermediate=32, top_k=3,
                               local_experts=2)  # fmt: skip
    ids = torch.tensor([[1, 5, 0], [7, 6, 2]], dtype=torch.int32)
    layer = type("Layer", (), {"topk_ids": ids.clone()})()
    timed = lambda fn, reps, graph, flush: 10.0 * moe_setup.active_experts(shape, layer.topk_ids)  # noqa: E731
    monkeypatch.setattr(cuda_graphs, "time_us", timed)
    call = type("Call", (), {"run": None})()
    got = bench.rank_times(call, layer, shape, 5, None, rank0_us=20.0)
    assert got == {
        "graph_us": 20.0,
        "active_experts": 2,
        "rank": 0,
        "rank_graph_us": [20.0, 10.0, 10.0, 20.0],
        "rank_active_experts": [2, 1, 1, 2],
    }
    assert torch.equal(layer.topk_ids, ids)
    got = bench.rank_times(call, layer, shape, 5, None, rank0_us=3.0)
    assert (got["graph_us"], got["rank"], got["active_experts"]) == (20.0, 3, 2)
    whole = dataclasses.replace(shape, local_experts=0)
    assert bench.rank_times(call, layer, whole, 5, None, rank0_us=3.0) == {}
    row = dict(impl="x", shape="ep", tokens=2, reps=5, ops="native", **got)
    assert bench.row_line(row) == (
        "[x] ep tokens=2: graph 20.0 us (EP rank 3, the slowest: 3.0 / 10.0 / 10.0 / 20.0)"
        " (5 reps), no reference at this token count (native ops)"
    )


def test_output_name() -> None:
    meta = fake_run()["meta"]
    assert bench.output_name("nvfp4_moe_h200", meta) == "nvfp4_moe_h200"
    meta["trees"]["overlay"]["ops"] = "standin"
    assert bench.output_name("nvfp4_moe_h200", meta) == "nvfp4_moe_h200_standin"


# The GPU as torch names it -> the default name (it was nvfp4_moe_h200 on every GPU, so that a
# run on an H100 or an MI300 wrote over the H200's results).
DEVICE_NAMES = [
    ("NVIDIA H200", "nvfp4_moe_h200"),
    ("NVIDIA H100 80GB HBM3", "nvfp4_moe_h100_80gb_hbm3"),
    ("NVIDIA GH200 480GB", "nvfp4_moe_gh200_480gb"),
    ("AMD Instinct MI300X", "nvfp4_moe_instinct_mi300x"),
    ("AMD Radeon Graphics", "nvfp4_moe_radeon_graphics"),
    ("NVIDIA", "nvfp4_moe_nvidia"),
    ("", "nvfp4_moe_gpu"),
    (None, "nvfp4_moe_gpu"),
]


@pytest.mark.parametrize(("device", "name"), DEVICE_NAMES)
def test_default_name_is_the_gpus(device: str | None, name: str) -> None:
    """The bench's results (and launch_floor.py's, by the same results_names.by_gpu)."""
    from results_names import by_gpu

    meta = fake_run()["meta"] | {"device": device}
    assert bench.output_name(None, meta) == name
    assert bench.output_name("mine", meta) == "mine"
    assert bench.parse_args(["--replot", "run.json"]).name is None
    assert by_gpu("launch_floor", device) == name.replace("nvfp4_moe", "launch_floor")


def test_markdown() -> None:
    lines = bench.markdown(fake_run(), "T").splitlines()
    table = lines.index("| implementation | ops | 1 tok | 8 tok |")
    assert lines[table : table + 5] == [
        "| implementation | ops | 1 tok | 8 tok |",
        "|---|---|---:|---:|",
        f"| {OVERLAY} | native | 50.0 / 100 (0.09) | 150.0 / 300 (0.25) |",
        f"| {MARLIN} | native | 40.0 / 80 (0.12) | — |",
        f"| {bench.BOUND} | — | 4.7 | 37.7 |",
    ]
    assert f"| {OVERLAY} | native | 4.5e-03 / 5.4e-05 | 4.5e-03 / 5.4e-05 |" in lines
    assert "- 0.24.0 + patches, portable path forced: skipped: no switch" in lines
    assert "| 0 | kernel | `_gemm` | 96x1x1 | 128x1x1 | 38.4 |" in lines
    assert (
        f"{MARLIN}, qwen3-30b-a3b, 8 tokens (native ops): per-kernel breakdown not available:"
        " the CUDA driver has no cuGraphNodeSetEnabled"
    ) in lines


def test_table_prints(capsys: pytest.CaptureFixture[str]) -> None:
    bench.print_table(fake_run())
    out = capsys.readouterr().out.splitlines()
    assert f"  {MARLIN} / overlay: 0.80x" in out
    assert "  0.24.0 + patches, portable path forced: skipped: no switch" in out


def test_replot(tmp_path: Path) -> None:
    results = tmp_path / "nvfp4_moe_h200.json"
    results.write_text(json.dumps(fake_run()))
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_nvfp4_moe.py"), "--replot", results],
        capture_output=True,
        text=True,
    )
    md, png = tmp_path / "nvfp4_moe_h200.md", tmp_path / "nvfp4_moe_h200.png"
    if importlib.util.find_spec("matplotlib") is None:
        want = [f"no matplotlib here: {png} not written (run --replot where it is)", f"wrote {md}"]
    else:
        want = [f"wrote {md}", f"wrote {png}"]
    assert (done.returncode, done.stderr, done.stdout.splitlines()) == (0, "", want)
    data = fake_run()
    assert md.read_text() == bench.markdown(data, bench.title_of(data["meta"]))


def test_no_cell_ran_no_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run whose every tree failed (a worker that could not import vLLM) writes its report
    and no PNG: one line, not a ZeroDivisionError (seen on an H100 host without pyzmq)."""
    data = fake_run()
    data["rows"] = []
    png = tmp_path / "none.png"
    assert bench.plot(data, png, "t") is False
    assert capsys.readouterr().out == f"no cell ran: {png} not written\n"
    assert not png.exists()


def test_merge() -> None:
    first, second = fake_run(), fake_run()
    first["meta"]["date"], second["meta"]["date"] = "2026-12-05T14:26:07", "2026-12-05T14:37:11"
    second["rows"] = [_row(MARLIN, 8, 80.0, "marlin")]
    second["meta"]["trees"] = {"pristine": {**first["meta"]["trees"]["pristine"], "ops": "native"}}
    second["breakdown"] = []
    data = bench.merge([first, second])
    assert sorted(data["meta"]["trees"]) == ["overlay", "pristine", "pristine+"]
    cells = {(r["impl"], r["tokens"]): r["graph_us"] for r in data["rows"]}
    assert cells == {
        (OVERLAY, 1): 50.0,
        (OVERLAY, 8): 150.0,
        (MARLIN, 1): 40.0,
        (MARLIN, 8): 80.0,
        (bench.BOUND, 1): pytest.approx(8 * 2654208 / 4.5e12 * 1e6),
        (bench.BOUND, 8): pytest.approx(64 * 2654208 / 4.5e12 * 1e6),
    }
    assert len(data["breakdown"]) == 2
    assert data["meta"]["skipped_cells"] == []
    text = bench.markdown(data, "t")  # it said "One run", the first run's date and time
    assert "\n2 runs, merged, of `benchmarks/bench_nvfp4_moe.py --reps 25` on " in text
    when = "2026-12-05T14:26:07, 2026-12-05T14:37:11; copy bandwidth measured in the first: 4.50"
    assert when in text


def test_merge_refuses_a_cell_of_two_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cell (shape, tokens, column) in two of the runs: which one the report showed was the
    later's, silently; now one line, exit 2, nothing written."""
    first, second = fake_run(), fake_run()
    second["rows"] = [_row(MARLIN, 1, 41.0, "marlin")]
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, run in zip(paths, (first, second), strict=True):
        path.write_text(json.dumps(run))
    argv = ["--merge", *map(str, paths), "--out", str(tmp_path / "out")]
    assert bench.main(argv) == 2
    assert capsys.readouterr().err == (
        f"bench_nvfp4_moe: --merge: 1 cells are in more than one of the runs, the first {MARLIN}"
        " on qwen3-30b-a3b at 1 tokens: keep each cell in one run\n"
    )
    assert not (tmp_path / "out").exists()


def test_rocm_and_before_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(bench.PLATFORM_ENV, "rocm")  # set in the parent: only rocm's worker has it
    assert bench.Tree("rocm", Path("/t")).impls("0.24.0", bench.COLUMNS) == {
        "0.24.0 + patches, ROCm configuration forced (rocm)": "rocm"
    }
    assert bench.Tree("before", Path("/t")).impls("0.24.0", bench.COLUMNS) == {
        "0.24.0 emulation + patches (overlay before)": "emulation"
    }
    switches = {
        role: {k: v for k, v in bench.Tree(role, Path("/t")).env().items() if k in bench.SWITCHES}
        for role in ("pristine", "overlay", "portable", "rocm", "before")
    }
    assert switches == {
        "pristine": {},
        "overlay": {},
        "portable": {bench.PORTABLE_ENV: "1"},
        "rocm": {bench.PORTABLE_ENV: "1", bench.PLATFORM_ENV: "rocm"},
        "before": {},
    }


def test_trees_of_the_arguments() -> None:
    args = bench.parse_args(["--pristine", "/p", "--overlay", "/o", "--before", "/b"])
    trees = [(t.role, str(t.path)) for t in bench.trees_of(args)]
    assert trees == [
        ("pristine", "/p"),
        ("overlay", "/o"),
        ("portable", "/o"),
        ("rocm", "/o"),
        ("before", "/b"),
    ]


def test_before_needs_its_tree(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--overlay", "o", "--columns", "overlay", "before"])
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith("error: the before column needs --before DIR")
    )


needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="the shape table imports torch"
)

DETAILED = (1, 8, 32, 128, 512, 2048, 8192)


@needs_torch
def test_required_cells() -> None:
    """Every shape and shard at 1, 32 and 512 tokens; Qwen3-30B-A3B and Qwen3-235B-A22B whole
    and DeepSeek-R1 at TP8 at every count from 1 to 8192: per-shape lists, 159 cells."""
    args = bench.parse_args(["--overlay", "o", "--columns", "overlay", "--cells", "required"])
    cells = bench.plan_of(args).cells
    import moe_setup

    assert list(cells) == [s.name for s in moe_setup.SHAPES]
    detailed = {k: v for k, v in cells.items() if v != [1, 32, 512]}
    assert detailed == {
        "qwen3-30b-a3b": list(DETAILED),
        "qwen3-235b-a22b": list(DETAILED),
        "deepseek-r1-tp8": list(DETAILED),
    }
    assert (len(cells), sum(map(len, cells.values()))) == (49, 159)


SHAPE_ARGS = [
    (["qwen3-30b-a3b", "e128-h4096-i1536"], ["qwen3-30b-a3b", "qwen3-235b-a22b"]),
    (
        ["e128-h4096-i1536", "qwen3-30b-a3b", "qwen3-235b-a22b"],
        ["qwen3-30b-a3b", "qwen3-235b-a22b"],
    ),
    (["test"], ["qwen3-30b-a3b", "qwen3-235b-a22b"]),
    (["kimi-k2-ep8", "gemma-4-26b-a4b-tp4"], ["kimi-k2-ep8", "gemma-4-26b-a4b-tp4"]),
    # Layers named by their sizes (a checkpoint the table lacks): after the table's, as given.
    (
        ["e64-h3584-i1280-k6", "qwen3-30b-a3b", "e256-h7168-i2048-k8-ep8"],
        ["qwen3-30b-a3b", "e64-h3584-i1280-k6", "e256-h7168-i2048-k8-ep8"],
    ),
]


@needs_torch
@pytest.mark.parametrize(("names", "resolved"), SHAPE_ARGS)
def test_shapes_argument(names: list[str], resolved: list[str]) -> None:
    args = bench.parse_args(["--overlay", "o", "--columns", "overlay", "--shapes", *names])
    assert args.shapes == resolved
    assert bench.plan_of(args).cells == {name: [1, 8, 32, 128, 512] for name in resolved}


@needs_torch
def test_all_shapes_and_an_unknown_one(capsys: pytest.CaptureFixture[str]) -> None:
    args = bench.parse_args(["--overlay", "o", "--columns", "overlay", "--shapes", "all"])
    assert len(args.shapes) == 49
    with pytest.raises(SystemExit):
        bench.parse_args(["--overlay", "o", "--columns", "overlay", "--shapes", "nope"])
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.split(": error: ", 1)[1].startswith(
        "unknown shape 'nope' (known: all, required, test, qwen3-30b-a3b, qwen3-30b-a3b-tp2, "
    )


@needs_torch
def test_a_layer_sized_as_no_layer_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--overlay", "o", "--columns", "overlay", "--shapes", "e8-h100-i64-k2"])
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.split(": error: ", 1)[1] == (
        "e8-h100-i64-k2: hidden and intermediate sizes are multiples of 16 (NVFP4)"
    )


def test_the_plan_reaches_the_worker_whole() -> None:
    plan = bench.WorkerPlan(
        cells={"qwen3-30b-a3b": [1, 8], "kimi-k2-ep8": [512]},
        reps=10,
        min_reps=3,
        rep_budget_ms=80.0,
        timings=("graph",),
        reference_max_tokens=512,
        breakdown_tokens=(8,),
        deadline=1.8e9,
    )
    assert bench.plan_from_json(bench.plan_to_json(plan)) == plan


BUDGET_CASES = [
    (400.0, [2, 1, 1], 200.0),  # the pristine tree runs Marlin too
    (400.0, [1, 1], 200.0),
    (90.0, [1], 90.0),
    (-5.0, [1, 1], 0.0),  # spent: the next tree starts no shape
]


@pytest.mark.parametrize(("left", "columns", "share"), BUDGET_CASES)
def test_budget_share(left: float, columns: list[int], share: float) -> None:
    assert bench.budget_share(left, columns) == share


REPS_CASES = [(10.0, 25), (7500.0, 20), (50_000.0, 5), (1e9, 5)]


@pytest.mark.parametrize(("call_us", "reps"), REPS_CASES)
def test_reps_fit_the_call(call_us: float, reps: int) -> None:
    plan = bench.WorkerPlan(cells={}, reps=25, min_reps=5, rep_budget_ms=150.0)
    assert bench.reps_for(plan, call_us) == reps


@needs_torch
def test_bytes_needed() -> None:
    """Kimi-K2's whole layer: 384 experts of 3 * 7168 * 2048 weights, 9/16 byte each in NVFP4
    (a copy for the emulation's layout, Marlin's repacked copy), 2 bytes in BF16 (TritonExperts;
    0.24.0's per-call dequantization twice: eager and the graph's pool); plus 24 bytes per
    token, expert and row width."""
    import moe_setup

    shape = moe_setup.shape_named("kimi-k2")
    weights = 384 * 3 * 7168 * 2048
    act = 24 * 512 * 8 * 7168
    got = {
        (kind, fused): bench.bytes_needed(kind, shape, 512, fused)
        for kind, fused in [("emulation", True), ("emulation", False), ("marlin", True)]
    }
    assert got == {
        ("emulation", True): weights * 9 // 16 + act,
        ("emulation", False): weights * 9 // 16 + 4 * weights + act,
        ("marlin", True): weights * 9 // 16 + act,
    }
    assert bench.bytes_needed("bf16", shape, 512, True) == 2 * weights + act


PRISTINE, ROCM, BEFORE, UPSTREAM = (
    "0.24.0 emulation (pristine)",
    "0.24.0 + patches, ROCm configuration forced (rocm)",
    "0.24.0 emulation + patches (overlay before)",
    "0.25.0's NVFP4 emulation on 0.24.0 (upstream)",
)


def summary_run() -> dict[str, Any]:
    """A run with every column of the summary: at 1 token (bound 4.72 µs) every goal met, a
    later release's emulation (grafted) 7.5x the overlay; at 32 tokens (bound 151 µs) overlay
    above Marlin, under half the bound, rocm 1.3x."""
    meta = fake_run()["meta"]
    cols = {OVERLAY: "overlay", MARLIN: "marlin", PRISTINE: "pristine", ROCM: "rocm"}
    cols |= {BEFORE: "before", UPSTREAM: "upstream"}
    times = {
        1: {
            OVERLAY: 14.0,
            MARLIN: 40.0,
            PRISTINE: 700.0,
            ROCM: 17.0,
            BEFORE: 28.0,
            UPSTREAM: 105.0,
        },
        32: {OVERLAY: 400.0, MARLIN: 300.0, PRISTINE: 900.0, ROCM: 520.0},
    }
    rows = [
        {**_row(impl, tokens, us), "column": cols[impl]}
        for tokens, by_impl in times.items()
        for impl, us in by_impl.items()
    ]
    return {"meta": meta, "rows": rows + bench.bound_rows(rows, meta), "breakdown": []}


def test_summary_verdicts() -> None:
    cells = bench.summary(summary_run())
    bound = {1: 8 * 2654208 / 4.5e12 * 1e6, 32: 256 * 2654208 / 4.5e12 * 1e6}
    assert [(c["shape"], c["tokens"], c["required"]) for c in cells] == [
        ("qwen3-30b-a3b", 1, True),
        ("qwen3-30b-a3b", 32, True),
    ]
    one, many = cells
    assert one["us"] == {
        "pristine": 700.0,
        "marlin": 40.0,
        "overlay": 14.0,
        "rocm": 17.0,
        "before": 28.0,
        "upstream": 105.0,
        bench.BOUND: pytest.approx(bound[1]),
    }
    ratios = ("overlay_vs_marlin", "rocm_vs_overlay", "before_vs_overlay", "upstream_vs_overlay")
    assert [one[r] for r in ratios] == [pytest.approx(0.35), pytest.approx(17 / 14), 2.0, 7.5]
    assert one["bound_fraction"] == pytest.approx(bound[1] / 14)
    assert one["goals"] == {
        "marlin": True,
        "pristine": True,
        "decode": True,  # floor 4.7 µs < 6: 14 µs <= 15
        "bound": None,  # judged at 32 and 128 tokens
        "rocm": True,
    }
    assert one["passed"] is True
    assert many["goals"] == {
        "marlin": False,
        "pristine": True,
        "decode": None,
        "bound": False,  # 151 / 400 = 38% < 50%
        "rocm": False,  # 1.3x > 1.25x
    }
    assert (many["passed"], many["before_vs_overlay"], many["upstream_vs_overlay"]) == (
        False,
        None,
        None,
    )


DECODE_CASES = [(15.0, True), (15.1, False)]


@pytest.mark.parametrize(("overlay_us", "met"), DECODE_CASES)
def test_decode_goal(overlay_us: float, met: bool) -> None:
    data = summary_run()
    for r in data["rows"]:
        if r["impl"] == OVERLAY and r["tokens"] == 1:
            r["graph_us"] = overlay_us
    assert bench.summary(data)[0]["goals"]["decode"] is met


def test_decode_goal_needs_a_small_floor() -> None:
    """Where the weight-read floor is 6 µs or more, the 15 µs goal does not apply."""
    data = summary_run()
    data["meta"]["bandwidth_bytes_per_s"] = 3.0e12  # the floor becomes 7.08 µs
    data["rows"] = [r for r in data["rows"] if r["impl"] != bench.BOUND]
    data["rows"] += bench.bound_rows(data["rows"], data["meta"])
    assert bench.summary(data)[0]["goals"]["decode"] is None


def test_summary_markdown() -> None:
    lines = bench.summary_lines(bench.summary(summary_run()))
    assert lines == [
        "| shape | tokens | overlay µs | Marlin µs | overlay/Marlin | pristine µs |"
        " overlay/pristine | bound µs | % of bound | rocm/overlay | before/overlay |"
        " upstream/overlay | missed | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        "| qwen3-30b-a3b | 1 | 14.0 | 40.0 | 0.35 | 700.0 | 0.02 | 4.7 | 34 | 1.21 | 2.00 | 7.50 |"
        " — | pass |",
        "| qwen3-30b-a3b | 32 | 400.0 | 300.0 | 1.33 | 900.0 | 0.44 | 151.0 | 38 | 1.30 | — | — |"
        " marlin, bound, rocm | FAIL |",
        "",
        "1 of 2 required cells judged pass every applicable goal (2 required cells measured).",
    ]
    md = bench.markdown(summary_run(), "T").splitlines()
    assert md.index("## Summary") < md.index("### qwen3-30b-a3b")


def test_skipped_cells_are_shown() -> None:
    data = fake_run()
    data["meta"]["skipped_cells"] = [
        {"impl": MARLIN, "shape": "qwen3-30b-a3b", "tokens": [1, 8], "reason": "needs 9 GiB"}
    ]
    line = f"- {MARLIN}, qwen3-30b-a3b, tokens 1, 8: skipped: needs 9 GiB"
    assert line in bench.markdown(data, "T").splitlines()


def test_rows_without_eager_or_reference() -> None:
    """A sweep's rows (--timings graph, --reference-max-tokens): '—' and 'no reference'."""
    data = fake_run()
    for r in data["rows"]:
        for key in ("eager_us", "experts_graph_us", "max_abs_err", "mean_abs_err"):
            r.pop(key, None)
    lines = bench.markdown(data, "T").splitlines()
    assert f"| {OVERLAY} | native | 50.0 / — (0.09) | 150.0 / — (0.25) |" in lines
    assert f"| {OVERLAY} | native | no reference | no reference |" in lines
    assert "The experts' own `apply` alone, CUDA graph replay µs:" not in lines


def test_column_of_every_label() -> None:
    """Rows of results written before rows carried their column get it from their label."""
    labels = {
        label: column
        for role in ("pristine", "overlay", "portable", "rocm", "before", "upstream")
        for column, (label, _) in bench.Tree(role, Path("/t")).by_column("0.24.0").items()
    }
    assert len(labels) == len(bench.COLUMNS)
    assert {label: bench.column_of_label(label) for label in labels} == labels
    assert bench.column_of_label(bench.BOUND) is None


def test_summary_of_rows_without_columns() -> None:
    data = summary_run()
    for r in data["rows"]:
        r.pop("column", None)
    assert bench.summary(data) == bench.summary(summary_run())


def test_the_plan_in_the_markdown() -> None:
    data = fake_run()
    plan = bench.WorkerPlan(cells={}, reps=10, rep_budget_ms=60.0, timings=("graph",))
    data["meta"]["plan"] = dataclasses.asdict(plan) | {"reference_max_tokens": 32}
    assert (
        "Timings: graph; reps per timing at most 10, at least 5, about 60 ms of calls; the W4A4"
        " reference up to 32 tokens."
    ) in bench.markdown(data, "T").splitlines()


NOT_BEGUN_CASES = [
    (3, ["a", "b"], {"c": [1]}),  # ended in b: c runs in a new worker
    (0, ["a", "b"], {}),  # a clean exit leaves nothing
    (1, [], {}),  # ended before any shape: no progress to build on
    (3, ["a", "b", "c"], {}),  # ended in the last shape
]


@pytest.mark.parametrize(("code", "begun", "left"), NOT_BEGUN_CASES)
def test_not_begun(code: int, begun: list[str], left: dict[str, list[int]]) -> None:
    cells = {"a": [1, 32], "b": [1], "c": [1]}
    assert bench.not_begun(cells, begun, code) == left


def fake_worker(died_in: str | None) -> tuple[list[list[str]], Any]:
    """A run_worker that records each plan's shapes and measures each shape at its counts,
    ending (exit 3, as after a poisoned CUDA context) at the shape ``died_in`` once."""
    plans: list[list[str]] = []

    def run(
        tree: Any, kinds: dict[str, str], plan: Any, out: Path, bandwidth: Any
    ) -> tuple[int, dict[str, Any]]:
        plans.append(list(plan.cells))
        label = next(iter(kinds))
        result: dict[str, Any] = dict(
            vllm="0.24.0", mode="native", rows=[], skipped={}, failed=[], breakdown=[], started=[]
        )
        for shape, tokens in plan.cells.items():
            result["started"].append(shape)
            if shape == died_in and len(plans) == 1:
                result["failed"].append({"impl": label, "shape": shape, "tokens": 1, "error": "x"})
                return bench.CONTEXT_LOST, result
            result["rows"] += [{"impl": label, "shape": shape, "tokens": t} for t in tokens]
        return 0, result

    return plans, run


def test_a_worker_that_ends_early_is_followed_by_one_on_the_shapes_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vllm_tree(tmp_path)
    plans, run = fake_worker(died_in="deepseek-r1")
    monkeypatch.setattr(bench, "run_worker", run)
    cells = {"qwen3-30b-a3b": [1, 8192], "deepseek-r1": [1, 32, 512], "kimi-k2": [1], "glm-5": [1]}
    opts = bench.Options(bench.WorkerPlan(cells=cells, reps=5), ("pristine",))
    saved: list[int] = []
    data = bench.run_trees(
        [bench.Tree("pristine", tmp_path)], opts, {}, lambda d: saved.append(len(d["rows"]))
    )
    assert plans == [list(cells), ["kimi-k2", "glm-5"]]
    assert [(r["shape"], r["tokens"], r["column"]) for r in data["rows"]] == [
        ("qwen3-30b-a3b", 1, "pristine"),
        ("qwen3-30b-a3b", 8192, "pristine"),
        ("kimi-k2", 1, "pristine"),
        ("glm-5", 1, "pristine"),
    ]
    label = "0.24.0 emulation (pristine)"
    assert data["meta"]["failed"] == [
        {"tree": "pristine", "error": "exit 3", "shape": "deepseek-r1"},
        {"impl": label, "shape": "deepseek-r1", "tokens": 1, "error": "x"},
    ]
    assert saved == [2, 4]


def test_a_worker_that_runs_through_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vllm_tree(tmp_path)
    plans, run = fake_worker(died_in=None)
    monkeypatch.setattr(bench, "run_worker", run)
    opts = bench.Options(bench.WorkerPlan(cells={"kimi-k2": [1]}, reps=5), ("overlay",))
    data = bench.run_trees([bench.Tree("overlay", tmp_path)], opts, {})
    assert plans == [["kimi-k2"]]
    assert data["meta"]["failed"] == []


def vllm_tree(path: Path) -> Path:
    (path / "vllm").mkdir(parents=True)
    (path / "vllm" / "_version.py").write_text('__version__ = "0.24.0"\n')
    return path


@pytest.mark.parametrize(("signum", "code"), STOPPED)
def test_stopped_while_a_worker_runs(
    signum: int,
    code: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ctrl-C or kill (sent to this process) while the second tree's worker runs: the worker
    process killed, one line naming the first tree's saved results, exit 130 or 143, the
    handlers as they were."""
    pristine, overlay, out = vllm_tree(tmp_path / "p"), vllm_tree(tmp_path / "o"), tmp_path / "r"
    measured: dict[str, Any] = {"vllm": "0.24.0", "mode": "native", "skipped": {}, "failed": []}
    measured |= {"rows": [_row(MARLIN, 1, 40.0, "marlin")], "breakdown": []}
    measured["started"] = [SHAPE["shape"]]
    pidfile = tmp_path / "worker.pid"
    sleeper = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"

    def signal_once_begun() -> None:
        for _ in range(600):
            if pidfile.is_file() and pidfile.read_text():
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signum)

    def run(tree: Any, kinds: dict[str, str], plan: Any, out: Path, bandwidth: Any) -> Any:
        if tree.role == "pristine":
            return 0, measured
        threading.Thread(target=signal_once_begun).start()
        done = subprocess.run([sys.executable, "-c", sleeper, str(pidfile)])  # as run_worker
        raise AssertionError(f"the worker ran through: {done.returncode}")

    monkeypatch.setattr(bench, "run_worker", run)
    handlers = [signal.getsignal(s) for s, _ in STOPPED]
    argv = ["--pristine", str(pristine), "--overlay", str(overlay), "--columns", "marlin"]
    argv += ["overlay", "--shapes", "qwen3-30b-a3b", "--tokens", "1", "--out", str(out)]
    assert bench.main([*argv, "--name", "run"]) == code
    saved = f"{out / 'run.json'}, {out / 'run.md'}"
    assert (
        capsys.readouterr().err == f"bench_nvfp4_moe: interrupted: what ran before is in {saved}\n"
    )
    assert sorted(p.name for p in out.iterdir()) == ["run.json", "run.md"]
    assert {r["column"] for r in json.loads((out / "run.json").read_text())["rows"]} == {"marlin"}
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(int(pidfile.read_text()), 0)
    assert [signal.getsignal(s) for s, _ in STOPPED] == handlers


READER_GONE = [
    ("at the end", ""),  # the run measured: its reports, then the table into the closed pipe
    ("at the start", "bench_nvfp4_moe: the output's reader went away: nothing saved\n"),
]


@pytest.mark.parametrize(("when", "line"), READER_GONE, ids=[w for w, _ in READER_GONE])
def test_a_reader_gone_ends_the_printing_not_the_reports(
    when: str, line: str, tmp_path: Path
) -> None:
    """`| head -0` (a pipe buffers, as without PYTHONUNBUFFERED): no traceback, exit 141; at
    the end the reports written whole, at the start (the first tree's line) nothing, and no
    worker started."""
    fake = "bench.run_worker = None  # not reached\n"
    if when == "at the end":
        fake = (
            f"data = json.loads({json.dumps(fake_run())!r})\n"
            "bench.run_trees = lambda trees, opts, meta, save: data | {'meta': data['meta'] | meta}\n"
        )
    driver = (
        f"import json, sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r})\n"
        "import bench_nvfp4_moe as bench\n"
        f"{fake}raise SystemExit(bench.main(sys.argv[1:]))\n"
    )
    argv = ["--overlay", str(vllm_tree(tmp_path / "o")), "--columns", "overlay"]
    argv += ["--shapes", "qwen3-30b-a3b", "--out", str(tmp_path / "r"), "--name", "run"]
    assert to_closed_pipe([sys.executable, "-c", driver, *argv]) == (128 + signal.SIGPIPE, line)
    png = ["run.png"] if importlib.util.find_spec("matplotlib") else []
    reports = ["run.json", "run.md", *png] if when == "at the end" else []
    assert sorted(p.name for p in tmp_path.glob("r/*")) == reports
