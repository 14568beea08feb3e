"""Overlay build and its lock on the synthetic story: byte-identical rebuilds, a lock that does
not match, a stale lock, other bases, tree export. (The real lock: test_real_series.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import git
from synthetic import (
    BUGGY,
    CLAMP_BUG,
    CLAMP_FIXED,
    COMMENT,
    FIXED,
    MOE,
    NAME_NEW,
    NAME_OLD,
    STORY_ARCHIVED,
    STORY_FIX,
    STORY_LOCAL,
    UTILS,
    Story,
)
from vllm_patchset.cli import main
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.hashes import sha256_file
from vllm_patchset.overlay.lock import Lock

FIX = STORY_FIX.name
LOCAL = STORY_LOCAL.name


def overlay_files(root: Path) -> dict[str, bytes]:
    base = root / "overlay"
    return {
        str(p.relative_to(base)): p.read_bytes()
        for p in sorted(base.rglob("*"))
        if p.is_file() and p.name != "overlay.lock.json"
    }


def test_build_matches_the_committed_lock(
    tiny: Project, story: Story, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = Lock.load(tiny.lock_path)
    assert main(["--project", str(tiny.root), "overlay", "build"]) == 0
    assert capsys.readouterr().out == (
        f"overlay for vllm 1.0: 1 file(s) in {tiny.overlay_dir}\n"
        f"  {MOE} {(lock.entries[0].patched_sha256 or '')[:12]} <- {FIX}, {LOCAL}\n"
    )
    files = overlay_files(tiny.root)
    pristine = story.upstream.files("1.0")[MOE]
    assert files == {
        MOE: pristine.replace(BUGGY, COMMENT + FIXED).replace(NAME_OLD, NAME_NEW).encode()
    }
    assert (lock.version, lock.patches) == ("1.0", (FIX, LOCAL))
    assert [(e.path, e.patches) for e in lock.entries] == [(MOE, (FIX, LOCAL))]
    assert lock.entries[0].patched_sha256 == sha256_file(tiny.overlay_dir / MOE)
    # Rebuilding gives byte-identical files.
    assert main(["--project", str(tiny.root), "overlay", "build"]) == 0
    assert overlay_files(tiny.root) == files
    capsys.readouterr()


def test_lock_mismatch_names_the_file_and_changes_nothing(
    tiny: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(tiny.lock_path.read_text())
    doc["files"][MOE]["patched_sha256"] = "0" * 64
    tampered = json.dumps(doc, indent=2) + "\n"
    tiny.lock_path.write_text(tampered)
    assert main(["--project", str(tiny.root), "overlay", "build"]) == 1
    assert capsys.readouterr().err == (
        "vllm-patchset: overlay does not match overlay.lock.json: "
        f"{MOE}: patched sha256 differs (rebuild with --update-lock if the change is intended)\n"
    )
    assert not (tiny.overlay_dir / "vllm").exists()
    assert tiny.lock_path.read_text() == tampered
    # --update-lock rewrites it to the committed bytes.
    assert main(["--project", str(tiny.root), "overlay", "build", "--update-lock"]) == 0
    assert tiny.lock_path.read_text() == git(tiny.root, "show", "HEAD:overlay/overlay.lock.json")


def test_status_and_check_report_a_stale_lock(
    tiny: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(tiny.lock_path.read_text())
    doc["files"][MOE]["pristine_sha256"] = "1" * 64
    tiny.lock_path.write_text(json.dumps(doc))
    assert main(["--project", str(tiny.root), "status", "--json"]) == 1
    status = json.loads(capsys.readouterr().out)
    assert status["lock"] == f"stale ({MOE}: pristine sha256 differs)"
    assert main(["--project", str(tiny.root), "check"]) == 1
    assert capsys.readouterr().err == (
        f"lock overlay.lock.json: stale ({MOE}: pristine sha256 differs)\n"
    )


def test_overlay_for_another_base_needs_a_skip_for_what_conflicts(
    tiny: Project, story: Story, capsys: pytest.CaptureFixture[str]
) -> None:
    """On 0.9 (a git ref) the archived fix applies again (0.9 has the bug), the MoE fix is not
    needed (0.9 predates its code) and the local patch conflicts: refused until it is skipped,
    then an overlay of the archived fix alone, out of the project's own overlay."""
    out = tiny.root / "old-overlay"
    argv = ["--project", str(tiny.root), "overlay", "build", "--out", str(out)]
    base = ("--git", str(story.upstream.path), "--ref", "v0.9")
    assert main([*argv, *base]) == 1
    assert capsys.readouterr().err == (
        f"vllm-patchset: {LOCAL} does not apply to git:v0.9: hunk 1 ({MOE} @@ -24 +24 @@)"
        f" differs at line 20 (leave it out with --skip {LOCAL})\n"
    )
    assert not out.exists()
    assert main([*argv, *base, "--skip", LOCAL]) == 0
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == [".vllm-patchset-owned", "overlay.lock.json", UTILS]
    assert (out / UTILS).read_text() == story.upstream.files("0.9")[UTILS].replace(
        CLAMP_BUG, CLAMP_FIXED
    )
    lock = Lock.load(out / "overlay.lock.json")
    assert (lock.version, lock.patches) == ("0.9", (f"upstreamed/{STORY_ARCHIVED.name}",))
    assert not (tiny.overlay_dir / "vllm").exists()  # the pin's overlay: untouched
    assert tiny.lock_path.read_text() == git(tiny.root, "show", "HEAD:overlay/overlay.lock.json")
    capsys.readouterr()


def test_tree_export_pristine_and_patched(
    tiny: Project, story: Story, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pristine, patched = tmp_path / "pristine", tmp_path / "patched"
    assert main(["--project", str(tiny.root), "tree", str(pristine), "--pristine"]) == 0
    assert main(["--project", str(tiny.root), "tree", str(patched)]) == 0
    files = story.upstream.files("1.0")
    listed = sorted(str(p.relative_to(pristine)) for p in pristine.rglob("*") if p.is_file())
    assert listed == sorted([*files, "vllm-patchset-tree.json"])
    assert {f: (pristine / f).read_text() for f in files} == files
    lock = Lock.load(tiny.lock_path)
    assert {f: (patched / f).read_text() for f in files if f != MOE} == {
        f: t for f, t in files.items() if f != MOE
    }
    assert sha256_file(patched / MOE) == lock.entries[0].patched_sha256
    info = json.loads((patched / "vllm-patchset-tree.json").read_text())
    assert (info["version"], info["kind"], info["patches"]) == ("1.0", "overlay", [FIX, LOCAL])
    assert json.loads((pristine / "vllm-patchset-tree.json").read_text())["kind"] == "pristine"
    capsys.readouterr()
