"""Where a hunk is in a file, by its lines: its pre-image exactly (with the offset), or the
closest window of the file when the text changed; and whether its result is there (its code
lines, comments and blank lines aside, so a backport whose comments differ from upstream's is
still recognised). The token-based evidence (token_evidence.py) refines these findings.
"""

from __future__ import annotations

import difflib

from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.series import locate
from vllm_patchset.series.patches import Hunk, Patch
from vllm_patchset.series.verdict import HunkFinding

LOCATE_RATIO = 0.8  # a pre-image window this similar is "the same code, changed"


def stripped_code(lines: tuple[str, ...] | list[str]) -> list[str]:
    """The lines of code, stripped: blank lines and comment lines left out."""
    stripped = (line.strip() for line in lines)
    return [line for line in stripped if line and not line.startswith("#")]


def find_block(haystack: list[str], needle: list[str] | tuple[str, ...]) -> list[int]:
    """Every index where the lines `needle` start in `haystack`, whole lines alike."""
    if not needle:
        return []
    first = needle[0]
    size = len(needle)
    return [
        i
        for i, line in enumerate(haystack)
        if line == first and tuple(haystack[i : i + size]) == tuple(needle)
    ]


def _closest_window(lines: list[str], pre: tuple[str, ...]) -> tuple[float, int]:
    if not pre or not lines:
        return 0.0, 0
    target = [line.strip() for line in pre]
    stripped = [line.strip() for line in lines]
    best_ratio, best_at = 0.0, 0
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(target)
    for start in range(max(1, len(stripped) - len(target) + 1)):
        matcher.set_seq1(stripped[start : start + len(target)])
        if matcher.real_quick_ratio() <= best_ratio or matcher.quick_ratio() <= best_ratio:
            continue
        ratio = matcher.ratio()
        if ratio > best_ratio:
            best_ratio, best_at = ratio, start
    return best_ratio, best_at


def change_groups(hunk: Hunk) -> list[tuple[list[str], list[str]]]:
    """(removed, added) code lines of each run of changed lines in the hunk."""
    return [
        (stripped_code(removed), stripped_code(added))
        for removed, added in locate.change_runs(hunk)
    ]


def _result_present(code_lines: list[str], hunk: Hunk) -> bool:
    """Every change of the hunk is there: its added code found, its removed code gone."""
    for removed, added in change_groups(hunk):
        if removed and find_block(code_lines, removed):
            return False
        if added and not find_block(code_lines, added):
            return False
    if any(added for _, added in change_groups(hunk)):
        return True
    # A pure removal: its context must still be there to tell "removed" from "absent".
    context = stripped_code(tuple(line[1:] for line in hunk.lines if line[0] == " "))
    return bool(find_block(code_lines, context))


def find_hunk(
    lines: list[str], code_lines: list[str], exists: bool, path: str, number: int, hunk: Hunk
) -> HunkFinding:
    """Where the hunk's pre-image is in the file: exactly, or the closest window."""
    header = f"@@ -{hunk.old_start} +{hunk.new_start} @@"
    if not exists:
        return HunkFinding(path, number, header, None, None, False, False, hunk.pre, (), None)
    present = _result_present(code_lines, hunk)
    exact = find_block(lines, hunk.pre)
    if exact:
        at = min(exact, key=lambda i: abs(i + 1 - hunk.old_start)) + 1
        return HunkFinding(
            path, number, header, at, at - hunk.old_start, present, True, hunk.pre, (), None
        )
    ratio, start = _closest_window(lines, hunk.pre)
    window = tuple(lines[start : start + len(hunk.pre)])
    return HunkFinding(
        path,
        number,
        header,
        None,
        None,
        present,
        ratio >= LOCATE_RATIO,
        hunk.pre,
        window,
        start + 1,
    )


def find_hunks(repo: Repo, tree: str, patch: Patch) -> tuple[HunkFinding, ...]:
    findings: list[HunkFinding] = []
    number = 0
    for file_patch in patch.files:
        blob = repo.read_blob(tree, file_patch.path)
        text = blob.decode("utf-8", "surrogateescape") if blob is not None else ""
        lines = text.split("\n") if blob is not None else []
        code_lines = stripped_code(locate.live_lines(text)) if blob is not None else []
        for hunk in file_patch.hunks:
            number += 1
            findings.append(
                find_hunk(lines, code_lines, blob is not None, file_patch.path, number, hunk)
            )
    return tuple(findings)
