"""The rebase's typed values and its journal, `.rebase/state.json`.

A damaged journal (unparseable, truncated, a field of the wrong type) is one `DamagedState`
error naming the file; `rebase --abort` does not need it (see swap.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from vllm_patchset.errors import BadInput
from vllm_patchset.infra import jsonfile
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.fsio import atomic_write, plain_parts
from vllm_patchset.overlay.upstream import Upstream
from vllm_patchset.series.states import Verdict

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

    def to_doc(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["section"] = self.section.value
        doc["action"] = self.action.value
        doc["verdict"] = self.verdict.to_doc()
        doc["decision"] = self.decision.value if self.decision else None
        doc["options"] = [o.value for o in self.options]
        doc["notes"] = list(self.notes)
        return doc

    @staticmethod
    def from_doc(doc: Mapping[str, Any]) -> Step:
        fields = {f.name for f in dataclasses.fields(Step)}
        if set(doc) != fields:
            raise KeyError(f"step fields {sorted(set(doc) ^ fields)}")
        text = {k: _string(doc[k]) for k in ("key", "name", "applied_upstream")}
        text |= {
            k: _string(doc[k])
            for k in ("upstream_pr", "range_diff", "diff_of_diffs", "report", "parked_reason")
        }
        return Step(
            **text,
            section=Section(doc["section"]),
            action=Action(_string(doc["action"])),
            verdict=Verdict.from_doc(doc["verdict"]),
            decision=Choice(doc["decision"]) if doc["decision"] else None,
            options=tuple(Choice(o) for o in doc["options"]),
            notes=tuple(_string(n) for n in doc["notes"]),
            commit=_string(doc["commit"]) if doc["commit"] is not None else None,
        )


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

    @property
    def new_pin(self) -> str:
        return self.onto.version or self.onto.label

    def decision(self, key: str) -> Decision | None:
        return next((d for d in self.decisions if d.patch == key), None)

    def to_json(self) -> str:
        doc = {
            "phase": self.phase.value,
            "old_pin": self.old_pin,
            "onto": dataclasses.asdict(self.onto),
            "git": self.git,
            "ref": self.ref,
            "project_head": self.project_head,
            "decisions": [
                {"patch": d.patch, "choice": d.choice.value, "release": d.release}
                for d in self.decisions
            ],
            "applied_before": list(self.applied_before),
            "renames": [list(r) for r in self.renames],
            "steps": [s.to_doc() for s in self.steps],
            "stop": self.stop.value if self.stop else None,
            "stopped_head": self.stopped_head,
            "moves": list(self.moves),
        }
        return json.dumps(doc, indent=2) + "\n"

    @staticmethod
    def from_json(text: str) -> RebaseState:
        doc = jsonfile.parse(text.encode("utf-8", "surrogateescape"))
        if doc["phase"] not in tuple(Phase):
            raise ValueError(f"phase {doc['phase']!r}")
        stop = _optional(doc["stop"])
        if stop is not None and not (stop in tuple(Action) and Action(stop).stops):
            raise ValueError(f"stop {stop!r}")
        onto = doc["onto"]
        return RebaseState(
            phase=Phase(doc["phase"]),
            old_pin=_string(doc["old_pin"]),
            onto=Upstream(
                label=_string(onto["label"]),
                version=_optional(onto["version"]),
                tag=_string(onto["tag"]),
                commit=_string(onto["commit"]),
                source=_string(onto["source"]),
            ),
            git=_optional(doc["git"]),
            ref=_optional(doc["ref"]),
            project_head=_string(doc["project_head"]),
            decisions=tuple(
                Decision(_string(d["patch"]), Choice(d["choice"]), _optional(d["release"]))
                for d in doc["decisions"]
            ),
            applied_before=tuple(_string(k) for k in doc["applied_before"]),
            renames=tuple((_string(a), _string(b)) for a, b in doc["renames"]),
            steps=tuple(Step.from_doc(s) for s in doc["steps"]),
            stop=Action(stop) if stop is not None else None,
            stopped_head=_optional(doc["stopped_head"]),
            moves=tuple(_move(m) for m in doc["moves"]),
        )


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"not a string: {value!r}")
    return value


def _move(value: Any) -> str:
    """A path the swap moves in: plain, relative, inside the checkout and not its `.git` (a
    tampered journal must not make `--continue` replace a file beside the checkout)."""
    parts = plain_parts(_string(value))
    if parts is None or parts[0] == ".git":
        raise ValueError(f"a move {value!r} is not a plain path inside the checkout")
    return "/".join(parts)


def _optional(value: Any) -> str | None:
    return None if value is None else _string(value)


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
