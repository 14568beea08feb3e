"""`vllm-patchset cache`: what the cache holds (per release and kind), how big, and a prune.

The cache (`--cache-dir`, `$VLLM_PATCHSET_CACHE`, else `$XDG_CACHE_HOME/vllm-patchset`) holds
`sdists/` (PyPI sdists, each imported into the mirror once), `wheels/` (the pin's wheel for the
kit, and what else the kit downloads), and `mirror.git` (every upstream tree, deduplicated by
git). Anything else there is not the tool's, and is listed as `other`, never removed.

`cache prune` removes what can be had again at no cost or is not the pin's:
- an sdist whose release is in the mirror (the mirror's tree is what every command reads;
  the sdist is only read once, to import it), except the pin's;
- a wheel of a release other than the pin (the kit only uses the pin's);
- the mirror's unreachable objects (`git gc --prune=now`): every tag is kept, and the commit the
  checkout's lock was built from is kept by a ref of its own first.
`--dry-run` lists what would go and removes nothing.

Only the cache's own is touched: `list` holds the cache's lock shared and `prune` exclusive
(`cachelocks.cache_exclusive`: a fetch, build or matrix running meanwhile finishes first, or
waits), nothing in it is followed through a symlink (a `mirror.git`, `sdists` or `wheels` that
is a link is listed as `other`, and `prune` refuses a linked `mirror.git`: it would gc a
repository that is not the cache's), and a file is removed only when it is a regular file
named as the tool names its downloads.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from vllm_patchset import versions
from vllm_patchset.console import table
from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.overlay import cachelocks
from vllm_patchset.overlay.lock import Lock

LOCK_REF = "refs/vllm-patchset/lock"  # keeps the lock's upstream commit through a gc
_SDIST = re.compile(r"vllm-(?P<version>[^/]+)\.tar\.gz")
_WHEEL = re.compile(r"vllm-(?P<version>[^-]+)-[^/]+\.whl")


@dataclass(frozen=True)
class Item:
    """One thing in the cache."""

    release: str  # "0.24.0", "mirror", or "other"
    kind: str  # "sdist", "wheel", "git", "other"
    path: str  # relative to the cache dir
    size: int  # bytes on disk (a folder's files summed)
    pin: bool = False
    prunable: bool = False
    detail: str = ""  # the mirror's tag count


def size_of(path: Path) -> int:
    """The bytes of a file, or of the files under a folder (links not followed)."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        return info.st_size
    total = 0
    for folder, _, names in os.walk(path):
        total += sum(os.lstat(os.path.join(folder, name)).st_size for name in names)
    return total


def human(size: int) -> str:
    """Bytes in decimal units, as du -h --si and pip's cache command write them."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def _is_mirror(path: Path) -> bool:
    """Whether `path` is the cache's own mirror: a real folder (not a link) with a HEAD."""
    return path.is_dir() and not path.is_symlink() and fsio.is_regular(path / "HEAD")


def _mirror_releases(cache: Path) -> set[str]:
    """The releases whose tree the mirror holds (its `v<version>` tags)."""
    if not _is_mirror(cache / "mirror.git"):
        return set()
    return {tag[1:] for tag in Repo(cache / "mirror.git").tags("v*")}


def inventory(cache: Path, pin: str | None) -> list[Item]:
    """Every item in the cache, sdists and wheels by release, the mirror, then the rest."""
    if not cache.is_dir():
        return []
    imported = _mirror_releases(cache)
    items: list[Item] = []
    others: list[Item] = []
    for entry in sorted(cache.iterdir()):
        if entry.name in (cachelocks.CACHE_LOCK, cachelocks.IMPORT_LOCK):
            continue  # the cache's locks
        if entry.name in ("sdists", "wheels") and entry.is_dir() and not entry.is_symlink():
            for file in sorted(entry.iterdir()):
                items.append(_item(cache, file, pin, imported))
        elif entry.name == "mirror.git" and _is_mirror(entry):
            trees = len(Repo(entry).tags("*"))  # one tag a tree: a release, a git ref, an install
            detail = f"{trees} tags"
            items.append(Item("mirror", "git", entry.name, size_of(entry), detail=detail))
        else:
            others.append(Item("other", "other", entry.name, size_of(entry)))
    return sorted(items, key=_order) + others


def _item(cache: Path, file: Path, pin: str | None, imported: set[str]) -> Item:
    rel = str(file.relative_to(cache))
    pattern = _SDIST if file.parent.name == "sdists" else _WHEEL
    found = pattern.fullmatch(file.name) if fsio.is_regular(file) else None
    if found is None:  # the kit's other wheels (wheels/tool-deps/), a partial download
        return Item("other", "other", rel, size_of(file))
    version = found["version"]
    kind = "sdist" if pattern is _SDIST else "wheel"
    is_pin = version == pin
    prunable = not is_pin and (kind == "wheel" or version in imported)
    return Item(version, kind, rel, size_of(file), is_pin, prunable and pin is not None)


def _order(item: Item) -> tuple[int, bool, Version, str]:
    """Releases in PEP 440 order (0.9 < 0.10), the sdist before the wheels; the mirror last."""
    parsed = versions.parse(item.release)
    group = {"sdist": 0, "wheel": 0, "git": 1}.get(item.kind, 2)
    return group, parsed is None, parsed or Version("0"), item.path


def _table(cache: Path, items: list[Item], title: str) -> str:
    total = sum(i.size for i in items)
    lines = [f"{title}: {cache} ({len(items)} items, {human(total)})"]
    rows = []
    for i in items:
        note = " (pin)" if i.pin else " (prunable)" if i.prunable else ""
        note = f" ({i.detail})" if i.detail else note
        cells = ("", i.release, i.kind, human(i.size), f"{i.path}{note}")
        rows.append([(cell, "") for cell in cells])
    if rows:
        lines.append(table(None, rows, right=(3,)))
    return "\n".join(lines)


def _json(items: list[Item]) -> list[dict[str, object]]:
    return [
        {
            "release": i.release,
            "kind": i.kind,
            "path": i.path,
            "size": i.size,
            "pin": i.pin,
            "prunable": i.prunable,
            **({"detail": i.detail} if i.detail else {}),
        }
        for i in items
    ]


def listing(cache: Path, pin: str | None) -> tuple[str, dict[str, object]]:
    """`cache list`'s report (text, JSON body) of `cache`, read under the cache's shared lock:
    a prune waits. A cache without a lock file yet is read without one (nothing else has begun
    to write it; listing writes nothing)."""
    with fsio.locked(cache / cachelocks.CACHE_LOCK, shared=True, holder=_HOLDER):
        items = inventory(cache, pin)
    body = {"cache": str(cache), "size": sum(i.size for i in items), "items": _json(items)}
    return _table(cache, items, "cache"), body


_HOLDER = "another vllm-patchset run (a fetch, build, matrix or cache prune)"


def prune(project: Project, *, dry_run: bool) -> tuple[str, dict[str, object]]:
    """`cache prune` of the project's cache, under the cache's exclusive lock: its report
    (text, JSON body)."""
    if not project.cache_dir.is_dir():
        return _prune(project, dry_run=dry_run)
    fsio.no_symlink_below(project.cache_dir, (cachelocks.CACHE_LOCK,))
    with cachelocks.cache_exclusive(project.cache_dir):
        return _prune(project, dry_run=dry_run)


def _prune(project: Project, *, dry_run: bool) -> tuple[str, dict[str, object]]:
    cache = project.cache_dir
    mirror = cache / "mirror.git"
    if mirror.is_symlink():
        raise fsio.UnsafePath(
            f"refusing {mirror}: it is a symlink (to {os.readlink(mirror)}), not the cache's own"
            " mirror; nothing was removed"
        )
    items = inventory(cache, project.pin)
    gone = [i for i in items if i.prunable]
    freed = sum(i.size for i in gone)
    # Each file goes whole and git gc replaces packs atomically: the cache stays usable.
    removing = "some of the files listed removed; the cache is usable as it is"
    fsio.interrupt_leaves("nothing was changed" if dry_run else removing)
    if not dry_run:
        for item in gone:
            path = fsio.no_symlink_below(cache, item.path.split("/"))
            if fsio.is_regular(path):  # still what was listed: a regular file of ours
                fsio.remove_file(path)
        if _is_mirror(mirror):
            freed += _gc(Repo(mirror), project)
    verb = "would remove" if dry_run else "removed"
    lines = [f"{verb} {len(gone)} file(s), {human(freed)}"]
    lines += [f"  {i.path} ({human(i.size)})" for i in gone]
    if not dry_run:
        lines.append("mirror: unreachable objects removed, every tag kept")
    body = {"dry_run": dry_run, "removed": _json(gone), "freed": freed}
    return "\n".join(lines), body


def _gc(repo: Repo, project: Project) -> int:
    """`git gc --prune=now` of the mirror, the lock's upstream commit kept by a ref first;
    the bytes freed."""
    before = size_of(repo.path)
    lock = Lock.load(project.lock_path) if fsio.is_regular(project.lock_path) else None
    commit = repo.resolve(lock.upstream_commit) if lock is not None else None
    if commit is not None:  # the id git resolved, not the lock's text
        repo.run("update-ref", LOCK_REF, commit)
    repo.run("gc", "--quiet", "--prune=now")
    return max(0, before - size_of(repo.path))
