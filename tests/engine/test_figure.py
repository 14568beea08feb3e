"""The report's figure: its bars, and its title on lines that fit (without matplotlib)."""

from __future__ import annotations

from engine_check import figure, report
from engine_results import speed_result


def test_one_round_in_the_figure_and_a_long_title_wrapped() -> None:
    """One round of a depth is "1 round" in the figure's legend, and a title longer than the
    figure is wide goes on two lines instead of off the figure's edges."""
    results = {
        f"{engine}-L48-r1": speed_result(f"{engine}-L48-r1", {"1": value}, {"1": 1.0})
        for engine, value in (("overlay-emulation", 296.0), ("pristine-marlin", 239.0))
    }
    rows = figure.plot_rows(report.summarize(results))
    assert list(rows) == ["overlay, 48 layers (1 round)", "Marlin, 48 layers (1 round)"]
    title = "vLLM 0.24.0 engine, NVFP4 Qwen3-MoE at Qwen3-30B-A3B's 48 layers (E=128, H=2048,"
    title += " I=768, top-8), H200, the final kernel"
    assert figure.figure_title(title) == (
        "vLLM 0.24.0 engine, NVFP4 Qwen3-MoE at Qwen3-30B-A3B's 48 layers (E=128, H=2048, I=768,"
        "\ntop-8), H200, the final kernel"
    )
    assert figure.figure_title("NVFP4, H200") == "NVFP4, H200"
