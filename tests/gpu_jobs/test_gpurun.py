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


def test_a_tree_that_does_not_import_says_why(tmp_path: Path, capsys) -> None:
    """pytest stopped before its report (here a stand-in interpreter that prints what pytest
    printed on a GPU host whose 0.21.0 tree lacked gguf): the run prints the log's last line,
    and the tree is unmet, also where it expects nothing of its own."""
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\necho 'INTERNALERROR>     import gguf'\n"
        "echo \"INTERNALERROR> ModuleNotFoundError: No module named 'gguf'\"\necho\nexit 3\n"
    )
    fake.chmod(0o755)
    expect = (gpurun.Expectation("tests/gpu/test_a.py::test_x", "red", "bug"),)
    trees = [
        gpurun.TreeSpec("buggy", "trees/buggy", ("tests/gpu",), expect),
        gpurun.TreeSpec("more", "trees/buggy", ("tests/gpu",), ()),
    ]
    gpurun.write_manifest(tmp_path, trees)
    (tmp_path / "trees" / "buggy").mkdir(parents=True)
    assert gpurun.main([str(tmp_path), "--python", str(fake)]) == 1
    out = capsys.readouterr().out.splitlines()
    log = tmp_path / "results" / "buggy.log"
    assert out[0].startswith("buggy: {'mode': 'pytest did not finish'} (")  # then its seconds
    assert out[1] == f"buggy: ModuleNotFoundError: No module named 'gguf' (the log: {log})"
    assert [" ".join(line.split()) for line in out[5:]] == [
        "buggy pytest did not finish ? test_a.py::test_x red not run UNMET",
        "buggy pytest did not finish ? pytest finished did not finish UNMET",
        "more pytest did not finish ? pytest finished did not finish UNMET",
        "0 expectations met, 3 unmet",
    ]
