"""The search for copies of the bug: every live place of the package where a line the patch
removes is (`bug_places`), in code related to the patch's (its scope, another method of its
class or of a class it derives from, a helper it calls, or surroundings alike). Each removed
line is searched for by its `Cue`: its tokens, trimmed of what the other side of the hunk
shares. One search of the tree serves every patch of a series (`_grep`).
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass

from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.series import locate
from vllm_patchset.series.case import Case
from vllm_patchset.series.line_evidence import LOCATE_RATIO
from vllm_patchset.series.token_evidence import Look, blob_text, related, without_separators
from vllm_patchset.series.verdict import HunkFinding


@dataclass(frozen=True)
class Cue:
    """One line of a hunk's change as it is searched for: its tokens on one side of the hunk,
    trimmed of what the other side shares, where they start in that side's tokens, and its
    text as the hunk writes it."""

    look: Look
    start: int
    words: tuple[str, ...]
    text: str
    line: tuple[str, ...] = ()  # its words on its own line (a comment holds one line)


def line_cues(look: Look, *, post: bool) -> list[Cue]:
    """The lines of each change of the hunk (the removed ones: the bug; `post`: the added
    ones, the fix), each trimmed of the tokens the other side shares (`layer.weight.device`
    against `w13.device`: `layer . weight . device`), at least four tokens long."""
    mine, other = (look.post, look.pre) if post else (look.pre, look.post)
    # (A hunk that starts or ends inside a call is no `readable` side; the tokens of its
    # changed lines are the same words.)
    cues: list[Cue] = []
    for (a, b), (c, d) in zip(mine.changes, other.changes, strict=True):
        theirs = other.words[c:d]
        for row in sorted({mine.tokens[i].start[0] for i in range(a, b)}):
            index = [i for i in range(a, b) if mine.tokens[i].start[0] == row]
            cue = _cue(look, mine, theirs, index[0], index[-1] + 1, post=post)
            if cue is not None:
                cues.append(cue)
    return cues


def _cue(
    look: Look, mine: locate.Side, theirs: tuple[str, ...], first: int, end: int, *, post: bool
) -> Cue | None:
    """The cue of the line whose tokens are `first`..`end` of `mine`: trimmed of what `theirs`
    (the other side's change) shares, widened to four tokens within the line; None where
    nothing of the line is its own, or too little to tell."""
    words = mine.words
    i, j = without_separators(words, first, end)
    if post and _shared(words[i:j], theirs):
        # A fix that only takes away (`a or b` -> `a`): the line and the token after it.
        end = min(len(words), end + 2)
        first, j = i, end
        theirs = ()
    i, j = _trimmed(words, i, j, theirs)
    if i >= j:
        return None  # the whole line is on the other side too
    i, j = _widened(words, i, j, first, end)
    return _cue_of(look, mine, i, j, post=post)


def _trimmed(words: tuple[str, ...], i: int, j: int, theirs: tuple[str, ...]) -> tuple[int, int]:
    """`words[i:j]` without the tokens it starts and ends with as `theirs` does."""
    k = 0
    while i + k < j and k < len(theirs) and words[i + k] == theirs[k]:
        k += 1
    m = 0
    while j - m > i + k and m < len(theirs) - k and words[j - 1 - m] == theirs[-1 - m]:
        m += 1
    return i + k, j - m


def _widened(words: tuple[str, ...], i: int, j: int, first: int, end: int) -> tuple[int, int]:
    """`words[i:j]` grown to four tokens within `first`..`end` (after its end first, and past
    a dot it ends on)."""
    while j - i < 4 and j < end:
        j += 1
    if j < end and words[j - 1] == ".":
        j += 1
    while j - i < 4 and i > first:
        i -= 1
    return i, j


def _cue_of(look: Look, mine: locate.Side, i: int, j: int, *, post: bool) -> Cue | None:
    """The cue of tokens `i`..`j` of `mine`; None for fewer than three, no name among them,
    or (the bug's) across lines."""
    words = mine.words
    names = [w for w in words[i:j] if w.isidentifier() and not keyword.iskeyword(w)]
    start, stop = mine.tokens[i], mine.tokens[j - 1]
    if j - i < 3 or not names or (start.start[0] != stop.end[0] and not post):
        return None
    line = mine.lines[start.start[0] - 1]
    text = line[start.start[1] : stop.end[1]] if start.start[0] == stop.end[0] else line.strip()
    own = tuple(words[k] for k in range(i, j) if mine.tokens[k].start[0] == start.start[0])
    return Cue(look, i, words[i:j], text, own)


def _shared(words: tuple[str, ...], theirs: tuple[str, ...]) -> bool:
    """Every token of `words` is at the start or the end of `theirs`."""
    k = 0
    while k < len(words) and k < len(theirs) and words[k] == theirs[k]:
        k += 1
    rest = words[k:]
    return not rest or theirs[len(theirs) - len(rest) :] == rest


def _reached(look: Look, finding: HunkFinding) -> range:
    """The rows of the look's file the patch changes (its one site, or git's place)."""
    size = len(look.hunk.pre)
    if len(look.sites) == 1 and look.row is not None:
        return range(look.row, look.row + size)
    at = finding.applies_at or (finding.found_at if finding.located else None)
    return range(at, at + size) if at else range(0)


_ANCESTORS: dict[tuple[str, str, str], tuple[str, ...]] = {}


def _ancestors(repo: Repo, tree: str, text: str, name: str) -> tuple[str, ...]:
    """The classes `name` derives from, through the package (a few levels: the base of a
    base in another module, e.g. modular_kernel.py's)."""
    key = (str(repo.path), tree, name)
    if key not in _ANCESTORS:
        if len(_ANCESTORS) > 4096:
            _ANCESTORS.clear()
        seen: list[str] = []
        frontier = list(locate.class_bases(text, name))
        while frontier and len(seen) < 12:
            base = frontier.pop(0)
            if base in seen or base == name:
                continue
            seen.append(base)
            for path in repo.grep_files(tree, f"class {base}", "*.py")[:4]:
                source = (repo.read_blob(tree, path) or b"").decode("utf-8", "surrogateescape")
                frontier += locate.class_bases(source, base)
        _ANCESTORS[key] = tuple(seen)
    return _ANCESTORS[key]


def _calls_helper(text: str, old: locate.Scope, new: locate.Scope) -> bool:
    """A module function `new` of the file that the function `old` names (a helper)."""
    if len(new) != 1 or not old:
        return False
    for start, end, path in locate.definitions(text):
        if path == old:
            rows = range(start, end + 1)
            return any(t.text == new[0] for t in locate.tokens(text) if t.start[0] in rows)
    return False


def bug_places(case: Case, applied: bool) -> tuple[list[tuple[str, bool]], list[str]]:
    """Every live place of the package where a removed line of the patch (the bug) is, in
    code related to the patch's (its scope, another method of its class or of a class it
    derives from, a helper it calls, or surroundings at least LOCATE_RATIO alike): (place,
    whether the patch, `applied`, changes it there), and the files skipped (past the readers'
    bounds)."""
    cues = bug_cues(case)
    if not cues:
        return [], []
    texts = sorted({cue.text for cue in cues})
    places: dict[str, bool] = {}
    skipped: list[str] = []
    for path in _grep(case.repo, case.tree, tuple(texts)):
        text = (case.repo.read_blob(case.tree, path) or b"").decode("utf-8", "surrogateescape")
        if not any(cue.text in text for cue in cues):
            continue  # (another patch's cue: one search serves them all)
        if locate.unreadable(text):
            skipped.append(path)
            continue
        for place, mine in _places_in(case, path, text, cues, applied):
            places[place] = places.get(place, False) or mine
    return sorted(places.items(), key=lambda p: _place_key(p[0])), skipped


def _places_in(
    case: Case, path: str, text: str, cues: list[Cue], applied: bool
) -> list[tuple[str, bool]]:
    """The places of the file `path` (`text`) where a cue is, in code related to the patch's:
    (place, whether the patch, `applied`, changes it there)."""
    findings = {h.number: h for h in case.hunks}
    out: list[tuple[str, bool]] = []
    for cue in cues:
        if cue.text not in text or not _may_relate(cue.look, path, text):
            continue
        reached = _reached(cue.look, findings[cue.look.number]) if applied else range(0)
        for row, scope in _related_hits(case, path, text, cue):
            place = f"{path}:{row} ({locate.dotted(scope)})"
            out.append((place, path == cue.look.path and row in reached))
    return out


_KNOWN: set[str] = set()  # every cue text asked for in this process
_GREPS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {}  # tree -> (texts, files)
_LAST: dict[str, str] = {}  # repository -> the last tree searched
_FEW = 400  # changed files searched by name; more: the whole tree again


def _grep(repo: Repo, tree: str, texts: tuple[str, ...]) -> tuple[str, ...]:
    """The Python files of `tree` holding one of `texts` (or of the texts asked before: one
    search serves every patch of a series). A tree id names its content: searched once per
    process; and a file whose blob did not change since the last tree searched (the tree
    with one more patch applied, the rebase's worktree, the next release) is not read
    again: only the files that changed are."""
    tree = repo.tree_of(tree)
    asked = frozenset(texts)
    known = _GREPS.get(tree)
    if known is not None and asked <= known[0]:
        return known[1]
    if len(_GREPS) > 256:
        _GREPS.clear()
        _LAST.clear()
    _KNOWN.update(asked)
    union = frozenset(_KNOWN)
    patterns = sorted(union)
    last = _LAST.get(str(repo.path))
    found: tuple[str, ...] | None = None
    if last is not None and last in _GREPS and _GREPS[last][0] == union:
        out = repo.run("diff", "--name-only", "--no-renames", "-z", last, tree, "--", "*.py")
        changed = {p for p in out.split("\0") if p}
        if len(changed) <= _FEW:
            kept = {p for p in _GREPS[last][1] if p not in changed}
            fresh = (
                repo.grep_files(tree, patterns[0], "*.py", *patterns[1:], paths=sorted(changed))
                if changed
                else []
            )
            found = tuple(sorted({*kept, *fresh}))
    if found is None:
        found = tuple(repo.grep_files(tree, patterns[0], "*.py", *patterns[1:]))
    _GREPS[tree] = (union, found)
    _LAST[str(repo.path)] = tree
    return found


def _may_relate(look: Look, path: str, text: str) -> bool:
    """A cheap test before a file's tokens: code related to a module function's can only be
    in a file that names it, or that holds most of its context lines (alike surroundings;
    vLLM's linear layers share fix 1's line, not its function). A method's: any file (a
    base class, or a base of one, may be anywhere)."""
    if path == look.path or (look.scope is not None and len(look.scope) > 1):
        return True
    if any(name in text for name in look.scope or ()):
        return True
    context = [line.strip() for line in look.hunk.pre if len(line.strip()) > 8]
    return bool(context) and 2 * sum(line in text for line in context) >= len(context)


def bug_cues(case: Case) -> list[Cue]:
    """The removed lines that tell the bug: live code where the patch was written (not a
    docstring's line, which a hunk starting inside it cannot tell), and not written again by
    the patch itself (`self.w1_scale_val` that the patch moves is no bug of the old code)."""
    posts = [look.post.words for look in case.looks]
    olds = {fp.path: fp.old_blob for fp in case.patch.files}
    cues = []
    for look in case.looks:
        blob = olds.get(look.path)
        old = blob_text(case.repo, blob) if blob else None
        for cue in line_cues(look, post=False):
            if any(locate.find(words, cue.words) for words in posts):
                continue
            if (old is None and not look.pre.readable) or (
                old is not None and not locate.find(locate.words(old), cue.words)
            ):
                continue
            cues.append(cue)
    return cues


def _place_key(place: str) -> tuple[str, int]:
    path, _, rest = place.partition(":")
    return path, int(rest.split(" ", 1)[0])


def _related_hits(
    case: Case, path: str, text: str, cue: Cue
) -> list[tuple[int, locate.Scope | None]]:
    look = cue.look
    hay = locate.words(text)
    toks = locate.tokens(text)
    hits = []
    for at in locate.find(hay, cue.words):
        row = toks[at].start[0]
        scope = locate.scope_of(text, row, toks[at + len(cue.words) - 1].end[0])
        start = max(0, at - cue.start)
        alike = (
            locate.similarity(hay[start : start + len(look.pre.words)], look.pre.words)
            >= LOCATE_RATIO
        )
        if alike or _related_scope(case, look, path, text, scope):
            hits.append((row, scope))
    return hits


def _related_scope(
    case: Case, look: Look, path: str, text: str, scope: locate.Scope | None
) -> bool:
    old = look.scope
    if old is None or scope is None:
        return False
    if related(old, scope, ()):
        return True
    if path == look.path and _calls_helper(text, old, scope):
        return True
    if len(old) > 1 and scope and look.text is not None:
        return scope[0] in _ancestors(case.repo, case.tree, look.text, old[0])
    return False
