"""Edit the series as commits: `import` puts it on the pin in `.queue/`, `export` writes the
commits back to `patches/` (like Electron's git-import-patches / git-export-patches)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from vllm_patchset.errors import BadInput, Finding
from vllm_patchset.infra import codec, fsio, jsonfile
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.infra.hashes import sha256_bytes
from vllm_patchset.overlay.upstream import mirror_for, pin_base
from vllm_patchset.series.patches import load_series, parse_patch, read_series_file, series_bytes

QUEUE_DIR = ".queue"
BASE_REF = "refs/vllm-patchset/base"  # in the queue repo: the upstream commit it sits on
# In the queue's git dir: the sha256 of each file of patches/ at import (or the last export),
# so that export overwrites nothing that was edited in patches/ meanwhile.
SNAPSHOT = "vllm-patchset-patches.json"


@dataclass(frozen=True)
class QueueInfo:
    path: Path
    base: str  # the upstream the queue sits on
    patches: tuple[str, ...]


def queue_path(project: Project) -> Path:
    return project.root / QUEUE_DIR


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


def export_queue(project: Project, *, keep: bool = True) -> QueueInfo:
    """Write the queue's commits to `patches/` and `patches/series`. Files whose bytes do not
    change are not rewritten, so an import then export with no edits changes nothing.

    A file of patches/ that changed since the import (or the last export) is not overwritten:
    the export is refused, with nothing written. A file that already holds what this export
    writes is not a change (a rerun after a killed export finishes it)."""
    path = queue_path(project)
    if not _is_queue(path):
        raise BadInput(f"no queue at {path}: run `vllm-patchset queue import` first")
    queue = Repo(path)
    if queue.is_dirty():
        raise Finding(f"{path} has uncommitted changes: commit them (git commit) first")
    exported = queue.format_patches(BASE_REF)
    with fsio.temp_dir("vllm-patchset-export-") as tmp:
        for name, data in exported:  # trailers and paths checked before anything is written
            fsio.write_file(tmp / name, data)
            parse_patch(tmp / name)
    folder = project.patches_dir
    old = read_series_file(project.series_file)
    names = [name for name, _ in exported]
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
