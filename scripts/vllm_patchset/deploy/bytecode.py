"""The bytecode beside an overlaid module: an unchecked-hash pyc is run without a look at its
source, so apply removes every pyc of a file it replaces, and verify finds stale ones."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from vllm_patchset.deploy.guard import STALE, bytecode_files, stale_bytecode
from vllm_patchset.deploy.target import ReadOnlyTarget
from vllm_patchset.infra import fsio


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


def stale_notes(source: Path, data: bytes | None = None) -> list[str]:
    """What status and verify say of each stale unchecked-hash pyc of `source` (its bytes
    `data`, else read only where an unchecked-hash pyc is there)."""
    return [
        f"{STALE} {pyc}: Python runs it instead of the patched file (`vllm-patchset overlay"
        " apply` removes it)"
        for pyc in stale_bytecode(source, data)
    ]
