"""What a deploy command reports: the state of each overlaid file, the outcome, the notes; and
the unified diff of `overlay diff` / `apply --diff`."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_patchset.console import diff_line_style, paint
from vllm_patchset.deploy.record import Step
from vllm_patchset.overlay.lock import Lock, LockEntry

if TYPE_CHECKING:
    from vllm_patchset.deploy.target import Target


@dataclass(frozen=True)
class FileState:
    path: str
    state: str  # pristine | patched | modified | missing: after the command (now, on a dry run)
    sha256: str | None
    action: str | None = None  # what the command did (would do, on a dry run): patch | restore


@dataclass(frozen=True)
class PatchState:
    patch: str
    state: str  # applied | not applied | partly: from the states of the files the lock maps to it
    files: tuple[str, ...]


@dataclass(frozen=True)
class Report:
    command: str
    outcome: str
    ok: bool
    target: str
    version: str | None  # None: the package is not installed there (any more)
    lock_version: str
    patches: tuple[str, ...]
    files: tuple[FileState, ...]
    notes: tuple[str, ...] = ()
    by_patch: tuple[PatchState, ...] = ()  # status: each patch of the lock, applied or not

    def head(self) -> str:
        return (
            f"overlay {self.command}: {self.outcome} ({self.target},"
            f" {self.version or 'not installed'};"
            f" overlay for {self.lock_version}: {', '.join(self.patches) or 'no patches'})"
        )

    def text(self) -> str:
        lines = [self.head()]
        lines += [f"  {f.action or f.state:10} {f.path}" for f in self.files]
        if self.by_patch:
            lines.append("  by patch (the lock's map of files to patches):")
            lines += [f"    {p.state:11} {p.patch}" for p in self.by_patch]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def patch_states(lock: Lock, files: Iterable[FileState]) -> tuple[PatchState, ...]:
    """Each patch of `lock`: applied when every file it touches is patched, not applied when
    none is, else partly (the per-file view says which)."""
    states = {f.path: f.state for f in files}
    out = []
    for patch in lock.patches:
        paths = tuple(e.path for e in lock.entries if patch in e.patches)
        found = {states.get(p) for p in paths}
        if found == {"patched"}:
            state = "applied"
        elif "patched" in found:
            state = "partly"
        else:
            state = "not applied"
        out.append(PatchState(patch, state, paths))
    return tuple(out)


def state_of(entry: LockEntry, sha: str | None) -> str:
    """The state of an installed file of sha256 `sha` (None: no file there): a file the
    overlay adds is pristine when absent, one it deletes patched when absent."""
    if sha == entry.patched_sha256:
        return "patched"
    if sha == entry.pristine_sha256:
        return "pristine"
    return "missing" if sha is None else "modified"


def files_after(files: Iterable[FileState], lock: Lock, steps: Iterable[Step]) -> list[FileState]:
    """The files as the steps left them (what a report shows after a change)."""
    done = {s.path: s.after_sha256 or None for s in steps}
    return [
        FileState(f.path, state_of(entry, done[f.path]), done[f.path], f.action)
        if f.path in done and entry is not None
        else f
        for f in files
        for entry in [lock.entry(f.path)]
    ]


def make_report(
    command: str,
    outcome: str,
    target: Target,
    lock: Lock,
    files: Iterable[FileState],
    notes: Iterable[str | None] = (),
    *,
    ok: bool = True,
) -> Report:
    kept = tuple(n for n in notes if n)
    return Report(
        command,
        outcome,
        ok,
        target.where,
        target.version,
        lock.version,
        lock.patches,
        tuple(files),
        kept,
    )


def unified_diff(path: str, before: bytes | None, after: bytes | None) -> str:
    """`before` to `after` (None: no file) as a unified diff that `patch -p1` applies in the
    target dir."""
    old = [] if before is None else before.decode("utf-8", "surrogateescape").splitlines(True)
    new = [] if after is None else after.decode("utf-8", "surrogateescape").splitlines(True)
    lines = difflib.unified_diff(
        old,
        new,
        "/dev/null" if before is None else f"a/{path}",
        "/dev/null" if after is None else f"b/{path}",
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n")
    return "".join(out)


def diff_text(diffs: dict[str, str], *, colour: bool) -> str:
    text = "".join(diffs.values())
    if not colour:
        return text
    return "".join(paint(line, diff_line_style(line), on=True) + "\n" for line in text.splitlines())
