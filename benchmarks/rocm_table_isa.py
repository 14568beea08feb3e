"""ISA facts of a ROCm tile table before any AMD GPU runs it: every fused GEMM configuration the
experts launch with TABLE as ROCm's generic table, compiled on this machine (no GPU) for gfx942
(MI300) and gfx950 (MI355), and judged by the rules patch 0002 chooses ROCm's table by (the
comment above its ROCM_CONFIGS): matrix instructions (MFMA), no VGPR spill and no scratch, and
at least two waves per SIMD.

    python benchmarks/rocm_table_isa.py TABLE [TABLE ...] [--out DIR] [--name NAME]

TABLE: a tile table's JSON as patch 0002 reads it (nvfp4_emulation_moe_tiles.*.json), or
``shipped`` for ROCm's generic table as the overlay has it. The configurations are those of
tests/overlay_kernels.py's drive of the fused experts (both benchmark shapes and the ragged one,
BF16 and FP16, with and without an expert map, both ends of every bucket of TABLE). Writes NAME.json
and NAME.md under DIR (default benchmarks/results, rocm_table_isa) and exits 1 where a
configuration breaks a rule, 0 where none does, 2 (one line, nothing written) for a TABLE it
cannot read. Candidate tables measured on an H200 with
``VLLM_PATCHSET_NVFP4_CONFIG_DIR`` (as nvfp4_emulation_moe_tiles.rocm_generic.json) are in
benchmarks/rocm_tables/.
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

from isa_facts import DEFAULT_OUT, PIN, REPO, default_pristine

TARGETS = ("gfx942", "gfx950")
GEMM = "_nvfp4_moe_gemm_kernel"
MIN_WAVES = 2  # ROCM_CONFIGS: "keeps at least two waves per SIMD"
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


def markdown(rows: list[Row], triton_version: str) -> str:
    lines = [
        "# ROCm tile tables: ISA facts",
        "",
        f"Compiled on a CPU machine with triton {triton_version} (`benchmarks/rocm_table_isa.py`):",
        "every fused GEMM configuration each table makes the experts launch, for gfx942 and",
        f"gfx950. Rules: MFMA, no VGPR spill or scratch, at least {MIN_WAVES} waves per SIMD.",
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
    parser.add_argument("tables", nargs="+", metavar="TABLE", help=f"a table's JSON, or {SHIPPED}")
    parser.add_argument("--overlay", type=Path, default=REPO / "overlay" / "vllm")
    parser.add_argument("--pristine", type=Path, default=default_pristine())
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--name", default="rocm_table_isa")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # as benchmarks/isa_facts.py
    import overlay_kernels as kernels
    import standins
    import triton

    fused = kernels.load_fused(args.overlay, args.pristine, standins.moe_align_block_size, True)
    module = kernels_module(fused)
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
    raise SystemExit(main())
