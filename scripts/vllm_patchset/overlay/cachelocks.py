"""The cache's locks: who may read, import into or prune the cache at once.

Every run that reads or writes the cache holds flock(2) on CACHE_LOCK in it: shared for as long
as it reads (a Mirror's life), exclusive for `cache prune` (`cache_exclusive`), which so waits
for every reader and importer and is never met by one. The mirror's imports are one at a time
too, exclusive on IMPORT_LOCK (`importing`) while their shared hold keeps a prune out: a reader
never waits for an import, so a long `matrix` does not hold a fetch off, nor a fetch a
`status`. One shared hold a process however many Mirror objects it makes, given up while that
process prunes (flock is per open file: a second open of its own would wait on itself).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from vllm_patchset.infra import fsio

CACHE_LOCK = "vllm-patchset.lock"
IMPORT_LOCK = "vllm-patchset.import.lock"
_HOLDER = "another vllm-patchset run (a fetch, build, matrix or cache prune)"
_shared: dict[Path, tuple[ExitStack, int]] = {}


def _made(path: Path) -> Path:
    """The lock file `path`, made (with its folder) when missing."""
    if not (path.exists() or path.is_symlink()):
        with fsio.locked(path, holder=_HOLDER):
            pass
    return path


def hold_shared(cache_dir: Path) -> None:
    """Take (or count once more) this process's shared hold on the cache."""
    key = cache_dir.absolute()
    if key in _shared:
        stack, count = _shared[key]
        _shared[key] = (stack, count + 1)
        return
    stack = ExitStack()
    stack.enter_context(fsio.locked(_made(key / CACHE_LOCK), shared=True, holder=_HOLDER))
    _shared[key] = (stack, 1)


def release_shared(cache_dir: Path) -> None:
    key = cache_dir.absolute()
    if key not in _shared:
        return
    stack, count = _shared[key]
    if count > 1:
        _shared[key] = (stack, count - 1)
        return
    del _shared[key]
    stack.close()


@contextmanager
def reading(cache_dir: Path) -> Iterator[None]:
    """The cache held shared by this run for the block (a prune waits)."""
    hold_shared(cache_dir)
    try:
        yield
    finally:
        release_shared(cache_dir)


@contextmanager
def importing(cache_dir: Path) -> Iterator[None]:
    """One import into the mirror at a time (and none while a prune runs)."""
    key = cache_dir.absolute()
    hold_shared(key)
    try:
        with fsio.locked(key / IMPORT_LOCK, holder=_HOLDER):
            yield
    finally:
        release_shared(key)


@contextmanager
def cache_exclusive(cache_dir: Path) -> Iterator[None]:
    """The cache to this run alone (a prune): other runs' readers and imports finish first,
    and wait meanwhile. This process's shared hold is given up meanwhile, and taken again."""
    key = cache_dir.absolute()
    held = _shared.pop(key, None)
    if held is not None:
        held[0].close()
    try:
        with fsio.locked(key / CACHE_LOCK, holder=_HOLDER):
            yield
    finally:
        if held is not None:
            stack = ExitStack()
            stack.enter_context(fsio.locked(key / CACHE_LOCK, shared=True, holder=_HOLDER))
            _shared[key] = (stack, held[1])
