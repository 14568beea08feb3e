"""benchmarks/w4a4_logprob_floor.py on a tiny checkpoint (CPU): its rows, files and bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the float64 forward runs torch (pip install torch)")
pytest.importorskip("safetensors.torch", reason="it reads safetensors files")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import w4a4_logprob_floor as floor  # noqa: E402
from engine_check import checkpoint as ckpt  # noqa: E402
from engine_check.runs import VOCAB  # noqa: E402

# The engine check's prompts draw from its vocabulary.
TINY = ckpt.MoeModel(
    layers=2, experts=8, hidden=64, intermediate=32, top_k=3, vocab=VOCAB, heads=4, kv_heads=2,
    head_dim=16,
)  # fmt: skip


def test_rows_and_files(tmp_path: Path) -> None:
    ckpt.write_model(TINY, "nvfp4", tmp_path / "work" / "models" / floor.MODEL)
    out = tmp_path / "out"
    assert floor.main(["--work", str(tmp_path / "work"), "--prompts", "1", "--out", str(out)]) == 0
    doc = json.loads((out / "w4a4_logprob_floor_cpu.json").read_text())
    assert [r["moe"] for r in doc["rows"]] == ["bf16 input", "patch 0002", "0.24.0"]
    assert {r["positions"] for r in doc["rows"]} == {floor.LOGPROB_LEN - 1}
    assert all(r["mean_abs_nats"] > 0 for r in doc["rows"])  # each change shows
    md = (out / "w4a4_logprob_floor_cpu.md").read_text()
    assert md.count("\n| ") == 4  # the header and three rows


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prompts", "0"], "argument --prompts: prompts: 1 to 32, got 0"),
        ([], "no nvfp4-L2 checkpoint in {work}/models/nvfp4-L2 (engine_e2e.py checkpoints first)"),
    ],
)
def test_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(SystemExit) as exc:
        floor.main(["--work", str(work), "--out", str(work / "out"), *argv])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(message.format(work=work))
    assert list(work.iterdir()) == []  # nothing written
