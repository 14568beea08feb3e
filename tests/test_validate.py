"""validate / gpurun / bundle on the CPU: the trees and expectations they build (on the
synthetic story; the real series' in test_real_series.py), the outcome rules, and the offline
bundle. The GPU run itself is tests/gpu."""

from __future__ import annotations

import json
import lzma
import tarfile
import zipfile
from pathlib import Path

import pytest
from support import export_committed
from synthetic import CLAMP_BUG, STORY_ARCHIVED, STORY_FIX, STORY_LOCAL, UTILS, Story
from vllm_patchset.gpu import BUNDLE_NAME, gpurun
from vllm_patchset.gpu.bundle import _pinned, make_bundle
from vllm_patchset.gpu.validate import build_trees
from vllm_patchset.infra.config import Project

ARCHIVED = f"upstreamed/{STORY_ARCHIVED.name}"
TREES = ["pristine-1.0", "overlay-1.0", "buggy-0001-1.0", "fixed-0001-1.0"]


def _with_gpu_tests(project: Project) -> Project:
    """The project with this project's committed tests/gpu (what validate ships and runs)."""
    export_committed(["tests/gpu"], project.root)
    return project


def test_build_trees_and_expectations(tiny: Project, story: Story, tmp_path: Path) -> None:
    """On the story: the pin's pristine tree, where each series patch's regression test is red
    and the archived patch's green (upstream there); the overlaid tree, all green; the
    archived patch reversed on the release that merged it (red), and applied again (green)."""
    built = build_trees(_with_gpu_tests(tiny), tmp_path / "gpu")
    specs = {s.name: s for s in built.specs}
    assert list(specs) == TREES
    expect = {name: {e.test: e.expect for e in s.expectations} for name, s in specs.items()}
    fix, local, archived = (s.regression_test for s in (STORY_FIX, STORY_LOCAL, STORY_ARCHIVED))
    assert expect == {
        "pristine-1.0": {archived: "green", fix: "red", local: "red"},
        "overlay-1.0": {archived: "green", fix: "green", local: "green"},
        "buggy-0001-1.0": {archived: "red"},
        "fixed-0001-1.0": {archived: "green"},
    }
    assert specs["pristine-1.0"].select == ("tests/gpu",)
    assert specs["buggy-0001-1.0"].select == (archived,)
    # Only the pin's trees take a native-ops kit's compiled extensions.
    assert {name: s.native for name, s in specs.items()} == {
        "pristine-1.0": True,
        "overlay-1.0": True,
        "buggy-0001-1.0": False,
        "fixed-0001-1.0": False,
    }

    root = built.root
    assert gpurun.load_manifest(root) == list(built.specs)
    metadata = root / "trees" / "pristine-1.0" / "vllm-1.0.dist-info" / "METADATA"
    assert metadata.read_text() == "Metadata-Version: 2.1\nName: vllm\nVersion: 1.0\n"
    utils = {name: (root / "trees" / name / UTILS).read_text() for name in specs}
    assert CLAMP_BUG in utils["buggy-0001-1.0"]
    assert utils["fixed-0001-1.0"] == utils["pristine-1.0"] == story.upstream.files("1.0")[UTILS]
    info = json.loads((root / "trees" / "overlay-1.0" / "vllm-patchset-tree.json").read_text())
    assert (info["kind"], info["patches"]) == ("overlay", [STORY_FIX.name, STORY_LOCAL.name])
    info = json.loads((root / "trees" / "buggy-0001-1.0" / "vllm-patchset-tree.json").read_text())
    assert (info["kind"], info["label"]) == ("nightly-like", f"1.0 with {ARCHIVED} reversed")
    assert (root / "tests" / "gpu" / "conftest.py").is_file()
    ini = (root / "pytest.ini").read_text()
    assert "    gpu: needs a CUDA or ROCm GPU" in ini
    assert "filterwarnings =\n    error\n" in ini


OUTCOMES = {
    "tests/gpu/test_a.py::test_x[1]": "passed",
    "tests/gpu/test_a.py::test_x[2]": "failed",
    "tests/gpu/test_a.py::test_y": "passed",
    "tests/gpu/test_a.py::test_z": "skipped",
    "tests/gpu/test_b.py": "error",
    "tests/gpu/test_c.py::test_w": "error",
}
OUTCOME_CASES = [
    ("tests/gpu/test_a.py::test_x", "red"),
    ("tests/gpu/test_a.py::test_y", "green"),
    ("tests/gpu/test_a.py::test_z", "skip"),
    ("tests/gpu/test_b.py::test_v", "error"),  # the module did not import: not red
    ("tests/gpu/test_c.py::test_w", "error"),  # a fixture broke: not red
    ("tests/gpu/test_d.py::test_u", "not run"),
]


@pytest.mark.parametrize(("test", "expected"), OUTCOME_CASES)
def test_outcome_of(test: str, expected: str) -> None:
    assert gpurun.outcome_of(test, OUTCOMES) == expected


def test_check_tree_rows() -> None:
    spec = gpurun.TreeSpec(
        "t",
        "trees/t",
        ("tests/gpu",),
        (
            gpurun.Expectation("tests/gpu/test_a.py::test_x", "red", "bug"),
            gpurun.Expectation("tests/gpu/test_b.py::test_v", "red", "bug"),
        ),
    )
    report: dict[str, object] = {
        "vllm": {"mode": "standin", "version": "0.24.0"},
        "outcomes": OUTCOMES,
    }
    rows = [
        (r.test.split("::")[1], r.expect, r.got, r.met) for r in gpurun.check_tree(spec, report)
    ]
    assert rows == [
        ("test_x", "red", "red", True),
        ("test_v", "red", "error", False),
        ("test_y", "green|skip", "green", True),
        ("test_z", "green|skip", "skip", True),
        ("test_w", "green|skip", "error", False),
    ]


def test_gpurun_without_manifest_is_bad_usage(tmp_path: Path) -> None:
    assert gpurun.main([str(tmp_path)]) == 2


def test_pinned_requirement(tmp_path: Path) -> None:
    wheel = tmp_path / "pydantic-2.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(
            "pydantic-2.0.dist-info/METADATA",
            "Name: pydantic\nRequires-Dist: typing-extensions>=4\n"
            "Requires-Dist: pydantic-core==2.50.5\n",
        )
    assert _pinned(wheel, "pydantic-core") == "pydantic-core==2.50.5"


def test_link_extensions(tmp_path: Path) -> None:
    site, tree = tmp_path / "site", tmp_path / "tree"
    for rel in ("vllm/_C_stable_libtorch.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(rel.encode())
    (site / "vllm" / "__init__.py").write_text("")
    (tree / "vllm" / "vllm_flash_attn").mkdir(parents=True)
    assert gpurun.link_extensions(site, tree) == [
        "vllm/_C_stable_libtorch.abi3.so",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
    ]
    assert (tree / "vllm" / "_C_stable_libtorch.abi3.so").read_bytes() == (
        b"vllm/_C_stable_libtorch.abi3.so"
    )
    assert sorted(p.name for p in (tree / "vllm").iterdir()) == [
        "_C_stable_libtorch.abi3.so",
        "vllm_flash_attn",
    ]
    assert gpurun.link_extensions(site, tree) == []  # already there: kept


def test_gpurun_native_without_vllm_is_bad_usage(tmp_path: Path) -> None:
    gpurun.write_manifest(tmp_path, [])
    assert gpurun.main([str(tmp_path), "--native", str(tmp_path / "nowhere")]) == 2


# xz level 0 in the tests: the archive's size is not under test, and level 9 takes minutes.
def test_bundle_without_wheels(tiny: Project, tmp_path: Path) -> None:
    archive = make_bundle(_with_gpu_tests(tiny), tmp_path / "b.tar.xz", wheels=False, level=0)
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
    for name in (*names_needed, "tests/gpu/conftest.py"):
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
    from test_kit import WHEEL_FILES, make_wheel
    from vllm_patchset.gpu.kitbuild import write_kit

    wheel = make_wheel(tmp_path / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl", WHEEL_FILES)
    kit = tmp_path / "kit"
    write_kit(wheel, "ab" * 32, "0.24.0", kit, level=0, part_limit=4096)
    out = tmp_path / "out" / "b.tar.xz"
    make_bundle(_with_gpu_tests(tiny), out, wheels=False, level=0, kit=kit)
    copied = out.parent / "vllm-patchset-kit"
    assert sorted(p.name for p in out.parent.iterdir()) == ["b.tar.xz", "vllm-patchset-kit"]
    assert {p.name: p.read_bytes() for p in copied.iterdir()} == {
        p.name: p.read_bytes() for p in kit.iterdir()
    }


def test_bundle_with_a_broken_kit_writes_nothing(tiny: Project, tmp_path: Path) -> None:
    from test_kit import WHEEL_FILES, make_wheel
    from vllm_patchset.errors import Finding
    from vllm_patchset.gpu.kitbuild import write_kit

    wheel = make_wheel(tmp_path / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl", WHEEL_FILES)
    kit = tmp_path / "kit"
    write_kit(wheel, "ab" * 32, "0.24.0", kit, level=0, part_limit=4096)
    (kit / "kit.tar.xz.01").unlink()
    out = tmp_path / "out" / "b.tar.xz"
    with pytest.raises(Finding, match=r"^kit part kit.tar.xz.01 is missing from "):
        make_bundle(_with_gpu_tests(tiny), out, wheels=False, level=0, kit=kit)
    assert not out.parent.exists()


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
    from test_kit import WHEEL_FILES, make_wheel
    from vllm_patchset.cli import main
    from vllm_patchset.gpu.kitbuild import write_kit

    wheel = make_wheel(tmp_path / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl", WHEEL_FILES)
    kit = tmp_path / "kit"
    write_kit(wheel, "ab" * 32, "0.24.0", kit, level=0, part_limit=4096)
    if remove:
        (kit / remove).unlink()
    work = tmp_path / "work"
    args = ["--project", str(_with_gpu_tests(tiny).root), "validate", "--work", str(work)]
    assert main([*args, "--build-only", "--kit", str(kit)]) == code
    err = capsys.readouterr().err
    assert err.endswith(stderr_end.format(kit=kit))
    native = work / "native" / "site" / "vllm" / "_C_stable_libtorch.abi3.so"
    assert native.is_file() == (code == 0)
    if code == 0:
        assert f"native ops for the pin's trees from {work / 'native' / 'site'}\n" in err
