"""infra/hashes.py as a unit: the three forms of a sha256 the tool writes and compares."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from vllm_patchset.infra.fsio import UnsafePath
from vllm_patchset.infra.hashes import record_hash, sha256_bytes, sha256_file

EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
HASHES = [
    # (bytes, hex, a RECORD's hash column)
    (b"", EMPTY, "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"),
    (b"abc", ABC, "sha256=ungWv48Bz-pBQUDeXa4iI7ADYaOWF3qctBD_YfIAFa0"),
]


@pytest.mark.parametrize(("data", "hexdigest", "record"), HASHES)
def test_the_three_forms(tmp_path: Path, data: bytes, hexdigest: str, record: str) -> None:
    path = tmp_path / "f"
    path.write_bytes(data)
    assert (sha256_bytes(data), sha256_file(path), record_hash(data)) == (
        hexdigest,
        hexdigest,
        record,
    )


def test_a_file_is_streamed_and_a_link_read_only_when_followed(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"abc" * (1 << 20))
    assert sha256_file(big) == sha256_bytes(b"abc" * (1 << 20))
    (tmp_path / "link").symlink_to("big")
    assert sha256_file(tmp_path / "link", follow=True) == sha256_file(big)
    with pytest.raises(UnsafePath):
        sha256_file(tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafePath):
        sha256_file(tmp_path / "fifo")
