"""The folders the suite puts at the front of ``sys.path`` (tests/ by pytest's rootdir conftest,
tests/gpu/ and benchmarks/ by the modules that import their helpers) hide any installed module
of the same top-level name. A helper named like an installed distribution breaks whatever
imports that distribution in the same process: transformers 5.25.0 (2026-12-01) depends on
``kernels`` and imports it, and found the suite's own tests/kernels.py instead (ImportError:
cannot import name 'CUDAProperties'), on a fresh venv only, where pip had resolved the new
release. So no helper module or package there takes the name of an installed distribution's
module or of the standard library's."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from importlib.metadata import packages_distributions
from pathlib import Path

from support import REPO

ON_THE_PATH = ("tests", "tests/gpu", "benchmarks")


def top_level_names(folder: Path) -> set[str]:
    """The importable names a folder on sys.path gives: its modules and regular packages (a
    folder without __init__.py is a namespace package, which an installed module outranks)."""
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "conftest"}
    packages = {p.parent.name for p in folder.glob("*/__init__.py")}
    return modules | packages


def shadowed(names: set[str], installed: Mapping[str, list[str]], own: str) -> dict[str, str]:
    """name -> what it hides: an installed distribution other than the project, or the stdlib."""
    hidden = {}
    for name in sorted(names):
        dists = [d for d in installed.get(name, []) if d != own]
        if dists:
            hidden[name] = f"the installed distribution {', '.join(dists)}"
        elif name in sys.stdlib_module_names:
            hidden[name] = "the standard library's module"
    return hidden


def test_no_helper_hides_an_installed_module() -> None:
    installed = packages_distributions()
    found = {
        f"{folder}/{name}": what
        for folder in ON_THE_PATH
        for name, what in shadowed(
            top_level_names(REPO / folder), installed, "vllm-patchset"
        ).items()
    }
    assert found == {}


def test_a_helper_named_like_a_distribution_is_caught(tmp_path: Path) -> None:
    """The rule on the case that broke: a kernels.py beside a distribution named kernels."""
    (tmp_path / "kernels.py").write_text("")
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("")
    (tmp_path / "spare").mkdir()  # a namespace package: an installed module outranks it
    (tmp_path / "conftest.py").write_text("")
    (tmp_path / "json.py").write_text("")
    names = top_level_names(tmp_path)
    assert names == {"kernels", "engine", "json"}
    installed = {"kernels": ["kernels"], "spare": ["spare"], "vllm_patchset": ["vllm-patchset"]}
    assert shadowed(names | {"vllm_patchset"}, installed, "vllm-patchset") == {
        "json": "the standard library's module",
        "kernels": "the installed distribution kernels",
    }
