"""How benchmarks/tune_nvfp4_moe.py stops early (Ctrl-C, kill, its reader gone): its compile
processes killed with it, the timings taken so far saved, one line, exit 130, 143 or 141. The
compile processes and the timings run on a GPU; here a compile process that only waits stands
for one that compiles, and a sweep that times nothing stands for one that times."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from support import REPO, STOPPED, kill_all, still_running

sys.path.insert(0, str(REPO / "benchmarks"))

import tune_nvfp4_moe as tune

# The tuner, but each compile process waits (and says its pid) where it would import vLLM;
# spawned processes run this file as their main module, so they wait too.
DRIVER = """
import multiprocessing, os, sys, time, types
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import tune_nvfp4_moe as tune

def waits(tree):
    if multiprocessing.parent_process() is None:  # the tuner itself: a module with a table
        return types.SimpleNamespace(table_json=str, GEMM_BLOCK_K=128)
    (tree / f"{os.getpid()}.pid").write_text("")
    time.sleep(60)

tune.load_kernel_module = waits
tune.torch.cuda.get_device_name = lambda: "CPU"
tune.free_gpu_bytes = lambda: 1 << 40
if __name__ == "__main__":
    raise SystemExit(tune.main(sys.argv[2:]))
"""
JOBS = 2


@pytest.mark.parametrize("group", [False, True], ids=["to-the-tuner", "to-its-group"])
@pytest.mark.parametrize(("signum", "code"), STOPPED)
def test_stopped_while_compiling(tmp_path: Path, signum: int, code: int, group: bool) -> None:
    """Ctrl-C (at the terminal: to the tuner and its compile processes) or kill (to the tuner)
    while the candidates compile: every compile process killed and reaped (a kill left them
    compiling on the GPU until done; Ctrl-C printed a traceback from each), one line, nothing
    saved."""
    tree, out = tmp_path / "tree", tmp_path / "out"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "__init__.py").write_text("")
    (tmp_path / "driver.py").write_text(DRIVER)
    argv = [sys.executable, str(tmp_path / "driver.py"), str(REPO / "benchmarks"), "--tree"]
    argv += [str(tree), "--shapes", "qwen3-30b-a3b", "--tokens", "1", "--jobs", str(JOBS)]
    tuner = subprocess.Popen(
        [*argv, "--out", str(out)], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    pids: list[int] = []
    try:
        for _ in range(1200):
            pids = [int(p.stem) for p in tree.glob("*.pid")]
            if len(pids) == JOBS or tuner.poll() is not None:
                break
            time.sleep(0.05)
        assert len(pids) == JOBS, tuner.communicate(timeout=30)[1]
        if group:
            os.killpg(tuner.pid, signum)
        else:
            tuner.send_signal(signum)
        _, err = tuner.communicate(timeout=60)
        assert (tuner.returncode, err) == (
            code,
            "tune_nvfp4_moe: interrupted: nothing saved (no table written)\n",
        )
        assert still_running(pids) == []
        assert not out.exists()
    finally:
        tuner.kill()
        kill_all(pids)


@pytest.mark.parametrize("predecode", [False, True], ids=["buckets", "predecode"])
@pytest.mark.parametrize(("signum", "code"), STOPPED)
def test_stopped_while_timing(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    signum: int,
    code: int,
    predecode: bool,
) -> None:
    """Ctrl-C or kill after some timings: they are saved where the whole sweep saves them
    (tune.json, with --predecode tune_predecode.json), marked as a sweep that did not end; no
    table is written; one line says where they are; the handlers are as they were."""
    taken = [{"shape": "qwen3-30b-a3b", "tokens": 1, "us": 12.5}, {"shape": "x", "us": 7.0}]

    def sweep(args: Any, rows: list[dict[str, Any]]) -> int:
        rows += taken
        os.kill(os.getpid(), signum)
        time.sleep(5)
        raise AssertionError("the sweep ran through")

    monkeypatch.setattr(tune, "sweep", sweep)
    monkeypatch.setattr(tune.torch.cuda, "get_device_name", lambda: "CPU")
    handlers = [signal.getsignal(s) for s, _ in STOPPED]
    argv = ["--tree", str(tmp_path), "--out", str(tmp_path / "out"), "--write-table", "t"]
    assert tune.main(argv + ["--predecode"] * predecode) == code
    saved = tmp_path / "out" / ("tune_predecode.json" if predecode else "tune.json")
    assert capsys.readouterr().err == (
        f"tune_nvfp4_moe: interrupted: 2 timings saved in {saved} (no table written)\n"
    )
    assert json.loads(saved.read_text()) == {
        "device": "CPU",
        "results": taken,
        "stopped": "interrupted before the end: no pick, no table",
    }
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [saved.name]
    assert [signal.getsignal(s) for s, _ in STOPPED] == handlers


def test_reader_gone_while_timing(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The output's reader gone (``| head``) mid-sweep: the timings so far saved, one line on
    stderr, exit 141."""

    def sweep(args: Any, rows: list[dict[str, Any]]) -> int:
        rows.append({"shape": "x", "us": 7.0})
        raise BrokenPipeError

    monkeypatch.setattr(tune, "sweep", sweep)
    monkeypatch.setattr(tune.torch.cuda, "get_device_name", lambda: "CPU")
    monkeypatch.setattr(tune.stops, "reader_gone", lambda: 141)  # stdout here is pytest's
    assert tune.main(["--tree", str(tmp_path), "--out", str(tmp_path)]) == 141
    assert capfd.readouterr().err == (
        "tune_nvfp4_moe: the output's reader went away: 1 timing saved in"
        f" {tmp_path / 'tune.json'} (no table written)\n"
    )
    assert json.loads((tmp_path / "tune.json").read_text())["results"] == [
        {"shape": "x", "us": 7.0}
    ]


GIB = 1 << 30


@pytest.fixture
def block_k(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel module's K step, as variant_key reads it (no vLLM tree here)."""
    monkeypatch.setattr(tune, "K", types.SimpleNamespace(GEMM_BLOCK_K=128), raising=False)


@pytest.mark.usefixtures("block_k")
def test_one_compile_per_variant_over_every_released_shape() -> None:
    """Over every shape of moe_setup.SHAPES at every swept count: one compile task for each
    variant_key, on the cheapest shape to build. The classes: w13 by top-k and expert
    parallelism (every hidden size is whole K steps), w2 by its depth's tail and expert
    parallelism."""
    tasks = tune.all_tasks(list(tune.moe_setup.SHAPES), tune.SWEPT)
    variants = tune.compile_variants(tasks)
    keys = [tune.variant_key(v) for v in variants]
    assert sorted(keys) == sorted({tune.variant_key(t) for t in tasks})
    assert {k[:4] for k in keys} == {
        ("w13", 0, 8, True),
        ("w13", 0, 10, True),
        ("w13", 0, 6, True),
        ("w13", 0, 1, True),
        ("w13", 0, 8, False),
        ("w13", 0, 10, False),
        ("w2", 0, 1, True),
        ("w2", 32, 1, True),
        ("w2", 48, 1, True),
        ("w2", 64, 1, True),
        ("w2", 80, 1, True),
        ("w2", 96, 1, True),
        ("w2", 0, 1, False),
    }
    cost = {v: tune.case_bytes(tune.shape_named(v[0]), [v[1]]) for v in tasks}
    for v in variants:
        assert cost[v] == min(cost[t] for t in tasks if tune.variant_key(t) == tune.variant_key(v))


@pytest.mark.usefixtures("block_k")
def test_variants_of_other_top_k_and_expert_parallelism_compile_on_their_own_shape() -> None:
    """Gemma-4 and Nemotron-3-Nano share w2's tail (I % 128 = 64), but w13's top-k is a
    constexpr (8 and 6); DeepSeek-R1's EP8 rank runs the naive candidates on aligned blocks.
    Each compiles on a shape of its own; where the kernels are the same (DeepSeek-R1 whole and
    Qwen3-30B), the compile builds Qwen3-30B's 0.7 GiB, not DeepSeek-R1's 12 GiB."""
    shapes = [tune.shape_named(n) for n in ("gemma-4-26b-a4b", "nemotron-3-nano-30b-a3b")]
    variants = tune.compile_variants(tune.all_tasks(shapes, [1]))
    assert {(v[0], v[2]) for v in variants} == {
        ("gemma-4-26b-a4b", "w13"),
        ("gemma-4-26b-a4b", "w2"),
        ("nemotron-3-nano-30b-a3b", "w13"),
    }
    shapes = [tune.shape_named(n) for n in ("deepseek-r1", "deepseek-r1-ep8", "qwen3-30b-a3b")]
    variants = tune.compile_variants(tune.all_tasks(shapes, [1]))
    assert {v[0] for v in variants} == {"qwen3-30b-a3b", "deepseek-r1-ep8"}
    assert {v[4] for v in variants if v[0] == "deepseek-r1-ep8"} == {True}  # naive


def test_compile_jobs_fit_the_free_memory() -> None:
    """Each process holds its cases and PROCESS_BYTES; at least one, at most --jobs."""
    assert tune.compile_jobs(14, 17 * GIB, 79 * GIB) == 4
    assert tune.compile_jobs(14, 1 * GIB, 79 * GIB) == 14
    assert tune.compile_jobs(14, 100 * GIB, 79 * GIB) == 1
    assert tune.case_bytes(tune.shape_named("kimi-k2"), [1]) == 19_159_789_632
    assert tune.case_bytes(tune.shape_named("qwen3-30b-a3b"), [1]) == 708_902_976


@pytest.mark.usefixtures("block_k")
def test_compile_processes_fit_the_gpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Kimi-K2 whole with --jobs 14 on 79 GiB free: four compile processes, each building the
    shape's 17.8 GiB (fourteen did before, and fourteen processes that each built every shape
    of a sweep ran an H100 out of memory), said in one line; every variant compiled by exactly
    one of them."""
    started: list[tuple] = []

    class Process:
        def __init__(self, target: Any, args: tuple) -> None:
            self.args = args
            self.pid: int | None = None
            self.exitcode: int | None = None

        def start(self) -> None:
            self.pid, self.exitcode = 1, 0
            started.append(self.args[1])

        def join(self) -> None:
            pass

    monkeypatch.setattr(tune.mp, "get_context", lambda _: types.SimpleNamespace(Process=Process))
    monkeypatch.setattr(tune, "free_gpu_bytes", lambda: 79 * GIB)
    variants = tune.compile_variants(tune.all_tasks([tune.shape_named("kimi-k2")], [1]))
    tune.compile_all(tmp_path, variants, 14)
    assert len(started) == 4
    assert sorted(t for share in started for t in share) == sorted(variants)
    assert capsys.readouterr().out == (
        "compile processes: 4 of 14, each holding up to 17.8 GiB of weights and buffers"
        " (79.0 GiB of the GPU free)\n"
    )


def test_three_stages_adds_a_twin_to_each_four_stage_tile_of_blocks_of_8(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--three-stages: each four-stage tile of blocks of 8 tokens (the --wide ones too, after
    widen) gets its three-stage twin, once; other blocks and tiles stay as they were."""
    for name in ("W13", "W2"):
        monkeypatch.setattr(tune, name, {bm: list(t) for bm, t in getattr(tune, name).items()})
    before = {
        name: {bm: list(t) for bm, t in getattr(tune, name).items()} for name in ("W13", "W2")
    }
    tune.widen()
    widened = {
        name: {bm: list(t) for bm, t in getattr(tune, name).items()} for name in ("W13", "W2")
    }
    tune.three_stages()
    for name in ("W13", "W2"):
        tiles = getattr(tune, name)
        assert {bm: t for bm, t in tiles.items() if bm != 8} == {
            bm: t for bm, t in widened[name].items() if bm != 8
        }
        four = [t for t in widened[name][8] if t[3] == 4]
        twins = [(n, k, w, 3) for n, k, w, _ in four]
        assert tiles[8] == list(dict.fromkeys(widened[name][8] + twins))
        assert len(tiles[8]) > len(before[name][8])
    assert (64, 128, 1, 3) in tune.W2[8] and (32, 128, 1, 3) in tune.W13[8]
    once = list(tune.W2[8])
    tune.three_stages()  # twice: nothing more
    assert tune.W2[8] == once
