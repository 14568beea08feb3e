"""The suite's own pytest settings, run as the suite runs them: its temporary folders live in
memory (/dev/shm, tests/conftest.py), so a passing test's folder must go when it ends and a
passing session must leave nothing behind; a failing session keeps its failed tests' folders,
and only the last such session's."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from support import REPO

TESTS = """
def test_passes(tmp_path):
    (tmp_path / "passed").write_text("1")

def test_fails(tmp_path):
    (tmp_path / "failed").write_text("1")
    assert not FAIL
"""


def _session(project: Path, temproot: Path, *, fail: bool) -> list[str]:
    """One pytest session of two tests, the second failing if `fail`; the files left in the
    temporary root afterwards, below pytest's folder for the user."""
    (project / "test_it.py").write_text(f"FAIL = {fail}\n{TESTS}")
    env = {**os.environ, "PYTEST_DEBUG_TEMPROOT": str(temproot)}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
        cwd=project,
        env=env,
        capture_output=True,
        check=False,
    )
    (user,) = temproot.iterdir()
    return sorted(p.relative_to(user).as_posix() for p in user.rglob("*") if p.is_file())


def test_passing_sessions_leave_nothing_and_the_last_failing_one_its_failures(
    tmp_path: Path,
) -> None:
    settings = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))
    options = settings["tool"]["pytest"]["ini_options"]
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text(
        "[pytest]\n"
        f"tmp_path_retention_policy = {options['tmp_path_retention_policy']}\n"
        f"tmp_path_retention_count = {options['tmp_path_retention_count']}\n"
    )
    temproot = tmp_path / "temproot"
    temproot.mkdir()

    assert _session(project, temproot, fail=False) == []
    assert _session(project, temproot, fail=True) == ["pytest-0/test_fails0/failed"]
    assert _session(project, temproot, fail=True) == ["pytest-1/test_fails0/failed"]
    assert _session(project, temproot, fail=False) == ["pytest-1/test_fails0/failed"]
