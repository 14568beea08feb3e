"""Edit the series as commits: `import` puts it on the pin in `.queue/`, `export` writes the
commits back to `patches/` (like Electron's git-import-patches / git-export-patches), and
`patch new` starts a patch there as a template commit whose trailers say what each needs.

`export` reads every commit before it writes anything: the problems of every commit (missing
or empty trailers, a version or a pull request that is not one, a regression test that does
not exist, a change outside the package, no change at all) come back at once, each commit
named by its short id and subject with the git command that fixes it; then nothing is
written."""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from vllm_patchset.console import fit
from vllm_patchset.errors import BadInput, Finding, GitError, MalformedPatch
from vllm_patchset.infra import codec, fsio, jsonfile
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.gitrepo import BOT_EMAIL, BOT_NAME, Repo
from vllm_patchset.infra.hashes import sha256_bytes
from vllm_patchset.overlay.upstream import mirror_for, pin_base
from vllm_patchset.series.patches import (
    REQUIRED_TRAILERS,
    Patch,
    Trailers,
    load_series,
    parse_patch_bytes,
    read_series_file,
    series_bytes,
)
from vllm_patchset.sync.checks import trailer_problems

QUEUE_DIR = ".queue"
BASE_REF = "refs/vllm-patchset/base"  # in the queue repo: the upstream commit it sits on
# In the queue's git dir: the sha256 of each file of patches/ at import (or the last export),
# so that export overwrites nothing that was edited in patches/ meanwhile.
SNAPSHOT = "vllm-patchset-patches.json"


# What each trailer needs: the comment line above it in a template (`patch new`, `backport`)
# and the words of a problem where it is missing or empty.
NEEDS = {
    "Upstream-PR": "the upstream pull request with the fix"
    " (https://github.com/vllm-project/vllm/pull/N), or `none (why)`",
    "Introduced-by": "the upstream pull request that brought the bug in (its URL), or `none (why)`",
    "Introduced-in": "the first release with the bug (e.g. 0.24.0), or `nightly`",
    "Applied-upstream": "the first release with the fix; empty while no release has it",
    "Regression-test": "the test that fails on the pin and passes with the fix"
    " (tests/gpu/<file>.py::<test>; write it)",
}
# The trailers a finished patch cannot leave empty.
NOT_EMPTY = ("Upstream-PR", "Introduced-by", "Introduced-in", "Regression-test")


@dataclass(frozen=True)
class CommitProblems:
    """Everything wrong with one commit of the queue, and the command that fixes it."""

    commit: str  # short id
    subject: str
    patch: str  # the file name export writes it to
    problems: tuple[str, ...]
    fix: str


@dataclass(frozen=True)
class QueueInfo:
    path: Path
    base: str  # the upstream the queue sits on
    patches: tuple[str, ...]
    problems: tuple[CommitProblems, ...] = ()  # export: nothing was written where any


def queue_path(project: Project) -> Path:
    return project.root / QUEUE_DIR


def shown(path: Path) -> str:
    """`path` as a command to copy names it: relative to the current directory where it is
    inside it (`.queue` from the checkout's root), else as it is."""
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except (ValueError, OSError):
        return str(path)


def _is_queue(path: Path) -> bool:
    """Was `path` made by `queue import`? (its repository has the base ref)"""
    return (path / ".git").is_dir() and Repo(path).resolve(BASE_REF) is not None


def _patch_files(project: Project) -> dict[str, str]:
    """name -> sha256 of the series file and every patch in patches/ (what export may touch)."""
    folder = project.patches_dir
    names = [project.series_file.name, *(p.name for p in folder.glob("*.patch"))]
    found = {}
    for name in sorted(set(names)):
        data = fsio.read_regular(folder / name)
        if data is not None:
            found[name] = sha256_bytes(data)
    return found


def _save_snapshot(queue: Repo, project: Project) -> None:
    text = json.dumps(_patch_files(project), indent=2, sort_keys=True) + "\n"
    fsio.atomic_write(queue.git_path(SNAPSHOT), text.encode())


def import_queue(project: Project, *, force: bool = False) -> QueueInfo:
    """The series as commits on the pin in `.queue/`, a clone that borrows the mirror's
    objects: deleting the folder removes it whole, whatever state it is in. It is built in a
    staging dir and renamed in, so an interrupted import leaves no half-made queue."""
    series = load_series(project.series_file, project.upstreamed_file)
    mirror = mirror_for(project)
    upstream = pin_base(project, mirror)
    path = queue_path(project)
    if os.path.lexists(path):
        if not force:
            raise BadInput(f"{path} exists: export it first, or import again with --force")
        if path.is_symlink() or not _is_queue(path):
            raise fsio.NotOwned(
                f"{path} was not made by `vllm-patchset queue import` (no {BASE_REF} in it):"
                " move it away; nothing was changed"
            )
    with fsio.staging_dir(project.root, "queue") as staging:
        queue = mirror.repo.clone_shared(staging / QUEUE_DIR, upstream.commit)
        queue.run("update-ref", BASE_REF, upstream.commit)
        queue.am([patch.raw for patch in series.active])
        _save_snapshot(queue, project)
        with fsio.deferred_signals():
            fsio.remove_tree(path)
            fsio.move(staging / QUEUE_DIR, path)
            fsio.interrupt_leaves(f"the queue in {path} had been made (the run was complete)")
    return QueueInfo(path, upstream.label, tuple(p.name for p in series.active))


def open_queue(project: Project) -> Repo:
    """The queue `queue import` made, with no `git am` or rebase stopped in it."""
    path = queue_path(project)
    if not _is_queue(path):
        raise BadInput(f"no queue at {path}: run `vllm-patchset queue import` first")
    queue = Repo(path)
    for state, finish in (("rebase-apply", "am"), ("rebase-merge", "rebase")):
        if queue.git_path(state).is_dir():
            raise Finding(
                f"a `git {finish}` is stopped in {path}: finish it (git -C {path} {finish}"
                f" --continue) or give it up (git -C {path} {finish} --abort) first"
            )
    return queue


def export_queue(
    project: Project, *, keep: bool = True, unfinished: Collection[str] = ()
) -> QueueInfo:
    """Write the queue's commits to `patches/` and `patches/series`. Files whose bytes do not
    change are not rewritten, so an import then export with no edits changes nothing.

    Every commit is checked first (`commit_problems`); where any has a problem, the returned
    info lists them all and nothing is written. `unfinished`: commits (full ids) whose empty
    trailers are left for the maintainer (a backport just taken: `check` and the overlay
    refuse the patch until they are filled).

    A file of patches/ that changed since the import (or the last export) is not overwritten:
    the export is refused, with nothing written. A file that already holds what this export
    writes is not a change (a rerun after a killed export finishes it)."""
    path = queue_path(project)
    queue = open_queue(project)
    if queue.is_dirty():
        raise Finding(f"{path} has uncommitted changes: commit them (git commit) first")
    exported = queue.format_patches(BASE_REF)
    found = queue_problems(project, queue, exported, unfinished)
    names = [name for name, _ in exported]
    if found:
        return QueueInfo(path, project.pin, tuple(names), found)
    folder = project.patches_dir
    old = read_series_file(project.series_file)
    writes = dict(exported)
    if names != old:
        writes[project.series_file.name] = series_bytes(names)
    removes = [name for name in old if name not in names]
    _refuse_overwriting_edits(queue, project, writes, removes)
    with fsio.deferred_signals():  # every file, or (but for a kill) none
        for name, data in writes.items():
            if fsio.read_regular(folder / name) != data:
                fsio.atomic_write(folder / name, data)
        for name in removes:
            fsio.remove_file(folder / name)
        _save_snapshot(queue, project)
        fsio.interrupt_leaves("the queue had been exported to patches/ (the run was complete)")
    if not keep:
        fsio.remove_tree(path)
    return QueueInfo(path, project.pin, tuple(names))


def _refuse_overwriting_edits(
    queue: Repo, project: Project, writes: dict[str, bytes], removes: list[str]
) -> None:
    snapshot_path = queue.git_path(SNAPSHOT)
    text = fsio.read_regular(snapshot_path)
    now = _patch_files(project)
    if text is None:  # a queue made before snapshots: patches/ must be as git has it
        rel = project.patches_dir.relative_to(project.root).as_posix()
        changed = Repo(project.root).changed_paths(rel)
        if changed:
            raise Finding(
                f"{project.patches_dir} has uncommitted changes ({changed[0].strip()}): commit"
                " or stash them, then export; nothing was written"
            )
        return
    try:
        then = codec.from_doc(dict[str, str], jsonfile.parse(text))
    except ValueError as exc:
        raise BadInput(f"{snapshot_path}: unreadable ({exc}): import again") from None
    for name in sorted({*writes, *removes}):
        new = sha256_bytes(writes[name]) if name in writes else None
        if now.get(name) not in (then.get(name), new):
            raise Finding(
                f"{project.patches_dir / name} changed since `queue import` (an edit not in the"
                " queue): export would overwrite it; nothing was written. Take the change into"
                " the queue (or move it away), then export again"
            )


# -- every problem of every commit ---------------------------------------------------------------
def queue_problems(
    project: Project,
    queue: Repo,
    exported: list[tuple[str, bytes]],
    unfinished: Collection[str] = (),
) -> tuple[CommitProblems, ...]:
    """The commits of the queue that have a problem, in order (`exported`: format-patch's
    files of base..HEAD, one a commit, an empty one for a commit that changes nothing)."""
    log = queue.run("log", "--reverse", "--no-merges", "--format=%H %s", f"{BASE_REF}..HEAD")
    commits = [line.split(" ", 1) for line in log.splitlines() if line]
    head = queue.head()
    found = []
    for (commit, *subject), (name, data) in zip(commits, exported, strict=True):
        message = queue.commit_message(commit)
        paths = queue.run("diff-tree", "--no-commit-id", "--name-only", "-r", "-z", commit)
        problems = commit_problems(
            project, name, data, message, [p for p in paths.split("\0") if p], commit in unfinished
        )
        if problems:
            short = commit[:12]
            where = shown(queue.path)
            fix = (
                f"git -C {where} commit --amend"
                if commit == head
                else f"git -C {where} rebase -i {short}^ (mark it `edit`, or `reword`)"
            )
            found.append(CommitProblems(short, "".join(subject), name, tuple(problems), fix))
    return tuple(found)


def left_for_maintainer(queue: Repo) -> set[str]:
    """The commits of the queue whose message still has a template's comment line above a
    trailer (`# Regression-test: …`): taken by `backport` and not edited since."""
    commits = queue.run("rev-list", f"{BASE_REF}..HEAD").split()
    marks = tuple(f"\n# {key}: " for key in REQUIRED_TRAILERS)
    return {c for c in commits if any(m in "\n" + queue.commit_message(c) for m in marks)}


def message_trailers(message: str) -> dict[str, list[str]]:
    """The series' trailers in a commit message (as `series.patches` reads them: `Key: value`
    lines; `#` comment lines are no trailers)."""
    found: dict[str, list[str]] = {}
    for line in message.strip().split("\n"):
        key, sep, value = line.partition(":")
        if sep and key in REQUIRED_TRAILERS:
            found.setdefault(key, []).append(value.strip())
    return found


def commit_problems(
    project: Project,
    name: str,
    data: bytes,
    message: str,
    paths: list[str],
    unfinished: bool = False,
) -> list[str]:
    """Every problem of one commit: its change (none, or outside the package), each trailer
    missing or empty, then `check`'s rules on those given (versions, the pull request, the
    regression test in tests/), then the patch file as `series.patches` parses it."""
    out = change_problems(project, data, paths)
    trailers = message_trailers(message)
    said, missing = said_trailers(trailers, unfinished=unfinished)
    out += missing
    patch = Patch(
        name=name,
        key=name,
        path=Path(name),
        subject="",
        trailers=Trailers(
            upstream_pr=said.get("Upstream-PR", "none (not said)"),
            introduced_by=said.get("Introduced-by", ""),
            introduced_in=said.get("Introduced-in", "nightly"),
            applied_upstream=said.get("Applied-upstream", ""),
            regression_tests=tuple(
                t for value in trailers.get("Regression-test", []) for t in value.split()
            ),
        ),
        files=(),
        raw=data or message.encode("utf-8", "surrogateescape"),
    )
    for problem in trailer_problems(project, patch, archived=False):
        words = problem.split(": ", 1)[1]
        if words.split(":", 1)[0] in said:
            out.append(words)
    if not out and data and not unfinished:
        try:
            parse_patch_bytes(data, Path(name))
        except MalformedPatch as exc:
            out.append(str(exc).removeprefix(f"malformed patch {name}: "))
    return out


def change_problems(project: Project, data: bytes, paths: list[str]) -> list[str]:
    """A commit's change: there is one, and it stays inside the package."""
    out = []
    if not data:
        out.append("no change: make the fix in the queue's files, then `git commit -a --amend`")
    for path in paths:
        if PurePosixPath(path).parts[:1] != (project.package,):
            out.append(f"changes {path}, outside the {project.package}/ package (take it out)")
    return out


def said_trailers(
    trailers: dict[str, list[str]], *, unfinished: bool
) -> tuple[dict[str, str], list[str]]:
    """The trailers a message gives a value (the first of each), and a problem for each one
    missing, or empty where a finished patch needs it (`unfinished`: a template's, allowed)."""
    said, out = {}, []
    for key in REQUIRED_TRAILERS:
        value = trailers.get(key, [None])[0]
        if value is None:
            out.append(f"{key}: missing ({NEEDS[key]})")
        elif not value and key in NOT_EMPTY and not unfinished:
            out.append(f"{key}: empty ({NEEDS[key]})")
        elif value or key not in NOT_EMPTY:
            said[key] = value
    return said, out


def problems_text(path: Path, problems: tuple[CommitProblems, ...], commits: int) -> str:
    """The report of an export that found problems: each commit, its problems, its fix (the
    lines fitted to the terminal, but for the commands to copy)."""
    lines = []
    for found in problems:
        lines.append(fit(f"{found.commit} {found.subject} ({found.patch}):"))
        lines += [fit(f"  - {problem}") for problem in found.problems]
        lines.append(f"  fix: {found.fix}")
    count = sum(len(found.problems) for found in problems)
    lines.append(
        fit(
            f"queue export: {count} problem(s) in {len(problems)} of {commits} commit(s) of"
            f" {shown(path)}; nothing was written"
        )
    )
    return "\n".join(lines)


def problems_body(problems: tuple[CommitProblems, ...]) -> list[dict[str, object]]:
    return [codec.to_doc(found) for found in problems]


# -- a new patch -----------------------------------------------------------------------------
def trailer_lines(values: Mapping[str, str], why: Mapping[str, str] | None = None) -> list[str]:
    """The series' trailers, those of `values` filled, each other one empty after a `#` line
    saying what it needs (and, from `why`, why it is left; `git commit --amend` in an editor
    drops the `#` lines)."""
    lines = []
    for key in REQUIRED_TRAILERS:
        value = values.get(key, "")
        if not value:
            left = f" ({why[key]})" if why and key in why else ""
            lines.append(f"# {key}: {NEEDS[key]}{left}")
        lines.append(f"{key}: {value}".rstrip())
    return lines


def new_patch(project: Project, subject: str) -> tuple[QueueInfo | None, str]:
    """A template commit on top of the queue (imported first where there is none): (the
    import made, or None; the commit's full id). What is staged in the queue goes in it."""
    if not subject.strip() or "\n" in subject:
        raise BadInput(f"a patch's name is one line of words (its subject), not {subject!r}")
    imported = None if _is_queue(queue_path(project)) else import_queue(project)
    queue = open_queue(project)
    lines = [
        subject.strip(),
        "",
        "# Why: what goes wrong without this fix, and how it shows (the lines below say what"
        " each trailer needs; an editor drops the # lines)",
        *trailer_lines({}),
    ]
    message = "\n".join(lines) + "\n"
    queue.run(
        "commit", "--quiet", "--allow-empty", "--cleanup=verbatim", "-F", "-",
        stdin=message.encode(), env=_identity(queue),
    )  # fmt: skip
    return imported, queue.head()


def _identity(queue: Repo) -> dict[str, str]:
    """The committer is the tool (as `queue import`'s); the author is the user where git knows
    one, else the tool too."""
    env = {"GIT_COMMITTER_NAME": BOT_NAME, "GIT_COMMITTER_EMAIL": BOT_EMAIL}
    try:
        queue.run("var", "GIT_AUTHOR_IDENT")
    except GitError:
        env |= {"GIT_AUTHOR_NAME": BOT_NAME, "GIT_AUTHOR_EMAIL": BOT_EMAIL}
    return env
