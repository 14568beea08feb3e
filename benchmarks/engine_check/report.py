"""The report of a work area's runs: the engines compared (teacher-forced logprobs, greedy
tokens), throughput, the rounds, the GPU's time per step, fix 2 and every run's outcome, as
a summary (JSON) and as Markdown."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .compare import compare_greedy, compare_logprobs
from .layers import layer_lines, layer_rows
from .numerics import model_layers, model_section, reference_lines
from .results import measured
from .rounds import round_medians, round_pairs
from .runs import (
    GREEDY_TOKENS,
    LOGPROB_LEN,
    LOGPROB_PROMPTS,
    REPEATS,
    THROUGHPUT_PROMPT,
    THROUGHPUT_TOKENS,
)

# (what, run a, series a, run b, series b): logprob series compared position by position.
LOGPROB_PAIRS = (
    (
        "pristine: batch of 32 vs one by one",
        "pristine-emulation-L2",
        "batch",
        "pristine-emulation-L2",
        "single",
    ),
    (
        "overlay: batch of 32 vs one by one",
        "overlay-emulation-L2",
        "batch",
        "overlay-emulation-L2",
        "single",
    ),
    ("pristine vs overlay", "pristine-emulation-L2", "batch", "overlay-emulation-L2", "batch"),
    (
        "pristine emulation vs Marlin",
        "pristine-emulation-L2",
        "batch",
        "pristine-marlin-L2",
        "batch",
    ),
    (
        "overlay vs overlay EP2",
        "overlay-emulation-L2",
        "batch",
        "overlay-emulation-L2-ep2",
        "batch",
    ),
    (
        "overlay vs overlay TP2",
        "overlay-emulation-L2",
        "batch",
        "overlay-emulation-L2-tp2",
        "batch",
    ),
    (
        "pristine vs pristine EP2",
        "pristine-emulation-L2",
        "batch",
        "pristine-emulation-L2-ep2",
        "batch",
    ),
    (
        "pristine EP2 vs overlay EP2",
        "pristine-emulation-L2-ep2",
        "batch",
        "overlay-emulation-L2-ep2",
        "batch",
    ),
)
THROUGHPUT_ROWS = (
    ("0.24.0 emulation, pristine", "pristine-emulation-L12"),
    ("0.24.0 emulation + overlay", "overlay-emulation-L12"),
    ("Marlin (0.24.0's default on Hopper)", "pristine-marlin-L12"),
    ("BF16 model", "pristine-bf16-L12"),
    ("emulation, pristine, EP2 (2 GPUs)", "pristine-emulation-L12-ep2"),
    ("emulation + overlay, EP2 (2 GPUs)", "overlay-emulation-L12-ep2"),
    ("0.24.0 emulation + overlay, PDL off", "overlay-emulation-L12-nopdl"),
)


def summarize(
    results: dict[str, dict[str, Any]], references: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The report's figures from the runs' results (and the float64 references', by model,
    if any: each model's engines against its own)."""
    ok = {n: r for n, r in results.items() if measured(r)}
    return {
        "logprobs": logprob_rows(ok),
        "references": reference_sections(ok, references or {}),
        "layers": layer_rows(ok),
        "greedy": greedy_rows(ok),
        "throughput": throughput_rows(ok),
        "rounds": round_pairs(ok),
        "gpu": gpu_rows(ok),
        "runs": {name: run_row(r, name in ok) for name, r in results.items()},
    }


def reference_sections(
    ok: dict[str, dict[str, Any]], references: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per model with a float64 reference and runs of its engines (fewest layers first), the
    engines against it (numerics.py ``model_section``)."""
    order = sorted(references, key=lambda m: (model_layers(m) or 0, m))
    sections = (model_section(ok, model, references[model]) for model in order)
    return [section for section in sections if section is not None]


def sections_of(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary's reference sections; a summary written before there was one per model
    (``reference`` and ``paired``: the 2-layer model's) as its one section."""
    if "references" in summary:
        return list(summary["references"])
    if summary.get("reference"):
        return [{"layers": 2, "engines": summary["reference"], "paired": summary.get("paired")}]
    return []


def logprob_rows(ok: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """LOGPROB_PAIRS' comparisons whose two series were measured."""
    rows = []
    for what, ra, sa, rb, sb in LOGPROB_PAIRS:
        a, b = ok.get(ra, {}).get(f"logprobs_{sa}"), ok.get(rb, {}).get(f"logprobs_{sb}")
        if a and b:
            rows.append({"what": what, "a": ra, "b": rb, **compare_logprobs(a, b)})
    return rows


def greedy_rows(ok: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The greedy tokens of LOGPROB_PAIRS' engine pairs (not batch vs one by one) compared."""
    rows = []
    for what, ra, _, rb, _ in LOGPROB_PAIRS[2:]:
        a, b = ok.get(ra, {}).get("greedy"), ok.get(rb, {}).get("greedy")
        if a and b:
            rows.append({"what": what, "a": ra, "b": rb, **compare_greedy(a, b)})
    return rows


def throughput_rows(ok: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """THROUGHPUT_ROWS' engines: per batch, the median tokens/s, the best and the worst."""
    return {
        label: {
            b: {"median": t["median"], "best": max(t["repeats"]), "worst": min(t["repeats"])}
            for b, t in ok[name]["throughput"].items()
        }
        for label, name in THROUGHPUT_ROWS
        if name in ok and "throughput" in ok[name]
    }


def gpu_rows(ok: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per profiled run and batch, the GPU's busy time per step beside the step's wall time
    (from the median tokens/s)."""
    return {
        name: {
            b: {
                **p,
                "wall_us_per_step": 1e6 * int(b) / r["throughput"][b]["median"],
            }
            for b, p in r["gpu_profile"].items()
        }
        for name, r in ok.items()
        if "gpu_profile" in r
    }


def run_row(r: dict[str, Any], ok: bool) -> dict[str, Any]:
    """A run's line of the report: its outcome, start-up, GPUs, guard lines, what failed."""
    return {
        "ok": ok,
        "startup_s": r.get("startup_s"),
        "seconds": r.get("seconds"),
        "gpus": r.get("gpus"),
        "guard": r.get("guard", []),
        "capture_errors": r.get("capture_errors", []),
        "failing_frame": r.get("failing_frame"),
        "error": r.get("startup_error") or (r.get("error_tail") or [None])[-1],
        "moe_layers": layers_line(r),
    }


def layers_line(result: dict[str, Any]) -> str:
    """A run's MoE layers in a few words: each experts class with its count, and how many
    of its layers are tiled and have fast scales where the experts record it."""
    if "moe_layers_error" in result:
        return "not recorded: " + result["moe_layers_error"][:80]
    per_worker = result.get("moe_layers") or []
    if not per_worker:
        return "—"
    counts: dict[str, list[int]] = {}
    for layer in per_worker[0].values():  # the first worker (every rank builds the same)
        count = counts.setdefault(layer["experts"], [0, 0, 0])
        count[0] += 1
        count[1] += layer["tiled"] is True
        count[2] += layer["fast_scales"] is True
    return "; ".join(
        f"{n} {name}" + (f", {tiled} tiled, {fast} fast scales" if tiled or fast else "")
        for name, (n, tiled, fast) in counts.items()
    )


def markdown(summary: dict[str, Any], title: str, notes: Sequence[str] = ()) -> str:
    """The report in Markdown: a section per kind of figure the summary has, then the runs."""
    lines = [f"# {title}", ""]
    lines += [f"Note: {note}\n" for note in notes]
    lines += logprob_section(summary["logprobs"])
    for section in sections_of(summary):
        lines += reference_lines(
            section["engines"], section.get("paired"), section["layers"], section.get("apart")
        )
    lines += layer_lines(summary.get("layers") or [])
    lines += greedy_section(summary["greedy"])
    lines += throughput_section(summary["throughput"])
    lines += rounds_section(summary["rounds"])
    lines += gpu_section(summary["gpu"])
    lines += fix2_section(summary["runs"])
    lines += runs_section(summary["runs"])
    return "\n".join(lines) + "\n"


def logprob_section(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = [
        f"Teacher-forced logprobs, 2-layer model, {LOGPROB_PROMPTS} prompts of"
        f" {LOGPROB_LEN} tokens (nats; |Δ| per prompt position):",
        "",
        "| comparison | positions | identical | mean abs Δ | max abs Δ |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {c['what']} | {c['positions']} | {c['identical']:.1%} | {c['mean_abs']:.4f}"
        f" | {c['max_abs']:.4f} |"
        for c in rows
    ]
    return [*lines, ""]


def greedy_section(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = [
        f"Greedy tokens, 2-layer model ({GREEDY_TOKENS} tokens after each prompt):",
        "",
        "| comparison | identical sequences | mean common prefix |",
        "|---|---:|---:|",
    ]
    lines += [
        f"| {c['what']} | {c['identical']:.0%} | {c['mean_common_prefix']:.1f} / {c['tokens']} |"
        for c in rows
    ]
    return [*lines, ""]


def throughput_section(throughput: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    if not throughput:
        return []
    intro = (
        f"Generation throughput, 12-layer model, {THROUGHPUT_TOKENS} greedy tokens after a"
        f" {THROUGHPUT_PROMPT}-token prompt, CUDA graphs, tokens/s: median of {REPEATS}"
        " (slowest to fastest):"
    )
    rows = [([label], {b: _cell(t) for b, t in row.items()}) for label, row in throughput.items()]
    return batch_table(intro, ["engine"], rows)


def rounds_section(pairs: list[dict[str, Any]]) -> list[str]:
    if not pairs:
        return []
    intro = (
        "Interleaved rounds (`rounds`): in each, the overlay's run, then Marlin's on the"
        " reverted install, minutes apart; tokens/s, overlay / Marlin (ratio):"
    )
    rows = [
        (
            [str(r["layers"]), str(r["round"])],
            {
                b: f"{o:.0f} / {r['marlin'][b]:.0f} ({o / r['marlin'][b]:.2f}x)"
                for b, o in r["overlay"].items()
                if b in r["marlin"]
            },
        )
        for r in pairs
    ]
    rows += round_medians(pairs)
    return batch_table(intro, ["layers:", "round:"], rows)


def gpu_section(gpu: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    if not gpu:
        return []
    intro = (
        f"GPU time per step: one more generation per batch under torch's profiler, the"
        f" union of its kernels, copies and memsets on the GPU over {THROUGHPUT_TOKENS}"
        " steps; beside it the step's wall time from the median tokens/s above"
        " (µs per step, GPU busy / wall):"
    )
    rows = [
        (
            [name],
            {
                b: f"{p['busy_us_per_step']:.0f} / {p['wall_us_per_step']:.0f}"
                for b, p in row.items()
            },
        )
        for name, row in gpu.items()
    ]
    return batch_table(intro, ["run"], rows)


def fix2_section(runs: dict[str, dict[str, Any]]) -> list[str]:
    fix2 = {n: r for n, r in runs.items() if "fix2" in n}
    if not fix2:
        return []
    lines = [
        "Fix 2 in the engine: an FP8 model with static per-tensor activation scales, LoRA"
        " enabled, data parallel 2 with expert parallel (TritonExperts defers the input"
        " quantization to apply(), with a tensor a1_scale):",
        "",
    ]
    for name, r in fix2.items():
        if r["ok"]:
            lines.append(f"- {name}: started (CUDA graphs captured) and generated")
        else:
            errors = "; ".join(r["capture_errors"]) or str(r["error"])[:160]
            lines.append(f"- {name}: start-up failed: {errors}, at {r['failing_frame']}")
    return [*lines, ""]


def runs_section(runs: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "Runs:",
        "",
        "| run | GPUs | outcome | start-up (s) | guard plugin | MoE layers |",
        "|---|---|---|---:|---|---|",
    ]
    for name, r in runs.items():
        if r["ok"]:
            outcome = "ok"
        else:
            outcome = "FAILED: " + ("; ".join(r["capture_errors"]) or str(r["error"])[:120])
        guard = "<br>".join(r["guard"]) or "—"
        gpus = ",".join(map(str, r["gpus"] or []))
        layers = r.get("moe_layers", "—")
        lines.append(
            f"| {name} | {gpus} | {outcome} | {r['startup_s'] or '—'} | {guard} | {layers} |"
        )
    return lines


def batch_table(
    intro: str, head: list[str], rows: list[tuple[list[str], dict[str, str]]]
) -> list[str]:
    """A Markdown table of a column per batch size: ``head`` names the leading columns (a
    trailing ``:`` right-aligns one), each row its leading cells and its cells by batch."""
    batches = sorted({int(b) for _, cells in rows for b in cells})
    names = [h.rstrip(":") for h in head] + [f"batch {b}" for b in batches]
    aligns = ["---:" if h.endswith(":") else "---" for h in head] + ["---:"] * len(batches)
    lines = [intro, "", "| " + " | ".join(names) + " |", "|" + "|".join(aligns) + "|"]
    for lead, cells in rows:
        lines.append("| " + " | ".join(lead + [cells.get(str(b), "—") for b in batches]) + " |")
    return [*lines, ""]


def _cell(t: dict[str, float]) -> str:
    return f"{t['median']:.0f} ({t['worst']:.0f} to {t['best']:.0f})"
