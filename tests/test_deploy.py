"""`overlay apply | verify | revert | status` on a real vllm 0.24.0 (the PyPI wheel, installed
with pip --target), with the overlay built by `build_overlay`: the round trip, every guard,
killed runs, concurrent runs and stale bytecode. Each fault case asserts the exit code, the
message and what the files hold afterwards."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import os
import py_compile
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest
from killable import KILL_ENV
from vllm_install import (
    ADDED,
    APPLY_POINTS,
    CHANGED,
    EDITED,
    EDITED_DIR,
    EDITED_MODULE,
    FIRST,
    KILLED_MID_APPLY,
    LOCK,
    OVERLAID,
    PATCHES,
    REVERT_POINTS,
    Overlay,
    Pristine,
    by_patch,
    cli_command,
    journal_path,
    read_only,
    record_doc,
    record_mismatches,
    replace_file,
    replaced_at,
    restored_at,
    run_cli,
    tree_state,
)
from vllm_patchset.cli import main
from vllm_patchset.deploy import guard
from vllm_patchset.infra.fsio import LOCK_TIMEOUT_ENV
from vllm_patchset.overlay.lock import Lock, LockEntry

N = len(OVERLAID)
STATE = ".vllm-patchset"

Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(overlay: Overlay, capsys: pytest.CaptureFixture[str]) -> Cli:
    """`vllm-patchset overlay ARGS` in this process: (exit code, stdout, stderr)."""

    def run(*args: str, project: Path | None = None) -> tuple[int, str, str]:
        root = project or overlay.project.root
        argv = ["--project", str(root), "--cache-dir", str(overlay.project.cache_dir)]
        code = main([*argv, "overlay", *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def header(command: str, outcome: str, target: Path) -> str:
    series = ", ".join(PATCHES)
    return f"overlay {command}: {outcome} ({target}/vllm, 0.24.0; overlay for 0.24.0: {series})"


def assert_pristine(target: Path, pristine: Pristine) -> None:
    for rel in CHANGED:
        assert (target / rel).read_bytes() == (pristine.root / rel).read_bytes(), rel
    assert [rel for rel in ADDED if (target / rel).exists()] == []
    assert not journal_path(target).exists()


def assert_patched(target: Path, overlay: Overlay) -> None:
    for rel in OVERLAID:
        assert (target / rel).read_bytes() == overlay.patched(rel), rel
    assert not journal_path(target).exists()


def originals(pristine: Pristine) -> dict[str, str]:
    """The record's originals once applied: the wheel's sha256 of each changed file, "" (no
    file) for each added one."""
    return {rel: pristine.record[rel] if rel in CHANGED else "" for rel in OVERLAID}


def no_temp_files(target: Path) -> bool:
    return not [p for p in target.rglob("*vllm-patchset-tmp")]


def project_with_lock(tmp_path: Path, overlay: Overlay, lock: Lock) -> Path:
    """A project like the session's, with another lock (and the same overlay files)."""
    root = tmp_path / "other-project"
    shutil.copytree(overlay.project.root, root, ignore=shutil.ignore_patterns(".git"))
    (root / "overlay" / "overlay.lock.json").write_text(lock.to_json())
    return root


# -- the round trip ----------------------------------------------------------------------------
def test_apply_verify_reapply_revert_round_trip(
    cli: Cli, target: Path, overlay: Overlay, pristine: Pristine
) -> None:
    assert overlay.lock == LOCK  # what is deployed is the committed lock the expectations follow
    t = str(target)
    assert cli("status", "--target", t) == (
        0,
        "\n".join(
            [
                header("status", "not applied", target),
                *(f"  pristine   {rel}" for rel in OVERLAID),
                *by_patch("not applied"),
            ]
        )
        + "\n",
        "",
    )
    code, out, _ = cli("verify", "--target", t)
    assert code == 1 and out.splitlines()[0] == header("verify", "NOT verified", target)

    untouched = tree_state(target)
    code, out, _ = cli("apply", "--target", t, "--dry-run")
    assert (code, out.splitlines()[0]) == (0, header("apply", "would apply", target))
    assert tree_state(target) == untouched

    assert cli("apply", "--target", t) == (
        0,
        "\n".join(
            [header("apply", "applied", target), *(f"  patch      {rel}" for rel in OVERLAID)]
        )
        + "\n",
        "",
    )
    assert_patched(target, overlay)
    for rel in CHANGED:
        assert (target / STATE / "originals" / rel).read_bytes() == (
            pristine.root / rel
        ).read_bytes()
        assert (target / rel).stat().st_mode == (pristine.root / rel).stat().st_mode
    for rel in ADDED:  # no original: the file was not there
        assert not (target / STATE / "originals" / rel).exists()
        assert (target / rel).stat().st_mode & 0o777 == 0o644
    assert sorted(os.listdir(target / STATE)) == ["applied.json", "lock", "originals"]
    doc = record_doc(target)
    assert doc["lock"] == json.loads(overlay.lock.to_json())
    assert doc["originals"] == originals(pristine)

    code, out, err = cli("verify", "--target", t)
    assert (code, out.splitlines()[0], err) == (0, header("verify", "verified", target), "")
    code, out, _ = cli("status", "--target", t, "--json")
    assert (code, json.loads(out)["outcome"]) == (0, "applied")

    applied = tree_state(target)
    code, out, _ = cli("apply", "--target", t)
    assert (code, out.splitlines()[0]) == (0, header("apply", "already applied", target))
    assert tree_state(target) == applied  # no-op: not one file rewritten

    code, out, _ = cli("revert", "--target", t, "--dry-run")
    assert (code, out.splitlines()[0]) == (0, header("revert", "would revert", target))
    assert tree_state(target) == applied

    code, out, err = cli("revert", "--target", t)
    assert (code, out.splitlines()[0], err) == (0, header("revert", "reverted", target), "")
    # byte-identical to the wheel, every file; nothing else left, not even the state dir
    assert record_mismatches(target, pristine.record) == []
    assert set(tree_state(target)) == set(tree_state(pristine.root))

    reverted = tree_state(target)
    code, out, _ = cli("revert", "--target", t)
    assert (code, out.splitlines()[0]) == (0, header("revert", "already pristine", target))
    assert tree_state(target) == reverted


# -- guards: version, hashes ---------------------------------------------------------------------
def set_version(target: Path, version: str) -> None:
    meta = target / "vllm-0.24.0.dist-info" / "METADATA"
    replace_file(
        meta, meta.read_bytes().replace(b"\nVersion: 0.24.0\n", f"\nVersion: {version}\n".encode())
    )


def test_apply_refuses_another_vllm_version(cli: Cli, target: Path) -> None:
    set_version(target, "0.25.0")
    before = tree_state(target)
    assert cli("apply", "--target", str(target)) == (
        1,
        "",
        f"vllm-patchset: vllm 0.25.0 is installed at {target}, but the overlay is for 0.24.0:"
        " nothing changed (rebase the patch set onto 0.25.0, or install vllm==0.24.0)\n",
    )
    assert tree_state(target) == before


def test_revert_refuses_after_vllm_was_upgraded(cli: Cli, target: Path, overlay: Overlay) -> None:
    assert cli("apply", "--target", str(target))[0] == 0
    set_version(target, "0.25.0")  # as `pip install -U vllm` would, replacing the files too
    upgraded = f"# vllm 0.25.0's {EDITED_MODULE}.py\n".encode()
    replace_file(target / EDITED, upgraded)
    before = tree_state(target)
    # One overlaid file replaced, the other still patched: the hash guard refuses (revert does
    # not check the version: it restores only files that hold the recorded patched bytes) ...
    assert cli("revert", "--target", str(target)) == (
        1,
        "",
        f"vllm-patchset: refusing to revert, nothing changed: {EDITED} (modified, sha256"
        f" {sha(upgraded)[:12]})"
        " changed since apply. --force restores the saved originals over them (the hash guard"
        " only)\n",
    )
    # ... and --force, which would put 0.24.0's bytes into a 0.25.0, is refused by the version
    code, out, err = cli("revert", "--target", str(target), "--force")
    assert (code, out) == (1, "")
    assert err.startswith("vllm-patchset: vllm 0.25.0 is installed at ") and "for 0.24.0" in err
    assert tree_state(target) == before
    code, out, _ = cli("status", "--target", str(target))
    assert (code, out.splitlines()[0]) == (
        1,
        f"overlay status: other version (the lock is for 0.24.0) ({target}/vllm, 0.25.0;"
        f" overlay for 0.24.0: {', '.join(PATCHES)})",
    )
    assert cli("verify", "--target", str(target))[0] == 1
    assert tree_state(target) == before


def test_hand_edited_file_refused_then_forced_and_reverted_to_the_edit(
    cli: Cli, target: Path, overlay: Overlay, pristine: Pristine
) -> None:
    edited = (pristine.root / EDITED).read_bytes() + b"# local hotfix\n"
    replace_file(target / EDITED, edited)
    before = tree_state(target)
    why = f"{EDITED} (sha256 {sha(edited)[:12]}: neither the pristine nor the patched vllm 0.24.0)"
    assert cli("apply", "--target", str(target)) == (
        1,
        "",
        f"vllm-patchset: refusing to apply, nothing changed: {why}. --force overwrites such files"
        " (the hash guard only), keeping their bytes for revert\n",
    )
    assert tree_state(target) == before

    code, out, err = cli("apply", "--target", str(target), "--force")
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == (
        f"  note: --force: overwrote {EDITED} (sha256 {sha(edited)[:12]}, neither the"
        " pristine nor the patched vllm 0.24.0); its bytes are kept for revert"
    )
    assert_patched(target, overlay)
    assert (target / STATE / "originals" / EDITED).read_bytes() == edited
    assert cli("verify", "--target", str(target))[0] == 0

    assert cli("revert", "--target", str(target))[0] == 0
    assert (target / EDITED).read_bytes() == edited  # the user's edit is back, byte for byte
    for rel in CHANGED:
        if rel != EDITED:
            assert (target / rel).read_bytes() == (pristine.root / rel).read_bytes(), rel
    assert [rel for rel in ADDED if (target / rel).exists()] == []


def test_missing_file_refused(cli: Cli, target: Path) -> None:
    (target / FIRST).unlink()
    before = tree_state(target)
    assert cli("apply", "--target", str(target), "--force") == (
        1,
        "",
        f"vllm-patchset: {target / FIRST} is missing: not a complete vllm\n",
    )
    assert tree_state(target) == before


def test_revert_refuses_a_file_edited_after_apply_unless_forced(
    cli: Cli, target: Path, overlay: Overlay, pristine: Pristine
) -> None:
    assert cli("apply", "--target", str(target))[0] == 0
    edited = overlay.patched(EDITED) + b"# edited after apply\n"
    replace_file(target / EDITED, edited)
    before = tree_state(target)
    assert cli("revert", "--target", str(target)) == (
        1,
        "",
        f"vllm-patchset: refusing to revert, nothing changed: {EDITED} (modified, sha256"
        f" {sha(edited)[:12]}) changed since apply. --force restores the saved originals over"
        " them (the hash guard only)\n",
    )
    assert tree_state(target) == before
    code, out, _ = cli("revert", "--target", str(target), "--force")
    assert code == 0
    assert (
        out.splitlines()[-1] == f"  note: --force: restored the original over {EDITED} (modified)"
    )
    assert_pristine(target, pristine)
    assert not (target / STATE).exists()


def test_revert_without_saved_originals_refused(cli: Cli, target: Path, overlay: Overlay) -> None:
    for rel in OVERLAID:  # an overlay copied in by hand: no record, no originals
        replace_file(target / rel, overlay.patched(rel))
    before = tree_state(target)
    assert cli("revert", "--target", str(target)) == (
        1,
        "",
        f"vllm-patchset: no saved original for {target / FIRST} (this overlay was not applied"
        " by vllm-patchset): reinstall vllm==0.24.0 to undo it\n",
    )
    assert tree_state(target) == before


def test_revert_refuses_a_corrupt_saved_original(cli: Cli, target: Path, overlay: Overlay) -> None:
    assert cli("apply", "--target", str(target))[0] == 0
    saved = target / STATE / "originals" / EDITED
    replace_file(saved, b"not the original\n")
    before = tree_state(target)
    assert cli("revert", "--target", str(target)) == (
        1,
        "",
        f"vllm-patchset: the saved original {saved} is corrupt (its sha256 differs from the"
        f" record): cannot restore {EDITED}; reinstall vllm==0.24.0\n",
    )
    assert tree_state(target) == before
    assert_patched(target, overlay)


def test_corrupt_record_is_bad_input(cli: Cli, target: Path) -> None:
    assert cli("apply", "--target", str(target))[0] == 0
    record = target / STATE / "applied.json"
    replace_file(record, b"{not json")
    before = tree_state(target)
    for command in ("apply", "revert"):
        code, out, err = cli(command, "--target", str(target))
        assert (code, out) == (2, "")
        assert err == (
            f"vllm-patchset: {record}: not a valid record (not JSON (Expecting property name"
            " enclosed in double quotes at line 1 column 2)); move it away to continue\n"
        )
    assert tree_state(target) == before


def test_apply_refuses_while_another_overlay_is_applied(
    cli: Cli, target: Path, overlay: Overlay, tmp_path: Path, pristine: Pristine
) -> None:
    # Another build of the overlay (say an older patch set): other patched bytes, other lock.
    other_bytes = overlay.patched(EDITED) + b"# older patch set\n"
    entries = tuple(
        LockEntry(e.path, e.pristine_sha256, sha(other_bytes), ("0001-older.patch",))
        if e.path == EDITED
        else e
        for e in overlay.lock.entries
    )
    older = dataclasses.replace(overlay.lock, patches=("0001-older.patch",), entries=entries)
    older_project = project_with_lock(tmp_path, overlay, older)
    replace_file(older_project / "overlay" / EDITED, other_bytes)
    assert cli("apply", "--target", str(target), project=older_project)[0] == 0

    before = tree_state(target)
    assert cli("apply", "--target", str(target)) == (
        1,
        "",
        f"vllm-patchset: refusing to apply, nothing changed: {target / OVERLAID[0]} holds another"
        " overlay (0001-older.patch): run `vllm-patchset overlay revert` first\n",
    )
    assert tree_state(target) == before
    # revert undoes what was applied (the record's lock), whatever this project's lock says
    assert cli("revert", "--target", str(target))[0] == 0
    assert_pristine(target, pristine)
    assert cli("apply", "--target", str(target))[0] == 0
    assert_patched(target, overlay)


# -- guards: paths that lead out ------------------------------------------------------------------
UNSAFE_LOCK_PATHS = (
    "../evil.py",
    "/tmp/evil.py",
    "vllm/../../evil.py",
    "vllm/./model_executor/evil.py",
    "torch/evil.py",
    "vllm\\..\\evil.py",
    "vllm",
)


@pytest.mark.parametrize("bad", UNSAFE_LOCK_PATHS)
def test_lock_paths_outside_the_package_refused(
    cli: Cli, target: Path, overlay: Overlay, tmp_path: Path, bad: str
) -> None:
    entry = LockEntry(bad, "0" * 64, "1" * 64, PATCHES[:1])
    lock = dataclasses.replace(overlay.lock, entries=(*overlay.lock.entries, entry))
    project = project_with_lock(tmp_path, overlay, lock)
    before = tree_state(target.parent)
    for command in ("apply", "revert", "verify"):
        assert cli(command, "--target", str(target), project=project) == (
            1,
            "",
            f"vllm-patchset: refusing lock path {bad!r}: only relative paths inside the vllm"
            " package are deployed\n",
        )
    assert tree_state(target.parent) == before


SYMLINKS = {
    # what becomes a symlink -> where it leads (outside the target)
    "package dir": EDITED_DIR,
    "file": EDITED,
    "bytecode dir": f"{EDITED_DIR}/__pycache__",
    "state dir": STATE,
}


@pytest.mark.parametrize("what", SYMLINKS)
def test_symlinks_leading_out_refused(cli: Cli, target: Path, tmp_path: Path, what: str) -> None:
    link = target / SYMLINKS[what]
    outside = tmp_path / "outside" / link.name
    outside.parent.mkdir()
    if link.is_dir():
        shutil.copytree(link, outside)
        shutil.rmtree(link)
    elif link.exists():
        shutil.copy2(link, outside)
        link.unlink()
    else:
        outside.mkdir()
        (outside / f"{EDITED_MODULE}.cpython-311.pyc").write_bytes(b"pyc outside")
    link.symlink_to(outside)
    before, outside_before = tree_state(target), tree_state(outside.parent)
    code, out, err = cli("apply", "--target", str(target))
    assert (code, out) == (1, "")
    if what == "file":  # a file linked elsewhere, as uv's --link-mode symlink makes them
        assert err == (
            f"vllm-patchset: refusing to apply, nothing changed: {link} is a symlink (to"
            f" {outside}), as `uv pip install --link-mode symlink` installs; reinstall vllm"
            " with `--link-mode copy` (or hardlink) to apply the overlay\n"
        )
    else:
        assert err.startswith(f"vllm-patchset: refusing {link}: it is a symlink (to {outside});")
    assert tree_state(target) == before
    assert tree_state(outside.parent) == outside_before


# -- guards: read-only target, the lock held, bad input ------------------------------------------
def test_read_only_target_refused_with_nothing_changed(overlay: Overlay, target: Path) -> None:
    before = tree_state(target)
    with read_only(target) as prefix:
        done = run_cli(overlay, "apply", "--target", str(target), prefix=prefix)
    assert (done.returncode, done.stdout) == (1, "")
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vllm-patchset: cannot write in {target} (")
    assert lines[0].endswith("): the target is read-only here; nothing was changed")
    assert tree_state(target) == before


def test_read_only_target_once_applied(overlay: Overlay, target: Path, cli: Cli) -> None:
    assert cli("apply", "--target", str(target))[0] == 0
    applied = tree_state(target)
    with read_only(target) as prefix:
        again = run_cli(overlay, "apply", "--target", str(target), prefix=prefix)
        verify = run_cli(overlay, "verify", "--target", str(target), prefix=prefix)
        revert = run_cli(overlay, "revert", "--target", str(target), prefix=prefix)
    assert (again.returncode, again.stdout.splitlines()[0]) == (
        0,
        header("apply", "already applied", target),
    )
    assert (verify.returncode, verify.stdout.splitlines()[0]) == (
        0,
        header("verify", "verified", target),
    )
    assert (revert.returncode, revert.stdout) == (1, "")
    assert revert.stderr.startswith("vllm-patchset: cannot write in ")
    assert revert.stderr.endswith(": the target is read-only here; nothing was changed\n")
    assert tree_state(target) == applied


def test_lock_held_by_another_run_times_out(
    cli: Cli, target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (target / STATE).mkdir()
    lock_file = target / STATE / "lock"
    monkeypatch.setenv(LOCK_TIMEOUT_ENV, "0.2")
    with lock_file.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        before = tree_state(target)
        assert cli("apply", "--target", str(target)) == (
            1,
            "",
            f"vllm-patchset: another vllm-patchset run holds {lock_file} (waited 0.2 s):"
            " nothing was changed\n",
        )
        assert tree_state(target) == before


def test_overlay_missing_or_stale_in_the_project(
    cli: Cli, target: Path, overlay: Overlay, tmp_path: Path
) -> None:
    project = project_with_lock(tmp_path, overlay, overlay.lock)
    source = project / "overlay" / EDITED
    before = tree_state(target)
    source.unlink()
    assert cli("apply", "--target", str(target), project=project) == (
        2,
        "",
        f"vllm-patchset: {source} is missing: run `vllm-patchset overlay build`\n",
    )
    source.write_bytes(b"stale\n")
    assert cli("apply", "--target", str(target), project=project) == (
        1,
        "",
        f"vllm-patchset: {source} does not match the lock's patched sha256: rebuild it with"
        " `vllm-patchset overlay build`\n",
    )
    assert tree_state(target) == before


def break_no_dist_info(target: Path) -> str:
    (target / "vllm-0.24.0.dist-info").rename(target / "vllm-0.24.0.dist-info.old")
    return f"{target}: no vllm-*.dist-info beside the package"


def break_two_dist_infos(target: Path) -> str:
    shutil.copytree(target / "vllm-0.24.0.dist-info", target / "vllm-0.23.0.dist-info")
    return f"{target}: 2 vllm-*.dist-info beside the package"


def break_no_version(target: Path) -> str:
    meta = target / "vllm-0.24.0.dist-info" / "METADATA"
    replace_file(meta, meta.read_bytes().replace(b"\nVersion: 0.24.0\n", b"\n"))
    return f"{meta}: no Version header"


def break_no_package(target: Path) -> str:
    (target / "vllm" / "__init__.py").unlink()
    return f"{target} holds no vllm package (vllm/__init__.py is missing)"


def break_metadata_linked_to_a_fifo(target: Path) -> str:
    """A link is read through (uv's --link-mode symlink), but only to a regular file."""
    meta = target / "vllm-0.24.0.dist-info" / "METADATA"
    fifo = target / "metadata.fifo"
    os.mkfifo(fifo)
    meta.unlink()
    meta.symlink_to(fifo)
    return f"refusing {meta}: it is a FIFO, not a regular file"


BROKEN_INSTALLS = (
    break_no_dist_info,
    break_two_dist_infos,
    break_no_version,
    break_metadata_linked_to_a_fifo,
    break_no_package,
)


@pytest.mark.parametrize("breakage", BROKEN_INSTALLS)
def test_broken_installs_are_bad_input(
    cli: Cli, target: Path, breakage: Callable[[Path], str]
) -> None:
    message = breakage(target)
    before = tree_state(target)
    for command in ("apply", "status"):
        assert cli(command, "--target", str(target)) == (2, "", f"vllm-patchset: {message}\n")
    assert tree_state(target) == before


def test_bad_target_and_python_options(
    cli: Cli, tmp_path: Path, target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("apply", "--target", str(empty)) == (
        2,
        "",
        f"vllm-patchset: {empty} holds no vllm package (vllm/__init__.py is missing)\n",
    )
    missing = tmp_path / "nowhere"
    assert cli("verify", "--target", str(missing))[0] == 2
    assert not missing.exists()
    assert cli("apply", "--python", "/nonexistent/python") == (
        2,
        "",
        "vllm-patchset: cannot run --python /nonexistent/python: No such file or directory\n",
    )
    monkeypatch.delenv("PYTHONPATH", raising=False)  # this venv has no vllm of its own
    assert cli("apply", "--python", sys.executable) == (
        2,
        "",
        f"vllm-patchset: {sys.executable} has no vllm package installed\n",
    )
    assert cli("apply", "--target", str(target), "--python", sys.executable) == (
        2,
        "",
        "vllm-patchset: overlay apply: argument --python: not allowed with argument --target"
        " (see `vllm-patchset overlay apply --help`)\n",
    )


# -- another interpreter, and this one ---------------------------------------------------------
def test_python_option_finds_another_environments_vllm(
    cli: Cli, target: Path, tmp_path: Path, overlay: Overlay
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    for name in ("vllm", "vllm-0.24.0.dist-info"):
        shutil.copytree(target / name, site / name, copy_function=os.link)
    python = str(venv / "bin" / "python")
    code, out, _ = cli("apply", "--python", python)
    assert (code, out.splitlines()[0]) == (0, header("apply", "applied", site.resolve()))
    assert_patched(site, overlay)
    assert cli("verify", "--python", python)[0] == 0


def test_default_is_the_vllm_of_this_interpreter(overlay: Overlay, target: Path) -> None:
    done = run_cli(overlay, "apply", env={"PYTHONPATH": str(target)})
    assert (done.returncode, done.stdout.splitlines()[0]) == (0, header("apply", "applied", target))
    assert_patched(target, overlay)


# -- killed runs -------------------------------------------------------------------------------
# Write points (vllm_install.APPLY_POINTS, REVERT_POINTS): two a file written (temp file
# complete, replaced); one more than APPLY_POINTS is never reached.
RECOVERED_BY = ("apply", "revert", "status")


def expected_repair_note(point: int) -> str | None:
    if point == 1:
        return None  # killed before its journal existed: only a temp file to sweep
    if point == APPLY_POINTS:
        return "finished an interrupted apply (it had committed)"
    replaced = replaced_at(point)
    return f"rolled back an interrupted apply ({replaced} of {N} files had been replaced)"


@pytest.mark.parametrize("point", range(1, APPLY_POINTS + 2))
def test_apply_killed_at_each_write_then_recovered(
    cli: Cli, overlay: Overlay, target: Path, pristine: Pristine, point: int, tmp_path: Path
) -> None:
    """Killed at each write point, then each of apply, revert and status repairs what it left
    (each on a copy of the killed install)."""
    killed = run_cli(overlay, "apply", "--target", str(target), env={KILL_ENV: str(point)})
    if point > APPLY_POINTS:
        assert killed.returncode == 0
        return
    assert killed.returncode == -signal.SIGKILL
    for recover in RECOVERED_BY:
        left = tmp_path / f"recovered-by-{recover}"
        shutil.copytree(target, left, copy_function=os.link, symlinks=True)
        code, out, err = cli(recover, "--target", str(left))
        assert (code, err) == (0, ""), recover
        note = expected_repair_note(point)
        notes = [line for line in out.splitlines() if line.startswith("  note: ")]
        assert notes[:1] == ([f"  note: {note}"] if note else []), recover
        assert no_temp_files(left)
        committed = point == APPLY_POINTS
        if recover == "apply" or (recover == "status" and committed):
            assert_patched(left, overlay)
            assert cli("verify", "--target", str(left))[0] == 0
        else:
            assert_pristine(left, pristine)
            assert not (left / STATE / "applied.json").exists()
            assert not [p for p in (left / STATE).rglob("*") if p.is_file() and p.name != "lock"]


@pytest.mark.parametrize("point", range(1, REVERT_POINTS + 1))
def test_revert_killed_at_each_write_then_finished(
    cli: Cli, overlay: Overlay, target: Path, pristine: Pristine, point: int
) -> None:
    assert cli("apply", "--target", str(target))[0] == 0
    killed = run_cli(overlay, "revert", "--target", str(target), env={KILL_ENV: str(point)})
    assert killed.returncode == -signal.SIGKILL
    code, out, _ = cli("status", "--target", str(target))
    assert no_temp_files(target)
    if point == 1:  # killed before its journal existed: the overlay is still whole
        assert (code, out.splitlines()[0]) == (0, header("status", "applied", target))
        assert_patched(target, overlay)
        return
    restored = restored_at(point)
    assert (code, out.splitlines()) == (
        0,
        [
            header("status", "not applied", target),
            *(f"  pristine   {rel}" for rel in OVERLAID),
            *by_patch("not applied"),
            f"  note: finished an interrupted revert ({restored} of {N} files had been restored)",
        ],
    )
    assert_pristine(target, pristine)
    assert not (target / STATE).exists()


def test_recovery_killed_too_is_recovered_by_the_next_run(
    cli: Cli, overlay: Overlay, target: Path, pristine: Pristine
) -> None:
    killed = run_cli(
        overlay, "apply", "--target", str(target), env={KILL_ENV: str(KILLED_MID_APPLY)}
    )
    assert killed.returncode == -signal.SIGKILL
    # the repair removes the files added before the first changed one (no write point), restores
    # that one... and is killed in the middle of that write
    killed = run_cli(overlay, "status", "--target", str(target), env={KILL_ENV: "1"})
    assert killed.returncode == -signal.SIGKILL
    assert journal_path(target).exists()
    code, out, _ = cli("status", "--target", str(target))
    assert (
        out.splitlines()[-1]
        == f"  note: rolled back an interrupted apply (1 of {N} files had been replaced)"
    )
    assert code == 0
    assert_pristine(target, pristine)
    assert no_temp_files(target)


def test_dry_run_with_an_interrupted_run_pending_changes_nothing(
    cli: Cli, overlay: Overlay, target: Path
) -> None:
    killed = run_cli(
        overlay, "apply", "--target", str(target), env={KILL_ENV: str(KILLED_MID_APPLY)}
    )
    assert killed.returncode == -signal.SIGKILL
    before = tree_state(target)
    for command in ("apply", "revert"):
        code, out, _ = cli(command, "--target", str(target), "--dry-run")
        outcome = f"would repair an interrupted run, then {command}"
        assert (code, out.splitlines()[0]) == (0, header(command, outcome, target))
    code, out, _ = cli("verify", "--target", str(target))
    assert code == 1
    assert "  note: an interrupted run is pending (`overlay status` repairs it)" in out.splitlines()
    assert tree_state(target) == before


# -- concurrent runs ---------------------------------------------------------------------------
def has_open(pid: int, path: Path) -> bool:
    """Whether the process `pid` has `path` open (it waits for the lock there)."""
    try:
        return any(os.readlink(fd) == str(path) for fd in Path(f"/proc/{pid}/fd").iterdir())
    except FileNotFoundError:  # the process, or one of its fds, is gone
        return False


@pytest.mark.parametrize("hold_first", [True, False], ids=["queued-on-the-lock", "free-race"])
def test_concurrent_applies_apply_once(
    overlay: Overlay, target: Path, pristine: Pristine, hold_first: bool
) -> None:
    (target / STATE).mkdir()
    command = cli_command(overlay, "apply", "--target", str(target), "--json")
    with (target / STATE / "lock").open("w") as held:
        if hold_first:  # every run starts while the lock is taken, and waits for it
            fcntl.flock(held, fcntl.LOCK_EX)
        runs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(3)]
        if hold_first:
            lock = target / STATE / "lock"
            deadline = time.monotonic() + 120
            while not all(has_open(run.pid, lock) for run in runs):  # all three at the lock
                assert [run.poll() for run in runs] == [None, None, None]
                assert time.monotonic() < deadline
                time.sleep(0.01)
            fcntl.flock(held, fcntl.LOCK_UN)
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0]
    outcomes = sorted(json.loads(out)["outcome"] for out in outputs)
    assert outcomes == ["already applied", "already applied", "applied"]
    assert_patched(target, overlay)
    assert record_doc(target)["originals"] == originals(pristine)


# -- stale bytecode ----------------------------------------------------------------------------
def compile_unchecked(source: Path, optimization: int | str = "") -> Path:
    pyc = Path(importlib.util.cache_from_source(str(source), optimization=optimization))
    py_compile.compile(
        str(source),
        cfile=str(pyc),
        doraise=True,
        optimize=int(optimization or -1),
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    return pyc


def test_unchecked_hash_pyc_present_before_apply_is_removed(
    cli: Cli, target: Path, overlay: Overlay
) -> None:
    source = target / EDITED
    stale = [compile_unchecked(source), compile_unchecked(source, 1)]
    stale.append(stale[0].with_name(f"{EDITED_MODULE}.cpython-312.pyc"))  # another interpreter's
    shutil.copy(stale[0], stale[2])
    beside = sorted(source.parent.glob("*.py"))
    untouched = [p for p in beside if str(p.relative_to(target)) not in OVERLAID]
    unrelated = compile_unchecked(untouched[0])  # a module the overlay leaves: its pyc stays
    kept = unrelated.read_bytes()

    assert cli("apply", "--target", str(target))[0] == 0
    assert [p.exists() for p in stale] == [False, False, False]
    assert unrelated.read_bytes() == kept
    # What Python now runs for the module is the patched source, not the old bytecode.
    code = SourceFileLoader(EDITED_MODULE, str(source)).get_code(EDITED_MODULE)
    assert code == compile(overlay.patched(EDITED), str(source), "exec", dont_inherit=True)
    assert cli("verify", "--target", str(target))[0] == 0


def test_verify_flags_stale_unchecked_bytecode_and_apply_clears_it(
    cli: Cli, target: Path, overlay: Overlay
) -> None:
    pyc = compile_unchecked(target / EDITED)
    for rel in OVERLAID:  # an overlay copied in by hand, leaving the old bytecode in place
        replace_file(target / rel, overlay.patched(rel))
    # the hazard: Python keeps running the pristine bytecode
    code = SourceFileLoader(EDITED_MODULE, str(target / EDITED)).get_code(EDITED_MODULE)
    assert code != compile(overlay.patched(EDITED), str(target / EDITED), "exec", dont_inherit=True)
    code_, out, _ = cli("verify", "--target", str(target))
    assert code_ == 1
    assert out.splitlines()[-1] == f"  note: {stale_note(pyc)}"

    code_, out, _ = cli("apply", "--target", str(target))
    assert (code_, out.splitlines()[0]) == (0, header("apply", "already applied", target))
    assert out.splitlines()[-1] == (
        "  note: recorded the overlay found in place (no originals: revert cannot undo it)"
    )
    assert not pyc.exists()
    assert cli("verify", "--target", str(target))[0] == 0


def stale_note(pyc: Path) -> str:
    return (
        f"stale unchecked-hash bytecode {pyc}: Python runs it instead of the patched file"
        " (`vllm-patchset overlay apply` removes it)"
    )


def test_stale_bytecode_of_the_pristine_file_is_reported_alike(
    cli: Cli, target: Path, overlay: Overlay, pristine: Pristine
) -> None:
    """A pyc of the pristine module, unchecked-hash, put back after apply (an image layer
    compiled before the overlay): status, verify and the guard all say it is not active."""
    t = str(target)
    assert cli("apply", "--target", t)[0] == 0
    pyc = Path(importlib.util.cache_from_source(str(target / EDITED)))
    py_compile.compile(
        str(pristine.root / EDITED),
        cfile=str(pyc),
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    patched = [f"  patched    {rel}" for rel in OVERLAID]
    note = f"  note: {stale_note(pyc)}"
    assert cli("status", "--target", t) == (
        1,
        "\n".join(
            [header("status", "stale bytecode", target), *patched, *by_patch("applied"), note]
        )
        + "\n",
        "",
    )
    code, out, _ = cli("verify", "--target", t)
    assert (code, out.splitlines()[0], out.splitlines()[-1]) == (
        1,
        header("verify", "NOT verified", target),
        note,
    )
    assert guard.check(target) == (
        False,
        f"vllm-patchset: the overlay on vllm 0.24.0 at {target}/vllm is NOT active: stale"
        f" unchecked-hash bytecode {pyc} runs instead of the patched file (run `vllm-patchset"
        " overlay apply`: it removes them)",
    )
    assert cli("apply", "--target", t) == (
        0,
        "\n".join(
            [
                header("apply", "already applied", target),
                *patched,
                f"  note: removed the stale unchecked-hash bytecode {pyc}",
            ]
        )
        + "\n",
        "",
    )
    assert not pyc.exists()
    assert cli("status", "--target", t)[0] == 0
    assert guard.check(target).active


# -- per patch ---------------------------------------------------------------------------------
def test_status_per_patch_from_the_lock_s_file_map(
    cli: Cli, target: Path, pristine: Pristine
) -> None:
    """One overlaid file put back to pristine after apply: each patch that touches it is
    partly applied (or not at all, where it touches nothing else), the others applied."""
    assert cli("apply", "--target", str(target))[0] == 0
    replace_file(target / EDITED, (pristine.root / EDITED).read_bytes())
    expected = []
    for patch in PATCHES:
        files = [e.path for e in LOCK.entries if patch in e.patches]
        state = "applied" if EDITED not in files else "partly" if len(files) > 1 else "not applied"
        expected.append({"patch": patch, "state": state, "files": files})
    code, out, _ = cli("status", "--target", str(target))
    assert (code, out.splitlines()) == (
        1,
        [
            header("status", "partial", target),
            *(f"  {'pristine' if r == EDITED else 'patched':10} {r}" for r in OVERLAID),
            "  by patch (the lock's map of files to patches):",
            *(f"    {p['state']:11} {p['patch']}" for p in expected),
        ],
    )
    code, out, _ = cli("status", "--target", str(target), "--json")
    assert (code, json.loads(out)["by_patch"]) == (1, expected)
