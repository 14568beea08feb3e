"""The queue on the synthetic story: the series as commits on the pin, and back, byte-identical
without edits; an edit becomes a patch; uncommitted edits are refused. (The real series' round
trip: test_real_series.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import git
from synthetic import STORY_FIX, STORY_LOCAL, UTILS
from vllm_patchset.cli import main
from vllm_patchset.infra.config import Project


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_import_export_round_trip_is_byte_identical(
    tiny: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(tiny.patches_dir)
    root = str(tiny.root)
    assert main(["--project", root, "queue", "import"]) == 0
    queue = tiny.root / ".queue"
    log = git(queue, "log", "--format=%s", "refs/vllm-patchset/base..HEAD")
    assert log == f"{STORY_LOCAL.subject}\n{STORY_FIX.subject}\n"
    assert main(["--project", root, "queue", "export", "--drop"]) == 0
    assert snapshot(tiny.patches_dir) == before
    assert not queue.exists()
    assert capsys.readouterr().out == (
        f"queue: 2 patch(es) as commits on 1.0 in {queue}\n"
        f"next: change the code in {queue} and `git commit` there (a patch's trailers:"
        " Upstream-PR, Introduced-by, Introduced-in, Applied-upstream, Regression-test),"
        " then `vllm-patchset queue export`\n"
        "exported 2 patch(es) to patches/\n"
        "next: `vllm-patchset overlay build --update-lock`, then `vllm-patchset check`;"
        " commit patches/ and the lock\n"
    )


def test_edit_loop_adds_a_patch(tiny: Project, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(tiny.root)
    assert main(["--project", root, "queue", "import"]) == 0
    queue = tiny.root / ".queue"
    target = queue / UTILS
    target.write_text(target.read_text().replace('"""Utilities."""', '"""Small utilities."""', 1))
    message = (
        "docs: say small\n\nWhy.\n\nUpstream-PR: none (local)\nIntroduced-by: none\n"
        "Introduced-in: 1.0\nApplied-upstream:\nRegression-test: tests/test_queue.py\n"
    )
    git(queue, "commit", "-q", "-am", message)
    assert main(["--project", root, "queue", "export"]) == 0
    series = (tiny.patches_dir / "series").read_text().splitlines()
    assert series == [STORY_FIX.name, STORY_LOCAL.name, "0003-docs-say-small.patch"]
    patch = (tiny.patches_dir / "0003-docs-say-small.patch").read_text()
    assert '-"""Utilities."""\n+"""Small utilities."""\n' in patch
    capsys.readouterr()


def test_export_refuses_uncommitted_edits(
    tiny: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tiny.root)
    assert main(["--project", root, "queue", "import"]) == 0
    (tiny.root / ".queue" / "vllm" / "__init__.py").write_text("# edited\n")
    before = snapshot(tiny.patches_dir)
    assert main(["--project", root, "queue", "export"]) == 1
    assert capsys.readouterr().err.endswith(
        "has uncommitted changes: commit them (git commit) first\n"
    )
    assert snapshot(tiny.patches_dir) == before
    # A second import without --force is refused too.
    assert main(["--project", root, "queue", "import"]) == 2


# (the snapshot of patches/ that import left in the queue's git dir, damaged; what is wrong)
DAMAGED_SNAPSHOTS = [
    (b"{", "not JSON (Expecting property name enclosed in double quotes at line 1 column 2)"),
    (b'["series"]', "a JSON array, not a JSON object"),
    (b'{"series": 1}', "\"['series']\" is a JSON number, not a JSON string"),
]


@pytest.mark.parametrize(("data", "why"), DAMAGED_SNAPSHOTS)
def test_export_refuses_a_damaged_snapshot(
    tiny: Project, capsys: pytest.CaptureFixture[str], data: bytes, why: str
) -> None:
    root = str(tiny.root)
    assert main(["--project", root, "queue", "import"]) == 0
    snapshot_file = tiny.root / ".queue" / ".git" / "vllm-patchset-patches.json"
    snapshot_file.write_bytes(data)
    before = snapshot(tiny.patches_dir)
    capsys.readouterr()
    assert main(["--project", root, "queue", "export"]) == 2
    assert capsys.readouterr().err == (
        f"vllm-patchset: {snapshot_file}: unreadable ({why}): import again\n"
    )
    assert snapshot(tiny.patches_dir) == before
