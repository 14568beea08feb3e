"""The `variance` report: per control of the logprob check (eager, no compile, no CUDA
graphs, the MoE dump), batch vs one by one, and where the dump found the first difference."""

from __future__ import annotations

from typing import Any

from .compare import compare_logprobs
from .dump import DUMP_OPS
from .results import measured
from .runs import VARIANCE_RUNS


def variance_summary(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variance run found (either install): batch vs one by one, and the dump's verdict."""
    rows = []
    for state in ("pristine", "overlay"):
        for run in VARIANCE_RUNS:
            r = results.get(f"{state}-{run.name}")
            if r is None:
                continue
            row: dict[str, Any] = {"run": f"{state}-{run.name}", "ok": measured(r)}
            row["kwargs"] = {k: r.get("kwargs", {}).get(k) for k in ("enforce_eager",)}
            row["compilation_config"] = r.get("kwargs", {}).get("compilation_config")
            if r.get("logprobs_batch") and r.get("logprobs_single"):
                row.update(compare_logprobs(r["logprobs_batch"], r["logprobs_single"]))
            if "moe_dump" in r:
                row["moe_dump"] = {
                    k: r["moe_dump"].get(k)
                    for k in ("error", "first_difference", "per_layer", "layers", "file")
                }
            rows.append(row)
    return rows


def variance_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "Batch of 32 vs one by one, teacher-forced logprobs on the 2-layer model, per control"
        " (nats):",
        "",
        "| run | identical | mean abs Δ | max abs Δ | first MoE difference (dump) |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        if not r["ok"]:
            lines.append(f"| {r['run']} | FAILED | | | |")
            continue
        dump = r.get("moe_dump") or {}
        first = dump.get("first_difference")
        if dump.get("error"):
            verdict = dump["error"]
        elif first:
            verdict = (
                f"{first['layer']}: {first['what']} ({first['op']}),"
                f" {first['identical_rows']:.1%} of rows identical, max |Δ| {first['max_abs']:.3g}"
            )
        else:
            verdict = "none: every layer's inputs and output identical" if dump else "—"
        lines.append(
            f"| {r['run']} | {r.get('identical', 0.0):.1%} | {r.get('mean_abs', 0.0):.4f}"
            f" | {r.get('max_abs', 0.0):.4f} | {verdict} |"
        )
    for r in rows:
        for layer in (r.get("moe_dump") or {}).get("per_layer") or []:
            ops = ", ".join(
                f"{op} {layer[op]['identical_rows']:.1%}"
                for op, _ in DUMP_OPS
                if "identical_rows" in layer.get(op, {})
            )
            info = r["moe_dump"]["layers"].get(layer["layer"], {})
            lines.append(
                f"- {r['run']} {layer['layer']} ({info.get('experts')}, input"
                f" {info.get('x_layout')}, unfused calls {info.get('unfused_calls')}): rows"
                f" identical: {ops}; output differs with identical inputs in"
                f" {layer.get('output_differs_with_same_inputs')} rows"
            )
    return "\n".join(lines) + "\n"
