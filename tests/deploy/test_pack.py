"""`deploy/pack.py`: the packed wheel's version, the tool's tagged with the pin and the lock's
first 8 hex, so that pip sees a new overlay as a new version. The wheel itself (byte for byte,
installed, deploying without the checkout) is test_pack.py's."""

from __future__ import annotations

import pytest
from vllm_patchset.deploy.pack import wheel_version
from vllm_patchset.infra.hashes import sha256_bytes

LOCK = b'{"schema": 2}\n'
TAG = sha256_bytes(LOCK)[:8]
VERSIONS = [
    ("0.1.0", "0.24.0", f"0.1.0+vllm0.24.0.{TAG}"),
    ("0.1.0+local", "0.24.0", f"0.1.0+vllm0.24.0.{TAG}"),  # the tool's local part dropped
    ("0.2.0.dev1", "0.25.0rc1", f"0.2.0.dev1+vllm0.25.0rc1.{TAG}"),
    ("0.1.0", "0.24.0+cu130", f"0.1.0+vllm0.24.0.cu130.{TAG}"),  # a local segment's words
]


@pytest.mark.parametrize(("tool", "vllm", "version"), VERSIONS)
def test_wheel_version(tool: str, vllm: str, version: str) -> None:
    assert wheel_version(tool, LOCK, vllm) == version
