"""`gpu/kitbuild.py`: which files of the real 0.24.0 wheel a kit keeps, the pin's wheel from
the index; and the kit's wheels for vllm-patchset itself, pyproject.toml's
[project].dependencies resolved for the GPU host (CPython 3.12 on Linux, no extras): every
dependency and every dependency of theirs is pinned there, at a version its specifier allows.
The host of issue 19 had none of tomlkit (and rich only by chance), so every command died on
import."""

from __future__ import annotations

import importlib.metadata
import random
import tomllib
import zipfile
from pathlib import Path

import pytest
from kits import WHEEL_FILES, make_wheel
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from support import REPO
from vllm_install import install_pristine
from vllm_patchset.cli import main
from vllm_patchset.gpu import KIT_PART_MIB, kitbuild, kitparts
from vllm_patchset.gpu.kitbuild import ENGINE_WHEELS, TOOL_WHEELS, VLLM_WHEELS, kit_member
from vllm_patchset.infra.config import Project

HOST = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
        "platform_system": "Linux", "implementation_name": "cpython", "extra": ""}  # fmt: skip


def pins(wheels: tuple[str, ...]) -> dict[str, Version]:
    pairs = (w.split("==") for w in wheels)
    return {canonicalize_name(name): Version(version) for name, version in pairs}


def needed(requirements: list[str]) -> list[Requirement]:
    reqs = [Requirement(r) for r in requirements]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(HOST)]


def test_tool_wheels_are_the_project_dependencies_resolved() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pinned = pins(TOOL_WHEELS)
    todo = needed(project["dependencies"])
    seen = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req}: not among the kit's wheels for vllm-patchset"
        assert req.specifier.contains(pinned[name], prereleases=True), (req, pinned[name])
        if name not in seen:
            seen.add(name)
            todo += needed(importlib.metadata.requires(req.name) or [])
    assert seen == set(pinned), f"pinned but needed by nothing: {set(pinned) - seen}"


def test_engine_wheels_hold_both_lists_once() -> None:
    assert ENGINE_WHEELS == VLLM_WHEELS + TOOL_WHEELS
    assert len(pins(ENGINE_WHEELS)) == len(ENGINE_WHEELS)


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


def test_pin_wheel_is_the_index_s(project, cache_dir: Path) -> None:
    """The pin's wheel, from the cache, checked against the package index's sha256."""
    from vllm_patchset.gpu.kitbuild import pin_wheel

    install_pristine(cache_dir)  # the wheel is in the test cache already
    wheel, sha256 = pin_wheel(project)
    assert wheel == cache_dir / "wheels" / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert sha256 == "2d2831aeba311292250df0132dbc4d8e9f42c654536eaec48e6fe58acb1822cf"
    assert kitparts.sha256_file(wheel) == sha256


def test_part_mib_sizes_the_parts(
    tiny: Project,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`kit build --part-mib 1`: parts of 1 MiB (the last what is left), each checked by
    `verify`: a channel that carries a kit part beside other files takes smaller parts."""
    extension = random.Random(1).randbytes(5 * 2**19)  # 2.5 MiB that xz cannot shrink
    files = {**WHEEL_FILES, "vllm/_moe_C_stable_libtorch.abi3.so": extension}
    wheel = make_wheel(tmp_path / "vllm-1.0-cp38-abi3-manylinux_2_28_x86_64.whl", files)
    monkeypatch.setattr(kitbuild, "pin_wheel", lambda project, platform: (wheel, "ab" * 32))
    out = tmp_path / "kit"
    argv = ["--project", str(tiny.root), "kit", "build", "--no-wheels", "--level", "0"]
    assert main([*argv, "--part-mib", "1", "--out", str(out)]) == 0
    sizes = [part.size for part in kitparts.verify(out).parts]
    assert sizes[:-1] == [2**20, 2**20] and 0 < sizes[-1] <= 2**20
    assert capsys.readouterr().out.splitlines()[0].startswith(f"wrote {out}: 3 parts, ")
    assert KIT_PART_MIB * 2**20 == kitparts.PART_LIMIT  # the default is the format's limit


@pytest.mark.parametrize("text", ["0", "61", "x", "", "-1"])
def test_part_mib_out_of_range_is_refused(
    tiny: Project, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused when the line is parsed, in one line: no build folder claimed, nothing written."""
    assert main(["--project", str(tiny.root), "kit", "build", "--part-mib", text]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"vllm-patchset: kit build: argument --part-mib: {text} MiB is not in 1..60"
        " (see `vllm-patchset kit build --help`)"
    ]
    assert not (tiny.root / "build").exists()
