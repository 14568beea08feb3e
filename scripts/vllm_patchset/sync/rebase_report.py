"""What a rebase says: the text and JSON reports, the range-diff verdict of a refreshed patch,
and the CHANGELOG.md section it adds."""

from __future__ import annotations

import datetime
import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_patchset.series.edits import rewrite_paths
from vllm_patchset.sync.rebase_state import Action, Choice, Phase, RebaseState, Section, Step
from vllm_patchset.sync.verdict_reports import verdict_json, versions_json


@dataclass(frozen=True)
class Outcome:
    state: RebaseState
    status: Phase  # STOPPED or DONE
    worktree: Path
    lines: tuple[str, ...] = ()  # next steps (stopped) or where things went (done)
    changelog: str = ""
    started: bool = True  # False: stopped before anything was written (decisions needed)


# -- range-diff ----------------------------------------------------------------------------------
def _changes(raw: bytes) -> list[str]:
    """The diff part of a patch with what a refresh may change (index lines, line numbers,
    context) marked, for the range-diff."""
    diff = raw.decode("utf-8", "replace").partition("\ndiff --git ")[2]
    out = []
    for line in ("diff --git " + diff).split("\n"):
        if line.startswith("index ") or line == "-- ":
            continue
        if line.startswith("@@"):
            out.append("@@ " + line.split("@@", 2)[-1].strip())
        else:
            out.append(line)
    return out


def range_diff(old: bytes, new: bytes, moves: dict[str, str] | None = None) -> tuple[str, str]:
    """unchanged / context-only churn / content changed, and then the diff of the diffs. The
    old patch is compared with its paths moved (`moves`): a move alone is not a change."""
    old = rewrite_paths(old, moves) if moves else old
    if old == new:
        return "unchanged", ""
    a, b = _changes(old), _changes(new)

    def changed(lines: list[str]) -> list[str]:
        return [
            line
            for line in lines
            if line.startswith(("diff --git", "+", "-")) and not line.startswith(("+++", "---"))
        ]

    if changed(a) == changed(b):
        return "context-only churn", ""
    diff = difflib.unified_diff(a, b, "old patch", "new patch", lineterm="", n=2)
    return "content changed", "\n".join(diff) + "\n"


# -- short names ---------------------------------------------------------------------------------
def option_name(key: str, keys: tuple[str, ...]) -> str:
    """ "0002" for "0002-....patch" (and "upstreamed/0001" for an archived one) when no other
    patch has that number, else the whole key: what `--keep`/`--drop` accept."""
    match = re.match(r"^((?:[^/]+/)?\d+)-", key)
    if match and sum(k.startswith(match.group(1) + "-") for k in keys) == 1:
        return match.group(1)
    return key


def option_flags(step: Step, keys: tuple[str, ...], release: str | None) -> list[str]:
    name = option_name(step.key, keys)
    flags = []
    for choice in step.options:
        flag = f"{choice.flag} {name}"
        if choice == Choice.RESOLVE_UPSTREAM and release is None:
            flag += " --release VERSION"
        flags.append(flag)
    return flags


_OPTION_MEANS = {
    (Section.SERIES, Choice.KEEP): "park it in patches/parked/ (kept, not applied; port it later)",
    (Section.SERIES, Choice.DROP): "remove it",
    (Section.SERIES, Choice.RESOLVE_UPSTREAM): "archive it in patches/upstreamed/ as fixed"
    " upstream (its regression test keeps guarding)",
    (Section.SERIES, Choice.PORT): "take it with `git am -3` in .rebase/worktree and stop there"
    " to port it by hand (`rebase --continue` carries it)",
    (Section.UPSTREAMED, Choice.KEEP): "carry it again in patches/series",
    (Section.UPSTREAMED, Choice.DROP): "remove it from the archive",
}


def decisions_needed(state: RebaseState) -> list[dict[str, Any]]:
    keys = tuple(s.key for s in state.steps)
    return [
        {
            "patch": s.key,
            "state": s.verdict.state.value,
            "verdict": s.verdict.reason.value,
            "options": option_flags(s, keys, state.onto.version),
            "means": [_OPTION_MEANS[(s.section, c)] for c in s.options],
        }
        for s in state.steps
        if s.action == Action.DECISION
    ]


# -- text ----------------------------------------------------------------------------------------
_DETAIL = {
    Action.CARRIED: "stays in patches/upstreamed/",
    Action.UNARCHIVED: "-> patches/series (--keep: applies again)",
    Action.DROPPED: "dropped (--drop)",
    Action.CONFLICT: "CONFLICT: the rebase stopped here",
}


def _detail(step: Step) -> str:
    """What the rebase did with one patch, as the text report's line says it."""
    if step.action.committed and step.action != Action.UNARCHIVED:
        moved = ", ".join(f"moved: {a} -> {b}" for a, b in step.verdict.moved_to)
        what = step.range_diff or "taken"
        return f"{step.action.value} ({what}{'; ' + moved if moved else ''})"
    if step.action == Action.ARCHIVED:
        how = " (--resolve-upstream)" if step.decision == Choice.RESOLVE_UPSTREAM else ""
        return f"-> patches/upstreamed/{how} (Applied-upstream: {step.applied_upstream or 'empty'})"
    if step.action == Action.PARKED:
        if step.section == Section.PARKED:
            return "stays in patches/parked/"
        return "-> patches/parked/ (--keep)"
    if step.action == Action.DECISION:
        return f"DECISION NEEDED ({step.verdict.reason.value})"
    return _DETAIL[step.action]


def render_text(outcome: Outcome, *, verbose: bool = False) -> str:
    state = outcome.state
    needed = decisions_needed(state)
    headline = f"rebase {state.old_pin} -> {state.onto.label}: {outcome.status.value}"
    if needed:
        headline += f", {len(needed)} decision(s) needed"
    if not outcome.started:
        headline += " (nothing has changed)"
    out = [headline, *_steps_text(state.steps, verbose=verbose)]
    if needed:
        out.append(
            "decisions needed (rerun with one option per patch"
            + ("; nothing has changed):" if not outcome.started else "):")
        )
        for item in needed:
            out.append(f"  {item['patch']} ({item['state']}, {item['verdict']}):")
            pairs = zip(item["options"], item["means"], strict=True)
            out += [f"    {flag}: {means}" for flag, means in pairs]
    if outcome.status == Phase.STOPPED and state.stop == Action.CONFLICT:
        out += [state.steps[-1].report, "next steps:", *(f"  {line}" for line in outcome.lines)]
    elif outcome.status == Phase.STOPPED:
        out += [f"  {line}" for line in outcome.lines]
    elif outcome.status == Phase.DONE:
        out += [*outcome.lines, "", outcome.changelog.rstrip("\n")]
    return "\n".join(out)


def _steps_text(steps: tuple[Step, ...], *, verbose: bool) -> list[str]:
    """A line per patch with its notes; the warnings; the cosmetic notes (or their count);
    the range-diffs."""
    out = []
    width = max(len(s.key) for s in steps) if steps else 0
    cosmetic = 0
    for step in steps:
        out.append(f"  {step.key.ljust(width)}  {step.verdict.state.value:<8}  {_detail(step)}")
        out += [f"    * {note}" for note in step.notes]
        cosmetic += len(step.verdict.cosmetic)
        if verbose:
            out += [f"    * (cosmetic) {note}" for note in step.verdict.cosmetic]
    for step in steps:
        out += [f"WARNING: {step.key}: {w}" for w in step.verdict.warnings]
    if cosmetic and not verbose:
        out.append(f"{cosmetic} cosmetic note(s) on upstreamed code (--verbose shows them)")
    for step in steps:
        if step.diff_of_diffs:
            out += [f"range-diff of {step.name}:", step.diff_of_diffs.rstrip("\n")]
    return out


# -- JSON ----------------------------------------------------------------------------------------
def report_body(outcome: Outcome) -> dict[str, Any]:
    """`rebase --json`'s report (console.emit makes it the document)."""
    state = outcome.state
    doc: dict[str, Any] = {
        "versions": versions_json({state.onto.label: [s.verdict for s in state.steps]}),
        "status": outcome.status.value,
        "started": outcome.started,
        "from": state.old_pin,
        "onto": {
            "label": state.onto.label,
            "version": state.onto.version,
            "source": state.onto.source,
            "commit": state.onto.commit,
        },
        "patches": {
            s.key: {
                "file": s.name,
                "section": s.section.value,
                **verdict_json(s.verdict),
                "action": s.action.value,
                "decision": s.decision.value if s.decision else None,
                "notes": list(s.notes),
                "range_diff": s.range_diff or None,
                "diff_of_diffs": s.diff_of_diffs or None,
                "applied_upstream": s.applied_upstream or None,
                "upstream_pr": s.upstream_pr,
            }
            for s in state.steps
        },
        "warnings": [f"{s.key}: {w}" for s in state.steps for w in s.verdict.warnings],
        "decisions": decisions_needed(state),
    }
    if outcome.status == Phase.STOPPED and state.stop == Action.CONFLICT:
        doc["conflict"] = {
            "patch": state.steps[-1].key,
            "worktree": str(outcome.worktree),
            "report": state.steps[-1].report,
            "next_steps": list(outcome.lines),
        }
    if outcome.status == Phase.DONE:
        doc["pin"] = state.new_pin
        doc["changelog"] = outcome.changelog
        doc["changed_files"] = list(state.changed)
        doc["overlay_empty"] = not any(s.action.committed for s in state.steps)
    return doc


# -- CHANGELOG.md --------------------------------------------------------------------------------
def today() -> str:
    # SOURCE_DATE_EPOCH (reproducible-builds.org) fixes the date for tests and CI.
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    now = (
        datetime.datetime.fromtimestamp(int(epoch), datetime.UTC)
        if epoch and epoch.isdigit()
        else datetime.datetime.now(datetime.UTC)
    )
    return now.date().isoformat()


def _pr(url: str) -> str:
    match = re.search(r"/pull/(\d+)$", url)
    return f"[#{match.group(1)}]({url})" if match else url


def changelog_entry(
    state: RebaseState, date: str, *, requirement: bool = False, images: bool = False
) -> str:
    """The Keep a Changelog section that the rebase adds (`requirement`, `images`: whether the
    `vllm==` requirement and the GPU CI images moved with the pin)."""
    new = state.new_pin
    along = [
        *([f"`vllm=={new}`"] if requirement else []),
        *([f"GPU validation images `v{new}`"] if images else []),
    ]
    lines = [
        f"## [vllm-{new}] - {date}",
        "",
        f"Rebased onto vLLM {new} (from {state.old_pin}) by `vllm-patchset rebase`.",
        "",
        "### Changed",
        "",
        f"- Pin: vLLM {state.old_pin} -> {new}" + (f" ({', '.join(along)})." if along else "."),
    ]
    settled = [s for s in state.steps if s.section != Section.PARKED]
    lines += [line for s in settled if (line := _changed(s, new))]
    carried = [f"`{s.name}`" for s in settled if s.action.committed]
    lines.append(f"- Still carried: {', '.join(carried) or 'none'}.")
    removed = [line for s in settled if (line := _removed(s, new))]
    if removed:
        lines += ["", "### Removed", "", *removed]
    return "\n".join(lines) + "\n"


def _changed(s: Step, new: str) -> str:
    """The `### Changed` line of a patch still in the project ("" for none)."""
    moved = "; ".join(f"moved: `{a}` -> `{b}`" for a, b in s.verdict.moved_to)
    how = "; ".join(x for x in (s.range_diff, moved) if x)
    if s.action == Action.REFRESHED and (s.range_diff != "unchanged" or moved):
        return f"- Refreshed `{s.name}` ({how})."
    if s.action == Action.RESOLVED:
        return f"- Conflict resolved in `{s.name}` ({how})."
    if s.action == Action.PARKED:
        return (
            f"- Parked `{s.name}` (--keep): {s.verdict.words} on vLLM {new}; kept in"
            " `patches/parked/`, not applied."
        )
    if s.action == Action.UNARCHIVED:
        return (
            f"- Carried again: `{s.name}` (--keep): upstream's fix is gone from vLLM {new};"
            " back in `patches/series`."
        )
    return ""


def _removed(s: Step, new: str) -> str:
    """The `### Removed` line of a patch out of the series ("" for none)."""
    if s.action == Action.ARCHIVED and s.decision == Choice.RESOLVE_UPSTREAM:
        return (
            f"- Resolved as upstream (--resolve-upstream): `{s.name}`, fixed in vLLM"
            f" {s.applied_upstream or new}; archived in `patches/upstreamed/`."
        )
    if s.action == Action.ARCHIVED and s.section == Section.SERIES:
        where = f"vLLM {s.applied_upstream}" if s.applied_upstream else new
        return (
            f"- Dropped as upstream: `{s.name}`, merged in {where} by {_pr(s.upstream_pr)};"
            " archived in `patches/upstreamed/`."
        )
    if s.action == Action.DROPPED:
        return f"- Dropped `{s.name}` (--drop): {s.verdict.words} on vLLM {new}."
    return ""
