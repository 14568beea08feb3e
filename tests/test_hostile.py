"""Hostile input, on real `pip install --target` trees of vllm 0.24.0, real virtual environments
and real git checkouts: destinations the tool does not own, paths from data that lead out,
special files where a file is expected, interrupted and concurrent runs, a reinstalled,
upgraded or uninstalled vllm under an applied overlay, and inputs that used to end in a
traceback. Each case checks the exit code, the exact message, and the type, mode and sha256 of
every file it could have touched, before and after (`support.snapshot`)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from killable import KILL_ENV, KILLABLE
from support import REPO, git, snapshot, to_closed_pipe
from synthetic import MOE, STORY_FIX, STORY_LOCAL, LocalIndex, Story, sdist_bytes
from vllm_install import (
    ADDED,
    APPLY_POINTS,
    CHANGED,
    EDITED,
    EDITED_DIR,
    EDITED_MODULE,
    OVERLAID,
    PATCHES,
    REVERT_POINTS,
    Overlay,
    Pristine,
    by_patch_of,
    record_mismatches,
    replace_file,
    replaced_at,
    restored_at,
)
from vllm_patchset.cli import main
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.fsio import LOCK_TIMEOUT_ENV, child
from vllm_patchset.overlay.lock import Lock
from vllm_patchset.overlay.upstream import Mirror

FIX = STORY_FIX.name  # a patch of the synthetic story's series (the `tiny` project)
STATE = ".vllm-patchset"
EMPTY_SHA = hashlib.sha256(b"").hexdigest()
N = len(OVERLAID)
NOT_OWNED = (
    "vllm-patchset: the output dir {dest} is not empty and was not made by vllm-patchset (no"
    " .vllm-patchset-owned in it): give a new or empty directory; nothing was written\n"
)
Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """`vllm-patchset ARGS` in this process: (exit code, stdout, stderr)."""

    def call(*argv: str | Path) -> tuple[int, str, str]:
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return call


def cli(
    *argv: str | Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`vllm-patchset ARGS` in a process of its own: where a FIFO could block, or a signal hit."""
    return subprocess.run(
        [*KILLABLE, *map(str, argv)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def deploy_args(overlay: Overlay, *args: str | Path) -> list[str | Path]:
    project = overlay.project
    return ["--project", project.root, "--cache-dir", project.cache_dir, "overlay", *args]


def header(command: str, outcome: str, target: Path, version: str = "0.24.0") -> str:
    return (
        f"overlay {command}: {outcome} ({target}/vllm, {version}; overlay for 0.24.0:"
        f" {', '.join(PATCHES)})"
    )


def fifo(path: Path) -> None:
    """A FIFO where a regular file was: reading it would block until a writer comes."""
    path.unlink()
    os.mkfifo(path)


# -- 1. destinations the tool does not own ---------------------------------------------------------
def user_files(tmp: Path, site: Path) -> tuple[Path, str]:
    dest = tmp / "out"
    (dest / "vllm" / "sub").mkdir(parents=True)
    (dest / "vllm" / "sub" / "keep.txt").write_text("precious\n")
    return dest, NOT_OWNED.format(dest=dest)


def git_clone_under_it(tmp: Path, site: Path) -> tuple[Path, str]:
    dest = tmp / "src"
    clone = dest / "vllm"
    clone.mkdir(parents=True)
    git(clone, "init", "-q", "-b", "main")
    (clone / "setup.py").write_text("committed\n")
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "work")
    (clone / "setup.py").write_text("uncommitted work\n")
    return dest, NOT_OWNED.format(dest=dest)


def site_packages(tmp: Path, site: Path) -> tuple[Path, str]:
    return site, NOT_OWNED.format(dest=site)


def a_file(tmp: Path, site: Path) -> tuple[Path, str]:
    (tmp / "out").write_text("a file\n")
    return (
        tmp / "out",
        f"vllm-patchset: the output dir {tmp / 'out'} is a regular file, not a directory\n",
    )


def a_symlink(tmp: Path, site: Path) -> tuple[Path, str]:
    (tmp / "real").mkdir()
    (tmp / "out").symlink_to(tmp / "real")
    return tmp / "out", (
        f"vllm-patchset: the output dir {tmp / 'out'} is a symlink (to {tmp / 'real'}): give a"
        " real dir\n"
    )


BUILD_OUT = (user_files, git_clone_under_it, site_packages, a_file, a_symlink)


@pytest.mark.parametrize("make", BUILD_OUT)
def test_build_out_refuses_what_it_does_not_own(
    run: Run, tiny: Project, target: Path, tmp_path: Path, make: Callable[..., tuple[Path, str]]
) -> None:
    dest, message = make(tmp_path, target)
    before = snapshot(tmp_path)
    assert run("--project", tiny.root, "overlay", "build", "--out", dest) == (2, "", message)
    assert snapshot(tmp_path) == before


def test_build_out_rewrites_what_it_made(run: Run, tiny: Project, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    for _ in range(2):  # a new dir, then the same dir again: it carries the marker
        code, out, err = run("--project", tiny.root, "overlay", "build", "--out", dest)
        assert (code, err) == (0, "")
        assert out.splitlines()[0] == f"overlay for vllm 1.0: 1 file(s) in {dest}"
    # What a killed build left (a staging dir of a process that is gone) is swept; the same
    # name of a live process (this one) is left alone.
    dead = _dead_pid()
    (dest / f".vllm-patchset-staging-{dead}-overlay-x").mkdir()
    (dest / f".vllm-patchset-staging-{os.getpid()}-overlay-y").mkdir()
    assert run("--project", tiny.root, "overlay", "build", "--out", dest)[0] == 0
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if not p.is_dir())
    assert files == [".vllm-patchset-owned", "overlay.lock.json", MOE]
    assert sorted(p.name for p in dest.iterdir() if p.name.startswith(".vllm-patchset-s")) == [
        f".vllm-patchset-staging-{os.getpid()}-overlay-y"
    ]


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


TREE_DEST = {
    "a file": (
        lambda d: d.write_text("a file\n"),
        "vllm-patchset: {d} is a file, not a directory: give a new or empty directory\n",
    ),
    "a symlink": (
        lambda d: d.symlink_to(d.parent),
        "vllm-patchset: {d} is a symlink, not a directory: give a new or empty directory\n",
    ),
    "vllm/ there": (
        lambda d: (d / "vllm").mkdir(parents=True),
        "vllm-patchset: {d}/vllm exists already: give an empty destination\n",
    ),
    "tree info there": (
        lambda d: d.mkdir() or (d / "vllm-patchset-tree.json").write_text("mine\n"),
        "vllm-patchset: {d}/vllm-patchset-tree.json exists already: give an empty destination\n",
    ),
}


@pytest.mark.parametrize("case", TREE_DEST)
def test_tree_writes_only_new_files(run: Run, tiny: Project, tmp_path: Path, case: str) -> None:
    make, message = TREE_DEST[case]
    dest = tmp_path / "dest"
    make(dest)
    before = snapshot(tmp_path, skip_git=True)
    assert run("--project", tiny.root, "tree", dest) == (2, "", message.format(d=dest))
    assert snapshot(tmp_path, skip_git=True) == before


# -- 2. paths from data: an installed vllm's RECORD -------------------------------------------------
RECORD = "vllm-0.24.0.dist-info/RECORD"
ENVS = "vllm/envs.py"


def _record_rows(site: Path, edit: Callable[[list[str]], list[str]]) -> None:
    rows = (site / RECORD).read_text().splitlines()
    replace_file(site / RECORD, ("\n".join(edit(rows)) + "\n").encode())


def record_dotdot(site: Path, tmp: Path) -> tuple[int, str]:
    (tmp / "escape").mkdir()
    (tmp / "escape" / "x.py").write_text("read from outside the install\n")
    _record_rows(site, lambda rows: [*rows, "vllm/../../escape/x.py,,"])
    return 2, (
        f"vllm-patchset: {site}: RECORD lists 'vllm/../../escape/x.py', not a plain path inside"
        " vllm/: refusing this install\n"
    )


def record_empty_part(site: Path, tmp: Path) -> tuple[int, str]:
    _record_rows(site, lambda rows: [r.replace(f"{ENVS},", "vllm//envs.py,") for r in rows])
    return 2, (
        f"vllm-patchset: {site}: RECORD lists 'vllm//envs.py', not a plain path inside vllm/:"
        " refusing this install\n"
    )


def record_no_hash(site: Path, tmp: Path) -> tuple[int, str]:
    _record_rows(site, lambda rows: [f"{ENVS},," if r.startswith(f"{ENVS},") else r for r in rows])
    return 2, (
        f"vllm-patchset: {site}: RECORD lists {ENVS} without a sha256: the installed vllm 0.24.0"
        " cannot be checked\n"
    )


def file_is_symlink(site: Path, tmp: Path) -> tuple[int, str]:
    outside = tmp / "outside-envs.py"
    outside.write_bytes((site / ENVS).read_bytes())  # the same bytes: the hash would pass
    (site / ENVS).unlink()
    (site / ENVS).symlink_to(outside)
    return 1, (
        f"vllm-patchset: refusing {site / ENVS}: it is a symlink (to {outside}); the tool does"
        " not follow symlinks inside what it reads or writes\n"
    )


def file_is_fifo(site: Path, tmp: Path) -> tuple[int, str]:
    fifo(site / ENVS)
    return 1, f"vllm-patchset: refusing {site / ENVS}: it is a FIFO, not a regular file\n"


def record_is_fifo(site: Path, tmp: Path) -> tuple[int, str]:
    fifo(site / RECORD)
    return 2, f"vllm-patchset: refusing {site / RECORD}: it is a FIFO, not a regular file\n"


FETCH_TARGET = (
    record_dotdot,
    record_empty_part,
    record_no_hash,
    file_is_symlink,
    file_is_fifo,
    record_is_fifo,
)


@pytest.mark.parametrize("make", FETCH_TARGET)
def test_fetch_target_checks_every_path_of_the_record(
    tiny: Project, target: Path, tmp_path: Path, make: Callable[..., tuple[int, str]]
) -> None:
    code, message = make(target, tmp_path)
    temp = tmp_path / "tmp"  # where the files are gathered: a `..` would lead out of it
    temp.mkdir()
    before = snapshot(tmp_path, skip_git=True)
    done = cli("--project", tiny.root, "fetch", "--target", target, env={"TMPDIR": str(temp)})
    assert (done.returncode, done.stdout, done.stderr) == (code, "", message)
    assert snapshot(tmp_path, skip_git=True) == before


# -- 3. paths from data: the series and its patches ---------------------------------------------
def series_latin1(project: Project) -> str:
    series = project.series_file
    series.write_bytes(f"{FIX}\n# caf".encode() + b"\xe9\n" + f"{STORY_LOCAL.name}\n".encode())
    offset = len(f"{FIX}\n# caf")
    return f"vllm-patchset: {series}: not UTF-8 text (byte 0xe9 at offset {offset})\n"


def series_is_fifo(project: Project) -> str:
    fifo(project.series_file)
    return f"vllm-patchset: refusing {project.series_file}: it is a FIFO, not a regular file\n"


def patch_is_fifo(project: Project) -> str:
    fifo(project.patches_dir / FIX)
    return f"vllm-patchset: {project.series_file}: entry {FIX} is a FIFO, not a regular file\n"


def patch_is_symlink(project: Project) -> str:
    outside = project.root.parent / "outside.patch"
    (project.patches_dir / FIX).rename(outside)
    (project.patches_dir / FIX).symlink_to(outside)
    return f"vllm-patchset: {project.series_file}: entry {FIX} is a symlink, not a regular file\n"


def patch_crlf(project: Project) -> str:
    path = project.patches_dir / FIX
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    return (
        f"vllm-patchset: malformed patch {path}: CRLF line endings (git format-patch writes LF:"
        " convert it, e.g. dos2unix)\n"
    )


def patch_dot_path(project: Project) -> str:
    path = project.patches_dir / FIX
    dotted = MOE.replace("/layers/", "/./layers/")
    path.write_text(path.read_text().replace(f"b/{MOE}", f"b/{dotted}", 1))
    return (
        f"vllm-patchset: malformed patch {path}: touches {dotted!r}, not a plain path inside"
        " vllm/\n"
    )


SERIES_DATA = (
    series_latin1,
    series_is_fifo,
    patch_is_fifo,
    patch_is_symlink,
    patch_crlf,
    patch_dot_path,
)
# (`check` lists such a patch with every other problem, exit 1: tests/test_sync_truth.py.)
READERS = (["status"], ["overlay", "build"], ["matrix", "1.0"])


@pytest.mark.parametrize("make", SERIES_DATA)
def test_series_and_patches_are_checked_before_use(
    run: Run, tiny: Project, make: Callable[[Project], str]
) -> None:
    message = make(tiny)
    before = snapshot(tiny.root.parent, skip_git=True)
    for argv in READERS:
        assert run("--project", tiny.root, *argv) == (2, "", message)
    assert snapshot(tiny.root.parent, skip_git=True) == before


# -- 4. special files in a target: refused, never opened -------------------------------------------
def start_guard(target: Path) -> tuple[int, list[str], str]:
    """`register()` in a fresh interpreter, as vLLM calls it at start (a FIFO must not block)."""
    script = (
        "import logging, sys\n"
        "handler = logging.StreamHandler(sys.stdout)\n"
        "handler.setFormatter(logging.Formatter('%(levelname)s %(message)s'))\n"
        "logging.getLogger('vllm').addHandler(handler)\n"
        "logging.getLogger('vllm').setLevel(logging.INFO)\n"
        "from vllm_patchset.deploy.guard import register\nregister()\nprint('vLLM goes on')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PATCHSET_STRICT"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": os.pathsep.join([str(target), env.get("PYTHONPATH", "")])},
        timeout=60,
    )
    return done.returncode, done.stdout.splitlines(), done.stderr


def overlaid_fifo(target: Path, overlay: Overlay) -> tuple[int, str, str]:
    fifo(target / EDITED)
    message = f"vllm-patchset: refusing {target / EDITED}: it is a FIFO, not a regular file\n"
    guard = f"vllm-patchset: NO overlay applied to vllm 0.24.0 at {target / 'vllm'}: its fixes are NOT active (run `vllm-patchset overlay apply`)"
    return 1, message, guard


def overlaid_dir(target: Path, overlay: Overlay) -> tuple[int, str, str]:
    (target / EDITED).unlink()
    (target / EDITED).mkdir()
    message = f"vllm-patchset: refusing {target / EDITED}: it is a directory, not a regular file\n"
    guard = f"vllm-patchset: NO overlay applied to vllm 0.24.0 at {target / 'vllm'}: its fixes are NOT active (run `vllm-patchset overlay apply`)"
    return 1, message, guard


def applied_then_fifo(target: Path, overlay: Overlay) -> tuple[int, str, str]:
    assert cli(*deploy_args(overlay, "apply", "--target", target)).returncode == 0
    fifo(target / EDITED)
    message = f"vllm-patchset: refusing {target / EDITED}: it is a FIFO, not a regular file\n"
    guard = (
        f"vllm-patchset: the overlay on vllm 0.24.0 at {target / 'vllm'} is PARTIAL: 1 of {N}"
        f" files are not patched ({EDITED_MODULE}.py): its fixes are NOT active (run `vllm-patchset"
        " overlay status`, then apply)"
    )
    return 1, message, guard


def record_fifo(target: Path, overlay: Overlay) -> tuple[int, str, str]:
    assert cli(*deploy_args(overlay, "apply", "--target", target)).returncode == 0
    record = target / STATE / "applied.json"
    fifo(record)
    message = f"vllm-patchset: refusing {record}: it is a FIFO, not a regular file\n"
    guard = (
        f"vllm-patchset: unreadable record {record} (refusing {record}: it is a FIFO, not a"
        " regular file): the overlay cannot be confirmed (run `vllm-patchset overlay status`)"
    )
    return 1, message, guard


def metadata_fifo(target: Path, overlay: Overlay) -> tuple[int, str, str]:
    meta = target / "vllm-0.24.0.dist-info" / "METADATA"
    fifo(meta)
    why = f"refusing {meta}: it is a FIFO, not a regular file"
    return (
        2,
        f"vllm-patchset: {why}\n",
        f"vllm-patchset: cannot check the overlay of {target / 'vllm'}: {why}",
    )


TARGET_SPECIAL = (overlaid_fifo, overlaid_dir, applied_then_fifo, record_fifo, metadata_fifo)


@pytest.mark.parametrize("make", TARGET_SPECIAL)
def test_special_files_in_a_target_are_refused_never_opened(
    overlay: Overlay, target: Path, make: Callable[..., tuple[int, str, str]]
) -> None:
    code, message, guard = make(target, overlay)
    before = snapshot(target)
    for command in ("apply", "verify", "status", "revert"):
        done = cli(*deploy_args(overlay, command, "--target", target), timeout=60)
        assert (done.returncode, done.stdout, done.stderr) == (code, "", message), command
    assert start_guard(target) == (0, [f"WARNING {guard}", "vLLM goes on"], "")
    assert snapshot(target) == before


def test_a_fifo_for_a_pyc_is_reported_not_read(overlay: Overlay, target: Path) -> None:
    assert cli(*deploy_args(overlay, "apply", "--target", target)).returncode == 0
    pyc = target / EDITED_DIR / "__pycache__" / f"{EDITED_MODULE}.cpython-311.pyc"
    pyc.parent.mkdir(exist_ok=True)
    os.mkfifo(pyc)
    done = cli(*deploy_args(overlay, "verify", "--target", target), timeout=60)
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == (
        f"  note: stale unchecked-hash bytecode {pyc}: Python runs it instead of the patched"
        " file (`vllm-patchset overlay apply` removes it)"
    )


def test_symlinked_originals_are_refused(overlay: Overlay, target: Path, tmp_path: Path) -> None:
    assert cli(*deploy_args(overlay, "apply", "--target", target)).returncode == 0
    originals = target / STATE / "originals" / "vllm"
    outside = tmp_path / "outside"
    shutil.copytree(originals, outside)
    shutil.rmtree(originals)
    originals.symlink_to(outside)
    before, outside_before = snapshot(target), snapshot(outside)
    done = cli(*deploy_args(overlay, "revert", "--target", target))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"vllm-patchset: refusing {originals}: it is a symlink (to {outside}); the tool does"
        " not follow symlinks inside what it reads or writes\n"
    )
    assert (snapshot(target), snapshot(outside)) == (before, outside_before)


def test_a_journal_path_that_leads_out_is_refused(
    overlay: Overlay, target: Path, tmp_path: Path
) -> None:
    (target / STATE).mkdir()
    step = {"path": "vllm/../../evil.py", "before_sha256": "0" * 64, "after_sha256": "1" * 64}
    intent = {"op": "apply", "id": "x", "version": "0.24.0", "files": [step]}
    (target / STATE / "journal.jsonl").write_text(json.dumps(intent) + "\n")
    (tmp_path / "evil.py").write_text("outside\n")
    before = snapshot(tmp_path)
    done = cli(*deploy_args(overlay, "status", "--target", target))
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        "",
        "vllm-patchset: refusing lock path 'vllm/../../evil.py': only relative paths inside the"
        " vllm package are deployed\n",
    )
    # Only the state dir's lock file is new (taken to repair the journal; it stays with it).
    assert snapshot(tmp_path) == {**before, f"site/{STATE}/lock": ("file", 0o644, EMPTY_SHA)}


# -- 5. no command destroys what it did not create ----------------------------------------------
def test_queue_export_refuses_to_overwrite_an_edit_in_patches(run: Run, tiny: Project) -> None:
    root = tiny.root
    assert run("--project", root, "queue", "import")[0] == 0
    edited = tiny.patches_dir / FIX
    edited.write_bytes(edited.read_bytes() + b"# edited in patches/, not in the queue\n")
    queue = root / ".queue"
    (queue / "vllm" / "utils.py").write_text("# an edit made in the queue\n")
    git(
        queue,
        "commit",
        "-q",
        "-am",
        "x: an edit in the queue\n\nUpstream-PR: none (local)\nIntroduced-by: none\nIntroduced-in: 1.0\nApplied-upstream:\nRegression-test: tests/gpu/test_synthetic.py::test_name",
    )
    before = snapshot(tiny.patches_dir)
    assert run("--project", root, "queue", "export") == (
        1,
        "",
        f"vllm-patchset: {edited} changed since `queue import` (an edit not in the queue):"
        " export would overwrite it; nothing was written. Take the change into the queue (or"
        " move it away), then export again\n",
    )
    assert snapshot(tiny.patches_dir) == before
    # Moved away, the export goes through; a second export (more queue work) needs no import.
    edited.write_bytes(git(root, "show", f"HEAD:patches/{FIX}").encode())
    assert run("--project", root, "queue", "export")[0] == 0
    assert (tiny.patches_dir / "0003-x-an-edit-in-the-queue.patch").is_file()
    git(
        queue,
        "commit",
        "-q",
        "--amend",
        "-m",
        "x: renamed\n\nUpstream-PR: none (local)\nIntroduced-by: none\nIntroduced-in: 1.0\nApplied-upstream:\nRegression-test: tests/gpu/test_synthetic.py::test_name",
    )
    assert run("--project", root, "queue", "export")[0] == 0
    assert (tiny.patches_dir / "0003-x-renamed.patch").is_file()
    assert not (tiny.patches_dir / "0003-x-an-edit-in-the-queue.patch").exists()


def test_queue_import_force_replaces_only_a_queue(run: Run, tiny: Project) -> None:
    mine = tiny.root / ".queue"
    mine.mkdir()
    (mine / "notes.txt").write_text("not a queue\n")
    before = snapshot(tiny.root, skip_git=True)
    assert run("--project", tiny.root, "queue", "import", "--force") == (
        2,
        "",
        f"vllm-patchset: {mine} was not made by `vllm-patchset queue import` (no"
        " refs/vllm-patchset/base in it): move it away; nothing was changed\n",
    )
    assert snapshot(tiny.root, skip_git=True) == before


def test_force_apply_over_an_edited_overlay_keeps_the_pristine_original(
    run: Run, overlay: Overlay, target: Path, pristine: Pristine
) -> None:
    assert run(*deploy_args(overlay, "apply", "--target", target))[0] == 0
    edited = overlay.patched(EDITED) + b"# a local hotfix on top of the overlay\n"
    replace_file(target / EDITED, edited)
    code, out, err = run(*deploy_args(overlay, "apply", "--target", target, "--force"))
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == (
        f"  note: --force: overwrote {EDITED} (sha256"
        f" {hashlib.sha256(edited).hexdigest()[:12]}, neither the pristine nor the patched vllm"
        " 0.24.0); the original saved when the overlay was first applied is kept for revert"
        " (the overwritten bytes are not)"
    )
    assert not (target / STATE / "undo").exists()
    code, out, err = run(*deploy_args(overlay, "revert", "--target", target))
    assert (code, out.splitlines()[0], err) == (0, header("revert", "reverted", target), "")
    assert record_mismatches(target, pristine.record) == []  # the wheel's bytes, every file
    assert not (target / STATE).exists()


# -- 6. honest states: vllm reinstalled, upgraded or uninstalled under an applied overlay ----------
@pytest.fixture
def venv(pristine: Pristine, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A virtual environment with vllm 0.24.0 in its site-packages (hard links to the wheel's
    install): (its python, its site-packages)."""
    root = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next(root.glob("lib/python*/site-packages")).resolve()
    for name in ("vllm", "vllm-0.24.0.dist-info"):
        shutil.copytree(pristine.root / name, site / name, copy_function=os.link)
    yield root / "bin" / "python", site


def pip(python: Path, *args: str) -> None:
    """This interpreter's pip acting on another environment (`pip --python`)."""
    env = {**os.environ, "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *args],
        check=True,
        capture_output=True,
        env={**env, "PIP_NO_CACHE_DIR": "1"},
    )


GONE_NOTE = (
    "  note: the overlay applied to vllm 0.24.0 ({patches}) is gone from the files (vllm was"
    " reinstalled over it): `vllm-patchset overlay apply` applies this lock's overlay again,"
    " `vllm-patchset overlay revert` removes the stale record"
)


@pytest.mark.parametrize("then", ["apply", "revert"])
def test_pip_force_reinstall_under_an_applied_overlay(
    run: Run,
    overlay: Overlay,
    venv: tuple[Path, Path],
    pristine: Pristine,
    then: str,
) -> None:
    python, site = venv
    assert run(*deploy_args(overlay, "apply", "--python", python))[0] == 0
    pip(python, "install", "--no-deps", "--no-compile", "--force-reinstall", str(pristine.wheel))
    assert record_mismatches(site, pristine.record) == []  # pip put the wheel's files back
    code, out, err = run(*deploy_args(overlay, "status", "--python", python))
    assert (code, err) == (1, "")
    # pip leaves a file the overlay added (its RECORD does not list it): patched still
    words = {rel: "patched" if rel in ADDED else "pristine" for rel in OVERLAID}
    assert out.splitlines() == [
        header("status", "gone", site),
        *(f"  {words[rel]:10} {rel}" for rel in OVERLAID),
        *by_patch_of(words),
        GONE_NOTE.format(patches=", ".join(PATCHES)),
    ]
    assert (
        json.loads(run(*deploy_args(overlay, "status", "--python", python, "--json"))[1])["ok"]
        is False
    )
    code, out, err = run(*deploy_args(overlay, then, "--python", python))
    assert (code, err) == (0, "")
    if then == "apply":
        assert out.splitlines()[0] == header("apply", "applied", site)
        assert run(*deploy_args(overlay, "verify", "--python", python))[0] == 0
        assert run(*deploy_args(overlay, "revert", "--python", python))[0] == 0
    else:
        assert out.splitlines()[0] == header("revert", "stale record removed", site)
    assert record_mismatches(site, pristine.record) == []
    assert [rel for rel in ADDED if (site / rel).exists()] == []
    assert not (site / STATE).exists()


@pytest.mark.parametrize("where", ["--python", "--target"])
def test_pip_uninstall_leaves_no_silent_orphan(
    run: Run, overlay: Overlay, venv: tuple[Path, Path], where: str
) -> None:
    python, site = venv
    assert run(*deploy_args(overlay, "apply", "--python", python))[0] == 0
    pip(python, "uninstall", "-y", "vllm")
    assert sorted(os.listdir(site)) == [STATE, *(["vllm"] if ADDED else [])]  # (pip leaves them)
    option = str(python) if where == "--python" else str(site)
    why = (
        f"{python} has no vllm package installed"
        if where == "--python"
        else f"{site} holds no vllm package (vllm/__init__.py is missing)"
    )
    found = f"{why}, but {site / STATE} is left from an overlay applied to vllm 0.24.0 (vllm uninstalled?)"
    code, out, err = run(*deploy_args(overlay, "status", where, option))
    assert (code, err) == (1, "")
    assert out.splitlines() == [
        f"overlay status: orphaned state ({site}/vllm, not installed; overlay for 0.24.0:"
        f" {', '.join(PATCHES)})",
        f"  note: {found}: `vllm-patchset overlay revert --target {site}` removes it",
    ]
    code, out, err = run(*deploy_args(overlay, "revert", where, option))
    assert (code, err) == (0, "")
    assert out.splitlines()[1] == f"  note: {found}: removed it"
    assert os.listdir(site) == []
    assert run(*deploy_args(overlay, "status", where, option)) == (2, "", f"vllm-patchset: {why}\n")


def rebased_onto_0_25_0(run: Run, overlay: Overlay, tmp_path: Path) -> Path:
    """A copy of the project whose pin moved to 0.25.0 with nothing to apply there: every
    series patch parked (kept, not applied), as `rebase --keep` leaves a patch whose code was
    rewritten upstream."""
    root = tmp_path / "rebased"
    shutil.copytree(overlay.project.root, root, ignore=shutil.ignore_patterns(".git", "vllm"))
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('pin = "0.24.0"', 'pin = "0.25.0"'))
    patches = root / "patches"
    names = (patches / "series").read_text().split()
    (patches / "parked").mkdir()
    for name in names:
        (patches / name).rename(patches / "parked" / name)
    (patches / "parked" / "series").write_text(
        "".join(f"{name}  # kept on 0.25.0: rewritten upstream\n" for name in names)
    )
    (patches / "series").write_text("")
    args = ("--project", root, "--cache-dir", overlay.project.cache_dir)
    assert run(*args, "overlay", "build", "--update-lock")[0] == 0
    return root


def upgrade_to_0_25_0(target: Path, mirror: Mirror) -> None:
    """What `pip install -U vllm==0.25.0` does to the files at stake: the overlaid modules and
    the dist-info replaced by 0.25.0's."""
    commit = mirror.release("0.25.0").commit
    for rel in CHANGED:  # (a file the overlay added stays: pip knows nothing of it)
        data = mirror.repo.read_blob(commit, rel)
        assert data is not None
        replace_file(target / rel, data)
    info = target / "vllm-0.24.0.dist-info"
    meta = info / "METADATA"
    replace_file(meta, meta.read_bytes().replace(b"\nVersion: 0.24.0\n", b"\nVersion: 0.25.0\n"))
    info.rename(target / "vllm-0.25.0.dist-info")


@pytest.mark.parametrize("then", ["apply", "revert"])
def test_upgraded_vllm_and_rebased_project_can_apply_and_revert(
    run: Run, overlay: Overlay, target: Path, tmp_path: Path, mirror: Mirror, then: str
) -> None:
    assert run(*deploy_args(overlay, "apply", "--target", target))[0] == 0
    upgrade_to_0_25_0(target, mirror)
    rebased = rebased_onto_0_25_0(run, overlay, tmp_path)
    args = ("--project", rebased, "--cache-dir", overlay.project.cache_dir, "overlay")
    gone = (
        f"the overlay applied to vllm 0.24.0 ({', '.join(PATCHES)}) is gone from the files"
        " (vllm 0.25.0 was installed over it)"
    )
    where = f"({target}/vllm, 0.25.0; overlay for 0.25.0: no patches)"
    assert run(*args, "status", "--target", target) == (
        1,
        f"overlay status: gone {where}\n  note: {gone}: `vllm-patchset overlay apply` applies"
        " this lock's overlay again, `vllm-patchset overlay revert` removes the stale record\n",
        "",
    )
    code, out, _ = run(*args, "verify", "--target", target)
    assert (code, out.splitlines()[0]) == (1, f"overlay verify: NOT verified {where}")
    before = snapshot(target)
    words = {rel: "patched" if rel in ADDED else "modified" for rel in OVERLAID}
    added_note = "".join(f"  note: removed what the overlay had added: {rel}\n" for rel in ADDED)
    assert run(*args, "revert", "--target", target, "--dry-run") == (
        0,
        f"overlay revert: would remove a stale record ({target}/vllm, 0.25.0; overlay for 0.24.0:"
        f" {', '.join(PATCHES)})\n" + "".join(f"  {words[rel]:10} {rel}\n" for rel in OVERLAID),
        "",
    )
    assert snapshot(target) == before
    if then == "revert":  # the stale record goes; vllm 0.25.0's files stay as pip left them
        assert run(*args, "revert", "--target", target) == (
            0,
            f"overlay revert: stale record removed ({target}/vllm, 0.25.0; overlay for 0.24.0:"
            f" {', '.join(PATCHES)})\n"
            + "".join(f"  {words[rel]:10} {rel}\n" for rel in OVERLAID)
            + f"  note: {gone}: removed its stale record\n"
            + added_note,
            "",
        )
        assert snapshot(target) == {
            k: v for k, v in before.items() if not k.startswith(STATE) and k not in ADDED
        }
        return
    assert run(*args, "apply", "--target", target) == (
        0,
        f"overlay apply: applied {where}\n  note: {gone}: removed its stale record\n" + added_note,
        "",
    )
    assert run(*args, "verify", "--target", target) == (
        0,
        f"overlay verify: verified {where}\n",
        "",
    )
    assert start_guard(target) == (
        0,
        ["INFO vllm-patchset: overlay active on vllm 0.25.0: no patches (0 files)", "vLLM goes on"],
        "",
    )
    assert run(*args, "revert", "--target", target)[0] == 0
    assert not (target / STATE).exists()


def test_revert_json_reports_the_files_as_left_and_a_refused_apply_prints_json(
    run: Run, overlay: Overlay, target: Path, pristine: Pristine
) -> None:
    code, out, _ = run(*deploy_args(overlay, "status", "--target", target, "--json"))
    assert [f["action"] for f in json.loads(out)["files"]] == [None] * N
    assert run(*deploy_args(overlay, "apply", "--target", target))[0] == 0
    code, out, _ = run(*deploy_args(overlay, "revert", "--target", target, "--json"))
    assert code == 0
    assert json.loads(out)["files"] == [
        {"path": rel, "state": "pristine", "sha256": pristine.record.get(rel), "action": "restore"}
        for rel in OVERLAID
    ]
    edited = (pristine.root / EDITED).read_bytes() + b"# local\n"
    replace_file(target / EDITED, edited)
    code, out, err = run(*deploy_args(overlay, "apply", "--target", target, "--json"))
    error = (
        f"refusing to apply, nothing changed: {EDITED} (sha256"
        f" {hashlib.sha256(edited).hexdigest()[:12]}: neither the pristine nor the patched vllm"
        " 0.24.0). --force overwrites such files (the hash guard only), keeping their bytes for"
        " revert"
    )
    assert (code, json.loads(out), err) == (
        1,
        {"ok": False, "command": "overlay apply", "exit_code": 1, "error": error},
        f"vllm-patchset: {error}\n",
    )


# -- 7. interrupted and concurrent runs -----------------------------------------------------------


def apply_interrupted_note(point: int) -> str:
    if point == 1:  # the journal's temp file: nothing had begun
        return "nothing was changed"
    if point == APPLY_POINTS:  # the record is in place: the apply had committed
        return "finished an interrupted apply (it had committed): the overlay is applied"
    replaced = replaced_at(point)
    return (
        f"rolled back an interrupted apply ({replaced} of {N} files had been replaced): the"
        " target is as it was"
    )


@pytest.mark.parametrize("name", ["TERM", "INT"])
@pytest.mark.parametrize("point", range(1, APPLY_POINTS + 1))
def test_apply_interrupted_at_each_write_is_rolled_back_and_says_so(
    overlay: Overlay, target: Path, point: int, name: str
) -> None:
    before = snapshot(target)
    done = cli(
        *deploy_args(overlay, "apply", "--target", target), env={KILL_ENV: f"{point}:{name}"}
    )
    signum = getattr(signal, f"SIG{name}")
    note = apply_interrupted_note(point)
    assert (done.returncode, done.stdout, done.stderr) == (
        128 + signum,
        "",
        f"vllm-patchset: interrupted (SIG{name}); {note}\n",
    )
    if point == APPLY_POINTS:
        assert cli(*deploy_args(overlay, "verify", "--target", target)).returncode == 0
    else:
        assert snapshot(target) == before


@pytest.mark.parametrize("point", range(1, REVERT_POINTS + 1))
def test_revert_interrupted_at_each_write_is_finished_and_says_so(
    run: Run, overlay: Overlay, target: Path, pristine: Pristine, point: int
) -> None:
    before = snapshot(target)
    assert run(*deploy_args(overlay, "apply", "--target", target))[0] == 0
    applied = snapshot(target)
    done = cli(*deploy_args(overlay, "revert", "--target", target), env={KILL_ENV: f"{point}:TERM"})
    restored = restored_at(point)
    note = (
        "nothing was changed"  # the journal's temp file: the revert had not begun
        if point == 1
        else f"finished an interrupted revert ({restored} of {N} files had been restored): the"
        " files are pristine"
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        143,
        "",
        f"vllm-patchset: interrupted (SIGTERM); {note}\n",
    )
    assert snapshot(target) == (applied if point == 1 else before)


def test_build_interrupted_leaves_the_overlay_as_it_was_or_whole(tiny: Project) -> None:
    project = tiny
    lock = Lock.load(project.lock_path)
    files = len(lock.entries)
    args = ("--project", project.root, "overlay", "build", "--update-lock")
    lock_before = project.lock_path.read_bytes()
    before = snapshot(project.root, skip_git=True)
    done = cli(*args, env={KILL_ENV: "1:TERM"})  # a staged file: nothing is in place yet
    assert (done.returncode, done.stdout, done.stderr) == (
        143,
        "",
        "vllm-patchset: interrupted (SIGTERM); nothing was changed (what was staged is removed)\n",
    )
    assert snapshot(project.root, skip_git=True) == before
    done = cli(*args, env={KILL_ENV: f"{2 * files + 1}:TERM"})  # the lock: held back, then whole
    assert (done.returncode, done.stderr) == (
        143,
        f"vllm-patchset: interrupted (SIGTERM); the overlay in {project.overlay_dir} had been"
        " written (the run was complete)\n",
    )
    assert project.lock_path.read_bytes() == lock_before
    assert sorted(p.name for p in project.overlay_dir.iterdir()) == ["overlay.lock.json", "vllm"]
    for entry in lock.entries:
        data = (project.overlay_dir / entry.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry.patched_sha256


def test_git_dies_with_a_killed_run(tiny: Project, tmp_path: Path) -> None:
    # git fetch over "ssh" that hangs: the ssh command is a script that waits.
    ssh = tmp_path / "ssh"
    ssh.write_text("#!/bin/sh\nsleep 30\n")
    ssh.chmod(0o755)
    run = subprocess.Popen(
        [sys.executable, "-m", "vllm_patchset", "--project", str(tiny.root), "fetch",
         "--git", "ssh://example.invalid/vllm.git", "--ref", "main"],
        env={**os.environ, "GIT_SSH_COMMAND": str(ssh)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    children = Path(f"/proc/{run.pid}/task/{run.pid}/children")
    deadline = time.monotonic() + 60
    while not (fetching := [p for p in map(int, children.read_text().split()) if _is_fetch(p)]):
        assert time.monotonic() < deadline, "git fetch never started"
        time.sleep(0.05)
    (git_pid,) = fetching
    run.kill()
    run.wait()
    deadline = time.monotonic() + 10
    while _running(git_pid):  # not a timing assertion: anything below the bound passes
        assert time.monotonic() < deadline, f"git (pid {git_pid}) outlived the killed run"
        time.sleep(0.05)


def test_a_child_whose_run_is_gone_never_starts() -> None:
    """setpriv sets the parent-death signal only once it runs: a run killed before then sends
    none, so the child checks that its parent is still the run before it execs the command.
    Given a pid that is not its parent (1), it does not start; given the run's, it does."""
    argv, preexec = child(["sh", "-c", "echo started"])
    if preexec is not None:
        pytest.skip("no setpriv here: the preexec_fn checks the parent itself")
    at = argv.index(str(os.getpid()))
    done = subprocess.run([*argv[:at], "1", *argv[at + 1 :]], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (1, "")
    done = subprocess.run(argv, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "started\n")


def _is_fetch(pid: int) -> bool:
    try:
        return b"fetch" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False


def _running(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"  # a zombie has exited: only its exit status is left


WRITERS = (
    ["queue", "import"],
    ["queue", "export"],
    ["overlay", "build"],
    ["rebase", "--onto", "1.1"],
)


@pytest.mark.parametrize("argv", WRITERS, ids=" ".join)
def test_one_writer_at_a_time_in_a_checkout(
    run: Run, tiny: Project, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tiny
    monkeypatch.setenv(LOCK_TIMEOUT_ENV, "0.2")
    before = snapshot(project.root, skip_git=True)
    fd = os.open(project.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a running rebase, queue or build holds it
        assert run("--project", project.root, *argv) == (
            1,
            "",
            "vllm-patchset: another vllm-patchset rebase, queue or overlay build is running in"
            f" {project.root} (waited 0.2 s): nothing was changed\n",
        )
    finally:
        os.close(fd)
    assert snapshot(project.root, skip_git=True) == before


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
def test_bad_lock_timeout_is_one_line(
    run: Run, tiny: Project, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOCK_TIMEOUT_ENV, value)
    assert run("--project", tiny.root, "overlay", "build") == (
        2,
        "",
        f"vllm-patchset: VLLM_PATCHSET_LOCK_TIMEOUT={value!r}: expected a number of seconds,"
        " e.g. 60\n",
    )


# -- 8. one line, never a traceback ------------------------------------------------------------------
ENCODINGS = [  # (environment, target dir name, what the first line shows of it)
    ({"PYTHONIOENCODING": "ascii"}, "sité", b"sit\\xe9"),
    ({"LC_ALL": "C"}, b"site\xff", b"site\xff"),
    ({"PYTHONIOENCODING": "utf-8"}, b"site\xff", b"site\xff"),
    ({"LC_ALL": "C", "PYTHONIOENCODING": "ascii"}, "sité", b"sit\\xe9"),
]


@pytest.mark.parametrize(("env", "name", "shown"), ENCODINGS)
def test_output_the_terminal_cannot_encode(
    overlay: Overlay,
    pristine: Pristine,
    tmp_path: Path,
    env: dict[str, str],
    name: str | bytes,
    shown: bytes,
) -> None:
    site = Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), os.fsencode(name))))
    for part in ("vllm/__init__.py", "vllm-0.24.0.dist-info/METADATA", *CHANGED):
        (site / part).parent.mkdir(parents=True, exist_ok=True)
        os.link(pristine.root / part, site / part)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_patchset",
            *map(str, deploy_args(overlay, "status", "--target", site)),
        ],
        capture_output=True,
        env={**os.environ, **env},
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (0, b"")
    line = os.fsencode(tmp_path) + b"/" + shown
    assert (
        done.stdout.splitlines()[0]
        == b"overlay status: not applied ("
        + line
        + b"/vllm, 0.24.0; overlay for 0.24.0: "
        + ", ".join(PATCHES).encode()
        + b")"
    )


@pytest.mark.parametrize(
    "argv",
    [["matrix", "--json", "1.0", "1.1"], ["overlay", "verify"], ["overlay", "--help"]],
    ids=" ".join,
)
def test_a_closed_pipe_ends_quietly(
    overlay: Overlay, target: Path, tiny: Project, argv: list[str]
) -> None:
    project = tiny
    if argv[0] == "overlay":
        argv = [*argv, "--target", str(target)]
        project = overlay.project
    command = [sys.executable, "-m", "vllm_patchset", "--project", str(project.root)]
    code, err = to_closed_pipe([*command, "--cache-dir", str(project.cache_dir), *argv])
    assert code == 128 + signal.SIGPIPE
    if argv[0] == "matrix":  # its timing line goes to stderr unless the pipe broke first
        assert re.fullmatch(r"(matrix: 2 trees x 3 patches in \d+\.\d s\n)?", err), err
    else:
        assert err == ""


def fake_python(tmp: Path, body: str) -> str:
    exe = tmp / "python"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


FAKE_PYTHONS = [  # (script body or None for a missing file, the reason after "cannot run")
    ("echo garbage", "no answer (is it a Python interpreter?)"),
    ("echo oops >&2; exit 3", "exit 3: oops (is it a Python interpreter?)"),
    (None, "No such file or directory"),
]


@pytest.mark.parametrize(("body", "why"), FAKE_PYTHONS)
@pytest.mark.parametrize("argv", [["fetch"], ["overlay", "status"]], ids=" ".join)
def test_a_fake_python_cannot_run(
    run: Run, overlay: Overlay, tmp_path: Path, body: str | None, why: str, argv: list[str]
) -> None:
    exe = fake_python(tmp_path, body) if body else str(tmp_path / "no-such-python")
    args = ("--project", overlay.project.root, "--cache-dir", overlay.project.cache_dir)
    assert run(*args, *argv, "--python", exe) == (
        2,
        "",
        f"vllm-patchset: cannot run --python {exe}: {why}\n",
    )


USAGE = [
    (["matrix", "--ref", "v1.0"], "--ref REF goes with --git URL|PATH"),
    (["matrix", "--git", "/nowhere"], "--git needs --ref REF"),
]


@pytest.mark.parametrize(
    ("argv", "message"), USAGE, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_usage_mistakes_are_one_line(
    run: Run, tiny: Project, argv: list[str], message: str
) -> None:
    assert run("--project", tiny.root, *argv) == (2, "", f"vllm-patchset: {message}\n")


DISK_FULL = """\
import json, os, shutil, subprocess, sys
site, cli = sys.argv[1], json.loads(sys.argv[2])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", site], check=True)
for rel, data in json.loads(sys.stdin.read()).items():
    os.makedirs(os.path.dirname(os.path.join(site, rel)), exist_ok=True)
    with open(os.path.join(site, rel), "w") as out:
        out.write(data)
with open(os.path.join(site, "filler"), "wb", buffering=0) as out:  # every block taken
    try:
        while True:
            out.write(b"x" * 4096)
            out.flush()
    except OSError:
        pass
sys.path.insert(0, sys.argv[3])
from support import snapshot
before = snapshot(site)
done = subprocess.run(cli + ["--target", site], capture_output=True, text=True)
print(json.dumps([done.returncode, done.stdout, done.stderr, snapshot(site) == before]))
"""


def test_disk_full_names_the_file_and_changes_nothing(
    overlay: Overlay, pristine: Pristine, tmp_path: Path
) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip(
            "a full disk is a small tmpfs mounted in a private namespace: needs root and unshare(1)"
        )
    site = tmp_path / "site"
    site.mkdir()
    files = {
        part: (pristine.root / part).read_text()
        for part in ("vllm/__init__.py", "vllm-0.24.0.dist-info/METADATA", *CHANGED)
    }
    command = [sys.executable, "-m", "vllm_patchset", *map(str, deploy_args(overlay, "apply"))]
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            sys.executable,
            "-c",
            DISK_FULL,
            str(site),
            json.dumps(command),
            str(REPO / "tests"),
        ],
        input=json.dumps(files),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    code, out, err, unchanged = json.loads(done.stdout)
    assert (code, out, unchanged) == (1, "", True)
    assert err == (
        f"vllm-patchset: cannot write {site}/{STATE}/journal.jsonl: No space left on device;"
        " nothing was changed\n"
    )


@pytest.fixture(scope="module")
def fresh_cache(
    tmp_path_factory: pytest.TempPathFactory, story: Story
) -> Iterator[tuple[Path, str]]:
    """A cache of its own, and a local package index serving the story's pin: a tag can be
    damaged and fetched again without touching the story's mirror."""
    folder = tmp_path_factory.mktemp("fresh-cache")
    with LocalIndex(folder / "index") as index:
        index.publish("vllm-1.0.tar.gz", sdist_bytes("1.0", story.upstream.files("1.0")))
        yield folder / "cache", index.url


@pytest.mark.parametrize("argv", READERS, ids=" ".join)
def test_a_mirror_tag_it_did_not_make_is_fetched_again(
    run: Run, tiny: Project, fresh_cache: tuple[Path, str], argv: list[str]
) -> None:
    cache, index = fresh_cache
    pyproject = tiny.pyproject
    pyproject.write_text(pyproject.read_text().replace(tiny.index_url, index))
    args = ("--project", tiny.root, "--cache-dir", cache)
    assert run(*args, "fetch", "1.0")[0] == 0  # the first test downloads it
    expected = run(*args, *argv)  # with the tag as the tool made it
    mirror = cache / "mirror.git"
    good = git(mirror, "rev-parse", "v1.0^{commit}").strip()
    junk = git(mirror, "commit-tree", f"{good}^{{tree}}", "-m", "vllm 1.0\n\nnot json")
    git(mirror, "tag", "-f", "v1.0", junk.strip())
    code, out, err = run(*args, *argv)
    assert (code, out) == expected[:2]
    note = (
        "vllm-patchset: the mirror's tag v1.0 was not made by vllm-patchset (its message is"
        " not the expected JSON): fetching it again\n"
    )

    def timeless(text: str) -> str:  # matrix prints its time on stderr
        return re.sub(r" in \d+\.\d s$", " in N s", text, flags=re.M)

    assert timeless(err) == note + timeless(expected[2])
    assert git(mirror, "rev-parse", "v1.0^{commit}").strip() == good
