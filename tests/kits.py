"""The small vLLM wheel and native-ops kit that the kit's, the bundle's and validate's tests
build (a wheel with a RECORD, a kit of several parts with a dependency wheel), and their
fixtures (conftest.py exports them)."""

from __future__ import annotations

import base64
import hashlib
import random
import zipfile
from pathlib import Path

import pytest
from vllm_patchset.gpu.kitbuild import write_kit

LIMIT = 4096  # small parts, so that the kits here have several
WHEEL_FILES = {
    "vllm/__init__.py": b"__version__ = '0.24.0'\n",
    # 10 KiB that xz cannot shrink: three parts' worth.
    "vllm/_C_stable_libtorch.abi3.so": random.Random(0).randbytes(10240),
    "vllm/vllm_flash_attn/__init__.py": b"",
    "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"\x7fELF fa3",
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"\x7fELF fa2",
    "vllm/vllm-rs": b"\x7fELF rust",
    "vllm/third_party/__init__.py": b"",
    "vllm/third_party/pynvml.py": b"# nvml\n",
    "vllm/third_party/deep_gemm/__init__.py": b"",
    "vllm/third_party/deep_gemm/include/cute/arch/mma.hpp": b"// header\n",
    "vllm/entrypoints/serve/instrumentator/static/swagger-ui-bundle.js": b"js",
    "vllm-0.24.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.24.0\n",
    "vllm-0.24.0.dist-info/entry_points.txt": b"[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n",
}


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(path: Path, files: dict[str, bytes], record_skip: tuple[str, ...] = ()) -> Path:
    """A wheel of `files` with a RECORD (files in `record_skip` left out of it)."""
    info = next(n.split("/")[0] for n in files if ".dist-info/" in n)
    rows = [f"{n},{_digest(d)},{len(d)}" for n, d in files.items() if n not in record_skip]
    rows.append(f"{info}/RECORD,,")
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{info}/RECORD", "\n".join(rows) + "\n")
    return path


def make_dependency_wheel(folder: Path) -> Path:
    files = {
        "tinydep/__init__.py": b"VALUE = 42\n",
        "tinydep-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinydep\nVersion: 1.0\n",
        "tinydep-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    folder.mkdir(parents=True, exist_ok=True)
    return make_wheel(folder / "tinydep-1.0-py3-none-any.whl", files)


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    return make_wheel(tmp_path / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl", WHEEL_FILES)


@pytest.fixture
def kit(wheel: Path, tmp_path: Path) -> Path:
    dep = make_dependency_wheel(tmp_path / "deps")
    write_kit(wheel, "ab" * 32, "0.24.0", tmp_path / "kit", wheels=[dep], level=0, part_limit=LIMIT)
    return tmp_path / "kit"


def listing(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
