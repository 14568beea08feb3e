"""The `rounds` command's runs read back: the pairs per round and the rounds taken together,
in the report's table and in the figure."""

from __future__ import annotations

from engine_check import figure, report, rounds
from engine_results import speed_result


def test_rounds_taken_together_in_the_table_and_the_figure() -> None:
    """With two rounds or more of a depth, the table ends in their medians and the range of
    the overlay / Marlin ratio over them; the figure's bars are those medians, slowest to
    fastest, after the phases' engines."""
    results = {
        f"{engine}-L48-r{i}": speed_result(f"{engine}-L48-r{i}", {"1": value}, {"1": 1.0})
        for i, (overlay, marlin) in enumerate([(300.0, 240.0), (290.0, 250.0), (310.0, 245.0)], 1)
        for engine, value in (("overlay-emulation", overlay), ("pristine-marlin", marlin))
    }
    results["pristine-marlin-L12"] = speed_result("pristine-marlin-L12", {"1": 400.0}, {"1": 1.0})
    summary = report.summarize(results)
    assert rounds.round_spread(summary["rounds"]) == {
        (48, "overlay"): {"1": {"median": 300.0, "worst": 290.0, "best": 310.0}},
        (48, "marlin"): {"1": {"median": 245.0, "worst": 240.0, "best": 250.0}},
    }
    assert (
        "| 48 | 3 | 310 / 245 (1.27x) |\n| 48 | median of 3 | 300 / 245 (1.16x to 1.27x) |\n"
        in (report.markdown(summary, "T"))
    )
    assert figure.plot_rows(summary) == {
        "Marlin (0.24.0's default on Hopper)": {
            "1": {"median": 400.0, "best": 400.0, "worst": 400.0}
        },
        "overlay, 48 layers (3 rounds)": {"1": {"median": 300.0, "worst": 290.0, "best": 310.0}},
        "Marlin, 48 layers (3 rounds)": {"1": {"median": 245.0, "worst": 240.0, "best": 250.0}},
    }
