"""Writes, renames and removals: every one the package makes goes through here (tests/
test_fs_layer.py checks it, kitparts.py and gpurun.py excepted: they travel alone to GPU hosts).
The rules (docs/development.md, "Safety"):

- a command writes only inside what it created or owns: its state dir, its staging dirs, and a
  destination that is missing, empty, or marked as made by the tool (`OWNER_MARKER`);
- a file that must never be seen half-written is written whole (`atomic_write`): a temp file in
  the same dir, fsync, rename, fsync of the dir; temp files and staging dirs carry the tool's
  own names, and only those are swept;
- every write point (a file written or renamed into place, a move, a removal, a folder made) is
  shown to the observers of `observed` (none in production: the tests kill a run there).

Standard library only; what is heavy to import is imported where it is used.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from vllm_patchset.errors import BadInput, Finding
from vllm_patchset.infra.fsio.children import process_alive
from vllm_patchset.infra.fsio.interrupts import deferred_signals
from vllm_patchset.infra.fsio.paths import kind_of, lstat_or_none

TMP_SUFFIX = ".vllm-patchset-tmp"  # temp files: .<name>.<random>.vllm-patchset-tmp
STAGING_PREFIX = ".vllm-patchset-staging-"  # staging dirs, beside what they replace
OWNER_MARKER = ".vllm-patchset-owned"  # in a destination dir the tool made and may rewrite

# The kinds of write point an observer is shown, with the path written, moved to or removed.
WRITTEN = "written"  # atomic_write: the temp file is complete (not yet in place)
REPLACED = "replaced"  # atomic_write: renamed into place, the dir synced
CREATED = "created"  # a file written in place (in a staging dir or a new folder)
APPENDED = "appended"  # a journal line appended, flushed and synced
MOVED = "moved"  # a rename (the path: where it went)
LINKED = "linked"  # a hard link made (the path: the new name)
COPIED = "copied"  # a file or tree copied (the path: the copy)
MADE = "made"  # a folder made
REMOVED = "removed"  # a file or tree removed

Observer = Callable[[str, Path], None]
_observers: list[Observer] = []  # none in production


class WriteFailed(Finding):
    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(f"cannot write {path}: {exc.strerror or exc}")
        self.path = path


class NotOwned(BadInput):
    pass


@contextmanager
def observed(observer: Observer) -> Iterator[None]:
    """Show `observer` every write point while the block runs (the tests' kill hook)."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)


def _point(kind: str, path: Path) -> None:
    for observer in tuple(_observers):
        observer(kind, path)


# -- whole files ---------------------------------------------------------------------------------
def atomic_write(path: Path, data: bytes, *, like: Path | None = None, mode: int = 0o644) -> None:
    """Write `path` whole: a temp file beside it, fsync, rename over it, fsync the dir.

    With `like`, the file gets that existing file's mode (and owner, when run as root). An
    OSError becomes WriteFailed naming `path`; the temp file never stays behind."""
    import tempfile  # here: the guard imports this module and never writes

    old = lstat_or_none(like) if like is not None else None
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
        _point(WRITTEN, path)
        os.replace(tmp, path)
    except BaseException as exc:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise WriteFailed(path, exc) from None
        raise
    fsync_dir(path.parent)
    _point(REPLACED, path)


def make_dirs(path: Path) -> None:
    """`path` and the folders above it that are missing, each new one mode 0755 whatever the
    umask (as pip leaves an install: a state dir made under umask 077 would keep the guard of
    a serving user who is not root from reading the record)."""
    missing = []
    while lstat_or_none(path) is None and path != path.parent:
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
        return
    except OSError as exc:
        raise WriteFailed(path, exc) from None
    _point(REMOVED, path)


def remove_dir(path: Path) -> None:
    """Remove an empty dir (WriteFailed when it is not empty, or not there)."""
    try:
        os.rmdir(path)
    except OSError as exc:
        raise WriteFailed(path, exc) from None
    _point(REMOVED, path)


def remove_tree(path: Path) -> None:
    """Remove a dir the tool made (its staging, its state), without following symlinks."""
    import shutil

    info = lstat_or_none(path)
    if info is None:
        return
    if not stat.S_ISDIR(info.st_mode):
        remove_file(path)
        return
    try:
        shutil.rmtree(path)
    except OSError as exc:
        raise WriteFailed(path, exc) from None
    _point(REMOVED, path)


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


def sweep_temp(dirs: Iterable[Path]) -> None:
    """Remove the temp files a killed run left: only the tool's own names, only regular files."""
    for folder in dirs:
        with suppress(FileNotFoundError, NotADirectoryError):
            for name in os.listdir(folder):
                info = lstat_or_none(folder / name)
                if is_temp_name(name) and info is not None and stat.S_ISREG(info.st_mode):
                    remove_file(folder / name)


def sweep_staging(folder: Path) -> None:
    """Remove the staging dirs that killed runs left in `folder`: only the tool's names, and
    only those of a process that is gone (the pid is in the name)."""
    with suppress(FileNotFoundError, NotADirectoryError):
        for name in os.listdir(folder):
            pid = name.removeprefix(STAGING_PREFIX).split("-")[0]
            if name.startswith(STAGING_PREFIX) and pid.isdigit() and not process_alive(int(pid)):
                remove_tree(folder / name)


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
            if lstat_or_none(final) is not None:
                move(final, aside)
            move(staged, final)
        except OSError as exc:
            if lstat_or_none(aside) is not None and lstat_or_none(final) is None:
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


# -- destinations --------------------------------------------------------------------------------
def claim_dir(dest: Path, what: str, *, mark: bool = True) -> None:
    """Make `dest` a dir this tool may rewrite: missing or empty (it gets the marker), or
    marked already. Anything else is refused, with nothing written. With `mark=False`, only
    check (before the work, so that a refusal comes first)."""
    info = lstat_or_none(dest)
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


# -- plain steps (in staging dirs, new folders, the tool's own state) ----------------------------
# Thin: each raises what the os call raises, as the call sites expect, and is a write point.
def write_file(path: Path, data: bytes | str) -> None:
    """Write `path` in place (text as UTF-8): for a file in a dir the tool is building."""
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    _point(CREATED, path)


@contextmanager
def writing(
    path: Path, *, exclusive: bool = False, append: bool = False, mode: int | None = None
) -> Iterator[BinaryIO]:
    """`path` open for writing, whole or streamed (a download, an archive). With `exclusive`,
    a file that is there already is refused (FileExistsError) and no symlink is followed;
    with `append`, what is written goes after what is there; with `mode`, the file gets that
    mode whatever the umask."""
    if append:
        handle = path.open("ab")
    elif exclusive:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        handle = os.fdopen(os.open(path, flags, 0o644 if mode is None else mode), "wb")
    else:
        handle = path.open("wb")
    with handle:
        yield handle
    if mode is not None:
        os.chmod(path, mode)
    _point(APPENDED if append else CREATED, path)


def make_dir(
    path: Path, *, parents: bool = False, exist_ok: bool = False, mode: int | None = None
) -> None:
    """`Path.mkdir`; with `mode`, the new folder gets it whatever the umask."""
    if mode is None:
        path.mkdir(parents=parents, exist_ok=exist_ok)
    else:
        path.mkdir(mode, parents=parents, exist_ok=exist_ok)
        os.chmod(path, mode)
    _point(MADE, path)


def touch(path: Path) -> None:
    path.touch()
    _point(CREATED, path)


def move(src: Path, dst: Path) -> None:
    """Rename `src` to `dst` (one rename(2): over a file there, or into a missing name)."""
    os.replace(src, dst)
    _point(MOVED, dst)


def link(src: Path, dst: Path) -> None:
    """A hard link `dst` to `src` (FileExistsError when `dst` is there: a commit point)."""
    os.link(src, dst)
    _point(LINKED, dst)


def copy_file(
    src: Path, dst: Path, *, metadata: bool = False, follow_symlinks: bool = True
) -> None:
    """Copy a file's bytes (with `metadata`, its mode and times too, as shutil.copy2)."""
    import shutil

    copy = shutil.copy2 if metadata else shutil.copyfile
    copy(src, dst, follow_symlinks=follow_symlinks)
    _point(COPIED, dst)


def copy_tree(src: Path, dst: Path, **options: object) -> None:
    """shutil.copytree (its options as given)."""
    import shutil

    shutil.copytree(src, dst, **options)  # type: ignore[arg-type]
    _point(COPIED, dst)


def discard_tree(path: Path) -> None:
    """Remove what is at `path` if anything, ignoring what cannot be removed (scratch the next
    run removes again)."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    _point(REMOVED, path)


@contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    """A new private folder in the system's temp dir, removed on the way out."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        _point(MADE, Path(tmp))
        yield Path(tmp)
    _point(REMOVED, Path(tmp))


def scratch_file() -> BinaryIO:
    """An unnamed temp file (gone when closed; no name to be seen, so no write point)."""
    import tempfile

    return tempfile.TemporaryFile()
