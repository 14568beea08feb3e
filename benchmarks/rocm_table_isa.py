"""ISA facts of a ROCm tile table before any AMD GPU runs it: every fused GEMM configuration the
experts launch with TABLE as ROCm's generic table, compiled on this machine (no GPU) for gfx942
(MI300) and gfx950 (MI355), and judged by the rules patch 0002 chooses ROCm's table by (the
comment above its ROCM_CONFIGS): matrix instructions (MFMA), no VGPR spill and no scratch, and
at least two waves per SIMD; and by what a launch needs: no more LDS than the target has (64
KiB on gfx942, 160 KiB on gfx950).

    python benchmarks/rocm_table_isa.py TABLE [TABLE ...] [--out DIR] [--name NAME]

TABLE: a tile table's JSON as patch 0002 reads it (nvfp4_emulation_moe_tiles.*.json), or
``shipped`` for ROCm's generic table as the overlay has it. The configurations are those of
tests/overlay_kernels.py's drive of the fused experts (both benchmark shapes and the ragged one,
BF16 and FP16, with and without an expert map, both ends of every bucket of TABLE). Writes NAME.json
and NAME.md under DIR (default benchmarks/results, rocm_table_isa) and exits 1 where a
configuration breaks a rule, 0 where none does, 2 (one line, nothing written) for a TABLE it
cannot read, or an --overlay or --pristine tree without the files it loads. Candidate tables
measured on an H200 with ``VLLM_PATCHSET_NVFP4_CONFIG_DIR`` (as
nvfp4_emulation_moe_tiles.rocm_generic.json) are in benchmarks/rocm_tables/.

    python benchmarks/rocm_table_isa.py --candidates [--wide] [--out DIR]

--candidates judges, by the same rules, every tile benchmarks/tune_nvfp4_moe.py may time with
ROCm's configuration (its groups of blocks from 16 tokens, its W13/W2 tiles, with --wide its
WIDE_ ones too, each also with two stages, ROCm's generic table's tiles, and its
PREDECODE_TILES): each GEMM tile as ROCm's only table entry (the predecoded ones as ROCm's
generic predecode, from one pair an expert), the experts driven at 1 and 2 tokens over the
shapes, dtypes and expert maps above, both dtypes on the weights as the experts lay them out at
load (what every layer whose weights tile runs; TABLE judges the checkpoint's rows too), every
launch compiled for both targets. A launch counts for the candidate its own constants name
(GATED, BLOCK_M, NAIVE, QDQ_A, the tile); a candidate broken on either target is one the tuner
leaves out when it sweeps ROCm's configuration. Writes rocm_tile_candidates.json (with the
sha256 of the kernels file it compiled: the tuner refuses a file of other kernels) and .md under
DIR, and exits 1 where a candidate launched nothing (its facts would be missing), else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import stops
from isa_facts import DEFAULT_OUT, PIN, REPO, default_pristine

TARGETS = ("gfx942", "gfx950")
GEMM = "_nvfp4_moe_gemm_kernel"
PREDECODED_GEMM = "_predecoded_moe_gemm_kernel"
MIN_WAVES = 2  # ROCM_CONFIGS: "keeps at least two waves per SIMD"
# The LDS one workgroup may take: MI300's (gfx942) 64 KiB, MI355's (gfx950) 160 KiB. A kernel
# that asks for more does not launch there (triton's OutOfResources).
LDS_BYTES = {"gfx942": 64 << 10, "gfx950": 160 << 10}
# Row.broken's rules in a sentence, for both Markdown files.
RULES = (
    f"Rules: MFMA, no VGPR spill or scratch, at least {MIN_WAVES} waves per SIMD, LDS within"
    f" the target's ({LDS_BYTES['gfx942'] >> 10} KiB on gfx942, {LDS_BYTES['gfx950'] >> 10} KiB"
    " on gfx950)."
)
SHIPPED = "shipped"


class BadTable(Exception):
    """A TABLE argument the script cannot take (main: one line on stderr, exit 2)."""


@dataclass(frozen=True)
class Row:
    table: str
    target: str
    config: str
    vgprs: int
    vgpr_spills: int
    sgpr_spills: int
    scratch_bytes: int
    occupancy_waves: int
    mfma: int
    lds_bytes: int

    def broken(self) -> list[str]:
        """The rules this configuration breaks (none: [])."""
        rules = {
            "VGPR spill": self.vgpr_spills > 0,
            "scratch": self.scratch_bytes > 0,
            "no MFMA": self.mfma == 0,
            f"fewer than {MIN_WAVES} waves": self.occupancy_waves < MIN_WAVES,
            f"LDS over {LDS_BYTES[self.target] >> 10} KiB": self.lds_bytes > LDS_BYTES[self.target],
        }
        return [rule for rule, broken in rules.items() if broken]


def kernels_module(fused: Any) -> Any:
    """Patch 0002's kernel module (tables, launchers) behind the loaded experts' module."""
    return sys.modules[fused.module.nvfp4_moe_configs.__module__]


@contextlib.contextmanager
def rocm_table(module: Any, table: dict[int, Any] | None) -> Iterator[None]:
    """ROCm's generic table replaced by ``table`` for the block (None: as it is), the module's
    cache of tables emptied before and after, so that nothing outlives the block."""
    kept = module.GENERIC_CONFIGS["rocm"]
    if table is not None:
        module.GENERIC_CONFIGS["rocm"] = table
    module._TABLES.clear()
    try:
        yield
    finally:
        module.GENERIC_CONFIGS["rocm"] = kept
        module._TABLES.clear()


def gemm_launches(fused: Any, table: dict[int, Any] | None) -> list[Any]:
    """Every GEMM launch of the fused experts' drive, on a ROCm machine, with ``table``."""
    import overlay_kernels as kernels

    module = kernels_module(fused)
    with rocm_table(module, table), kernels.recording_launches() as launches:
        bounds = list(module.GENERIC_CONFIGS["rocm"])
        kernels._drive(fused, kernels.token_counts(bounds))
    return [launch for launch in launches if launch.kernel.__name__ == GEMM]


def read_table(module: Any, name: str) -> dict[int, Any] | None:
    """A TABLE argument: None for the shipped table, else the file's table (its errors are
    patch 0002's own, naming the file and entry)."""
    if name == SHIPPED:
        return None
    path = Path(name)
    if not path.is_file():
        raise BadTable(f"{name}: no such table file (or say {SHIPPED!r})")
    try:
        table: dict[int, Any] = module.parse_table(path.read_text(), name)
    except module.Nvfp4MoeTableError as exc:
        raise BadTable(str(exc)) from None
    return table


def facts(name: str, fused: Any, table: dict[int, Any] | None) -> list[Row]:
    import overlay_kernels as kernels

    launches = gemm_launches(fused, table)
    rows = []
    for target in TARGETS:
        for spec in kernels.unique([kernels.specialize(launch, target) for launch in launches]):
            found = kernels.isa_facts(kernels.compile_for(spec), target)
            rows.append(Row(
                table=name,
                target=target,
                config=spec.label(),
                vgprs=found["vgprs"],
                vgpr_spills=found["vgpr_spills"],
                sgpr_spills=found["sgpr_spills"],
                scratch_bytes=found["scratch_bytes"],
                occupancy_waves=found["occupancy_waves"],
                mfma=found["mfma"],
                lds_bytes=found["shared_bytes_triton"],
            ))  # fmt: skip
    return rows


# --candidates: the tuner's candidate tiles with ROCm's configuration.
CANDIDATES_NAME = "rocm_tile_candidates"
TOP = 1 << 62  # a table's one bucket: every token count
DRIVEN = [1, 2]  # naive blocks at both (tune_nvfp4_moe's groups at 1 and 8 tokens have them)


def tuner(module: Any, wide: bool) -> Any:
    """benchmarks/tune_nvfp4_moe.py with its WIDE_ tiles (wide) and as it sweeps ROCm's
    configuration: ROCm's token blocks, the tiles' two-stage twins and the kernel module's ROCm
    table's tiles."""
    import tune_nvfp4_moe as tune

    if wide:
        tune.widen()
    tune.platform_candidates(module, "rocm")
    return tune


def candidate_of(spec: Any) -> tuple[Any, ...]:
    """A compiled GEMM's candidate, as tune_nvfp4_moe keys it, from its own constants."""
    import overlay_kernels as kernels

    gemm = "w13" if spec.constexpr("GATED") else "w2"
    tile: tuple[Any, ...] = (spec.constexpr("BLOCK_N"), spec.constexpr("BLOCK_K"),
                             spec.options["num_warps"], spec.options["num_stages"])  # fmt: skip
    if kernels.is_predecoded_gemm(spec):
        return (f"predecoded {gemm}", spec.constexpr("BLOCK_M"), False, False, tile)
    if spec.constexpr("SPLIT_GU"):
        tile += (True,)
    naive, qdq = bool(spec.constexpr("NAIVE")), bool(spec.constexpr("QDQ_A"))
    return (gemm, spec.constexpr("BLOCK_M"), naive, qdq, tile)


def candidate_launches(fused: Any, tune: Any) -> list[Any]:
    """Every GEMM launch (fused and predecoded) of the experts' drive at DRIVEN tokens with each
    tuner candidate as ROCm's table's one entry, and each PREDECODE_TILES entry as ROCm's generic
    predecode from one pair an expert (at a count that routes one pair to every expert); both
    dtypes on the weights as process_weights_after_loading lays them out, what a layer runs
    (the checkpoint's rows are a fallback for weights that do not tile, judged with the tables
    above: ``rocm_table_isa.py shipped``)."""
    import overlay_kernels as kernels

    module = kernels_module(fused)
    groups = dict.fromkeys(g for gs in tune.GROUPS.values() for g in gs)
    launches: list[Any] = []
    for bm, naive, qdq in groups:
        w13, w2 = tune.W13[bm], tune.W2[bm]
        for i in range(max(len(w13), len(w2))):
            tiles = (module.GemmConfig(*w13[i % len(w13)]), module.GemmConfig(*w2[i % len(w2)]))
            table = {TOP: module.MoeConfig(naive, bm, qdq, *tiles)}
            with rocm_table(module, table), kernels.recording_launches() as found:
                kernels._drive(fused, DRIVEN, fp16_rows=False)
            launches += [f for f in found if f.kernel.__name__ == GEMM]
    return launches + predecode_launches(fused, tune)


def predecode_launches(fused: Any, tune: Any) -> list[Any]:
    """candidate_launches' predecoded GEMMs: each PREDECODE_TILES entry as ROCm's generic
    predecode from one pair an expert."""
    import overlay_kernels as kernels

    module = kernels_module(fused)
    launches: list[Any] = []
    tokens = max(-(-e // top_k) for e, _, _, top_k in kernels.SHAPES.values())
    kept = module.GENERIC_PREDECODE["rocm"]
    for bm, w13_tile, w2_tile in tune.PREDECODE_TILES:
        tiles = (module.GemmConfig(*w13_tile), module.GemmConfig(*w2_tile))
        module.GENERIC_PREDECODE["rocm"] = module.PredecodeConfig(1, bm, *tiles)
        try:
            with rocm_table(module, None), kernels.recording_launches() as found:
                kernels._drive(fused, [tokens], fp16_rows=False)
        finally:
            module.GENERIC_PREDECODE["rocm"] = kept
        launches += [f for f in found if f.kernel.__name__ == PREDECODED_GEMM]
    return launches


def tuner_candidates(tune: Any) -> list[tuple[Any, ...]]:
    """Every candidate the tuner may time (its fused GEMMs', then its predecoded ones')."""
    fused = tune.every_candidate(list(tune.GROUPS))
    return fused + tune.predecode_candidates(tune.PREDECODE_TILES)


def candidate_rows(
    launches: list[Any], wanted: list[tuple[Any, ...]]
) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]]]:
    """Each wanted candidate's facts on both targets (the worst over its configurations among
    the launches) and the rules it breaks; and the wanted candidates that launched nothing."""
    import overlay_kernels as kernels

    facts: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = {c: {} for c in wanted}
    for target in TARGETS:
        for spec in kernels.unique([kernels.specialize(x, target) for x in launches]):
            key = candidate_of(spec)
            if key in facts:
                compiled = kernels.isa_facts(kernels.compile_for(spec), target)
                facts[key].setdefault(target, []).append(compiled)
    rows, silent = [], []
    for key, by_target in facts.items():
        if set(by_target) != set(TARGETS):
            silent.append(key)
            continue
        gemm, bm, naive, qdq, tile = key
        row: dict[str, Any] = {"gemm": gemm, "block_m": bm, "naive": naive, "qdq_a": qdq,
                               "tile": list(tile), "broken": []}  # fmt: skip
        for target, found in by_target.items():
            worst = Row(
                table=CANDIDATES_NAME,
                target=target,
                config=f"{len(found)} configurations",
                vgprs=max(f["vgprs"] for f in found),
                vgpr_spills=max(f["vgpr_spills"] for f in found),
                sgpr_spills=max(f["sgpr_spills"] for f in found),
                scratch_bytes=max(f["scratch_bytes"] for f in found),
                occupancy_waves=min(f["occupancy_waves"] for f in found),
                mfma=min(f["mfma"] for f in found),
                lds_bytes=max(f["shared_bytes_triton"] for f in found),
            )
            row[target] = {k: v for k, v in vars(worst).items() if k not in ("table", "target")}
            row["broken"] += [f"{target}: {rule}" for rule in worst.broken()]
        rows.append(row)
    return rows, silent


def candidates_markdown(rows: list[dict[str, Any]], triton_version: str) -> str:
    lines = [
        "# The tuner's ROCm candidates: ISA facts",
        "",
        f"Compiled on a CPU machine with triton {triton_version}"
        " (`benchmarks/rocm_table_isa.py --candidates`): every tile",
        "`benchmarks/tune_nvfp4_moe.py` may time with ROCm's configuration, for gfx942 and gfx950,",
        "the worst of its configurations.",
        RULES,
        "The tuner leaves out the candidates that break one.",
        "",
        f"{sum(1 for r in rows if not r['broken'])} of {len(rows)} candidates keep the rules.",
        "",
        "| GEMM | block | naive | QDQ | tile (n, k, warps, stages) | gfx942 VGPRs, waves, LDS |"
        " gfx950 VGPRs, waves, LDS | broken |",
        "|---|---:|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            f"{r[t]['vgprs']}, {r[t]['occupancy_waves']}, {r[t]['lds_bytes'] >> 10} KiB"
            for t in TARGETS
        ]
        lines.append(
            f"| {r['gemm']} | {r['block_m']} | {int(r['naive'])} | {int(r['qdq_a'])} |"
            f" {tuple(r['tile'])} | {cells[0]} | {cells[1]} | {'; '.join(r['broken'])} |"
        )
    return "\n".join(lines) + "\n"


def write_candidates(fused: Any, overlay: Path, wide: bool, out: Path, triton_version: str) -> int:
    tune = tuner(kernels_module(fused), wide)
    rows, silent = candidate_rows(candidate_launches(fused, tune), tuner_candidates(tune))
    sha256 = tune.kernels_sha256(overlay.parent)  # overlay: the tree's vllm folder
    document = {"triton": triton_version, "vllm": PIN, "kernels_sha256": sha256, "wide": wide,
                "targets": list(TARGETS), "candidates": rows}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{CANDIDATES_NAME}.json").write_text(json.dumps(document, indent=1) + "\n")
    text = candidates_markdown(rows, triton_version)
    (out / f"{CANDIDATES_NAME}.md").write_text(text)
    print(text)
    for key in silent:
        print(f"rocm_table_isa: no launch of candidate {key}", file=sys.stderr)
    return 1 if silent else 0


def markdown(rows: list[Row], triton_version: str) -> str:
    lines = [
        "# ROCm tile tables: ISA facts",
        "",
        f"Compiled on a CPU machine with triton {triton_version} (`benchmarks/rocm_table_isa.py`):",
        "every fused GEMM configuration each table makes the experts launch, for gfx942 and",
        "gfx950.",
        RULES,
        "",
        "| table | target | configurations | breaking a rule | most VGPRs | fewest waves |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for table in dict.fromkeys(r.table for r in rows):
        for target in TARGETS:
            some = [r for r in rows if r.table == table and r.target == target]
            if not some:
                continue
            broken = sum(1 for r in some if r.broken())
            most = max(r.vgprs for r in some)
            fewest = min(r.occupancy_waves for r in some)
            lines.append(f"| {table} | {target} | {len(some)} | {broken} | {most} | {fewest} |")
    lines += ["", "Configurations that break a rule:", ""]
    for r in rows:
        if r.broken():
            lines.append(
                f"- {r.table}, {r.target}: `{r.config}`: {', '.join(r.broken())}"
                f" ({r.vgprs} VGPRs, {r.occupancy_waves} waves)"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="*", metavar="TABLE", help=f"a table's JSON, or {SHIPPED}")
    parser.add_argument("--overlay", type=Path, default=REPO / "overlay" / "vllm")
    parser.add_argument("--pristine", type=Path, default=default_pristine())
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--name", default="rocm_table_isa")
    parser.add_argument(
        "--candidates", action="store_true", help="judge the tuner's ROCm candidates instead"
    )
    parser.add_argument("--wide", action="store_true", help="with --candidates: the WIDE_ too")
    args = parser.parse_args(argv)
    if bool(args.tables) == args.candidates:
        parser.error("name TABLEs, or say --candidates (not both)")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # as benchmarks/isa_facts.py
    import overlay_kernels as kernels
    import standins
    import triton

    needed = ((args.overlay.parent / kernels.FUSED_MOE, "--overlay: patch 0002's experts"),
              (args.pristine / "__init__.py", "--pristine: vLLM 0.24.0's package"))  # fmt: skip
    for path, what in needed:
        if not path.is_file():
            print(f"rocm_table_isa: no {path} ({what})", file=sys.stderr)
            return 2
    fused = kernels.load_fused(args.overlay, args.pristine, standins.moe_align_block_size, True)
    module = kernels_module(fused)
    if args.candidates:
        return write_candidates(fused, args.overlay, args.wide, args.out, triton.__version__)
    try:
        tables = {name: read_table(module, name) for name in args.tables}
    except BadTable as exc:
        print(f"rocm_table_isa: {exc}", file=sys.stderr)
        return 2
    rows = [row for name, table in tables.items() for row in facts(name, fused, table)]
    args.out.mkdir(parents=True, exist_ok=True)
    document = {"triton": triton.__version__, "vllm": PIN, "rows": [vars(r) for r in rows]}
    (args.out / f"{args.name}.json").write_text(json.dumps(document, indent=1) + "\n")
    text = markdown(rows, triton.__version__)
    (args.out / f"{args.name}.md").write_text(text)
    print(text)
    return 1 if any(r.broken() for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(stops.main(main, "rocm_table_isa"))
