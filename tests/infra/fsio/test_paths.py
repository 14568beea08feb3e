"""infra/fsio/paths.py as a unit: paths from data (plain or refused), what a mode is in words,
the checked reads (a regular file only, never through a link unless asked, bounded), and no
symlink on the way below a root."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from vllm_patchset.infra.fsio import plain_parts
from vllm_patchset.infra.fsio.paths import (
    UnsafePath,
    is_regular,
    kind_of,
    no_symlink_below,
    read_chunks,
    read_regular,
    same_path,
)

PATHS = [
    # (path from data, the top folder it must be under, its parts or None)
    ("vllm/a.py", "vllm", ("vllm", "a.py")),
    ("vllm/sub/a.py", None, ("vllm", "sub", "a.py")),
    ("a", None, ("a",)),
    ("vllm", "vllm", None),  # the package itself is no path in it
    ("torch/a.py", "vllm", None),
    ("", None, None),
    ("/vllm/a.py", None, None),
    ("vllm/", "vllm", None),
    ("vllm//a.py", None, None),
    ("vllm/./a.py", None, None),
    ("vllm/../a.py", None, None),
    ("vllm\\a.py", None, None),
    ("vllm/a\x00.py", None, None),
]


@pytest.mark.parametrize(("rel", "top", "parts"), PATHS)
def test_plain_parts(rel: str, top: str | None, parts: tuple[str, ...] | None) -> None:
    assert plain_parts(rel, top) == parts


KINDS = [
    (stat.S_IFREG, "a regular file"),
    (stat.S_IFDIR, "a directory"),
    (stat.S_IFLNK, "a symlink"),
    (stat.S_IFIFO, "a FIFO"),
    (stat.S_IFSOCK, "a socket"),
    (stat.S_IFCHR, "a character device"),
    (stat.S_IFBLK, "a block device"),
    (0, "a special file"),
]


@pytest.mark.parametrize(("mode", "name"), KINDS)
def test_kind_of(mode: int, name: str) -> None:
    assert kind_of(mode | 0o644) == name


def regular(path: Path) -> None:
    path.write_bytes(b"0123456789")


def link_to_regular(path: Path) -> None:
    regular(path.with_name("target"))
    path.symlink_to("target")


def dangling_link(path: Path) -> None:
    path.symlink_to("nowhere")


def fifo(path: Path) -> None:
    os.mkfifo(path)


def folder(path: Path) -> None:
    path.mkdir()


def missing(path: Path) -> None:
    pass


def under_a_file(path: Path) -> None:
    path.parent.rmdir()
    path.parent.write_bytes(b"")


# (what is at the path, read_regular(limit=4), the same with follow=True); a str: UnsafePath's
# words, with {path}
READS: list[tuple[Callable[[Path], None], bytes | str | None, bytes | str | None]] = [
    (regular, b"0123", b"0123"),
    (missing, None, None),
    (under_a_file, None, None),
    (link_to_regular, "refusing {path}: it is a symlink, not a regular file", b"0123"),
    (dangling_link, "refusing {path}: it is a symlink, not a regular file", None),
    (
        fifo,
        "refusing {path}: it is a FIFO, not a regular file",
        "refusing {path}: it is a FIFO, not a regular file",
    ),
    (
        folder,
        "refusing {path}: it is a directory, not a regular file",
        "refusing {path}: it is a directory, not a regular file",
    ),
]


@pytest.mark.parametrize(("make", "plain", "followed"), READS)
def test_read_regular(
    tmp_path: Path,
    make: Callable[[Path], None],
    plain: bytes | str | None,
    followed: bytes | str | None,
) -> None:
    path = tmp_path / "d" / "f"
    path.parent.mkdir()
    make(path)
    for follow, expected in ((False, plain), (True, followed)):
        if isinstance(expected, str):
            with pytest.raises(UnsafePath) as error:
                read_regular(path, limit=4, follow=follow)
            assert str(error.value) == expected.format(path=path)
        else:
            assert read_regular(path, limit=4, follow=follow) == expected


def test_read_regular_without_a_limit_and_read_chunks(tmp_path: Path) -> None:
    path = tmp_path / "big"
    data = bytes(range(256)) * 5_000  # more than one MiB chunk, less than two
    path.write_bytes(data)
    assert read_regular(path) == data
    assert b"".join(read_chunks(path, chunk=1000)) == data
    assert [len(c) for c in read_chunks(path, chunk=1 << 20)] == [1 << 20, len(data) - (1 << 20)]
    with pytest.raises(UnsafePath) as error:
        list(read_chunks(path, size=5))
    assert str(error.value) == f"{path} is {len(data)} bytes, not the 5 expected"
    with pytest.raises(FileNotFoundError):
        list(read_chunks(tmp_path / "none"))


def test_no_symlink_below_a_root(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "link").symlink_to("b")
    assert no_symlink_below(tmp_path, ("a", "b", "c")) == tmp_path / "a" / "b" / "c"
    assert no_symlink_below(tmp_path, ("x", "y")) == tmp_path / "x" / "y"
    with pytest.raises(UnsafePath) as error:
        no_symlink_below(tmp_path, ("a", "link", "c"))
    assert str(error.value) == (
        f"refusing {tmp_path / 'a' / 'link'}: it is a symlink (to b); the tool does not follow"
        " symlinks inside what it reads or writes"
    )
    linked_root = tmp_path / "root"
    linked_root.symlink_to("a")  # the root itself is the user's to choose
    assert no_symlink_below(linked_root, ("b",)) == linked_root / "b"


def test_is_regular_and_same_path(tmp_path: Path) -> None:
    link_to_regular(tmp_path / "link")
    assert (is_regular(tmp_path / "target"), is_regular(tmp_path / "link")) == (True, False)
    assert is_regular(tmp_path / "none") is False
    assert same_path(tmp_path / "link", tmp_path / "target")
    assert same_path(tmp_path, tmp_path / ".")
    assert not same_path(tmp_path / "target", tmp_path)
    assert not same_path(tmp_path / "none", tmp_path / "none")
