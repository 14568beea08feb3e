"""Overlay build and its lock: byte-identical rebuilds, lock round trip, other bases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import ORACLE, committed
from vllm_patchset.cli import main
from vllm_patchset.config import Project
from vllm_patchset.lock import Lock, sha256_file

TRITON = "vllm/model_executor/layers/fused_moe/experts/triton_moe.py"
EMULATION = "vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py"
FIX2 = "0001-triton_moe-no-tensor-truthiness-when-quantizing-defe.patch"
FUSED = "0002-nvfp4_emulation_moe-fused-NVFP4-GEMMs-over-the-route.patch"
TOUCHED_BY = {EMULATION: (FIX2, FUSED), TRITON: (FIX2,)}


def overlay_files(root: Path) -> dict[str, bytes]:
    base = root / "overlay"
    return {
        str(p.relative_to(base)): p.read_bytes()
        for p in sorted(base.rglob("*"))
        if p.is_file() and p.name != "overlay.lock.json"
    }


def test_build_matches_committed_lock(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--project", str(project.root), "overlay", "build"]) == 0
    files = overlay_files(project.root)
    assert sorted(files) == [EMULATION, TRITON]
    lock = Lock.load(project.lock_path)
    assert lock.version == "0.24.0"
    assert lock.patches == (FIX2, FUSED)
    for entry in lock.entries:
        assert sha256_file(project.overlay_dir / entry.path) == entry.patched_sha256
        assert entry.patches == TOUCHED_BY[entry.path]
    text = files[TRITON].decode()
    assert "                self.a1_scale,\n" in text
    assert "self.a1_scale or self.a1_gscale" not in text
    assert "    def a1_scale(self) -> torch.Tensor:\n" in files[EMULATION].decode()
    # Rebuilding gives byte-identical files.
    assert main(["--project", str(project.root), "overlay", "build"]) == 0
    assert overlay_files(project.root) == files
    capsys.readouterr()


def test_lock_mismatch_names_the_file_and_changes_nothing(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(project.lock_path.read_text())
    doc["files"][TRITON]["patched_sha256"] = "0" * 64
    tampered = json.dumps(doc, indent=2) + "\n"
    project.lock_path.write_text(tampered)
    assert main(["--project", str(project.root), "overlay", "build"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "vllm-patchset: overlay does not match overlay.lock.json: "
        f"{TRITON}: patched sha256 differs (rebuild with --update-lock if the change is intended)\n"
    )
    assert not (project.overlay_dir / "vllm").exists()
    assert project.lock_path.read_text() == tampered
    # --update-lock rewrites it to the committed bytes.
    assert main(["--project", str(project.root), "overlay", "build", "--update-lock"]) == 0
    assert project.lock_path.read_bytes() == committed("overlay/overlay.lock.json")


def test_status_reports_stale_lock(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(project.lock_path.read_text())
    doc["files"][EMULATION]["pristine_sha256"] = "1" * 64
    project.lock_path.write_text(json.dumps(doc))
    assert main(["--project", str(project.root), "status", "--json"]) == 1
    status = json.loads(capsys.readouterr().out)
    assert status["lock"] == f"stale ({EMULATION}: pristine sha256 differs)"
    assert main(["--project", str(project.root), "check"]) == 1
    assert capsys.readouterr().err == (
        f"lock overlay.lock.json: stale ({EMULATION}: pristine sha256 differs)\n"
    )


def test_overlay_for_nightly_like_base(
    project: Project, nightly_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = project.root / "nightly-overlay"
    argv = ["--project", str(project.root), "overlay", "build", "--out", str(out)]
    # The fused kernel (0002) is written for 0.24.0 and conflicts with this older base.
    assert main([*argv, "--git", str(nightly_repo), "--ref", "nightly"]) == 1
    assert capsys.readouterr().err == (
        f"vllm-patchset: {FUSED} does not apply to git:nightly: hunk 2 "
        "(vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py @@ -21 +46 @@) "
        f"differs at line 21 (leave it out with --skip {FUSED})\n"
    )
    assert not out.exists()
    assert main([*argv, "--git", str(nightly_repo), "--ref", "nightly", "--skip", FUSED]) == 0
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == [".vllm-patchset-owned", "overlay.lock.json", ORACLE]
    text = (out / ORACLE).read_text()
    assert "kE2M1ToFloat_handle.val = kE2M1ToFloat_handle.val.to(w13.device)" in text
    assert "layer.weight.device" not in text
    lock = Lock.load(out / "overlay.lock.json")
    assert lock.patches == (
        "upstreamed/0001-nvfp4-oracle-take-the-E2M1-table-s-device-from-w13.patch",
    )
    assert lock.version == "git:nightly"
    # The committed lock of the pin is untouched.
    assert not (project.overlay_dir / "vllm").exists()
    capsys.readouterr()


def test_tree_export_pristine_and_patched(
    project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pristine, patched = tmp_path / "pristine", tmp_path / "patched"
    assert main(["--project", str(project.root), "tree", str(pristine), "--pristine"]) == 0
    assert main(["--project", str(project.root), "tree", str(patched)]) == 0
    lock = Lock.load(project.lock_path)
    for entry in lock.entries:
        assert sha256_file(pristine / entry.path) == entry.pristine_sha256
        assert sha256_file(patched / entry.path) == entry.patched_sha256
    info = json.loads((patched / "vllm-patchset-tree.json").read_text())
    assert (info["version"], info["kind"], info["patches"]) == ("0.24.0", "overlay", [FIX2, FUSED])
    assert json.loads((pristine / "vllm-patchset-tree.json").read_text())["kind"] == "pristine"
    assert (pristine / "vllm" / "__init__.py").is_file()
    capsys.readouterr()
