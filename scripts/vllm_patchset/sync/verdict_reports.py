"""The reports of verdicts (status, matrix, rebase) as data: the text a person reads and the
body of the JSON document; `console.emit` prints the one or the other."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from vllm_patchset.console import table
from vllm_patchset.series.verdict import WHOLE_HEADERS, Verdict


def verdict_json(verdict: Verdict) -> dict[str, object]:
    """A verdict in the JSON reports (matrix details, rebase patches)."""
    doc = verdict.to_doc()
    return {
        "state": doc["state"],
        "verdict": doc["reason"],
        "text_state": doc["text_state"],
        "trailer_state": doc["trailer_state"],
        "three_way": doc["three_way"],
        "moved_to": dict(verdict.moved_to) or None,
        "candidates": doc["candidates"],
        "warnings": doc["warnings"],
        "disagreements": list(verdict.disagreements),
        "hunks": [
            # The expected and found lines only where the hunk does not apply.
            {
                k: v
                for k, v in h.items()
                if (h["applies_at"] is None and not h["result_present"])
                or k not in ("expected", "found", "found_at")
            }
            for h in doc["hunks"]
        ],
    }


def versions_json(columns: Mapping[str, Iterable[Verdict]]) -> dict[str, dict[str, str]]:
    """`{"<version>": {"<patch>": "<state>"}}`: the shape `matrix --json` and `rebase --json`
    share (scripts and CI read it)."""
    return {label: {v.patch: v.state.value for v in vs} for label, vs in columns.items()}


def matrix_body(columns: Mapping[str, Sequence[Verdict]]) -> dict[str, object]:
    """`matrix --json`'s report: each version's states, and each verdict in full."""
    return {
        "versions": versions_json(columns),
        "details": {label: {v.patch: verdict_json(v) for v in vs} for label, vs in columns.items()},
    }


def status_report(
    package: str,
    pin: str,
    verdicts: Sequence[Verdict],
    parked: Mapping[str, str],
    freshness: str,
    *,
    verbose: bool,
) -> tuple[str, dict[str, object]]:
    """`status`: the text (the pin, a line a patch, the notes, the lock) and the JSON body;
    `parked`: the reason of each parked patch."""
    lines = [f"pin: {package} {pin}"]
    for verdict in verdicts:
        why = f" (parked: {parked[verdict.patch]})" if verdict.patch in parked else ""
        lines.append(f"  {verdict.patch}: {state_cell(verdict)}{why}")
    lines += note_lines([(v.patch, v) for v in verdicts], verbose=verbose)
    step = lock_next_step(freshness)
    lines.append(f"lock: {freshness}" + (f": {step}" if step else ""))
    body: dict[str, object] = {
        "pin": pin,
        "patches": {v.patch: v.state.value for v in verdicts},
        "warnings": {v.patch: list(v.warnings) for v in verdicts},
        "disagreements": {v.patch: list(v.disagreements) for v in verdicts},
        "parked": dict(parked),
        "lock": freshness,
    }
    return "\n".join(lines), body


# What rewrites a lock that is stale or missing (the overlay built from the series as it is).
UPDATE_LOCK = "`vllm-patchset overlay build --update-lock` rewrites it (then commit it)"


def lock_next_step(freshness: str) -> str:
    """The next step after the lock's freshness ("fresh", "missing", "stale (...)"): none
    for a fresh lock."""
    return "" if freshness == "fresh" else UPDATE_LOCK


def state_cell(verdict: Verdict) -> str:
    cell = verdict.state.value
    if verdict.reason.value != verdict.state.value:
        cell += f" ({verdict.reason.value})"
    if verdict.offsets and verdict.state.value == "applies":
        cell += f" (offset {','.join(f'{o:+d}' for o in verdict.offsets)})"
    if verdict.warnings:
        cell += " *"
    return cell


def note_lines(notes: Sequence[tuple[str, Verdict]], *, verbose: bool) -> list[str]:
    """The notes of (where, verdict) pairs: each warning (a disagreement that changes a
    decision) on a `* WARNING` line; the cosmetic ones (comments or surrounding text differ on
    an upstreamed patch) one a line with `verbose`, else folded into a count."""
    lines = [f"* WARNING {where}: {note}" for where, v in notes for note in v.warnings]
    cosmetic = [f"  note {where}: {note}" for where, v in notes for note in v.cosmetic]
    if verbose:
        lines += cosmetic
    elif cosmetic:
        lines.append(f"{len(cosmetic)} cosmetic note(s) on upstreamed code (--verbose shows them)")
    return lines


STATE_STYLES = {"applies": "green", "upstream": "cyan", "absent": "dim", "conflict": "bold red"}
LEGEND = (
    "states: applies (needed, applies cleanly), upstream (the version has the fix), absent"
    " (the code it fixes is not there), conflict (needed, does not apply); (verdict) when finer,"
    " * a warning below"
)


def column_id(patch: str) -> str:
    """A patch's column heading: its number, `U` before an upstreamed one's, `P` before a
    parked one's (`0002`, `U0001`, `P0003`); a file with no number keeps its name."""
    folder, _, name = patch.rpartition("/")
    number = name.split("-", 1)[0]
    if not number.isdigit():
        return patch
    return {"upstreamed": "U", "parked": "P"}.get(folder, "") + number


def unique_ids(patches: Sequence[str]) -> dict[str, str]:
    """Each patch's column id, unique among `patches` (series, archive and parked together):
    where two share one (`U0001` for two archived fixes numbered 0001), the first word of
    the name joins it (`U0001-nvfp4`), else the whole key."""
    short = {p: column_id(p) for p in patches}
    shared = {i for i in short.values() if list(short.values()).count(i) > 1}
    ids = {
        p: f"{i}-{p.rpartition('/')[2].split('-')[1]}" if i in shared and i != p else i
        for p, i in short.items()
    }
    taken = list(ids.values())
    return {p: p if taken.count(i) > 1 else i for p, i in ids.items()}


def _state_cells(verdicts: Sequence[Verdict], patches: Sequence[str]) -> list[tuple[str, str]]:
    """One version's row of the matrix: each patch's state cell and its style ("-" where the
    version has no verdict of it)."""
    by_patch = {v.patch: v for v in verdicts}
    return [
        (state_cell(by_patch[p]), STATE_STYLES[by_patch[p].state.value])
        if p in by_patch
        else ("-", "")
        for p in patches
    ]


def matrix_table(
    columns: dict[str, Sequence[Verdict]], *, colour: bool = False, verbose: bool = False
) -> str:
    """Versions as rows, patches as columns under their column ids (a rich `Table`: a cell
    too wide for the terminal is wrapped inside its column), a legend of both; states
    coloured when `colour`. The legend and the notes are fitted by `console.emit`."""
    patches = list(dict.fromkeys(v.patch for vs in columns.values() for v in vs))
    ids = unique_ids(patches)
    rows = [[(label, ""), *_state_cells(verdicts, patches)] for label, verdicts in columns.items()]
    lines = [table(["version", *(ids[p] for p in patches)], rows, colour=colour)]
    key = max(len(i) for i in ids.values()) if ids else 0
    # Under patches/ (not named on each line: the archive's longest names would need 82 of
    # the 80 columns a pipe gets).
    named = [p for p in patches if ids[p] != p]
    lines += ["ids (patches/):"] if named else []
    lines += [f"{ids[p].ljust(key)}  {p}" for p in named]
    lines.append(LEGEND)
    notes = [(f"{label} {ids[v.patch]}", v) for label, vs in columns.items() for v in vs]
    lines += note_lines(notes, verbose=verbose)
    return "\n".join(lines)


def conflict_report(verdict: Verdict) -> str:
    reason = f" ({verdict.reason.value})" if verdict.reason.value != verdict.state.value else ""
    out = [f"{verdict.patch} on {verdict.base}: {verdict.state.value}{reason}"]
    for h in verdict.hunks:
        if h.applies_at is not None or h.result_present:
            continue
        if h.header in WHOLE_HEADERS.values():  # a file the patch adds or deletes whole
            other = "another file at its path" if h.header == "new file" else "another file"
            out.append(f"  hunk {h.number} {h.file} ({h.header}): {verdict.base} has {other}")
            continue
        out.append(f"  hunk {h.number} {h.file} {h.header}: expected")
        out += [f"    | {line}" for line in h.expected]
        if h.found_at is not None:
            out.append(f"  {verdict.base} has at line {h.found_at}:")
            out += [f"    | {line}" for line in h.found]
        else:
            out.append(f"  {verdict.base} has no such file")
    return "\n".join(out)
