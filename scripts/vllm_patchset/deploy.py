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

import fcntl
import importlib.util
import itertools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_patchset.errors import BadInput, Finding
from vllm_patchset.installed import (
    JOURNAL,
    LOCK_FILE,
    ORIGINALS,
    RECORD,
    STATE_DIR,
    installed_version,
    path_parts,
)
from vllm_patchset.lock import Lock, LockEntry, sha256_bytes

if TYPE_CHECKING:
    import argparse

RECORD_SCHEMA = 1
TMP_SUFFIX = ".vllm-patchset-tmp"
LOCK_TIMEOUT_ENV = "VLLM_PATCHSET_LOCK_TIMEOUT"  # seconds to wait for another run (default 60)
KILL_ENV = "VLLM_PATCHSET_TEST_KILL_AFTER"  # tests: SIGKILL at the N-th write point


class VersionMismatch(Finding):
    pass


class HashMismatch(Finding):
    pass


class UnsafePath(Finding):
    pass


class ReadOnlyTarget(Finding):
    pass


# -- the installed vllm ------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    root: Path  # the directory that holds the package
    package: str
    version: str  # from the package's dist-info METADATA beside it

    @property
    def state(self) -> Path:
        return self.root / STATE_DIR


# Run by the interpreter of `--python` (or this one): finds the package without importing it,
# so neither vllm nor torch is loaded. `-c` puts the caller's cwd first on sys.path: drop it.
_LOCATE = """\
import importlib.metadata, importlib.util, json, sys
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]
spec = importlib.util.find_spec(sys.argv[1])
try:
    version = importlib.metadata.version(sys.argv[1])
except importlib.metadata.PackageNotFoundError:
    version = None
print(json.dumps({"origin": spec.origin if spec else None, "version": version}))
"""


def find_target(
    package: str, *, target_dir: Path | None = None, python: str | None = None
) -> Target:
    """`--target DIR`, else the package that `python` (default: this interpreter) imports."""
    if target_dir is not None and python is not None:
        raise BadInput("--target and --python exclude each other")
    reported = None
    if target_dir is None:
        exe = python or sys.executable
        try:
            done = subprocess.run(
                [exe, "-c", _LOCATE, package], capture_output=True, text=True, timeout=120
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BadInput(f"cannot run --python {exe}: {exc}") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise BadInput(f"{exe} could not look for {package}: {last}")
        try:
            found = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise BadInput(f"{exe} printed no answer when asked for {package}") from None
        if not found["origin"] or not found["origin"].endswith("__init__.py"):
            raise BadInput(f"{exe} has no {package} package installed")
        target_dir = Path(found["origin"]).parent.parent
        reported = found["version"]
    root = target_dir.resolve()
    if not (root / package / "__init__.py").is_file():
        raise BadInput(f"{root} holds no {package} package ({package}/__init__.py is missing)")
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
    path = target.root.joinpath(*parts)
    for step in [*reversed(path.parents[: len(parts) - 1]), path, path.parent / "__pycache__"]:
        if step.is_symlink():
            raise UnsafePath(
                f"refusing {step}: it is a symlink (to {os.readlink(step)}); the overlay is"
                " written only to regular files inside the package"
            )
    return path


def _refuse_symlinked_state(target: Target) -> None:
    for path in (target.state, target.state / LOCK_FILE, target.state / ORIGINALS):
        if path.is_symlink():
            raise UnsafePath(
                f"refusing {path}: it is a symlink (to {os.readlink(path)}); the tool keeps its"
                " state only in a plain directory beside the package"
            )


def _pending(target: Target) -> bool:
    """Did a run stop before its end (a journal, or the temp file of one being written)?"""
    return (target.state / JOURNAL).exists() or any(target.state.glob(f".*{TMP_SUFFIX}"))


def _check_version(target: Target, lock: Lock) -> None:
    if target.version != lock.version:
        raise VersionMismatch(
            f"{target.package} {target.version} is installed at {target.root}, but the overlay"
            f" is for {lock.version}: nothing changed (rebase the patch set onto"
            f" {target.version}, or install {lock.package}=={lock.version})"
        )


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _sha(data: bytes | None) -> str | None:
    return None if data is None else sha256_bytes(data)


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


def read_record(state: Path) -> Record | None:
    text = _read(state / RECORD)
    if text is None:
        return None
    where = str(state / RECORD)
    try:
        doc = json.loads(text)
        if doc["schema"] != RECORD_SCHEMA:
            raise BadInput(f"{where}: record schema {doc['schema']} is not {RECORD_SCHEMA}")
        return Record(
            lock=Lock.from_json(json.dumps(doc["lock"]), where),
            originals={str(k): str(v) for k, v in doc["originals"].items()},
            transaction=str(doc["transaction"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadInput(f"{where}: not a valid record ({exc!r}); move it away to continue") from None


def _write_record(state: Path, lock: Lock, originals: dict[str, str], transaction: str) -> None:
    doc = {
        "schema": RECORD_SCHEMA,
        "transaction": transaction,
        "lock": json.loads(lock.to_json()),
        "originals": dict(sorted(originals.items())),
    }
    _write_atomic(state / RECORD, (json.dumps(doc, indent=2) + "\n").encode())


def _read_journal(state: Path) -> Journal | None:
    text = _read(state / JOURNAL)
    if text is None:
        return None
    lines = text.decode("utf-8", errors="replace").splitlines()
    try:
        intent = json.loads(lines[0])
        steps = tuple(Step(**s) for s in intent["files"])
        return Journal(str(intent["op"]), str(intent["id"]), steps)
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(
            f"{state / JOURNAL}: unreadable journal ({exc!r}): check the files, then remove it"
        ) from None


@contextmanager
def _transaction(target: Target, op: str, steps: list[Step]) -> Iterator[str]:
    """Journal `steps` before any change; on an error, undo (apply) or finish (revert) them."""
    txid = uuid.uuid4().hex
    intent = {"op": op, "id": txid, "version": target.version, "files": [asdict(s) for s in steps]}
    _write_atomic(target.state / JOURNAL, (json.dumps(intent) + "\n").encode())
    try:
        yield txid
    except BaseException:
        _recover(target)  # the same code that repairs a killed run
        raise
    (target.state / JOURNAL).unlink()
    _fsync_dir(target.state)


def _journal_done(target: Target, path: str) -> None:
    with (target.state / JOURNAL).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"done": path}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _recover(target: Target) -> str | None:
    """Repair what a killed run left (the caller holds the lock); a note, or None."""
    _sweep_tmp([target.state])  # a run killed while writing its journal leaves only a temp file
    journal = _read_journal(target.state)
    if journal is None:
        return None
    record = read_record(target.state)
    n = len(journal.steps)
    if journal.op == "apply" and record is not None and record.transaction == journal.id:
        note = "finished an interrupted apply (it had committed)"
    elif journal.op == "apply":
        undone = [
            _put(target, s, want=s.before_sha256, other=s.after_sha256) for s in journal.steps
        ]
        if record is None:
            shutil.rmtree(target.state / ORIGINALS, ignore_errors=True)
        for step in journal.steps:
            if record is not None and step.path not in record.originals:
                (target.state / ORIGINALS / step.path).unlink(missing_ok=True)
        note = f"rolled back an interrupted apply ({sum(undone)} of {n} files had been replaced)"
    else:
        done = [_put(target, s, want=s.after_sha256, other=s.before_sha256) for s in journal.steps]
        _forget(target)
        note = f"finished an interrupted revert ({n - sum(done)} of {n} files had been restored)"
    _sweep_tmp({package_path(target, s.path).parent for s in journal.steps})
    (target.state / JOURNAL).unlink()
    _fsync_dir(target.state)
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
        _write_atomic(path, _saved_original(target, step.path, want), like=path)
    _remove_bytecode(path)
    return current != want


def _saved_original(target: Target, rel: str, sha: str) -> bytes:
    saved = target.state / ORIGINALS / rel
    data = _read(saved)
    if data is None or sha256_bytes(data) != sha:
        what = "missing" if data is None else "corrupt (its sha256 differs from the record)"
        raise Finding(
            f"the saved original {saved} is {what}: cannot restore {rel}; reinstall"
            f" {target.package}=={target.version}"
        )
    return data


def _forget(target: Target) -> None:
    """After a revert: drop the record (the commit point), then the originals."""
    (target.state / RECORD).unlink(missing_ok=True)
    _fsync_dir(target.state)
    shutil.rmtree(target.state / ORIGINALS, ignore_errors=True)


# -- file system: atomic writes, bytecode, the lock ---------------------------------------------
_write_points = itertools.count(1)


def _kill_point() -> None:
    """Test hook: with VLLM_PATCHSET_TEST_KILL_AFTER=N the process SIGKILLs itself at the N-th
    point (each write has two: temp file complete, and replaced), as a crash or `kill -9`."""
    limit = os.environ.get(KILL_ENV)
    if limit and next(_write_points) >= int(limit):
        os.kill(os.getpid(), signal.SIGKILL)


def _write_atomic(path: Path, data: bytes, *, like: Path | None = None) -> None:
    """Write a temp file beside `path`, fsync it, os.replace it over `path`, fsync the dir.

    With `like`, keep that existing file's mode (and owner, when run as root)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = like.stat() if like is not None and like.exists() else None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, stat.S_IMODE(old.st_mode) if old else 0o644)
        if old is not None and os.geteuid() == 0:
            os.chown(tmp, old.st_uid, old.st_gid)
        _kill_point()
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    _kill_point()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sweep_tmp(dirs: Iterable[Path]) -> None:
    """Remove temp files that a killed run left (only ours: a dot name ending in TMP_SUFFIX)."""
    for folder in dirs:
        if folder.is_dir():
            for leftover in folder.glob(f".*{TMP_SUFFIX}"):
                leftover.unlink(missing_ok=True)


def bytecode_files(source: Path) -> list[Path]:
    """`__pycache__/<module>.*.pyc` of a module, for every interpreter and optimization level."""
    cache = source.parent / "__pycache__"
    if not cache.is_dir():
        return []
    prefix = source.name.removesuffix(".py") + "."
    return sorted(p for p in cache.iterdir() if p.name.startswith(prefix) and p.suffix == ".pyc")


def _remove_bytecode(source: Path) -> None:
    # Timestamp pycs would be rebuilt, but an unchecked-hash pyc (compileall --invalidation-mode
    # unchecked-hash, common in images) is run without looking at the source: remove them all.
    for pyc in bytecode_files(source):
        pyc.unlink(missing_ok=True)


def stale_bytecode(source: Path, data: bytes) -> list[Path]:
    """Unchecked-hash pycs that do not match `data`: Python would run them instead of it."""
    stale = []
    for pyc in bytecode_files(source):
        with pyc.open("rb") as handle:
            head = handle.read(16)
        flags = int.from_bytes(head[4:8], "little")
        if flags & 0b01 and not flags & 0b10:  # hash-based, check_source off (PEP 552)
            current = head[:4] == importlib.util.MAGIC_NUMBER
            if not (current and head[8:16] == importlib.util.source_hash(data)):
                stale.append(pyc)
    return stale


def _check_writable(dirs: Iterable[Path]) -> None:
    """Create and remove a temp file in each dir: a read-only target fails here, unchanged."""
    for folder in sorted(set(dirs)):
        try:
            fd, probe = tempfile.mkstemp(prefix=".probe.", suffix=TMP_SUFFIX, dir=folder)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise ReadOnlyTarget(
                f"cannot write in {folder} ({exc.strerror}): the target is read-only here;"
                " nothing was changed"
            ) from None


@contextmanager
def _locked(target: Target, *, shared: bool = False) -> Iterator[None]:
    """Hold <state>/lock, waiting for another run at most VLLM_PATCHSET_LOCK_TIMEOUT seconds.

    The lock file is never removed: a run waiting on a removed file would hold a lock that a
    third run, creating a new file, does not see."""
    path = target.state / LOCK_FILE
    _refuse_symlinked_state(target)
    try:
        if shared:
            fd = os.open(path, os.O_RDONLY)
        else:
            target.state.mkdir(exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ReadOnlyTarget(
            f"cannot open {path} ({exc.strerror}): the target is read-only here;"
            " nothing was changed"
        ) from None
    try:
        timeout = float(os.environ.get(LOCK_TIMEOUT_ENV) or 60)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Finding(
                        f"another vllm-patchset run holds {path} (waited {timeout:g} s):"
                        " nothing was changed"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the flock


# -- reports -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileState:
    path: str
    state: str  # pristine | patched | modified | missing
    sha256: str | None
    action: str = ""  # what the command did (or would do) to it


@dataclass(frozen=True)
class Report:
    command: str
    outcome: str
    ok: bool
    target: str
    version: str
    lock_version: str
    patches: tuple[str, ...]
    files: tuple[FileState, ...]
    notes: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def text(self) -> str:
        lines = [
            f"overlay {self.command}: {self.outcome} ({self.target}, {self.version};"
            f" overlay for {self.lock_version}: {', '.join(self.patches) or 'no patches'})"
        ]
        lines += [f"  {f.action or f.state:10} {f.path}" for f in self.files]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def _state_of(entry: LockEntry, sha: str | None) -> str:
    if sha is None:
        return "missing"
    return {entry.pristine_sha256: "pristine", entry.patched_sha256: "patched"}.get(sha, "modified")


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
    overlay = _overlay_files(lock, overlay_dir)
    pending = _pending(target)
    if dry_run and pending:
        return _would_repair("apply", target, lock)
    if not pending:  # plan without the lock: a no-op must work on a read-only target too
        steps, files, notes = _plan_apply(target, lock, paths, force=force)
        record = read_record(target.state)
        if dry_run or (not steps and record is not None and record.lock == lock):
            outcome = "would apply" if steps else "already applied"
            return _report("apply", outcome, target, lock, files, notes)
    _check_writable(_dirs_written(target, paths.values()))
    with _locked(target):
        repaired = _recover(target)
        record = read_record(target.state)
        steps, files, notes = _plan_apply(target, lock, paths, force=force)
        if not steps and record is not None and record.lock == lock:
            return _report("apply", "already applied", target, lock, files, [repaired, *notes])
        if not steps:
            notes.append(
                "recorded the overlay found in place (no originals: revert cannot undo it)"
            )
        current = {s.path: _read(paths[s.path]) or b"" for s in steps}
        kept = record.originals if record is not None else {}
        originals = {path: sha for path, sha in kept.items() if path in paths}
        with _transaction(target, "apply", steps) as txid:
            for step in steps:
                _write_atomic(target.state / ORIGINALS / step.path, current[step.path])
                originals[step.path] = step.before_sha256
            for step in steps:
                _write_atomic(paths[step.path], overlay[step.path], like=paths[step.path])
                _remove_bytecode(paths[step.path])
                _journal_done(target, step.path)
            _write_record(target.state, lock, originals, txid)
        for path in paths.values():  # also pycs left beside files that were patched already
            _remove_bytecode(path)
    outcome = "applied" if steps else "already applied"
    return _report("apply", outcome, target, lock, files, [repaired, *notes])


def _would_repair(command: str, target: Target, lock: Lock) -> Report:
    files = [
        FileState(e.path, _state_of(e, sha), sha)
        for e in lock.entries
        for sha in [_sha(_read(package_path(target, e.path)))]
    ]
    outcome = f"would repair an interrupted run, then {command}"
    return _report(command, outcome, target, lock, files)


def _plan_apply(
    target: Target, lock: Lock, paths: dict[str, Path], *, force: bool
) -> tuple[list[Step], list[FileState], list[str | None]]:
    record = read_record(target.state)
    if record is not None and record.lock != lock:
        for entry in record.lock.entries:
            saved = record.originals.get(entry.path, entry.pristine_sha256)
            if _sha(_read(package_path(target, entry.path))) != saved:
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
            notes.append(
                f"--force: overwrote {entry.path} (sha256 {sha[:12]}, {why});"
                " its bytes are kept for revert"
            )
        steps.append(Step(entry.path, sha, entry.patched_sha256))
        files.append(FileState(entry.path, state, sha, "patch"))
    if refused:
        raise HashMismatch(
            f"refusing to apply, nothing changed: {'; '.join(refused)}."
            " --force overwrites such files (the hash guard only), keeping their bytes for revert"
        )
    return steps, files, notes


def _overlay_files(lock: Lock, overlay_dir: Path) -> dict[str, bytes]:
    files = {}
    for entry in lock.entries:
        source = overlay_dir / entry.path
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
    """Restore the saved originals of what `apply` changed (its record's lock, else `lock`)."""
    _refuse_symlinked_state(target)
    record = read_record(target.state)
    applied = record.lock if record else lock
    _check_version(target, applied)
    pending = _pending(target)
    if dry_run and pending:
        return _would_repair("revert", target, applied)
    if not pending:
        steps, files, notes = _plan_revert(target, applied, record, force=force)
        if dry_run or (not steps and record is None):
            outcome = "would revert" if steps else "already pristine"
            return _report("revert", outcome, target, applied, files, notes)
    paths = [package_path(target, e.path) for e in applied.entries]
    _check_writable(_dirs_written(target, paths))
    with _locked(target):
        repaired = _recover(target)
        record = read_record(target.state)
        applied = record.lock if record else lock
        steps, files, notes = _plan_revert(target, applied, record, force=force)
        if steps:
            with _transaction(target, "revert", steps):
                for step in steps:
                    _put(target, step, want=step.after_sha256, other=step.before_sha256)
                    _journal_done(target, step.path)
                _forget(target)
        elif record is not None:
            _forget(target)
            notes.append("the files were pristine already: removed the stale record")
    outcome = "reverted" if steps else "already pristine"
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
        sha = _sha(_read(path))
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
    """ok only when the target holds exactly the overlay of `lock`."""
    _refuse_symlinked_state(target)
    problems: list[str | None] = []
    if target.version != lock.version:
        problems.append(
            f"{target.package} {target.version} is installed, the lock is for {lock.version}"
        )
    with _locked(target, shared=True) if (target.state / LOCK_FILE).exists() else nullcontext():
        if (target.state / JOURNAL).exists():
            problems.append("an interrupted run is pending (`overlay status` repairs it)")
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
        except ReadOnlyTarget as exc:
            notes.append(f"an interrupted run is pending and cannot be repaired: {exc}")
            ok = False
    record = read_record(target.state)
    files = []
    for entry in lock.entries:
        sha = _sha(_read(package_path(target, entry.path)))
        files.append(FileState(entry.path, _state_of(entry, sha), sha))
    states = {f.state for f in files}
    if target.version != lock.version:
        outcome, ok = f"other version (the lock is for {lock.version})", False
    elif states <= {"patched"}:
        outcome = "applied"
    elif states == {"pristine"}:
        outcome = "not applied"
    else:
        outcome, ok = ("partial" if states <= {"pristine", "patched"} else "modified"), False
    if record is not None and record.lock != lock:
        notes.append(f"the applied overlay's lock differs from this one ({record.lock.patches})")
    elif record is None and outcome == "applied":
        notes.append("no record of this apply: `overlay revert` cannot restore the originals")
    return _report("status", outcome, target, lock, files, notes, ok=ok)


# -- command line ------------------------------------------------------------------------------
def register_cli(osub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`overlay apply|verify|revert|status`, called by cli.build_parser."""
    helps = {
        "apply": "install the overlay into an installed vllm (every file or none)",
        "verify": "exit 0 only when the installed vllm holds exactly the overlay of the lock",
        "revert": "restore the files that apply replaced, byte for byte",
        "status": "what the installed vllm holds (repairs an interrupted apply first)",
    }
    for name, text in helps.items():
        p = osub.add_parser(name, help=text)
        where = p.add_mutually_exclusive_group()
        where.add_argument(
            "--target", type=Path, metavar="DIR", help="dir holding the vllm package"
        )
        where.add_argument("--python", metavar="EXE", help="the vllm of this interpreter")
        p.add_argument("--json", action="store_true", help="print the report as JSON")
        if name in ("apply", "revert"):
            p.add_argument("--dry-run", action="store_true", help="say what would change")
            p.add_argument(
                "--force",
                action="store_true",
                help="override the hash guard only: replace files that are neither pristine nor"
                " patched (apply keeps their bytes for revert)",
            )
        p.set_defaults(func=cmd_deploy)


def cmd_deploy(args: argparse.Namespace) -> int:
    from vllm_patchset.config import Project  # here: the guard imports this module, not tomllib

    project = Project.load(args.project, args.cache_dir)
    lock = Lock.load(project.lock_path)
    target = find_target(lock.package, target_dir=args.target, python=args.python)
    command = args.overlay_command
    try:
        if command == "apply":
            report = apply(
                target, lock, project.overlay_dir, dry_run=args.dry_run, force=args.force
            )
        elif command == "revert":
            report = revert(target, lock, dry_run=args.dry_run, force=args.force)
        elif command == "verify":
            report = verify(target, lock)
        else:
            report = status(target, lock)
    except OSError as exc:  # a failed write mid-run: _transaction has undone what it did
        raise Finding(
            f"{exc.strerror or exc}: {exc.filename}; no file was left half-written (a run"
            " that could not undo itself is repaired by the next apply, revert or status)"
        ) from None
    print(report.to_json() if args.json else report.text())
    return 0 if report.ok else 1
