"""`gpu/gpurun.py` on the CPU: the outcome rules, the rows of a tree's check, the extensions
linked in from a native kit, and its refusals as exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_patchset.gpu import gpurun

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
