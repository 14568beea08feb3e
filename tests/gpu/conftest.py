"""Selects the vLLM under test for tests/gpu and says in the run's output which one it was.

- env ``VLLM_PATCHSET_VLLM_TREE=DIR``: DIR holds a pure-Python ``vllm/`` package (a pristine or
  overlaid tree made by ``vllm-patchset``), optionally with ``vllm-patchset-tree.json``
  (``{"version", "kind": "pristine"|"overlay", "patches": [...]}``); DIR goes first on sys.path.
- otherwise: the installed vllm.

With vLLM's compiled extensions present the real ops run (mode ``native``); without them,
capture-safe stand-ins from ``standins.py`` (mode ``standin``). Without torch or a GPU nothing
is set up and every module in this folder skips itself.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TREE_ENV = "VLLM_PATCHSET_VLLM_TREE"
TREE_INFO = "vllm-patchset-tree.json"
REPORT_ENV = "VLLM_PATCHSET_GPU_REPORT"  # where to write the run's outcomes as JSON


@dataclasses.dataclass(frozen=True)
class VllmUnderTest:
    mode: str  # "native", "standin", or "skipped: <why>"
    version: str = ""
    location: str = ""
    kind: str = "installed"  # "installed", or the tree's "pristine" / "overlay"
    patches: tuple[str, ...] = ()
    standin_ops: tuple[str, ...] = ()
    import_warnings: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.mode.startswith("skipped"):
            return f"vllm-patchset gpu: {self.mode}"
        patches = ", ".join(self.patches) or "none"
        return (
            f"vllm-patchset gpu: mode={self.mode} vllm={self.version} kind={self.kind} "
            f"patches=[{patches}] from {self.location}"
        )


def _gpu_missing() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "no torch"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA or ROCm GPU"
    return None


def _select_tree() -> dict[str, Any]:
    tree = os.environ.get(TREE_ENV)
    if not tree:
        return {}
    root = Path(tree).resolve()
    if not (root / "vllm" / "__init__.py").is_file():
        raise pytest.UsageError(f"{TREE_ENV}={tree}: no vllm/__init__.py there")
    if not any(root.glob("vllm-*.dist-info/METADATA")):
        # vLLM's platform detection reads its version through importlib.metadata.
        raise pytest.UsageError(
            f"{TREE_ENV}={tree}: no vllm-*.dist-info/METADATA beside vllm/"
            " (trees from `vllm-patchset validate --build-only` or `bundle` have one)"
        )
    info_path = root / TREE_INFO
    info: dict[str, Any] = json.loads(info_path.read_text()) if info_path.is_file() else {}
    return {"root": root, **info}


def _set_up() -> VllmUnderTest:
    if missing := _gpu_missing():
        return VllmUnderTest(mode=f"skipped: {missing}")
    tree = _select_tree()
    if "root" not in tree and importlib.util.find_spec("vllm") is None:
        return VllmUnderTest(mode="skipped: no vllm importable (set VLLM_PATCHSET_VLLM_TREE)")
    import moe_setup

    try:
        imported = moe_setup.import_vllm(tree.get("root"))
    except moe_setup.WrongTree as exc:
        raise pytest.UsageError(f"{TREE_ENV}: {exc}") from None
    return VllmUnderTest(
        mode=imported.mode,
        version=imported.module.__version__,
        location=str(imported.package_dir),
        kind=tree.get("kind", "tree") if tree else "installed",
        patches=tuple(tree.get("patches", ())),
        standin_ops=imported.standin_ops,
        import_warnings=imported.import_warnings,
    )


UNDER_TEST: VllmUnderTest = VllmUnderTest(mode="skipped: not configured")


def pytest_configure(config: pytest.Config) -> None:
    global UNDER_TEST
    UNDER_TEST = _set_up()


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [UNDER_TEST.describe()]
    if UNDER_TEST.standin_ops:
        lines.append("vllm-patchset gpu: stand-in ops: " + ", ".join(UNDER_TEST.standin_ops))
    lines += [f"vllm-patchset gpu: while importing vllm: {w}" for w in UNDER_TEST.import_warnings]
    return lines


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # The header is printed only when this folder is on the command line; say it again here.
    terminalreporter.write_line(UNDER_TEST.describe())


_OUTCOMES: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record each test's outcome for ``vllm-patchset validate`` (gpurun.py)."""
    if report.failed and report.when != "call":
        _OUTCOMES[report.nodeid] = "error"
    elif report.when == "call" or report.skipped:
        _OUTCOMES.setdefault(report.nodeid, report.outcome)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    # A module that skips itself, or fails to import, has no test reports: record the module.
    if report.failed or report.skipped:
        _OUTCOMES[report.nodeid] = "error" if report.failed else "skipped"


def pytest_sessionfinish(session: pytest.Session) -> None:
    if path := os.environ.get(REPORT_ENV):
        report = {"vllm": dataclasses.asdict(UNDER_TEST), "outcomes": _OUTCOMES}
        Path(path).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


@pytest.fixture(scope="session")
def vllm_under_test() -> VllmUnderTest:
    return UNDER_TEST


@pytest.fixture(scope="session", autouse=True)
def _workspace() -> None:
    """FusedMoEKernel.apply takes its buffers from vLLM's workspace manager: set it up once."""
    if UNDER_TEST.mode.startswith("skipped"):
        return
    import moe_setup

    moe_setup.init_workspace()


@pytest.fixture(autouse=True)
def _seeded() -> Iterator[None]:
    if UNDER_TEST.mode.startswith("skipped"):
        yield
        return
    import torch

    torch.manual_seed(0)
    yield


@pytest.fixture
def capture_graph() -> Callable[[Callable[[], Any]], tuple[Any, Any]]:
    """cuda_graphs.capture: ``capture_graph(fn)`` gives ``(graph, output)``."""
    import cuda_graphs

    return cuda_graphs.capture
