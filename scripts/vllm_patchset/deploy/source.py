"""The overlay to deploy: the checkout's (--project, else the one around the current
directory), else the one packed into this vllm-patchset (`overlay pack`); its patched files,
each checked against its lock."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vllm_patchset.errors import BadInput, Finding
from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.fsio import UnsafePath
from vllm_patchset.infra.hashes import sha256_bytes
from vllm_patchset.infra.installed import path_parts
from vllm_patchset.overlay.lock import Lock

PACKED = "_overlay"  # in the package of a wheel `overlay pack` built: the lock and vllm/**


@dataclass(frozen=True)
class Source:
    """An overlay to deploy: its lock and the dir holding its patched files (`vllm/…`)."""

    lock: Lock
    files: Path


def packaged_overlay() -> Source | None:
    """The overlay packed into this installed vllm-patchset (`overlay pack`), if any."""
    folder = Path(__file__).resolve().parents[1] / PACKED
    lock = folder / "overlay.lock.json"
    return Source(Lock.load(lock), folder) if lock.is_file() else None


def overlay_source(project_dir: Path | None, cache_dir: Path | None) -> Source | None:
    """The checkout's overlay (--project, else the checkout around the current directory),
    else the one packed into this vllm-patchset; None when there is neither."""
    root = project_dir or Project.discover(Path.cwd())
    if root is None:
        return packaged_overlay()
    project = Project.load(root, cache_dir)
    return Source(Lock.load(project.lock_path), project.overlay_dir)


def no_overlay(package: str, version: str) -> Lock:
    """The lock of no overlay: what status and revert compare against when neither a checkout
    nor a packed overlay is at hand and the target records none."""
    return Lock(package, version, source="", upstream_commit="", patches=(), entries=())


def overlay_files(lock: Lock, overlay_dir: Path) -> dict[str, bytes]:
    """The overlay's patched files (in `overlay_dir`/vllm/…), each checked against the lock."""
    files = {}
    for entry in lock.entries:
        if entry.patched_sha256 is None:  # a file the overlay deletes
            continue
        parts = path_parts(lock.package, entry.path)
        if parts is None:
            raise UnsafePath(
                f"refusing lock path {entry.path!r}: only relative paths inside the"
                f" {lock.package} package are deployed"
            )
        source = fsio.no_symlink_below(overlay_dir, parts)
        data = fsio.read_regular(source)
        if data is None:
            raise BadInput(f"{source} is missing: run `vllm-patchset overlay build`")
        if sha256_bytes(data) != entry.patched_sha256:
            raise Finding(
                f"{source} does not match the lock's patched sha256: rebuild it with"
                " `vllm-patchset overlay build`"
            )
        files[entry.path] = data
    return files
