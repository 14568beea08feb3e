"""The scripts the GPU bundle carries (gpurun.py, kitparts.py and the files beside them) run as
a GPU host runs them, without vllm-patchset (``python3 -E -S``: no site-packages): a closed
pipe ends them quietly with 141 (it was exit 120 and Python's "Exception ignored ...
BrokenPipeError"), Ctrl-C or kill in one line (it was a traceback, or nothing), and gpurun.py
stopped kills the pytest run it started with what that started (they ran on, on the GPU)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import STOPPED, child_starter, kill_all, started, still_running, to_closed_pipe
from vllm_patchset.gpu import gpurun, kitparts
from vllm_patchset.infra import archives, jsonfile
from vllm_patchset.infra.fsio import interrupts

SCRIPTS = ["gpurun.py", "kitparts.py"]
HOST = [sys.executable, "-E", "-S"]  # a GPU host's python: no vllm-patchset (no site-packages)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """The scripts as the bundle lays them out (bundle.py's _stage copies these files)."""
    root = tmp_path / "bundle"
    root.mkdir()
    for module in (gpurun, kitparts, archives, jsonfile, interrupts):
        source = Path(module.__file__ or "")
        shutil.copy2(source, root / source.name)
    return root


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("args", [["--help"], ["--bogus"]], ids=["help", "usage-error"])
def test_closed_pipe(bundle: Path, script: str, args: list[str]) -> None:
    """``SCRIPT --help | head -0`` (a pipe buffers: no PYTHONUNBUFFERED): 141, nothing on
    stderr; a usage error still says itself (stderr) with argparse's 2."""
    code, err = to_closed_pipe([*HOST, str(bundle / script), *args])
    if args == ["--help"]:
        assert (code, err) == (128 + signal.SIGPIPE, "")
    else:
        assert code == 2 and err.startswith("usage: ")


@pytest.mark.parametrize(("signum", "code"), STOPPED)
def test_gpurun_stopped_while_pytest_runs(bundle: Path, signum: int, code: int) -> None:
    """Ctrl-C or kill while a tree's pytest runs: that pytest and the process it started are
    killed, one line says where the logs are, exit 130 or 143."""
    (bundle / "trees" / "t").mkdir(parents=True)
    tree = {"name": "t", "path": "trees/t", "select": ["tests/gpu"], "expectations": []}
    (bundle / gpurun.MANIFEST).write_text(json.dumps({"trees": [tree]}))
    fake = child_starter(bundle)  # pytest's interpreter
    out = bundle / "results"
    command = [*HOST, str(bundle / "gpurun.py"), str(bundle), "--python", str(fake)]
    run = subprocess.Popen(
        [*command, "--out", str(out)], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    pids: list[int] = []
    try:
        pids = started(bundle)
        assert len(pids) == 2
        os.killpg(run.pid, signum)  # Ctrl-C at a terminal reaches the group
        _, err = run.communicate(timeout=30)
        assert (run.returncode, err) == (
            code,
            f"gpurun: interrupted: the logs and reports of the trees run so far are in {out}\n",
        )
        assert still_running(pids) == []
    finally:
        run.kill()
        kill_all(pids)
