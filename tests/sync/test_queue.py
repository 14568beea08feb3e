"""The queue on the synthetic story: the series as commits on the pin, and back, byte-identical
without edits; an edit becomes a patch; uncommitted edits are refused. (The real series' round
trip: test_real_series.py.) And tables of one commit's problems: its change, its trailers."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import git, project_at
from synthetic import STORY_FIX, STORY_LOCAL, UTILS
from vllm_patchset.cli import main
from vllm_patchset.infra.config import Project
from vllm_patchset.sync.queue import NEEDS, change_problems, message_trailers, said_trailers


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
        "Introduced-in: 1.0\nApplied-upstream:\nRegression-test: tests/gpu/test_synthetic.py::test_name\n"
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


# -- every problem at once -----------------------------------------------------------------------
NEEDS_PR = "the upstream pull request with the fix (https://github.com/vllm-project/vllm/pull/N), or `none (why)`"
NEEDS_BY = "the upstream pull request that brought the bug in (its URL), or `none (why)`"
NEEDS_IN = "the first release with the bug (e.g. 0.24.0), or `nightly`"
NEEDS_APPLIED = "the first release with the fix; empty while no release has it"
NEEDS_TEST = (
    "the test that fails on the pin and passes with the fix (tests/gpu/<file>.py::<test>; write it)"
)
GOOD_TRAILERS = (
    "Upstream-PR: none (local)\nIntroduced-by: none (local)\nIntroduced-in: 1.0\n"
    "Applied-upstream:\nRegression-test: tests/gpu/test_synthetic.py::test_name\n"
)


def short(queue: Path, rev: str) -> str:
    return git(queue, "rev-parse", rev).strip()[:12]


def test_export_lists_every_problem_of_every_commit_at_once(
    tiny: Project,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit with a change outside the package, two trailers missing and two wrong, under
    a template commit with no change and every trailer empty: all listed in one run, each
    commit with the command that fixes it; nothing written. Fixed with those commands, the
    export writes both."""
    root = str(tiny.root)
    assert main(["--project", root, "queue", "import"]) == 0
    queue = tiny.root / ".queue"
    utils = queue / UTILS
    utils.write_text(utils.read_text().replace('"""Utilities."""', '"""Small utilities."""'))
    (queue / "notes.txt").write_text("notes\n")
    git(queue, "add", "-A")
    message = (
        "docs: say small\n\nWhy.\n\nUpstream-PR: pr 5\nIntroduced-in: 1.0\n"
        "Regression-test: tests/gpu/test_synthetic.py::test_nope\n"
    )
    git(queue, "commit", "-q", "-m", message)
    assert main(["--project", root, "patch", "new", "moe: say why"]) == 0
    capsys.readouterr()
    before = snapshot(tiny.patches_dir)
    assert main(["--project", root, "queue", "export"]) == 1
    first, second = short(queue, "HEAD^"), short(queue, "HEAD")
    assert capsys.readouterr() == (
        f"{first} docs: say small (0003-docs-say-small.patch):\n"
        "  - changes notes.txt, outside the vllm/ package (take it out)\n"
        f"  - Introduced-by: missing ({NEEDS_BY})\n"
        f"  - Applied-upstream: missing ({NEEDS_APPLIED})\n"
        "  - Upstream-PR: 'pr 5' is not a pull request URL or number, nor `none (why)`\n"
        "  - Regression-test: tests/gpu/test_synthetic.py::test_nope does not exist in tests/\n"
        f"  fix: git -C {queue} rebase -i {first}^ (mark it `edit`, or `reword`)\n"
        f"{second} moe: say why (0004-moe-say-why.patch):\n"
        "  - no change: make the fix in the queue's files, then `git commit -a --amend`\n"
        f"  - Upstream-PR: empty ({NEEDS_PR})\n"
        f"  - Introduced-by: empty ({NEEDS_BY})\n"
        f"  - Introduced-in: empty ({NEEDS_IN})\n"
        f"  - Regression-test: empty ({NEEDS_TEST})\n"
        f"  fix: git -C {queue} commit --amend\n"
        f"queue export: 10 problem(s) in 2 of 4 commit(s) of {queue}; nothing was written\n",
        "",
    )
    assert snapshot(tiny.patches_dir) == before
    # In 60 columns, from the checkout's root: every line fits but the commands to copy,
    # which stay whole.
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.chdir(tiny.root)
    assert main(["--project", root, "queue", "export"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if len(line) > 60] == [
        f"  fix: git -C .queue rebase -i {first}^ (mark it `edit`, or `reword`)"
    ]
    assert lines[1:4] == [
        "  - changes notes.txt, outside the vllm/ package (take it",
        "    out)",
        "  - Introduced-by: missing (the upstream pull request that",
    ]
    # The commands it names fix them: the template commit amended with a change, the first
    # commit reworded and its stray file taken out in a `git rebase -i` stopped on it.
    moe = queue / "vllm" / "layers" / "moe.py"
    moe.write_text(moe.read_text().replace('"""A tiny MoE layer."""', '"""A MoE layer."""'))
    git(queue, "commit", "-q", "-a", "--amend", "-m", f"moe: say why\n\nWhy.\n\n{GOOD_TRAILERS}")
    editor = "sed -i '1s/^pick /edit /'"
    git(queue, "-c", f"sequence.editor={editor}", "rebase", "-q", "-i", f"{first}^")
    git(queue, "rm", "-q", "notes.txt")
    git(queue, "commit", "-q", "--amend", "-m", f"docs: say small\n\nWhy.\n\n{GOOD_TRAILERS}")
    git(queue, "rebase", "--continue")
    assert main(["--project", root, "queue", "export"]) == 0
    assert read_series(tiny)[2:] == ["0003-docs-say-small.patch", "0004-moe-say-why.patch"]
    capsys.readouterr()


def read_series(project: Project) -> list[str]:
    return (project.patches_dir / "series").read_text().splitlines()


def test_patch_new_writes_a_template_commit_and_says_the_next_steps(
    tiny: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a queue, `patch new` imports one first; the template's trailers each follow a
    comment saying what it needs."""
    root = str(tiny.root)
    queue = tiny.root / ".queue"
    monkeypatch.chdir(tiny.root)  # the commands to copy name the queue from here
    assert main(["--project", root, "patch", "new", "moe: guard the scale"]) == 0
    commit = short(queue, "HEAD")
    assert capsys.readouterr() == (
        "queue: 2 patch(es) as commits on 1.0 in .queue\n"
        f"patch new: a template commit {commit} 'moe: guard the scale' on top of .queue\n"
        "next:\n"
        "  1. make the fix in .queue/vllm/\n"
        "  2. git -C .queue commit -a --amend\n"
        "     (fill each trailer: the # line above it says what it needs)\n"
        "  3. write its regression test in tests/gpu/ (the Regression-test: trailer names it)\n"
        "  4. vllm-patchset queue export  (lists every problem left, else writes patches/)\n"
        "  5. vllm-patchset overlay build --update-lock\n"
        "  6. vllm-patchset check\n",
        "",
    )
    assert git(queue, "log", "-1", "--format=%B") == (
        "moe: guard the scale\n\n"
        "# Why: what goes wrong without this fix, and how it shows (the lines below say what"
        " each trailer needs; an editor drops the # lines)\n"
        f"# Upstream-PR: {NEEDS_PR}\nUpstream-PR:\n"
        f"# Introduced-by: {NEEDS_BY}\nIntroduced-by:\n"
        f"# Introduced-in: {NEEDS_IN}\nIntroduced-in:\n"
        f"# Applied-upstream: {NEEDS_APPLIED}\nApplied-upstream:\n"
        f"# Regression-test: {NEEDS_TEST}\nRegression-test:\n\n"
    )
    # A second one goes on top of the first (the queue is there now); a name of two lines is
    # refused.
    assert main(["--project", root, "patch", "new", "utils: two"]) == 0
    assert git(queue, "log", "--format=%s", "-2") == "utils: two\nmoe: guard the scale\n"
    assert main(["--project", root, "patch", "new", "a\nb"]) == 2
    assert capsys.readouterr().err.endswith(
        "a patch's name is one line of words (its subject), not 'a\\nb'\n"
    )


CHANGES = [
    # (the change's bytes, its paths) -> the problems
    (b"x", ["vllm/a.py"], []),
    (b"", [], ["no change: make the fix in the queue's files, then `git commit -a --amend`"]),
    (b"x", ["tests/a.py"], ["changes tests/a.py, outside the vllm/ package (take it out)"]),
]


@pytest.mark.parametrize(("data", "paths", "problems"), CHANGES)
def test_change_problems(data: bytes, paths: list[str], problems: list[str]) -> None:
    assert change_problems(project_at(Path("/checkout")), data, paths) == problems


FULL = (
    "x\n\nUpstream-PR: none (local)\nIntroduced-by: none (old)\nIntroduced-in: 1.0\n"
    "Applied-upstream:\nRegression-test: tests/gpu/t.py::t\n"
)
SAID = {
    "Upstream-PR": "none (local)",
    "Introduced-by": "none (old)",
    "Introduced-in": "1.0",
    "Applied-upstream": "",
    "Regression-test": "tests/gpu/t.py::t",
}
TRAILERS = [
    # (message, unfinished) -> (the trailers said, the problems)
    (FULL, False, (SAID, [])),
    (
        FULL.replace("Introduced-in: 1.0", "Introduced-in:"),
        False,
        ({k: v for k, v in SAID.items() if k != "Introduced-in"}, [f"Introduced-in: empty ({NEEDS['Introduced-in']})"]),
    ),
    (FULL.replace("Introduced-in: 1.0", "Introduced-in:"), True, ({k: v for k, v in SAID.items() if k != "Introduced-in"}, [])),
    (
        FULL.replace("Regression-test: tests/gpu/t.py::t\n", "# Regression-test: a template's\n"),
        False,
        ({k: v for k, v in SAID.items() if k != "Regression-test"}, [f"Regression-test: missing ({NEEDS['Regression-test']})"]),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("message", "unfinished", "expected"), TRAILERS)
def test_said_trailers(
    message: str, unfinished: bool, expected: tuple[dict[str, str], list[str]]
) -> None:
    assert said_trailers(message_trailers(message), unfinished=unfinished) == expected
