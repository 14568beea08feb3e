"""benchmarks/keep_faster_tables.py: of a sweep's tables, those the layer confirms, read from
bench runs shaped as the H200's (the 2026-12-03 32-token sweep's two runs, committed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support import REPO, to_closed_pipe

sys.path.insert(0, str(REPO / "benchmarks"))

import keep_faster_tables as keep

RESULTS = REPO / "benchmarks" / "results"
RUNS = [RESULTS / "nvfp4_moe_h200_tuned32_more.json", RESULTS / "nvfp4_moe_h200_required_t32b.json"]
SWEPT = [  # the tables tune_nvfp4_moe.py --wide --tokens 32 wrote that day (experts held, H, I)
    (128, 2048, 384), (128, 2688, 928), (128, 4096, 384), (128, 5120, 1024), (16, 5120, 2048),
    (256, 3072, 384), (256, 6144, 256), (256, 7168, 256), (32, 7168, 2048), (384, 7168, 256),
    (48, 7168, 2048), (512, 4096, 256),
]  # fmt: skip


def name(e: int, h: int, i: int) -> str:
    return f"nvfp4_emulation_moe_tiles.E{e}_H{h}_I{i}.NVIDIA_H200.json"


def test_the_h200_sweep_keeps_what_patch_0002_ships(tmp_path: Path, capsys) -> None:
    """The rule reproduces the hand-made choice of that day: the 9 tables patch 0002 ships
    kept (copied as they are); Maverick TP8 and Scout TP4 (slower in the A/B) and Kimi-K2 EP8
    (slower in both runs) dropped."""
    tables, out = tmp_path / "tables", tmp_path / "out"
    tables.mkdir()
    for shape in SWEPT:
        (tables / name(*shape)).write_text(json.dumps({"shape": shape}))
    argv = ["--tables", str(tables), "--results", *map(str, RUNS), "--tokens", "32"]
    assert keep.main([*argv, "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "9 of 12 tables kept"
    dropped = [line for line in lines if line.startswith("drop ")]
    assert dropped == [
        f"drop {name(128, 5120, 1024)}: llama-4-maverick-tp8 32: 0.925x, llama-4-maverick-tp8 32: 0.995x",
        f"drop {name(16, 5120, 2048)}: llama-4-scout-tp4 32: 0.945x, llama-4-scout-tp4 32: 1.000x",
        f"drop {name(48, 7168, 2048)}: kimi-k2-ep8 32: 0.995x, kimi-k2-ep8 32: 0.993x",
    ]
    dropped_shapes = [(128, 5120, 1024), (16, 5120, 2048), (48, 7168, 2048)]
    kept = sorted(p.name for p in out.iterdir())
    assert kept == sorted(name(*s) for s in SWEPT if s not in dropped_shapes)
    assert all((out / k).read_text() == (tables / k).read_text() for k in kept)


def test_unmeasured_and_other_token_counts() -> None:
    """A table no row measured is dropped; rows at token counts not swept do not count."""
    run = {"rows": [
        {"shape": "s", "experts": 8, "local_experts": 0, "hidden": 64, "intermediate": 32,
         "tokens": t, "column": c, "graph_us": us}
        for t, c, us in [(1, "overlay", 10.0), (1, "before", 12.0), (32, "overlay", 30.0),
                         (32, "before", 29.0), (32, "marlin", 99.0)]
    ]}  # fmt: skip
    got = keep.verdicts([name(8, 64, 32), name(4, 64, 32)], [run], {1})
    assert [(v.kept, v.speedups) for v in got] == [(True, (("s", 1, 1.2),)), (False, ())]
    assert got[1].line() == f"drop {name(4, 64, 32)}: no row of its shape at the swept token counts"
    assert keep.verdicts([name(8, 64, 32)], [run], {1, 32})[0].kept is False


@pytest.mark.parametrize(
    ("file", "text", "message"),
    [
        ("other.json", "{}", "other.json: not a shape table's name"),
        (name(8, 64, 32), "{}", ""),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, capsys, file: str, text: str, message: str) -> None:
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / file).write_text(text)
    results = tmp_path / "r.json"
    results.write_text("not json" if not message else '{"rows": []}')
    code = keep.main(["--tables", str(tables), "--results", str(results), "--tokens", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("keep_faster_tables: ")
    assert message in err


def test_a_folder_without_tables_is_one_line(tmp_path: Path, capsys) -> None:
    """A wrong --tables (missing, or no table in it) is an error, not "0 of 0 tables kept"."""
    (tmp_path / "r.json").write_text('{"rows": []}')
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "missing", tmp_path / "empty"):
        argv = ["--tables", str(folder), "--results", str(tmp_path / "r.json"), "--tokens", "1"]
        assert keep.main([*argv, "--out", str(tmp_path / "out")]) == 2
        assert capsys.readouterr().err == (
            f"keep_faster_tables: {folder}: no tables (*.json) there\n"
        )
    assert not (tmp_path / "out").exists()


def test_a_reader_gone_ends_the_printing_not_the_copy(tmp_path: Path) -> None:
    """`| head -0`: no traceback, exit 128 + SIGPIPE as other command-line tools, and the kept
    tables copied all the same."""
    tables, out = tmp_path / "tables", tmp_path / "out"
    tables.mkdir()
    for shape in SWEPT:
        (tables / name(*shape)).write_text(json.dumps({"shape": shape}))
    script = REPO / "benchmarks" / "keep_faster_tables.py"
    argv = ["--tables", str(tables), "--results", *map(str, RUNS), "--tokens", "32"]
    assert to_closed_pipe([sys.executable, str(script), *argv, "--out", str(out)]) == (141, "")
    assert len(list(out.glob("*.json"))) == 9


def test_counts_with_the_same_tiles_are_not_judged() -> None:
    """Rows whose overlay and before columns took the same tiles (``tiles``) say nothing of the
    table: a table tuned at 32 tokens whose 512-token entry is the shipped one is judged at 32
    alone (the H100's Qwen3-235B TP2 table, 2026-12-06: 1.02x at 32, 0.99x at 512 with the same
    tiles); a row without ``tiles`` in a column (a run before they were recorded, or a tree
    without tables) is judged as before."""
    shape = {"experts": 8, "local_experts": 0, "hidden": 64, "intermediate": 32}
    run = {"rows": [
        {"shape": "s", **shape, "tokens": t, "column": c, "graph_us": us, **tiles}
        for t, c, us, tiles in [
            (32, "overlay", 100.0, {"tiles": "A"}), (32, "before", 102.0, {"tiles": "B"}),
            (512, "overlay", 200.0, {"tiles": "G"}), (512, "before", 198.0, {"tiles": "G"}),
            (1, "overlay", 10.0, {"tiles": "G"}), (1, "before", 9.0, {}),
        ]
    ]}  # fmt: skip
    [kept] = keep.verdicts([name(8, 64, 32)], [run], {32, 512})
    assert (kept.kept, kept.speedups, kept.same) == (True, (("s", 32, 1.02),), (("s", 512),))
    assert kept.line() == (
        f"keep {name(8, 64, 32)}: s 32: 1.020x (the same tiles, not judged: s 512)"
    )
    [dropped] = keep.verdicts([name(8, 64, 32)], [run], {1, 32, 512})
    assert dropped.kept is False and dropped.speedups == (("s", 1, 0.9), ("s", 32, 1.02))
    [alike] = keep.verdicts([name(8, 64, 32)], [run], {512})
    assert alike.line() == (
        f"drop {name(8, 64, 32)}: it changes no tile at the swept token counts"
        " (the same tiles, not judged: s 512)"
    )


def test_shipped_folder_keeps_the_faster_buckets_alone(tmp_path: Path, capsys) -> None:
    """--shipped: a sweep at 1 and 32 tokens whose 32-token pick is faster in both runs and whose
    1-token pick is slower in one keeps the 32-token bucket alone (the H100's Qwen3.6-35B TP8
    table, 2026-12-06, 0.985x at 1 token and 1.043x at 32, was dropped whole): the key of 1 gets
    the shipped entry back, the key of 32 (none shipped) stays, the other keys and the predecode
    entry are the shipped ones, in the tuner's order; a table faster at no count is dropped."""
    tables, shipped, out = tmp_path / "tables", tmp_path / "shipped", tmp_path / "out"
    tables.mkdir()
    shipped.mkdir()
    old = {"_tuned": "t", "1": "one", "4": "four", "64": "wide", "predecode": "p"}
    new = {"_tuned": "t; then sweep", "1": "ONE", "4": "four", "32": "NEW", "64": "wide", "predecode": "p"}  # fmt: skip
    for shape in ((8, 64, 32), (4, 64, 32)):
        (shipped / name(*shape)).write_text(json.dumps(old))
        (tables / name(*shape)).write_text(json.dumps(new))
    rows = [
        {"shape": s, "experts": e, "local_experts": 0, "hidden": 64, "intermediate": 32,
         "tokens": t, "column": c, "graph_us": us}
        for s, e in (("s", 8), ("r", 4))
        for t, c, us in [(1, "overlay", 10.0), (1, "before", 9.5), (32, "overlay", 30.0),
                         (32, "before", 31.0 if s == "s" else 29.0)]
    ]  # fmt: skip
    runs = []
    for i in range(2):
        runs.append(tmp_path / f"r{i}.json")
        runs[-1].write_text(json.dumps({"rows": rows}))
    argv = ["--tables", str(tables), "--results", *map(str, runs), "--tokens", "1", "32"]
    assert keep.main([*argv, "--shipped", str(shipped), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"drop {name(4, 64, 32)}: r 1: 0.950x, r 32: 0.967x, r 1: 0.950x, r 32: 0.967x",
        f"drop {name(8, 64, 32)}: s 1: 0.950x, s 32: 1.033x, s 1: 0.950x, s 32: 1.033x"
        " (kept: the buckets of 32 tokens)",
        "0 of 2 tables kept, 1 in part",
    ]
    assert sorted(p.name for p in out.iterdir()) == [name(8, 64, 32)]
    text = (out / name(8, 64, 32)).read_text()
    assert list(json.loads(text).items()) == [
        ("_tuned", "t; then sweep; benchmarks/keep_faster_tables.py kept the picks of 32 tokens"
         " (faster in the layer) and gave the shipped entries back at 1"),
        ("1", "one"), ("4", "four"), ("32", "NEW"), ("64", "wide"), ("predecode", "p"),
    ]  # fmt: skip
    assert text.endswith("}\n")
    # Without --shipped the rule is the table's whole, as before.
    assert keep.main([*argv, "--out", str(tmp_path / "whole")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "0 of 2 tables kept"
    assert not list((tmp_path / "whole").iterdir())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "Expecting value"),
        ("[1, 2]", f"{name(8, 64, 32)}: the sweep's or the shipped table is not a JSON object"),
    ],
)
def test_a_shipped_table_that_is_not_a_json_object_is_one_line(
    tmp_path: Path, capsys, text: str, message: str
) -> None:
    """Not JSON, or JSON that is not a table (a list: no key to give back), is an error, not a
    table written without the shipped entries."""
    tables, shipped = tmp_path / "tables", tmp_path / "shipped"
    tables.mkdir()
    shipped.mkdir()
    (tables / name(8, 64, 32)).write_text('{"1": "a", "32": "b"}')
    (shipped / name(8, 64, 32)).write_text(text)
    rows = [{"shape": "s", "experts": 8, "hidden": 64, "intermediate": 32, "tokens": t,
             "column": c, "graph_us": us}
            for t, c, us in [(1, "overlay", 10.0), (1, "before", 9.0), (32, "overlay", 1.0), (32, "before", 2.0)]]  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps({"rows": rows}))
    argv = ["--tables", str(tables), "--results", str(tmp_path / "r.json"), "--tokens", "1", "32"]
    assert keep.main([*argv, "--shipped", str(shipped), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"keep_faster_tables: {message}")
    assert not (tmp_path / "out").exists()


def test_a_shipped_folder_that_is_not_there_is_one_line(tmp_path: Path, capsys) -> None:
    """A wrong --shipped is an error, not a silent judgement of every table whole."""
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / name(8, 64, 32)).write_text("{}")
    (tmp_path / "r.json").write_text('{"rows": []}')
    argv = ["--tables", str(tables), "--results", str(tmp_path / "r.json"), "--tokens", "1"]
    missing = tmp_path / "missing"
    assert keep.main([*argv, "--shipped", str(missing), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"keep_faster_tables: {missing}: no such folder (--shipped: the shipped tables')\n"
    )
    assert not (tmp_path / "out").exists()
