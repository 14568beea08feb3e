"""`vllm-patchset validate` (commands/validate.py): --kit assembled beside the trees before
anything runs, a broken kit one line; --only checked against the trees' names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import cli, with_gpu_tests
from vllm_patchset.commands import validate
from vllm_patchset.infra.config import Project

VALIDATE_KIT_CASES = [
    (None, 0, ""),
    ("kit.tar.xz.01", 1, "vllm-patchset: kit part kit.tar.xz.01 is missing from {kit}\n"),
]


@pytest.mark.parametrize(("remove", "code", "stderr_end"), VALIDATE_KIT_CASES)
def test_validate_with_a_kit(
    tiny: Project,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    remove: str | None,
    code: int,
    stderr_end: str,
) -> None:
    """validate --kit assembles the kit beside the trees before running anything; a broken kit
    stops it with one line and no native/ folder."""
    from kits import WHEEL_FILES, make_wheel
    from vllm_patchset.cli import main
    from vllm_patchset.gpu.kitbuild import write_kit

    wheel = make_wheel(tmp_path / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl", WHEEL_FILES)
    kit = tmp_path / "kit"
    write_kit(wheel, "ab" * 32, "0.24.0", kit, level=0, part_limit=4096)
    if remove:
        (kit / remove).unlink()
    work = tmp_path / "work"
    args = ["--project", str(with_gpu_tests(tiny).root), "validate", "--work", str(work)]
    assert main([*args, "--build-only", "--kit", str(kit)]) == code
    err = capsys.readouterr().err
    assert err.endswith(stderr_end.format(kit=kit))
    native = work / "native" / "site" / "vllm" / "_C_stable_libtorch.abi3.so"
    assert native.is_file() == (code == 0)
    if code == 0:
        assert f"native ops for the pin's trees from {work / 'native' / 'site'}\n" in err


# -- the remaining faults ----------------------------------------------------------------------


# -- the remaining faults ----------------------------------------------------------------------
def test_validate_only_an_unknown_tree_is_refused_before_building(
    tiny: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    assert cli(capsys, tiny.root, "validate", "--only", "nope", "--work", work) == (
        2,
        "",
        "vllm-patchset: validate --only nope: no such tree (the trees: pristine-1.0,"
        " overlay-1.0, buggy-0001-1.0, fixed-0001-1.0)\n",
    )
    assert not work.exists()


def test_validate_without_torch_says_so_in_one_line(
    tiny: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    python = tmp_path / "v" / "bin" / "python"
    work = tmp_path / "work"
    argv = ("validate", "--python", python, "--work", work)
    assert cli(capsys, tiny.root, *argv) == (
        2,
        "",
        f"vllm-patchset: validate needs torch (and a GPU): {python} cannot import it"
        " (ModuleNotFoundError: No module named 'torch'); run it where they are (--python EXE),"
        " or take the trees there with `vllm-patchset bundle`\n",
    )
    assert not work.exists()


TREES = ["pristine-1.0", "overlay-1.0"]
UNKNOWN = [
    ([], None),
    (["overlay-1.0"], None),
    (["overlay-1.0", "buggy", "other"], "validate --only buggy: no such tree (the trees: pristine-1.0, overlay-1.0)"),
]  # fmt: skip


@pytest.mark.parametrize(("only", "refusal"), UNKNOWN)
def test_the_first_only_that_names_no_tree(only: list[str], refusal: str | None) -> None:
    assert validate.unknown_tree(TREES, only) == refusal
