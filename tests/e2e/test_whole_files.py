"""A patch that adds a file, and one that deletes a file, end to end on a synthetic upstream
(tests/synthetic.py): the series, `overlay build` and its lock, `check`, `matrix` (upstream
adds the same file: upstream; another one: a conflict naming it), `rebase`, `pack`, and the
deploy commands on an install of the synthetic release (apply creates the file, revert removes
it and restores the deleted one byte for byte; a killed apply is rolled back by the next run)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from killable import KILL_AT_ENV, KILL_ENV, KILLABLE
from support import cli, git
from synthetic import (
    BASE,
    BUGGY,
    MOE,
    MOE_TEXT,
    UTILS,
    UTILS_TEXT,
    PatchSpec,
    SyntheticUpstream,
    make_project,
)
from vllm_patchset.deploy import guard
from vllm_patchset.errors import BadInput
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.lock import Lock, LockEntry
from vllm_patchset.series.patches import load_series

KERNEL = "vllm/layers/kernel.py"
KERNEL_TEXT = '''\
"""The scale of the experts' inputs, in a module of its own."""


def input_scale(a1_scale, a1_gscale):
    return a1_gscale if a1_scale is None else a1_scale
'''
USES_KERNEL = "        scale = input_scale(self.a1_scale, self.a1_gscale)\n"
IMPORT = "import math\n"
IMPORTS_KERNEL = "import math\n\nfrom vllm.layers.kernel import input_scale\n"
ADD = PatchSpec(
    "0001-moe-input-scale-module.patch",
    {MOE: (BUGGY, USES_KERNEL)},
    subject="moe: the input scale in a module of its own",
    adds={KERNEL: KERNEL_TEXT},
)
DELETE = PatchSpec(
    "0002-utils-gone.patch",
    {},
    subject="utils: gone",
    upstream_pr="none (local)",
    deletes=(UTILS,),
)


def sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def whole(tmp_path: Path, synthetic_cache: Path) -> tuple[SyntheticUpstream, Project]:
    """Release 1.0, and a project pinned to it whose series adds a module and deletes one."""
    upstream = SyntheticUpstream(tmp_path / "upstream")
    upstream.release("1.0", BASE)
    project = make_project(
        tmp_path / "project", synthetic_cache, upstream, "1.0", series=[ADD, DELETE]
    )
    return upstream, project


def test_the_series_parses_added_and_deleted_files(
    whole: tuple[SyntheticUpstream, Project],
) -> None:
    _, project = whole
    series = load_series(project.series_file, project.upstreamed_file)
    add, delete = series.active
    assert [(f.path, f.change) for f in add.files] == [(KERNEL, "added"), (MOE, "modified")]
    assert (add.files[0].whole, add.files[1].whole) == (KERNEL_TEXT.encode(), None)
    assert [(f.path, f.change, f.whole) for f in delete.files] == [
        (UTILS, "deleted", UTILS_TEXT.encode())
    ]


def test_the_lock_records_absent_sides(whole: tuple[SyntheticUpstream, Project]) -> None:
    _, project = whole
    lock = Lock.load(project.lock_path)
    patched_moe = MOE_TEXT.replace(BUGGY, USES_KERNEL)
    assert lock.entries == (
        LockEntry(KERNEL, None, sha(KERNEL_TEXT), (ADD.name,)),
        LockEntry(MOE, sha(MOE_TEXT), sha(patched_moe), (ADD.name,)),
        LockEntry(UTILS, sha(UTILS_TEXT), None, (DELETE.name,)),
    )
    assert (project.overlay_dir / KERNEL).read_text() == KERNEL_TEXT
    assert not (project.overlay_dir / UTILS).exists()
    doc = json.loads(project.lock_path.read_text())
    assert doc["schema"] == 2
    assert doc["files"][KERNEL]["pristine_sha256"] is None
    assert doc["files"][UTILS]["patched_sha256"] is None


def test_a_later_patch_edits_the_added_file(tmp_path: Path, synthetic_cache: Path) -> None:
    upstream = SyntheticUpstream(tmp_path / "upstream")
    upstream.release("1.0", BASE)
    edit = PatchSpec(
        "0002-kernel-docstring.patch",
        {KERNEL: ("in a module of its own", "in a module of its own, edited")},
        upstream_pr="none (local)",
    )
    project = make_project(
        tmp_path / "project", synthetic_cache, upstream, "1.0", series=[ADD, edit]
    )
    lock = Lock.load(project.lock_path)
    edited = KERNEL_TEXT.replace("in a module of its own", "in a module of its own, edited")
    assert lock.entry(KERNEL) == LockEntry(KERNEL, None, sha(edited), (ADD.name, edit.name))


def test_a_file_in_a_new_folder_is_refused(tmp_path: Path, synthetic_cache: Path) -> None:
    upstream = SyntheticUpstream(tmp_path / "upstream")
    upstream.release("1.0", BASE)
    new = PatchSpec("0001-new-package.patch", {}, adds={"vllm/kernels/x.py": "x = 1\n"})
    with pytest.raises(BadInput) as error:
        make_project(tmp_path / "project", synthetic_cache, upstream, "1.0", series=[new])
    assert str(error.value) == (
        f"vllm/kernels/x.py: {new.name} adds a file in a folder git:v1.0 does not have"
        " (vllm/kernels/): a patch adds files only in the package's own folders"
    )


def install(root: Path, files: dict[str, str], version: str = "1.0") -> Path:
    """An install of the synthetic release: its package and a dist-info naming its version."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    dist = root / f"vllm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n\n")
    return root


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_check_then_deploy_round_trip(
    whole: tuple[SyntheticUpstream, Project], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    upstream, project = whole
    root = project.root
    code, out, err = cli(capsys, root, "check")
    assert (code, err) == (0, ""), out
    site = install(tmp_path / "site", upstream.files("1.0"))
    before = tree_bytes(site)
    t = str(site)
    head = f"({site}/vllm, 1.0; overlay for 1.0: {ADD.name}, {DELETE.name})"
    code, out, err = cli(capsys, root, "overlay", "diff", "--target", t)
    assert (code, err) == (0, ""), out
    assert f"--- /dev/null\n+++ b/{KERNEL}\n@@ -0,0 +1,5 @@\n" in out
    assert f"--- a/{UTILS}\n+++ /dev/null\n" in out
    code, out, err = cli(capsys, root, "overlay", "apply", "--target", t)
    assert (code, out, err) == (
        0,
        f"overlay apply: applied {head}\n"
        f"  patch      {KERNEL}\n"
        f"  patch      {MOE}\n"
        f"  patch      {UTILS}\n",
        "",
    )
    assert (site / KERNEL).read_text() == KERNEL_TEXT
    assert not (site / UTILS).exists()
    assert cli(capsys, root, "overlay", "verify", "--target", t)[:2] == (
        0,
        f"overlay verify: verified {head}\n"
        f"  patched    {KERNEL}\n"
        f"  patched    {MOE}\n"
        f"  patched    {UTILS}\n",
    )
    code, out, _ = cli(capsys, root, "overlay", "status", "--target", t)
    assert (code, out.splitlines()[0]) == (0, f"overlay status: applied {head}")
    assert "    applied     0002-utils-gone.patch" in out.splitlines()
    code, out, err = cli(capsys, root, "overlay", "diff", "--target", t)
    assert (code, err) == (0, "")
    code, out, err = cli(capsys, root, "overlay", "diff", "--pristine", "--target", t)
    assert (code, err) == (0, ""), out
    assert f"--- /dev/null\n+++ b/{KERNEL}\n" in out
    assert f"--- a/{UTILS}\n+++ /dev/null\n" in out
    code, out, err = cli(capsys, root, "overlay", "revert", "--target", t)
    assert (code, err) == (0, ""), out
    assert tree_bytes(site) == before  # the added file gone, the deleted one back, byte for byte
    assert not (site / ".vllm-patchset").exists()


OTHER_KERNEL = KERNEL_TEXT.replace("a1_gscale if", "1.0 if")
OTHER_UTILS = UTILS_TEXT + "\n\ndef extra():\n    return 1\n"
PATCHED_MOE = MOE_TEXT.replace(BUGGY, USES_KERNEL)
RELEASES: dict[str, dict[str, str | None]] = {  # each on 1.0
    "1.1": {KERNEL: KERNEL_TEXT, MOE: PATCHED_MOE},  # the fix, as the patch: upstream
    "1.2": {KERNEL: OTHER_KERNEL},  # another file at the path it adds: a conflict
    "1.3": {UTILS: None},  # the file it deletes is gone: upstream
    "1.4": {UTILS: OTHER_UTILS},  # the file it deletes changed: a conflict
    "1.5": {KERNEL: KERNEL_TEXT},  # the module alone: the patch leaves it out
}


def releases(upstream: SyntheticUpstream) -> None:
    for version, changes in RELEASES.items():
        upstream.release(version, changes, base="1.0")


def test_matrix_over_releases(
    whole: tuple[SyntheticUpstream, Project], capsys: pytest.CaptureFixture[str]
) -> None:
    upstream, project = whole
    releases(upstream)
    refs = [a for v in RELEASES for a in ("--ref", f"v{v}")]
    code, out, err = cli(
        capsys, project.root, "--verbose", "matrix", "--git", str(upstream.path), *refs
    )
    assert err.startswith("matrix: 5 trees x 2 patches in ")
    assert (code, out) == (
        0,
        "version   0001                   0002\n"
        "git:v1.1  upstream               applies\n"
        "git:v1.2  conflict *             applies\n"
        "git:v1.3  applies                upstream\n"
        "git:v1.4  applies                conflict *\n"
        "git:v1.5  applies (refreshed) *  applies\n"
        f"0001  patches/{ADD.name}\n"
        f"0002  patches/{DELETE.name}\n"
        "states: applies (needed, applies cleanly), upstream (the version has the fix), absent"
        " (the code it fixes is not there), conflict (needed, does not apply); (verdict) when"
        " finer, * a warning below\n"
        f"* WARNING git:v1.2 0001: {KERNEL}: git:v1.2 has another file at the path it adds\n"
        f"* WARNING git:v1.4 0002: {UTILS}: the file it deletes differs on git:v1.4\n"
        f"* WARNING git:v1.5 0001: {KERNEL}: there already (partly upstream); the patch as"
        " placed here leaves it out\n",
    )


def test_overlay_build_on_other_releases(
    whole: tuple[SyntheticUpstream, Project], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A conflict names the path; where upstream has the module already, the patch as placed
    there leaves it out (upstream's file is not overlaid)."""
    upstream, project = whole
    releases(upstream)
    git_base = ("--git", str(upstream.path), "--ref")
    out_dir = str(tmp_path / "out")
    code, out, err = cli(
        capsys, project.root, "overlay", "build", *git_base, "v1.2", "--out", out_dir
    )
    assert (code, out, err) == (
        1,
        "",
        f"vllm-patchset: {ADD.name} does not apply to git:v1.2: {KERNEL}: git:v1.2 has another"
        f" file at the path it adds (leave it out with --skip {ADD.name})\n",
    )
    code, out, err = cli(
        capsys, project.root, "overlay", "build", *git_base, "v1.5", "--out", out_dir
    )
    assert (code, err) == (0, "")
    lock = Lock.load(tmp_path / "out" / "overlay.lock.json")
    assert [(e.path, e.change, e.patches) for e in lock.entries] == [
        (MOE, "modified", (ADD.name,)),
        (UTILS, "deleted", (DELETE.name,)),
    ]


def onto(upstream: SyntheticUpstream, version: str) -> tuple[str, ...]:
    return ("--onto-git", str(upstream.path), "--ref", f"v{version}")


def checkout_bytes(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def test_rebase_onto_a_release_with_the_module_archives_the_patch(
    whole: tuple[SyntheticUpstream, Project], capsys: pytest.CaptureFixture[str]
) -> None:
    upstream, project = whole
    releases(upstream)
    code, out, err = cli(capsys, project.root, "rebase", *onto(upstream, "1.1"))
    assert (code, err) == (0, "")
    assert out.splitlines()[:3] == [
        "rebase 1.0 -> git:v1.1: done",
        f"  {ADD.name}  upstream  -> patches/upstreamed/ (Applied-upstream: 1.1)",
        "    * Applied-upstream: 1.1 (the earliest release in the local mirror, searching back"
        " from 1.1, that has the fix)",
    ]
    lock = Lock.load(project.lock_path)
    assert [(e.path, e.change) for e in lock.entries] == [(UTILS, "deleted")]
    assert cli(capsys, project.root, "check") == (0, "check: 2 patches, 0 problem(s)\n", "")


def test_rebase_onto_a_release_with_another_file_stops_naming_it_then_continues(
    whole: tuple[SyntheticUpstream, Project], capsys: pytest.CaptureFixture[str]
) -> None:
    upstream, project = whole
    releases(upstream)
    root = project.root
    before = checkout_bytes(root)
    code, out, err = cli(capsys, root, "rebase", *onto(upstream, "1.2"))
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert lines[:3] == [
        "rebase 1.0 -> git:v1.2: stopped",
        f"  {ADD.name}  conflict  CONFLICT: the rebase stopped here",
        f"WARNING: {ADD.name}: {KERNEL}: git:v1.2 has another file at the path it adds",
    ]
    assert lines[3:5] == [
        f"{ADD.name} on git:v1.2: conflict",
        f"  hunk 1 {KERNEL} (new file): git:v1.2 has another file at its path",
    ]
    assert f"  2. resolve the conflict in: {KERNEL}" in lines
    assert {k: v for k, v in checkout_bytes(root).items() if not k.startswith(".rebase/")} == before
    # The hand resolution: the patch's module over upstream's, and the patch's edit.
    work = root / ".rebase" / "worktree"
    (work / KERNEL).write_text(KERNEL_TEXT)
    (work / MOE).write_text(PATCHED_MOE)
    git(work, "add", KERNEL, MOE)
    git(work, "am", "--continue")
    code, out, err = cli(capsys, root, "rebase", "--continue")
    assert (code, err) == (0, ""), out
    assert out.splitlines()[0] == "rebase 1.0 -> git:v1.2: done"
    lock = Lock.load(project.lock_path)
    assert [(e.path, e.change) for e in lock.entries] == [
        (KERNEL, "modified"),
        (MOE, "modified"),
        (UTILS, "deleted"),
    ]
    assert cli(capsys, root, "check") == (0, "check: 2 patches, 0 problem(s)\n", "")


def test_rebase_onto_a_release_with_the_module_alone_leaves_it_out_of_the_patch(
    whole: tuple[SyntheticUpstream, Project], capsys: pytest.CaptureFixture[str]
) -> None:
    upstream, project = whole
    releases(upstream)
    code, out, err = cli(capsys, project.root, "rebase", *onto(upstream, "1.5"))
    assert (code, err) == (0, "")
    assert out.splitlines()[:4] == [
        "rebase 1.0 -> git:v1.5: done",
        f"  {ADD.name}  applies   refreshed (content changed)",
        f"  {DELETE.name}              applies   refreshed (unchanged)",
        f"WARNING: {ADD.name}: {KERNEL}: there already (partly upstream); the patch as placed"
        " here leaves it out",
    ]
    patch = load_series(project.series_file, project.upstreamed_file).active[0]
    assert [(f.path, f.change) for f in patch.files] == [(MOE, "modified")]
    assert cli(capsys, project.root, "check") == (0, "check: 2 patches, 0 problem(s)\n", "")


def test_pack_carries_the_added_file_and_deploys_it(
    whole: tuple[SyntheticUpstream, Project], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The packed wheel holds the added module (and not the deleted one); its tool, run from
    the wheel's files with no checkout around, applies and reverts that overlay."""
    upstream, project = whole
    code, out, err = cli(capsys, project.root, "overlay", "pack", "--out", str(tmp_path / "dist"))
    assert (code, err) == (0, ""), out
    wheel = next((tmp_path / "dist").glob("*.whl"))
    packed = "vllm_patchset/_overlay/"
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.startswith(packed)]
        assert names == [f"{packed}overlay.lock.json", f"{packed}{KERNEL}", f"{packed}{MOE}"]
        assert archive.read(f"{packed}{KERNEL}") == KERNEL_TEXT.encode()
        archive.extractall(tmp_path / "unpacked")
    site = install(tmp_path / "site", upstream.files("1.0"))
    before = tree_bytes(site)
    elsewhere = tmp_path / "elsewhere"  # no checkout at or above it
    elsewhere.mkdir()

    def tool(*args: str) -> tuple[int, str]:
        env = {**os.environ, "PYTHONPATH": str(tmp_path / "unpacked")}
        done = subprocess.run(
            [sys.executable, "-m", "vllm_patchset", "overlay", *args, "--target", str(site)],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return done.returncode, done.stdout + done.stderr

    assert tool("apply")[0] == 0
    assert (site / KERNEL).read_text() == KERNEL_TEXT
    assert not (site / UTILS).exists()
    code, out = tool("verify")
    assert (code, out.splitlines()[1:]) == (
        0,
        [f"  patched    {KERNEL}", f"  patched    {MOE}", f"  patched    {UTILS}"],
    )
    assert tool("revert")[0] == 0
    assert tree_bytes(site) == before


def test_the_guard_checks_added_and_deleted_files(
    whole: tuple[SyntheticUpstream, Project], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    upstream, project = whole
    site = install(tmp_path / "site", upstream.files("1.0"))
    assert cli(capsys, project.root, "overlay", "apply", "--target", str(site))[0] == 0
    active = guard.Outcome(
        True, f"vllm-patchset: overlay active on vllm 1.0: {ADD.name}, {DELETE.name} (3 files)"
    )
    assert guard.check(site) == active

    def partial(name: str) -> guard.Outcome:
        return guard.Outcome(
            False,
            f"vllm-patchset: the overlay on vllm 1.0 at {site}/vllm is PARTIAL: 1 of 3 files are"
            f" not patched ({name}): its fixes are NOT active (run `vllm-patchset overlay"
            " status`, then apply)",
        )

    (site / UTILS).write_text(UTILS_TEXT)  # the deleted module is back
    assert guard.check(site) == partial("utils.py")
    (site / UTILS).unlink()
    (site / KERNEL).unlink()  # the added module is gone
    assert guard.check(site) == partial("kernel.py")
    # vllm reinstalled over it: its own files back, the added module left there (pip removes
    # only the files its RECORD lists): the overlay is gone all the same.
    (site / KERNEL).write_text(KERNEL_TEXT)
    (site / MOE).write_text(MOE_TEXT)
    (site / UTILS).write_text(UTILS_TEXT)
    assert guard.check(site) == guard.Outcome(
        False,
        f"vllm-patchset: the overlay applied to vllm 1.0 at {site}/vllm is GONE (vllm"
        " reinstalled?): its fixes are NOT active (run `vllm-patchset overlay apply`)",
    )
    code, out, _ = cli(capsys, project.root, "overlay", "status", "--target", str(site))
    assert (code, out.splitlines()[:4]) == (
        1,
        [
            f"overlay status: gone ({site}/vllm, 1.0; overlay for 1.0: {ADD.name}, {DELETE.name})",
            f"  patched    {KERNEL}",
            f"  pristine   {MOE}",
            f"  pristine   {UTILS}",
        ],
    )
    assert cli(capsys, project.root, "overlay", "apply", "--target", str(site))[0] == 0
    assert cli(capsys, project.root, "overlay", "revert", "--target", str(site))[0] == 0
    assert not (site / KERNEL).exists()


def test_apply_refuses_another_file_where_it_adds_one(
    whole: tuple[SyntheticUpstream, Project], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    upstream, project = whole
    site = install(tmp_path / "site", {**upstream.files("1.0"), KERNEL: OTHER_KERNEL})
    before = tree_bytes(site)
    code, out, err = cli(capsys, project.root, "overlay", "apply", "--target", str(site))
    assert (code, out) == (1, "")
    assert err.startswith(
        f"vllm-patchset: refusing to apply, nothing changed: {KERNEL} (sha256 {sha(OTHER_KERNEL)[:12]}:"
        " neither the pristine nor the patched vllm 1.0)"
    )
    assert tree_bytes(site) == before
    assert not (site / ".vllm-patchset").exists()
    # --force: it keeps that file's bytes, and revert puts them back.
    assert cli(capsys, project.root, "overlay", "apply", "--force", "--target", str(site))[0] == 0
    assert (site / KERNEL).read_text() == KERNEL_TEXT
    assert cli(capsys, project.root, "overlay", "revert", "--target", str(site))[0] == 0
    assert tree_bytes(site) == before


# Write points of the apply (two per whole file written: the temp file complete, renamed in):
# the journal, the originals of the modified and the deleted file (none for the added one), the
# modified and the added file (the deleted one is removed: no write point), the record.
APPLY_POINTS = 2 * (1 + 2 + 2 + 1)


def killable(project: Project, site: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`vllm-patchset overlay ARGS --target SITE` in a process of its own, with the tests' kill
    hook (tests/killable.py) reading `env`."""

    def tool(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        argv = ["--project", str(project.root), "overlay", *args, "--target", str(site)]
        return subprocess.run(
            [*KILLABLE, *argv],
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=120,
        )

    return tool


# Where apply is killed: each write point, and the removal of the file it deletes.
APPLY_KILLS = [{KILL_ENV: str(point)} for point in range(1, APPLY_POINTS + 1)]
APPLY_KILLS.append({KILL_AT_ENV: f"removed::{{site}}/{UTILS}"})


@pytest.mark.parametrize("kill", APPLY_KILLS, ids=lambda kill: "-".join(kill.values()))
def test_apply_killed_at_each_write_point_is_rolled_back(
    whole: tuple[SyntheticUpstream, Project], tmp_path: Path, kill: dict[str, str]
) -> None:
    """Killed at each write point, the next `overlay status` finishes the apply (killed after
    its commit point, the record's rename) or rolls it back: the added file gone, the deleted
    one back, byte for byte; `revert` then leaves the install as it was."""
    upstream, project = whole
    site = install(tmp_path / "site", upstream.files("1.0"))
    before = tree_bytes(site)
    tool = killable(project, site)
    killed = tool("apply", env={k: v.format(site=site) for k, v in kill.items()})
    assert killed.returncode == -signal.SIGKILL
    status = tool("status")
    assert status.returncode == 0, status.stdout + status.stderr
    if kill.get(KILL_ENV) == str(APPLY_POINTS):  # the record was in place: it had committed
        assert status.stdout.splitlines()[0].startswith("overlay status: applied")
        assert (site / KERNEL).read_text() == KERNEL_TEXT
        assert not (site / UTILS).exists()
        assert tool("revert").returncode == 0
    else:
        assert status.stdout.splitlines()[0].startswith("overlay status: not applied")
    assert tree_bytes(site) == before
    assert not (site / ".vllm-patchset").exists()


# Revert's write points: the journal, the modified file and the deleted one restored (the
# added file is removed: no write point); and the removal of the added file.
REVERT_KILLS = [{KILL_ENV: str(point)} for point in range(1, 2 * (1 + 2) + 1)]
REVERT_KILLS.append({KILL_AT_ENV: f"removed::{{site}}/{KERNEL}"})


@pytest.mark.parametrize("kill", REVERT_KILLS, ids=lambda kill: "-".join(kill.values()))
def test_revert_killed_at_each_write_point_is_finished(
    whole: tuple[SyntheticUpstream, Project], tmp_path: Path, kill: dict[str, str]
) -> None:
    upstream, project = whole
    site = install(tmp_path / "site", upstream.files("1.0"))
    before = tree_bytes(site)
    tool = killable(project, site)
    assert tool("apply").returncode == 0
    killed = tool("revert", env={k: v.format(site=site) for k, v in kill.items()})
    assert killed.returncode == -signal.SIGKILL
    status = tool("status")
    assert status.returncode == 0, status.stdout + status.stderr
    if kill.get(KILL_ENV) == "1":  # killed before its journal was in place: the overlay is whole
        assert status.stdout.splitlines()[0].startswith("overlay status: applied")
        assert tool("revert").returncode == 0
    else:
        assert status.stdout.splitlines()[0].startswith("overlay status: not applied")
    assert tree_bytes(site) == before
    assert not (site / ".vllm-patchset").exists()


@pytest.mark.parametrize("how", ["reinstalled", "uninstalled"])
def test_revert_after_pip_removes_the_module_it_added(
    whole: tuple[SyntheticUpstream, Project],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    how: str,
) -> None:
    """pip reinstalls (or uninstalls) vllm under the applied overlay: it puts back (removes)
    the files its RECORD lists and leaves the module the overlay added; revert removes it,
    with the folders that leaves empty."""
    upstream, project = whole
    files = upstream.files("1.0")
    site = install(tmp_path / "site", files)
    before = tree_bytes(site)
    t = str(site)
    assert cli(capsys, project.root, "overlay", "apply", "--target", t)[0] == 0
    (site / "vllm/layers/__pycache__").mkdir()  # as Python leaves it
    for rel, text in files.items():
        (site / rel).unlink(missing_ok=True)
        if how == "reinstalled":
            (site / rel).write_text(text)
    if how == "uninstalled":
        shutil.rmtree(site / "vllm-1.0.dist-info")
    code, out, err = cli(capsys, project.root, "overlay", "revert", "--target", t)
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == f"  note: removed what the overlay had added: {KERNEL}"
    assert tree_bytes(site) == (before if how == "reinstalled" else {})
    assert sorted(os.listdir(site)) == (
        ["vllm", "vllm-1.0.dist-info"] if how == "reinstalled" else []
    )
