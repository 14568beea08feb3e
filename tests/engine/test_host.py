"""The host's reading of a run: where a failed capture broke, what each rank's log says."""

from __future__ import annotations

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
