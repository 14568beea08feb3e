"""Walk the series over an upstream tree, and build the overlay and its lock from the result.

The walk classifies each patch (the upstreamed archive first, then the series) on the tree with
the earlier applicable patches applied, and applies the ones that apply. The overlay is the set
of files that the applied patches touch, patched, at vLLM's own paths.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vllm_patchset.errors import BadInput, LockMismatch, PatchDoesNotApply
from vllm_patchset.infra import codec, fsio
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.hashes import sha256_bytes
from vllm_patchset.overlay.lock import Lock, LockEntry, compare_locks
from vllm_patchset.overlay.upstream import (
    Mirror,
    Upstream,
    is_pin,
    mirror_for,
    pin_base,
    resolve_base,
)
from vllm_patchset.series.classify import classify
from vllm_patchset.series.patches import Patch, load_series, parse_patch_bytes
from vllm_patchset.series.verdict import WHOLE_HEADERS, Reason, State, Verdict

TREE_INFO = "vllm-patchset-tree.json"
SYMLINK = "120000"  # git's mode of a symlink: a blob whose bytes are the target
LINK_HOPS = 8  # the most links followed from one path: more is taken for a loop


def links_of(mirror: Mirror, upstream: Upstream) -> dict[str, str]:
    """Each symlink of `upstream`'s tree -> the file of the package it leads to (through at
    most LINK_HOPS links). The walk reads a patch's file through its link (the patch is
    placed on the file the link leads to: `moved`); `tree` and `overlay build` write the link
    as a regular file with that file's text. A link that leads out of the package, an
    absolute link, a link to no file of the tree (a folder, nothing) and a loop are refused,
    one line naming the link."""
    repo, package = mirror.repo, mirror.package
    blobs = repo.blobs(repo.tree_of(upstream.commit))
    found = {}
    for path in sorted(p for p, (mode, _) in blobs.items() if mode == SYMLINK):
        where, hops = path, 0
        while blobs[where][0] == SYMLINK:
            if hops == LINK_HOPS:
                raise BadInput(
                    f"{upstream.label} holds {path!r}, a symbolic link in a loop (over"
                    f" {LINK_HOPS} links): refused"
                )
            hops += 1
            raw = repo.read_object(blobs[where][1]).decode("utf-8", "surrogateescape")
            where = posixpath.normpath(posixpath.join(posixpath.dirname(where), raw))
            why = (
                "an absolute path"
                if raw.startswith("/")
                else f"outside {package}/"
                if not where.startswith(f"{package}/")
                else f"no file of {upstream.label}"
                if where not in blobs
                else None
            )
            if why is not None:
                raise BadInput(
                    f"{upstream.label} holds {path!r}, a symbolic link to {raw!r}, {why}: refused"
                )
        found[path] = where
    return found


def followed(mirror: Mirror, tree: str, links: Mapping[str, str]) -> str:
    """`tree` with each link of `links` made a regular file: the bytes and mode of the file it
    leads to in `tree` (patched, in a patched tree)."""
    if not links:
        return tree
    blobs = mirror.repo.blobs(tree)
    gone = [link for link, target in sorted(links.items()) if target not in blobs]
    if gone:
        raise BadInput(
            f"{gone[0]} is a symbolic link to {links[gone[0]]}, which the patches delete: refused"
        )
    return mirror.repo.with_blobs(tree, {link: blobs[target] for link, target in links.items()})


@dataclass(frozen=True)
class TreeInfo:
    """`vllm-patchset-tree.json` beside a tree's package (`overlay tree`, and validate's trees):
    what the tree is; tests/gpu/conftest.py reads it."""

    version: str
    label: str
    source: str
    kind: str  # "pristine", "overlay", or validate's "nightly-like" and "nightly-like+fix"
    patches: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps(codec.to_doc(self), indent=2) + "\n"


@dataclass(frozen=True)
class Walk:
    upstream: Upstream
    verdicts: tuple[Verdict, ...]
    applied: tuple[Patch, ...]  # as they applied to this tree (moved or refreshed: placed)
    tree: str  # the patched tree


def walk(
    mirror: Mirror,
    upstream: Upstream,
    patches: tuple[Patch, ...],
    *,
    on_pin: frozenset[str] | None = None,
) -> Walk:
    """`on_pin`: the keys of the patches that apply on the pin, where the caller knows them
    (a base with no release version is then classified against the pin, as the rebase
    does: code that was there and is gone is `rewritten`, not `not-found`)."""
    repo = mirror.repo
    tree = repo.tree_of(upstream.commit)
    verdicts: list[Verdict] = []
    applied: list[Patch] = []
    for patch in patches:
        was_applied = None if on_pin is None else patch.key in on_pin
        verdict = classify(
            repo,
            tree,
            patch,
            base=upstream.label,
            version=upstream.version,
            was_applied=was_applied,
        )
        verdicts.append(verdict)
        if verdict.state == State.APPLIES:
            placed = verdict.placed
            if placed is not None:  # moved, or refreshed by token match: as it applies here
                patch = parse_patch_bytes(placed, patch.path, patch.key)
            tree = repo.apply_to_tree(tree, patch.raw)
            applied.append(patch)
    return Walk(upstream, tuple(verdicts), tuple(applied), tree)


def walk_project(
    project: Project, mirror: Mirror, upstream: Upstream, patches: tuple[Patch, ...]
) -> Walk:
    """The walk on `upstream` for a report (`matrix`); one with no release version against the
    pin (`walk`), as the rebase classifies it. (`overlay build` and `tree` take a base as it
    is: a patch they cannot place there is left out with `--skip`.)"""
    if upstream.version is not None or is_pin(project, upstream):
        return walk(mirror, upstream, patches)
    pinned = walk(mirror, pin_base(project, mirror), patches)
    return walk(mirror, upstream, patches, on_pin=frozenset(p.key for p in pinned.applied))


def require_no_conflict(result: Walk) -> None:
    for verdict in result.verdicts:
        archived = "/" in verdict.patch  # a key under patches/upstreamed/ (series keys: names)
        if archived and not verdict.bug_present:
            continue  # fixed upstream in other words: nothing to apply, nothing lost
        if verdict.state == State.CONFLICT:
            hunk = next(
                (h for h in verdict.hunks if h.applies_at is None and not h.result_present), None
            )
            if hunk is None or hunk.header in WHOLE_HEADERS.values():  # a whole file's
                what = verdict.warnings[0]
            else:
                where = (
                    f"differs at line {hunk.found_at}"
                    if verdict.reason == Reason.CONFLICT
                    else f"is not there ({verdict.reason.value})"
                )
                what = f"hunk {hunk.number} ({hunk.file} {hunk.header}) {where}"
            raise PatchDoesNotApply(
                verdict.patch,
                result.upstream.label,
                f"{what} (leave it out with --skip {verdict.patch})",
            )


def overlay_trees(mirror: Mirror, result: Walk) -> tuple[str, str, dict[str, str]]:
    """The pristine and the patched tree of `result` with their symlinks followed
    (`followed`), and the links (`links_of`)."""
    links = links_of(mirror, result.upstream)
    pristine = followed(mirror, mirror.repo.tree_of(result.upstream.commit), links)
    return pristine, followed(mirror, result.tree, links), links


def lock_for(mirror: Mirror, result: Walk, package: str) -> Lock:
    base, tree, links = overlay_trees(mirror, result)
    touched: dict[str, list[str]] = {}
    for patch in result.applied:
        for path in patch.paths:
            touched.setdefault(path, []).append(patch.key)
    for link, target in links.items():  # the installed package has the link as a file
        if target in touched and link not in touched:
            touched[link] = list(touched[target])
    entries = []
    for path, keys in sorted(touched.items()):
        pristine = mirror.repo.read_blob(base, path)
        patched = mirror.repo.read_blob(tree, path)
        if pristine is None and patched is None:
            continue  # added by one patch, deleted by a later one: nothing to deploy
        folder = path.rsplit("/", 1)[0]
        if pristine is None and mirror.repo.subtree(base, folder) is None:
            raise BadInput(
                f"{path}: {keys[0]} adds a file in a folder {result.upstream.label} does not"
                f" have ({folder}/): a patch adds files only in the package's own folders"
            )
        entries.append(
            LockEntry(
                path,
                None if pristine is None else sha256_bytes(pristine),
                None if patched is None else sha256_bytes(patched),
                tuple(keys),
            )
        )
    return Lock(
        package=package,
        version=result.upstream.version or result.upstream.label,
        source=result.upstream.source,
        upstream_commit=result.upstream.commit,
        patches=tuple(p.key for p in result.applied),
        entries=tuple(entries),
    )


def patches_for(project: Project) -> tuple[Patch, ...]:
    """The upstreamed archive first (older fixes), then the series."""
    series = load_series(project.series_file, project.upstreamed_file)
    return series.upstreamed + series.active


def without(patches: tuple[Patch, ...], skip: tuple[str, ...]) -> tuple[Patch, ...]:
    known = {p.key for p in patches} | {p.name for p in patches}
    unknown = [name for name in skip if name not in known]
    if unknown:
        raise BadInput(f"--skip {unknown[0]}: no such patch in the series or the archive")
    return tuple(p for p in patches if p.key not in skip and p.name not in skip)


def build_overlay(
    project: Project,
    *,
    update_lock: bool = False,
    base: Upstream | None = None,
    out_dir: Path | None = None,
    skip: tuple[str, ...] = (),
) -> tuple[Lock, Path]:
    """Regenerate the overlay from pristine upstream + patches and check it against the lock.

    For the pin, the series must apply cleanly and the result must match the committed lock
    (or rewrite it with `update_lock`). For another base, the overlay and a lock of its own go
    to `out_dir`; the committed lock is not touched. `skip` leaves patches (by file name or
    path under patches/) out of the walk, e.g. one that conflicts with an older base.
    """
    mirror = mirror_for(project)
    upstream = base or resolve_base(project, mirror)
    links_of(mirror, upstream)  # a link that leads out is refused before the walk reads it
    pinned = is_pin(project, upstream)
    result = walk(mirror, upstream, without(patches_for(project), skip))
    require_no_conflict(result)
    lock = lock_for(mirror, result, project.package)
    target = out_dir or (
        project.overlay_dir
        if pinned
        else project.root / "build" / f"overlay-{upstream.tag.replace('/', '-')}"
    )
    # The project's overlay dir is the tool's by configuration (overlay/vllm is generated);
    # any other output dir must be new, empty, or one it made before (its marker says so).
    owned = target.resolve() == project.overlay_dir.resolve()
    lock_path = project.lock_path if owned else target / "overlay.lock.json"
    if not owned:
        fsio.claim_dir(target, "the output dir", mark=False)
    if pinned and owned and not update_lock:
        committed = Lock.load(project.lock_path)
        difference = compare_locks(lock, committed)
        if difference:
            raise LockMismatch(
                f"overlay does not match {project.lock_path.name}: {difference}"
                " (rebuild with --update-lock if the change is intended)"
            )
    if not owned:
        fsio.claim_dir(target, "the output dir")
    patched_tree = overlay_trees(mirror, result)[1]
    with fsio.staging_dir(target, "overlay") as staging:
        for entry in lock.entries:
            data = mirror.repo.read_blob(patched_tree, entry.path)
            if data is not None:  # a deleted file: in the lock only
                fsio.atomic_write(staging.joinpath(*entry.path.split("/")), data)
        fsio.make_dir(staging / project.package, exist_ok=True)
        with fsio.deferred_signals():  # the overlay and its lock change together, or neither
            fsio.replace_dir(staging / project.package, target / project.package)
            if update_lock or lock_path != project.lock_path:
                fsio.atomic_write(lock_path, lock.to_json().encode())
            fsio.interrupt_leaves(
                f"the overlay in {target} had been written (the run was complete)"
            )
    return lock, target


def export_tree(project: Project, base: Upstream | None, dest: Path, *, pristine: bool) -> Path:
    """Write a full `vllm/` tree (pristine, or with every applicable patch) under `dest`."""
    mirror = mirror_for(project)
    upstream = base or resolve_base(project, mirror)
    links_of(mirror, upstream)  # a link that leads out is refused before the walk reads it
    if pristine:
        tree = followed(mirror, mirror.repo.tree_of(upstream.commit), links_of(mirror, upstream))
        applied = tuple[str, ...]()
    else:
        result = walk(mirror, upstream, patches_for(project))
        require_no_conflict(result)
        tree, applied = overlay_trees(mirror, result)[1], tuple(p.key for p in result.applied)
    exists = os.path.lexists(dest)
    if exists and (dest.is_symlink() or not dest.is_dir()):
        what = "a symlink" if dest.is_symlink() else "a file"
        raise BadInput(f"{dest} is {what}, not a directory: give a new or empty directory")
    for name in (project.package, TREE_INFO):  # written new, never over anything
        if os.path.lexists(dest / name):
            raise BadInput(f"{dest / name} exists already: give an empty destination")
    info = TreeInfo(
        version=upstream.version or upstream.label,
        label=upstream.label,
        source=upstream.source,
        kind="pristine" if pristine else "overlay",
        patches=tuple(applied),
    )
    # Staged beside, then renamed in: an interrupted run leaves no half-written tree.
    with fsio.staging_dir(dest if exists else dest.parent, "tree") as staging:
        mirror.repo.archive_to(tree, staging)
        fsio.atomic_write(staging / TREE_INFO, info.to_json().encode())
        with fsio.deferred_signals():
            if exists:
                for name in (project.package, TREE_INFO):
                    fsio.move(staging / name, dest / name)
            else:
                fsio.move(staging, dest)
            fsio.interrupt_leaves(f"the tree in {dest} had been written (the run was complete)")
    return dest
