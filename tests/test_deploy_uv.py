"""`overlay status | verify | diff | apply | revert` on a vllm installed by a real uv, in both of
the link modes that share files with uv's cache: `--link-mode symlink` (every file a link into
the cache: read through, never written, apply refuses) and `--link-mode copy` (the round trip;
uv's cache byte for byte as it was). The install is the slim wheel of tests/vllm_install.py
(about 40 files), with UV_CACHE_DIR in the session's tmp dir."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from vllm_install import (
    EDITED,
    FIRST,
    OVERLAID,
    PATCHES,
    Overlay,
    Pristine,
    by_patch,
    record_mismatches,
)
from vllm_patchset.cli import main
from vllm_patchset.deploy import guard

UV = shutil.which("uv", path=os.path.dirname(sys.executable)) or shutil.which("uv")
pytestmark = pytest.mark.skipif(UV is None, reason="uv is not installed (the dev extra has it)")

INFO = "vllm-0.24.0.dist-info"
Cli = Callable[..., tuple[int, str, str]]


def uv_install(pristine: Pristine, folder: Path, mode: str) -> tuple[Path, Path]:
    """`uv pip install --link-mode MODE --target` of the slim wheel: (the target, uv's cache)."""
    cache, site = folder / "uv-cache", folder / "site"
    env = {**os.environ, "UV_CACHE_DIR": str(cache), "UV_NO_CONFIG": "1", "UV_OFFLINE": "1"}
    subprocess.run(
        [str(UV), "pip", "install", "--no-deps", "--link-mode", mode, "--target", str(site),
         str(pristine.wheel)],
        env=env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return site, cache


def cache_state(cache: Path) -> dict[str, str]:
    """Every file of uv's cache by its sha256 (links by their target)."""
    state = {}
    for folder, _dirs, files in os.walk(cache):
        for name in files:
            path = Path(folder, name)
            rel = str(path.relative_to(cache))
            if path.is_symlink():
                state[rel] = f"link {os.readlink(path)}"
            else:
                state[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return state


@pytest.fixture(scope="module")
def linked(pristine: Pristine, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return uv_install(pristine, tmp_path_factory.mktemp("uv-symlink"), "symlink")


@pytest.fixture
def cli(overlay: Overlay, capsys: pytest.CaptureFixture[str]) -> Cli:
    def run(*args: str) -> tuple[int, str, str]:
        argv = [
            "--project",
            str(overlay.project.root),
            "--cache-dir",
            str(overlay.project.cache_dir),
        ]
        code = main([*argv, "overlay", *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def header(command: str, outcome: str, target: Path) -> str:
    series = ", ".join(PATCHES)
    return f"overlay {command}: {outcome} ({target}/vllm, 0.24.0; overlay for 0.24.0: {series})"


def test_symlinked_install_is_read_through_and_never_written(
    cli: Cli, linked: tuple[Path, Path], overlay: Overlay
) -> None:
    site, cache = linked
    edited = site / EDITED
    assert edited.is_symlink() and (site / INFO / "METADATA").is_symlink()  # uv's symlink mode
    before = cache_state(cache)
    t = str(site)

    assert cli("status", "--target", t) == (
        0,
        "\n".join(
            [
                header("status", "not applied", site),
                *(f"  pristine   {r}" for r in OVERLAID),
                *by_patch("not applied"),
            ]
        )
        + "\n",
        "",
    )
    code, out, err = cli("verify", "--target", t)
    assert (code, out.splitlines()[0], err) == (1, header("verify", "NOT verified", site), "")
    code, diff, err = cli("diff", "--target", t)
    assert code == 0 and f"--- a/{EDITED}\n+++ b/{EDITED}\n" in diff

    refusal = (
        f"vllm-patchset: refusing to apply, nothing changed: {site / FIRST} is a symlink"
        f" (to {os.readlink(site / FIRST)}), as `uv pip install --link-mode symlink`"
        " installs; reinstall vllm with `--link-mode copy` (or hardlink) to apply the overlay\n"
    )
    assert cli("apply", "--target", t) == (1, "", refusal)
    assert cli("apply", "--target", t, "--dry-run") == (1, "", refusal)
    # The guard reads the links through as well.
    assert guard.check(site) == (
        False,
        f"vllm-patchset: NO overlay applied to vllm 0.24.0 at {site}/vllm: its fixes are NOT"
        " active (run `vllm-patchset overlay apply`)",
    )
    assert cli("revert", "--target", t)[:2] == (
        0,
        "\n".join(
            [header("revert", "already pristine", site), *(f"  pristine   {r}" for r in OVERLAID)]
        )
        + "\n",
    )
    assert cache_state(cache) == before
    assert edited.is_symlink() and not (site / ".vllm-patchset").exists()


def test_copied_install_round_trip_leaves_uv_cache_intact(
    cli: Cli, pristine: Pristine, overlay: Overlay, tmp_path: Path
) -> None:
    site, cache = uv_install(pristine, tmp_path, "copy")
    before = cache_state(cache)
    t = str(site)
    assert cli("apply", "--target", t)[:2] == (
        0,
        "\n".join([header("apply", "applied", site), *(f"  patch      {r}" for r in OVERLAID)])
        + "\n",
    )
    assert [(site / r).read_bytes() == overlay.patched(r) for r in OVERLAID] == [True] * len(
        OVERLAID
    )
    assert cli("verify", "--target", t)[0] == 0
    assert cli("revert", "--target", t)[:2] == (
        0,
        "\n".join([header("revert", "reverted", site), *(f"  restore    {r}" for r in OVERLAID)])
        + "\n",
    )
    assert record_mismatches(site, pristine.record) == []
    assert cache_state(cache) == before
