"""`vllm-patchset rebase` on synthetic upstreams (tests/synthetic.py): the ways a fix can be
lost or a resolution thrown away, each stated as a small story of releases and patches.

After every rebase that finishes, `check` passes; a rebase that stops for a decision changes
no byte of the checkout (every file's sha256 compared).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from killable import KILL_AT_ENV, KILL_ENV, KILLABLE
from support import cli, git, rebase_json
from synthetic import (
    BASE,
    BUGGY,
    FIXED,
    MOE,
    MOE_TEXT,
    NAME_NEW,
    NAME_OLD,
    STORY_ARCHIVED,
    STORY_FIX,
    STORY_LOCAL,
    UTILS,
    UTILS_TEXT,
    PatchSpec,
    Story,
    SyntheticUpstream,
    make_project,
    rewritten,
    write_patches,
)
from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.lock import Lock
from vllm_patchset.overlay.upstream import Mirror

EPOCH = "1782518400"  # SOURCE_DATE_EPOCH: 2026-06-27
FIX = PatchSpec(
    "0001-moe-no-tensor-truthiness.patch",
    {MOE: (BUGGY, FIXED)},
    subject="moe: no tensor truthiness",
)
LOCAL = PatchSpec(
    "0002-moe-fused-name.patch",
    {MOE: (NAME_OLD, NAME_NEW)},
    subject="moe: say fused",
    upstream_pr="none (local)",
)
# 1.0's moe.py, split in two: the quantizer stays, the class and what follows it move.
MOE_HEAD, MOE_TAIL = MOE_TEXT.split("\n\n\nclass Experts")
EXPERTS_CLASS = "class Experts" + MOE_TAIL
NEW_MODULE_HEAD = (
    '"""The experts, moved out of moe.py."""\n\nfrom vllm.layers.moe import quantize\n\n\n'
)
OTHER_WORDS = "        scale = self.a1_gscale if self.a1_scale is None else self.a1_scale\n"


# -- helpers -------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _fixed_date(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)


def sha256s(root: Path) -> dict[str, str]:
    """Every file of the checkout (git's own dir and the rebase's aside): sha256 and mode."""
    return {
        p.relative_to(
            root
        ).as_posix(): f"{hashlib.sha256(p.read_bytes()).hexdigest()} {p.stat().st_mode:o}"
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] not in (".git", ".rebase")
    }


def signal_at(kind: str, where: Path, signum: int) -> fsio.Observer:
    """An observer of the file-system layer that sends `signum` to this process at the first
    write point of `kind` on `where`."""
    sent: list[int] = []

    def observe(seen: str, path: Path) -> None:
        if (seen, path) == (kind, where) and not sent:
            sent.append(signum)
            os.kill(os.getpid(), signum)

    return observe


def onto(upstream: SyntheticUpstream, version: str) -> tuple[str, ...]:
    return ("--onto-git", str(upstream.path), "--ref", f"v{version}")


def patch_on(
    upstream: SyntheticUpstream, version: str, specs: list[PatchSpec], tmp: Path
) -> list[bytes]:
    """The specs written afresh on `version`: what a refresh there must give, byte for byte."""
    folder = tmp / f"expected-{version}-{len(list(tmp.glob('expected-*')))}"
    folder.mkdir()
    names = write_patches(upstream, version, specs, folder, tmp)
    return [(folder / n).read_bytes() for n in names]


def assert_checks(capsys: pytest.CaptureFixture[str], root: Path, patches: int) -> None:
    assert cli(capsys, root, "check") == (0, f"check: {patches} patches, 0 problem(s)\n", "")
    assert not (root / ".rebase").exists()


def pyproject_pin(upstream: SyntheticUpstream, version: str) -> str:
    commit = git(upstream.path, "rev-parse", f"v{version}^{{commit}}").strip()
    return f'pin = "{version}"\npin-ref = "v{version}"\npin-commit = "{commit}"\n'


@pytest.fixture
def upstream(tmp_path: Path) -> SyntheticUpstream:
    up = SyntheticUpstream(tmp_path / "upstream")
    up.release("1.0", BASE)
    return up


# -- moved code ----------------------------------------------------------------------------------
MOVES = {
    # git mv: git's rename detection between the old pin and the new base names the new path.
    "renamed": ({}, {MOE: "vllm/layers/experts/moe.py"}, "vllm/layers/experts/moe.py"),
    # The class moved to a new module, moe.py kept: no rename; the hunks' pre-images are found
    # in the package.
    "moved without a rename": (
        {MOE: MOE_HEAD + "\n", "vllm/layers/experts.py": NEW_MODULE_HEAD + EXPERTS_CLASS},
        {},
        "vllm/layers/experts.py",
    ),
}


@pytest.mark.parametrize("how", list(MOVES))
def test_moved_code_is_followed(
    upstream: SyntheticUpstream,
    synthetic_cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    how: str,
) -> None:
    """Before: the patches were `absent`, kept, and the overlay shipped without the fix while
    the report said it was carried."""
    changes, renames, new_path = MOVES[how]
    upstream.release("1.1", changes, renames=renames)
    project = make_project(
        tmp_path / "project", synthetic_cache, upstream, "1.0", series=[FIX, LOCAL]
    )
    root = project.root
    doc = rebase_json(capsys, root, *onto(upstream, "1.1"))
    assert doc["versions"] == {"git:v1.1": {FIX.name: "applies", LOCAL.name: "applies"}}
    for name in (FIX.name, LOCAL.name):
        entry = doc["patches"][name]  # type: ignore[index]
        assert (entry["verdict"], entry["moved_to"], entry["action"], entry["range_diff"]) == (
            "moved",
            {MOE: new_path},
            "refreshed",
            "context-only churn",
        )
        assert entry["warnings"] == [f"moved: {MOE} -> {new_path}"]
    assert doc["warnings"] == [
        f"{FIX.name}: moved: {MOE} -> {new_path}",
        f"{LOCAL.name}: moved: {MOE} -> {new_path}",
    ]
    moved = [dataclasses.replace(s, edits={new_path: s.edits[MOE]}) for s in (FIX, LOCAL)]
    expected = patch_on(upstream, "1.1", moved, tmp_path)
    assert [(root / "patches" / s.name).read_bytes() for s in (FIX, LOCAL)] == expected
    lock = Lock.load(project.lock_path)
    assert [(e.path, e.patches) for e in lock.entries] == [(new_path, (FIX.name, LOCAL.name))]
    assert doc["changelog"] == (
        "## [vllm-1.1] - 2026-06-27\n\n"
        "Rebased onto vLLM 1.1 (from 1.0) by `vllm-patchset rebase`.\n\n"
        "### Changed\n\n"
        "- Pin: vLLM 1.0 -> 1.1.\n"
        f"- Refreshed `{FIX.name}` (context-only churn; moved: `{MOE}` -> `{new_path}`).\n"
        f"- Refreshed `{LOCAL.name}` (context-only churn; moved: `{MOE}` -> `{new_path}`).\n"
        f"- Still carried: `{FIX.name}`, `{LOCAL.name}`.\n"
    )
    assert_checks(capsys, root, 2)


def test_code_copied_to_two_places_stops_with_both_named(
    upstream: SyntheticUpstream,
    synthetic_cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    copies = {
        MOE: MOE_HEAD + "\n",
        "vllm/layers/cpu.py": NEW_MODULE_HEAD + EXPERTS_CLASS,
        "vllm/layers/gpu.py": NEW_MODULE_HEAD + EXPERTS_CLASS,
    }
    upstream.release("1.1", copies)
    project = make_project(tmp_path / "project", synthetic_cache, upstream, "1.0", series=[FIX])
    root = project.root
    before = sha256s(root)
    code, out, err = cli(capsys, root, "rebase", *onto(upstream, "1.1"))
    assert (code, err) == (1, "")
    assert out == (
        "rebase 1.0 -> git:v1.1: stopped, 1 decision(s) needed (nothing has changed)\n"
        f"  {FIX.name}  conflict  DECISION NEEDED (ambiguous)\n"
        f"WARNING: {FIX.name}: the code it fixes is not where the patch says; it is at"
        " vllm/layers/cpu.py:16 (Experts.apply), vllm/layers/gpu.py:16 (Experts.apply): carry"
        " the fix there by hand (queue import) or decide\n"
        f"WARNING: {FIX.name}: the bug (`or self.a1_gscale`) is live at vllm/layers/cpu.py:16"
        " (Experts.apply), vllm/layers/gpu.py:16 (Experts.apply); its fix is nowhere in"
        f" {MOE}\n"
        "decisions needed (rerun with one option per patch; nothing has changed):\n"
        f"  {FIX.name} (conflict, ambiguous):\n"
        "    --port 0001: take it with `git am -3` in .rebase/worktree and stop there to port"
        " it by hand (`rebase --continue` carries it)\n"
        "    --keep 0001: park it in patches/parked/ (kept, not applied; port it later)\n"
        "    --drop 0001: remove it\n"
        f"  rerun: vllm-patchset rebase --onto-git {upstream.path} --ref v1.1 <an option per patch above>\n"
        "  No rebase is in progress: nothing was written.\n"
    )
    assert sha256s(root) == before
    assert not (root / ".rebase").exists()


# -- a conflict in the first of two patches, resolved by hand -----------------------------------
CHANGED_LINE = "        scale = self.a1_scale or self.a1_gscale or 1.0\n"
RESOLVED_LINE = "        scale = self.a1_scale  # 1.1 resolution\n"


def resolve_by_hand(worktree: Path) -> None:
    """What the maintainer writes in place of the conflict markers (a blob and a tree that
    exist only in the worktree)."""
    text = (worktree / MOE).read_text()
    text = re.sub(r"<<<<<<< .*?>>>>>>> [^\n]*\n", RESOLVED_LINE, text, flags=re.S)
    (worktree / MOE).write_text(text)
    git(worktree, "add", MOE)
    git(worktree, "am", "--continue")


def test_conflict_in_first_patch_then_continue(
    upstream: SyntheticUpstream,
    synthetic_cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: `--continue` failed with `git read-tree failed: fatal: failed to unpack tree
    object` (the next patch was classified through the mirror, which does not have the
    resolved tree)."""
    upstream.release("1.1", {MOE: MOE_TEXT.replace(BUGGY, CHANGED_LINE)})
    project = make_project(
        tmp_path / "project", synthetic_cache, upstream, "1.0", series=[FIX, LOCAL]
    )
    root = project.root
    before = sha256s(root)
    doc = rebase_json(capsys, root, *onto(upstream, "1.1"), code=1)
    worktree = root / ".rebase" / "worktree"
    assert doc["status"] == "stopped"
    assert doc["conflict"]["patch"] == FIX.name  # type: ignore[index]
    assert sha256s(root) == before
    # The worktree is sparse: the conflicted patch's file is checked out, not the others.
    files = [p for p in worktree.rglob("*") if p.is_file() and ".git" not in p.parts]
    assert [p.relative_to(worktree).as_posix() for p in files] == [MOE]
    # --continue before it is resolved: a finding, nothing changes.
    code, _, err = cli(capsys, root, "rebase", "--continue")
    assert code == 1
    assert err.startswith(f"vllm-patchset: {FIX.name} is not resolved yet in {worktree}: ")
    resolve_by_hand(worktree)
    doc = rebase_json(capsys, root, "--continue")
    assert doc["versions"] == {"git:v1.1": {FIX.name: "conflict", LOCAL.name: "applies"}}
    fix, local = (doc["patches"][n] for n in (FIX.name, LOCAL.name))  # type: ignore[index]
    assert (fix["action"], fix["range_diff"]) == ("resolved", "content changed")
    assert (local["action"], local["verdict"], local["range_diff"]) == (
        "refreshed",
        "applies",
        "context-only churn",
    )
    resolved = dataclasses.replace(FIX, edits={MOE: (CHANGED_LINE, RESOLVED_LINE)})
    assert [(root / "patches" / s.name).read_bytes() for s in (FIX, LOCAL)] == patch_on(
        upstream, "1.1", [resolved, LOCAL], tmp_path
    )
    assert (root / "patches" / "series").read_text() == f"{FIX.name}\n{LOCAL.name}\n"
    pyproject = (root / "pyproject.toml").read_text()
    assert pyproject_pin(upstream, "1.1") in pyproject
    assert '"vllm==1.0"' in pyproject  # a git pin leaves the PyPI requirement alone
    for written in ("pyproject.toml", "overlay/overlay.lock.json", "CHANGELOG.md"):
        assert str(upstream.path) not in (root / written).read_text()  # no local path
    assert_checks(capsys, root, 2)


def test_skipped_conflict_needs_a_decision(
    upstream: SyntheticUpstream,
    synthetic_cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: `git am --skip` then `--continue` deleted the patch with no decision named."""
    upstream.release("1.1", {MOE: MOE_TEXT.replace(BUGGY, CHANGED_LINE)})
    project = make_project(
        tmp_path / "project", synthetic_cache, upstream, "1.0", series=[FIX, LOCAL]
    )
    root = project.root
    rebase_json(capsys, root, *onto(upstream, "1.1"), code=1)
    worktree = root / ".rebase" / "worktree"
    git(worktree, "am", "--skip")
    assert cli(capsys, root, "rebase", "--continue") == (
        1,
        "",
        f"vllm-patchset: {FIX.name} was skipped in {worktree} (`git am --skip`) with no"
        " decision: `rebase --continue` with one of --port 0001, --keep 0001, --drop 0001\n",
    )
    doc = rebase_json(capsys, root, "--continue", "--drop", "0001")
    assert (doc["patches"][FIX.name]["action"], doc["patches"][FIX.name]["decision"]) == (  # type: ignore[index]
        "dropped",
        "drop",
    )
    assert (root / "patches" / "series").read_text() == f"{LOCAL.name}\n"
    assert not (root / "patches" / FIX.name).exists()
    assert (
        f"- Dropped `{FIX.name}` (--drop): conflict on vLLM 1.1.\n"
        in (root / "CHANGELOG.md").read_text()
    )
    assert_checks(capsys, root, 1)


# -- upstream fixed the bug in other words -------------------------------------------------------
@pytest.mark.parametrize("when", ["at the start", "after the stop"])
def test_upstream_fix_in_other_words_resolved_as_upstream(
    upstream: SyntheticUpstream,
    synthetic_cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    when: str,
) -> None:
    """Before: the only way on was `git am --skip`, which deleted the patch (its provenance and
    regression test lost) instead of archiving it."""
    upstream.release("1.1", {MOE: MOE_TEXT.replace(BUGGY, OTHER_WORDS)})
    project = make_project(
        tmp_path / "project", synthetic_cache, upstream, "1.0", series=[FIX, LOCAL]
    )
    root = project.root
    original = (root / "patches" / FIX.name).read_bytes()
    if when == "at the start":
        doc = rebase_json(capsys, root, *onto(upstream, "1.1"), "--resolve-upstream", "0001")
    else:
        stopped = rebase_json(capsys, root, *onto(upstream, "1.1"), code=1)
        assert stopped["conflict"]["patch"] == FIX.name  # type: ignore[index]
        doc = rebase_json(capsys, root, "--continue", "--resolve-upstream", "0001")
    assert doc["versions"] == {"git:v1.1": {FIX.name: "conflict", LOCAL.name: "applies"}}
    fix = doc["patches"][FIX.name]  # type: ignore[index]
    assert (fix["action"], fix["decision"], fix["applied_upstream"]) == (
        "archived",
        "resolve-upstream",
        "1.1",
    )
    archived = root / "patches" / "upstreamed" / FIX.name
    assert archived.read_bytes() == original.replace(
        b"\nApplied-upstream:\n", b"\nApplied-upstream: 1.1\n"
    )
    assert b"\nRegression-test: tests/gpu/test_synthetic.py::test_fix\n" in archived.read_bytes()
    assert (root / "patches" / "upstreamed" / "series").read_text() == f"{FIX.name}\n"
    assert (root / "patches" / "series").read_text() == f"{LOCAL.name}\n"
    assert (
        f"- Resolved as upstream (--resolve-upstream): `{FIX.name}`, fixed in vLLM 1.1;"
        " archived in `patches/upstreamed/`.\n"
    ) in (root / "CHANGELOG.md").read_text()
    assert_checks(capsys, root, 2)
    # The archived patch keeps guarding: on 1.1 its code is there, changed, with no bug in it
    # (its trailers say upstream; the text says conflict: not applied, nothing lost).
    _, out, _ = cli(capsys, root, "status", "--json")
    assert json.loads(out)["patches"][f"upstreamed/{FIX.name}"] == "conflict"


# -- a damaged journal ---------------------------------------------------------------------------
DAMAGE = [
    ("truncated", lambda text: text[: len(text) // 2], "not JSON"),
    ("empty", lambda text: "", "not JSON (Expecting value at line 1 column 1)"),
    ("not an object", lambda text: "[]\n", "a JSON array, not a JSON object"),
    ("a key missing", lambda text: text.replace('"phase"', '"fase"'), "no 'phase'"),
    (
        "a wrong type",
        lambda text: text.replace('"old_pin": "1.0"', '"old_pin": 10'),
        "'old_pin' is a JSON number, not a JSON string",
    ),
]


@pytest.mark.parametrize(("name", "damage", "what"), DAMAGE)
def test_damaged_state_gives_one_line_and_abort_restores(
    tiny: Project,
    capsys: pytest.CaptureFixture[str],
    name: str,
    damage: Callable[[str], str],
    what: str,
) -> None:
    """Before: a raw KeyError traceback, and `--abort` could not recover. (The story's 1.1
    changed the line the local patch changes: the rebase stops on that conflict.)"""
    root = tiny.root
    before = sha256s(root)
    rebase_json(capsys, root, "--onto", "1.1", code=1)
    state = root / ".rebase" / "state.json"
    state.write_text(damage(state.read_text()))
    code, out, err = cli(capsys, root, "rebase", "--continue")
    assert (code, out) == (2, "")
    assert err.startswith(f"vllm-patchset: {state} is damaged ({what.split(':')[0]}")
    assert err.endswith(
        "): `vllm-patchset rebase --abort` restores the checkout as it was before the rebase\n"
    )
    assert what in err and err.count("\n") == 1
    assert cli(capsys, root, "rebase", "--abort") == (
        0,
        "rebase onto (unknown: damaged state) aborted: everything is as it was\n",
        "",
    )
    assert sha256s(root) == before
    assert not (root / ".rebase").exists()


# -- two more a maintainer meets -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("decision", "series", "archive", "parked"),
    [
        ("--resolve-upstream", [], [LOCAL.name], []),
        ("--keep", [], [], [LOCAL.name]),
        ("--drop", [], [], []),
    ],
)
def test_local_patch_found_upstream_is_archived_only_when_named(
    upstream: SyntheticUpstream,
    synthetic_cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    decision: str,
    series: list[str],
    archive: list[str],
    parked: list[str],
) -> None:
    """A patch written here (`Upstream-PR: none`) whose text upstream now has: nothing
    upstream merged it, so it is never archived as upstream without the maintainer saying so."""
    upstream.release("1.1", {MOE: MOE_TEXT.replace(NAME_OLD, NAME_NEW)})
    project = make_project(tmp_path / "project", synthetic_cache, upstream, "1.0", series=[LOCAL])
    root = project.root
    before = sha256s(root)
    doc = rebase_json(capsys, root, *onto(upstream, "1.1"), code=1)
    assert (doc["started"], doc["versions"]) == (False, {"git:v1.1": {LOCAL.name: "upstream"}})
    assert doc["decisions"] == [
        {
            "patch": LOCAL.name,
            "state": "upstream",
            "verdict": "upstream",
            "options": ["--resolve-upstream 0002", "--keep 0002", "--drop 0002"],
            "means": [
                "archive it in patches/upstreamed/ as fixed upstream (its regression test keeps"
                " guarding)",
                "park it in patches/parked/ (kept, not applied; port it later)",
                "remove it",
            ],
        }
    ]
    assert sha256s(root) == before
    assert not (root / ".rebase").exists()
    doc = rebase_json(capsys, root, *onto(upstream, "1.1"), decision, "0002")
    assert doc["status"] == "done"
    assert (root / "patches" / "series").read_text() == "".join(f"{n}\n" for n in series)
    assert (root / "patches" / "upstreamed" / "series").read_text() == "".join(
        f"{n}\n" for n in archive
    )
    parked_series = root / "patches" / "parked" / "series"
    assert (parked_series.read_text() if parked_series.exists() else "") == "".join(
        f"{n}  # kept by `rebase` 1.0 -> git:v1.1 on 2026-06-27: upstream there\n" for n in parked
    )
    assert_checks(capsys, root, len(archive) + len(parked))


def test_upstream_reverted_an_archived_fix(
    upstream: SyntheticUpstream,
    synthetic_cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """1.1 has the fix (archived here with its release); 1.2 reverts it: the archived patch
    applies again. Carried again with `--keep`, or it would vanish from the overlay unsaid."""
    upstream.release("1.1", {MOE: MOE_TEXT.replace(BUGGY, FIXED)})
    upstream.release("1.2", {MOE: MOE_TEXT})
    merged = dataclasses.replace(FIX, applied_upstream="1.1", base="1.0")
    project = make_project(
        tmp_path / "project", synthetic_cache, upstream, "1.1", upstreamed=[merged]
    )
    root = project.root
    original = (root / "patches" / "upstreamed" / FIX.name).read_bytes()
    doc = rebase_json(capsys, root, *onto(upstream, "1.2"), code=1)
    key = f"upstreamed/{FIX.name}"
    assert doc["versions"] == {"git:v1.2": {key: "applies"}}
    assert doc["warnings"] == [
        f"{key}: text says applies, trailers say upstream: the bug is back (a revert?); the text"
        " decides"
    ]
    assert [d["options"] for d in doc["decisions"]] == [  # type: ignore[attr-defined]
        ["--keep upstreamed/0001", "--drop upstreamed/0001"]
    ]
    doc = rebase_json(capsys, root, *onto(upstream, "1.2"), "--keep", "upstreamed/0001")
    assert doc["patches"][key]["action"] == "unarchived"  # type: ignore[index]
    assert (root / "patches" / "series").read_text() == f"{FIX.name}\n"
    assert (root / "patches" / "upstreamed" / "series").read_text() == ""
    assert (root / "patches" / FIX.name).read_bytes() == original.replace(
        b"\nApplied-upstream: 1.1\n", b"\nApplied-upstream:\n"
    )
    assert Lock.load(project.lock_path).patches == (FIX.name,)
    assert_checks(capsys, root, 1)


# -- rewritten upstream: park or drop ------------------------------------------------------------
@pytest.fixture(scope="module")
def rewritten_on_1_1(tmp_path_factory: pytest.TempPathFactory) -> tuple[SyntheticUpstream, Path]:
    """1.1 rewrote the function the fix changes, 1.2 changed nothing of it; a project on 1.0
    with the fix and the local patch (built once for the module; tests copy it)."""
    folder = tmp_path_factory.mktemp("rewritten-on-1.1")
    upstream = SyntheticUpstream(folder / "upstream")
    upstream.release("1.0", BASE)
    upstream.release("1.1", {MOE: rewritten(MOE_TEXT)})
    upstream.release("1.2", {"vllm/__init__.py": '__version__ = "1.2"\n'})
    cache = tmp_path_factory.getbasetemp() / "synthetic-cache"  # the `synthetic_cache` fixture's
    make_project(folder / "project", cache, upstream, "1.0", series=[FIX, LOCAL])
    return upstream, folder / "project"


@pytest.mark.parametrize("decision", ["--keep", "--drop"])
def test_rewritten_code_stops_then_park_or_drop(
    rewritten_on_1_1: tuple[SyntheticUpstream, Path],
    synthetic_cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    decision: str,
) -> None:
    """The function the fix changes was rewritten upstream: not `absent` (the code was there
    on the pin), a stop for a decision; a parked patch is carried by the next rebase."""
    upstream, template = rewritten_on_1_1
    root = tmp_path / "project"
    shutil.copytree(template, root, symlinks=True)
    before = sha256s(root)
    doc = rebase_json(capsys, root, *onto(upstream, "1.1"), code=1)
    fix = doc["patches"][FIX.name]  # type: ignore[index]
    assert (fix["state"], fix["verdict"], fix["action"]) == ("conflict", "rewritten", "decision")
    assert fix["warnings"] == [
        "it applied on the old pin; the code it changes is gone from git:v1.1 (rewritten or"
        " removed upstream)"
    ]
    assert sha256s(root) == before
    original = (root / "patches" / FIX.name).read_bytes()
    doc = rebase_json(capsys, root, *onto(upstream, "1.1"), decision, "0001")
    assert (root / "patches" / "series").read_text() == f"{LOCAL.name}\n"
    parked = root / "patches" / "parked"
    if decision == "--keep":
        assert (parked / FIX.name).read_bytes() == original
        assert (parked / "series").read_text() == (
            f"{FIX.name}  # kept by `rebase` 1.0 -> git:v1.1 on 2026-06-27: conflict (rewritten) there\n"
        )
    else:
        assert not parked.exists()
    assert_checks(capsys, root, 2 if decision == "--keep" else 1)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "rebase onto 1.1")
    # The next rebase: the parked patch stays parked, no decision asked again.
    doc = rebase_json(capsys, root, *onto(upstream, "1.2"))
    expected = {LOCAL.name: "applies"}
    if decision == "--keep":
        expected[f"parked/{FIX.name}"] = "conflict"
        assert doc["patches"][f"parked/{FIX.name}"]["action"] == "parked"  # type: ignore[index]
        assert (parked / FIX.name).read_bytes() == original
    assert doc["versions"] == {"git:v1.2": expected}
    assert_checks(capsys, root, 2 if decision == "--keep" else 1)


def test_the_same_line_in_unrelated_code_is_not_a_move(
    upstream: SyntheticUpstream,
    synthetic_cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """1.1 rewrote `apply`; another module has the patch's removed line in code of its own
    (as vLLM's linear NVFP4 emulation has the MoE oracle's `layer.weight.device` line, rightly
    there): that is no move, the fix's code is gone."""
    unrelated = (
        "\n\nclass Linear:\n"
        "    def forward(self, x):\n"
        "        weight = self.load()\n"
        f"{BUGGY}"
        "        return weight * x * scale\n"
    )
    upstream.release("1.1", {MOE: rewritten(MOE_TEXT), UTILS: UTILS_TEXT + unrelated})
    project = make_project(tmp_path / "project", synthetic_cache, upstream, "1.0", series=[FIX])
    doc = rebase_json(capsys, project.root, *onto(upstream, "1.1"), code=1)
    fix = doc["patches"][FIX.name]  # type: ignore[index]
    assert (fix["state"], fix["verdict"], fix["moved_to"], fix["candidates"]) == (
        "conflict",
        "rewritten",
        None,
        [],
    )


# -- decisions that do not fit -------------------------------------------------------------------
BAD_DECISIONS: list[tuple[Sequence[str], str]] = [
    (
        ("--keep", "0002"),
        f"--keep {LOCAL.name}: it needs no decision (applies (3-way) on git:v1.1)",
    ),
    (("--drop", "0009"), "--drop 0009: no such patch in patches/"),
    (("--drop", "0001", "--keep", "0001"), f"--drop 0001: {FIX.name} has a decision already"),
    (("--release", "1.1"), "--release goes with --resolve-upstream PATCH"),
    (
        ("--resolve-upstream", "0001", "--release", "soon"),
        "not a vLLM version: 'soon' (expected e.g. 0.24.0)",
    ),
    (
        ("--resolve-upstream", "0001", "--release", "1.2"),
        f"--resolve-upstream {FIX.name}: --release 1.2 is newer than git:v1.1, which has the fix",
    ),
    (
        ("--keep", "0001", "--drop", "0002"),
        f"--drop {LOCAL.name}: it needs no decision (applies (3-way) on git:v1.1)",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD_DECISIONS)
def test_decisions_that_do_not_fit_change_nothing(
    rewritten_on_1_1: tuple[SyntheticUpstream, Path],
    synthetic_cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: Sequence[str],
    message: str,
) -> None:
    upstream, template = rewritten_on_1_1
    root = tmp_path / "project"
    shutil.copytree(template, root, symlinks=True)
    before = sha256s(root)
    code, out, err = cli(capsys, root, "rebase", *onto(upstream, "1.1"), *args)
    assert (code, out, err) == (2, "", f"vllm-patchset: {message}\n")
    assert sha256s(root) == before
    assert not (root / ".rebase").exists()


def test_resolve_upstream_on_a_ref_with_no_version(
    upstream: SyntheticUpstream,
    synthetic_cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`nightly` names no release: `--release` says which release has the fix. Where the text
    shows the fix (in other words here: a conflict with no bug in it), it is accepted on a ref
    as on a release (before: refused on the ref, accepted on a release that had the bug)."""
    upstream.release("1.1", {MOE: rewritten(MOE_TEXT)})
    upstream.release("1.2", {MOE: MOE_TEXT.replace(BUGGY, OTHER_WORDS)}, base="1.0")
    project = make_project(tmp_path / "project", synthetic_cache, upstream, "1.0", series=[FIX])
    root = project.root
    git(upstream.path, "tag", "nightly", "v1.2")
    args = ("--onto-git", str(upstream.path), "--ref", "nightly", "--resolve-upstream", "0001")
    assert cli(capsys, root, "rebase", *args) == (
        2,
        "",
        f"vllm-patchset: --resolve-upstream {FIX.name}: git:nightly has no release version; say"
        " which release has the fix with --release VERSION\n",
    )
    git(upstream.path, "tag", "-f", "nightly", "v1.1")
    assert cli(capsys, root, "rebase", *args) == (
        2,
        "",
        f"vllm-patchset: --resolve-upstream {FIX.name}: git:nightly has no release version; say"
        " which release has the fix with --release VERSION\n",
    )
    doc = rebase_json(capsys, root, *args, "--release", "1.1")
    assert doc["patches"][FIX.name]["applied_upstream"] == "1.1"  # type: ignore[index]
    assert b"\nApplied-upstream: 1.1\n" in (root / "patches/upstreamed" / FIX.name).read_bytes()
    assert_checks(capsys, root, 1)


# -- interrupted while swapping files in ---------------------------------------------------------
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("then", ["--continue", "--abort"])
def test_signal_during_the_swap(
    tiny: Project, capsys: pytest.CaptureFixture[str], signum: int, then: str
) -> None:
    """Before: Ctrl-C there printed "interrupted; nothing was left half-written" with
    patches/ rewritten and the pin, the lock and CHANGELOG.md not (SIGTERM killed it silently).
    The signal lands between two moves of the swap: at the layer's write point of patches/
    moved into the checkout (`fsio.observed`)."""
    root = tiny.root
    before = sha256s(root)
    with fsio.observed(signal_at("moved", root / "patches", signum)):
        code, out, err = cli(capsys, root, "rebase", "--onto", "1.0.1")
    assert (code, out) == (128 + signum, "")
    assert err == (
        f"vllm-patchset: interrupted ({signal.Signals(signum).name}); the rebase was done: the"
        " checkout is rebased; `rebase --continue` removes .rebase/ (`rebase --abort` would put"
        " everything back)\n"
    )
    assert 'pin = "1.0.1"\n' in (root / "pyproject.toml").read_text()
    assert Lock.load(tiny.lock_path).version == "1.0.1"
    code, out, err = cli(capsys, root, "rebase", then)
    assert (code, err) == (0, "")
    if then == "--abort":
        assert out == "rebase onto 1.0.1 aborted: everything is as it was\n"
        assert sha256s(root) == before
        assert not (root / ".rebase").exists()
    else:
        assert out.startswith("rebase 1.0 -> 1.0.1: done\n")
        assert_checks(capsys, root, 3)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_while_staging_changes_nothing(
    tiny: Project, capsys: pytest.CaptureFixture[str], signum: int
) -> None:
    """Interrupted while the rebased project is staged (the signal at the layer's write point
    of patches/ copied into the stage): the checkout is as it was, and the message says so and
    what cleans up."""
    root = tiny.root
    before = sha256s(root)
    with fsio.observed(signal_at("copied", root / ".rebase" / "stage" / "patches", signum)):
        done = cli(capsys, root, "rebase", "--onto", "1.0.1")
    assert done == (
        128 + signum,
        "",
        f"vllm-patchset: interrupted ({signal.Signals(signum).name}); the rebase changed nothing"
        " in patches/, pyproject.toml, the lock or CHANGELOG.md yet; `rebase --abort` removes"
        " .rebase/\n",
    )
    assert sha256s(root) == before
    assert cli(capsys, root, "rebase", "--abort") == (
        0,
        "rebase onto 1.0.1 aborted: everything is as it was\n",
        "",
    )
    assert sha256s(root) == before
    assert not (root / ".rebase").exists()


def test_check_and_status_know_parked_patches(
    upstream: SyntheticUpstream,
    synthetic_cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A parked patch does not apply and does not fail `check`; its reason must be there;
    `status` names it; the overlay leaves it out."""
    upstream.release("1.1", {MOE: rewritten(MOE_TEXT)})
    project = make_project(tmp_path / "project", synthetic_cache, upstream, "1.0", series=[FIX])
    root = project.root
    rebase_json(capsys, root, *onto(upstream, "1.1"), "--keep", "0001")
    assert_checks(capsys, root, 1)
    assert Lock.load(project.lock_path).patches == ()
    reason = "kept by `rebase` 1.0 -> git:v1.1 on 2026-06-27: conflict (rewritten) there"
    code, out, _ = cli(capsys, root, "status", "--json")
    doc = json.loads(out)
    assert (code, doc["patches"], doc["parked"]) == (
        0,
        {f"parked/{FIX.name}": "conflict"},
        {f"parked/{FIX.name}": reason},
    )
    series = root / "patches" / "parked" / "series"
    series.write_text(f"{FIX.name}\n")
    assert cli(capsys, root, "check") == (
        1,
        "check: 1 patches, 1 problem(s)\n",
        f"{series}: {FIX.name} has no reason (a `# why it is parked` comment on its line)\n",
    )


# -- the story: refusals -------------------------------------------------------------------------
DIRTY = [
    (f"patches/{STORY_FIX.name}", f"M patches/{STORY_FIX.name}"),
    ("patches/0003-stray.patch", "?? patches/0003-stray.patch"),
    ("README.md", "M README.md"),
]


@pytest.mark.parametrize(("path", "status"), DIRTY)
def test_dirty_checkout_is_refused(
    tiny: Project, capsys: pytest.CaptureFixture[str], path: str, status: str
) -> None:
    root = tiny.root
    (root / "README.md").write_text("readme\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "readme")
    target = root / path
    target.write_bytes((target.read_bytes() if target.exists() else b"") + b"\n")
    before = sha256s(root)
    code, out, err = cli(capsys, root, "rebase", "--onto", "1.2", "--keep", "0001")
    assert (code, out) == (2, "")
    assert err == (
        f"vllm-patchset: the checkout {root} has uncommitted changes ({status}):"
        " commit or stash them before a rebase\n"
    )
    assert sha256s(root) == before
    assert not (root / ".rebase").exists()


BAD_USAGE = [
    (("--onto", "1.0"), "the pin 1.0 is 1.0 already: nothing to rebase"),
    (("--onto", "latest"), "not a vLLM version: 'latest' (expected e.g. 0.24.0)"),
    (("--onto", "1.1", "--ref", "v1.1"), "--ref goes with --onto-git"),
    (("--onto-git", "/nonexistent"), "--onto-git needs --ref REF"),
    (("--continue",), "no rebase in progress (start one with `rebase --onto VERSION`)"),
    (("--abort",), "no rebase in progress (start one with `rebase --onto VERSION`)"),
    (("--abort", "--keep", "0002"), "--abort takes no decisions (it puts everything back)"),
    (
        ("--onto", "1.1", "--keep", "0001"),
        f"--keep {STORY_FIX.name}: it needs no decision (upstream on 1.1)",
    ),
    (
        ("--onto", "1.1", "--keep", "upstreamed/0001"),
        f"--keep upstreamed/{STORY_ARCHIVED.name}: it needs no decision (upstream on 1.1)",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD_USAGE)
def test_bad_usage_changes_nothing(
    tiny: Project, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    before = sha256s(tiny.root)
    assert cli(capsys, tiny.root, "rebase", *args) == (2, "", f"vllm-patchset: {message}\n")
    assert sha256s(tiny.root) == before
    assert not (tiny.root / ".rebase").exists()


def test_git_pin_is_found_again_by_its_commit(
    tiny: Project, story: Story, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rebase onto a local git ref writes `pin-ref` and `pin-commit`, never the local path:
    the next `check` finds the tree in the mirror by its commit."""
    root = tiny.root
    doc = rebase_json(capsys, root, *onto(story.upstream, "1.0.1"))
    assert doc["status"] == "done"
    commit = git(story.upstream.path, "rev-parse", "v1.0.1^{commit}").strip()
    pyproject = (root / "pyproject.toml").read_text()
    assert f'pin = "1.0.1"\npin-ref = "v1.0.1"\npin-commit = "{commit}"\n' in pyproject
    assert '"vllm==1.0"' in pyproject  # a git pin leaves the PyPI requirement alone
    for written in ("pyproject.toml", "overlay/overlay.lock.json", "CHANGELOG.md"):
        assert str(story.upstream.path) not in (root / written).read_text()
    assert_checks(capsys, root, 3)
    assert Mirror(story.cache).git_commit(commit) is not None


# -- the story: killed, or running beside another writer -------------------------------------------
# `rebase --onto 1.0.1` of the story: both series patches refreshed one line down, the archived
# one stays; 18 write points (each write has two, see tests/killable.py): the journal (phase
# "running") at 1-6, staging from 7, the journal's phase "swap" at 16, "done" at 18.
KILL_POINTS = {"journal": 1, "running": 2, "staging": 7, "staged": 15, "swap": 16, "done": 18}


def run_rebase(root: Path, cache: Path, *args: str, env: dict[str, str]) -> int:
    """`vllm-patchset rebase ARGS` in a process of its own (to be killed); its exit status."""
    return subprocess.run(
        [*KILLABLE, "--project", str(root), "rebase", *args],
        env={**os.environ, "VLLM_PATCHSET_CACHE": str(cache), "SOURCE_DATE_EPOCH": EPOCH, **env},
        capture_output=True,
        timeout=120,
    ).returncode


def phase(root: Path) -> str | None:
    try:
        return str(json.loads((root / ".rebase" / "state.json").read_text())["phase"])
    except (OSError, ValueError, KeyError):
        return None


def expect_rebased_onto_1_0_1(capsys: pytest.CaptureFixture[str], root: Path, story: Story) -> None:
    """The story's project rebased onto 1.0.1: both patches refreshed, `check` passes."""
    text = (root / "pyproject.toml").read_text()
    assert 'pin = "1.0.1"\n' in text
    assert (root / "patches" / "series").read_text() == f"{STORY_FIX.name}\n{STORY_LOCAL.name}\n"
    lock = Lock.load(root / "overlay" / "overlay.lock.json")
    assert (lock.version, lock.patches) == ("1.0.1", (STORY_FIX.name, STORY_LOCAL.name))
    refreshed = (root / "patches" / STORY_FIX.name).read_text()
    assert "@@ -19,7 +19,8 @@" in refreshed  # one line down from the pin's patch
    assert_checks(capsys, root, 3)


@pytest.mark.parametrize("point", list(KILL_POINTS.values()), ids=list(KILL_POINTS))
def test_killed_rebase_is_undone_or_finished(
    tiny: Project, story: Story, capsys: pytest.CaptureFixture[str], point: int
) -> None:
    """SIGKILL (which no process can defer) at a write point: before the swap, the checkout is
    as it was, `--continue` refuses and `--abort` cleans up; from the swap on, `--abort` puts
    everything back byte for byte and `--continue` finishes (each tried on a copy)."""
    root = tiny.root
    before = sha256s(root)
    killed = run_rebase(root, story.cache, "--onto", "1.0.1", env={KILL_ENV: str(point)})
    assert killed == -signal.SIGKILL
    if phase(root) in ("swap", "done"):
        copy = root.parent / "copy"
        shutil.copytree(root, copy, symlinks=True)
        assert cli(capsys, copy, "rebase", "--continue")[0] == 0
        expect_rebased_onto_1_0_1(capsys, copy, story)
        assert cli(capsys, root, "rebase", "--abort") == (
            0,
            "rebase onto 1.0.1 aborted: everything is as it was\n",
            "",
        )
        assert sha256s(root) == before
        assert not (root / ".rebase").exists()
        return
    assert sha256s(root) == before
    assert git(root, "status", "--porcelain") == ""
    code, _, err = cli(capsys, root, "rebase", "--onto", "1.0.1")
    assert (code, "a rebase is in progress" in err) == (2, True)
    assert cli(capsys, root, "rebase", "--continue") == (
        2,
        "",
        "vllm-patchset: the rebase was interrupted before it finished: `rebase --abort`,"
        " then start again\n",
    )
    assert cli(capsys, root, "rebase", "--abort") == (
        0,
        "rebase onto 1.0.1 aborted: everything is as it was\n",
        "",
    )
    assert sha256s(root) == before
    assert not (root / ".rebase").exists()
    assert cli(capsys, root, "rebase", "--onto", "1.0.1")[0] == 0
    expect_rebased_onto_1_0_1(capsys, root, story)


@pytest.mark.parametrize("then", ["--abort", "--continue"])
def test_rebase_killed_in_the_middle_of_the_swap(
    tiny: Project, story: Story, capsys: pytest.CaptureFixture[str], then: str
) -> None:
    """SIGKILL between two moves of the swap (patches/ in, the rest not): `--abort` puts
    everything back byte for byte, `--continue` finishes."""
    root = tiny.root
    before = sha256s(root)
    killed = run_rebase(
        root, story.cache, "--onto", "1.0.1", env={KILL_AT_ENV: f"moved::{root / 'patches'}"}
    )
    assert killed == -signal.SIGKILL
    assert phase(root) == "swap"
    assert sha256s(root) != before  # half swapped
    assert cli(capsys, root, "rebase", then)[0] == 0
    assert not (root / ".rebase").exists()
    if then == "--abort":
        assert sha256s(root) == before
    else:
        expect_rebased_onto_1_0_1(capsys, root, story)


def test_a_second_writer_is_refused_while_a_rebase_runs(
    tiny: Project, story: Story, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rebases at once, an `--abort` under a running rebase, or a `queue export` during
    one: the second is refused, and the first finishes as if alone. (Before: `--abort` removed
    `.rebase/` under the running rebase.) The first stops itself (SIGSTOP) at its second write
    point, the journal written, while the others try."""
    root = tiny.root
    assert cli(capsys, root, "queue", "import")[0] == 0
    env = {**os.environ, "SOURCE_DATE_EPOCH": EPOCH, KILL_ENV: "2:STOP"}
    process = subprocess.Popen(
        [*KILLABLE, "--project", str(root), "rebase", "--onto", "1.0.1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _, status = os.waitpid(process.pid, os.WUNTRACED)  # until it has stopped itself
        assert os.WIFSTOPPED(status)
        assert phase(root) == "running"
        monkeypatch.setenv("VLLM_PATCHSET_LOCK_TIMEOUT", "0")  # refused at once, not after 60 s
        refused = (
            "vllm-patchset: another vllm-patchset rebase, queue or overlay build is running in"
            f" {root} (waited 0 s): nothing was changed\n"
        )
        for args in (("rebase", "--onto", "1.2"), ("rebase", "--abort"), ("queue", "export")):
            assert cli(capsys, root, *args) == (1, "", refused)
    finally:
        os.kill(process.pid, signal.SIGCONT)
    assert process.wait(timeout=120) == 0
    expect_rebased_onto_1_0_1(capsys, root, story)


def test_the_swaps_moves_are_write_points(
    tiny: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every move of the swap (each old path to the backup, each staged one in) is a write
    point of the file-system layer, where the kill hook of the tests can stop the run (before,
    the swap renamed by itself and the kill tests reached none of them)."""
    root = tiny.root
    seen: list[tuple[str, str]] = []

    def record(kind: str, path: Path) -> None:
        if kind == "moved":
            seen.append((kind, path.relative_to(root).as_posix()))

    with fsio.observed(record):
        assert cli(capsys, root, "rebase", "--onto", "1.0.1")[0] == 0
    assert seen == [
        ("moved", ".rebase/stage/overlay/vllm"),  # the staged overlay build
        ("moved", ".rebase/backup/patches"),  # the swap: each old one aside, the new one in
        ("moved", "patches"),
        ("moved", ".rebase/backup/pyproject.toml"),
        ("moved", "pyproject.toml"),
        ("moved", ".rebase/backup/overlay/overlay.lock.json"),
        ("moved", "overlay/overlay.lock.json"),
        ("moved", ".rebase/backup/CHANGELOG.md"),
        ("moved", "CHANGELOG.md"),
        ("moved", "overlay/vllm"),  # not built in this checkout: a marker, no backup
        ("moved", ".rebase/discarded"),  # the cleanup: the backup goes in one rename
    ]
