"""CUDA (HIP on ROCm) graph capture and timing, one way for the tests, the benchmark and the
tuner. Timings are what the benchmark and the tuner print; no test asserts one.

``kernel_breakdown`` times each launch of one captured call alone: the call is captured once,
the CUDA driver lists the graph's nodes (``cuGraphGetNodes``, in dependency order), and an
executable graph of the whole call is replayed with every kernel, memset and memcpy node but
one disabled (``cuGraphNodeSetEnabled``), the L2 flushed before each replay. Before each of those
replays, untimed, the launches before that one replay (the others disabled), so that each
launch runs on the state it has in the whole call: a launch that counts with atomics into a
buffer an earlier launch clears (vLLM's ``moe_align_block_size``) would otherwise count on from
its own last replay and index past its buffers. CUDA only (the driver API through ctypes, no
extra package); elsewhere it raises BreakdownUnavailable.
"""

from __future__ import annotations

import ctypes
import dataclasses
import statistics
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")
# Zeroed before each timed call: more than the H200's 60 MB L2 (and MI300's), so that one
# layer's weights do not stay cached from the previous call, as a real model's other layers
# prevent.
L2_FLUSH_BYTES = 256 << 20


def capture(fn: Callable[[], T], keep_graph: bool = False) -> tuple[torch.cuda.CUDAGraph, T]:
    """Capture ``fn`` in a graph; return ``(graph, output)``.

    ``fn`` runs once eagerly on a side stream first, so that Triton compiles and autotunes
    outside the capture and the workspaces reach their size, as torch.cuda.graph requires.
    The caller keeps the graph alive, refills the static inputs and calls ``graph.replay()``.
    ``keep_graph``: the graph (``raw_cuda_graph()``) outlives its instantiation.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph(keep_graph=True) if keep_graph else torch.cuda.CUDAGraph()
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


# -- one captured call, kernel by kernel --------------------------------------------------------
class BreakdownUnavailable(RuntimeError):
    """The per-kernel breakdown cannot run here (no CUDA driver, an old driver or torch)."""


# CUgraphNodeType values (cuda.h): the nodes that do work and can be disabled one by one.
_KERNEL, _MEMCPY, _MEMSET = 0, 1, 2
_TOGGLED = {_KERNEL: "kernel", _MEMCPY: "memcpy", _MEMSET: "memset"}


class _KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS_v2 (cuda.h, CUDA 12)."""

    _fields_ = [
        ("func", ctypes.c_void_p),
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem_bytes", ctypes.c_uint),
        ("kernel_params", ctypes.c_void_p),
        ("extra", ctypes.c_void_p),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    ]


@dataclasses.dataclass(frozen=True)
class Launch:
    """One node of a captured call and its time replayed alone."""

    index: int
    kind: str  # kernel, memset or memcpy
    name: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    us: float


class _Driver:
    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise BreakdownUnavailable(f"no CUDA driver library: {exc}") from None

    def __call__(self, name: str, *args: Any) -> None:
        fn = getattr(self.lib, name, None)
        if fn is None:
            raise BreakdownUnavailable(f"the CUDA driver has no {name}")
        code = fn(*args)
        if code != 0:
            raise BreakdownUnavailable(f"{name} returned CUDA error {code}")

    def name_of(self, params: _KernelNodeParams) -> str:
        out = ctypes.c_char_p()
        for getter, handle in (("cuFuncGetName", params.func), ("cuKernelGetName", params.kern)):
            fn = getattr(self.lib, getter, None)
            if handle and fn is not None and fn(ctypes.byref(out), ctypes.c_void_p(handle)) == 0:
                return (out.value or b"?").decode(errors="replace")
        return "?"

    def nodes(self, graph: int) -> list[int]:
        """The graph's nodes in dependency order (a captured stream is a chain)."""
        count = ctypes.c_size_t(0)
        self("cuGraphGetNodes", ctypes.c_void_p(graph), None, ctypes.byref(count))
        nodes = (ctypes.c_void_p * count.value)()
        self("cuGraphGetNodes", ctypes.c_void_p(graph), nodes, ctypes.byref(count))
        order = [int(n or 0) for n in nodes]
        edges = ctypes.c_size_t(0)
        try:
            self("cuGraphGetEdges", ctypes.c_void_p(graph), None, None, ctypes.byref(edges))
            src, dst = (ctypes.c_void_p * edges.value)(), (ctypes.c_void_p * edges.value)()
            self("cuGraphGetEdges", ctypes.c_void_p(graph), src, dst, ctypes.byref(edges))
        except BreakdownUnavailable:
            return order  # the driver's own order: creation order, for a captured chain
        pairs = [(int(a or 0), int(b or 0)) for a, b in zip(src, dst, strict=True)]
        return _topological(order, pairs)


def _topological(nodes: list[int], edges: list[tuple[int, int]]) -> list[int]:
    """Kahn's order of ``nodes``, ties in the order given."""
    waiting = {n: 0 for n in nodes}
    for _, b in edges:
        waiting[b] += 1
    done: list[int] = []
    ready = [n for n in nodes if waiting[n] == 0]
    while ready:
        node = ready.pop(0)
        done.append(node)
        for a, b in edges:
            if a == node:
                waiting[b] -= 1
                if waiting[b] == 0:
                    ready.append(b)
    return done


def kernel_breakdown(
    fn: Callable[[], Any], reps: int, flush: torch.Tensor | None = None
) -> tuple[list[Launch], float, float]:
    """Each kernel, memset and memcpy of one call of ``fn``, replayed alone from the call's own
    graph (the others disabled), median µs of ``reps`` replays, before each (untimed) the
    launches before it and ``flush`` zeroed.

    Returns (the launches in order, the whole graph's µs, an all-disabled graph's µs: the floor
    that every one-launch replay includes). Raises BreakdownUnavailable where it cannot run."""
    if not torch.cuda.is_available() or torch.version.cuda is None:
        raise BreakdownUnavailable("needs CUDA (the driver API lists the graph's nodes)")
    driver = _Driver()
    fn()
    try:
        graph, _ = capture(fn, keep_graph=True)
        raw = int(graph.raw_cuda_graph())
    except (TypeError, RuntimeError, AttributeError) as exc:
        raise BreakdownUnavailable(f"torch cannot keep the captured graph: {exc}") from None
    launches: list[tuple[int, str, str, tuple[int, ...], tuple[int, ...]]] = []
    for node in driver.nodes(raw):
        node_type = ctypes.c_int(-1)
        driver("cuGraphNodeGetType", ctypes.c_void_p(node), ctypes.byref(node_type))
        if node_type.value not in _TOGGLED:
            continue
        label = _TOGGLED[node_type.value]
        name, grid, block = label, tuple[int, ...](), tuple[int, ...]()
        if node_type.value == _KERNEL:
            params = _KernelNodeParams()
            driver("cuGraphKernelNodeGetParams_v2", ctypes.c_void_p(node), ctypes.byref(params))
            name, grid, block = driver.name_of(params), tuple(params.grid), tuple(params.block)
        launches.append((node, label, name, grid, block))
    exec_ = ctypes.c_void_p()
    driver(
        "cuGraphInstantiateWithFlags",
        ctypes.byref(exec_),
        ctypes.c_void_p(raw),
        ctypes.c_ulonglong(0),
    )
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def enable(on: set[int]) -> None:
        for node, *_ in launches:
            driver("cuGraphNodeSetEnabled", exec_, ctypes.c_void_p(node), ctypes.c_uint(node in on))

    def replay() -> None:
        driver("cuGraphLaunch", exec_, stream)

    def restore(i: int) -> Callable[[], None]:
        """The launches before launch ``i`` replayed, then launch ``i`` alone enabled."""
        before, only = {n for n, *_ in launches[:i]}, {launches[i][0]}

        def run() -> None:
            enable(before)
            replay()
            enable(only)

        return run

    try:
        timed: list[Launch] = []
        for i, (_node, kind, name, grid, block) in enumerate(launches):
            us = _median_us(replay, reps, flush, restore(i))
            timed.append(Launch(len(timed), kind, name, grid, block, us))
        enable(set())
        floor = _median_us(replay, reps, flush)
        enable({n for n, *_ in launches})
        whole = _median_us(replay, reps, flush)
    finally:
        torch.cuda.synchronize()
        driver("cuGraphExecDestroy", exec_)
    del graph
    return timed, whole, floor


def _median_us(
    fn: Callable[[], Any],
    reps: int,
    flush: torch.Tensor | None,
    before: Callable[[], Any] | None = None,
) -> float:
    """Median µs of ``reps`` calls of ``fn`` between CUDA events, after one untimed; ``before``
    (untimed) and the flush before each."""
    if before is not None:
        before()
    fn()
    events = []
    for _ in range(reps):
        if before is not None:
            before()
        if flush is not None:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1000.0 for s, e in events)


def profiled_kernels(fn: Callable[[], Any]) -> list[tuple[str, float]]:
    """(name, µs) of each GPU kernel of one eager call of ``fn``, in launch order, from
    torch.profiler (CUPTI); after one call outside the profile (compiling, autotuning)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda e: e.time_range.start)
    return [(e.name, e.time_range.elapsed_us()) for e in kernels]
