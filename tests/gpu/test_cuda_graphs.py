"""``cuda_graphs.kernel_breakdown`` on the GPU: each launch timed alone runs on the state it has
in the whole call.

The benchmark's per-kernel breakdown replays one launch of a layer's graph at a time. Replayed
again and again on its own, a launch that counts into a buffer an earlier launch clears (vLLM's
``moe_align_block_size`` does, with atomics) counts on from its last replay, and the launches
after it index with those counts: on the H200 the breakdown of Llama-4-Scout TP4 at 1024 tokens
ended every worker, Marlin's too, with CUDA errors (an illegal memory access, "operation not
supported on global/shared address space"), and with the fix ran in every one.
Here a counter is cleared, incremented and read within one call, and what the read saw is kept
as a running maximum: 1 in every replay of the whole call, 1 in every breakdown replay that
restores the launches before the timed one, and the count of the increment's own replays
without that.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the GPU tests need torch")
import torch

if torch.version.cuda is None or not torch.cuda.is_available():
    pytest.skip(
        "needs a CUDA GPU (the breakdown reads the graph through the CUDA driver)",
        allow_module_level=True,
    )

import cuda_graphs

pytestmark = pytest.mark.gpu


def test_each_launch_alone_sees_the_state_of_the_whole_call() -> None:
    counter = torch.zeros(1, dtype=torch.int64, device="cuda")
    seen = torch.zeros(1, dtype=torch.int64, device="cuda")

    def call() -> None:
        counter.zero_()  # a memset
        counter.add_(1)  # a kernel that counts on from what the buffer holds
        torch.maximum(seen, counter, out=seen)  # a kernel that reads the count

    launches, whole, floor = cuda_graphs.kernel_breakdown(call, reps=5)
    torch.cuda.synchronize()

    assert len(launches) == 3
    assert (counter.item(), seen.item()) == (1, 1)
    assert whole > 0 and floor > 0
