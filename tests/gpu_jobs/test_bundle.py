"""`gpu/bundle.py`: the offline bundle written (without wheels, with a kit, with a broken kit:
nothing written), the pinned pydantic-core, the README's tree lines."""

from __future__ import annotations

import json
import lzma
import tarfile
import zipfile
from pathlib import Path

import pytest
from support import with_gpu_tests
from synthetic import UTILS
from vllm_patchset.gpu import BUNDLE_NAME, bundle, gpurun
from vllm_patchset.gpu.bundle import _pinned, make_bundle
from vllm_patchset.infra.config import Project


def test_pinned_requirement(tmp_path: Path) -> None:
    wheel = tmp_path / "pydantic-2.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(
            "pydantic-2.0.dist-info/METADATA",
            "Name: pydantic\nRequires-Dist: typing-extensions>=4\n"
            "Requires-Dist: pydantic-core==2.50.5\n",
        )
    assert _pinned(wheel, "pydantic-core") == "pydantic-core==2.50.5"


# xz level 0 in the tests: the archive's size is not under test, and level 9 takes minutes.
def test_bundle_without_wheels(tiny: Project, tmp_path: Path) -> None:
    archive = make_bundle(with_gpu_tests(tiny), tmp_path / "b.tar.xz", wheels=False, level=0)
    assert archive.stat().st_size < 64 * 1024 * 1024
    with lzma.open(archive) as xz, tarfile.open(fileobj=xz) as tar:
        names = set(tar.getnames())
        run_sh = tar.extractfile(f"{BUNDLE_NAME}/run.sh")
        assert run_sh is not None
        script = run_sh.read().decode()
        assert script.rstrip().endswith('exec "$PY" gpurun.py . "$@"')
        assert "KIT=${VLLM_PATCHSET_KIT:-../vllm-patchset-kit}" in script
        manifest = tar.extractfile(f"{BUNDLE_NAME}/manifest.json")
        assert manifest is not None
        native = {t["name"]: t["native"] for t in json.load(manifest)["trees"]}
    names_needed = ("gpurun.py", "kitparts.py", "manifest.json", "pytest.ini", "README.txt")
    imported = ("archives.py", "jsonfile.py", "interrupts.py")  # what the two scripts import
    for name in (*names_needed, *imported, "tests/gpu/conftest.py"):
        assert f"{BUNDLE_NAME}/{name}" in names
    assert f"{BUNDLE_NAME}/trees/buggy-0001-1.0/{UTILS}" in names
    assert not any(n.startswith(f"{BUNDLE_NAME}/wheels") for n in names)
    assert native == {
        "pristine-1.0": True,
        "overlay-1.0": True,
        "buggy-0001-1.0": False,
        "fixed-0001-1.0": False,
    }
    assert not (tmp_path / "vllm-patchset-kit").exists()


def test_bundle_with_kit(tiny: Project, tmp_path: Path) -> None:
    from kits import WHEEL_FILES, make_wheel
    from vllm_patchset.gpu.kitbuild import write_kit

    wheel = make_wheel(tmp_path / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl", WHEEL_FILES)
    kit = tmp_path / "kit"
    write_kit(wheel, "ab" * 32, "0.24.0", kit, level=0, part_limit=4096)
    out = tmp_path / "out" / "b.tar.xz"
    make_bundle(with_gpu_tests(tiny), out, wheels=False, level=0, kit=kit)
    copied = out.parent / "vllm-patchset-kit"
    assert sorted(p.name for p in out.parent.iterdir()) == ["b.tar.xz", "vllm-patchset-kit"]
    assert {p.name: p.read_bytes() for p in copied.iterdir()} == {
        p.name: p.read_bytes() for p in kit.iterdir()
    }


def test_bundle_with_a_broken_kit_writes_nothing(tiny: Project, tmp_path: Path) -> None:
    from kits import WHEEL_FILES, make_wheel
    from vllm_patchset.errors import Finding
    from vllm_patchset.gpu.kitbuild import write_kit

    wheel = make_wheel(tmp_path / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl", WHEEL_FILES)
    kit = tmp_path / "kit"
    write_kit(wheel, "ab" * 32, "0.24.0", kit, level=0, part_limit=4096)
    (kit / "kit.tar.xz.01").unlink()
    out = tmp_path / "out" / "b.tar.xz"
    with pytest.raises(Finding, match=r"^kit part kit.tar.xz.01 is missing from "):
        make_bundle(with_gpu_tests(tiny), out, wheels=False, level=0, kit=kit)
    assert not out.parent.exists()


def test_the_readme_names_each_tree_s_expectations() -> None:
    expect = (gpurun.Expectation("tests/gpu/test_a.py::test_x", "red", "bug"),)
    specs = [
        gpurun.TreeSpec("pristine-1.0", "trees/pristine-1.0", ("tests/gpu",), expect),
        gpurun.TreeSpec("buggy-0001-1.1", "trees/buggy-0001-1.1", (), (), skipped="no reverse"),
    ]
    text = bundle.readme("b.tar.xz", specs)
    assert "    tar -xJf b.tar.xz && sh vllm-patchset-gpu/run.sh\n" in text
    assert text.endswith(
        "Trees:\n  pristine-1.0: test_x red\n  buggy-0001-1.1: not built: no reverse\n"
    )
