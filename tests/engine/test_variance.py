"""The `variance` report: per control, batch vs one by one and the dump's first difference."""

from __future__ import annotations

from engine_check import variance
from engine_results import CAPTURE


def test_variance_report() -> None:
    same = [[-1.0, -2.0]]
    results = {
        "overlay-emulation-L2-eager": {
            "finished": True,
            "kwargs": {"enforce_eager": True, "compilation_config": CAPTURE},
            "logprobs_batch": same,
            "logprobs_single": [[-1.0, -2.5]],
        },
        "pristine-emulation-L2-dump": {
            "finished": True,
            "kwargs": {"compilation_config": CAPTURE},
            "logprobs_batch": same,
            "logprobs_single": same,
            "moe_dump": {"first_difference": None, "per_layer": [], "layers": {}},
        },
    }
    rows = variance.variance_summary(results)
    assert [r["run"] for r in rows] == ["pristine-emulation-L2-dump", "overlay-emulation-L2-eager"]
    lines = variance.variance_markdown(rows).splitlines()
    assert lines[4:] == [
        "| pristine-emulation-L2-dump | 100.0% | 0.0000 | 0.0000 | none: every layer's inputs"
        " and output identical |",
        "| overlay-emulation-L2-eager | 50.0% | 0.2500 | 0.5000 | — |",
    ]
