"""Every file-system write of the tool goes through here, and so does every read of a path that
came from data (a RECORD, a lock, a journal, a series, a patch header). The rules (README.md,
"Safety"):

- a command writes only inside what it created or owns: its state dir, its staging dirs, and a
  destination that is missing, empty, or marked as made by the tool (`OWNER_MARKER`);
- a relative path read from data is used only when it is plain: no absolute path, no `..`,
  `.` or empty parts, no backslash or NUL, and inside the expected top folder;
- no symlink is followed on the way to a file the tool reads or writes inside a target, and
  only regular files are read: a FIFO or device is refused, never opened (nothing may block);
- each file is written whole: a temp file in the same dir, fsync, rename, fsync of the dir;
  temp files and staging dirs carry the tool's own names, and only those are swept;
- a writer holds a flock (`locked`), waiting at most `VLLM_PATCHSET_LOCK_TIMEOUT` seconds;
- SIGINT and SIGTERM raise `Interrupted`, so that cleanups run; `interrupt_leaves` says what an
  interrupt at this point leaves behind, for the one line `cli.main` prints; the children a
  command starts die with it (`die_with_parent`).

Standard library only, and cheap to import (the rest is imported where it is used): the
start-up guard reads through `read_regular`.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from vllm_patchset.errors import BadInput, Finding

TMP_SUFFIX = ".vllm-patchset-tmp"  # temp files: .<name>.<random>.vllm-patchset-tmp
STAGING_PREFIX = ".vllm-patchset-staging-"  # staging dirs, beside what they replace
OWNER_MARKER = ".vllm-patchset-owned"  # in a destination dir the tool made and may rewrite
LOCK_TIMEOUT_ENV = "VLLM_PATCHSET_LOCK_TIMEOUT"  # seconds to wait for another run (default 60)
KILL_ENV = "VLLM_PATCHSET_TEST_KILL_AFTER"  # tests: "N" SIGKILL, "N:TERM"/"N:INT" at write N


class UnsafePath(Finding):
    """A path that would lead out of what the tool may touch, or a file that is not regular."""


class WriteFailed(Finding):
    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(f"cannot write {path}: {exc.strerror or exc}")
        self.path = path


class ReadFailed(BadInput):
    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(f"cannot read {path}: {exc.strerror or exc}")


class NotOwned(BadInput):
    pass


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM: raised in the main thread, so that `finally` and rollbacks run."""

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# -- paths from data -----------------------------------------------------------------------------
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


def _lstat(path: Path) -> os.stat_result | None:
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
        info = _lstat(path)
        if info is None:
            break
        if stat.S_ISLNK(info.st_mode):
            raise UnsafePath(
                f"refusing {path}: it is a symlink (to {os.readlink(path)}); the tool does not"
                " follow symlinks inside what it reads or writes"
            )
    return root.joinpath(*parts)


def read_regular(path: Path, *, limit: int | None = None) -> bytes | None:
    """The bytes of a regular file (the first `limit` of them), or None when it is missing.

    A symlink, FIFO, device or dir is refused with UnsafePath before anything opens it; the
    open itself is O_NOFOLLOW | O_NONBLOCK, so a file swapped for a FIFO meanwhile cannot
    block either."""
    info = _lstat(path)
    if info is None:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePath(f"refusing {path}: it is {kind_of(info.st_mode)}, not a regular file")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
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
        chunks = []
        left = limit
        while left is None or left > 0:
            chunk = os.read(fd, 1 << 20 if left is None else min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left = None if left is None else left - len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise ReadFailed(path, exc) from None
    finally:
        os.close(fd)


def is_regular(path: Path) -> bool:
    """Whether `path` is a regular file itself (not a link to one)."""
    info = _lstat(path)
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


# -- writes --------------------------------------------------------------------------------------
_write_points = [0]


def _test_hook() -> None:
    """Tests: with VLLM_PATCHSET_TEST_KILL_AFTER=N the process signals itself at the N-th write
    point (each write has two: temp file complete, and renamed): SIGKILL, as a crash or
    `kill -9` would, or with "N:TERM" / "N:INT" a SIGTERM or SIGINT."""
    setting = os.environ.get(KILL_ENV)
    if not setting:
        return
    _write_points[0] += 1
    import signal

    point, _, name = setting.partition(":")
    if _write_points[0] == int(point):
        os.kill(os.getpid(), getattr(signal, f"SIG{name}") if name else signal.SIGKILL)


def atomic_write(path: Path, data: bytes, *, like: Path | None = None, mode: int = 0o644) -> None:
    """Write `path` whole: a temp file beside it, fsync, rename over it, fsync the dir.

    With `like`, the file gets that existing file's mode (and owner, when run as root). An
    OSError becomes WriteFailed naming `path`; the temp file never stays behind."""
    import tempfile  # here: the guard imports this module and never writes

    old = _lstat(like) if like is not None else None
    try:
        make_dirs(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    except OSError as exc:
        raise WriteFailed(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, stat.S_IMODE(old.st_mode) if old else mode)
        if old is not None and os.geteuid() == 0:
            os.chown(tmp, old.st_uid, old.st_gid)
        _test_hook()
        os.replace(tmp, path)
    except BaseException as exc:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise WriteFailed(path, exc) from None
        raise
    fsync_dir(path.parent)
    _test_hook()


def make_dirs(path: Path) -> None:
    """`path` and the folders above it that are missing, each new one mode 0755 whatever the
    umask (as pip leaves an install: a state dir made under umask 077 would keep the guard of
    a serving user who is not root from reading the record)."""
    missing = []
    while _lstat(path) is None and path != path.parent:
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o755)
        except FileExistsError:
            continue
        os.chmod(folder, 0o755)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise WriteFailed(path, exc) from None
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_file(path: Path) -> None:
    """Unlink a file (or link) if it is there; a dir is refused."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise WriteFailed(path, exc) from None


def remove_tree(path: Path) -> None:
    """Remove a dir the tool made (its staging, its state), without following symlinks."""
    import shutil

    info = _lstat(path)
    if info is None:
        return
    if not stat.S_ISDIR(info.st_mode):
        remove_file(path)
        return
    try:
        shutil.rmtree(path)
    except OSError as exc:
        raise WriteFailed(path, exc) from None


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


def sweep_temp(dirs: Iterable[Path]) -> None:
    """Remove the temp files a killed run left: only the tool's own names, only regular files."""
    for folder in dirs:
        with suppress(FileNotFoundError, NotADirectoryError):
            for name in os.listdir(folder):
                info = _lstat(folder / name)
                if is_temp_name(name) and info is not None and stat.S_ISREG(info.st_mode):
                    remove_file(folder / name)


def sweep_staging(folder: Path) -> None:
    """Remove the staging dirs that killed runs left in `folder`: only the tool's names, and
    only those of a process that is gone (the pid is in the name)."""
    with suppress(FileNotFoundError, NotADirectoryError):
        for name in os.listdir(folder):
            pid = name.removeprefix(STAGING_PREFIX).split("-")[0]
            if name.startswith(STAGING_PREFIX) and pid.isdigit() and not _alive(int(pid)):
                remove_tree(folder / name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def staging_dir(folder: Path, name: str) -> Iterator[Path]:
    """A new dir `folder`/.vllm-patchset-staging-<pid>-<name>-<random>, removed on the way out
    (whatever is left of it), with what killed runs left swept first."""
    import tempfile

    sweep_staging(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        prefix = f"{STAGING_PREFIX}{os.getpid()}-{name}-"
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=folder))
    except OSError as exc:
        raise WriteFailed(folder, exc) from None
    try:
        yield path
    finally:
        with deferred_signals(), suppress(WriteFailed):  # else swept by the next run
            remove_tree(path)


def replace_dir(staged: Path, final: Path) -> None:
    """Put the dir `staged` at `final`, the old `final` (if any) moved aside into `staged`'s
    parent and removed. The two renames run with SIGINT/SIGTERM deferred."""
    aside = staged.parent / f"{STAGING_PREFIX}{os.getpid()}-old"
    with deferred_signals():
        try:
            if _lstat(final) is not None:
                os.rename(final, aside)
            os.rename(staged, final)
        except OSError as exc:
            if _lstat(aside) is not None and _lstat(final) is None:
                os.rename(aside, final)
            raise WriteFailed(final, exc) from None
        fsync_dir(final.parent)
        remove_tree(aside)


# -- build outputs -------------------------------------------------------------------------------
def build_dir(root: Path) -> Path:
    """`root`/build, the folder of the tool's default build outputs (`kit build`, `bundle`,
    `validate`): a real folder that is new, empty or marked as the tool's (`claim_dir`), so
    that what the tool replaces in it is what it wrote there. A symlinked `build/` or one that
    holds the user's files is refused with one line, nothing removed."""
    path = root / "build"
    claim_dir(path, "the build folder")
    return path


def remove_output(path: Path) -> None:
    """Remove a default build output in the tool's own build folder (`build_dir`): never
    through a link (a symlink there is removed itself, not what it points to)."""
    remove_tree(path)


def same_path(a: Path, b: Path) -> bool:
    """Whether `a` and `b` are one file or folder (both there, same device and inode)."""
    one, two = _stat(a), _stat(b)
    return (
        one is not None
        and two is not None
        and (one.st_dev, one.st_ino)
        == (
            two.st_dev,
            two.st_ino,
        )
    )


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


# -- destinations --------------------------------------------------------------------------------
def claim_dir(dest: Path, what: str, *, mark: bool = True) -> None:
    """Make `dest` a dir this tool may rewrite: missing or empty (it gets the marker), or
    marked already. Anything else is refused, with nothing written. With `mark=False`, only
    check (before the work, so that a refusal comes first)."""
    info = _lstat(dest)
    if info is not None and stat.S_ISLNK(info.st_mode):
        raise NotOwned(f"{what} {dest} is a symlink (to {os.readlink(dest)}): give a real dir")
    if info is not None and not stat.S_ISDIR(info.st_mode):
        raise NotOwned(f"{what} {dest} is {kind_of(info.st_mode)}, not a directory")
    if info is not None:
        names = os.listdir(dest)
        if OWNER_MARKER in names:
            if not stat.S_ISREG(os.lstat(dest / OWNER_MARKER).st_mode):
                raise NotOwned(f"{what} {dest}: {OWNER_MARKER} is not a regular file")
            return
        if names:
            raise NotOwned(
                f"{what} {dest} is not empty and was not made by vllm-patchset (no"
                f" {OWNER_MARKER} in it): give a new or empty directory; nothing was written"
            )
    if not mark:
        return
    atomic_write(
        dest / OWNER_MARKER,
        b"made by vllm-patchset: it may replace what it wrote here (remove this file to stop it)\n",
    )


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
    flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    flags |= os.O_RDONLY if shared else os.O_RDWR | os.O_CREAT
    while True:
        info = _lstat(path)
        if info is not None and not stat.S_ISREG(info.st_mode):  # a FIFO would block the open
            raise UnsafePath(f"refusing {path}: it is {kind_of(info.st_mode)}, not a regular file")
        try:
            if not shared:
                make_dirs(path.parent)
            fd = os.open(path, flags, 0o644)
        except FileNotFoundError:
            if shared:
                yield
                return
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
            _flock(fd, shared, deadline, f"{holder} holds {path} (waited {timeout:g} s)")
            held, now = os.fstat(fd), _lstat(path)
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


# -- signals and children ------------------------------------------------------------------------
_leaves: list[str | None] = [None]


def interrupt_leaves(note: str | None) -> None:
    """Say what an interrupt from now on leaves behind (printed by cli.main), or None."""
    _leaves[0] = note


def interrupted_note() -> str | None:
    return _leaves[0]


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


@contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` in the main thread while the block runs."""
    import signal

    if not _main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    _leaves[0] = None
    try:
        yield
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)


@contextmanager
def deferred_signals() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done (a rollback or a swap must not be cut
    short): they are noted, and raised again once the block is over. Not a signal mask: with
    other threads in the process (torch starts some) the kernel hands the signal to one of
    them, and Python would still run its handler in the main thread, inside the block."""
    import signal

    if not _main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, _frame: object) -> None:
        pending.append(signum)

    old = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
        if pending:
            signal.raise_signal(pending[0])  # the handler that was there runs now


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes a child get SIGKILL when this process dies (Linux prctl
    PR_SET_PDEATHSIG); None elsewhere. A git or python child must not outlive a killed run."""
    import sys

    if not sys.platform.startswith("linux"):
        return None
    if not _prctl:
        import ctypes

        _prctl.append(ctypes.CDLL(None, use_errno=True).prctl)
    import signal

    prctl, parent = _prctl[0], os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl ran: die now
            os._exit(1)

    return preexec


def child(argv: list[str]) -> tuple[list[str], Callable[[], None] | None]:
    """`argv` and a `preexec_fn` for a child that must die with this process. Where util-linux's
    `setpriv --pdeathsig` is there, it sets PR_SET_PDEATHSIG for the child and no `preexec_fn`
    is needed: with one, Python must fork() instead of vfork(), which costs about 10 ms a child
    in a process as large as one that has imported torch (the tests), against 1 ms. A parent
    that dies before setpriv's prctl sends no signal, so a shell then checks that the parent is
    still this process before it execs the command (about 0.5 ms more)."""
    import shutil
    import sys

    if not sys.platform.startswith("linux"):
        return argv, None
    if not _setpriv:
        _setpriv.append(shutil.which("setpriv") or "")
    if _setpriv[0]:
        alive = '[ "$PPID" = "$0" ] && exec "$@"'  # $0: this process's pid
        return [
            _setpriv[0],
            "--pdeathsig",
            "KILL",
            "/bin/sh",
            "-c",
            alive,
            str(os.getpid()),
            *argv,
        ], None
    return argv, die_with_parent()


_setpriv: list[str] = []
_prctl: list[Callable[..., int]] = []
