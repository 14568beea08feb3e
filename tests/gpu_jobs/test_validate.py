"""`gpu/validate.py` on the CPU: the trees and expectations it builds (on the synthetic story;
the real series' in test_real_series.py), and its pure parts (the pin's expectations, pytest's
options without pytest-xdist's). The GPU run itself is tests/gpu."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import with_gpu_tests
from synthetic import CLAMP_BUG, STORY_ARCHIVED, STORY_FIX, STORY_LOCAL, UTILS, Story
from vllm_patchset.gpu import gpurun, validate
from vllm_patchset.gpu.validate import build_trees
from vllm_patchset.infra.config import Project

ARCHIVED = f"upstreamed/{STORY_ARCHIVED.name}"


TREES = ["pristine-1.0", "overlay-1.0", "buggy-0001-1.0", "fixed-0001-1.0"]


def test_build_trees_and_expectations(tiny: Project, story: Story, tmp_path: Path) -> None:
    """On the story: the pin's pristine tree, where each series patch's regression test is red
    and the archived patch's green (upstream there); the overlaid tree, all green; the
    archived patch reversed on the release that merged it (red), and applied again (green)."""
    built = build_trees(with_gpu_tests(tiny), tmp_path / "gpu")
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


@pytest.mark.parametrize(
    ("addopts", "kept"),
    [
        ("-ra -n auto --maxprocesses 8 --dist loadfile --strict-markers", "-ra --strict-markers"),
        ("-nauto -ra --dist=load --numprocesses=2", "-ra"),
        ("-ra --strict-markers", "-ra --strict-markers"),
        (["-ra", "-n", "auto", "-k", "a b"], "-ra -k 'a b'"),
        ("", ""),
    ],
)
def test_the_gpu_run_is_serial(addopts: str | list[str], kept: str) -> None:
    """The bundle's pytest.ini keeps the project's options but pytest-xdist's (a GPU host has
    one pytest process per tree, and may have no pytest-xdist: `-n` was an unknown option)."""
    assert validate.serial(addopts) == kept
