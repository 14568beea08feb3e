"""Unit tables for the readers of the project's data: release versions (a patch file and the
series file: tests/series/test_patches.py; the overlay lock: tests/overlay/test_lock.py; an
installed wheel's RECORD and names: tests/infra/test_installed.py; paths from data:
tests/infra/fsio/test_paths.py; git sources: tests/overlay/test_upstream.py). No git, no vLLM:
text in, value (or one error) out."""

from __future__ import annotations

import pytest
from packaging.version import Version
from vllm_patchset.versions import parse as parse_version


# -- versions ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("0.24.0", Version("0.24.0")),
        ("0.25.0rc1", Version("0.25.0rc1")),
        ("1!2.0", Version("1!2.0")),
        ("0.24.0+cu130", Version("0.24.0+cu130")),
        ("latest", None),
        ("", None),
        ("git:nightly", None),
        ("0.24.0-nightly", None),
    ],
)
def test_parse_version(text: str, version: Version | None) -> None:
    assert parse_version(text) == version
