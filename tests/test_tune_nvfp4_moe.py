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
