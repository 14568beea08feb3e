"""Paths that came from data, and checked reads: a relative path read from data is used only
when it is plain (no absolute path, no `..`, `.` or empty parts, no backslash or NUL, inside the
expected top folder); no symlink is followed on the way to a file the tool reads inside a
target; only regular files are read, opened without blocking (a FIFO or device is refused,
never opened). Standard library only, and cheap to import: the start-up guard reads through
`read_regular`.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from vllm_patchset.errors import BadInput, Finding


class UnsafePath(Finding):
    """A path that would lead out of what the tool may touch, or a file that is not regular."""


class ReadFailed(BadInput):
    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(f"cannot read {path}: {exc.strerror or exc}")


def plain_parts(rel: str, top: str | None = None) -> tuple[str, ...] | None:
    """The parts of a plain relative POSIX path (under `top` when given, and not `top` alone),
    or None when it is absolute, has `..`, `.` or empty parts, a backslash or a NUL."""
    parts = tuple(rel.split("/"))
    if (
        not rel
        or rel.startswith("/")
        or "\\" in rel
        or "\x00" in rel
        or any(part in ("", ".", "..") for part in parts)
        or (top is not None and (parts[0] != top or len(parts) < 2))
    ):
        return None
    return parts


def kind_of(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "a special file"


def lstat_or_none(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # a component on the way is a file: nothing is there
        return None


def no_symlink_below(root: Path, parts: Iterable[str]) -> Path:
    """`root`/parts, refusing a symlink at any existing step below `root` (`root` itself and
    the dirs above it are the user's to choose)."""
    path = root
    for part in parts:
        path = path / part
        info = lstat_or_none(path)
        if info is None:
            break
        if stat.S_ISLNK(info.st_mode):
            raise UnsafePath(
                f"refusing {path}: it is a symlink (to {os.readlink(path)}); the tool does not"
                " follow symlinks inside what it reads or writes"
            )
    return root.joinpath(*parts)


def read_regular(path: Path, *, limit: int | None = None, follow: bool = False) -> bytes | None:
    """The bytes of a regular file (the first `limit` of them), or None when it is missing.

    A symlink, FIFO, device or dir is refused with UnsafePath before anything opens it; the
    open itself is O_NOFOLLOW | O_NONBLOCK, so a file swapped for a FIFO meanwhile cannot
    block either. With `follow`, a symlink whose target is a regular file is read through (an
    install made of links, as uv's `--link-mode symlink` makes: read-only use only)."""
    info = lstat_or_none(path)
    if info is not None and follow and stat.S_ISLNK(info.st_mode):
        info = stat_or_none(path)  # a dangling link: missing
    if info is None:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePath(f"refusing {path}: it is {kind_of(info.st_mode)}, not a regular file")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"refusing {path}: it is a symlink, not a regular file") from None
        raise ReadFailed(path, exc) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath(f"refusing {path}: it is not a regular file")
        return _read_up_to(fd, limit)
    except OSError as exc:
        raise ReadFailed(path, exc) from None
    finally:
        os.close(fd)


def _read_up_to(fd: int, limit: int | None) -> bytes:
    """The bytes of the open file `fd` from where it stands, the first `limit` of them (all
    with None), read a MiB at a time."""
    chunks = []
    left = limit
    while left is None or left > 0:
        chunk = os.read(fd, 1 << 20 if left is None else min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left = None if left is None else left - len(chunk)
    return b"".join(chunks)


def is_regular(path: Path) -> bool:
    """Whether `path` is a regular file itself (not a link to one)."""
    info = lstat_or_none(path)
    return info is not None and stat.S_ISREG(info.st_mode)


def read_chunks(
    path: Path, *, size: int | None = None, follow: bool = False, chunk: int = 1 << 20
) -> Iterator[bytes]:
    """The bytes of the regular file `path`, in chunks (a large file is never held whole),
    lstat-checked and opened without blocking. With `size`, a file of another size is
    refused before it is read (UnsafePath). With `follow`, a symlink whose target is a regular
    file is read through (an install made of links, as uv's `--link-mode symlink` makes:
    read-only use only). FileNotFoundError when it is missing."""
    info = os.lstat(path)
    if follow and stat.S_ISLNK(info.st_mode):
        info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePath(f"refusing {path}: it is {kind_of(info.st_mode)}, not a regular file")
    if size is not None and info.st_size != size:
        raise UnsafePath(f"{path} is {info.st_size} bytes, not the {size} expected")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"refusing {path}: it is a symlink, not a regular file") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath(f"refusing {path}: it is not a regular file")
        while data := os.read(fd, chunk):
            yield data
    finally:
        os.close(fd)


def same_path(a: Path, b: Path) -> bool:
    """Whether `a` and `b` are one file or folder (both there, same device and inode)."""
    one, two = stat_or_none(a), stat_or_none(b)
    return (
        one is not None
        and two is not None
        and (one.st_dev, one.st_ino)
        == (
            two.st_dev,
            two.st_ino,
        )
    )


def stat_or_none(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None
