"""infra/fsio/writes.py as a unit: a whole-file write and the write points it shows, the
destinations the tool may claim (a table), the sweeps that remove only the tool's own leftovers,
and a staged dir put in place."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from vllm_patchset.infra.fsio.writes import (
    OWNER_MARKER,
    REPLACED,
    STAGING_PREFIX,
    TMP_SUFFIX,
    WRITTEN,
    NotOwned,
    atomic_write,
    claim_dir,
    is_temp_name,
    make_dirs,
    observed,
    replace_dir,
    staging_dir,
    sweep_staging,
    sweep_temp,
)


def test_atomic_write_shows_its_points_and_takes_the_mode_of_like(tmp_path: Path) -> None:
    like = tmp_path / "like"
    like.write_bytes(b"")
    like.chmod(0o600)
    seen: list[tuple[str, str]] = []
    with observed(lambda kind, path: seen.append((kind, path.name))):
        atomic_write(tmp_path / "new" / "f", b"data", like=like)
    assert seen == [(WRITTEN, "f"), (REPLACED, "f")]
    assert (tmp_path / "new" / "f").read_bytes() == b"data"
    assert stat.S_IMODE(os.stat(tmp_path / "new" / "f").st_mode) == 0o600
    assert os.listdir(tmp_path / "new") == ["f"]  # no temp file left


def test_make_dirs_makes_each_missing_folder_0755(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        make_dirs(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    modes = [stat.S_IMODE(os.stat(p).st_mode) for p in (tmp_path / "a", tmp_path / "a" / "b")]
    assert modes == [0o755, 0o755]


def missing(dest: Path) -> None:
    pass


def empty(dest: Path) -> None:
    dest.mkdir()


def marked(dest: Path) -> None:
    dest.mkdir()
    (dest / OWNER_MARKER).write_bytes(b"")
    (dest / "old-output").write_bytes(b"")


def users(dest: Path) -> None:
    dest.mkdir()
    (dest / "notes.txt").write_bytes(b"mine")


def a_link(dest: Path) -> None:
    dest.with_name("real").mkdir()
    dest.symlink_to("real")


def a_file(dest: Path) -> None:
    dest.write_bytes(b"")


def a_marker_dir(dest: Path) -> None:
    (dest / OWNER_MARKER).mkdir(parents=True)


# (what is at the destination, None when it may be claimed, else the refusal's words)
CLAIMS: list[tuple[Callable[[Path], None], str | None]] = [
    (missing, None),
    (empty, None),
    (marked, None),
    (
        users,
        f"the build folder {{dest}} is not empty and was not made by vllm-patchset (no"
        f" {OWNER_MARKER} in it): give a new or empty directory; nothing was written",
    ),
    (a_link, "the build folder {dest} is a symlink (to real): give a real dir"),
    (a_file, "the build folder {dest} is a regular file, not a directory"),
    (a_marker_dir, f"the build folder {{dest}}: {OWNER_MARKER} is not a regular file"),
]


@pytest.mark.parametrize(("make", "refusal"), CLAIMS)
def test_claim_dir(tmp_path: Path, make: Callable[[Path], None], refusal: str | None) -> None:
    dest = tmp_path / "out"
    make(dest)
    if refusal is None:
        claim_dir(dest, "the build folder")
        assert (dest / OWNER_MARKER).is_file()
    else:
        with pytest.raises(NotOwned) as error:
            claim_dir(dest, "the build folder")
        assert str(error.value) == refusal.format(dest=dest)


def test_claim_dir_without_mark_only_checks(tmp_path: Path) -> None:
    claim_dir(tmp_path / "out", "a folder", mark=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("name", "temp"),
    [
        (f".lock.json.abc{TMP_SUFFIX}", True),
        (f"lock.json.abc{TMP_SUFFIX}", False),  # not hidden: not the tool's name
        (".lock.json", False),
        (TMP_SUFFIX, True),
    ],
)
def test_is_temp_name(name: str, temp: bool) -> None:
    assert is_temp_name(name) == temp


def test_the_sweeps_remove_only_the_tools_leftovers(tmp_path: Path) -> None:
    root = tmp_path / "folder"  # beside the conftest's HOME
    root.mkdir()
    temp = f".f.x{TMP_SUFFIX}"
    (root / temp).write_bytes(b"")
    (root / f".d{TMP_SUFFIX}").mkdir()  # not a regular file: kept
    (root / "user.txt").write_bytes(b"")
    dead = f"{STAGING_PREFIX}999999999-x-abc"  # no such pid
    alive = f"{STAGING_PREFIX}{os.getpid()}-x-abc"
    for name in (dead, alive):
        (root / name).mkdir()
    sweep_temp([root, root / "none"])
    sweep_staging(root)
    assert sorted(os.listdir(root)) == sorted([f".d{TMP_SUFFIX}", "user.txt", alive])


def test_a_staged_dir_replaces_the_old_one(tmp_path: Path) -> None:
    root = tmp_path / "folder"  # beside the conftest's HOME
    final = root / "tree"
    final.mkdir(parents=True)
    (final / "old").write_bytes(b"")
    with staging_dir(root, "tree") as staged:
        assert staged.name.startswith(f"{STAGING_PREFIX}{os.getpid()}-tree-")
        (staged / "new").write_bytes(b"")
        replace_dir(staged, final)
    assert os.listdir(final) == ["new"]
    assert sorted(os.listdir(root)) == ["tree"]
