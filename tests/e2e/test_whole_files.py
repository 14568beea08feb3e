"""A patch that adds a file, and one that deletes a file, end to end on a synthetic upstream
(tests/synthetic.py): the series, `overlay build` and its lock, `check`, `matrix` (upstream
adds the same file: upstream; another one: a conflict naming it), `rebase`, `pack`, and the
deploy commands on an install of the synthetic release (apply creates the file, revert removes
it and restores the deleted one byte for byte; a killed apply is rolled back by the next run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import cli
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
