"""The suite reads the committed tree (HEAD), never uncommitted edits: a rebase under review
(patches/, the lock and the pin rewritten, not committed yet) must not change what the tests
copy or expect."""

from __future__ import annotations

from pathlib import Path

from support import committed, export_committed, git


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
