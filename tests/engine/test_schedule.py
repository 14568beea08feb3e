"""Where and when the phases' runs go: GPU blocks side by side, a phase refused before any
engine starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_check import cli, schedule

GPU_BLOCKS = [
    ([1, 1], 2, [[0], [1]]),
    ([1, 1], 1, None),
    ([2], 2, [[0, 1]]),
    ([1, 2], 2, None),
    ([1, 2], 4, [[0], [1, 2]]),
]


@pytest.mark.parametrize(("needs", "gpus", "expected"), GPU_BLOCKS)
def test_gpu_blocks(needs: list[int], gpus: int, expected: list[list[int]] | None) -> None:
    assert schedule.gpu_blocks(needs, gpus) == expected


def test_phases_refuse_a_checkpoint_not_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`phases baselines` without the BF16 checkpoint failed deep in transformers
    (`HFValidationError: Repo id must be ...`); refused in one line now, as `rounds` does,
    before any engine starts or the install is asked its state."""
    calls: list[str] = []

    def state(self: object) -> str:
        calls.append("state")
        return "pristine"

    def engine(*args: object) -> dict[str, object]:
        calls.append("engine")
        return {}

    monkeypatch.setattr(schedule.Host, "state", state)
    monkeypatch.setattr(schedule, "run_engine", engine)
    for name in ("nvfp4-L2", "nvfp4-L12"):
        (tmp_path / "models" / name).mkdir(parents=True)
    with pytest.raises(SystemExit) as refused:
        cli.main(["phases", "baselines", "--work", str(tmp_path), "--gpus", "1"])
    assert str(refused.value) == (
        f"no checkpoint {tmp_path / 'models' / 'bf16-L12'}: run `checkpoints bf16-L12`"
    )
    with pytest.raises(SystemExit) as refused:
        cli.main(["phases", "fix2", "parallel", "--work", str(tmp_path), "--gpus", "1"])
    assert str(refused.value) == (
        f"no checkpoint {tmp_path / 'models' / 'fp8-L2'}: run `checkpoints fp8-L2`"
    )
    assert calls == []
