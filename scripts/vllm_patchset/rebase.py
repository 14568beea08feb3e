"""`vllm-patchset rebase`: take the series from the pin onto a new vLLM release or git ref.

Each patch is classified on the new base with every signal (states.classify: git's apply
check, the hunks located in the new files, the trailers; plus a 3-way merge here), then taken
there as a commit with `git am -3` in the worktree `.rebase/worktree`:
- applies: refreshed (new context and index lines, same message and file name);
- upstream: leaves the series for patches/upstreamed/ with the release that merged it;
- absent: kept unchanged (the overlay skips it) unless `--drop`;
- conflict: the rebase stops; the maintainer resolves in the worktree, then `--continue`.
`patches/`, the pin, the lock and CHANGELOG.md are staged under `.rebase/stage/` and swapped in
only when the whole rebase is done; the state in `.rebase/state.json` makes `--continue` and
`--abort` possible, and lets a swap cut short by a kill be finished or rolled back.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import difflib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_patchset import fsio
from vllm_patchset.config import Project
from vllm_patchset.errors import BadInput, Finding, GitError
from vllm_patchset.gitrepo import Repo
from vllm_patchset.overlay import build_overlay, pin_base
from vllm_patchset.reports import conflict_report
from vllm_patchset.series import Patch, load_series, write_series_file
from vllm_patchset.states import State, classify
from vllm_patchset.upstream import VERSION_RE, Mirror, Upstream, check_version, version_key

REBASE_DIR = ".rebase"
CHANGELOG = "CHANGELOG.md"
CHANGELOG_HEADER = (
    "# Changelog\n\n"
    "All notable changes to this patch set are documented in this file.\n"
    "The format is based on [Keep a Changelog](https://keepachangelog.com/en/1.1.0/).\n\n"
    "## [Unreleased]\n"
)
ABSENT_RULE = {
    "keep": "absent patches stay in the series unchanged (the overlay skips a patch that is"
    " absent); rerun with --drop to remove them",
    "drop": "absent patches leave the series (--drop); git history keeps them",
}


@dataclass(frozen=True)
class Step:
    """What the rebase found and did for one patch."""

    key: str  # the patch's key before the rebase ("name" or "upstreamed/name")
    name: str
    archive: bool  # in patches/upstreamed/ before the rebase
    state: str  # on the new base: applies, upstream, absent, conflict
    text_state: str
    trailer_state: str | None
    three_way: str  # "clean", "no change" or "conflict": `git apply --3way` on the tree
    action: str  # refreshed, resolved, archived, carried, kept, dropped, skipped, conflict
    notes: tuple[str, ...] = ()
    commit: str | None = None
    applied_upstream: str = ""
    upstream_pr: str = ""
    range_diff: str = ""  # unchanged, context-only churn, content changed
    diff_of_diffs: str = ""
    report: str = ""  # the conflict report

    @staticmethod
    def load(doc: dict[str, Any]) -> Step:
        return Step(**{**doc, "notes": tuple(doc["notes"])})


@dataclass(frozen=True)
class RebaseState:
    phase: str  # running, stopped (on a conflict), swap (files being swapped in), done
    old_pin: str
    onto: dict[str, Any]  # Upstream fields, plus "git"/"ref" for a git base
    absent: str  # keep or drop
    project_head: str
    steps: tuple[Step, ...] = ()
    stopped_head: str | None = None
    moves: tuple[tuple[str, bool], ...] = ()  # (path under the root, existed before)

    @property
    def upstream(self) -> Upstream:
        fields = ("label", "version", "tag", "commit", "source")
        return Upstream(**{k: self.onto[k] for k in fields})

    @property
    def new_pin(self) -> str:
        return str(self.onto["version"] or self.onto["label"])

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @staticmethod
    def load(path: Path) -> RebaseState:
        doc = json.loads(path.read_text("utf-8"))
        doc["steps"] = tuple(Step.load(s) for s in doc["steps"])
        doc["moves"] = tuple((str(p), bool(e)) for p, e in doc["moves"])
        return RebaseState(**doc)


@dataclass(frozen=True)
class Outcome:
    state: RebaseState
    status: str  # done, stopped, aborted
    worktree: Path
    lines: tuple[str, ...] = ()  # next steps (stopped) or where things went (done)
    changelog: str = ""


# -- paths and state -----------------------------------------------------------------------------
def rebase_dir(project: Project) -> Path:
    return project.root / REBASE_DIR


def _state_path(project: Project) -> Path:
    return rebase_dir(project) / "state.json"


def _save(project: Project, state: RebaseState) -> None:
    fsio.atomic_write(_state_path(project), state.to_json().encode())


def _load(project: Project) -> RebaseState:
    if not _state_path(project).is_file():
        raise BadInput("no rebase in progress (start one with `rebase --onto VERSION`)")
    return RebaseState.load(_state_path(project))


def _mirror(project: Project) -> Mirror:
    return Mirror(project.cache_dir, project.package, project.index_url)


def _rel(project: Project, path: Path) -> str:
    return path.relative_to(project.root).as_posix()


def _tracked_paths(project: Project) -> list[str]:
    """What a rebase rewrites (the generated overlay/vllm/ aside)."""
    return [
        _rel(project, project.patches_dir),
        "pyproject.toml",
        _rel(project, project.lock_path),
        CHANGELOG,
    ]


def _require_clean(project: Project, head: str | None = None) -> None:
    """No tracked change anywhere, no untracked file where the rebase writes."""
    repo = Repo(project.root)
    ours = set(repo.changed_paths(*_tracked_paths(project)))
    changed = [line for line in repo.changed_paths() if not line.startswith("??") or line in ours]
    if changed:
        raise BadInput(
            f"the checkout {project.root} has uncommitted changes ({changed[0].strip()}):"
            " commit or stash them before a rebase"
        )
    if head is not None and repo.head() != head:
        raise BadInput(
            f"{project.root} moved to another commit since the rebase started:"
            " `rebase --abort`, then start again"
        )


# -- start / continue / abort --------------------------------------------------------------------
def start(
    project: Project, *, version: str | None, git: str | None, ref: str | None, absent: str
) -> Outcome:
    if _state_path(project).exists():
        raise BadInput(
            f"a rebase is in progress ({_state_path(project)}): `rebase --continue` or"
            " `rebase --abort`"
        )
    _require_clean(project)
    if (project.upstreamed_file.parent.parent != project.patches_dir) or not (
        project.series_file.parent == project.patches_dir
    ):
        raise BadInput("rebase needs the series and the upstreamed archive under one patches/ dir")
    mirror = _mirror(project)
    old = pin_base(project, mirror)  # its blobs are the 3-way merge's base
    onto = mirror.git_ref(git, ref) if git and ref else mirror.release(check_version(version or ""))
    if onto.commit == old.commit:
        raise BadInput(f"the pin {project.pin} is {onto.label} already: nothing to rebase")
    load_series(project.series_file, project.upstreamed_file)  # well-formed before anything
    state = RebaseState(
        phase="running",
        old_pin=project.pin,
        onto={**dataclasses.asdict(onto), "git": git, "ref": ref},
        absent=absent,
        project_head=Repo(project.root).head(),
    )
    folder = rebase_dir(project)
    _cleanup(project)  # what a kill at the very end of a cleanup may have left
    folder.mkdir()
    (folder / ".gitignore").write_text("*\n", encoding="utf-8")
    # Written whole, then linked in: one rebase at a time, and never a half-written state.
    draft = folder / f"state.{os.getpid()}.json"
    draft.write_text(state.to_json(), encoding="utf-8")
    try:
        os.link(draft, _state_path(project))
    except FileExistsError:
        raise BadInput(f"another rebase started in {project.root} meanwhile") from None
    finally:
        draft.unlink()
    worktree = mirror.repo.clone_shared(folder / "worktree", onto.commit)
    state = dataclasses.replace(state, steps=_take_archive(project, mirror, worktree, onto))
    _save(project, state)
    return _proceed(project, mirror, state)


def resume(project: Project, *, absent: str | None) -> Outcome:
    state = _load(project)
    mirror = _mirror(project)
    if state.phase in ("swap", "done"):
        return _finish(project, mirror, state)
    if state.phase != "stopped":
        raise BadInput(
            "the rebase was interrupted before it finished: `rebase --abort`, then start again"
        )
    _require_clean(project, state.project_head)
    worktree = Repo(rebase_dir(project) / "worktree")
    conflicted = state.steps[-1]
    if worktree.am_in_progress():
        if (
            worktree.unmerged_paths()
            or worktree.is_dirty()
            or worktree.head() == state.stopped_head
        ):
            raise Finding(
                f"{conflicted.name} is not resolved yet in {worktree.path}: fix the conflicts,"
                " `git add` the files, `git am --continue`; then `rebase --continue`"
            )
        worktree.am_quit()  # resolved and committed with `git commit`
    if worktree.is_dirty():
        raise Finding(f"{worktree.path} has uncommitted changes: commit them first")
    assert state.stopped_head is not None
    commits = worktree.count(state.stopped_head)
    if commits > 1:
        raise Finding(
            f"{worktree.path}: {commits} commits for {conflicted.name}; squash them into one"
        )
    done = dataclasses.replace(
        conflicted,
        action="resolved" if commits else "skipped",
        state=State.CONFLICT.value,
        commit=worktree.head() if commits else None,
    )
    state = dataclasses.replace(
        state,
        phase="running",
        steps=(*state.steps[:-1], done),
        stopped_head=None,
        absent=absent or state.absent,
    )
    _save(project, state)
    return _proceed(project, mirror, state)


def abort(project: Project) -> Outcome:
    state = _load(project)
    mirror = _mirror(project)
    if state.phase == "done":
        return _finish(project, mirror, state)  # only the cleanup was left: too late to undo
    if state.phase == "swap":
        _roll_back(project, state)
    _cleanup(project)
    return Outcome(state, "aborted", rebase_dir(project) / "worktree")


# -- taking the patches --------------------------------------------------------------------------
def _three_way(repo: Repo, tree: str, patch: Patch) -> str:
    try:
        merged = repo.apply_to_tree(tree, patch.raw, three_way=True)
    except GitError:
        return "conflict"
    return "no change" if merged == tree else "clean"


def _take_archive(
    project: Project, mirror: Mirror, worktree: Repo, onto: Upstream
) -> tuple[Step, ...]:
    """The archive, classified first (as the overlay walk does); one that applies again is
    committed, so that the series meets the tree the overlay will build."""
    steps = []
    for patch in load_series(project.series_file, project.upstreamed_file).upstreamed:
        tree = worktree.tree_of("HEAD")
        verdict = classify(mirror.repo, tree, patch, base=onto.label, version=onto.version)
        notes = list(verdict.disagreements)
        if verdict.state == State.APPLIES:
            notes.append(
                f"archived as upstream, yet applies to {onto.label} (did upstream revert the"
                " fix?): the overlay applies it; consider moving it back to the series"
            )
            worktree.am([patch.raw])
        steps.append(
            Step(
                key=patch.key,
                name=patch.name,
                archive=True,
                state=verdict.state.value,
                text_state=verdict.text_state.value,
                trailer_state=verdict.trailer_state.value if verdict.trailer_state else None,
                three_way=_three_way(mirror.repo, tree, patch),
                action="carried",
                notes=tuple(notes),
                applied_upstream=patch.trailers.applied_upstream,
                upstream_pr=patch.trailers.upstream_pr,
            )
        )
    return tuple(steps)


def _proceed(project: Project, mirror: Mirror, state: RebaseState) -> Outcome:
    onto = state.upstream
    worktree = Repo(rebase_dir(project) / "worktree")
    done = {step.key for step in state.steps}
    for patch in load_series(project.series_file, project.upstreamed_file).active:
        if patch.key in done:
            continue
        step = _take(mirror, worktree, patch, onto, state.absent)
        state = dataclasses.replace(state, steps=(*state.steps, step))
        if step.action == "conflict":
            state = dataclasses.replace(state, phase="stopped", stopped_head=worktree.head())
            _save(project, state)
            return Outcome(state, "stopped", worktree.path, _next_steps(project, worktree))
        _save(project, state)
    return _finish(project, mirror, state)


def _take(mirror: Mirror, worktree: Repo, patch: Patch, onto: Upstream, absent: str) -> Step:
    """Classify one patch of the series on the worktree's HEAD and take it there (or not)."""
    tree = worktree.tree_of("HEAD")
    verdict = classify(mirror.repo, tree, patch, base=onto.label, version=onto.version)
    three_way = _three_way(mirror.repo, tree, patch)
    step = Step(
        key=patch.key,
        name=patch.name,
        archive=False,
        state=verdict.state.value,
        text_state=verdict.text_state.value,
        trailer_state=verdict.trailer_state.value if verdict.trailer_state else None,
        three_way=three_way,
        action="",
        notes=verdict.disagreements,
        applied_upstream=patch.trailers.applied_upstream,
        upstream_pr=patch.trailers.upstream_pr,
    )
    notes = step.notes
    if verdict.state == State.UPSTREAM:
        if three_way != "no change":
            notes += (f"3-way merge: {three_way} (the release's code differs from the patch's)",)
        release, note = _merged_in(mirror, patch, onto)
        return dataclasses.replace(
            step, action="archived", applied_upstream=release, notes=(*notes, note)
        )
    if verdict.state == State.ABSENT:
        if three_way == "clean":
            notes += ("3-way merge: clean, although the code it fixes was not found",)
        action = "dropped" if absent == "drop" else "kept"
        return dataclasses.replace(step, action=action, notes=notes)
    if not worktree.am_3way(patch.raw):
        return dataclasses.replace(
            step, state=State.CONFLICT.value, action="conflict", report=conflict_report(verdict)
        )
    if verdict.state == State.CONFLICT:
        notes += ("its context changed; the 3-way merge (git am -3) applied it cleanly",)
    return dataclasses.replace(
        step, state=State.APPLIES.value, action="refreshed", commit=worktree.head(), notes=notes
    )


def _merged_in(mirror: Mirror, patch: Patch, onto: Upstream) -> tuple[str, str]:
    """The release that merged the fix: the trailer, else the earliest release in the local
    mirror (searching back from the new base while the fix is there)."""
    if patch.trailers.applied_upstream:
        return patch.trailers.applied_upstream, (
            f"Applied-upstream: {patch.trailers.applied_upstream} (trailer kept)"
        )
    if onto.version is None:
        return "", f"merged upstream at {onto.label}, no release yet: Applied-upstream left empty"
    key = version_key(onto.version)
    releases = sorted(
        (
            tag[1:]
            for tag in mirror.repo.tags("v*")
            if VERSION_RE.match(tag[1:]) and version_key(tag[1:]) <= key
        ),
        key=version_key,
        reverse=True,
    )
    first = onto.version
    for release in releases:
        tree = mirror.repo.tree_of(f"refs/tags/v{release}")
        verdict = classify(mirror.repo, tree, patch, base=release, version=release)
        if verdict.text_state != State.UPSTREAM:
            break
        first = release
    return first, (
        f"Applied-upstream: {first} (the earliest release in the local mirror, searching back"
        f" from {onto.version}, that has the fix)"
    )


def _next_steps(project: Project, worktree: Repo) -> tuple[str, ...]:
    files = " ".join(worktree.unmerged_paths()) or "(the files of the hunks above)"
    return (
        f"1. cd {worktree.path}",
        f"2. resolve the conflict in: {files}",
        "3. git add <the files> && git am --continue"
        " (keeps the patch's message, author and date; `git am --skip` drops the patch)",
        f"4. cd {project.root} && vllm-patchset rebase --continue",
        "To give up: vllm-patchset rebase --abort (everything is restored as it was).",
        "Nothing in patches/, pyproject.toml, the lock or CHANGELOG.md has changed yet.",
    )


# -- finishing: stage everything, then swap ------------------------------------------------------
def _finish(project: Project, mirror: Mirror, state: RebaseState) -> Outcome:
    worktree = Repo(rebase_dir(project) / "worktree")
    if state.phase == "running":
        state = _stage(project, mirror, worktree, state)
        state = dataclasses.replace(state, phase="swap")
        _save(project, state)
    if state.phase == "swap":
        _swap(project, state)
        state = dataclasses.replace(state, phase="done")  # no way back from here: the backups
        _save(project, state)  # go with the cleanup
    changelog = _entry_of(project)
    _cleanup(project)
    where = (
        f"pin: {project.package} {state.new_pin} (was {state.old_pin}); patches/, "
        f"{_rel(project, project.lock_path)} and {CHANGELOG} rewritten; review and commit them",
    )
    return Outcome(state, "done", worktree.path, where, changelog)


def _stage(project: Project, mirror: Mirror, worktree: Repo, state: RebaseState) -> RebaseState:
    stage = rebase_dir(project) / "stage"
    if stage.exists():
        shutil.rmtree(stage)
    patches = stage / _rel(project, project.patches_dir)
    shutil.copytree(project.patches_dir, patches)
    archive_dir = patches / project.upstreamed_file.parent.name
    series = load_series(project.series_file, project.upstreamed_file)
    old = {p.key: p for p in series.all}
    carried = [p.name for p in series.upstreamed]
    active: list[str] = []
    steps = []
    for step in state.steps:
        patch = old[step.key]
        if step.action in ("refreshed", "resolved"):
            assert step.commit is not None
            (_, data), *_ = worktree.format_patches(f"{step.commit}^", step.commit)
            (patches / step.name).write_bytes(data)
            kind, diff = range_diff(patch.raw, data)
            step = dataclasses.replace(step, range_diff=kind, diff_of_diffs=diff)
            active.append(step.name)
        elif step.action == "kept":
            active.append(step.name)
        elif step.action == "archived":
            if (archive_dir / step.name).exists():
                raise BadInput(f"{archive_dir / step.name} exists already: rename the patch")
            (archive_dir / step.name).write_bytes(with_trailer(patch.raw, step.applied_upstream))
            (patches / step.name).unlink()
            carried.append(step.name)
        elif step.action in ("dropped", "skipped"):
            (patches / step.name).unlink()
        steps.append(step)
    state = dataclasses.replace(state, steps=tuple(steps))
    write_series_file(patches / project.series_file.name, active)
    write_series_file(archive_dir / project.upstreamed_file.name, carried)
    onto = state.upstream
    pyproject = set_pin(
        project.pyproject.read_text("utf-8"),
        state.new_pin,
        git=state.onto["git"],
        ref=state.onto["ref"],
    )
    (stage / "pyproject.toml").write_text(pyproject, encoding="utf-8")
    old_log = (
        (project.root / CHANGELOG).read_text("utf-8")
        if (project.root / CHANGELOG).is_file()
        else ""
    )
    entry = changelog_entry(state, _today())
    (stage / CHANGELOG).write_text(insert_entry(old_log, entry), encoding="utf-8")
    (rebase_dir(project) / "entry.md").write_text(entry, encoding="utf-8")
    staged = dataclasses.replace(
        project,
        root=stage,
        pin=state.new_pin,
        pin_git=state.onto["git"],
        pin_ref=state.onto["ref"],
        series_file=patches / project.series_file.name,
        upstreamed_file=archive_dir / project.upstreamed_file.name,
        overlay_dir=stage / _rel(project, project.overlay_dir),
        lock_path=stage / _rel(project, project.lock_path),
    )
    load_series(staged.series_file, staged.upstreamed_file)  # the result parses
    build_overlay(staged, update_lock=True, base=onto, out_dir=staged.overlay_dir)
    moves = [
        _rel(project, project.patches_dir),
        "pyproject.toml",
        _rel(project, project.lock_path),
        CHANGELOG,
        _rel(project, project.overlay_dir / project.package),
    ]
    return dataclasses.replace(state, moves=tuple((m, (project.root / m).exists()) for m in moves))


def _swap(project: Project, state: RebaseState) -> None:
    """Move each staged path in place, the old one to `.rebase/backup/`. Safe to rerun after a
    kill: what was moved already is skipped."""
    folder = rebase_dir(project)
    for rel, _ in state.moves:
        staged, target, saved = folder / "stage" / rel, project.root / rel, folder / "backup" / rel
        if not staged.exists():
            continue
        if target.exists() and not saved.exists():
            saved.parent.mkdir(parents=True, exist_ok=True)
            target.replace(saved)
        _remove(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        staged.replace(target)


def _roll_back(project: Project, state: RebaseState) -> None:
    folder = rebase_dir(project)
    for rel, existed in reversed(state.moves):
        target, saved = project.root / rel, folder / "backup" / rel
        if saved.exists():
            _remove(target)
            saved.replace(target)
        elif not existed and not (folder / "stage" / rel).exists():
            _remove(target)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _entry_of(project: Project) -> str:
    path = rebase_dir(project) / "entry.md"
    return path.read_text("utf-8") if path.is_file() else ""


def _cleanup(project: Project) -> None:
    """Remove `.rebase/` (the worktree is a clone that only borrows the mirror's objects), the
    state file last: a kill here leaves a state that `--continue` or `--abort` understands."""
    folder = rebase_dir(project)
    for leftover in ("worktree", "stage", "backup"):
        shutil.rmtree(folder / leftover, ignore_errors=True)
    _state_path(project).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


# -- text helpers --------------------------------------------------------------------------------
def with_trailer(raw: bytes, release: str) -> bytes:
    """The patch with its `Applied-upstream:` trailer set to `release` (nothing else changes)."""
    message, sep, rest = raw.partition(b"\n---\n")
    lines = [
        f"Applied-upstream: {release}".encode() if line.startswith(b"Applied-upstream:") else line
        for line in message.split(b"\n")
    ]
    return b"\n".join(lines) + sep + rest


def _changes(raw: bytes) -> list[str]:
    """The diff part of a patch with what a refresh may change (index lines, line numbers,
    context) marked, for the range-diff."""
    diff = raw.decode("utf-8", "replace").partition("\ndiff --git ")[2]
    out = []
    for line in ("diff --git " + diff).split("\n"):
        if line.startswith("index ") or line == "-- ":
            continue
        if line.startswith("@@"):
            out.append("@@ " + line.split("@@", 2)[-1].strip())
        else:
            out.append(line)
    return out


def range_diff(old: bytes, new: bytes) -> tuple[str, str]:
    """unchanged / context-only churn / content changed, and then the diff of the diffs."""
    if old == new:
        return "unchanged", ""
    a, b = _changes(old), _changes(new)

    def changed(lines: list[str]) -> list[str]:
        return [
            line
            for line in lines
            if line.startswith(("diff --git", "+", "-")) and not line.startswith(("+++", "---"))
        ]

    if changed(a) == changed(b):
        return "context-only churn", ""
    diff = difflib.unified_diff(a, b, "old patch", "new patch", lineterm="", n=2)
    return "content changed", "\n".join(diff) + "\n"


def set_pin(text: str, pin: str, *, git: str | None, ref: str | None) -> str:
    """pyproject.toml with the new pin (and `pin-git`/`pin-ref` for a git base; the `vllm==`
    requirement follows a release pin)."""
    out: list[str] = []
    table = ""
    found = False
    for line in text.split("\n"):
        if line.startswith("["):
            table = line.strip()
        if table == "[tool.vllm-patchset]" and re.match(r"pin-(git|ref)\s*=", line):
            continue
        if table == "[tool.vllm-patchset]" and re.match(r"pin\s*=", line):
            found = True
            out.append(f"pin = {json.dumps(pin)}")
            if git and ref:
                out += [f"pin-git = {json.dumps(git)}", f"pin-ref = {json.dumps(ref)}"]
            continue
        out.append(line)
    if not found:
        raise BadInput("pyproject.toml: no `pin = ...` in [tool.vllm-patchset]")
    text = "\n".join(out)
    if not git:
        text = re.sub(r'"vllm==[^"]*"', f'"vllm=={pin}"', text)
    return text


def _today() -> str:
    # SOURCE_DATE_EPOCH (reproducible-builds.org) fixes the date for tests and CI.
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    now = (
        datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
        if epoch
        else datetime.datetime.now(datetime.timezone.utc)
    )
    return now.date().isoformat()


def _pr(url: str) -> str:
    match = re.search(r"/pull/(\d+)$", url)
    return f"[#{match.group(1)}]({url})" if match else url


def changelog_entry(state: RebaseState, date: str) -> str:
    """The Keep a Changelog section that the rebase adds."""
    active = [s for s in state.steps if not s.archive]
    lines = [
        f"## [vllm-{state.new_pin}] - {date}",
        "",
        f"Rebased onto vLLM {state.new_pin} (from {state.old_pin}) by `vllm-patchset rebase`.",
        "",
        "### Changed",
        "",
        f"- Pin: vLLM {state.old_pin} -> {state.new_pin}.",
    ]
    for s in active:
        if s.action == "refreshed" and s.range_diff != "unchanged":
            lines.append(f"- Refreshed `{s.name}` ({s.range_diff}).")
        elif s.action == "resolved":
            lines.append(f"- Conflict resolved in `{s.name}` ({s.range_diff}).")
    carried = [
        f"`{s.name}`" + (f" (absent on {state.new_pin}, kept)" if s.action == "kept" else "")
        for s in active
        if s.action in ("refreshed", "resolved", "kept")
    ]
    lines.append(f"- Still carried: {', '.join(carried) or 'none'}.")
    removed = []
    for s in active:
        if s.action == "archived":
            where = f"vLLM {s.applied_upstream}" if s.applied_upstream else state.new_pin
            removed.append(
                f"- Dropped as upstream: `{s.name}`, merged in {where} by {_pr(s.upstream_pr)};"
                " archived in `patches/upstreamed/`."
            )
        elif s.action == "dropped":
            removed.append(f"- Dropped `{s.name}`: absent from vLLM {state.new_pin} (--drop).")
        elif s.action == "skipped":
            removed.append(f"- Dropped `{s.name}` while resolving its conflict (git am --skip).")
    if removed:
        lines += ["", "### Removed", "", *removed]
    return "\n".join(lines) + "\n"


def insert_entry(changelog: str, entry: str) -> str:
    """Newest first: after the `[Unreleased]` section, else before the first release."""
    if not changelog.strip():
        return CHANGELOG_HEADER + "\n" + entry
    lines = changelog.splitlines(keepends=True)
    sections = [i for i, line in enumerate(lines) if line.startswith("## ")]
    unreleased = [i for i in sections if _is_unreleased(lines[i])]
    after = [i for i in sections if unreleased and i > unreleased[0]]
    at = after[0] if after else (len(lines) if unreleased or not sections else sections[0])
    head = "".join(lines[:at]).rstrip("\n") + "\n\n"
    tail = "".join(lines[at:])
    return head + entry + ("\n" + tail if tail else "")


def _is_unreleased(line: str) -> bool:
    return line.strip().lower() in ("## [unreleased]", "## unreleased")


# -- reports -------------------------------------------------------------------------------------
def _detail(step: Step) -> str:
    if step.action in ("refreshed", "resolved"):
        return f"{step.action} ({step.range_diff or 'taken'})"
    if step.action == "archived":
        return f"-> patches/upstreamed/ (Applied-upstream: {step.applied_upstream or 'empty'})"
    if step.action == "kept":
        return "kept in the series (absent)"
    if step.action == "carried":
        return "stays in patches/upstreamed/"
    if step.action == "conflict":
        return "CONFLICT: the rebase stopped here"
    return step.action


def render_text(outcome: Outcome) -> str:
    state = outcome.state
    if outcome.status == "aborted":
        return f"rebase onto {state.onto['label']} aborted: everything is as it was"
    out = [f"rebase {state.old_pin} -> {state.onto['label']}: {outcome.status}"]
    width = max(len(s.key) for s in state.steps) if state.steps else 0
    for step in state.steps:
        out.append(f"  {step.key.ljust(width)}  {step.state:<8}  {_detail(step)}")
        out += [f"    * {note}" for note in step.notes]
    out.append(f"absent rule: {ABSENT_RULE[state.absent]}")
    for step in state.steps:
        if step.diff_of_diffs:
            out += [f"range-diff of {step.name}:", step.diff_of_diffs.rstrip("\n")]
    if outcome.status == "stopped":
        out += [state.steps[-1].report, "next steps:", *(f"  {line}" for line in outcome.lines)]
    else:
        out += [*outcome.lines, "", outcome.changelog.rstrip("\n")]
    return "\n".join(out)


def render_json(outcome: Outcome) -> str:
    state = outcome.state
    doc: dict[str, Any] = {
        "versions": {state.onto["label"]: {s.key: s.state for s in state.steps}},
        "status": outcome.status,
        "from": state.old_pin,
        "onto": {k: state.onto[k] for k in ("label", "version", "source", "commit")},
        "absent_rule": ABSENT_RULE[state.absent],
        "patches": {
            s.key: {
                "file": s.name,
                "state": s.state,
                "text_state": s.text_state,
                "trailer_state": s.trailer_state,
                "three_way": s.three_way,
                "action": s.action,
                "notes": list(s.notes),
                "range_diff": s.range_diff or None,
                "diff_of_diffs": s.diff_of_diffs or None,
                "applied_upstream": s.applied_upstream or None,
                "upstream_pr": s.upstream_pr,
            }
            for s in state.steps
        },
    }
    if outcome.status == "stopped":
        doc["conflict"] = {
            "patch": state.steps[-1].key,
            "worktree": str(outcome.worktree),
            "report": state.steps[-1].report,
            "next_steps": list(outcome.lines),
        }
    if outcome.status == "done":
        doc["pin"] = state.new_pin
        doc["changelog"] = outcome.changelog
    return json.dumps(doc, indent=2)


# -- command line --------------------------------------------------------------------------------
def cmd_rebase(args: argparse.Namespace) -> int:
    project = Project.load(args.project, args.cache_dir)
    absent = "drop" if args.drop else "keep" if args.keep else None
    if bool(args.ref) != bool(args.onto_git):
        raise BadInput(
            "--onto-git needs --ref REF" if args.onto_git else "--ref goes with --onto-git"
        )
    if args.abort:
        outcome = abort(project)
    elif args.resume:
        outcome = resume(project, absent=absent)
    else:
        outcome = start(
            project, version=args.onto, git=args.onto_git, ref=args.ref, absent=absent or "keep"
        )
    print(render_json(outcome) if args.json else render_text(outcome))
    return 1 if outcome.status == "stopped" else 0


def register_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rebase", help="take the series onto a new vLLM release or git ref")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--onto", metavar="VERSION", help="a vLLM release from the package index")
    what.add_argument("--onto-git", metavar="URL|PATH", help="a git repository holding vllm/")
    what.add_argument("--continue", dest="resume", action="store_true", help="after a conflict")
    what.add_argument("--abort", action="store_true", help="restore everything as it was")
    p.add_argument("--ref", metavar="REF", help="the ref of --onto-git")
    absent = p.add_mutually_exclusive_group()
    absent.add_argument("--drop", action="store_true", help="drop patches absent on the new base")
    absent.add_argument("--keep", action="store_true", help="keep them (the default rule)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_rebase)
