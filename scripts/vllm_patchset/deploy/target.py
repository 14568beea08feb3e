"""The install being deployed to: the directory that holds the `vllm` package (pip's
`--target`, or site-packages) and, beside it, the state a later run needs (`.vllm-patchset/`):

    lock           flock(2) against concurrent runs; kept after revert (see `Target.locked`)
    journal.jsonl  only while a run changes files: one intent line, then one line per file done
    applied.json   the record of the applied overlay: its lock, and the sha256 of each original
    originals/     the bytes each overlaid file had before apply, at vLLM's own paths
    undo/          while an apply runs: bytes it replaced that revert does not need

Every path of the target is reached through `Target`'s methods, each checked on the way (no
symlink below the target, only paths inside the package)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from vllm_patchset.errors import BadInput, Finding, PatchsetError
from vllm_patchset.infra import fsio
from vllm_patchset.infra.fsio import UnsafePath
from vllm_patchset.infra.hashes import sha256_bytes, sha256_file
from vllm_patchset.infra.installed import (
    JOURNAL,
    LOCK_FILE,
    ORIGINALS,
    RECORD,
    STATE_DIR,
    installed_version,
    path_parts,
    probe,
)
from vllm_patchset.overlay.lock import Lock

UNDO = "undo"  # in the state dir while an apply runs: bytes it replaced that revert does not need
STATE_NAMES = (LOCK_FILE, JOURNAL, RECORD, ORIGINALS, UNDO)  # all the tool ever makes there


class VersionMismatch(Finding):
    pass


class HashMismatch(Finding):
    pass


class ReadOnlyTarget(Finding):
    pass


class LinkedInstall(Finding):
    pass


class NoPackage(BadInput):
    """No package where the target should hold one; `root` is where its state would be."""

    def __init__(self, message: str, root: Path | None) -> None:
        super().__init__(message)
        self.root = root


@dataclass(frozen=True)
class Target:
    root: Path  # the directory that holds the package
    package: str
    version: str  # from the package's dist-info METADATA beside it

    @classmethod
    def find(
        cls, package: str, *, target_dir: Path | None = None, python: str | None = None
    ) -> Target:
        """`--target DIR`, else the package that `python` (default: this interpreter) imports."""
        if target_dir is not None and python is not None:
            raise BadInput("--target and --python exclude each other")
        reported = None
        if target_dir is None:
            target_dir, reported = _imported_root(package, python)
        root = target_dir.resolve()
        if not (root / package / "__init__.py").is_file():
            raise NoPackage(
                f"{root} holds no {package} package ({package}/__init__.py is missing)", root
            )
        version = installed_version(root, package)
        if reported is not None and reported != version:
            raise BadInput(
                f"{python or sys.executable} reports {package} {reported}, but the dist-info"
                f" beside {root / package} says {version}: a broken install"
            )
        return cls(root, package, version)

    # -- paths -----------------------------------------------------------------------------------
    @property
    def state(self) -> Path:
        return self.root / STATE_DIR

    @property
    def where(self) -> str:
        return str(self.root / self.package)

    def state_path(self, *parts: str) -> Path:
        """A path in the state dir, no symlink on the way (the state dir itself included)."""
        return fsio.no_symlink_below(self.root, [STATE_DIR, *parts])

    def path(self, rel: str, *, linked: bool = False) -> Path:
        """The path of a lock entry in the target, refusing anything that could lead out of it.

        `linked`: the file itself may be a symlink (uv's `--link-mode symlink` links each file
        into its cache); its reads follow it to a regular file, and a write replaces the link,
        never what it points to. The folders on the way may not be links."""
        parts = path_parts(self.package, rel)
        if parts is None:
            raise UnsafePath(
                f"refusing lock path {rel!r}: only relative paths inside the {self.package}"
                " package are deployed"
            )
        if linked:
            path = fsio.no_symlink_below(self.root, parts[:-1]) / parts[-1]
        else:
            path = fsio.no_symlink_below(self.root, parts)
        fsio.no_symlink_below(path.parent, ["__pycache__"])
        return path

    def refuse_linked(self, lock: Lock) -> None:
        """Apply writes no file that is a symlink: uv's `--link-mode symlink` shares it with
        uv's cache and every environment made from it."""
        for entry in lock.entries:
            path = self.path(entry.path, linked=True)
            if path.is_symlink():
                raise LinkedInstall(
                    f"refusing to apply, nothing changed: {path} is a symlink (to"
                    f" {os.readlink(path)}), as `uv pip install --link-mode symlink` installs;"
                    f" reinstall {self.package} with `--link-mode copy` (or hardlink) to apply"
                    " the overlay"
                )

    def refuse_symlinked_state(self) -> None:
        for name in (LOCK_FILE, ORIGINALS, UNDO, RECORD, JOURNAL):
            self.state_path(name)

    # -- reads -----------------------------------------------------------------------------------
    def read(self, rel: str) -> bytes | None:
        """The bytes of an installed file (through a link to a regular file), None: missing."""
        return fsio.read_regular(self.path(rel, linked=True), follow=True)

    def file_sha(self, rel: str) -> str | None:
        """The sha256 of an installed file, streamed in chunks (a large file is never held
        whole), or None when it is missing; a FIFO is refused before it is opened, a link is
        read through to a regular file."""
        path = self.path(rel, linked=True)
        try:
            return sha256_file(path, follow=True)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise fsio.ReadFailed(path, exc) from None

    def pending(self) -> bool:
        """Did a run stop before its end (a journal, or the temp file of one being written)?"""
        names = os.listdir(self.state) if self.state.is_dir() else []
        return JOURNAL in names or any(fsio.is_temp_name(n) for n in names)

    def check_version(self, lock: Lock) -> None:
        if self.version != lock.version:
            raise VersionMismatch(
                f"{self.package} {self.version} is installed at {self.root}, but the overlay"
                f" is for {lock.version}: nothing changed (rebase the patch set onto"
                f" {self.version}, or install {lock.package}=={lock.version})"
            )

    def saved_original(self, rel: str, sha: str) -> bytes:
        """The saved bytes of `rel` with this sha256: in undo/ (what an apply in progress
        replaced while an original was kept already) or originals/."""
        parts = rel.split("/")
        for where in (UNDO, ORIGINALS):
            saved = self.state_path(where, *parts)
            data = fsio.read_regular(saved)
            if data is not None and sha256_bytes(data) == sha:
                return data
        what = "missing" if data is None else "corrupt (its sha256 differs from the record)"
        raise Finding(
            f"the saved original {saved} is {what}: cannot restore {rel}; reinstall"
            f" {self.package}=={self.version}"
        )

    def check_original(self, rel: str, sha: str) -> None:
        self.saved_original(rel, sha)

    # -- writes ----------------------------------------------------------------------------------
    def forget(self) -> None:
        """Drop the record (the commit point of a revert), then the originals."""
        fsio.remove_file(self.state_path(RECORD))
        fsio.fsync_dir(self.state)
        fsio.remove_tree(self.state_path(ORIGINALS))
        fsio.remove_tree(self.state_path(UNDO))

    def remove_state_dir(self) -> str | None:
        """With the lock held and no record left: remove the state dir (its lock file last). A
        file the tool did not make is left there, and said so."""
        if not self.state.is_dir():
            return None
        foreign = sorted(n for n in os.listdir(self.state) if n not in STATE_NAMES)
        if foreign:
            return f"left {self.state}: it holds files vllm-patchset did not make ({foreign[0]})"
        fsio.sweep_temp([self.state])
        fsio.remove_tree(self.state_path(ORIGINALS))
        fsio.remove_tree(self.state_path(UNDO))
        fsio.remove_file(self.state_path(LOCK_FILE))  # a run waiting on it takes a new one
        fsio.remove_dir(self.state)
        return None

    def dirs_written(self, paths: Iterable[Path]) -> set[Path]:
        dirs = {p.parent for p in paths} | {p.parent / "__pycache__" for p in paths}
        dirs = {d for d in dirs if d.is_dir()}
        return dirs | ({self.state} if self.state.is_dir() else {self.root})

    def check_writable(self, paths: Iterable[Path]) -> None:
        """A read-only target fails here, unchanged. No probe file is made: one that a kill
        left would be a stray file in the target."""
        check_writable(self.dirs_written(paths))

    @contextmanager
    def locked(self, *, shared: bool = False) -> Iterator[None]:
        """Hold <state>/lock, waiting for another run at most VLLM_PATCHSET_LOCK_TIMEOUT seconds.

        On the way out, a state dir that records nothing (no record, no journal: a run refused,
        rolled back or reverted) is removed: the target is left as it was before any apply."""
        self.refuse_symlinked_state()
        with fsio.locked(self.state_path(LOCK_FILE), shared=shared):
            try:
                yield
            finally:
                if not shared:
                    with fsio.deferred_signals(), suppress(PatchsetError, OSError):
                        if not {RECORD, JOURNAL} & set(os.listdir(self.state)):
                            self.remove_state_dir()


def _imported_root(package: str, python: str | None) -> tuple[Path, str | None]:
    """The dir holding the package that `python` imports, and the version it reports."""
    exe = python or sys.executable
    found = probe(exe, package)
    if not found.origin or not found.origin.endswith("__init__.py"):
        # where an uninstalled package may have left the state of an overlay
        left = [Path(d).resolve() for d in found.site_dirs if (Path(d) / STATE_DIR).is_dir()]
        hint = (
            ""
            if python
            else ": this is vllm-patchset's own environment; name the serving one with"
            " --python EXE (its interpreter) or --target DIR (the dir holding the package)"
        )
        raise NoPackage(f"{exe} has no {package} package installed{hint}", next(iter(left), None))
    return Path(found.origin).parent.parent, found.version


def check_writable(dirs: Iterable[Path]) -> None:
    for folder in sorted(set(dirs)):
        why = _cannot_write(folder)
        if why:
            raise ReadOnlyTarget(
                f"cannot write in {folder} ({why}): the target is read-only here;"
                " nothing was changed"
            )


def _cannot_write(folder: Path) -> str | None:
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "Read-only file system"
        return None if os.access(folder, os.W_OK | os.X_OK) else "Permission denied"
    except OSError as exc:
        return exc.strerror
