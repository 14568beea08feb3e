"""Helpers shared by the tests (imported by name: `from support import ...`; a module of its
own, since tests/ and tests/gpu/ each have a conftest.py)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import io
import json
import os
import signal
import stat
import subprocess
import tarfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_patchset.cli import main
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.upstream import Mirror
from vllm_patchset.series.patches import Patch, Trailers

if TYPE_CHECKING:
    import pytest
    from vllm_patchset.infra.config import Project

REPO = Path(__file__).resolve().parent.parent
# Ctrl-C and kill, each with the exit status of a run they stop (128 + the signal).
STOPPED = [(signal.SIGINT, 130), (signal.SIGTERM, 143)]
PROJECT_FILES = (
    "pyproject.toml",
    "patches",
    "overlay/overlay.lock.json",
    "CHANGELOG.md",
    ".github/workflows/gpu-validation.yml",
    ".buildkite/gpu-validation.yml",
)
NIGHTLY_LINE_FIXED = "kE2M1ToFloat_handle.val = kE2M1ToFloat_handle.val.to(w13.device)"
NIGHTLY_LINE_BUGGY = "kE2M1ToFloat_handle.val = kE2M1ToFloat_handle.val.to(layer.weight.device)"
ORACLE = "vllm/model_executor/layers/fused_moe/oracle/nvfp4.py"


# pip's own settings on this machine (its CA bundle, a trusted host, its config file, its
# index), read when the tests start: conftest.py's autouse fixture clears them for the tool
# under test (each case gives its own), but a test that downloads with the real pip (the tool's
# dependency wheels, tests/test_pack.py) needs the machine's, as a user's pip has them.
PIP_SETTINGS = (
    "PIP_CERT",
    "PIP_CLIENT_CERT",
    "PIP_TRUSTED_HOST",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "SSL_CLIENT_CERT",
    "PIP_CONFIG_FILE",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
)
MACHINE_PIP = {name: os.environ[name] for name in PIP_SETTINGS if name in os.environ}


def machine_pip_env() -> dict[str, str]:
    """The current environment with pip's settings as the machine had them."""
    env = {k: v for k, v in os.environ.items() if k not in PIP_SETTINGS}
    return {**env, **MACHINE_PIP}


@contextlib.contextmanager
def populating(cache_dir: Path) -> Iterator[None]:
    """One filler of the shared test cache at a time (pytest-xdist's workers, or two sessions):
    an exclusive flock(2) on `cache_dir/.populate.lock`, held while a fixture downloads into the
    cache or checks that an earlier one did; the next one waits, then finds it filled."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".populate.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def git(
    cwd: Path, *args: str, env: dict[str, str] | None = None, input: bytes | None = None
) -> str:
    full_env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        # Fixed dates: a test's commit ids are the same every run (CI once failed on an id
        # that only one run in a hundred makes).
        "GIT_AUTHOR_DATE": "2026-06-27T00:00:00+00:00",
        "GIT_COMMITTER_DATE": "2026-06-27T00:00:00+00:00",
        **(env or {}),
    }
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=full_env, check=True, capture_output=True, input=input
    )
    return done.stdout.decode()


@functools.cache
def committed(path: str, repo: Path = REPO) -> bytes:
    """The bytes of `path` at HEAD of `repo`. Tests read the committed tree, never the working
    tree: the suite gives the same results while uncommitted edits (a rebase under review) sit
    in the checkout."""
    return _git_bytes(repo, "show", f"HEAD:{path}")


def export_committed(paths: Iterable[str], dest: Path, repo: Path = REPO) -> None:
    """The files and folders `paths` as committed at HEAD of `repo`, written under `dest`
    (those HEAD does not have are left out)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(_archive(repo, tuple(paths)))) as archive:
        archive.extractall(dest, filter="data")


def with_gpu_tests(project: Project) -> Project:
    """The project with this project's committed tests/gpu (what validate ships and runs)."""
    export_committed(["tests/gpu"], project.root)
    return project


@functools.cache
def _archive(repo: Path, paths: tuple[str, ...]) -> bytes:
    """A tar of `paths` at HEAD (once per session: HEAD does not move while the tests run)."""
    present = _git_bytes(repo, "ls-tree", "-r", "--name-only", "-z", "HEAD", "--", *paths)
    files = [name for name in present.decode().split("\0") if name]
    return _git_bytes(repo, "archive", "--format=tar", "HEAD", "--", *files)


def _git_bytes(cwd: Path, *args: str) -> bytes:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"the tests read the project as committed in {cwd} (git {' '.join(args[:2])}"
            f" failed: {done.stderr.decode(errors='replace').strip()}): run them in a git"
            " checkout"
        )
    return done.stdout


def make_upstream_repo(mirror: Mirror, version: str, path: Path, edits: dict[str, bytes]) -> Path:
    """A bare git repository holding vLLM `version` (the files of its PyPI sdist) as tag
    v<version>, and those files with `edits` (path -> new bytes) as tag `nightly` on top. Made
    from the mirror's objects: no checkout of thousands of files."""
    release = mirror.release(version)
    git(path.parent, "init", "-q", "--bare", "--template=", str(path))
    git(path, "fetch", "-q", str(mirror.repo.path), f"refs/tags/v{version}")
    tree = git(path, "rev-parse", f"{release.commit}^{{tree}}").strip()
    # Fixed dates: the same commits every session (the mirror keeps a tag per commit fetched).
    dated = {"GIT_AUTHOR_DATE": "2026-06-27T00:00:00+00:00"}
    dated["GIT_COMMITTER_DATE"] = dated["GIT_AUTHOR_DATE"]
    base = git(path, "commit-tree", tree, "-m", f"vllm {version}", env=dated).strip()
    git(path, "tag", f"v{version}", base)
    index = {"GIT_INDEX_FILE": str(path / "nightly.index")}
    git(path, "read-tree", tree, env=index)
    for rel, data in edits.items():
        blob = git(path, "hash-object", "-w", "--stdin", input=data).strip()
        git(path, "update-index", "--cacheinfo", f"100644,{blob},{rel}", env=index)
    edited = git(path, "write-tree", env=index).strip()
    (path / "nightly.index").unlink()
    nightly = git(path, "commit-tree", edited, "-p", base, "-m", "nightly", env=dated).strip()
    git(path, "tag", "nightly", nightly)
    return path


_SHA256: dict[tuple[int, int, int, int], str] = {}


def snapshot(root: Path, *, skip_git: bool = False) -> dict[str, tuple[object, ...]]:
    """Every entry under `root` by its relative path: ("file", mode, sha256), ("dir", mode),
    ("link", target), or (the kind, mode) for a FIFO, socket or device. Symlinks are not
    followed. With `skip_git`, a `.git` dir is left out (git refreshes its own index).

    A file's sha256 is computed once per (device, inode, size, mtime): the installed vllm that
    every test copies is 6,000 hard links to the same files. (Not ctime: each copy's new
    links change it.)"""
    found: dict[str, tuple[object, ...]] = {}
    for folder, dirs, files in os.walk(root):
        if skip_git and ".git" in dirs:
            dirs.remove(".git")
        for name in dirs + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            rel = os.path.relpath(path, root)
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                found[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = ("dir", mode)
            elif stat.S_ISREG(info.st_mode):
                key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
                if key not in _SHA256:
                    with open(path, "rb") as handle:
                        _SHA256[key] = hashlib.file_digest(handle, "sha256").hexdigest()
                found[rel] = ("file", mode, _SHA256[key])
            else:
                found[rel] = (stat.S_IFMT(info.st_mode), mode)
    return found


# -- a project's layout, for the unit tests of what reads its paths ----------------------------------
def project_at(root: Path, pin: str = "1.0") -> Project:
    """The project a checkout at `root` with the default layout is (nothing read from disk)."""
    patches = root / "patches"
    return Project(
        root=root,
        pin=pin,
        package="vllm",
        index_url="",
        series_file=patches / "series",
        upstreamed_file=patches / "upstreamed" / "series",
        parked_file=patches / "parked" / "series",
        overlay_dir=root / "overlay",
        lock_path=root / "overlay" / "overlay.lock.json",
        cache_dir=root / "cache",
    )


def bare_patch(key: str, upstream_pr: str = "https://github.com/vllm-project/vllm/pull/1") -> Patch:
    """A patch under patches/ at `key` whose trailers say `upstream_pr` (its other trailers
    filled, no files, no bytes): for the rules that read a patch's name and trailers only."""
    trailers = Trailers(upstream_pr, "y", "1.0", "", ("tests/t.py::t",))
    return Patch(key.rpartition("/")[2], key, Path(key), "x", trailers, (), b"")


# -- the command line, as a test runs it -----------------------------------------------------------
def cli(capsys: pytest.CaptureFixture[str], root: Path, *args: str | Path) -> tuple[int, str, str]:
    code = main(["--project", str(root), *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def rebase_json(
    capsys: pytest.CaptureFixture[str], root: Path, *args: str, code: int = 0
) -> dict[str, object]:
    got, out, err = cli(capsys, root, "rebase", *args, "--json")
    assert (got, err) == (code, ""), err
    doc: dict[str, object] = json.loads(out)
    return doc


def child_starter(folder: Path) -> Path:
    """An executable standing for an interpreter that runs a GPU job (pytest, an engine): it
    starts a child, as such a job starts its own processes, writes both pids into
    ``folder/pids`` (``started``) and waits."""
    pids = folder / "pids"
    pids.mkdir()
    script = folder / "python"
    script.write_text(
        f"#!/bin/sh\nsleep 60 &\necho $! > {pids}/child\necho $$ > {pids}/job\nwait\n"
    )
    script.chmod(0o755)
    return script


def started(folder: Path, wait_s: float = 30) -> list[int]:
    """The pids ``child_starter``'s job wrote in ``folder/pids``, once both are there."""
    pids = folder / "pids"
    deadline = time.monotonic() + wait_s
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return [int(p.read_text()) for p in sorted(pids.iterdir())]


def still_running(pids: list[int], wait_s: float = 5) -> list[int]:
    """Those of ``pids`` still running after up to ``wait_s`` (a SIGKILL takes a moment to
    land); a zombie (killed, its parent gone, no init here that reaps it) is not running."""

    def running(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + wait_s
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if running(pid)]


def kill_all(pids: list[int]) -> None:
    """A test's cleanup: SIGKILL whatever of ``pids`` is left."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def to_closed_pipe(argv: list[str], timeout: float = 120) -> tuple[int, str]:
    """Run ``argv`` as ``ARGV | head -0`` runs it: its stdout a pipe whose reader is gone before
    the first line, the environment without PYTHONUNBUFFERED, as a user's (a pipe buffers: the
    write error may come at exit). Its exit status and stderr."""
    read, write = os.pipe()
    os.close(read)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        done = subprocess.run(
            argv, stdout=write, stderr=subprocess.PIPE, text=True, env=env, timeout=timeout
        )
    finally:
        os.close(write)
    return done.returncode, done.stderr
