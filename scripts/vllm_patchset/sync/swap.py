"""The rebase's staging and swap: the rebased project is written under `.rebase/stage/` and
checked as `check` checks a checkout (`stage_project`); then the staged files replace the
checkout's in one short pass, each old one kept in `.rebase/backup/` until the end
(`swap_in`), which `roll_back` undoes.

The backup dir is its own journal: before a path is replaced, either its old version is in
`backup/<path>` or a marker `backup/<path>.created-by-swap` says there was none. So a swap
cut short (a kill, a power cut) is finished by running `swap_in` again, or undone by
`roll_back` — neither needs anything but the two dirs, not even a readable state file.
"""

from __future__ import annotations

import dataclasses
import re
import tarfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_patchset import versions
from vllm_patchset.errors import BadInput, Finding, PatchsetError
from vllm_patchset.infra import archives, fsio
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.fsio import fsync_dir, remove_file, remove_tree
from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.overlay.build import build_overlay
from vllm_patchset.overlay.upstream import Mirror, Upstream, git_source_commit, is_remote_url
from vllm_patchset.series.edits import with_trailer
from vllm_patchset.series.patches import Patch, read_series_entries, write_series_file
from vllm_patchset.sync.checks import problems, project_series
from vllm_patchset.sync.project_files import (
    insert_entry,
    set_ci_images,
    set_pin,
    set_readme,
    set_torch_comment,
    set_unreleased_pin,
    torch_of,
)
from vllm_patchset.sync.rebase_report import changelog_entry, range_diff, today
from vllm_patchset.sync.rebase_state import Action, RebaseState, Section, Step, rebase_dir

CHANGELOG = "CHANGELOG.md"
README = "README.md"
# The GPU CI files whose vLLM image tags follow a release pin.
CI_FILES = (".github/workflows/gpu-validation.yml", ".buildkite/gpu-validation.yml")
STAGE = "stage"
BACKUP = "backup"
CREATED = ".created-by-swap"
REQUIREMENTS_BOUND = 1 << 20  # the most of an sdist's `requirements/cuda.txt` read (bytes)


def _marker(folder: Path, rel: str) -> Path:
    return folder / BACKUP / (rel + CREATED)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        remove_tree(path)
    else:
        remove_file(path)


def swap_in(folder: Path, root: Path, paths: Sequence[str]) -> None:
    """Move each staged `folder/stage/<rel>` to `root/<rel>`, the old one to the backup.
    Safe to run again after a kill: what was moved already is skipped."""
    for rel in paths:
        staged, target, saved = folder / STAGE / rel, root / rel, folder / BACKUP / rel
        if not staged.exists():
            continue  # moved in by an earlier run
        if not saved.exists() and not _marker(folder, rel).exists():
            fsio.make_dir(saved.parent, parents=True, exist_ok=True)
            if target.exists() or target.is_symlink():
                fsio.move(target, saved)
            else:
                fsio.touch(_marker(folder, rel))
            fsync_dir(saved.parent)
        remove(target)  # only after a kill between the two renames: the staged one again
        fsio.make_dir(target.parent, parents=True, exist_ok=True)
        fsio.move(staged, target)
        fsync_dir(target.parent)


def roll_back(folder: Path, root: Path, paths: Sequence[str]) -> None:
    """Put back every path the backup holds (and remove those the swap created): the checkout
    as it was before `swap_in`, byte for byte."""
    for rel in reversed(paths):
        target, saved, marker = root / rel, folder / BACKUP / rel, _marker(folder, rel)
        if saved.exists() or saved.is_symlink():
            remove(target)
            fsio.move(saved, target)
            fsync_dir(target.parent)
        elif marker.exists():
            remove(target)
            remove_file(marker)


def has_backup(folder: Path) -> bool:
    backup = folder / BACKUP
    return backup.is_dir() and any(backup.iterdir())


# -- the rebased project -----------------------------------------------------------------------
def rel(project: Project, path: Path) -> str:
    return path.relative_to(project.root).as_posix()


def rewritten_paths(project: Project) -> list[str]:
    """Everything a rebase may replace (the order the swap takes)."""
    return [
        rel(project, project.patches_dir),
        "pyproject.toml",
        rel(project, project.lock_path),
        CHANGELOG,
        README,
        *CI_FILES,
        rel(project, project.overlay_dir / project.package),
    ]


def stage_project(
    project: Project, mirror: Mirror, worktree: Repo, state: RebaseState
) -> RebaseState:
    """Write the rebased project under `.rebase/stage/` and check it as `check` does: nothing
    is swapped in unless the result is coherent. The steps: the patches and the three series
    files; `pyproject.toml` (the pin, the torch comment); the GPU CI files' image tags; the
    CHANGELOG.md section (and `.rebase/entry.md`, what the report prints); the README's pin
    and table; then `check` on the staged project. Returns the state with the range-diffs of
    the taken patches and the paths the swap moves in."""
    stage = rebase_dir(project) / STAGE
    remove(stage)
    state = stage_series(project, worktree, state, stage)
    release = state.git is None  # a PyPI release (not --onto-git)
    old_pyproject = project.pyproject.read_text("utf-8")
    new_pyproject = stage_pyproject(project, mirror, state, stage, old_pyproject)
    images = release and stage_ci_files(project, state, stage)
    pinned = f"vllm=={state.new_pin}"
    requirement = new_pyproject.count(pinned) > old_pyproject.count(pinned)
    stage_changelog(project, state, stage, requirement=requirement, images=images)
    if (project.root / README).is_file() and release:
        stage_readme(project, state, stage)
    check_staged(project, mirror, stage)
    moves = [rel for rel in rewritten_paths(project) if (stage / rel).exists()]
    overlay = rel(project, project.overlay_dir / project.package)
    changed = changed_files(project.root, stage, moves, skip=overlay)
    return dataclasses.replace(state, moves=tuple(moves), changed=changed)


def changed_files(root: Path, stage: Path, moves: Sequence[str], *, skip: str) -> tuple[str, ...]:
    """ "A|M|D path" of every file the swap of `moves` changes in the checkout `root` (the
    generated overlay under `skip` aside: it is not committed)."""
    out: list[str] = []
    for move in moves:
        if move == skip or move.startswith(skip + "/"):
            continue
        new, old = _files(stage / move, move), _files(root / move, move)
        for path in sorted(new.keys() | old.keys()):
            if path not in old:
                out.append(f"A {path}")
            elif path not in new:
                out.append(f"D {path}")
            elif new[path].read_bytes() != old[path].read_bytes():
                out.append(f"M {path}")
    return tuple(out)


def _files(where: Path, name: str) -> dict[str, Path]:
    if where.is_file():
        return {name: where}
    if not where.is_dir():
        return {}
    return {f"{name}/{p.relative_to(where).as_posix()}": p for p in where.rglob("*") if p.is_file()}


@dataclass
class _Lists:
    """The three series files being rewritten, in order."""

    active: list[str]
    unarchived: list[str]
    archived: list[str]
    parked: dict[str, str]  # name -> reason


@dataclass(frozen=True)
class Staging:
    """What staging one patch's file needs: the project, the worktree the patches were taken
    in, the rebase's state, the stage folder, and the series lists being rewritten."""

    project: Project
    worktree: Repo
    state: RebaseState
    stage: Path
    lists: _Lists

    def staged(self, path: Path) -> Path:
        """Where the checkout's `path` is under the stage."""
        return self.stage / rel(self.project, path)


def stage_series(project: Project, worktree: Repo, state: RebaseState, stage: Path) -> RebaseState:
    """`patches/` as the steps leave it: taken patches from the worktree's commits, archived,
    parked and dropped ones moved or removed, and the series, archive and parked lists."""
    fsio.copy_tree(project.patches_dir, stage / rel(project, project.patches_dir))
    series = project_series(project)
    old: dict[str, Patch] = {p.key: p for p in (*series.all, *series.parked)}
    lists = _Lists(
        active=[],
        unarchived=[],
        archived=[p.name for p in series.upstreamed],
        parked=dict(read_series_entries(project.parked_file)),
    )
    staging = Staging(project, worktree, state, stage, lists)
    steps = tuple(_stage_step(staging, step, old[step.key]) for step in state.steps)
    write_series_file(stage / rel(project, project.series_file), lists.unarchived + lists.active)
    write_series_file(stage / rel(project, project.upstreamed_file), lists.archived)
    if lists.parked or project.parked_file.exists():
        write_series_file(
            stage / rel(project, project.parked_file), list(lists.parked), lists.parked
        )
    return dataclasses.replace(state, steps=steps)


def _stage_step(staging: Staging, step: Step, patch: Patch) -> Step:
    """One patch's file under the stage as its step says, and its name in the lists."""
    project, lists = staging.project, staging.lists
    here = staging.staged(patch.path)
    if step.action.committed:
        return _stage_taken(staging, step, patch)
    if step.action == Action.ARCHIVED and step.section == Section.SERIES:
        archive_dir = staging.staged(project.upstreamed_file.parent)
        fsio.write_file(
            _new_file(archive_dir / step.name), with_trailer(patch.raw, step.applied_upstream)
        )
        remove_file(here)
        lists.archived.append(step.name)
    elif step.action == Action.PARKED and step.section == Section.SERIES:
        parked_dir = staging.staged(project.parked_file.parent)
        fsio.make_dir(parked_dir, parents=True, exist_ok=True)
        fsio.move(here, _new_file(parked_dir / step.name))
        lists.parked[step.name] = step.parked_reason.replace("#", "").replace("\n", " ")
    elif step.action == Action.DROPPED:
        remove_file(here)
        if step.section == Section.UPSTREAMED:
            lists.archived.remove(step.name)
    return step


def _stage_taken(staging: Staging, step: Step, patch: Patch) -> Step:
    """A patch taken in the worktree: its commit as the new patch file, with the range-diff
    against the old one."""
    lists, new_pin = staging.lists, staging.state.new_pin
    here = staging.staged(patch.path)
    assert step.commit is not None
    (_, data), *_ = staging.worktree.format_patches(f"{step.commit}^", step.commit)
    if step.section == Section.UPSTREAMED:  # carried again (--keep), by hand or not
        data = with_trailer(data, "")
        remove_file(here)
        lists.archived.remove(step.name)
        lists.unarchived.append(step.name)
    else:
        lists.active.append(step.name)
        if versions.older(step.applied_upstream, new_pin) or (step.applied_upstream == new_pin):
            # Its trailer says merged by now; the code says needed (a revert, or a
            # trailer that was wrong): the code decides, the trailer is emptied.
            data = with_trailer(data, "")
            step = dataclasses.replace(
                step,
                notes=(
                    *step.notes,
                    f"Applied-upstream: {step.applied_upstream} emptied: the bug is"
                    f" still in {new_pin}",
                ),
            )
    new_file = _new_file(staging.staged(staging.project.patches_dir) / step.name, here)
    fsio.write_file(new_file, data)
    kind, diff = range_diff(patch.raw, data, dict(step.verdict.moved_to))
    return dataclasses.replace(step, range_diff=kind, diff_of_diffs=diff)


def stage_pyproject(
    project: Project, mirror: Mirror, state: RebaseState, stage: Path, old_pyproject: str
) -> str:
    """`pyproject.toml` with the new pin (and, for a release, the torch it requires)."""
    release = state.git is None
    new_pyproject = set_pin(
        old_pyproject,
        state.new_pin,
        ref=state.ref,
        commit=git_source_commit(state.onto),
        git_url=state.git if state.git and is_remote_url(state.git) else None,
        requirement=release,
    )
    if release:
        new_pyproject = set_torch_comment(new_pyproject, state.new_pin, _torch(mirror, state.onto))
    fsio.write_file(stage / "pyproject.toml", new_pyproject)
    return new_pyproject


def stage_ci_files(project: Project, state: RebaseState, stage: Path) -> bool:
    """The GPU CI files with the new release's image tags; whether any tag changed."""
    images = False
    for ci_file in CI_FILES:
        if (project.root / ci_file).is_file():
            old_text = (project.root / ci_file).read_text("utf-8")
            new_text = set_ci_images(old_text, state.new_pin)
            images = images or new_text != old_text
            fsio.write_file(_new_file(stage / ci_file), new_text)
    return images


def stage_changelog(
    project: Project, state: RebaseState, stage: Path, *, requirement: bool, images: bool
) -> None:
    """CHANGELOG.md with the rebase's section (and, for a release, the pin under
    `[Unreleased]`); the section alone in `.rebase/entry.md`."""
    old_log = (
        (project.root / CHANGELOG).read_text("utf-8")
        if (project.root / CHANGELOG).is_file()
        else ""
    )
    entry = changelog_entry(state, today(), requirement=requirement, images=images)
    new_log = insert_entry(old_log, entry)
    if state.git is None:
        sha256 = re.search(r"\bsha256:([0-9a-f]{64})\b", state.onto.source)
        new_log = set_unreleased_pin(new_log, state.new_pin, sha256.group(1) if sha256 else None)
    fsio.write_file(stage / CHANGELOG, new_log)
    fsio.write_file(rebase_dir(project) / "entry.md", entry)


def stage_readme(project: Project, state: RebaseState, stage: Path) -> None:
    """README.md with the new pin and each patch's row of its table."""
    fsio.write_file(
        stage / README,
        set_readme(
            (project.root / README).read_text("utf-8"),
            state.old_pin,
            state.new_pin,
            _readme_rows(project, state),
        ),
    )


def check_staged(project: Project, mirror: Mirror, stage: Path) -> None:
    """The staged project's overlay built and its lock rebuilt, then `check`'s rules: a
    Finding, and nothing swapped in, unless it passes."""
    try:
        staged = Project.load(stage, project.cache_dir)
        build_overlay(staged, update_lock=True)
        _, found = problems(staged, mirror)
    except PatchsetError as exc:
        found = [str(exc)]
    if found:
        raise Finding(
            f"the rebased project would fail `check` ({found[0]}): nothing was swapped in;"
            " `rebase --abort` restores everything"
        )


def _readme_rows(project: Project, state: RebaseState) -> dict[str, tuple[str, str, str] | None]:
    """Each patch's row of the README's table: its new key, release with the fix, state."""
    rows: dict[str, tuple[str, str, str] | None] = {}
    archive = project.upstreamed_file.parent.name
    parked = project.parked_file.parent.name
    for step in state.steps:
        if step.action == Action.DROPPED:
            rows[step.key] = None
            continue
        key = {
            Action.ARCHIVED: f"{archive}/{step.name}",
            Action.UNARCHIVED: step.name,
        }.get(step.action, step.key)
        if step.action == Action.PARKED and step.section != Section.PARKED:
            key = f"{parked}/{step.name}"
        release = step.applied_upstream if step.action != Action.UNARCHIVED else ""
        rows[step.key] = (key, release, step.verdict.state.value)
    return rows


def _torch(mirror: Mirror, onto: Upstream) -> str | None:
    """The torch the release requires, from its sdist's `requirements/cuda.txt` (None: not a
    PyPI release, or no such pin there). The sdist is read as a stream up to that member only,
    and the member bounded (`archives.read_member`)."""
    if not onto.source.startswith("pypi:") or onto.version is None:
        return None
    sdist = mirror.sdists / f"{mirror.package}-{onto.version}.tar.gz"
    member = f"{mirror.package}-{onto.version}/requirements/cuda.txt"
    try:
        with tarfile.open(sdist, "r|gz") as tar:
            data = archives.read_member(tar, member, what=str(sdist), limit=REQUIREMENTS_BOUND)
    except (OSError, tarfile.TarError, EOFError, zlib.error, archives.ArchiveRefused):
        return None
    return torch_of(data.decode("utf-8", "replace")) if data is not None else None


def _new_file(path: Path, replacing: Path | None = None) -> Path:
    """`path`, refused when a file of another patch is there already."""
    if path.exists() and path != replacing:
        raise BadInput(f"{path.name} exists already in {path.parent.name}/: rename the patch")
    fsio.make_dir(path.parent, parents=True, exist_ok=True)
    return path
