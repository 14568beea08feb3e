"""The worker's measurements that need no engine: the GPU's busy time from a trace's events."""

from __future__ import annotations

import types

from engine_check import worker


def test_gpu_busy_counts_overlapping_spans_once() -> None:
    """The union of the GPU's kernels, copies and memsets (two kernels overlapping, as
    programmatic dependent launch overlaps them), per step; CPU events and instant events
    are not the GPU's."""
    events = [
        {"cat": "kernel", "ts": 100.0, "dur": 10.0},
        {"cat": "kernel", "ts": 105.0, "dur": 10.0},  # overlaps the first: 100-115
        {"cat": "gpu_memcpy", "ts": 120.0, "dur": 4.0},
        {"cat": "gpu_memset", "ts": 121.0, "dur": 1.0},  # inside the copy
        {"cat": "kernel", "ts": 130.0, "dur": 2.0},
        {"cat": "cpu_op", "ts": 0.0, "dur": 500.0},
        {"cat": "kernel", "ts": 200.0},  # no duration: not a span
    ]
    assert worker.gpu_busy(events, steps=2) == {"busy_us_per_step": 10.5, "kernels_per_step": 2.0}


def test_prompt_logprobs_of_each_token_after_the_first() -> None:
    """vLLM's prompt_logprobs: None for the first token, then per position a dict of token id
    to its Logprob; the prompt's own token's is the one kept."""

    def logprob(value: float) -> types.SimpleNamespace:
        return types.SimpleNamespace(logprob=value)

    output = types.SimpleNamespace(
        prompt_logprobs=[None, {7: logprob(-0.5), 9: logprob(-0.25)}, {3: logprob(-2.0)}]
    )
    assert worker.prompt_logprobs(output, [5, 7, 3]) == [-0.5, -2.0]
