"""`sync/swap.py`: the torch a release requires, read from its sdist within a bound, and the
stage context that stages each patch's file."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from vllm_patchset.overlay.upstream import Mirror, Upstream
from vllm_patchset.sync import swap

# The torch a release requires, read from its sdist's requirements/cuda.txt (name -> bytes of the
# sdist's members before it, that member -> the torch read): within the bound, over it (refused,
# never read whole: no torch said), and none there.
CUDA_TXT = "vllm-9.9/requirements/cuda.txt"
TORCH_OF_SDIST = [
    ({"vllm-9.9/PKG-INFO": b"x", CUDA_TXT: b"torch==2.14.0\n"}, "2.14.0"),
    ({CUDA_TXT: b"torch==2.14.0\n" + b"#" * (swap.REQUIREMENTS_BOUND + 1)}, None),
    ({"vllm-9.9/PKG-INFO": b"x"}, None),
]


@pytest.mark.parametrize(("members", "torch"), TORCH_OF_SDIST)
def test_torch_of_the_sdist(tmp_path: Path, members: dict[str, bytes], torch: str | None) -> None:
    mirror = Mirror(tmp_path / "cache")
    mirror.sdists.mkdir()
    with tarfile.open(mirror.sdists / "vllm-9.9.tar.gz", "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    onto = Upstream("9.9", "9.9", "v9.9", "abc", "pypi:vllm-9.9.tar.gz sha256:0")
    assert swap._torch(mirror, onto) == torch
