"""CUDA (HIP on ROCm) graph capture and timing, one way for the tests, the benchmark and the
tuner. Timings are what the benchmark and the tuner print; no test asserts one."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")
# Zeroed before each timed call: more than the H200's 60 MB L2 (and MI300's), so that one
# layer's weights do not stay cached from the previous call, as a real model's other layers
# prevent.
L2_FLUSH_BYTES = 256 << 20


def capture(fn: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
    """Capture ``fn`` in a graph; return ``(graph, output)``.

    ``fn`` runs once eagerly on a side stream first, so that Triton compiles and autotunes
    outside the capture and the workspaces reach their size, as torch.cuda.graph requires.
    The caller keeps the graph alive, refills the static inputs and calls ``graph.replay()``.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def l2_flush_buffer() -> torch.Tensor:
    return torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")


def time_us(
    fn: Callable[[], Any], reps: int, *, graph: bool = True, flush: torch.Tensor | None = None
) -> float:
    """Median µs of ``reps`` calls of ``fn`` (``graph``: replays of it captured, the GPU time
    alone; else plain calls after a device sync, so that the host's launch overhead counts),
    ``flush`` zeroed before each call. ``fn`` runs once first: compiling and autotuning stay
    out of the timing and the capture."""
    fn()
    if graph:
        fn = capture(fn)[0].replay
    events = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        if not graph:
            torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1000.0 for s, e in events)
