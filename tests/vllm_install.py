"""A real vllm 0.24.0 wheel from PyPI, installed with `pip install --no-deps --target` once per
cache (env VLLM_PATCHSET_TEST_CACHE, else the session's tmp dir), every file checked against the
wheel's RECORD.

The deploy tests work on the part of that install the tool reads and writes (`pristine`: the
package's `__init__.py` and `envs.py`, every file of each folder that holds an overlaid file,
the dist-info with its RECORD cut to those files) and on a wheel of that part (the wheel's own
files and hashes, for pip): the same bytes in about 40 files instead of 4,400, so that a copy
per test and a walk over it before and after cost little. `full_pristine` is the whole install.
Tests get a copy (hard links: the tool only ever replaces files, and any write in place would
show as a RECORD mismatch in `record_mismatches`).

The fixtures are registered for every test module by tests/conftest.py.
"""

from __future__ import annotations

import base64
import csv
import functools
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest
from killable import KILLABLE
from support import committed, export_committed, populating
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.build import build_overlay
from vllm_patchset.overlay.lock import Lock

VERSION = "0.24.0"
# vllm ships Linux wheels only; their Python files are the same for every platform.
PLATFORM = "manylinux_2_28_x86_64"
LOCK_PATH = "overlay/overlay.lock.json"
# What the tests expect of the mechanics comes from the committed lock, so that a patch added
# to the series (or another file it touches) changes the expectations with it.
LOCK = Lock.from_json(committed(LOCK_PATH).decode(), f"HEAD:{LOCK_PATH}")
PATCHES = LOCK.patches  # the series, in order: every report and guard line names them all
OVERLAID = tuple(e.path for e in LOCK.entries)  # the lock's order (sorted), that of the reports
# The files the overlay adds (no pristine file: no original saved, none once reverted), and the
# wheel's files it changes. (The series deletes no file.)
ADDED = tuple(e.path for e in LOCK.entries if e.pristine_sha256 is None)
CHANGED = tuple(rel for rel in OVERLAID if rel not in ADDED)
# The changed file the tests edit, damage or replace (the last in the lock's order), its
# module name, its folder; and the first one.
EDITED = CHANGED[-1]
EDITED_MODULE = PurePosixPath(EDITED).stem
EDITED_DIR = str(PurePosixPath(EDITED).parent)
FIRST = CHANGED[0]
# Write points of an apply (fsio.observed, tests/killable.py: two per file written): journal, then one
# original per changed file, then the files in the lock's order. Killed here, the first changed
# file (and any added before it) has just been written and the others not: a journal is
# pending, nothing is committed; REPLACED_MID_APPLY files had been written.
REPLACED_MID_APPLY = OVERLAID.index(FIRST) + 1
KILLED_MID_APPLY = 2 + 2 * len(CHANGED) + 2 * REPLACED_MID_APPLY
# All of an apply's: journal, originals, files, record; the record's replace (the last) commits.
APPLY_POINTS = 2 * (1 + len(CHANGED) + len(OVERLAID) + 1)
# A revert's: journal, the changed files restored (a file the overlay added is removed: no point).
REVERT_POINTS = 2 * (1 + len(CHANGED))


def replaced_at(point: int) -> int:
    """The files an apply stopped at write point `point` had replaced: the i-th (from 1) at the
    second point of its write, 2 + 2 * len(CHANGED) + 2 * i."""
    return min(max(point - 2 - 2 * len(CHANGED), 0) // 2, len(OVERLAID))


def restored_at(point: int) -> int:
    """The files a revert stopped at write point `point` had restored: each changed file at
    the second point of its write, a file the overlay added removed (no write point) right
    after the point before it."""
    done, last = 0, 2  # the journal's points
    for rel in OVERLAID:
        if rel in ADDED:
            done += point > last
        else:
            last += 2
            done += point >= last
    return done


# Besides the overlaid files' folders, the files of the package the tests damage.
SLIM_EXTRA = ("vllm/__init__.py", "vllm/envs.py")


@dataclass(frozen=True)
class Pristine:
    root: Path  # the pip --target dir
    record: dict[str, str]  # the wheel's RECORD: path -> sha256 hex (files with a hash)
    wheel: Path  # the wheel it was installed from


@dataclass(frozen=True)
class Overlay:
    project: Project  # a session copy of this project, overlay built with build_overlay
    lock: Lock

    def patched(self, rel: str) -> bytes:
        return (self.project.overlay_dir / rel).read_bytes()


def pip(*args: str, home: Path) -> None:
    # HOME and no cache: pip must write nothing outside the cache dir of the tests.
    env = {**os.environ, "HOME": str(home), "PIP_NO_CACHE_DIR": "1", "PIP_NO_INPUT": "1"}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run([sys.executable, "-m", "pip", *args], env=env, capture_output=True)
    if done.returncode != 0:
        raise AssertionError(f"pip {' '.join(args)} failed:\n{done.stderr.decode()[-3000:]}")


def wheel_record(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        rows = csv.reader(io.StringIO(archive.read(name).decode()))
        record = {}
        for path, digest, _size in rows:
            if digest:
                algo, _, b64 = digest.partition("=")
                assert algo == "sha256", digest
                record[path] = base64.urlsafe_b64decode(b64 + "==").hex()
        return record


@functools.cache
def install_pristine(cache_dir: Path) -> Pristine:
    with populating(cache_dir):
        return _install_pristine(cache_dir)


def _install_pristine(cache_dir: Path) -> Pristine:
    wheels = cache_dir / "wheels"
    home = cache_dir / "pip-home"
    home.mkdir(parents=True, exist_ok=True)
    if not list(wheels.glob(f"vllm-{VERSION}-*.whl")):
        pip("download", f"vllm=={VERSION}", "--no-deps", "--only-binary=:all:",
             "--platform", PLATFORM, "-d", str(wheels), home=home)  # fmt: skip
    wheel = next(wheels.glob(f"vllm-{VERSION}-*.whl"))
    root = cache_dir / "installed" / f"vllm-{VERSION}"
    record = wheel_record(wheel)
    if not root.exists():
        staging = root.with_name(f"{root.name}.{os.getpid()}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        pip("install", "--no-deps", "--no-compile", "--target", str(staging), str(wheel),
             home=home)  # fmt: skip
        assert record_mismatches(staging, record) == []
        os.replace(staging, root)
    return Pristine(root, record, wheel)


def slim_install(full: Pristine, folder: Path) -> Pristine:
    """The part of `full` the deploy tests touch, in `folder`/site (copies, and a RECORD
    of its own; the tests' own copies of it are hard links, in one file system), and a wheel of it in `folder` (the original wheel's members and RECORD rows);
    every file checked against the wheel's RECORD (an earlier run that wrote in place into the
    cached install would show here)."""
    dirs = {str(PurePosixPath(p).parent) for p in OVERLAID}
    info = f"vllm-{VERSION}.dist-info"
    kept = {
        p
        for p in full.record
        if p in SLIM_EXTRA or str(PurePosixPath(p).parent) in dirs or p.startswith(f"{info}/")
    }
    record = {p: full.record[p] for p in sorted(kept)}
    site = folder / "site"
    for rel in (*record, *(f"{info}/{n}" for n in ("INSTALLER", "REQUESTED"))):
        if (full.root / rel).exists():
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(full.root / rel, site / rel)
    installed = (full.root / info / "RECORD").read_text()
    (site / info / "RECORD").write_text(_record_rows(installed, (site / info).name, site))
    wheel = folder / full.wheel.name
    with zipfile.ZipFile(full.wheel) as src, zipfile.ZipFile(wheel, "w") as out:
        for name in sorted(kept):
            out.writestr(src.getinfo(name), src.read(name))
        out.writestr(
            f"{info}/RECORD", _record_rows(src.read(f"{info}/RECORD").decode(), info, None, kept)
        )
    slim = Pristine(site, record, wheel)
    assert record_mismatches(site, record) == []
    return slim


def _record_rows(text: str, info: str, site: Path | None, kept: set[str] | None = None) -> str:
    """The rows of a RECORD for the files kept (those in `site`, or in `kept`), itself last."""
    rows = []
    for row in csv.reader(io.StringIO(text)):
        path = row[0]
        if path == f"{info}/RECORD":
            continue
        if (kept is not None and path in kept) or (site is not None and (site / path).is_file()):
            rows.append(",".join(row))
    return "\n".join([*rows, f"{info}/RECORD,,"]) + "\n"


def record_mismatches(root: Path, record: dict[str, str]) -> list[str]:
    """Every file of the wheel compared with its RECORD sha256."""
    bad = []
    for path, sha in record.items():
        try:
            if hashlib.sha256((root / path).read_bytes()).hexdigest() != sha:
                bad.append(path)
        except FileNotFoundError:
            bad.append(f"{path} (missing)")
    return bad


@functools.cache
def build_session_overlay(root: Path, cache_dir: Path) -> Overlay:
    export_committed(("pyproject.toml", "patches", LOCK_PATH), root)
    project = Project.load(root, cache_dir)
    build_overlay(project, update_lock=True)
    return Overlay(project, Lock.load(project.lock_path))


@pytest.fixture(scope="session")
def full_pristine(cache_dir: Path) -> Pristine:
    """The whole installed wheel (read it; never give its files to the tool)."""
    return install_pristine(cache_dir)


@pytest.fixture(scope="session")
def pristine(full_pristine: Pristine, tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    """The part of the installed wheel the deploy tests touch, and a wheel of it."""
    return slim_install(full_pristine, tmp_path_factory.mktemp("slim-vllm"))


@pytest.fixture(scope="session")
def overlay(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Overlay:
    return build_session_overlay(tmp_path_factory.getbasetemp() / "deploy-project", cache_dir)


@pytest.fixture
def target(pristine: Pristine, tmp_path: Path) -> Path:
    """A fresh copy of the installed vllm (the dir that holds `vllm/`)."""
    dest = tmp_path / "site"
    shutil.copytree(pristine.root, dest, copy_function=os.link, symlinks=True)
    return dest


def tree_state(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under root: files by (inode, size, mtime, mode), links by their target.

    Files are hard links to the cached install: a file that was rewritten or replaced shows up
    as a new inode, so two equal states mean nothing under root changed."""
    state: dict[str, tuple[object, ...]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                state[rel] = ("link", os.readlink(path))
            elif name in dirs:
                state[rel] = ("dir", info.st_mode)
            else:
                state[rel] = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_mode)
    return state


def replace_file(path: Path, data: bytes) -> None:
    """Change a file the way an editor or pip would: a new file, never the shared inode (or
    a file where there is none: one the overlay adds)."""
    path.unlink(missing_ok=True)
    path.write_bytes(data)


@contextmanager
def read_only(root: Path) -> Iterator[list[str]]:
    """Yield a command prefix that runs a command with `root` read-only.

    Root ignores permission bits, so as root: a read-only bind mount in a private mount
    namespace (EROFS, as on a read-only image layer). Otherwise: every dir made 0o555."""
    if os.geteuid() == 0:
        if shutil.which("unshare") is None:
            pytest.skip("running as root without unshare(1): no way to make a read-only target")
        script = 'mount --bind -o ro "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"'
        yield ["unshare", "--mount", "sh", "-c", script, str(root)]
        return
    dirs = [root] + [Path(d) / n for d, names, _ in os.walk(root) for n in names]
    for d in dirs:
        d.chmod(0o555)
    try:
        yield []
    finally:
        for d in dirs:
            d.chmod(0o755)


def cli_command(overlay: Overlay, *args: str) -> list[str]:
    project = overlay.project
    return [*KILLABLE, "--project", str(project.root),
            "--cache-dir", str(project.cache_dir), "overlay", *args]  # fmt: skip


def run_cli(overlay: Overlay, *args: str, prefix: tuple[str, ...] | list[str] = (),
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        [*prefix, *cli_command(overlay, *args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def journal_path(target: Path) -> Path:
    return target / ".vllm-patchset" / "journal.jsonl"


def record_doc(target: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((target / ".vllm-patchset" / "applied.json").read_text())
    return data


def by_patch_of(states: Mapping[str, str]) -> list[str]:
    """The per-patch lines of `overlay status` with each overlaid file in its state (path ->
    state): a patch is applied when all its files are patched, partly when some are."""
    lines = ["  by patch (the lock's map of files to patches):"]
    for patch in PATCHES:
        found = {states[e.path] for e in LOCK.entries if patch in e.patches}
        state = (
            "applied" if found == {"patched"} else "partly" if "patched" in found else "not applied"
        )
        lines.append(f"    {state:11} {patch}")
    return lines


def by_patch(state: str) -> list[str]:
    """The per-patch lines of `overlay status` with every patch of the series in `state`."""
    return [
        "  by patch (the lock's map of files to patches):",
        *(f"    {state:11} {p}" for p in PATCHES),
    ]
