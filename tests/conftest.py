"""Shared fixtures: real vLLM releases from PyPI (cached once per test session), real git repos,
and a guard that makes writes to the real $HOME or site-packages fail."""

from __future__ import annotations

import os
import shutil
import site
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kits import kit, wheel
from support import (
    NIGHTLY_LINE_BUGGY,
    NIGHTLY_LINE_FIXED,
    ORACLE,
    PROJECT_FILES,
    REPO,
    export_committed,
    git,
    make_upstream_repo,
    populating,
)
from synthetic import Story, make_story
from vllm_install import full_pristine, overlay, pristine, target
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.upstream import Mirror

# The real vLLM wheel's fixtures and the small kit's, for every test module.
__all__ = ["full_pristine", "kit", "overlay", "pristine", "target", "wheel"]

# Test directories in memory where the machine has a tmpfs with room (pyproject.toml has pytest
# remove a passing test's folder when it ends, and keep only the last failing session's): a
# session writes and removes some 70,000 files, which costs a disk (ext4 mounted with `discard`
# here) about 30 s. PYTEST_DEBUG_TEMPROOT, when set, wins.
TMPFS = Path("/dev/shm")
TMPFS_ROOM = 4 << 30


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # a pytest-xdist worker: its controller did both
        _temp_root_in_memory()
        _bytecode_for_children()
    _own_bytecode_settings()


def _temp_root_in_memory() -> None:
    if "PYTEST_DEBUG_TEMPROOT" in os.environ or not os.access(TMPFS, os.W_OK | os.X_OK):
        return
    with open("/proc/mounts") as mounts:
        tmpfs = any(line.split()[1:3] == [str(TMPFS), "tmpfs"] for line in mounts)
    if tmpfs and shutil.disk_usage(TMPFS).free >= TMPFS_ROOM:
        os.environ["PYTEST_DEBUG_TEMPROOT"] = str(TMPFS)


# The suite starts some 250 Python processes (the tool in a process of its own, pytest-xdist's
# workers). Where PYTHONDONTWRITEBYTECODE is set, as on the machine the suite is timed on, each
# compiled the tool's modules again (0.25 s of CPU a process): those processes write their
# bytecode to the test cache instead (PYTHONPYCACHEPREFIX), never beside a source or in
# site-packages, and the bytecode of the session's temporary files is removed at its end. The
# tests' own process keeps the settings it was started with: the stale-bytecode tests place
# .pyc files where a plain Python looks for them (importlib.util.cache_from_source).
ORIGINAL_BYTECODE = "VLLM_PATCHSET_TEST_DONTWRITEBYTECODE"


def _bytecode_for_children() -> None:
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or "PYTHONPYCACHEPREFIX" in os.environ:
        return
    os.environ[ORIGINAL_BYTECODE] = os.environ.pop("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONPYCACHEPREFIX"] = str(test_cache_dir() / "pycache")


def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or ORIGINAL_BYTECODE not in os.environ:
        return
    prefix = Path(os.environ["PYTHONPYCACHEPREFIX"])
    for temp in {tempfile.gettempdir(), os.environ.get("PYTEST_DEBUG_TEMPROOT")} - {None}:
        shutil.rmtree(prefix / Path(str(temp)).resolve().relative_to("/"), ignore_errors=True)


def _own_bytecode_settings() -> None:
    """The tests' process takes their own settings back (a worker, or a suite a test starts,
    is started with the children's)."""
    if ORIGINAL_BYTECODE in os.environ:
        sys.dont_write_bytecode = True
        sys.pycache_prefix = None


_REAL_HOME = Path(os.path.expanduser("~")).resolve()
_PROTECTED = tuple(
    {Path(p).resolve() for p in (*site.getsitepackages(), sysconfig.get_paths()["purelib"])}
    | {_REAL_HOME}
)
_guard_active = False


def _audit(event: str, args: tuple[object, ...]) -> None:
    """Refuse writes to the real $HOME and site-packages while a test runs."""
    if not _guard_active or event != "open":
        return
    path, mode = args[0], args[1]
    if not isinstance(path, str | bytes | os.PathLike) or not isinstance(mode, str):
        return
    if not any(flag in mode for flag in "wax+"):
        return
    target = Path(os.fsdecode(path)).resolve()
    for protected in _PROTECTED:
        if target.is_relative_to(protected) and not target.is_relative_to(REPO):
            raise PermissionError(f"test tried to write {target} (under {protected})")


sys.addaudithook(_audit)


# pip's, requests' and uv's TLS settings (a CA bundle, a client certificate, a trusted host):
# `status --verbose` names them; SSL_CERT_FILE and SSL_CERT_DIR stay (Python's own defaults).
TLS_SETTINGS = (
    "PIP_CERT",
    "PIP_CLIENT_CERT",
    "PIP_TRUSTED_HOST",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "SSL_CLIENT_CERT",
    "UV_INSECURE_HOST",
)


@pytest.fixture(autouse=True)
def _no_writes_to_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    global _guard_active
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.delenv("VLLM_PATCHSET_CACHE", raising=False)
    # The machine's index settings (a CI's PIP_INDEX_URL, a pip.conf, a netrc) are each case's
    # to give: none is read unless a test sets it (infra/indexsettings.py reads them all).
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL", "NETRC", *TLS_SETTINGS):
        monkeypatch.delenv(name, raising=False)
    # Reports fit the terminal ($COLUMNS, else 80 when piped): the exact texts of the tests are
    # a wide terminal's, whose lines a temporary path of any length does not break;
    # tests/test_terminal.py runs every report in 80 columns.
    monkeypatch.setenv("COLUMNS", "1000")
    _guard_active = True
    try:
        yield
    finally:
        _guard_active = False


@pytest.fixture
def triton_cache(cache_dir: Path) -> Iterator[None]:
    """Triton's cache under the test cache (never $HOME): for the tests that compile kernels
    (a warm cache compiles nothing)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_CACHE_DIR", str(cache_dir / "triton"))
        patch.setenv("TRITON_HOME", str(cache_dir / "triton-home"))
        yield


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The upstream mirror and downloads for the whole session, kept from one session to the
    next: $VLLM_PATCHSET_TEST_CACHE, else `.cache/test-upstream` in the checkout (git-ignored),
    so that the README's test command downloads each release once."""
    cache = test_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def test_cache_dir() -> Path:
    return Path(os.environ.get("VLLM_PATCHSET_TEST_CACHE") or REPO / ".cache" / "test-upstream")


# Every release a test reads, fetched once before the first test: a test's exact stderr must
# not depend on whether an earlier test already downloaded the release it uses.
RELEASES = ("0.20.2", "0.21.0", "0.23.0", "0.24.0", "0.25.0", "0.33.0")


@pytest.fixture(scope="session")
def mirror(cache_dir: Path) -> Mirror:
    mirror = Mirror(cache_dir)
    with populating(cache_dir):
        for version in RELEASES:
            mirror.release(version)
    return mirror


@pytest.fixture(scope="session")
def project_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This project's patch set as committed (HEAD, not the working tree), in a git repo."""
    root = tmp_path_factory.mktemp("project-template") / "project"
    export_committed(PROJECT_FILES, root)
    git(root, "init", "-q", "--template=", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "project")
    return root


@pytest.fixture
def project(
    tmp_path: Path,
    cache_dir: Path,
    mirror: Mirror,
    project_template: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Project:
    """A copy of this project's committed patch set in a fresh git repo, using the session's
    mirror (also for the CLI, through VLLM_PATCHSET_CACHE)."""
    monkeypatch.setenv("VLLM_PATCHSET_CACHE", str(cache_dir))
    root = tmp_path / "project"
    shutil.copytree(project_template, root, symlinks=True)
    return Project.load(root, cache_dir)


@pytest.fixture
def synthetic_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A mirror for synthetic upstreams (tests/synthetic.py), shared by the session: no
    network, no real release. The CLI finds it through VLLM_PATCHSET_CACHE."""
    path = tmp_path_factory.getbasetemp() / "synthetic-cache"
    path.mkdir(exist_ok=True)
    monkeypatch.setenv("VLLM_PATCHSET_CACHE", str(path))
    return path


@pytest.fixture(scope="session")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    """The synthetic story most tests of the mechanics share (tests/synthetic.py): built once,
    its index served for the whole session."""
    built = make_story(tmp_path_factory.mktemp("story"))
    with built.index:
        yield built


@pytest.fixture
def tiny(story: Story, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    """A copy of the story's committed project (pin 1.0; patches 0001 and 0002 in the series,
    upstreamed/0001 archived), using the story's mirror (also for the CLI)."""
    monkeypatch.setenv("VLLM_PATCHSET_CACHE", str(story.cache))
    root = tmp_path / "project"
    shutil.copytree(story.project, root, symlinks=True)
    return Project.load(root, story.cache)


@pytest.fixture(scope="session")
def nightly_repo(mirror: Mirror, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The nightly-like base: v0.21.0 with vLLM PR #41630's one line reverted (tag `nightly`;
    tag v0.21.0 is the release)."""
    release = mirror.release("0.21.0")
    oracle = mirror.repo.read_blob(release.commit, ORACLE)
    assert oracle is not None and oracle.decode().count(NIGHTLY_LINE_FIXED) == 1
    buggy = oracle.decode().replace(NIGHTLY_LINE_FIXED, NIGHTLY_LINE_BUGGY).encode()
    path = tmp_path_factory.mktemp("nightly") / "vllm.git"
    return make_upstream_repo(mirror, "0.21.0", path, {ORACLE: buggy})
