"""Tar archives read by the tool (an sdist, a tree from the mirror, a native-ops kit), checked
member by member by the tool itself before anything of a member is written, whatever the
interpreter's tarfile does: its `data` filter is not relied on (CVE-2025-4517 let a crafted
archive write outside the folder on Python up to 3.11.12, 3.12.10 and 3.13.3).

A member is written only when its name is a plain relative path (no absolute path, `..`, `.`,
empty part, backslash, NUL or newline), under one of the expected top folders, of a regular
file or a folder (no link, device or FIFO), within the size bounds, and not written already.
Files get mode 0644, or 0755 when the archive says executable: never setuid, setgid or sticky.
Each is written with O_CREAT | O_EXCL | O_NOFOLLOW in chunks, below a fresh folder that only
this extraction writes in.

Standard library only: `kitparts.py` (copied into the GPU bundle, for hosts without
vllm-patchset) uses it, and the bundle carries this file beside it. So it writes the members
itself (os.open, os.mkdir, os.chmod), not through the file-system layer (`infra/fsio/`), which
does not travel: one of the three modules (with kitparts.py and gpurun.py) that
tests/test_fs_layer.py lets write on their own.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


class ArchiveRefused(Exception):
    """A member that the rules refuse: one line that names the archive and the member."""

    exit_code = 1  # a finding: the archive is not what it should be


@dataclass(frozen=True)
class Bounds:
    """The most an extraction writes: per member, in all, and how many members."""

    member: int
    total: int
    count: int


TREE_BOUNDS = Bounds(member=256 << 20, total=8 << 30, count=200_000)
# An sdist: every member counted, those outside `vllm/` too (vLLM 0.33's sdist has 9,629).
SDIST_BOUNDS = Bounds(member=256 << 20, total=8 << 30, count=100_000)
KIT_BOUNDS = Bounds(member=8 << 30, total=64 << 30, count=200_000)
CHUNK = 1 << 20


def member_parts(name: str) -> tuple[str, ...] | None:
    """The parts of a plain relative member name (a trailing `/` of a folder allowed), or
    None."""
    rel = name[:-1] if name.endswith("/") else name
    parts = tuple(rel.split("/"))
    if (
        not rel
        or rel.startswith("/")
        or any(c in rel for c in "\\\x00\n\r")
        or any(part in ("", ".", "..") for part in parts)
    ):
        return None
    return parts


def check(
    member: tarfile.TarInfo,
    *,
    what: str,
    tops: Iterable[str] | None = None,
) -> tuple[str, ...]:
    """The parts of `member`'s name when the rules allow it; ArchiveRefused otherwise."""
    parts = member_parts(member.name)
    if parts is None:
        raise ArchiveRefused(f"{what} holds {member.name!r}, not a plain relative path: refused")
    allowed = tuple(tops) if tops is not None else None
    if allowed is not None and parts[0] not in allowed:
        raise ArchiveRefused(
            f"{what} holds {member.name!r}, outside {', '.join(f'{t}/' for t in allowed)}: refused"
        )
    if not (member.isreg() or member.isdir()):
        kind = (
            "a symbolic link"
            if member.issym()
            else "a hard link"
            if member.islnk()
            else "a device"
            if member.ischr() or member.isblk()
            else "a FIFO"
            if member.isfifo()
            else "a special member"
        )
        to = f" to {member.linkname!r}" if member.issym() or member.islnk() else ""
        raise ArchiveRefused(f"{what} holds {member.name!r}, {kind}{to}: refused")
    return parts


@dataclass
class _Tally:
    bounds: Bounds
    what: str
    count: int = 0
    total: int = 0

    def seen(self, member: tarfile.TarInfo) -> None:
        """Count every member of the archive, written or passed over: an archive of a million
        members beside the expected folder is refused as soon as the count is over."""
        self.count += 1
        self.total += max(member.size, 0) if member.isreg() else 0
        if self.total > self.bounds.total or self.count > self.bounds.count:
            raise ArchiveRefused(
                f"{self.what} holds more than {self.bounds.total} bytes or"
                f" {self.bounds.count} members: refused"
            )

    def add(self, member: tarfile.TarInfo) -> None:
        if member.isreg() and member.size > self.bounds.member:
            raise ArchiveRefused(
                f"{self.what} holds {member.name!r} of {member.size} bytes, over the bound of"
                f" {self.bounds.member} a member: refused"
            )


def members(tar: tarfile.TarFile, tally: _Tally | None = None) -> Iterator[tarfile.TarInfo]:
    """The members of `tar` one by one, each counted by `tally`, none kept: tarfile's own
    iteration keeps every member it has read (`tar.members`), memory that grows with an
    archive of a million members; here each is let go once the next is read."""
    while True:
        member = tar.next()
        if member is None:
            return
        if tally is not None:
            tally.seen(member)
        yield member
        kept: list[tarfile.TarInfo] = getattr(tar, "members")  # noqa: B009 - untyped
        kept.clear()


def extract(
    tar: tarfile.TarFile,
    dest: Path,
    *,
    what: str,
    tops: Iterable[str] | None = None,
    bounds: Bounds = TREE_BOUNDS,
    select: Callable[[tarfile.TarInfo], tuple[str, ...] | None] | None = None,
    stream: bool = False,
) -> int:
    """Write the members of `tar` under `dest` (a folder this extraction alone writes in), each
    checked first; return the files written. With `select`, only the members it gives a path
    for (the parts below `dest`), there; the others are passed over unread.

    A random-access archive is checked whole before the first byte is written; a `stream`
    (mode `r|`) member by member, each before it is written (the caller's staging folder,
    removed on an error, holds what came before)."""

    def plan(member: tarfile.TarInfo) -> tuple[str, ...] | None:
        if select is None:
            return check(member, what=what, tops=tops)
        out = select(member)
        if out is None:
            return None
        check(member, what=what, tops=tops)
        if member_parts("/".join(out)) is None:
            raise ArchiveRefused(f"{what} holds {member.name!r}, not a plain path: refused")
        return out

    source: Iterable[tarfile.TarInfo]
    if stream:
        source = members(tar, _Tally(bounds, what))
    else:
        listed = []
        tally = _Tally(bounds, what)
        for member in members(tar, tally):
            listed.append(member)
            if plan(member) is not None:
                tally.add(member)
        source = listed
    tally = _Tally(bounds, what)
    written = 0
    for member in source:
        parts = plan(member)
        if parts is None:
            continue
        tally.add(member)
        if member.isdir():
            _mkdirs(dest, parts)
            continue
        _mkdirs(dest, parts[:-1])
        _write(tar, member, dest.joinpath(*parts), what)
        written += 1
    return written


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, out: Path, what: str) -> None:
    handle = tar.extractfile(member)
    if handle is None:
        raise ArchiveRefused(f"{what}: {member.name!r} cannot be read")
    mode = 0o755 if member.mode & 0o111 else 0o644
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(out, flags, mode)
    except FileExistsError:
        raise ArchiveRefused(f"{what} holds {member.name!r} twice: refused") from None
    with os.fdopen(fd, "wb") as sink:
        left = member.size
        while left > 0:
            chunk = handle.read(min(CHUNK, left))
            if not chunk:
                raise ArchiveRefused(f"{what}: {member.name!r} is truncated")
            sink.write(chunk)
            left -= len(chunk)
    os.chmod(out, mode)  # whatever the umask: the archive's executable bit, nothing more


def _mkdirs(dest: Path, parts: tuple[str, ...]) -> None:
    """The folders `parts` below `dest`, each made here or a real folder made before (no
    member is ever a link, so none can be one)."""
    path = dest
    for part in parts:
        path = path / part
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            if path.is_symlink() or not path.is_dir():
                raise ArchiveRefused(f"{path} is in the way of a folder: refused") from None
            continue
        os.chmod(path, 0o755)  # whatever the umask


def read_member(
    tar: tarfile.TarFile, name: str, *, what: str, limit: int, bounds: Bounds = TREE_BOUNDS
) -> bytes | None:
    """The bytes of the regular member `name`, read in one pass that stops there (a stream
    `r|` is read no further), or None when the archive has none. Checked as `extract` checks
    a member (a plain path, a regular file) and refused over `limit` bytes; the members before
    it counted against `bounds`."""
    for member in members(tar, _Tally(bounds, what)):
        if member.name != name:
            continue
        check(member, what=what)
        if member.size > limit:
            raise ArchiveRefused(
                f"{what} holds {name!r} of {member.size} bytes, over the bound of {limit}: refused"
            )
        handle = tar.extractfile(member)
        if handle is None:
            raise ArchiveRefused(f"{what}: {name!r} cannot be read")
        data = handle.read(limit + 1)
        if len(data) != member.size:
            raise ArchiveRefused(f"{what}: {name!r} is truncated")
        return data
    return None
