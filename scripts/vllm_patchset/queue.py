"""Edit the series as commits: `import` puts it on the pin in a worktree, `export` writes the
commits back to `patches/` (like Electron's git-import-patches / git-export-patches)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vllm_patchset.config import Project
from vllm_patchset.errors import BadInput, Finding
from vllm_patchset.gitrepo import Repo
from vllm_patchset.series import load_series, parse_patch, read_series_file, write_series_file
from vllm_patchset.upstream import Mirror, Upstream

QUEUE_DIR = ".queue"


@dataclass(frozen=True)
class QueueInfo:
    worktree: Path
    base: str  # the upstream the queue sits on
    patches: tuple[str, ...]


def queue_path(project: Project) -> Path:
    return project.root / QUEUE_DIR


def import_queue(
    project: Project, *, force: bool = False, base: Upstream | None = None
) -> QueueInfo:
    """The series as commits on the pin (or `base`) in the worktree `.queue/`."""
    series = load_series(project.series_file, project.upstreamed_file)
    mirror = Mirror(project.cache_dir, project.package, project.index_url)
    upstream = base or mirror.release(project.pin)
    path = queue_path(project)
    if path.exists():
        if not force:
            raise BadInput(f"{path} exists: export it first, or import again with --force")
        drop_queue(project)
    worktree = mirror.repo.add_worktree(path, upstream.commit)
    try:
        worktree.am([patch.raw for patch in series.active])
    except BadInput:
        drop_queue(project)
        raise
    return QueueInfo(path, upstream.label, tuple(p.name for p in series.active))


def open_queue(project: Project) -> tuple[Repo, str]:
    path = queue_path(project)
    if not (path / ".git").exists():
        raise BadInput(f"no queue at {path}: run `vllm-patchset queue import` first")
    worktree = Repo(path)
    base = worktree.run("merge-base", "HEAD", f"refs/tags/v{project.pin}").strip()
    return worktree, base


def export_queue(project: Project, *, keep: bool = True) -> QueueInfo:
    """Write the queue's commits to `patches/` and `patches/series`; unchanged files keep
    their bytes, so an import then export with no edits changes nothing."""
    worktree, base = open_queue(project)
    if worktree.is_dirty():
        raise Finding(f"{worktree.path} has uncommitted changes: commit them (git commit) first")
    exported = worktree.format_patches(base)
    folder = project.patches_dir
    old = read_series_file(project.series_file)
    for name, data in exported:
        target = folder / name
        if not target.exists() or target.read_bytes() != data:
            target.write_bytes(data)
        parse_patch(target)  # trailers and paths must still be right
    names = [name for name, _ in exported]
    for name in old:
        if name not in names:
            (folder / name).unlink(missing_ok=True)
    if names != old:
        write_series_file(project.series_file, names)
    if not keep:
        drop_queue(project)
    return QueueInfo(worktree.path, project.pin, tuple(names))


def drop_queue(project: Project) -> None:
    mirror = Mirror(project.cache_dir, project.package, project.index_url)
    mirror.repo.remove_worktree(queue_path(project))
