"""The default name of a benchmark's results: the benchmark and the GPU it ran on, so that a run
on another GPU never writes over the results of the GPU that `benchmarks/results/` has."""

from __future__ import annotations

import re


def by_gpu(benchmark: str, device: str | None) -> str:
    """``BENCHMARK_<GPU>``, the GPU as torch names it, lower case, its maker left out:
    ``nvfp4_moe_h200`` on an NVIDIA H200, ``nvfp4_moe_h100_80gb_hbm3`` on an NVIDIA H100 80GB
    HBM3, ``nvfp4_moe_instinct_mi300x`` on an AMD Instinct MI300X (``gpu`` where unnamed)."""
    words = re.sub(r"[^a-z0-9]+", "_", (device or "").lower()).strip("_")
    return f"{benchmark}_{re.sub(r'^(nvidia|amd)_', '', words) or 'gpu'}"
