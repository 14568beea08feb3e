"""The rebase's typed values and its journal, `.rebase/state.json`.

A damaged journal (unparseable, truncated, a field of the wrong type) is one `DamagedState`
error naming the file; `rebase --abort` does not need it (see swap.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal

from vllm_patchset.errors import BadInput
from vllm_patchset.infra import codec, jsonfile
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.fsio import atomic_write, plain_parts
from vllm_patchset.overlay.upstream import Upstream
from vllm_patchset.series.verdict import THREE_WAY, Verdict

REBASE_DIR = ".rebase"
STATE_FILE = "state.json"


class Section(StrEnum):
    """Where a patch is before the rebase."""

    SERIES = "series"  # patches/series: applied by the overlay
    UPSTREAMED = "upstreamed"  # patches/upstreamed/: merged upstream, kept as a guard
    PARKED = "parked"  # patches/parked/: kept by a decision, not applied


class Choice(StrEnum):
    """A maintainer's decision for one patch, named on the command line."""

    DROP = "drop"  # out of the project (git history keeps it)
    KEEP = "keep"  # a series patch: parked; an archived one that applies again: the series
    RESOLVE_UPSTREAM = "resolve-upstream"  # archived as upstream, with the release
    PORT = "port"  # taken by `git am -3` in the worktree, the rebase stopped for a hand port

    @property
    def flag(self) -> str:
        return f"--{self.value}"


class Phase(StrEnum):
    """Where the rebase is (the journal's `phase`)."""

    RUNNING = "running"  # classifying and taking the patches, then staging the project
    STOPPED = "stopped"  # for a hand resolution or a decision (`RebaseState.stop` says which)
    SWAP = "swap"  # the staged files are being swapped in
    DONE = "done"  # swapped in; only `.rebase/` is left to remove


class Action(StrEnum):
    """What the rebase did with one patch (a `Step`'s `action`)."""

    REFRESHED = "refreshed"  # taken as a commit in the worktree (git am -3)
    RESOLVED = "resolved"  # resolved by hand in the worktree after a conflict
    UNARCHIVED = "unarchived"  # an archived patch carried again in the series (--keep)
    ARCHIVED = "archived"  # archived as upstream (merged, or --resolve-upstream)
    CARRIED = "carried"  # stays archived, still guarding
    PARKED = "parked"  # in patches/parked/ (stays there, or --keep)
    DROPPED = "dropped"  # out of the project (--drop)
    CONFLICT = "conflict"  # a stop: resolved by hand in the worktree, or decided
    DECISION = "decision"  # a stop: needs one of the step's options on the command line

    @property
    def stops(self) -> bool:
        """The rebase stops at this step (the journal's `stop` is this action)."""
        return self in (Action.CONFLICT, Action.DECISION)

    @property
    def committed(self) -> bool:
        """The patch is a commit in the worktree (`Step.commit`)."""
        return self in (Action.REFRESHED, Action.RESOLVED, Action.UNARCHIVED)


@dataclass(frozen=True)
class Decision:
    patch: str  # the patch's key
    choice: Choice
    release: str | None = None  # for resolve-upstream: the release that has the fix


@dataclass(frozen=True)
class Step:
    """What the rebase found and did for one patch."""

    key: str  # the patch's key before the rebase ("name", "upstreamed/name", "parked/name")
    name: str
    section: Section
    verdict: Verdict  # on the new base
    action: Action
    decision: Choice | None = None
    options: tuple[Choice, ...] = ()  # the decisions that settle it (when it needs one)
    notes: tuple[str, ...] = ()  # what was done, and why
    commit: str | None = None  # in the worktree
    applied_upstream: str = ""
    upstream_pr: str = ""
    range_diff: str = ""  # unchanged, context-only churn, content changed
    diff_of_diffs: str = ""
    report: str = ""  # the conflict report
    parked_reason: str = ""


@dataclass(frozen=True)
class RebaseState:
    phase: Phase
    old_pin: str
    onto: Upstream
    git: str | None  # --onto-git URL|PATH
    ref: str | None  # --ref
    project_head: str  # the checkout's commit when the rebase started
    decisions: tuple[Decision, ...] = ()
    applied_before: tuple[str, ...] = ()  # keys of the patches applied on the old pin
    renames: tuple[tuple[str, str], ...] = ()  # git's renames, old pin -> new base
    steps: tuple[Step, ...] = ()
    stop: Action | None = None  # conflict or decision, while the phase is STOPPED
    stopped_head: str | None = None  # the worktree's HEAD when it stopped
    moves: tuple[str, ...] = ()  # the staged paths the swap moves in (under the root)
    changed: tuple[str, ...] = ()  # "M path" (A added, D removed): every file the swap changes

    @property
    def new_pin(self) -> str:
        return self.onto.version or self.onto.label

    def decision(self, key: str) -> Decision | None:
        return next((d for d in self.decisions if d.patch == key), None)

    def to_json(self) -> str:
        return json.dumps(codec.to_doc(self), indent=2) + "\n"

    @staticmethod
    def from_json(text: str) -> RebaseState:
        """The journal's state, every value type-checked (infra/codec.py); a stop that is not a
        stopping action, a three-way outcome git does not give, or a move that is not a plain
        path inside the checkout, refused."""
        state = codec.from_doc(RebaseState, jsonfile.parse(text.encode("utf-8", "surrogateescape")))
        if state.stop is not None and not state.stop.stops:
            raise ValueError(f"stop {state.stop.value!r}")
        for step in state.steps:
            if step.verdict.three_way not in THREE_WAY:
                raise ValueError(f"three_way {step.verdict.three_way!r}")
        return dataclasses.replace(state, moves=tuple(_move(m) for m in state.moves))


def _move(value: str) -> str:
    """A path the swap moves in: plain, relative, inside the checkout and not its `.git` (a
    tampered journal must not make `--continue` replace a file beside the checkout)."""
    parts = plain_parts(value)
    if parts is None or parts[0] == ".git":
        raise ValueError(f"a move {value!r} is not a plain path inside the checkout")
    return "/".join(parts)


class DamagedState(BadInput):
    def __init__(self, path: Path, what: str) -> None:
        super().__init__(
            f"{path} is damaged ({what}): `vllm-patchset rebase --abort` restores the checkout"
            " as it was before the rebase"
        )


# -- the journal ---------------------------------------------------------------------------------
def rebase_dir(project: Project) -> Path:
    return project.root / REBASE_DIR


def state_path(project: Project) -> Path:
    return rebase_dir(project) / STATE_FILE


def save(project: Project, state: RebaseState) -> None:
    """Written whole (temp file, fsync, rename): a kill leaves the old state or the new one."""
    atomic_write(state_path(project), state.to_json().encode())


def load(project: Project) -> RebaseState:
    path = state_path(project)
    if not path.is_file() and not path.is_symlink():
        raise BadInput("no rebase in progress (start one with `rebase --onto VERSION`)")
    try:
        return RebaseState.from_json(jsonfile.read(path).decode("utf-8", "surrogateescape"))
    except KeyError as exc:
        raise DamagedState(path, f"no {exc.args[0]!r}") from None
    except OSError as exc:
        raise DamagedState(path, exc.strerror or str(exc)) from None
    except (ValueError, TypeError) as exc:
        what = str(exc) or type(exc).__name__
        raise DamagedState(path, what.splitlines()[0]) from None


def phase_on_disk(project: Project) -> Phase | Literal["damaged"] | None:
    """The journal's phase, "damaged", or None when there is no journal."""
    if not state_path(project).exists():
        return None
    try:
        return load(project).phase
    except BadInput:
        return "damaged"
