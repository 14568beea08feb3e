"""`vllm-patchset kit verify|assemble` (commands/kit.py) on a small kit built here: a missing,
truncated or altered part, or a file that is not the wheel's: one line on stderr, the exit code,
and nothing written."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import BinaryIO, cast

import pytest
from command_lines import parse_line
from kits import LIMIT, WHEEL_FILES, listing, make_wheel
from vllm_patchset.cli import main
from vllm_patchset.commands import kit as kit_command
from vllm_patchset.gpu import kitparts
from vllm_patchset.gpu.kitbuild import write_kit


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


def test_kit_verify_line_parsed() -> None:
    assert parse_line(kit_command, "kit", "verify", "/k") == {
        "command": "kit",
        "func": kit_command.cmd_kit_verify,
        "writes_checkout": False,
        "needs": (),
        "kit_command": "verify",
        "kit": Path("/k"),
    }
