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
import shutil
import tarfile
from collections.abc import Sequence
from pathlib import Path

from vllm_patchset import versions
from vllm_patchset.errors import BadInput, Finding, PatchsetError
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.fsio import fsync_dir, remove_file, remove_tree
from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.overlay.build import build_overlay
from vllm_patchset.overlay.upstream import Mirror, Upstream, git_source_commit, is_remote_url
from vllm_patchset.series.edits import (
    insert_entry,
    set_ci_images,
    set_pin,
    set_readme,
    set_torch_comment,
    set_unreleased_pin,
    torch_of,
    with_trailer,
)
from vllm_patchset.series.patches import Patch, read_series_entries, write_series_file
from vllm_patchset.sync.checks import problems, project_series
from vllm_patchset.sync.rebase_report import changelog_entry, range_diff, today
from vllm_patchset.sync.rebase_state import Action, RebaseState, Section, rebase_dir

CHANGELOG = "CHANGELOG.md"
README = "README.md"
# The GPU CI files whose vLLM image tags follow a release pin.
CI_FILES = (".github/workflows/gpu-validation.yml", ".buildkite/gpu-validation.yml")
STAGE = "stage"
BACKUP = "backup"
CREATED = ".created-by-swap"


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
            saved.parent.mkdir(parents=True, exist_ok=True)
            if target.exists() or target.is_symlink():
                target.rename(saved)
            else:
                _marker(folder, rel).touch()
            fsync_dir(saved.parent)
        remove(target)  # only after a kill between the two renames: the staged one again
        target.parent.mkdir(parents=True, exist_ok=True)
        staged.rename(target)
        fsync_dir(target.parent)


def roll_back(folder: Path, root: Path, paths: Sequence[str]) -> None:
    """Put back every path the backup holds (and remove those the swap created): the checkout
    as it was before `swap_in`, byte for byte."""
    for rel in reversed(paths):
        target, saved, marker = root / rel, folder / BACKUP / rel, _marker(folder, rel)
        if saved.exists() or saved.is_symlink():
            remove(target)
            saved.rename(target)
            fsync_dir(target.parent)
        elif marker.exists():
            remove(target)
            marker.unlink()


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
    is swapped in unless the result is coherent."""
    folder = rebase_dir(project)
    stage = folder / STAGE
    remove(stage)
    patches = stage / rel(project, project.patches_dir)
    shutil.copytree(project.patches_dir, patches)
    archive_dir = stage / rel(project, project.upstreamed_file.parent)
    parked_dir = stage / rel(project, project.parked_file.parent)
    series = project_series(project)
    old: dict[str, Patch] = {p.key: p for p in (*series.all, *series.parked)}
    active: list[str] = []
    unarchived: list[str] = []
    archived = [p.name for p in series.upstreamed]
    parked = dict(read_series_entries(project.parked_file))
    steps = []
    for step in state.steps:
        patch = old[step.key]
        here = stage / rel(project, patch.path)
        if step.action.committed:
            assert step.commit is not None
            (_, data), *_ = worktree.format_patches(f"{step.commit}^", step.commit)
            if step.section == Section.UPSTREAMED:  # carried again (--keep), by hand or not
                data = with_trailer(data, "")
                here.unlink()
                archived.remove(step.name)
                unarchived.append(step.name)
            else:
                active.append(step.name)
                if versions.older(step.applied_upstream, state.new_pin) or (
                    step.applied_upstream == state.new_pin
                ):
                    # Its trailer says merged by now; the code says needed (a revert, or a
                    # trailer that was wrong): the code decides, the trailer is emptied.
                    data = with_trailer(data, "")
                    step = dataclasses.replace(
                        step,
                        notes=(
                            *step.notes,
                            f"Applied-upstream: {step.applied_upstream} emptied: the bug is"
                            f" still in {state.new_pin}",
                        ),
                    )
            _new_file(patches / step.name, here).write_bytes(data)
            kind, diff = range_diff(patch.raw, data, dict(step.verdict.moved_to))
            step = dataclasses.replace(step, range_diff=kind, diff_of_diffs=diff)
        elif step.action == Action.ARCHIVED and step.section == Section.SERIES:
            _new_file(archive_dir / step.name).write_bytes(
                with_trailer(patch.raw, step.applied_upstream)
            )
            here.unlink()
            archived.append(step.name)
        elif step.action == Action.PARKED and step.section == Section.SERIES:
            parked_dir.mkdir(parents=True, exist_ok=True)
            here.rename(_new_file(parked_dir / step.name))
            parked[step.name] = step.parked_reason.replace("#", "").replace("\n", " ")
        elif step.action == Action.DROPPED:
            here.unlink()
            if step.section == Section.UPSTREAMED:
                archived.remove(step.name)
        steps.append(step)
    state = dataclasses.replace(state, steps=tuple(steps))
    write_series_file(stage / rel(project, project.series_file), unarchived + active)
    write_series_file(stage / rel(project, project.upstreamed_file), archived)
    if parked or project.parked_file.exists():
        write_series_file(stage / rel(project, project.parked_file), list(parked), parked)
    release = state.git is None
    onto = state.onto
    old_pyproject = project.pyproject.read_text("utf-8")
    new_pyproject = set_pin(
        old_pyproject,
        state.new_pin,
        ref=state.ref,
        commit=git_source_commit(onto),
        git_url=state.git if state.git and is_remote_url(state.git) else None,
        requirement=release,
    )
    if release:
        new_pyproject = set_torch_comment(new_pyproject, state.new_pin, _torch(mirror, onto))
    (stage / "pyproject.toml").write_text(new_pyproject, encoding="utf-8")
    images = False
    for ci_file in CI_FILES:
        if (project.root / ci_file).is_file() and release:
            old_text = (project.root / ci_file).read_text("utf-8")
            new_text = set_ci_images(old_text, state.new_pin)
            images = images or new_text != old_text
            _new_file(stage / ci_file).write_text(new_text, encoding="utf-8")
    old_log = (
        (project.root / CHANGELOG).read_text("utf-8")
        if (project.root / CHANGELOG).is_file()
        else ""
    )
    pinned = f"vllm=={state.new_pin}"
    requirement = new_pyproject.count(pinned) > old_pyproject.count(pinned)
    entry = changelog_entry(state, today(), requirement=requirement, images=images)
    new_log = insert_entry(old_log, entry)
    if release:
        sha256 = re.search(r"\bsha256:([0-9a-f]{64})\b", onto.source)
        new_log = set_unreleased_pin(new_log, state.new_pin, sha256.group(1) if sha256 else None)
    (stage / CHANGELOG).write_text(new_log, encoding="utf-8")
    if (project.root / README).is_file() and release:
        (stage / README).write_text(
            set_readme(
                (project.root / README).read_text("utf-8"),
                state.old_pin,
                state.new_pin,
                _readme_rows(project, state),
            ),
            encoding="utf-8",
        )
    (folder / "entry.md").write_text(entry, encoding="utf-8")
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
    moves = [rel for rel in rewritten_paths(project) if (stage / rel).exists()]
    return dataclasses.replace(state, moves=tuple(moves))


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
    PyPI release, or no such pin there)."""
    if not onto.source.startswith("pypi:") or onto.version is None:
        return None
    sdist = mirror.sdists / f"{mirror.package}-{onto.version}.tar.gz"
    member = f"{mirror.package}-{onto.version}/requirements/cuda.txt"
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            handle = tar.extractfile(member)
            data = handle.read() if handle is not None else b""
    except (OSError, KeyError, tarfile.TarError, EOFError):
        return None
    return torch_of(data.decode("utf-8", "replace"))


def _new_file(path: Path, replacing: Path | None = None) -> Path:
    """`path`, refused when a file of another patch is there already."""
    if path.exists() and path != replacing:
        raise BadInput(f"{path.name} exists already in {path.parent.name}/: rename the patch")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
