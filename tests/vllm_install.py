"""A real vllm 0.24.0 wheel from PyPI, installed with `pip install --no-deps --target` once per
cache (env VLLM_PATCHSET_TEST_CACHE, else the session's tmp dir), every file checked against the
wheel's RECORD; tests get a copy of it (hard links: the tool only ever replaces files, and any
write in place would show as a RECORD mismatch in `record_mismatches`).

Imported by test_deploy.py and test_guard.py (fixtures defined here are used by name there).
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import committed, export_committed
from vllm_patchset.config import Project
from vllm_patchset.lock import Lock
from vllm_patchset.overlay import build_overlay

VERSION = "0.24.0"
# vllm ships Linux wheels only; their Python files are the same for every platform.
PLATFORM = "manylinux_2_28_x86_64"
TRITON_MOE = "vllm/model_executor/layers/fused_moe/experts/triton_moe.py"
NVFP4_EMU = "vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py"
LOCK_PATH = "overlay/overlay.lock.json"
# What the tests expect of the mechanics comes from the committed lock, so that a patch added
# to the series (or another file it touches) changes the expectations with it.
LOCK = Lock.from_json(committed(LOCK_PATH).decode(), f"HEAD:{LOCK_PATH}")
PATCHES = LOCK.patches  # the series, in order: every report and guard line names them all
OVERLAID = tuple(e.path for e in LOCK.entries)  # the lock's order (sorted), that of the reports
# Write points of an apply (see deploy._kill_point: two per file written): journal, then one
# original per file, then the files. Killed here, the first overlaid file has just been
# replaced and the others not: a journal is pending, nothing is committed.
KILLED_MID_APPLY = 2 + 2 * len(OVERLAID) + 2


@dataclass(frozen=True)
class Pristine:
    root: Path  # the pip --target dir
    record: dict[str, str]  # the wheel's RECORD: path -> sha256 hex (files with a hash)


@dataclass(frozen=True)
class Overlay:
    project: Project  # a session copy of this project, overlay built with build_overlay
    lock: Lock

    def patched(self, rel: str) -> bytes:
        return (self.project.overlay_dir / rel).read_bytes()


def _pip(*args: str, home: Path) -> None:
    # HOME and no cache: pip must write nothing outside the cache dir of the tests.
    env = {**os.environ, "HOME": str(home), "PIP_NO_CACHE_DIR": "1", "PIP_NO_INPUT": "1"}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    subprocess.run([sys.executable, "-m", "pip", *args], env=env, check=True, capture_output=True)


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
    wheels = cache_dir / "wheels"
    home = cache_dir / "pip-home"
    home.mkdir(parents=True, exist_ok=True)
    if not list(wheels.glob(f"vllm-{VERSION}-*.whl")):
        _pip("download", f"vllm=={VERSION}", "--no-deps", "--only-binary=:all:",
             "--platform", PLATFORM, "-d", str(wheels), home=home)  # fmt: skip
    wheel = next(wheels.glob(f"vllm-{VERSION}-*.whl"))
    root = cache_dir / "installed" / f"vllm-{VERSION}"
    if not root.exists():
        staging = root.with_name(f"{root.name}.{os.getpid()}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        _pip("install", "--no-deps", "--no-compile", "--target", str(staging), str(wheel),
             home=home)  # fmt: skip
        os.replace(staging, root)
    record = wheel_record(wheel)
    assert record_mismatches(root, record) == []
    return Pristine(root, record)


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
def pristine(cache_dir: Path) -> Pristine:
    return install_pristine(cache_dir)


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
    """Change a file the way an editor or pip would: a new file, never the shared inode."""
    path.unlink()
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
    return [sys.executable, "-m", "vllm_patchset", "--project", str(project.root),
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
