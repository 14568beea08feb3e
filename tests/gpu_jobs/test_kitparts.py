"""`gpu/kitparts.py` on the CPU: a kit's parts written, checked and reassembled from a small
wheel built here, in this interpreter and as the script a GPU host runs alone."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

from kits import LIMIT, WHEEL_FILES, listing
from vllm_patchset.gpu import kitparts

KEPT = sorted(
    {
        "vllm/__init__.py",
        "vllm/_C_stable_libtorch.abi3.so",
        "vllm/vllm_flash_attn/__init__.py",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
        "vllm/third_party/__init__.py",
        "vllm/third_party/pynvml.py",
        "vllm/third_party/deep_gemm/__init__.py",
        "vllm-0.24.0.dist-info/METADATA",
        "vllm-0.24.0.dist-info/entry_points.txt",
        "vllm-0.24.0.dist-info/RECORD",
    }
)


def test_write_verify_assemble(wheel: Path, kit: Path, tmp_path: Path) -> None:
    manifest = kitparts.Manifest.load(kit)
    with zipfile.ZipFile(wheel) as archive:
        record = archive.read("vllm-0.24.0.dist-info/RECORD")
    assert manifest.vllm == "0.24.0"
    assert manifest.wheel == wheel.name
    assert manifest.wheel_sha256 == "ab" * 32
    assert manifest.record_sha256 == hashlib.sha256(record).hexdigest()
    assert manifest.site_files == len(KEPT)
    dep = tmp_path / "deps" / "tinydep-1.0-py3-none-any.whl"
    assert manifest.wheels == {dep.name: hashlib.sha256(dep.read_bytes()).hexdigest()}
    assert len(manifest.parts) >= 3
    assert [p.name for p in manifest.parts] == [
        f"kit.tar.xz.{i:02d}" for i in range(len(manifest.parts))
    ]
    assert all(p.size == LIMIT for p in manifest.parts[:-1])
    for part in manifest.parts:
        data = (kit / part.name).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (part.size, part.sha256)
    assert listing(kit) == ["kit.json", *(p.name for p in manifest.parts)]
    assert kitparts.verify(kit) == manifest

    dest = tmp_path / "native"
    assert kitparts.assemble(kit, dest) == dest
    site = dest / "site"
    for name in KEPT:
        expected = record if name.endswith("RECORD") else WHEEL_FILES[name]
        assert (site / name).read_bytes() == expected
    assert not (site / "vllm" / "vllm-rs").exists()
    assert (site / "tinydep" / "__init__.py").read_bytes() == b"VALUE = 42\n"  # pip installed it
    complete = json.loads((dest / kitparts.COMPLETE).read_text())
    assert complete["manifest"] == manifest.to_json()
    assert set(complete["files"]) == {
        p.relative_to(dest).as_posix()
        for p in dest.rglob("*")
        if p.is_file() and p.name != kitparts.COMPLETE
    }
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    # Assembled already from the same kit: a no-op.
    before = listing(dest)
    assert kitparts.assemble(kit, dest) == dest
    assert listing(dest) == before


def test_kitparts_runs_standalone(kit: Path, tmp_path: Path) -> None:
    """On a GPU host without vllm-patchset, the bundle runs kitparts.py as a script."""
    import subprocess
    import sys

    script = Path(kitparts.__file__)
    isolated = tmp_path / "isolated"
    isolated.mkdir()
    (isolated / "kitparts.py").write_bytes(script.read_bytes())
    result = subprocess.run(
        [sys.executable, "-I", str(isolated / "kitparts.py"), "verify", str(kit)],
        capture_output=True,
        text=True,
    )
    size = sum(p.size for p in kitparts.Manifest.load(kit).parts) / 2**20
    parts = len(kitparts.Manifest.load(kit).parts)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"kit for vllm 0.24.0: {parts} parts ({size:.1f} MiB) ok\n"
    (kit / "kit.tar.xz.00").unlink()
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            str(isolated / "kitparts.py"),
            "assemble",
            str(kit),
            "--dest",
            str(tmp_path / "n"),
        ],
        capture_output=True,
        text=True,
    )
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"kitparts: kit part kit.tar.xz.00 is missing from {kit}\n"
    assert not (tmp_path / "n").exists()
