"""`gpu/gpurun.py` on the CPU: the outcome rules, the rows of a tree's check, the extensions
linked in from a native kit, and its refusals as exit codes."""

from __future__ import annotations

import json
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


def test_an_only_that_names_no_tree_is_bad_usage(tmp_path: Path, capsys) -> None:
    """Before: an --only naming no tree of the manifest was passed over in silence, and a run
    of `--only overlay-0.24.0 --only overlay-0.24.0-shape_tables` ran the first alone."""
    trees = [gpurun.TreeSpec(name, f"trees/{name}", ("tests/gpu",), ()) for name in ("a", "b")]
    gpurun.write_manifest(tmp_path, trees)
    assert gpurun.main([str(tmp_path), "--only", "a", "--only", "a-more"]) == 2
    assert capsys.readouterr().err == "gpurun: no tree a-more in manifest.json (its trees: a, b)\n"
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "1/", "/2", "a/b", "1/2/3", "-1/2", ""])
def test_a_part_that_is_no_k_of_n_is_bad_usage(tmp_path: Path, text: str, capsys) -> None:
    gpurun.write_manifest(tmp_path, [])
    assert gpurun.main([str(tmp_path), f"--part={text}"]) == 2
    err = f"gpurun: --part takes K/N with 1 <= K <= N, not {text!r}\n"
    assert capsys.readouterr().err == err
    assert not (tmp_path / "results").exists()


# Collected ids as tests/gpu's are: one test of many parametrizations among single ones.
IDS = [f"tests/gpu/test_a.py::test_x[{i}]" for i in range(5)] + [
    f"tests/gpu/test_b.py::test_{name}" for name in "pqrstu"
]


@pytest.mark.parametrize("n", range(1, len(IDS) + 2))
@pytest.mark.parametrize("whole", [frozenset(), frozenset({"tests/gpu/test_a.py::test_x"})])
def test_the_parts_hold_each_test_once_in_order(n: int, whole: frozenset[str]) -> None:
    parts = [gpurun.Part(k, n).of(IDS, whole) for k in range(1, n + 1)]
    assert [node for part in parts for node in part] == IDS
    x_parts = [k for k, part in enumerate(parts) if any("test_x" in node for node in part)]
    if whole:  # every parametrization of an expected test where its first one falls
        assert x_parts == [0]
    else:  # the K-th part: the ids from the (K-1)/N to the K/N point
        assert x_parts == sorted({i * n // len(IDS) for i in range(5)})


CONFTEST = """
import json, os
outcomes = {}
def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        outcomes[report.nodeid] = report.outcome
def pytest_collectreport(report):
    if report.skipped:
        outcomes[report.nodeid] = "skipped"
def pytest_sessionfinish(session):
    path = os.environ.get("VLLM_PATCHSET_GPU_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"vllm": {"mode": "standin", "version": "1.0"}, "outcomes": outcomes}, f)
"""

TESTS = """
import pytest
@pytest.mark.parametrize("n", [1, 2, 3])
def test_x(n):
    assert n != 3  # the bug: red
def test_y():
    pass
def test_z():
    pass
def test_w():
    pass
"""


def test_parts_run_the_whole_selection_once(tmp_path: Path, capsys) -> None:
    """A tree in two calls (--part 1/2, then 2/2) runs each collected test once; the expected
    test's three parametrizations stay together and are judged in the part that runs them,
    the other part noting it."""
    gpu = tmp_path / "tests" / "gpu"
    gpu.mkdir(parents=True)
    (gpu / "conftest.py").write_text(CONFTEST)
    (gpu / "test_a.py").write_text(TESTS)
    (tmp_path / "trees" / "t").mkdir(parents=True)
    expect = (gpurun.Expectation("tests/gpu/test_a.py::test_x", "red", "the bug"),)
    gpurun.write_manifest(tmp_path, [gpurun.TreeSpec("t", "trees/t", ("tests/gpu",), expect)])
    rows = {}
    for k in (1, 2):
        out = tmp_path / f"out{k}"
        assert gpurun.main([str(tmp_path), "--part", f"{k}/2", "--out", str(out)]) == 0
        lines = capsys.readouterr().out.splitlines()
        rows[k] = [" ".join(line.split()) for line in lines[3:]]
        assert lines[1] == f"t: part {k} of 2: 3 of 6 tests"
        report = json.loads((out / f"t.part{k}of2.json").read_text())
        names = ("x[1]", "x[2]", "x[3]") if k == 1 else ("w", "y", "z")
        assert sorted(report["outcomes"]) == [f"tests/gpu/test_a.py::test_{n}" for n in names]
    assert rows[1] == [
        "t standin 1.0 test_a.py::test_x red red ok",
        "1 expectations met, 0 unmet",
    ]
    assert rows[2] == [
        "t standin 1.0 test_a.py::test_x red not run other part",
        "t standin 1.0 test_a.py::test_w green|skip green ok",
        "t standin 1.0 test_a.py::test_y green|skip green ok",
        "t standin 1.0 test_a.py::test_z green|skip green ok",
        "3 expectations met, 0 unmet, 1 in other parts",
    ]


def test_a_part_of_nothing_collected_runs_the_selection(tmp_path: Path, capsys) -> None:
    """Every module skipped itself (as on a host without a GPU): nothing to divide, so the
    part runs the whole selection and its report says why, as a run without --part does."""
    gpu = tmp_path / "tests" / "gpu"
    gpu.mkdir(parents=True)
    (gpu / "conftest.py").write_text(CONFTEST)
    skips = "import pytest\npytest.skip('no GPU', allow_module_level=True)\n"
    (gpu / "test_a.py").write_text(skips + TESTS)
    (tmp_path / "trees" / "t").mkdir(parents=True)
    expect = (gpurun.Expectation("tests/gpu/test_a.py::test_x", "red", "the bug"),)
    gpurun.write_manifest(tmp_path, [gpurun.TreeSpec("t", "trees/t", ("tests/gpu",), expect)])
    assert gpurun.main([str(tmp_path), "--part", "2/3"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "t: part 2 of 3: 0 of 0 tests"
    assert [" ".join(line.split()) for line in lines[3:]] == [
        "t standin 1.0 test_a.py::test_x red skip UNMET",
        "0 expectations met, 1 unmet",
    ]
    report = json.loads((tmp_path / "results" / "t.part2of3.json").read_text())
    assert report["outcomes"] == {"tests/gpu/test_a.py": "skipped"}
