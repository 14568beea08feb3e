"""`validate` on synthetic upstreams (tests/synthetic.py): the trees of an archived patch when
upstream merged the same fix, and when it fixed the bug in other words (what `rebase
--resolve-upstream` archives). No GPU: the trees and the manifest are built, and gpurun reports
a tree that could not be built without running pytest."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from synthetic import BUGGY, FIXED, MOE, MOE_TEXT, PatchSpec, SyntheticUpstream, make_project
from vllm_patchset.cli import main
from vllm_patchset.gpu import gpurun
from vllm_patchset.gpu import validate as validate_trees
from vllm_patchset.infra import fsio

OTHER_WORDS = "        scale = self.a1_gscale if self.a1_scale is None else self.a1_scale\n"


TEST = "tests/gpu/test_synthetic.py::test_fix"


# Archived: upstream merged it in 1.1 (written on 1.0, where the bug is).
FIX = PatchSpec(
    "0001-moe-no-tensor-truthiness.patch",
    {MOE: (BUGGY, FIXED)},
    subject="moe: no tensor truthiness",
    applied_upstream="1.1",
    regression_test=TEST,
    base="1.0",
)


PYTEST = '\n[tool.pytest.ini_options]\naddopts = "-ra"\nmarkers = ["gpu: needs a GPU"]\n'


NOT_REVERSED = (
    f"upstreamed/{FIX.name} does not reverse on 1.1 (upstream fixed the bug in other words):"
    " no tree with the bug to run its regression tests on"
)


def validated(
    tmp_path: Path, cache: Path, release_1_1: str, capsys, pytest_settings: str = PYTEST
) -> tuple[int, str, Path]:
    """A project pinned to 1.1 (1.0 with `release_1_1` for the buggy line) that archives FIX;
    `validate --build-only`: (exit code, stderr, the work folder)."""
    upstream = SyntheticUpstream(tmp_path / "upstream")
    upstream.release("1.0", {"vllm/__init__.py": '__version__ = "1.0"\n', MOE: MOE_TEXT})
    upstream.release("1.1", {MOE: MOE_TEXT.replace(BUGGY, release_1_1)})
    project = make_project(
        tmp_path / "project",
        cache,
        upstream,
        "1.1",
        upstreamed=[FIX],
        extra_pyproject=pytest_settings,
    )
    gpu_tests = project.root / "tests" / "gpu"
    gpu_tests.mkdir(parents=True)
    (gpu_tests / "test_synthetic.py").write_text("def test_fix():\n    pass\n")
    work = tmp_path / "work"
    code = main(["--project", str(project.root), "validate", "--build-only", "--work", str(work)])
    out, err = capsys.readouterr()
    assert out == ""
    return code, err, work


@pytest.mark.parametrize(
    ("addopts", "why"),
    [('"-ra \'x"', "No closing quotation"), ("3", "not a string or a list of strings")],
)
def test_addopts_that_are_no_command_line_are_one_line(
    tmp_path: Path,
    synthetic_cache: Path,
    capsys: pytest.CaptureFixture[str],
    addopts: str,
    why: str,
) -> None:
    """Was: a traceback (shlex) half-way through the build; now refused before anything is
    written."""
    settings = f"\n[tool.pytest.ini_options]\naddopts = {addopts}\n"
    code, err, work = validated(tmp_path, synthetic_cache, FIXED, capsys, pytest_settings=settings)
    pyproject = tmp_path / "project" / "pyproject.toml"
    assert (code, err.count("\n"), work.exists()) == (2, 1, False)
    assert err.startswith(f"vllm-patchset: {pyproject}: [tool.pytest.ini_options] addopts ")
    assert err.endswith(f": {why}\n")


def test_merged_as_is_gets_a_buggy_and_a_fixed_tree(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No [tool.pytest.ini_options] in this project (was a KeyError): pytest's defaults.
    code, err, work = validated(tmp_path, synthetic_cache, FIXED, capsys, pytest_settings="")
    assert (
        work / "pytest.ini"
    ).read_text() == "[pytest]\naddopts = \nmarkers =\nfilterwarnings =\n"
    assert (code, err) == (
        0,
        "tree pristine-1.1: trees/pristine-1.1\n"
        "tree overlay-1.1: trees/overlay-1.1\n"
        "tree buggy-0001-1.1: trees/buggy-0001-1.1\n"
        "tree fixed-0001-1.1: trees/fixed-0001-1.1\n",
    )
    buggy = (work / "trees" / "buggy-0001-1.1" / MOE).read_text()
    assert buggy == MOE_TEXT  # 1.1 with the fix reversed: the bug is back
    assert (work / "trees" / "fixed-0001-1.1" / MOE).read_text() == MOE_TEXT.replace(BUGGY, FIXED)


def test_fixed_in_other_words_skips_the_buggy_tree_with_the_reason(
    tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the reverse apply failed and the whole run stopped (`git apply failed`, exit
    2), the pin's trees unbuilt."""
    code, err, work = validated(tmp_path, synthetic_cache, OTHER_WORDS, capsys)
    assert (code, err) == (
        0,
        "tree pristine-1.1: trees/pristine-1.1\n"
        "tree overlay-1.1: trees/overlay-1.1\n"
        f"tree buggy-0001-1.1: skipped: {NOT_REVERSED}\n",
    )
    assert sorted(p.name for p in (work / "trees").iterdir()) == ["overlay-1.1", "pristine-1.1"]
    manifest = json.loads((work / "manifest.json").read_text())
    assert manifest["trees"][2] == {
        "name": "buggy-0001-1.1",
        "path": "trees/buggy-0001-1.1",
        "select": [TEST],
        "expectations": [{"test": TEST, "expect": "red", "why": NOT_REVERSED}],
        "native": False,
        "skipped": NOT_REVERSED,
    }
    assert [t["name"] for t in manifest["trees"]] == [
        "pristine-1.1",
        "overlay-1.1",
        "buggy-0001-1.1",
    ]
    assert "skipped" not in manifest["trees"][0]

    # The report: the tree's expectation is not run, with the reason; the run goes on (exit 0).
    assert gpurun.main([str(work), "--only", "buggy-0001-1.1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"buggy-0001-1.1: not built: {NOT_REVERSED}"
    assert out[-1] == "0 expectations met, 0 unmet, 1 on trees not built"
    summary = json.loads((work / "results" / "summary.json").read_text())
    assert summary == {
        "rows": [
            {
                "tree": "buggy-0001-1.1",
                "mode": "not built",
                "vllm": "-",
                "test": TEST,
                "expect": "red",
                "got": "not run",
                "met": True,
                "note": f"not built: {NOT_REVERSED}",
            }
        ],
        "seconds": {},
    }


# Each way the build stops after its first tree: (what stops it, exit code, its words).
BUILD_STOPS = [
    (fsio.Interrupted(signal.SIGINT), 130, "interrupted (SIGINT)"),
    (fsio.Interrupted(signal.SIGTERM), 143, "interrupted (SIGTERM)"),
    (OSError(28, "No space left on device"), 3, "No space left on device"),
]


@pytest.mark.parametrize(("stop", "code", "words"), BUILD_STOPS)
def test_a_build_stopped_midway_leaves_no_half_built_work_folder(
    tmp_path: Path,
    synthetic_cache: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    stop: BaseException,
    code: int,
    words: str,
) -> None:
    """Was: the trees built so far stayed in --work, and the next run refused the folder
    (`exists already: give a new folder`); now it is removed, and the one line says so."""
    write_tree = validate_trees._write_tree
    written: list[Path] = []

    def write_then_stop(*args: object) -> None:
        if written:
            raise stop
        write_tree(*args)  # type: ignore[arg-type]
        written.append(args[2])  # type: ignore[arg-type]

    monkeypatch.setattr(validate_trees, "_write_tree", write_then_stop)
    got, err, work = validated(tmp_path, synthetic_cache, FIXED, capsys)
    assert (got, err, work.exists()) == (
        code,
        f"vllm-patchset: {words}; removed the half-built {work}\n",
        False,
    )
    assert written  # the first tree was there before it stopped
