"""The NVFP4 MoE benchmark's CPU side: its columns per tree, its arguments, the bound, the
output name, and the reports (table, Markdown, --replot) from results shaped like a run's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import REPO

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
    (["--pristine", "p", "--overlay", "o", "--breakdown-tokens", "8"], list(bench.COLUMNS), [8]),
]


@pytest.mark.parametrize(("argv", "columns", "breakdown"), ARGS_CASES)
def test_arguments(argv: list[str], columns: list[str], breakdown: list[int]) -> None:
    args = bench.parse_args([*argv, "--tokens", "1", "8"])
    assert (args.columns, args.breakdown_tokens) == (columns, breakdown)


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


def _row(impl: str, tokens: int, graph_us: float, kind: str = "emulation") -> dict[str, Any]:
    return {
        **SHAPE,
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


def test_output_name() -> None:
    meta = fake_run()["meta"]
    assert bench.output_name("nvfp4_moe_h200", meta) == "nvfp4_moe_h200"
    meta["trees"]["overlay"]["ops"] = "standin"
    assert bench.output_name("nvfp4_moe_h200", meta) == "nvfp4_moe_h200_standin"


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


def test_merge() -> None:
    first, second = fake_run(), fake_run()
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
