"""Deploy the overlay onto an installed vllm: `overlay apply | verify | revert | status`.

The target is the directory that holds the `vllm` package (pip's `--target`, or site-packages).
Beside the package, `<target>/.vllm-patchset/` keeps what a later run needs:

    lock           flock(2) against concurrent runs; kept after revert (see `_locked`)
    journal.jsonl  only while a run changes files: one intent line, then one line per file done
    applied.json   the record of the applied overlay: its lock, and the sha256 of each original
    originals/     the bytes each overlaid file had before apply, at vLLM's own paths

Apply writes the journal, saves the originals, then replaces each file atomically (temp file in
the same directory, fsync, os.replace); writing the record is its commit point. A run killed
before that is rolled back by the next apply, revert or status (each file is whole: either its
old or its new bytes); one killed after it only leaves its journal behind. Revert always runs
forward to the end: originals are removed only after the last file is restored.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import os
import stat
import sys
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_patchset.console import colours, diff_line_style, emit, paint
from vllm_patchset.errors import BadInput, Finding, PatchsetError
from vllm_patchset.infra import fsio, jsonfile
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.fsio import (  # re-exported: the tests and the README name them here
    KILL_ENV,
    LOCK_TIMEOUT_ENV,
    TMP_SUFFIX,
    UnsafePath,
)
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
from vllm_patchset.overlay.lock import Lock, LockEntry
from vllm_patchset.registry import add_command

if TYPE_CHECKING:
    import argparse

RECORD_SCHEMA = 1
UNDO = "undo"  # in the state dir while an apply runs: bytes it replaced that revert does not need
STATE_NAMES = (LOCK_FILE, JOURNAL, RECORD, ORIGINALS, UNDO)  # all the tool ever makes there

__all__ = ["KILL_ENV", "LOCK_TIMEOUT_ENV", "TMP_SUFFIX", "UnsafePath"]


class VersionMismatch(Finding):
    pass


class HashMismatch(Finding):
    pass


class ReadOnlyTarget(Finding):
    pass


class NoPackage(BadInput):
    """No package where the target should hold one; `root` is where its state would be."""

    def __init__(self, message: str, root: Path | None) -> None:
        super().__init__(message)
        self.root = root


# -- the installed vllm ------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    root: Path  # the directory that holds the package
    package: str
    version: str  # from the package's dist-info METADATA beside it

    @property
    def state(self) -> Path:
        return self.root / STATE_DIR


def find_target(
    package: str, *, target_dir: Path | None = None, python: str | None = None
) -> Target:
    """`--target DIR`, else the package that `python` (default: this interpreter) imports."""
    if target_dir is not None and python is not None:
        raise BadInput("--target and --python exclude each other")
    reported = None
    if target_dir is None:
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
            raise NoPackage(
                f"{exe} has no {package} package installed{hint}", next(iter(left), None)
            )
        target_dir = Path(found.origin).parent.parent
        reported = found.version
    root = target_dir.resolve()
    if not (root / package / "__init__.py").is_file():
        raise NoPackage(
            f"{root} holds no {package} package ({package}/__init__.py is missing)", root
        )
    version = installed_version(root, package)
    if reported is not None and reported != version:
        raise BadInput(
            f"{python or sys.executable} reports {package} {reported}, but the dist-info beside"
            f" {root / package} says {version}: a broken install"
        )
    return Target(root, package, version)


def package_path(target: Target, rel: str) -> Path:
    """The path of a lock entry in the target, refusing anything that could lead out of it."""
    parts = path_parts(target.package, rel)
    if parts is None:
        raise UnsafePath(
            f"refusing lock path {rel!r}: only relative paths inside the {target.package}"
            " package are deployed"
        )
    path = fsio.no_symlink_below(target.root, parts)
    fsio.no_symlink_below(path.parent, ["__pycache__"])
    return path


def _state_path(target: Target, *parts: str) -> Path:
    """A path in the state dir, no symlink on the way (the state dir itself included)."""
    return fsio.no_symlink_below(target.root, [STATE_DIR, *parts])


def _refuse_symlinked_state(target: Target) -> None:
    for name in (LOCK_FILE, ORIGINALS, UNDO, RECORD, JOURNAL):
        _state_path(target, name)


def _pending(target: Target) -> bool:
    """Did a run stop before its end (a journal, or the temp file of one being written)?"""
    names = os.listdir(target.state) if target.state.is_dir() else []
    return JOURNAL in names or any(fsio.is_temp_name(n) for n in names)


def _check_version(target: Target, lock: Lock) -> None:
    if target.version != lock.version:
        raise VersionMismatch(
            f"{target.package} {target.version} is installed at {target.root}, but the overlay"
            f" is for {lock.version}: nothing changed (rebase the patch set onto"
            f" {target.version}, or install {lock.package}=={lock.version})"
        )


def _read(path: Path) -> bytes | None:
    return fsio.read_regular(path)


def _sha(data: bytes | None) -> str | None:
    return None if data is None else sha256_bytes(data)


def _file_sha(target: Target, rel: str) -> str | None:
    """The sha256 of an installed file, streamed in chunks (a large file is never held whole),
    or None when it is missing; a FIFO or a link is refused before it is opened."""
    path = package_path(target, rel)
    try:
        return sha256_file(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise fsio.ReadFailed(path, exc) from None


# -- the record and the journal -----------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    lock: Lock
    originals: dict[str, str]  # path -> sha256 of the bytes saved in originals/
    transaction: str  # the journal id that wrote it (tells a committed apply from a killed one)


@dataclass(frozen=True)
class Step:
    path: str
    before_sha256: str
    after_sha256: str


@dataclass(frozen=True)
class Journal:
    op: str  # "apply" or "revert"
    id: str
    steps: tuple[Step, ...]  # the intent; the lines after it (files done) are for people


def read_record(target: Target) -> Record | None:
    path = _state_path(target, RECORD)
    text = _read(path)
    if text is None:
        return None
    try:
        doc = jsonfile.parse(text)
        if doc["schema"] != RECORD_SCHEMA:
            raise BadInput(f"{path}: record schema {doc['schema']} is not {RECORD_SCHEMA}")
        return Record(
            lock=Lock.from_doc(doc["lock"], str(path)),
            originals={str(k): str(v) for k, v in doc["originals"].items()},
            transaction=str(doc["transaction"]),
        )
    except KeyError as exc:
        raise BadInput(
            f"{path}: not a valid record (no {exc.args[0]!r}); move it away to continue"
        ) from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise BadInput(f"{path}: not a valid record ({exc}); move it away to continue") from None


def _write_record(
    target: Target, lock: Lock, originals: dict[str, str], txid: str, sizes: dict[str, int]
) -> None:
    """`sizes`: each patched file's size, so that the start-up guard refuses a file of another
    size before it reads a byte of it (the lock has only sha256s)."""
    doc = {
        "schema": RECORD_SCHEMA,
        "transaction": txid,
        "lock": lock.to_doc(),
        "originals": dict(sorted(originals.items())),
        "patched_sizes": dict(sorted(sizes.items())),
    }
    fsio.atomic_write(_state_path(target, RECORD), (json.dumps(doc, indent=2) + "\n").encode())


def _read_journal(target: Target) -> Journal | None:
    path = _state_path(target, JOURNAL)
    text = _read(path)
    if text is None:
        return None
    try:
        intent = jsonfile.parse(text.split(b"\n", 1)[0])
        steps = tuple(_step(s) for s in jsonfile.field(intent, "files", list))
        op = jsonfile.field(intent, "op", str)
        return Journal(op, jsonfile.field(intent, "id", str), steps)
    except ValueError as exc:
        raise BadInput(
            f"{path}: unreadable journal ({exc}): check the files, then remove it"
        ) from None


def _step(doc: object) -> Step:
    if not isinstance(doc, dict):
        raise jsonfile.BadJson("a file step is not a JSON object")
    fields = [jsonfile.field(doc, key, str) for key in ("path", "before_sha256", "after_sha256")]
    return Step(*fields)


@contextmanager
def _transaction(target: Target, op: str, steps: list[Step]) -> Iterator[str]:
    """Journal `steps` before any change; on an error or an interrupt, undo (apply) or finish
    (revert) them at once, with the next SIGINT/SIGTERM held back until that is done."""
    txid = uuid.uuid4().hex
    intent = {"op": op, "id": txid, "version": target.version, "files": [asdict(s) for s in steps]}
    journal = _state_path(target, JOURNAL)
    try:
        fsio.atomic_write(journal, (json.dumps(intent) + "\n").encode())
        yield txid
    except BaseException as exc:
        with fsio.deferred_signals():
            try:
                note = _recover(target)  # the same code that repairs a killed run
            except (PatchsetError, OSError) as again:
                _left(
                    exc,
                    f"the {op} stopped half-way and could not be undone ({again}): its journal"
                    f" {journal} is left for the next `vllm-patchset overlay apply`, `revert`"
                    " or `status` to finish",
                )
                raise exc from None
        record = read_record(target)
        if note is None:
            _left(exc, "nothing was changed")
        elif op == "revert":
            _left(exc, f"{note}: the files are pristine")
        elif record is not None and record.transaction == txid:
            _left(exc, f"{note}: the overlay is applied")
        else:
            _left(exc, f"{note}: the target is as it was")
        raise
    fsio.remove_file(journal)
    fsio.fsync_dir(target.state)
    done = "applied" if op == "apply" else "reverted"
    fsio.interrupt_leaves(f"the overlay had been {done} (the run was complete)")


def _left(exc: BaseException, note: str) -> None:
    """Say what `exc` left behind, in the one line cli.main prints for it."""
    if isinstance(exc, PatchsetError):
        exc.left = note
    fsio.interrupt_leaves(note)


def _journal_done(target: Target, path: str) -> None:
    try:
        with _state_path(target, JOURNAL).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"done": path}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        raise fsio.WriteFailed(target.state / JOURNAL, exc) from None


def _recover(target: Target) -> str | None:
    """Repair what a killed run left (the caller holds the lock); a note, or None."""
    fsio.sweep_temp([target.state])  # a run killed while writing its journal leaves a temp file
    journal = _read_journal(target)
    if journal is None:
        return None
    record = read_record(target)
    n = len(journal.steps)
    if journal.op == "apply" and record is not None and record.transaction == journal.id:
        note = "finished an interrupted apply (it had committed)"
    elif journal.op == "apply":
        undone = [
            _put(target, s, want=s.before_sha256, other=s.after_sha256) for s in journal.steps
        ]
        if record is None:
            fsio.remove_tree(_state_path(target, ORIGINALS))
        for step in journal.steps:
            if record is not None and step.path not in record.originals:
                fsio.remove_file(_state_path(target, ORIGINALS, *step.path.split("/")))
        note = f"rolled back an interrupted apply ({sum(undone)} of {n} files had been replaced)"
    else:
        done = [_put(target, s, want=s.after_sha256, other=s.before_sha256) for s in journal.steps]
        _forget(target)
        note = f"finished an interrupted revert ({n - sum(done)} of {n} files had been restored)"
    fsio.remove_tree(_state_path(target, UNDO))
    fsio.sweep_temp({package_path(target, s.path).parent for s in journal.steps})
    fsio.remove_file(_state_path(target, JOURNAL))
    fsio.fsync_dir(target.state)
    return note


def _put(target: Target, step: Step, *, want: str, other: str) -> bool:
    """Make the file's sha256 `want`: it is `want` already, or `other` and its original is saved.

    True when it had to restore the file."""
    path = package_path(target, step.path)
    current = _sha(_read(path)) or ""  # "": missing (a forced revert may recreate a file)
    if current != want:
        if current != other:
            raise Finding(
                f"{path} changed during an interrupted run (sha256 {current}): reinstall"
                f" {target.package}=={target.version} and remove {target.state}"
            )
        fsio.atomic_write(path, _saved_original(target, step.path, want), like=path)
    _remove_bytecode(path, strict=False)
    return current != want


def _saved_original(target: Target, rel: str, sha: str) -> bytes:
    """The saved bytes of `rel` with this sha256: in undo/ (what an apply in progress replaced
    while an original was kept already) or originals/."""
    parts = rel.split("/")
    for where in (UNDO, ORIGINALS):
        saved = _state_path(target, where, *parts)
        data = _read(saved)
        if data is not None and sha256_bytes(data) == sha:
            return data
    what = "missing" if data is None else "corrupt (its sha256 differs from the record)"
    raise Finding(
        f"the saved original {saved} is {what}: cannot restore {rel}; reinstall"
        f" {target.package}=={target.version}"
    )


def _forget(target: Target) -> None:
    """Drop the record (the commit point of a revert), then the originals."""
    fsio.remove_file(_state_path(target, RECORD))
    fsio.fsync_dir(target.state)
    fsio.remove_tree(_state_path(target, ORIGINALS))
    fsio.remove_tree(_state_path(target, UNDO))


def _remove_state_dir(target: Target) -> str | None:
    """With the lock held and no record left: remove the state dir (its lock file last). A
    file the tool did not make is left there, and said so."""
    if not target.state.is_dir():
        return None
    foreign = sorted(n for n in os.listdir(target.state) if n not in STATE_NAMES)
    if foreign:
        return f"left {target.state}: it holds files vllm-patchset did not make ({foreign[0]})"
    fsio.sweep_temp([target.state])
    fsio.remove_tree(_state_path(target, ORIGINALS))
    fsio.remove_tree(_state_path(target, UNDO))
    fsio.remove_file(_state_path(target, LOCK_FILE))  # a run waiting on it takes a new one
    try:
        os.rmdir(target.state)
    except OSError as exc:
        raise fsio.WriteFailed(target.state, exc) from None
    return None


def _overlay_gone(target: Target, record: Record | None) -> bool:
    """Is nothing of the recorded overlay left in the files? (vllm reinstalled or upgraded
    over it: `pip install --force-reinstall` or `-U` replaces the files, not the record)"""
    if record is None:
        return False
    if not record.lock.entries:
        return record.lock.version != target.version
    return all(_file_sha(target, e.path) != e.patched_sha256 for e in record.lock.entries)


def _gone_note(target: Target, record: Record) -> str:
    how = (
        f"{target.package} {target.version} was installed over it"
        if record.lock.version != target.version
        else f"{target.package} was reinstalled over it"
    )
    return (
        f"the overlay applied to {target.package} {record.lock.version}"
        f" ({', '.join(record.lock.patches) or 'no patches'}) is gone from the files ({how})"
    )


# -- file system: bytecode, writability, the lock --------------------------------------------------
def bytecode_files(source: Path) -> list[Path]:
    """`__pycache__/<module>.*.pyc` of a module, for every interpreter and optimization level."""
    cache = source.parent / "__pycache__"
    if not cache.is_dir() or cache.is_symlink():
        return []
    prefix = source.name.removesuffix(".py") + "."
    return sorted(p for p in cache.iterdir() if p.name.startswith(prefix) and p.suffix == ".pyc")


def _remove_bytecode(source: Path, *, strict: bool = True) -> None:
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


def _check_bytecode_removable(sources: Iterable[Path]) -> None:
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


def _left_bytecode(sources: Iterable[Path]) -> list[str]:
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


def _check_writable(dirs: Iterable[Path]) -> None:
    """A read-only target fails here, unchanged. No probe file is made: one that a kill left
    would be a stray file in the target."""
    for folder in sorted(set(dirs)):
        try:
            read_only = os.statvfs(folder).f_flag & os.ST_RDONLY
            why = (
                "Read-only file system"
                if read_only
                else None
                if os.access(folder, os.W_OK | os.X_OK)
                else "Permission denied"
            )
        except OSError as exc:
            why = exc.strerror
        if why:
            raise ReadOnlyTarget(
                f"cannot write in {folder} ({why}): the target is read-only here;"
                " nothing was changed"
            )


@contextmanager
def _locked(target: Target, *, shared: bool = False) -> Iterator[None]:
    """Hold <state>/lock, waiting for another run at most VLLM_PATCHSET_LOCK_TIMEOUT seconds.

    On the way out, a state dir that records nothing (no record, no journal: a run refused,
    rolled back or reverted) is removed: the target is left as it was before any apply."""
    _refuse_symlinked_state(target)
    with fsio.locked(_state_path(target, LOCK_FILE), shared=shared):
        try:
            yield
        finally:
            if not shared:
                with fsio.deferred_signals(), suppress(PatchsetError, OSError):
                    if not {RECORD, JOURNAL} & set(os.listdir(target.state)):
                        _remove_state_dir(target)


# -- reports -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileState:
    path: str
    state: str  # pristine | patched | modified | missing: after the command (now, on a dry run)
    sha256: str | None
    action: str | None = None  # what the command did (would do, on a dry run): patch | restore


@dataclass(frozen=True)
class Report:
    command: str
    outcome: str
    ok: bool
    target: str
    version: str | None  # None: the package is not installed there (any more)
    lock_version: str
    patches: tuple[str, ...]
    files: tuple[FileState, ...]
    notes: tuple[str, ...] = ()

    def text(self) -> str:
        lines = [
            f"overlay {self.command}: {self.outcome} ({self.target},"
            f" {self.version or 'not installed'};"
            f" overlay for {self.lock_version}: {', '.join(self.patches) or 'no patches'})"
        ]
        lines += [f"  {f.action or f.state:10} {f.path}" for f in self.files]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def _state_of(entry: LockEntry, sha: str | None) -> str:
    if sha is None:
        return "missing"
    return {entry.pristine_sha256: "pristine", entry.patched_sha256: "patched"}.get(sha, "modified")


def _after(files: list[FileState], lock: Lock, steps: list[Step]) -> list[FileState]:
    """The files as the steps left them (what a report shows after a change)."""
    done = {s.path: s.after_sha256 for s in steps}
    return [
        FileState(f.path, _state_of(entry, done[f.path]), done[f.path], f.action)
        if f.path in done and entry is not None
        else f
        for f in files
        for entry in [lock.entry(f.path)]
    ]


def _current(target: Target, lock: Lock) -> list[FileState]:
    return [
        FileState(e.path, _state_of(e, sha), sha)
        for e in lock.entries
        for sha in [_file_sha(target, e.path)]
    ]


def _report(
    command: str,
    outcome: str,
    target: Target,
    lock: Lock,
    files: Iterable[FileState],
    notes: Iterable[str | None] = (),
    *,
    ok: bool = True,
) -> Report:
    where = str(target.root / target.package)
    kept = tuple(n for n in notes if n)
    return Report(
        command, outcome, ok, where, target.version, lock.version, lock.patches, tuple(files), kept
    )


# -- the commands ------------------------------------------------------------------------------
def apply(
    target: Target, lock: Lock, overlay_dir: Path, *, dry_run: bool = False, force: bool = False
) -> Report:
    """Install the overlay of `lock` (files from `overlay_dir`): every file or none."""
    _refuse_symlinked_state(target)
    _check_version(target, lock)
    paths = {e.path: package_path(target, e.path) for e in lock.entries}
    overlay = overlay_files(lock, overlay_dir)
    pending = _pending(target)
    if dry_run and pending:
        return _would_repair("apply", target, lock)
    if not pending:  # plan without the lock: a no-op must work on a read-only target too
        record = read_record(target)
        gone = _overlay_gone(target, record)
        steps, files, notes = _plan_apply(
            target, lock, paths, None if gone else record, force=force
        )
        if dry_run or (not steps and record is not None and record.lock == lock):
            outcome = "would apply" if steps else "already applied"
            return _report("apply", outcome, target, lock, files, notes)
    _check_bytecode_removable(paths.values())
    _check_writable(_dirs_written(target, paths.values()))
    with _locked(target):
        repaired = _recover(target)
        record = read_record(target)
        gone = _overlay_gone(target, record)
        steps, files, notes = _plan_apply(
            target, lock, paths, None if gone else record, force=force
        )
        if not steps and record is not None and record.lock == lock:
            return _report("apply", "already applied", target, lock, files, [repaired, *notes])
        if gone and record is not None:
            notes.insert(0, f"{_gone_note(target, record)}: removed its stale record")
            _forget(target)
            record = None
        if not steps and lock.entries:
            notes.append(
                "recorded the overlay found in place (no originals: revert cannot undo it)"
            )
        current = {s.path: _read(paths[s.path]) or b"" for s in steps}
        kept = record.originals if record is not None else {}
        originals = {path: sha for path, sha in kept.items() if path in paths}
        with _transaction(target, "apply", steps) as txid:
            for step in steps:
                if kept.get(step.path, step.before_sha256) == step.before_sha256:
                    where = ORIGINALS  # saved for revert (or there already)
                    originals[step.path] = step.before_sha256
                else:
                    where = UNDO  # the original saved at the first apply stays for revert
                saved = _state_path(target, where, *step.path.split("/"))
                if _sha(_read(saved)) != step.before_sha256:
                    fsio.atomic_write(saved, current[step.path])
            for step in steps:
                fsio.atomic_write(paths[step.path], overlay[step.path], like=paths[step.path])
                _remove_bytecode(paths[step.path])
                _journal_done(target, step.path)
            for path in paths.values():  # also pycs left beside files that were patched already
                _remove_bytecode(path)
            sizes = {e.path: len(overlay[e.path]) for e in lock.entries}
            _write_record(target, lock, originals, txid, sizes)
            fsio.remove_tree(_state_path(target, UNDO))
    outcome = "applied" if steps or not lock.entries else "already applied"
    return _report("apply", outcome, target, lock, _after(files, lock, steps), [repaired, *notes])


def _would_repair(command: str, target: Target, lock: Lock) -> Report:
    outcome = f"would repair an interrupted run, then {command}"
    return _report(command, outcome, target, lock, _current(target, lock))


def _plan_apply(
    target: Target, lock: Lock, paths: dict[str, Path], record: Record | None, *, force: bool
) -> tuple[list[Step], list[FileState], list[str | None]]:
    if record is not None and record.lock != lock:
        for entry in record.lock.entries:
            saved = record.originals.get(entry.path, entry.pristine_sha256)
            if _file_sha(target, entry.path) != saved:
                raise HashMismatch(
                    f"refusing to apply, nothing changed: {target.root / entry.path} holds"
                    f" another overlay ({', '.join(record.lock.patches)}): run `vllm-patchset"
                    " overlay revert` first"
                )
        record = None  # its files are all back to their originals: it is stale
    steps: list[Step] = []
    files: list[FileState] = []
    notes: list[str | None] = []
    refused: list[str] = []
    for entry in lock.entries:
        sha = _sha(_read(paths[entry.path]))
        state = _state_of(entry, sha)
        if state == "missing":
            raise HashMismatch(f"{paths[entry.path]} is missing: not a complete {target.package}")
        if state == "patched":
            files.append(FileState(entry.path, state, sha))
            continue
        assert sha is not None
        if state == "modified":
            why = f"neither the pristine nor the patched {target.package} {lock.version}"
            if not force:
                refused.append(f"{entry.path} (sha256 {sha[:12]}: {why})")
                continue
            kept = record is not None and entry.path in record.originals
            notes.append(
                f"--force: overwrote {entry.path} (sha256 {sha[:12]}, {why});"
                + (
                    " the original saved when the overlay was first applied is kept for revert"
                    " (the overwritten bytes are not)"
                    if kept
                    else " its bytes are kept for revert"
                )
            )
        steps.append(Step(entry.path, sha, entry.patched_sha256))
        files.append(FileState(entry.path, state, sha, "patch"))
    if refused:
        raise HashMismatch(
            f"refusing to apply, nothing changed: {'; '.join(refused)}."
            " --force overwrites such files (the hash guard only), keeping their bytes for revert"
        )
    return steps, files, notes


def overlay_files(lock: Lock, overlay_dir: Path) -> dict[str, bytes]:
    """The overlay's patched files (in `overlay_dir`/vllm/…), each checked against the lock."""
    files = {}
    for entry in lock.entries:
        parts = path_parts(lock.package, entry.path)
        if parts is None:
            raise UnsafePath(
                f"refusing lock path {entry.path!r}: only relative paths inside the"
                f" {lock.package} package are deployed"
            )
        source = fsio.no_symlink_below(overlay_dir, parts)
        data = _read(source)
        if data is None:
            raise BadInput(f"{source} is missing: run `vllm-patchset overlay build`")
        if sha256_bytes(data) != entry.patched_sha256:
            raise Finding(
                f"{source} does not match the lock's patched sha256: rebuild it with"
                " `vllm-patchset overlay build`"
            )
        files[entry.path] = data
    return files


def _dirs_written(target: Target, paths: Iterable[Path]) -> set[Path]:
    dirs = {p.parent for p in paths} | {p.parent / "__pycache__" for p in paths}
    dirs = {d for d in dirs if d.is_dir()}
    return dirs | ({target.state} if target.state.is_dir() else {target.root})


def revert(target: Target, lock: Lock, *, dry_run: bool = False, force: bool = False) -> Report:
    """Restore the saved originals of what `apply` changed (its record's lock, else `lock`).

    With a record, the version is not checked: each file is restored only when it holds the
    recorded patched bytes (an upgrade of vllm that left the files patched is undone, one that
    replaced them leaves only a stale record to remove). --force needs the recorded version."""
    _refuse_symlinked_state(target)
    record = read_record(target)
    applied = record.lock if record else lock
    if record is None or force:
        _check_version(target, applied)
    pending = _pending(target)
    if dry_run and pending:
        return _would_repair("revert", target, applied)
    if not pending:
        gone = _overlay_gone(target, record)
        if gone:
            steps, files, notes = list[Step](), _current(target, applied), list[str | None]()
        else:
            steps, files, notes = _plan_revert(target, applied, record, force=force)
        if dry_run:
            outcome = (
                "would remove a stale record"
                if gone
                else "would revert"
                if steps
                else "already pristine"
            )
            return _report("revert", outcome, target, applied, files, notes)
        if not steps and record is None and not target.state.exists():
            return _report("revert", "already pristine", target, applied, files, notes)
    paths = [package_path(target, e.path) for e in applied.entries]
    _check_writable(_dirs_written(target, paths))
    with _locked(target):
        repaired = _recover(target)
        record = read_record(target)
        applied = record.lock if record else lock
        outcome = "already pristine"
        if record is not None and _overlay_gone(target, record):
            steps, files = [], _current(target, applied)
            notes = [f"{_gone_note(target, record)}: removed its stale record"]
            outcome = "stale record removed"
            _forget(target)
        else:
            steps, files, notes = _plan_revert(target, applied, record, force=force)
        if steps:
            with _transaction(target, "revert", steps):
                for step in steps:
                    _put(target, step, want=step.after_sha256, other=step.before_sha256)
                    _journal_done(target, step.path)
                _forget(target)
            outcome = "reverted"
        elif record is not None and outcome == "already pristine":
            _forget(target)
            notes.append("the files were pristine already: removed the stale record")
        notes.append(_remove_state_dir(target))
        notes += _left_bytecode(paths) if steps else []
    files = _after(files, applied, steps)
    return _report("revert", outcome, target, applied, files, [repaired, *notes])


def _plan_revert(
    target: Target, applied: Lock, record: Record | None, *, force: bool
) -> tuple[list[Step], list[FileState], list[str | None]]:
    steps: list[Step] = []
    files: list[FileState] = []
    notes: list[str | None] = []
    refused: list[str] = []
    for entry in applied.entries:
        path = package_path(target, entry.path)
        sha = _file_sha(target, entry.path)
        original = record.originals.get(entry.path) if record else None
        if sha == (original or entry.pristine_sha256):
            files.append(FileState(entry.path, "pristine", sha))
            continue
        state = _state_of(entry, sha)
        if state != "patched" and not force:
            refused.append(f"{entry.path} ({state}, sha256 {(sha or '-')[:12]})")
            continue
        if original is None:
            raise Finding(
                f"no saved original for {path} (this overlay was not applied by vllm-patchset):"
                f" reinstall {target.package}=={target.version} to undo it"
            )
        _saved_original(target, entry.path, original)  # check it before changing anything
        if state != "patched":
            notes.append(f"--force: restored the original over {entry.path} ({state})")
        steps.append(Step(entry.path, sha or "", original))
        files.append(FileState(entry.path, state, sha, "restore"))
    if refused:
        raise HashMismatch(
            f"refusing to revert, nothing changed: {'; '.join(refused)} changed since apply."
            " --force restores the saved originals over them (the hash guard only)"
        )
    return steps, files, notes


def verify(target: Target, lock: Lock) -> Report:
    """ok only when the target holds exactly the overlay of `lock`, recorded by apply."""
    _refuse_symlinked_state(target)
    problems: list[str | None] = []
    if target.version != lock.version:
        problems.append(
            f"{target.package} {target.version} is installed, the lock is for {lock.version}"
        )
    with _locked(target, shared=True) if target.state.is_dir() else nullcontext():
        if _state_path(target, JOURNAL).exists():
            problems.append("an interrupted run is pending (`overlay status` repairs it)")
        record = read_record(target)
        if record is None:
            problems.append(
                f"no record of an apply in {target.state}: the start-up guard cannot confirm"
                " the overlay (`vllm-patchset overlay apply` records it)"
            )
        elif record.lock != lock:
            problems.append(
                f"the overlay recorded there is another one"
                f" ({', '.join(record.lock.patches) or 'no patches'} on {record.lock.version})"
            )
        files = []
        for entry in lock.entries:
            path = package_path(target, entry.path)
            data = _read(path)
            files.append(FileState(entry.path, _state_of(entry, _sha(data)), _sha(data)))
            if files[-1].state != "patched":
                problems.append(f"{entry.path} is {files[-1].state}")
            elif data is not None:
                problems += [
                    f"stale unchecked-hash bytecode {p}" for p in stale_bytecode(path, data)
                ]
    ok = not problems
    return _report(
        "verify", "verified" if ok else "NOT verified", target, lock, files, problems, ok=ok
    )


def status(target: Target, lock: Lock) -> Report:
    """What the target holds, after repairing an interrupted run (when it can write)."""
    _refuse_symlinked_state(target)
    notes: list[str | None] = []
    ok = True
    if _pending(target):
        paths = [package_path(target, e.path) for e in lock.entries]
        try:
            _check_writable(_dirs_written(target, paths))
            with _locked(target):
                notes.append(_recover(target))
            fsio.interrupt_leaves(f"{notes[0]}; nothing else was changed")
        except ReadOnlyTarget as exc:
            notes.append(f"an interrupted run is pending and cannot be repaired: {exc}")
            ok = False
    record = read_record(target)
    files = _current(target, lock)
    states = {f.state for f in files}
    if record is not None and _overlay_gone(target, record):
        outcome, ok = "gone", False
        notes.append(
            f"{_gone_note(target, record)}: `vllm-patchset overlay apply` applies this lock's"
            " overlay again, `vllm-patchset overlay revert` removes the stale record"
        )
    elif target.version != lock.version:
        outcome, ok = f"other version (the lock is for {lock.version})", False
    elif states <= {"patched"} and (lock.entries or record is not None):
        outcome = "applied"
    elif states <= {"pristine"}:
        outcome = "not applied"
    else:
        outcome, ok = ("partial" if states <= {"pristine", "patched"} else "modified"), False
    if record is not None and record.lock != lock and outcome != "gone":
        applied = ", ".join(record.lock.patches) or "no patches"
        notes.append(
            f"the overlay applied there ({applied} on {record.lock.version}) is not this one:"
            " `vllm-patchset overlay revert` removes it, then `overlay apply` applies this one"
        )
    elif record is None and outcome == "applied":
        notes.append("no record of this apply: `overlay revert` cannot restore the originals")
    return _report("status", outcome, target, lock, files, notes, ok=ok)


def orphaned(root: Path, package: str, lock: Lock | None, command: str, why: str) -> Report:
    """status or revert where the package is gone but the state of an overlay is left
    (`pip uninstall vllm` removes the package's files, not `.vllm-patchset/`). `lock`: the
    overlay given (None: the one recorded there)."""
    state = root / STATE_DIR
    target = Target(root, package, "")
    _refuse_symlinked_state(target)
    record = read_record(target)
    lock = lock or (record.lock if record is not None else no_overlay(package, ""))
    what = (
        f"an overlay applied to {package} {record.lock.version}"
        if record is not None
        else "an overlay"
    )
    found = f"{why}, but {state} is left from {what} ({package} uninstalled?)"
    notes: list[str | None] = []
    if command == "status":
        outcome, ok = "orphaned state", False
        notes.append(f"{found}: `vllm-patchset overlay revert --target {root}` removes it")
    else:
        _check_writable([state, root])
        with _locked(target):
            fsio.sweep_temp([state])
            fsio.remove_file(_state_path(target, JOURNAL))
            _forget(target)
            notes += [f"{found}: removed it", _remove_state_dir(target)]
        outcome, ok = "orphaned state removed", True
    kept = tuple(n for n in notes if n)
    return Report(
        command, outcome, ok, str(root / package), None, lock.version, lock.patches, (), kept
    )


# -- the overlay to deploy ----------------------------------------------------------------------
PACKED = "_overlay"  # in the package of a wheel `overlay pack` built: the lock and vllm/**


@dataclass(frozen=True)
class Source:
    """An overlay to deploy: its lock and the dir holding its patched files (`vllm/…`)."""

    lock: Lock
    files: Path


def packaged_overlay() -> Source | None:
    """The overlay packed into this installed vllm-patchset (`overlay pack`), if any."""
    folder = Path(__file__).resolve().parents[1] / PACKED
    lock = folder / "overlay.lock.json"
    return Source(Lock.load(lock), folder) if lock.is_file() else None


def overlay_source(project_dir: Path | None, cache_dir: Path | None) -> Source | None:
    """The checkout's overlay (--project, else the checkout around the current directory),
    else the one packed into this vllm-patchset; None when there is neither."""
    root = project_dir or Project.discover(Path.cwd())
    if root is None:
        return packaged_overlay()
    project = Project.load(root, cache_dir)
    return Source(Lock.load(project.lock_path), project.overlay_dir)


def no_overlay(package: str, version: str) -> Lock:
    """The lock of no overlay: what status and revert compare against when neither a checkout
    nor a packed overlay is at hand and the target records none."""
    return Lock(package, version, source="", upstream_commit="", patches=(), entries=())


# -- diff --------------------------------------------------------------------------------------
def unified_diff(path: str, before: bytes | None, after: bytes) -> str:
    """`before` (None: missing) to `after` as a unified diff that `patch -p1` applies in the
    target dir."""
    old = [] if before is None else before.decode("utf-8", "surrogateescape").splitlines(True)
    new = after.decode("utf-8", "surrogateescape").splitlines(True)
    lines = difflib.unified_diff(
        old, new, "/dev/null" if before is None else f"a/{path}", f"b/{path}"
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n")
    return "".join(out)


def diff(target: Target, lock: Lock, overlay_dir: Path) -> tuple[Report, dict[str, str]]:
    """What apply would change: each overlaid file as installed against the overlay's."""
    _refuse_symlinked_state(target)
    _check_version(target, lock)
    overlay = overlay_files(lock, overlay_dir)
    files, diffs = [], {}
    for entry in lock.entries:
        data = _read(package_path(target, entry.path))
        state = _state_of(entry, _sha(data))
        files.append(
            FileState(entry.path, state, _sha(data), None if state == "patched" else "patch")
        )
        diffs[entry.path] = (
            "" if state == "patched" else unified_diff(entry.path, data, overlay[entry.path])
        )
    outcome = "differs" if any(diffs.values()) else "no difference"
    return _report("diff", outcome, target, lock, files), diffs


def diff_text(diffs: dict[str, str], *, colour: bool) -> str:
    text = "".join(diffs.values())
    if not colour:
        return text
    return "".join(paint(line, diff_line_style(line), on=True) + "\n" for line in text.splitlines())


# -- command line ------------------------------------------------------------------------------
def register_cli(osub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`overlay apply|verify|revert|status|diff`, called by cli.build_parser."""
    helps = {
        "apply": "install the overlay into an installed vllm (every file or none)",
        "verify": "exit 0 only when the installed vllm holds exactly the overlay of the lock",
        "revert": "restore the files that apply replaced, byte for byte",
        "status": "what the installed vllm holds (repairs an interrupted apply first)",
        "diff": "the overlay's changes to the installed files, as a unified diff",
    }
    forces = {
        "apply": "override the hash guard only: replace files that are neither pristine nor"
        " patched (their bytes are kept for revert, unless an original is saved already)",
        "revert": "override the hash guard only: restore the saved originals over files that"
        " changed since apply",
    }
    for name, text in helps.items():
        p = add_command(osub, name, cmd_deploy, help=text, writes_checkout=False)
        where = p.add_mutually_exclusive_group()
        where.add_argument(
            "--target",
            type=Path,
            metavar="DIR",
            help="the dir holding the vllm package (site-packages, pip's --target)",
        )
        where.add_argument(
            "--python",
            metavar="EXE",
            help="the vllm of this interpreter (default: the one running vllm-patchset)",
        )
        if name in forces:
            p.add_argument(
                "--dry-run", action="store_true", help="say what would change, change nothing"
            )
            p.add_argument("--force", action="store_true", help=forces[name])
        if name == "apply":
            p.add_argument(
                "--diff", action="store_true", help="also print the changes as a unified diff"
            )


NO_OVERLAY = (
    "overlay {command} needs an overlay: {cwd} is not in a vllm-patchset checkout and this"
    " vllm-patchset carries none; pass --project DIR (a checkout with a built overlay), or"
    " install the wheel that `vllm-patchset overlay pack` builds"
)


def cmd_deploy(args: argparse.Namespace) -> int:
    command = args.overlay_command
    fsio.interrupt_leaves("nothing was changed")
    source = overlay_source(args.project, args.cache_dir)
    if source is None and command not in ("status", "revert"):
        raise BadInput(NO_OVERLAY.format(command=command, cwd=Path.cwd()))
    package = source.lock.package if source else "vllm"
    diffs: dict[str, str] = {}
    try:
        target = find_target(package, target_dir=args.target, python=args.python)
    except NoPackage as exc:
        if command not in ("status", "revert") or exc.root is None:
            raise
        if not (exc.root / STATE_DIR).is_dir() or (exc.root / STATE_DIR).is_symlink():
            raise
        lock = source.lock if source else None
        report = orphaned(exc.root, package, lock, command, str(exc))
    else:
        lock = source.lock if source else _recorded(target)
        if command == "apply":
            assert source is not None
            if args.diff:
                diffs = diff(target, lock, source.files)[1]
            report = apply(target, lock, source.files, dry_run=args.dry_run, force=args.force)
        elif command == "diff":
            assert source is not None
            report, diffs = diff(target, lock, source.files)
        elif command == "revert":
            report = revert(target, lock, dry_run=args.dry_run, force=args.force)
        elif command == "verify":
            report = verify(target, lock)
        else:
            report = status(target, lock)
    if source is None:
        recorded = (
            "compared with the one recorded at apply"
            if report.patches
            else "none is recorded here either"
        )
        why = f"no overlay given (no checkout here, none packed in this vllm-patchset): {recorded}"
        report = dataclasses.replace(report, notes=(*report.notes, why))
    doc = asdict(report)
    if diffs:
        for item in doc["files"]:
            item["diff"] = diffs[item["path"]]
    code = 0 if report.ok else 1
    changes = diff_text(diffs, colour=colours())
    if command == "diff":
        return emit(args, changes.rstrip("\n"), doc, code)
    text = report.text() + ("\n" + changes.rstrip("\n") if changes else "")
    return emit(args, text, doc, code)


def _recorded(target: Target) -> Lock:
    """The lock of the overlay recorded at `target` (none given): status and revert need only
    that record."""
    _refuse_symlinked_state(target)
    record = read_record(target)
    return record.lock if record is not None else no_overlay(target.package, target.version)
