"""The scripts the GPU bundle carries (gpurun.py, kitparts.py and the files beside them) run as
a GPU host runs them, without vllm-patchset (``python3 -E -S``: no site-packages): a closed
pipe ends them quietly with 141 (it was exit 120 and Python's "Exception ignored ...
BrokenPipeError"), Ctrl-C or kill in one line (it was a traceback, or nothing), and gpurun.py
stopped kills the pytest run it started with what that started (they ran on, on the GPU)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import STOPPED
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
    read, write = os.pipe()
    os.close(read)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        done = subprocess.run(
            [*HOST, str(bundle / script), *args], stdout=write, stderr=subprocess.PIPE, env=env
        )
    finally:
        os.close(write)
    if args == ["--help"]:
        assert (done.returncode, done.stderr.decode()) == (128 + signal.SIGPIPE, "")
    else:
        assert done.returncode == 2 and done.stderr.decode().startswith("usage: ")


def running(pid: int) -> bool:
    """Whether the process runs (a zombie, killed and not yet reaped by init, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(("signum", "code"), STOPPED)
def test_gpurun_stopped_while_pytest_runs(bundle: Path, signum: int, code: int) -> None:
    """Ctrl-C or kill while a tree's pytest runs: that pytest and the process it started are
    killed, one line says where the logs are, exit 130 or 143."""
    (bundle / "trees" / "t").mkdir(parents=True)
    tree = {"name": "t", "path": "trees/t", "select": ["tests/gpu"], "expectations": []}
    (bundle / gpurun.MANIFEST).write_text(json.dumps({"trees": [tree]}))
    pids = bundle / "pids"
    pids.mkdir()
    fake = bundle / "python"  # pytest's interpreter: starts a child, says both pids
    fake.write_text(
        f"#!/bin/sh\nsleep 60 &\necho $! > {pids}/child\necho $$ > {pids}/pytest\nwait\n"
    )
    fake.chmod(0o755)
    out = bundle / "results"
    command = [*HOST, str(bundle / "gpurun.py"), str(bundle), "--python", str(fake)]
    run = subprocess.Popen(
        [*command, "--out", str(out)], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    started: list[int] = []
    try:
        for _ in range(600):
            if len(list(pids.iterdir())) == 2:
                break
            time.sleep(0.05)
        started = [int(p.read_text()) for p in sorted(pids.iterdir())]
        assert len(started) == 2
        os.killpg(run.pid, signum)  # Ctrl-C at a terminal reaches the group
        _, err = run.communicate(timeout=30)
        assert (run.returncode, err) == (
            code,
            f"gpurun: interrupted: the logs and reports of the trees run so far are in {out}\n",
        )
        for _ in range(100):  # a SIGKILL takes a moment to land
            if not any(running(pid) for pid in started):
                break
            time.sleep(0.05)
        assert [pid for pid in started if running(pid)] == []
    finally:
        run.kill()
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
