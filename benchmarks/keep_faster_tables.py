"""Keep the tile tables the layer confirms: of the tables a tuner sweep wrote, those whose
shape's layer is faster with them than with the shipped tables in every given benchmark run.

    python benchmarks/keep_faster_tables.py --tables DIR --results A.json [B.json ...] \\
        --tokens 32 [--out DIR]

The tuner times the two GEMMs alone; the layer (bench_nvfp4_moe.py's ``FusedMoEKernel.apply``
under CUDA graphs) also runs the quantization pass, the top-k sum and their launches, and on an
H200 it found a pick 7% behind the shipped tile that the tuner's GEMM timings put 4% ahead
(Llama-4-Maverick TP8 at 32 tokens, 2026-12-03). A results file is a bench run with the
``overlay`` column on the tree with the new tables and the ``before`` column on the shipped
one. A table is kept where every row of its shape (experts held, hidden, intermediate) at the
swept token counts is faster (before / overlay above 1) in every results file, and dropped
where one is not, or where no row measured it. A row whose two columns took the same tiles
(each row's ``tiles``, in runs that record them) is not judged: the table does not change that
count, and its ratio is the run's noise; the line names those counts. Prints a line per
table; with --out, copies the kept tables there (first: a reader that goes away, `| head`, ends
the printing, not the copy).

With --shipped DIR (the folder of the tables the ``before`` tree ships), a table dropped whole
that is faster at some swept counts keeps those buckets alone: a sweep of some token counts
(``tune_nvfp4_moe.py --tokens``) changes the shipped table at the keys of those counts only, so
each other count's key gets back the shipped entry, or goes where the shipped table has none.
The bucket of a count covers the counts from the key below it, and a layer takes one entry per
count, so each bucket's entry is judged on its own. Where DIR has no table of that name (the
sweep started from the GPU's or the generic table), the table is kept whole or not at all.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import stops

TABLE_NAME = re.compile(r"^nvfp4_emulation_moe_tiles\.E(\d+)_H(\d+)_I(\d+)\.[^.]+\.json$")


@dataclass(frozen=True)
class Verdict:
    table: str
    speedups: tuple[tuple[str, int, float], ...]  # (shape, tokens, before / overlay) per row
    same: tuple[tuple[str, int], ...] = ()  # (shape, tokens) of rows with the same tiles

    @property
    def kept(self) -> bool:
        return bool(self.speedups) and all(s > 1.0 for _, _, s in self.speedups)

    @property
    def faster_counts(self) -> list[int]:
        """The swept token counts at which every judged row is faster."""
        counts = sorted({t for _, t, _ in self.speedups})
        return [c for c in counts if all(s > 1.0 for _, t, s in self.speedups if t == c)]

    def line(self) -> str:
        same = sorted(set(self.same))
        alike = ", ".join(f"{shape} {tokens}" for shape, tokens in same)
        alike = f" (the same tiles, not judged: {alike})" if same else ""
        if not self.speedups and same:
            return f"drop {self.table}: it changes no tile at the swept token counts{alike}"
        if not self.speedups:
            return f"drop {self.table}: no row of its shape at the swept token counts"
        cells = ", ".join(f"{shape} {tokens}: {s:.3f}x" for shape, tokens, s in self.speedups)
        return f"{'keep' if self.kept else 'drop'} {self.table}: {cells}{alike}"


def table_shape(name: str) -> tuple[int, int, int]:
    """(experts held, hidden, intermediate) from a shape table's file name."""
    found = TABLE_NAME.match(name)
    if found is None:
        raise ValueError(
            f"{name}: not a shape table's name (nvfp4_emulation_moe_tiles.E*_H*_I*.*.json)"
        )
    return int(found[1]), int(found[2]), int(found[3])


def speedups(
    run: dict[str, Any], shape: tuple[int, int, int], tokens: set[int]
) -> tuple[list[tuple[str, int, float]], list[tuple[str, int]]]:
    """before / overlay per (shape name, tokens) of one bench run, for the rows of ``shape``
    whose two columns took different tiles (or do not say); and the (shape name, tokens) of
    those that took the same."""
    times: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for row in run["rows"]:
        held = row.get("local_experts") or row.get("experts")
        ours = (held, row.get("hidden"), row.get("intermediate")) == shape
        if ours and row["tokens"] in tokens and row.get("column") in ("overlay", "before"):
            times.setdefault((row["shape"], row["tokens"]), {})[row["column"]] = row
    judged, same = [], []
    for (name, t), pair in sorted(times.items()):
        if {"before", "overlay"} <= pair.keys():
            tiles = pair["before"].get("tiles")
            if tiles is not None and tiles == pair["overlay"].get("tiles"):
                same.append((name, t))
            else:
                judged.append((name, t, pair["before"]["graph_us"] / pair["overlay"]["graph_us"]))
    return judged, same


def restored(
    name: str, table: dict[str, Any], shipped: dict[str, Any], keep: list[int], swept: set[int]
) -> dict[str, Any]:
    """``table`` (a sweep of the counts ``swept`` over ``shipped``) with the buckets of the
    counts in ``keep`` alone: each other swept count's key as ``shipped`` has it (or none), and
    the note saying so."""
    if not (isinstance(table, dict) and isinstance(shipped, dict)):
        raise ValueError(f"{name}: the sweep's or the shipped table is not a JSON object")
    out = {k: v for k, v in table.items() if k.startswith("_")}
    back = sorted(swept - set(keep))
    note = (
        f"; benchmarks/keep_faster_tables.py kept the picks of {' '.join(map(str, keep))} tokens"
        f" (faster in the layer) and gave the shipped entries back at {' '.join(map(str, back))}"
    )
    out["_tuned"] = f"{table.get('_tuned', '')}{note}"
    entries = {k: v for k, v in table.items() if not k.startswith("_")}
    for count in back:
        entries.pop(str(count), None)
        if str(count) in shipped:
            entries[str(count)] = shipped[str(count)]
    buckets = sorted((int(k), k) for k in entries if k.isdigit())
    out |= {k: entries[k] for _, k in buckets}  # by bound, as the tuner writes them
    return out | {k: v for k, v in entries.items() if not k.isdigit()}  # the predecode entry


def verdicts(tables: list[str], runs: list[dict[str, Any]], tokens: set[int]) -> list[Verdict]:
    found = []
    for name in tables:
        measured = [speedups(run, table_shape(name), tokens) for run in runs]
        found.append(
            Verdict(
                name,
                tuple(s for judged, _ in measured for s in judged),
                tuple(s for _, same in measured for s in same),
            )
        )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=Path, required=True, help="the tables the sweep wrote")
    parser.add_argument("--results", type=Path, nargs="+", required=True, help="bench JSONs")
    parser.add_argument("--tokens", type=int, nargs="+", required=True, help="token counts swept")
    parser.add_argument("--out", type=Path, help="copy the kept tables here")
    parser.add_argument(
        "--shipped",
        type=Path,
        help="the shipped tables' folder: a table faster at some swept counts keeps those buckets",
    )
    args = parser.parse_args(argv)
    try:
        names = sorted(p.name for p in args.tables.glob("*.json"))
        if not names:
            raise ValueError(f"{args.tables}: no tables (*.json) there")
        if args.shipped is not None and not args.shipped.is_dir():
            raise ValueError(f"{args.shipped}: no such folder (--shipped: the shipped tables')")
        runs = [json.loads(p.read_text()) for p in args.results]
        found = verdicts(names, runs, set(args.tokens))
        partial = {
            v.table: restored(
                v.table,
                json.loads((args.tables / v.table).read_text()),
                json.loads((args.shipped / v.table).read_text()),
                v.faster_counts,
                set(args.tokens),
            )
            for v in found
            if args.shipped is not None
            and not v.kept
            and v.faster_counts
            and (args.shipped / v.table).is_file()
        }
    except (OSError, ValueError, KeyError) as exc:
        print(f"keep_faster_tables: {exc}", file=sys.stderr)
        return 2
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for verdict in found:
            if verdict.kept:
                shutil.copy2(args.tables / verdict.table, args.out / verdict.table)
        for table, text in partial.items():
            (args.out / table).write_text(json.dumps(text, indent=1) + "\n")
    for verdict in found:  # a closed pipe here: stops.main ends it quietly, the tables copied
        counts = verdict.faster_counts
        more = f" (kept: the buckets of {' '.join(map(str, counts))} tokens)"
        print(verdict.line() + (more if verdict.table in partial else ""))
    kept = sum(v.kept for v in found)
    some = f", {len(partial)} in part" if partial else ""
    print(f"{kept} of {len(found)} tables kept{some}")
    return 0


if __name__ == "__main__":
    raise SystemExit(stops.main(main, "keep_faster_tables"))
