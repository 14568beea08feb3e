"""infra/fsio/children.py as a unit: the command line `child` makes runs the command with its
arguments as given (through setpriv where it is there), and `run_child` returns what it ran."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from vllm_patchset.infra.fsio.children import child, die_with_parent, process_alive, run_child

ARGVS = [
    ["printf", "%s|", "plain"],
    ["printf", "%s|", "two words", "$HOME", "-x", "'quoted'"],
    ["printf", "%s|", ""],
]


@pytest.mark.parametrize("argv", ARGVS)
def test_the_child_command_line_runs_the_arguments_as_given(argv: list[str]) -> None:
    command, preexec = child(argv)
    if shutil.which("setpriv") and sys.platform.startswith("linux"):
        assert command[:3] == [shutil.which("setpriv"), "--pdeathsig", "KILL"]
        assert command[-len(argv) :] == argv
        assert preexec is None
    done = subprocess.run(command, preexec_fn=preexec, capture_output=True, check=True)
    assert done.stdout.decode() == "".join(f"{a}|" for a in argv[2:])


def test_run_child_returns_the_completed_process() -> None:
    done = run_child([sys.executable, "-c", "import os; print(os.getppid())"], capture_output=True)
    assert (done.returncode, done.stdout.decode().split()[-1]) == (0, str(os.getpid()))
    assert run_child(["sh", "-c", "exit 3"]).returncode == 3


def test_die_with_parent_is_a_preexec_on_linux() -> None:
    preexec = die_with_parent()
    assert callable(preexec) == sys.platform.startswith("linux")


def test_process_alive() -> None:
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, check=True)
    assert process_alive(os.getpid()) is True
    assert process_alive(int(gone.stdout)) is False  # waited for: its pid names no process
