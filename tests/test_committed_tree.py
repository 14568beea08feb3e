"""The suite reads the committed tree (HEAD), never uncommitted edits: a rebase under review
(patches/, the lock and the pin rewritten, not committed yet) must not change what the tests
copy or expect."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import REPO, committed, export_committed, git


def test_committed_files_are_heads_not_the_working_trees(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "patches").mkdir(parents=True)
    (repo / "patches" / "series").write_text("0001-a.patch\n")
    (repo / "patches" / "0001-a.patch").write_text("committed\n")
    (repo / "pyproject.toml").write_text('pin = "1.0"\n')
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "committed")
    # What a rebase under review leaves: files changed, added and removed, none committed.
    (repo / "patches" / "series").write_text("0002-b.patch\n")
    (repo / "patches" / "0001-a.patch").unlink()
    (repo / "patches" / "0002-b.patch").write_text("uncommitted\n")
    (repo / "pyproject.toml").write_text('pin = "1.1"\n')

    out = tmp_path / "out"
    export_committed(["pyproject.toml", "patches", "CHANGELOG.md"], out, repo)
    files = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert files == {
        "pyproject.toml": 'pin = "1.0"\n',
        "patches/series": "0001-a.patch\n",
        "patches/0001-a.patch": "committed\n",
    }
    assert committed("pyproject.toml", repo) == b'pin = "1.0"\n'


def test_the_suite_runs_during_the_review_of_an_uncommitted_rebase(
    tmp_path: Path, cache_dir: Path
) -> None:
    """A checkout of this project with what `rebase --onto 0.25.0` leaves for review (the pin
    moved, the series emptied, the lock rewritten, none of it committed): tests that copy the
    project and expect its lock still pass there."""
    checkout = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", "--shared", str(REPO), str(checkout))
    pyproject = checkout / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('pin = "0.24.0"', 'pin = "0.25.0"'))
    for patch in (checkout / "patches").glob("*.patch"):
        patch.rename(checkout / "patches" / "upstreamed" / patch.name)
    (checkout / "patches" / "series").write_text("")
    (checkout / "overlay" / "overlay.lock.json").write_text('{"version": "0.25.0"}\n')
    assert git(checkout, "status", "--porcelain") != ""
    tests = [
        "tests/test_real_series.py::test_status_and_check_on_the_pin",
        "tests/test_deploy.py::test_apply_verify_reapply_revert_round_trip",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *tests,
         "--basetemp", str(tmp_path / "basetemp")],
        cwd=checkout,
        env={**os.environ, "VLLM_PATCHSET_TEST_CACHE": str(cache_dir)},
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert done.stdout.splitlines()[-1].startswith("2 passed in ")
