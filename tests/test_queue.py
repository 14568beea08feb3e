"""The queue: the series as commits on the pin, and back, byte-identical without edits."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import git
from vllm_patchset.cli import main
from vllm_patchset.config import Project

FIX2 = "0001-triton_moe-no-tensor-truthiness-when-quantizing-defe.patch"
FUSED = "0002-nvfp4_emulation_moe-fused-NVFP4-GEMMs-over-the-route.patch"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_import_export_round_trip_is_byte_identical(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(project.patches_dir)
    root = str(project.root)
    assert main(["--project", root, "queue", "import"]) == 0
    queue = project.root / ".queue"
    log = git(queue, "log", "--format=%s", "refs/vllm-patchset/base..HEAD")
    assert log == (
        "nvfp4_emulation_moe: fused NVFP4 GEMMs over the routed experts only\n"
        "triton_moe: no tensor truthiness when quantizing deferred inputs\n"
    )
    assert main(["--project", root, "queue", "export", "--drop"]) == 0
    assert snapshot(project.patches_dir) == before
    assert not queue.exists()
    assert capsys.readouterr().out == (
        f"queue: 2 patch(es) as commits on 0.24.0 in {queue}\nexported 2 patch(es) to patches/\n"
    )


def test_edit_loop_adds_a_patch(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(project.root)
    assert main(["--project", root, "queue", "import"]) == 0
    queue = project.root / ".queue"
    target = (
        queue / "vllm" / "model_executor" / "layers" / "fused_moe" / "experts" / "triton_moe.py"
    )
    target.write_text(target.read_text().replace('"""Triton-based MoE', '"""Triton MoE', 1))
    message = (
        "docs: shorter docstring\n\nWhy.\n\nUpstream-PR: none (local)\nIntroduced-by: none\n"
        "Introduced-in: 0.24.0\nApplied-upstream:\nRegression-test: tests/test_queue.py\n"
    )
    git(queue, "commit", "-q", "-am", message)
    assert main(["--project", root, "queue", "export"]) == 0
    series = (project.patches_dir / "series").read_text().splitlines()
    assert series == [FIX2, FUSED, "0003-docs-shorter-docstring.patch"]
    patch = (project.patches_dir / "0003-docs-shorter-docstring.patch").read_text()
    assert '-"""Triton-based MoE expert implementations."""\n' in patch
    assert '+"""Triton MoE expert implementations."""\n' in patch
    capsys.readouterr()


def test_export_refuses_uncommitted_edits(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(project.root)
    assert main(["--project", root, "queue", "import"]) == 0
    (project.root / ".queue" / "vllm" / "__init__.py").write_text("# edited\n")
    before = snapshot(project.patches_dir)
    assert main(["--project", root, "queue", "export"]) == 1
    assert capsys.readouterr().err.endswith(
        "has uncommitted changes: commit them (git commit) first\n"
    )
    assert snapshot(project.patches_dir) == before
    # A second import without --force is refused too.
    assert main(["--project", root, "queue", "import"]) == 2
