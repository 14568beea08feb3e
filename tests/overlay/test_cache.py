"""The cache touches only its own (overlay/cache.py, the mirror's locks in overlay/upstream.py):
each entry of a tmp copy of the story's cache replaced by a symlink out of it, a FIFO or a
read-only file, through `cache list`, `cache prune`, `status` and `fetch`; every run that reads
the cache holds its lock shared, a prune exclusive, an import one at a time. Each case checks
the snapshot (path, kind, mode, sha256) of everything it could touch before and after."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support import cli, git, snapshot
from synthetic import LocalIndex, Story, sdist_bytes
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.cache import human, inventory, size_of
from vllm_patchset.overlay.cachelocks import CACHE_LOCK, IMPORT_LOCK

# The user's own things a cache entry may point at.
Setup = Callable[[Path, Path], Path]  # (cache, elsewhere) -> the folder the case could touch


@pytest.fixture
def cache(story: Story, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    shutil.copytree(story.cache, path, symlinks=True)
    monkeypatch.setenv("VLLM_PATCHSET_CACHE", str(path))
    monkeypatch.setenv("VLLM_PATCHSET_LOCK_TIMEOUT", "0.5")
    return path


def user_repo(elsewhere: Path) -> Path:
    """A user's repository with an unreachable commit (what `git gc --prune=now` removes)."""
    repo = elsewhere / "user-repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a").write_text("kept\n")
    git(repo, "add", "a")
    git(repo, "commit", "-q", "-m", "one")
    (repo / "a").write_text("dangling\n")
    git(repo, "commit", "-q", "-am", "two")
    git(repo, "reset", "-q", "--hard", "HEAD~1")
    git(repo, "reflog", "expire", "--expire=now", "--all")
    return repo


def mirror_is_a_link(cache: Path, elsewhere: Path) -> Path:
    repo = user_repo(elsewhere)
    shutil.rmtree(cache / "mirror.git")
    (cache / "mirror.git").symlink_to(repo / ".git")
    return repo


def sdists_is_a_link(cache: Path, elsewhere: Path) -> Path:
    folder = elsewhere / "downloads"
    shutil.move(cache / "sdists", folder)
    (cache / "sdists").symlink_to(folder)
    return folder


def an_sdist_is_a_link(cache: Path, elsewhere: Path) -> Path:
    folder = elsewhere / "mine"
    folder.mkdir()
    (folder / "vllm-0.9.tar.gz").write_bytes(b"the user's own file")
    (cache / "sdists" / "vllm-0.9.tar.gz").unlink()
    (cache / "sdists" / "vllm-0.9.tar.gz").symlink_to(folder / "vllm-0.9.tar.gz")
    return folder


def an_sdist_is_a_fifo(cache: Path, elsewhere: Path) -> Path:
    (cache / "sdists" / "vllm-1.1.tar.gz").unlink()
    os.mkfifo(cache / "sdists" / "vllm-1.1.tar.gz")
    return elsewhere


def the_lock_is_a_link(cache: Path, elsewhere: Path) -> Path:
    (elsewhere / "target").write_text("not a lock\n")
    (cache / CACHE_LOCK).unlink(missing_ok=True)
    (cache / CACHE_LOCK).symlink_to(elsewhere / "target")
    return elsewhere


def the_lock_is_a_fifo(cache: Path, elsewhere: Path) -> Path:
    (cache / CACHE_LOCK).unlink(missing_ok=True)
    os.mkfifo(cache / CACHE_LOCK)
    return elsewhere


def the_import_lock_is_a_link(cache: Path, elsewhere: Path) -> Path:
    (elsewhere / "target").write_text("not a lock\n")
    (cache / IMPORT_LOCK).unlink(missing_ok=True)
    (cache / IMPORT_LOCK).symlink_to(elsewhere / "target")
    return elsewhere


def a_read_only_sdist(cache: Path, elsewhere: Path) -> Path:
    (cache / "sdists" / "vllm-1.2.tar.gz").chmod(0o444)
    return elsewhere


# (setup, command, expected exit, what stderr holds (a part of its one line), the cache may
# change (a prune's own removals and gc) or not)
R = "refusing "
CASES: list[tuple[Setup, tuple[str, ...], int, str, bool]] = [
    (mirror_is_a_link, ("cache", "prune"), 1, f"{R}{{cache}}/mirror.git: it is a symlink", False),
    (mirror_is_a_link, ("cache", "list"), 0, "", False),
    (mirror_is_a_link, ("status",), 1, f"{R}{{cache}}/mirror.git: it is a symlink", False),
    (mirror_is_a_link, ("fetch", "1.2"), 1, f"{R}{{cache}}/mirror.git: it is a symlink", False),
    (sdists_is_a_link, ("cache", "prune"), 0, "", True),
    (sdists_is_a_link, ("cache", "list"), 0, "", False),
    (sdists_is_a_link, ("fetch", "1.2"), 1, f"{R}{{cache}}/sdists: it is a symlink", False),
    (an_sdist_is_a_link, ("cache", "prune"), 0, "", True),
    (an_sdist_is_a_link, ("cache", "list"), 0, "", False),
    (an_sdist_is_a_fifo, ("cache", "prune"), 0, "", True),
    (an_sdist_is_a_fifo, ("cache", "list"), 0, "", False),
    (an_sdist_is_a_fifo, ("fetch", "1.1"), 0, "", False),
    (
        the_lock_is_a_link,
        ("cache", "prune"),
        1,
        f"{R}{{cache}}/{CACHE_LOCK}: it is a symlink",
        False,
    ),
    (
        the_lock_is_a_link,
        ("cache", "list"),
        1,
        f"{R}{{cache}}/{CACHE_LOCK}: it is a symlink",
        False,
    ),
    (the_lock_is_a_link, ("status",), 1, f"{R}{{cache}}/{CACHE_LOCK}: it is a symlink", False),
    (the_lock_is_a_fifo, ("cache", "prune"), 1, f"{R}{{cache}}/{CACHE_LOCK}: it is a FIFO", False),
    (the_lock_is_a_fifo, ("fetch", "1.1"), 1, f"{R}{{cache}}/{CACHE_LOCK}: it is a FIFO", False),
    (
        the_import_lock_is_a_link,
        ("fetch", "--git", "{upstream}", "--ref", "v1.2"),
        1,
        f"{R}{{cache}}/{IMPORT_LOCK}: it is a symlink",
        False,
    ),
    (a_read_only_sdist, ("cache", "list"), 0, "", False),
    (a_read_only_sdist, ("fetch", "1.2"), 0, "", False),
]


@pytest.mark.parametrize(
    ("setup", "command", "code", "error", "prunes"),
    CASES,
    ids=[f"{c[0].__name__}-{'-'.join(c[1][:2])}" for c in CASES],
)
def test_the_cache_touches_only_its_own(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    tiny: Project,
    story: Story,
    cache: Path,
    setup: Setup,
    command: tuple[str, ...],
    code: int,
    error: str,
    prunes: bool,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    theirs = setup(cache, elsewhere)
    before, before_cache = snapshot(theirs), snapshot(cache)
    args = [a.format(upstream=story.upstream.path) for a in command]
    got, _, err = cli(capsys, tiny.root, *args)
    assert got == code, err
    if error:
        assert err.count("\n") == 1 and error.format(cache=cache) in err, err
    else:
        assert "Traceback" not in err and "internal error" not in err
    assert snapshot(theirs) == before
    after = snapshot(cache)
    if not prunes:
        assert after == before_cache
    else:  # the prune removed regular files of its own, and repacked the mirror: nothing else
        gone = {p for p in before_cache if p not in after and not p.startswith("mirror.git")}
        for path in gone:
            assert before_cache[path][0] == "file" and path.startswith("sdists/vllm-"), path
        for path, entry in after.items():
            if not path.startswith("mirror.git"):
                assert before_cache.get(path) == entry, path


# -- locks between runs ---------------------------------------------------------------------------
HOLD = textwrap.dedent(
    """
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH if sys.argv[2] == "shared" else fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.read()
    """
)


@contextmanager
def held(path: Path, mode: str) -> Iterator[None]:
    """Another run holding `path`'s flock (`shared` or `exclusive`) until the block ends."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        yield
    finally:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        child.wait(timeout=10)
        child.stdout.close()


WAITED = "another vllm-patchset run (a fetch, build, matrix or cache prune) holds {path} (waited 0.5 s): nothing was changed"
LOCKS = [
    ("a prune waits for a reader", CACHE_LOCK, "shared", ("cache", "prune"), CACHE_LOCK),
    ("a reader waits for a prune", CACHE_LOCK, "exclusive", ("status",), CACHE_LOCK),
    ("a listing waits for a prune", CACHE_LOCK, "exclusive", ("cache", "list"), CACHE_LOCK),
    ("an import waits for a prune", CACHE_LOCK, "exclusive", ("fetch", "7.0"), CACHE_LOCK),
    (
        "an import waits for an import",
        IMPORT_LOCK,
        "exclusive",
        ("fetch", "--git", "{upstream}", "--ref", "v1.2"),
        IMPORT_LOCK,
    ),
]


@pytest.mark.parametrize(
    ("lock", "mode", "command", "named"), [c[1:] for c in LOCKS], ids=[c[0] for c in LOCKS]
)
def test_runs_wait_for_each_other_and_change_nothing(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tiny: Project,
    story: Story,
    cache: Path,
    lock: str,
    mode: str,
    command: tuple[str, ...],
    named: str,
) -> None:
    command = tuple(a.format(upstream=story.upstream.path) for a in command)
    with LocalIndex(tmp_path / "index") as index:
        index.publish("vllm-7.0.tar.gz", sdist_bytes("7.0", {"vllm/__init__.py": "x = 7\n"}))
        monkeypatch.setenv("PIP_INDEX_URL", index.url)
        (cache / lock).touch()
        before = snapshot(cache)
        with held(cache / lock, mode):
            code, out, err = cli(capsys, tiny.root, *command)
        assert (code, out) == (1, "")
        assert err == f"vllm-patchset: {WAITED.format(path=cache / named)}\n"
        assert snapshot(cache) == before
        # and once the other run is done, it runs
        code, out, err = cli(capsys, tiny.root, *command)
        assert code in (0, 1) and "waited" not in err, err


def test_a_reader_does_not_wait_for_an_import(
    capsys: pytest.CaptureFixture[str], tiny: Project, cache: Path
) -> None:
    with held(cache / IMPORT_LOCK, "exclusive"):
        code, _, err = cli(capsys, tiny.root, "cache", "list")
        assert (code, err) == (0, "")


PRUNE_DURING_FETCH = textwrap.dedent(
    """
    import subprocess, sys
    cli = [sys.executable, "-m", "vllm_patchset", "--project", sys.argv[1]]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
    fetch = subprocess.Popen([*cli, "fetch", sys.argv[2]], **quiet)
    prune = subprocess.Popen([*cli, "cache", "prune"], **quiet)
    for name, run in (("fetch", fetch), ("prune", prune)):
        _, err = run.communicate(timeout=120)
        print(name, run.returncode, err.strip().replace("\\n", " | "))
    """
)


def test_a_prune_during_a_fetch_leaves_both_whole(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny: Project, cache: Path
) -> None:
    """The issue's race (3 of 4 fetches failed with `git write-tree failed`): a fetch that
    imports and a prune started together both finish, and the release is in the mirror."""
    monkeypatch.setenv("VLLM_PATCHSET_LOCK_TIMEOUT", "60")
    with LocalIndex(tmp_path / "index") as index:
        files = {f"vllm/m{i}.py": f"x = {i}\n" for i in range(200)}
        index.publish("vllm-7.0.tar.gz", sdist_bytes("7.0", {"vllm/__init__.py": "", **files}))
        monkeypatch.setenv("PIP_INDEX_URL", index.url)
        done = subprocess.run(
            [sys.executable, "-c", PRUNE_DURING_FETCH, str(tiny.root), "7.0"],
            capture_output=True,
            text=True,
            timeout=240,
        )
    lines = done.stdout.splitlines()
    assert lines[0].startswith("fetch 0 "), done.stdout + done.stderr
    assert lines[1].startswith("prune 0 "), done.stdout + done.stderr
    tags = subprocess.run(
        ["git", "--git-dir", str(cache / "mirror.git"), "tag", "--list", "v7.0"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert tags.stdout == "v7.0\n"


HUMAN = [
    (0, "0 B"),
    (999, "999 B"),
    (1000, "1.0 kB"),
    (1_234_567, "1.2 MB"),
    (999_999_999, "1000.0 MB"),
    (5_000_000_000_000, "5000.0 GB"),
]


@pytest.mark.parametrize(("size", "text"), HUMAN)
def test_human(size: int, text: str) -> None:
    assert human(size) == text


def test_size_of_a_file_and_a_folder(tmp_path: Path) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "a").write_bytes(b"x" * 10)
    (tmp_path / "d" / "e" / "b").write_bytes(b"y" * 5)
    assert (size_of(tmp_path / "d" / "a"), size_of(tmp_path / "d")) == (10, 15)


def test_inventory_of_an_empty_cache(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    assert inventory(tmp_path / "cache", "0.24.0") == []
