"""infra/archives.py as a unit: the bounds count EVERY member of an archive, the ones passed over
(outside `vllm/` in an sdist) as much as the ones written, and the members are not kept while
an archive is read (memory does not grow with their count)."""

from __future__ import annotations

import gzip
import io
import tarfile
import time
from pathlib import Path

import pytest
from vllm_patchset.errors import DownloadFailed
from vllm_patchset.infra import archives
from vllm_patchset.infra.archives import ArchiveRefused, Bounds
from vllm_patchset.overlay.upstream import _extract_package


def _header(name: str, size: int = 0) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def many_members(count: int, *, vllm: bool = True) -> bytes:
    """A gzipped tar of `count` empty files `pkg-1.0/junk/NNNNNNN` (and vllm/__init__.py
    first), made header by header: a template whose name digits and checksum are patched."""
    template = bytearray(_header("pkg-1.0/junk/0000000"))
    start = len("pkg-1.0/junk/")
    base = int(template[148:154], 8) - sum(template[start : start + 7])
    parts = []
    if vllm:
        data = b'__version__ = "1.0"\n'
        parts.append(_header("pkg-1.0/vllm/__init__.py", len(data)) + data.ljust(512, b"\0"))
    for i in range(count):
        digits = b"%07d" % i
        template[start : start + 7] = digits
        template[148:155] = b"%06o\0" % (base + sum(digits))
        parts.append(bytes(template))
    parts.append(bytes(1024))
    return gzip.compress(b"".join(parts), compresslevel=1)


def test_the_template_archive_is_a_valid_tar() -> None:
    with tarfile.open(fileobj=io.BytesIO(many_members(3)), mode="r|gz") as tar:
        names = [m.name for m in tar]
    assert names == [
        "pkg-1.0/vllm/__init__.py",
        "pkg-1.0/junk/0000000",
        "pkg-1.0/junk/0000001",
        "pkg-1.0/junk/0000002",
    ]


def _select(member: tarfile.TarInfo) -> tuple[str, ...] | None:
    parts = tuple(member.name.split("/"))
    return parts[1:] if len(parts) > 2 and parts[1] == "vllm" else None


@pytest.mark.parametrize("stream", [True, False])
def test_members_passed_over_count_against_the_bounds(tmp_path: Path, stream: bool) -> None:
    data = many_members(50)
    dest = tmp_path / "dest"
    dest.mkdir()
    with (
        tarfile.open(fileobj=io.BytesIO(data), mode="r|gz" if stream else "r:gz") as tar,
        pytest.raises(ArchiveRefused) as info,
    ):
        archives.extract(
            tar,
            dest,
            what="the sdist",
            select=_select,
            stream=stream,
            bounds=Bounds(member=1 << 20, total=1 << 20, count=20),
        )
    assert str(info.value) == "the sdist holds more than 1048576 bytes or 20 members: refused"
    if not stream:  # a random-access archive is checked whole first: nothing written
        assert list(dest.iterdir()) == []


def test_bytes_passed_over_count_against_the_bounds(tmp_path: Path) -> None:
    """A member outside the selection declaring 9 GiB: refused from its header, unread."""
    member = tarfile.TarInfo("pkg-1.0/junk/big")
    member.size = 9 << 30
    big = member.tobuf(format=tarfile.GNU_FORMAT)
    data = gzip.compress(big + bytes(1024))
    with (
        tarfile.open(fileobj=io.BytesIO(data), mode="r|gz") as tar,
        pytest.raises(ArchiveRefused) as info,
    ):
        archives.extract(tar, tmp_path, what="the sdist", select=_select, stream=True)
    assert (
        str(info.value) == "the sdist holds more than 8589934592 bytes or 200000 members: refused"
    )


def test_members_are_not_kept_while_reading() -> None:
    """tarfile keeps every member it read; `archives.members` lets each go."""
    with tarfile.open(fileobj=io.BytesIO(many_members(2000)), mode="r|gz") as tar:
        kept = 0
        for _ in archives.members(tar):
            kept = max(kept, len(getattr(tar, "members")))  # noqa: B009 - untyped attribute
    assert kept <= 1


def test_read_member_counts_the_members_before_it() -> None:
    data = many_members(40, vllm=False)
    with (
        tarfile.open(fileobj=io.BytesIO(data), mode="r|gz") as tar,
        pytest.raises(ArchiveRefused) as info,
    ):
        archives.read_member(
            tar, "pkg-1.0/none", what="the sdist", limit=100, bounds=Bounds(1, 1 << 20, 10)
        )
    assert str(info.value) == "the sdist holds more than 1048576 bytes or 10 members: refused"


def test_an_sdist_of_a_million_members_is_refused_quickly(tmp_path: Path) -> None:
    """The issue's sdist (its members outside `vllm/`), cut to what the bound needs: 120,000
    members, refused at the 100,001st (the sdist's bound), in seconds."""
    sdist = tmp_path / "vllm-1.0.tar.gz"
    sdist.write_bytes(many_members(120_000))
    (tmp_path / "out").mkdir()
    began = time.process_time()
    with pytest.raises(DownloadFailed) as info:
        _extract_package(sdist, tmp_path / "out", "vllm")
    took = time.process_time() - began
    assert str(info.value) == f"{sdist} holds more than 8589934592 bytes or 100000 members: refused"
    assert took < 10, took
    # what came before the bound (in the caller's staging folder, removed on the error)
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["__init__.py", "vllm"]
