"""The bytecode beside an overlaid module: an unchecked-hash pyc is run without a look at its
source, so apply removes every pyc of a file it replaces, and verify finds stale ones."""

from __future__ import annotations

import importlib.util
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from vllm_patchset.deploy.target import ReadOnlyTarget
from vllm_patchset.infra import fsio
from vllm_patchset.infra.fsio import UnsafePath


def bytecode_files(source: Path) -> list[Path]:
    """`__pycache__/<module>.*.pyc` of a module, for every interpreter and optimization level."""
    cache = source.parent / "__pycache__"
    if not cache.is_dir() or cache.is_symlink():
        return []
    prefix = source.name.removesuffix(".py") + "."
    return sorted(p for p in cache.iterdir() if p.name.startswith(prefix) and p.suffix == ".pyc")


def remove_bytecode(source: Path, *, strict: bool = True) -> None:
    # Timestamp pycs would be rebuilt, but an unchecked-hash pyc (compileall --invalidation-mode
    # unchecked-hash, common in images) is run without looking at the source: remove them all.
    # Not `strict` (a revert, a rollback): one that cannot go is left, and the revert says so;
    # restoring the originals must not stop on it.
    for pyc in bytecode_files(source):
        try:
            fsio.remove_file(pyc)
        except fsio.WriteFailed:
            if strict:
                raise


FS_IOC_GETFLAGS = 0x80086601  # Linux: the inode flags of chattr(1)
FS_IMMUTABLE_FL, FS_APPEND_FL = 0x10, 0x20


def _cannot_remove(pyc: Path) -> str | None:
    """Why `pyc` cannot be removed (a folder in its place, `chattr +i` or `+a`), or None."""
    try:
        info = os.lstat(pyc)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(info.st_mode):
        return "it is a directory"
    if not stat.S_ISREG(info.st_mode):
        return None  # a link, a FIFO: unlink removes it
    import fcntl

    try:
        fd = os.open(pyc, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        flags = int.from_bytes(fcntl.ioctl(fd, FS_IOC_GETFLAGS, bytes(8))[:4], "little")
    except OSError:  # a file system without inode flags
        return None
    finally:
        os.close(fd)
    if flags & (FS_IMMUTABLE_FL | FS_APPEND_FL):
        return "it is immutable or append-only (chattr +i / +a)"
    return None


def check_bytecode_removable(sources: Iterable[Path]) -> None:
    """Every pyc that apply removes can go: checked before anything is changed, so that an
    apply never stops half-way on one (and then every command would meet it again)."""
    for source in sources:
        for pyc in bytecode_files(source):
            why = _cannot_remove(pyc)
            if why:
                raise ReadOnlyTarget(
                    f"cannot remove the stale bytecode {pyc} ({why}): remove it, then apply;"
                    " nothing was changed"
                )


def left_bytecode(sources: Iterable[Path]) -> list[str]:
    return [
        f"could not remove {pyc}: remove it by hand" for s in sources for pyc in bytecode_files(s)
    ]


def stale_bytecode(source: Path, data: bytes) -> list[Path]:
    """Unchecked-hash pycs that do not match `data`: Python would run them instead of it."""
    stale = []
    for pyc in bytecode_files(source):
        try:
            head = fsio.read_regular(pyc, limit=16) or b""
        except UnsafePath:
            stale.append(pyc)  # not a regular file where a pyc should be: not the patched code
            continue
        flags = int.from_bytes(head[4:8], "little")
        if flags & 0b01 and not flags & 0b10:  # hash-based, check_source off (PEP 552)
            current = head[:4] == importlib.util.MAGIC_NUMBER
            if not (current and head[8:16] == importlib.util.source_hash(data)):
                stale.append(pyc)
    return stale
