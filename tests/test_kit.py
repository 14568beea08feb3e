"""The native-ops kit on the CPU: which files of the real 0.24.0 wheel it keeps, and its parts
written, checked and reassembled from a small wheel built here (a missing, truncated or altered
part, or a file that is not the wheel's: one line on stderr and nothing written)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import random
import tarfile
import zipfile
from pathlib import Path
from typing import BinaryIO, cast

import pytest
from vllm_install import install_pristine
from vllm_patchset.cli import main
from vllm_patchset.gpu import kitparts
from vllm_patchset.gpu.kitbuild import kit_member, write_kit

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


def test_kit_keeps_what_the_engine_needs_of_the_real_wheel(cache_dir: Path) -> None:
    install_pristine(cache_dir)  # downloads the 0.24.0 wheel once into the test cache
    (wheel,) = (cache_dir / "wheels").glob("vllm-0.24.0-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
    kept = {n for n in names if kit_member(n)}
    so_files = {n for n in names if n.endswith(".so")}
    assert sorted(so_files - kept) == [
        "vllm/third_party/deep_gemm/_C.cpython-310-x86_64-linux-gnu.so",
        "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so",
        "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so",
        "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so",
        "vllm/third_party/deep_gemm/_C.cpython-314-x86_64-linux-gnu.so",
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    ]
    for name in (
        "vllm/_C_stable_libtorch.abi3.so",
        "vllm/_moe_C_stable_libtorch.abi3.so",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
        "vllm/model_executor/layers/fused_moe/experts/triton_moe.py",
        "vllm/third_party/pynvml.py",
        "vllm-0.24.0.dist-info/RECORD",
        "vllm-0.24.0.dist-info/entry_points.txt",
    ):
        assert name in kept
    assert "vllm/vllm-rs" not in kept
    # Every Python file of the wheel is kept (the engine imports them lazily, anywhere).
    assert {n for n in names if n.endswith(".py")} <= kept


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


def test_cli_verify_and_assemble(
    kit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parts = len(kitparts.Manifest.load(kit).parts)
    assert main(["kit", "verify", str(kit)]) == 0
    assert capsys.readouterr().out == f"kit for vllm 0.24.0: {parts} parts ok\n"
    dest = tmp_path / "native"
    assert main(["kit", "assemble", str(kit), "--dest", str(dest)]) == 0
    assert capsys.readouterr().out == f"kit assembled in {dest}: PYTHONPATH={dest / 'site'}\n"


def _tamper(kit: Path) -> str:
    part = kit / "kit.tar.xz.01"
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    got = hashlib.sha256(bytes(data)).hexdigest()
    want = kitparts.Manifest.load(kit).parts[1].sha256
    return f"kit part kit.tar.xz.01: sha256 {got} is not the manifest's {want} (altered)"


def _truncate(kit: Path) -> str:
    part = kit / "kit.tar.xz.00"
    part.write_bytes(part.read_bytes()[:1000])
    return f"kit part kit.tar.xz.00 is 1000 bytes, the manifest says {LIMIT} (truncated or incomplete copy)"


def _remove(kit: Path) -> str:
    (kit / "kit.tar.xz.02").unlink()
    return f"kit part kit.tar.xz.02 is missing from {kit}"


def _no_manifest(kit: Path) -> str:
    (kit / "kit.json").unlink()
    return f"no kit.json in {kit}: not a kit folder"


def _bad_part_name(kit: Path) -> str:
    data = json.loads((kit / "kit.json").read_text())
    data["parts"][0]["name"] = "../kit.tar.xz.00"
    (kit / "kit.json").write_text(json.dumps(data))
    return f"{kit / 'kit.json'}: part name '../kit.tar.xz.00' is not a plain file name"


BROKEN_KITS = [
    (_tamper, 1),
    (_truncate, 1),
    (_remove, 1),
    (_no_manifest, 2),
    (_bad_part_name, 1),
]


@pytest.mark.parametrize(("breaks", "code"), BROKEN_KITS, ids=lambda x: getattr(x, "__name__", x))
@pytest.mark.parametrize("command", ["verify", "assemble"])
def test_broken_kit_is_one_line_and_writes_nothing(
    kit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], breaks, code: int, command: str
) -> None:
    message = breaks(kit)
    before = listing(tmp_path)
    dest = tmp_path / "native"
    args = ["kit", command, str(kit)] + (["--dest", str(dest)] if command == "assemble" else [])
    assert main(args) == code
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", f"vllm-patchset: {message}\n")
    assert listing(tmp_path) == before


def _repack(kit: Path, edit) -> None:
    """Rewrite the kit's stream with `edit(name, data) -> data | None` applied to each member
    (the parts and manifest rewritten to match: only the contents are wrong)."""
    manifest = kitparts.Manifest.load(kit)
    stream = b"".join((kit / p.name).read_bytes() for p in manifest.parts)
    members = []
    import lzma

    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(stream))) as tar:
        for member in tar:
            handle = tar.extractfile(member)
            assert handle is not None
            data = edit(member.name, handle.read())
            if data is not None:
                members.append((member.name, data))
    for part in manifest.parts:
        (kit / part.name).unlink()
    with (
        kitparts.PartWriter(kit, LIMIT) as parts,
        lzma.open(cast(BinaryIO, parts), "wb", preset=0) as xz,
        tarfile.open(fileobj=xz, mode="w") as tar,
    ):
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    new = kitparts.Manifest(**{**manifest.__dict__, "parts": tuple(parts.parts)})
    (kit / "kit.json").write_text(new.to_json())


CONTENT_CASES = [
    (
        lambda n, d: d + b"# edited\n" if n == "site/vllm/__init__.py" else d,
        "site/vllm/__init__.py does not match the sha256 in {wheel}'s RECORD",
    ),
    (
        lambda n, d: d if n != "site/vllm/third_party/pynvml.py" else None,
        "the kit's site/ holds 9 files, the manifest 10",
    ),
    (
        lambda n, d: b"x" if n.endswith("RECORD") else d,
        "vllm-0.24.0.dist-info/RECORD is not the RECORD of {wheel}",
    ),
    (
        lambda n, d: d if not n.startswith("wheels/") else None,
        "the kit's wheels: missing ['tinydep-1.0-py3-none-any.whl'], unexpected []",
    ),
]


@pytest.mark.parametrize(("edit", "message"), CONTENT_CASES)
def test_kit_with_files_that_are_not_the_wheels(
    kit: Path, wheel: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit, message: str
) -> None:
    _repack(kit, edit)
    assert main(["kit", "verify", str(kit)]) == 0  # the parts are whole: the contents are not
    capsys.readouterr()
    before = listing(tmp_path)
    assert main(["kit", "assemble", str(kit), "--dest", str(tmp_path / "native")]) == 1
    assert capsys.readouterr().err == f"vllm-patchset: {message.format(wheel=wheel.name)}\n"
    assert listing(tmp_path) == before


def test_file_outside_the_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = make_wheel(
        tmp_path / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        WHEEL_FILES,
        record_skip=("vllm/__init__.py",),
    )
    write_kit(wheel, "cd" * 32, "0.24.0", tmp_path / "kit", level=0, part_limit=LIMIT)
    before = listing(tmp_path)
    assert main(["kit", "assemble", str(tmp_path / "kit"), "--dest", str(tmp_path / "n")]) == 1
    message = f"site/vllm/__init__.py is not a file of {wheel.name}"
    assert capsys.readouterr().err == f"vllm-patchset: {message}\n"
    assert listing(tmp_path) == before


def test_destination_taken(kit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "native"
    dest.mkdir()
    assert main(["kit", "assemble", str(kit), "--dest", str(dest)]) == 2
    message = f"{dest} exists already and holds no assembly of this kit"
    assert capsys.readouterr().err == f"vllm-patchset: {message}\n"
    assert os.listdir(dest) == []


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


def test_pin_wheel_is_the_index_s(project, cache_dir: Path) -> None:
    """The pin's wheel, from the cache, checked against the package index's sha256."""
    from vllm_patchset.gpu.kitbuild import pin_wheel

    install_pristine(cache_dir)  # the wheel is in the test cache already
    wheel, sha256 = pin_wheel(project)
    assert wheel == cache_dir / "wheels" / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert sha256 == "2d2831aeba311292250df0132dbc4d8e9f42c654536eaec48e6fe58acb1822cf"
    assert kitparts.sha256_file(wheel) == sha256
