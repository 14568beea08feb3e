"""Edit the series as commits: `import` puts it on the pin in `.queue/`, `export` writes the
commits back to `patches/` (like Electron's git-import-patches / git-export-patches)."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vllm_patchset.config import Project
from vllm_patchset.errors import BadInput, Finding
from vllm_patchset.gitrepo import Repo
from vllm_patchset.overlay import pin_base
from vllm_patchset.series import load_series, parse_patch, read_series_file, write_series_file
from vllm_patchset.upstream import Mirror

QUEUE_DIR = ".queue"
BASE_REF = "refs/vllm-patchset/base"  # in the queue repo: the upstream commit it sits on


@dataclass(frozen=True)
class QueueInfo:
    path: Path
    base: str  # the upstream the queue sits on
    patches: tuple[str, ...]


def queue_path(project: Project) -> Path:
    return project.root / QUEUE_DIR


def import_queue(project: Project, *, force: bool = False) -> QueueInfo:
    """The series as commits on the pin in `.queue/`, a clone that borrows the mirror's
    objects: deleting the folder removes it whole, whatever state it is in."""
    series = load_series(project.series_file, project.upstreamed_file)
    mirror = Mirror(project.cache_dir, project.package, project.index_url)
    upstream = pin_base(project, mirror)
    path = queue_path(project)
    if path.exists():
        if not force:
            raise BadInput(f"{path} exists: export it first, or import again with --force")
        shutil.rmtree(path)
    try:
        queue = mirror.repo.clone_shared(path, upstream.commit)
        queue.run("update-ref", BASE_REF, upstream.commit)
        queue.am([patch.raw for patch in series.active])
    except BadInput:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return QueueInfo(path, upstream.label, tuple(p.name for p in series.active))


def export_queue(project: Project, *, keep: bool = True) -> QueueInfo:
    """Write the queue's commits to `patches/` and `patches/series`. Files whose bytes do not
    change are not rewritten, so an import then export with no edits changes nothing."""
    path = queue_path(project)
    if not (path / ".git").exists():
        raise BadInput(f"no queue at {path}: run `vllm-patchset queue import` first")
    queue = Repo(path)
    if queue.is_dirty():
        raise Finding(f"{path} has uncommitted changes: commit them (git commit) first")
    exported = queue.format_patches(BASE_REF)
    with tempfile.TemporaryDirectory(prefix="vllm-patchset-export-") as tmp:
        for name, data in exported:  # trailers and paths checked before anything is written
            (Path(tmp) / name).write_bytes(data)
            parse_patch(Path(tmp) / name)
    folder = project.patches_dir
    old = read_series_file(project.series_file)
    for name, data in exported:
        target = folder / name
        if not target.exists() or target.read_bytes() != data:
            target.write_bytes(data)
    names = [name for name, _ in exported]
    for name in old:
        if name not in names:
            (folder / name).unlink(missing_ok=True)
    if names != old:
        write_series_file(project.series_file, names)
    if not keep:
        shutil.rmtree(path)
    return QueueInfo(path, project.pin, tuple(names))
