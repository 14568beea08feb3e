"""The host's reading of a run: where a failed capture broke, what each rank's log says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_check import host
from engine_results import FRAME

# The shape of what vLLM 0.24.0 logged when capture failed (one rank's worker, trimmed).
FAILED_LOG = """\
(Worker_DP0_EP0 pid=3969) ERROR 11-30 08:37:47 [multiproc_executor.py:1000]   File "/tmp/e2e/native/site/vllm/model_executor/layers/fused_moe/modular_kernel.py", line 1200, in apply
(Worker_DP0_EP0 pid=3969) ERROR 11-30 08:37:47 [multiproc_executor.py:1000]     self.fused_experts.apply(
(Worker_DP0_EP0 pid=3969) ERROR 11-30 08:37:47 [multiproc_executor.py:1000]   File "/tmp/e2e/native/site/vllm/model_executor/layers/fused_moe/experts/triton_moe.py", line 248, in apply
(Worker_DP0_EP0 pid=3969) ERROR 11-30 08:37:47 [multiproc_executor.py:1000]     self.a1_scale or self.a1_gscale,
(Worker_DP0_EP0 pid=3969) ERROR 11-30 08:37:47 [multiproc_executor.py:1000] torch.AcceleratorError: CUDA error: operation not permitted when stream is capturing
(Worker_DP0_EP0 pid=3969) ERROR 11-30 08:37:47 [multiproc_executor.py:1000] Search for `cudaErrorStreamCaptureInvalidated' in the CUDA docs.
"""


def test_failing_frame_and_capture_errors() -> None:
    assert host.failing_frame(FAILED_LOG) == FRAME
    assert host.failing_frame("all fine\n") is None
    assert sorted({m.group(0) for m in host.CAPTURE_ERRORS.finditer(FAILED_LOG)}) == [
        "cudaErrorStreamCaptureInvalidated",
        "operation not permitted when stream is capturing",
    ]


RANK_CASES = [  # (exit code, log, what the worker wrote or None) -> the rank's report
    (
        0,
        "INFO vllm-patchset: overlay 0.24.0 verified\nINFO vllm-patchset: overlay 0.24.0 verified\n",
        {"finished": True},
        {
            "finished": True,
            "exit_code": 0,
            "guard": ["overlay 0.24.0 verified"],
            "capture_errors": [],
        },
    ),
    (
        1,
        FAILED_LOG,
        {"startup_error": "RuntimeError: Engine core initialization failed."},
        {
            "startup_error": "RuntimeError: Engine core initialization failed.",
            "exit_code": 1,
            "guard": [],
            "capture_errors": [
                "cudaErrorStreamCaptureInvalidated",
                "operation not permitted when stream is capturing",
            ],
            "failing_frame": FRAME,
        },
    ),
    (
        -9,
        "".join(f"line {i}\n" for i in range(20)),
        None,
        {
            "exit_code": -9,
            "guard": [],
            "capture_errors": [],
            "error_tail": [f"line {i}" for i in range(5, 20)],
        },
    ),
]


@pytest.mark.parametrize(("code", "log", "written", "expected"), RANK_CASES)
def test_rank_report(
    tmp_path: Path,
    code: int,
    log: str,
    written: dict[str, Any] | None,
    expected: dict[str, Any],
) -> None:
    out = tmp_path / "run.rank0.json"
    if written is not None:
        out.write_text(json.dumps(written))
    assert host.rank_report(code, log, out) == expected


def test_across_ranks() -> None:
    ranks: list[dict[str, Any]] = [
        {"guard": ["b", "a"], "capture_errors": []},
        {"guard": ["a"], "capture_errors": ["x"], "failing_frame": "f.py:2 (g): y"},
        {"guard": [], "capture_errors": ["x"], "failing_frame": "f.py:1 (g): z"},
    ]
    assert host.across_ranks(ranks) == {
        "ranks": ranks,
        "guard": ["a", "b"],
        "capture_errors": ["x"],
        "failing_frame": "f.py:1 (g): z",
    }
    assert "failing_frame" not in host.across_ranks(ranks[:1])


def test_host_of_a_work_area(tmp_path: Path) -> None:
    """The kit's site where `setup` assembled one (its vllm/), else the installed vLLM."""
    assert host.host_of(tmp_path) == host.Host(None, tmp_path / "models", tmp_path / "results")
    (tmp_path / "native" / "site" / "vllm").mkdir(parents=True)
    assert host.host_of(tmp_path).site == tmp_path / "native" / "site"
