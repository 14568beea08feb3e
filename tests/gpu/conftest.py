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
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The vLLM modules the tests import, imported once here (see _import_vllm).
VLLM_MODULES = (
    "vllm.model_executor.layers.fused_moe",
    "vllm.model_executor.layers.fused_moe.oracle.nvfp4",
    "vllm.model_executor.layers.fused_moe.experts.triton_moe",
    "vllm.model_executor.layers.fused_moe.experts.nvfp4_emulation_moe",
    "vllm.v1.worker.workspace",
)
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
    sys.path.insert(0, str(root))
    info_path = root / TREE_INFO
    info: dict[str, Any] = json.loads(info_path.read_text()) if info_path.is_file() else {}
    return {"root": root, **info}


def _set_up() -> VllmUnderTest:
    if missing := _gpu_missing():
        return VllmUnderTest(mode=f"skipped: {missing}")
    tree = _select_tree()
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return VllmUnderTest(mode="skipped: no vllm importable (set VLLM_PATCHSET_VLLM_TREE)")
    package_dir = Path(spec.origin).parent

    import standins

    native = standins.has_compiled_extensions(package_dir)
    ops = () if native else tuple(standins.install())

    vllm, import_warnings = _import_vllm()
    if "root" in tree and not Path(vllm.__file__).is_relative_to(tree["root"]):
        raise pytest.UsageError(f"{TREE_ENV}: imported vllm from {vllm.__file__} instead")
    return VllmUnderTest(
        mode="native" if native else "standin",
        version=vllm.__version__,
        location=str(package_dir),
        kind=tree.get("kind", "tree") if tree else "installed",
        patches=tuple(tree.get("patches", ())),
        standin_ops=ops,
        import_warnings=import_warnings,
    )


def _import_vllm() -> tuple[Any, tuple[str, ...]]:
    """Import vLLM's MoE modules, recording the warnings that importing them raises.

    Importing vLLM 0.24.0 with torch 2.11 raises torch's own DeprecationWarnings (e.g.
    ``torch.jit.script_method`` when vLLM's import-time ``torch.compile`` loads inductor).
    They come from third-party import machinery, not from the code under test, so they are
    reported in the header instead of failing collection; warnings that tests raise still fail.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import vllm

        for name in VLLM_MODULES:
            importlib.import_module(name)
    seen = dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught)
    return vllm, tuple(seen)


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
    import torch
    from vllm.v1.worker.workspace import init_workspace_manager

    init_workspace_manager(torch.device("cuda"))


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
    """Capture ``fn`` in a CUDA (HIP on ROCm) graph; return ``(graph, output)``.

    ``fn`` runs once eagerly on a side stream first, so that Triton compiles and autotunes
    outside the capture and the workspace reaches its size, as torch.cuda.graph requires.
    The caller keeps the graph alive, refills the static inputs and calls ``graph.replay()``.
    """
    import torch

    def capture(fn: Callable[[], Any]) -> tuple[Any, Any]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        return graph, out

    return capture
