"""validate / gpurun / bundle on the CPU: the trees and expectations they build from the real
patches and vLLM releases, the outcome rules, and the offline bundle. The GPU run itself is
tests/gpu (see issue 5's notes for the H200 table)."""

from __future__ import annotations

import json
import lzma
import tarfile
import zipfile
from pathlib import Path

import pytest
from support import NIGHTLY_LINE_BUGGY, NIGHTLY_LINE_FIXED, ORACLE, export_committed
from vllm_patchset import gpurun
from vllm_patchset.bundle import NAME, _pinned, make_bundle
from vllm_patchset.config import Project
from vllm_patchset.overlay import patches_for
from vllm_patchset.upstream import Mirror
from vllm_patchset.validate import build_trees

FIX1 = "tests/gpu/test_fix1_e2m1_device.py::test_emulation_convert_without_weight_attr_then_graph_capture"
FIX2 = "tests/gpu/test_fix2_deferred_quant_capture.py::test_deferred_fp8_static_scale_graph_capture"
FIX1_PATCH = "upstreamed/0001-nvfp4-oracle-take-the-E2M1-table-s-device-from-w13.patch"


def _with_gpu_tests(project: Project) -> Project:
    export_committed(["tests/gpu"], project.root)
    return project


def test_reversed_fix1_on_0_21_0_is_the_nightly_bug(mirror: Mirror, project: Project) -> None:
    (fix1,) = (p for p in patches_for(project) if p.key == FIX1_PATCH)
    release = mirror.release("0.21.0")
    pristine = mirror.repo.tree_of(release.commit)
    buggy = mirror.repo.apply_to_tree(pristine, fix1.raw, reverse=True)
    text = mirror.repo.read_blob(buggy, ORACLE)
    assert text is not None
    assert text.decode().count(NIGHTLY_LINE_BUGGY) == 1
    assert NIGHTLY_LINE_FIXED not in text.decode()
    # Re-applying the fix gives back v0.21.0 exactly.
    assert mirror.repo.apply_to_tree(buggy, fix1.raw) == pristine


def test_build_trees_and_expectations(project: Project, tmp_path: Path) -> None:
    built = build_trees(_with_gpu_tests(project), tmp_path / "gpu")
    specs = {s.name: s for s in built.specs}
    assert list(specs) == [
        "pristine-0.24.0",
        "overlay-0.24.0",
        "buggy-0001-0.21.0",
        "fixed-0001-0.21.0",
    ]
    expect = {name: {e.test: e.expect for e in s.expectations} for name, s in specs.items()}
    assert expect["pristine-0.24.0"][FIX1] == "green"  # upstream since 0.21.0
    assert expect["pristine-0.24.0"][FIX2] == "red"
    assert expect["buggy-0001-0.21.0"] == {FIX1: "red"}
    assert expect["fixed-0001-0.21.0"] == {FIX1: "green"}
    # Every series patch: red on the pristine pin, green on the overlay.
    for patch in patches_for(project):
        for test in patch.trailers.regression_tests:
            assert expect["overlay-0.24.0"][test] == "green"
            if not patch.key.startswith("upstreamed/"):
                assert expect["pristine-0.24.0"][test] == "red"
    assert specs["pristine-0.24.0"].select == ("tests/gpu",)
    assert specs["buggy-0001-0.21.0"].select == (FIX1,)
    # Only the pin's trees take a native-ops kit's compiled extensions.
    assert {name: s.native for name, s in specs.items()} == {
        "pristine-0.24.0": True,
        "overlay-0.24.0": True,
        "buggy-0001-0.21.0": False,
        "fixed-0001-0.21.0": False,
    }

    root = built.root
    assert gpurun.load_manifest(root) == list(built.specs)
    for name, version in (("pristine-0.24.0", "0.24.0"), ("buggy-0001-0.21.0", "0.21.0")):
        metadata = root / "trees" / name / f"vllm-{version}.dist-info" / "METADATA"
        assert metadata.read_text() == f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    oracle = {name: (root / "trees" / name / ORACLE).read_text() for name in specs}
    assert NIGHTLY_LINE_BUGGY in oracle["buggy-0001-0.21.0"]
    assert NIGHTLY_LINE_FIXED in oracle["fixed-0001-0.21.0"]
    info = json.loads((root / "trees" / "overlay-0.24.0" / "vllm-patchset-tree.json").read_text())
    assert info["kind"] == "overlay"
    assert info["patches"] == [p.key for p in patches_for(project) if p.key != FIX1_PATCH]
    assert (root / "tests" / "gpu" / "standins.py").is_file()
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
    report = {"vllm": {"mode": "standin", "version": "0.24.0"}, "outcomes": OUTCOMES}
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
def test_bundle_without_wheels(project: Project, tmp_path: Path) -> None:
    archive = make_bundle(_with_gpu_tests(project), tmp_path / "b.tar.xz", wheels=False, level=0)
    assert archive.stat().st_size < 64 * 1024 * 1024
    with lzma.open(archive) as xz, tarfile.open(fileobj=xz) as tar:
        names = set(tar.getnames())
        run_sh = tar.extractfile(f"{NAME}/run.sh")
        assert run_sh is not None
        script = run_sh.read().decode()
        assert script.rstrip().endswith('exec "$PY" gpurun.py . "$@"')
        assert "KIT=${VLLM_PATCHSET_KIT:-../vllm-patchset-kit}" in script
        manifest = tar.extractfile(f"{NAME}/manifest.json")
        assert manifest is not None
        native = {t["name"]: t["native"] for t in json.load(manifest)["trees"]}
    names_needed = ("gpurun.py", "kitparts.py", "manifest.json", "pytest.ini", "README.txt")
    for name in (*names_needed, "tests/gpu/conftest.py"):
        assert f"{NAME}/{name}" in names
    assert f"{NAME}/trees/buggy-0001-0.21.0/{ORACLE}" in names
    assert not any(n.startswith(f"{NAME}/wheels") for n in names)
    assert native == {
        "pristine-0.24.0": True,
        "overlay-0.24.0": True,
        "buggy-0001-0.21.0": False,
        "fixed-0001-0.21.0": False,
    }
    assert not (tmp_path / "vllm-patchset-kit").exists()


def test_bundle_with_kit(project: Project, tmp_path: Path) -> None:
    from test_kit import WHEEL_FILES, make_wheel
    from vllm_patchset.kit import write_kit

    wheel = make_wheel(tmp_path / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl", WHEEL_FILES)
    kit = tmp_path / "kit"
    write_kit(wheel, "ab" * 32, "0.24.0", kit, level=0, part_limit=4096)
    out = tmp_path / "out" / "b.tar.xz"
    make_bundle(_with_gpu_tests(project), out, wheels=False, level=0, kit=kit)
    copied = out.parent / "vllm-patchset-kit"
    assert sorted(p.name for p in out.parent.iterdir()) == ["b.tar.xz", "vllm-patchset-kit"]
    assert {p.name: p.read_bytes() for p in copied.iterdir()} == {
        p.name: p.read_bytes() for p in kit.iterdir()
    }


def test_bundle_with_a_broken_kit_writes_nothing(project: Project, tmp_path: Path) -> None:
    from test_kit import WHEEL_FILES, make_wheel
    from vllm_patchset.errors import Finding
    from vllm_patchset.kit import write_kit

    wheel = make_wheel(tmp_path / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl", WHEEL_FILES)
    kit = tmp_path / "kit"
    write_kit(wheel, "ab" * 32, "0.24.0", kit, level=0, part_limit=4096)
    (kit / "kit.tar.xz.01").unlink()
    out = tmp_path / "out" / "b.tar.xz"
    with pytest.raises(Finding, match=r"^kit part kit.tar.xz.01 is missing from "):
        make_bundle(_with_gpu_tests(project), out, wheels=False, level=0, kit=kit)
    assert not out.parent.exists()


VALIDATE_KIT_CASES = [
    (None, 0, ""),
    ("kit.tar.xz.01", 1, "vllm-patchset: kit part kit.tar.xz.01 is missing from {kit}\n"),
]


@pytest.mark.parametrize(("remove", "code", "stderr_end"), VALIDATE_KIT_CASES)
def test_validate_with_a_kit(
    project: Project,
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
    from vllm_patchset.kit import write_kit

    wheel = make_wheel(tmp_path / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl", WHEEL_FILES)
    kit = tmp_path / "kit"
    write_kit(wheel, "ab" * 32, "0.24.0", kit, level=0, part_limit=4096)
    if remove:
        (kit / remove).unlink()
    work = tmp_path / "work"
    args = ["--project", str(_with_gpu_tests(project).root), "validate", "--work", str(work)]
    assert main([*args, "--build-only", "--kit", str(kit)]) == code
    err = capsys.readouterr().err
    assert err.endswith(stderr_end.format(kit=kit))
    native = work / "native" / "site" / "vllm" / "_C_stable_libtorch.abi3.so"
    assert native.is_file() == (code == 0)
    if code == 0:
        assert f"native ops for the pin's trees from {work / 'native' / 'site'}\n" in err
