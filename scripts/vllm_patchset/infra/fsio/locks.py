"""Locks: one writer at a time. A writer holds flock(2) on a lock file (`locked`) or on the
checkout's directory itself (`locked_dir`, no file made), waiting at most
`VLLM_PATCHSET_LOCK_TIMEOUT` seconds. Standard library only.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from vllm_patchset.errors import BadInput, Finding
from vllm_patchset.infra.fsio.paths import ReadFailed, UnsafePath, kind_of, lstat_or_none
from vllm_patchset.infra.fsio.writes import WriteFailed, make_dirs

LOCK_TIMEOUT_ENV = "VLLM_PATCHSET_LOCK_TIMEOUT"  # seconds to wait for another run (default 60)


# -- locks ---------------------------------------------------------------------------------------
def lock_timeout() -> float:
    raw = os.environ.get(LOCK_TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return 60.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise BadInput(f"{LOCK_TIMEOUT_ENV}={raw!r}: expected a number of seconds, e.g. 60")
    return value


@contextmanager
def locked(
    path: Path, *, shared: bool = False, holder: str = "another vllm-patchset run"
) -> Iterator[None]:
    """Hold flock(2) on the file `path` (created with its dir), waiting at most
    `lock_timeout()`. A shared lock on a missing file holds nothing (there is nothing to guard).

    The file may be removed by the holder (a revert removes the state dir): a run that then
    gets the lock on the removed file sees that it is no longer at `path`, and takes it again."""
    timeout = lock_timeout()
    deadline = time.monotonic() + timeout
    while True:
        fd = _open_lock_file(path, shared)
        if fd is None:  # shared, and no file: nothing to guard
            yield
            return
        try:
            _flock(fd, shared, deadline, f"{holder} holds {path} (waited {timeout:g} s)")
            held, now = os.fstat(fd), lstat_or_none(path)
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)  # it was removed while we waited: take the one at `path` now
    try:
        yield
    finally:
        os.close(fd)  # releases the flock


def _open_lock_file(path: Path, shared: bool) -> int | None:
    """The lock file `path` opened without blocking or following a link (made, with its dir,
    readable by all, for an exclusive lock), or None for a shared lock on a missing file; a
    link or a file that is not regular is refused (UnsafePath)."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    flags |= os.O_RDONLY if shared else os.O_RDWR | os.O_CREAT
    info = lstat_or_none(path)
    if info is not None and not stat.S_ISREG(info.st_mode):  # a FIFO would block the open
        raise UnsafePath(f"refusing {path}: it is {kind_of(info.st_mode)}, not a regular file")
    try:
        if not shared:
            make_dirs(path.parent)
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:
        if shared:
            return None
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"refusing {path}: it is a symlink") from None
        raise WriteFailed(path, exc) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath(f"refusing {path}: it is not a regular file")
        if info is None and not shared:  # made here: readable by all, whatever the umask
            with suppress(OSError):
                os.fchmod(fd, 0o644)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def locked_dir(path: Path, *, holder: str) -> Iterator[None]:
    """Hold flock(2) on the directory `path` itself: no lock file is made (a checkout where a
    command is refused keeps every byte)."""
    deadline = time.monotonic() + lock_timeout()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ReadFailed(path, exc) from None
    try:
        _flock(fd, False, deadline, f"{holder} is running in {path} (waited {lock_timeout():g} s)")
        yield
    finally:
        os.close(fd)


def _flock(fd: int, shared: bool, deadline: float, busy: str) -> None:
    import fcntl

    while True:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise Finding(f"{busy}: nothing was changed") from None
            time.sleep(0.05)
