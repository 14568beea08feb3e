"""ISA facts of the overlay's Triton kernels for MI300 (gfx942), MI355 (gfx950) and Hopper
(sm_90), compiled on this machine (no GPU): per kernel, configuration and target, the registers,
spills and memory, and for sm_90 the SASS instruction mix, so that a kernel change shows its
cost on AMD before anyone has an MI300.

    python benchmarks/isa_facts.py [--overlay DIR] [--pristine DIR] [--out DIR]

The configurations are those of tests/test_kernels_compile.py (tests/overlay_kernels.py: the fused
experts' own launcher driven over both benchmark shapes, both dtypes and every token bucket,
its launches recorded and bound by triton's binder). Without a driver triton leaves
n_regs/n_spills empty: AMD's facts come from the hsaco's metadata (.vgpr_count,
.vgpr_spill_count, ...), NVIDIA's from the cubin through the wheel's cuobjdump. `shared` is
triton's dynamic shared memory (LDS on AMD) per program.

Output: benchmarks/results/isa_facts.json and isa_facts.md (and a table on stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import stops

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "gpu")]
DEFAULT_OUT = REPO / "benchmarks" / "results"
PIN = "0.24.0"
# The columns of the Markdown table, per backend.
HIP_COLUMNS = ("vgprs", "agprs", "sgprs", "vgpr_spills", "sgpr_spills", "scratch_bytes",
               "occupancy_waves", "mfma")  # fmt: skip
CUDA_COLUMNS = ("registers", "local_bytes", "stack_bytes", "sass_instructions", "mma",
                "k_loop_instructions", "k_loop_mma")  # fmt: skip
MIX_SHOWN = 8  # the most frequent SASS opcodes shown in the table


def default_pristine() -> Path:
    cache = os.environ.get("VLLM_PATCHSET_TEST_CACHE", str(REPO / ".cache" / "test-upstream"))
    return Path(cache) / "installed" / f"vllm-{PIN}" / "vllm"


def collect(overlay: Path, pristine: Path) -> list[dict[str, Any]]:
    import overlay_kernels as kernels
    import triton

    rows = []
    for target in kernels.TARGETS:
        rocm = kernels.TARGETS[target].backend == "hip"
        launches, _ = kernels.fused_launches(overlay, pristine, rocm)
        specs = kernels.unique([kernels.specialize(launch, target) for launch in launches])
        for spec in specs:
            facts = kernels.isa_facts(kernels.compile_for(spec), target)
            rows.append({
                "kernel": spec.kernel.__name__,
                "target": target,
                "config": spec.label(),
                **facts,
            })  # fmt: skip
    print(f"triton {triton.__version__}: {len(rows)} compiled kernels", file=sys.stderr)
    return rows


def markdown(rows: list[dict[str, Any]], triton_version: str, source_sha256: str) -> str:
    lines = [
        "# ISA facts of the overlay's Triton kernels",
        "",
        f"Compiled on a CPU machine with triton {triton_version} (`benchmarks/isa_facts.py`),",
        "for every configuration the fused experts' launcher uses. `shared`: triton's shared",
        "memory (LDS) per program, bytes; `mfma` / `mma`: matrix instructions in the code",
        "(v_mfma_*; HMMA/HGMMA); spills and scratch/local bytes: what a change costs first;",
        "`k_loop_*`: the SASS of a GEMM's K loop (one K step, per warp), where the decode shows.",
        f"The fused MoE kernels file's sha256 (the lock's patched_sha256): `{source_sha256[:12]}`.",
        "",
    ]
    for backend, columns in (("hip", HIP_COLUMNS), ("cuda", CUDA_COLUMNS)):
        chosen = [r for r in rows if (r["target"] == "sm90") == (backend == "cuda")]
        if not chosen:
            continue
        head = ["kernel", "target", "config", "shared", *columns]
        if backend == "cuda":
            head.append(f"SASS mix of the K loop, else the kernel (top {MIX_SHOWN})")
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in chosen:
            cells = [r["kernel"], r["target"], f"`{r['config']}`", str(r["shared_bytes_triton"])]
            cells += [str(r.get(c)) for c in columns]
            if backend == "cuda":
                top = list((r["k_loop_mix"] or r["sass_mix"]).items())[:MIX_SHOWN]
                cells.append(" ".join(f"{op} {n}" for op, n in top))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    overlay_help = "the built overlay's vllm/ (vllm-patchset overlay build)"
    pristine_help = f"a pristine vllm {PIN} package dir (its moe_align_block_size)"
    overlay = REPO / "overlay" / "vllm"
    parser.add_argument("--overlay", type=Path, default=overlay, help=overlay_help)
    parser.add_argument("--pristine", type=Path, default=default_pristine(), help=pristine_help)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import triton

    rows = collect(args.overlay, args.pristine)
    args.out.mkdir(parents=True, exist_ok=True)
    import hashlib

    import overlay_kernels as kernels

    # Which kernels these are: the overlaid files' sha256 (the lock's patched_sha256).
    sources = {
        rel: hashlib.sha256((args.overlay.parent / rel).read_bytes()).hexdigest()
        for rel in (kernels.FUSED_KERNELS, kernels.FUSED_MOE)
    }
    fused = sources[kernels.FUSED_KERNELS]
    document = {
        "triton": triton.__version__,
        "vllm": PIN,
        "sources": sources,
        "kernels": rows,
    }
    (args.out / "isa_facts.json").write_text(json.dumps(document, indent=1) + "\n")
    text = markdown(rows, triton.__version__, fused)
    (args.out / "isa_facts.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(stops.main(main, "isa_facts"))
