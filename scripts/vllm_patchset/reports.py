"""Text and JSON renderings of verdicts (status, matrix, check)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

from vllm_patchset.states import Verdict


def verdict_json(verdict: Verdict) -> dict[str, object]:
    """A verdict in the JSON reports (matrix details, rebase patches)."""
    return {
        "state": verdict.state.value,
        "verdict": verdict.reason.value,
        "text_state": verdict.text_state.value,
        "trailer_state": verdict.trailer_state.value if verdict.trailer_state else None,
        "three_way": verdict.three_way,
        "moved_to": {a: b for a, b in verdict.moved_to} or None,
        "candidates": list(verdict.candidates),
        "warnings": list(verdict.warnings),
        "disagreements": list(verdict.disagreements),
        "hunks": [
            {
                "file": h.file,
                "number": h.number,
                "header": h.header,
                "applies_at": h.applies_at,
                "offset": h.offset,
                "result_present": h.result_present,
                "located": h.located,
                **(
                    {"expected": list(h.expected), "found": list(h.found), "found_at": h.found_at}
                    if h.applies_at is None and not h.result_present
                    else {}
                ),
            }
            for h in verdict.hunks
        ],
    }


def versions_json(columns: Mapping[str, Iterable[Verdict]]) -> dict[str, dict[str, str]]:
    """`{"<version>": {"<patch>": "<state>"}}`: the shape `matrix --json` and `rebase --json`
    share (scripts and CI read it)."""
    return {label: {v.patch: v.state.value for v in vs} for label, vs in columns.items()}


def matrix_json(columns: dict[str, Sequence[Verdict]]) -> str:
    doc = {
        "versions": versions_json(columns),
        "details": {label: {v.patch: verdict_json(v) for v in vs} for label, vs in columns.items()},
    }
    return json.dumps(doc, indent=2)


def state_cell(verdict: Verdict) -> str:
    cell = verdict.state.value
    if verdict.reason.value != verdict.state.value:
        cell += f" ({verdict.reason.value})"
    if verdict.offsets and verdict.state.value == "applies":
        cell += f" (offset {','.join(f'{o:+d}' for o in verdict.offsets)})"
    if verdict.disagreements:
        cell += " *"
    return cell


def matrix_table(columns: dict[str, Sequence[Verdict]]) -> str:
    patches = list(dict.fromkeys(v.patch for vs in columns.values() for v in vs))
    rows = [["version", *patches]]
    for label, verdicts in columns.items():
        by_patch = {v.patch: state_cell(v) for v in verdicts}
        rows.append([label, *(by_patch.get(p, "-") for p in patches)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    notes = [
        f"* {label} {v.patch}: {note}"
        for label, vs in columns.items()
        for v in vs
        for note in v.disagreements
    ]
    return "\n".join([*lines, *notes])


def conflict_report(verdict: Verdict) -> str:
    reason = f" ({verdict.reason.value})" if verdict.reason.value != verdict.state.value else ""
    out = [f"{verdict.patch} on {verdict.base}: {verdict.state.value}{reason}"]
    for h in verdict.hunks:
        if h.applies_at is not None or h.result_present:
            continue
        out.append(f"  hunk {h.number} {h.file} {h.header}: expected")
        out += [f"    | {line}" for line in h.expected]
        if h.found_at is not None:
            out.append(f"  {verdict.base} has at line {h.found_at}:")
            out += [f"    | {line}" for line in h.found]
        else:
            out.append(f"  {verdict.base} has no such file")
    return "\n".join(out)
