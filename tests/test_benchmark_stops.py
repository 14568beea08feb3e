"""Every benchmark script stops as a command-line tool does: Ctrl-C or kill in one line on
stderr (exit 130 or 143), its reader gone (``| head``) quietly with exit 141, never a
traceback; what they run in processes of their own (the engine check's engines) is killed
with them."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import REPO, STOPPED, child_starter, kill_all, started, still_running, to_closed_pipe

sys.path.insert(0, str(REPO / "benchmarks"))

import stops
from engine_check import host
from engine_check.runs import Run

BENCHMARKS = REPO / "benchmarks"
# The scripts a user runs: each file of benchmarks/ with a __main__ block.
SCRIPTS = sorted(
    p.name for p in BENCHMARKS.glob("*.py") if 'if __name__ == "__main__":' in p.read_text()
)


def test_the_scripts_are_these() -> None:
    """A new script joins the tests below by being in benchmarks/ (this list is a pin)."""
    assert SCRIPTS == [
        "bench_guard.py",
        "bench_matrix.py",
        "bench_nvfp4_moe.py",
        "decode_layouts.py",
        "engine_e2e.py",
        "isa_facts.py",
        "keep_faster_tables.py",
        "launch_floor.py",
        "rocm_table_isa.py",
        "tune_nvfp4_moe.py",
        "upstream_graft.py",
        "w4a4_logprob_floor.py",
        "w4a4_roundings.py",
    ]


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_to_a_closed_pipe(script: str) -> None:
    """``SCRIPT --help | head -0`` as a user runs it (a pipe buffers: no PYTHONUNBUFFERED):
    exit 141 and nothing on stderr (it was Python's "Exception ignored ... BrokenPipeError"
    and exit 120, the error coming at exit, after every handler)."""
    argv = [sys.executable, str(BENCHMARKS / script), "--help"]
    assert to_closed_pipe(argv) == (128 + signal.SIGPIPE, "")


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_runs_through_stops(script: str) -> None:
    """The __main__ block of each script runs its main through stops.main, under the script's
    name (the behaviour is stops.main's, tested below; those with more to say, what the run
    kept, say it inside their main, each tested beside it)."""
    tree = ast.parse((BENCHMARKS / script).read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
    )
    calls = [
        ast.unparse(node)
        for node in ast.walk(block)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "stops.main"
    ]
    assert calls == [f"stops.main(main, '{script[:-3]}')"]


@pytest.mark.parametrize(("signum", "code"), STOPPED)
def test_stops_main_when_stopped(
    signum: int, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C or kill while the script runs: one line, exit 130 or 143, the handlers as they
    were."""
    handlers = [signal.getsignal(s) for s, _ in STOPPED]

    def run() -> int:
        print("begun")
        os.kill(os.getpid(), signum)
        time.sleep(5)
        raise AssertionError("ran through")

    assert stops.main(run, "isa_facts") == code
    assert capsys.readouterr() == ("begun\n", "isa_facts: interrupted\n")
    assert [signal.getsignal(s) for s, _ in STOPPED] == handlers


def test_stops_main_passes_on_what_main_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """The script's exit status is its main's (None: 0), argparse's exits included; its
    reader gone: 141."""
    assert stops.main(lambda: 3, "x") == 3
    assert stops.main(lambda: None, "x") == 0
    with pytest.raises(SystemExit) as exc:
        stops.main(lambda: sys.exit(2), "x")
    assert exc.value.code == 2

    def gone() -> int:
        raise BrokenPipeError

    monkeypatch.setattr(stops, "reader_gone", lambda: 141)  # stdout here is pytest's
    assert stops.main(gone, "x") == 141


@pytest.mark.parametrize(("signum", "code"), STOPPED)
def test_engine_check_stopped_kills_its_engines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int, code: int
) -> None:
    """Ctrl-C or kill while an engine runs (the check's parent waiting for its worker, in a
    session of its own, as vLLM's engine processes are; the signal raises where it waits, as
    engine_e2e.py's stops.main makes it): the worker and what it started are killed (they ran
    on, on the GPU, until done: the kill after the wait never came)."""
    fake = child_starter(tmp_path)  # the worker's interpreter
    (tmp_path / "results").mkdir()
    engine = host.Host(None, tmp_path / "models", tmp_path / "results", python=str(fake))

    def stopped_while_waiting(procs: list[subprocess.Popen[bytes]], begin: float) -> None:
        started(tmp_path)  # the worker and its child are up
        raise stops.Interrupted(signum)

    monkeypatch.setattr(host, "_wait_all", stopped_while_waiting)
    with pytest.raises(stops.Interrupted):
        host.run_engine(engine, Run("run", "model"), "overlay", [0])
    pids = started(tmp_path)
    try:
        assert len(pids) == 2 and still_running(pids) == []
    finally:
        kill_all(pids)
