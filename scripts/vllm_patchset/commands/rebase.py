"""`vllm-patchset rebase --onto VERSION | --onto-git URL|PATH --ref REF | --continue | --abort`:
the series taken onto a new vLLM release or git ref (`sync/rebase.py`, the state machine),
with the decisions named on the line (`--keep`, `--drop`, `--resolve-upstream`, `--port`)."""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_patchset.commands import project_of
from vllm_patchset.console import emit
from vllm_patchset.errors import BadInput, Finding, GitError, InternalError
from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project
from vllm_patchset.registry import GIT, Subcommands, add_command

if TYPE_CHECKING:
    from vllm_patchset.sync.rebase_report import Outcome
    from vllm_patchset.sync.rebase_state import Choice

# GitPython for git, tomlkit for pyproject.toml, ruamel.yaml for the CI files.
REBASE = (*GIT, "tomlkit", "ruamel.yaml")


def _local_path(source: str) -> bool:
    """`--onto-git` names a local path (not a URL, nor scp's `host:path`)."""
    return "://" not in source and not re.match(r"^[\w.-]+@?[\w.-]*:", source)


def _choices(args: argparse.Namespace) -> list[tuple[Choice, str]]:
    """The decisions on the line, each with the PATCH it names, in the order of the flags."""
    from vllm_patchset.sync.rebase_state import Choice

    return [
        *((Choice.KEEP, name) for name in args.keep),
        *((Choice.DROP, name) for name in args.drop),
        *((Choice.RESOLVE_UPSTREAM, name) for name in args.resolve_upstream),
        *((Choice.PORT, name) for name in args.port),
    ]


def _refuse_bad_line(args: argparse.Namespace, choices: list[tuple[Choice, str]]) -> None:
    """`--onto-git` with `--ref` (a path made absolute: it is the caller's, relative to the
    directory the command runs in), and `--abort` alone."""
    if args.onto_git and _local_path(args.onto_git):
        args.onto_git = str(Path(args.onto_git).resolve())
    if bool(args.ref) != bool(args.onto_git):
        raise BadInput(
            "--onto-git needs --ref REF" if args.onto_git else "--ref goes with --onto-git"
        )
    if args.abort and (choices or args.release):
        raise BadInput("--abort takes no decisions (it puts everything back)")


@contextlib.contextmanager
def _what_it_left(project: Project) -> Iterator[None]:
    """An error or an interrupt inside the rebase says what the rebase left (its journal's
    phase); git failing once something was written is an internal error, not bad input."""
    from vllm_patchset.sync.rebase_end import interrupted_message
    from vllm_patchset.sync.rebase_state import phase_on_disk

    # cli.main holds the checkout lock and turns SIGTERM into an interrupt, as for Ctrl-C.
    try:
        yield
    except KeyboardInterrupt:
        fsio.interrupt_leaves(interrupted_message(project))
        raise
    except GitError as exc:
        if phase_on_disk(project) is None:  # refused before anything was written
            raise
        raise InternalError(str(exc), interrupted_message(project)) from exc
    except Exception as exc:
        if not isinstance(exc, BadInput | Finding):
            fsio.interrupt_leaves(interrupted_message(project))
        raise


def _aborted(args: argparse.Namespace, project: Project) -> int:
    from vllm_patchset.sync.rebase_end import abort

    label = abort(project)
    text = f"rebase onto {label or '(unknown: damaged state)'} aborted: everything is as it was"
    return emit(args, text, {"status": "aborted", "onto": label})


def _started_or_resumed(
    args: argparse.Namespace, project: Project, choices: list[tuple[Choice, str]]
) -> Outcome:
    from vllm_patchset.sync.rebase import resume, start

    if args.resume:
        return resume(project, choices=choices, release=args.release)
    return start(
        project,
        version=args.onto,
        git=args.onto_git,
        ref=args.ref,
        choices=choices,
        release=args.release,
        allow_downgrade=args.allow_downgrade,
    )


def cmd_rebase(args: argparse.Namespace) -> int:
    # The `maintain` extra's modules: cli.main finds them first (registry's `needs`).
    from vllm_patchset.sync.rebase_report import render_text, report_body
    from vllm_patchset.sync.rebase_state import Phase

    project = project_of(args)
    choices = _choices(args)
    _refuse_bad_line(args, choices)
    with _what_it_left(project):
        if args.abort:
            return _aborted(args, project)
        outcome = _started_or_resumed(args, project, choices)
    text = render_text(outcome, verbose=args.verbose)
    return emit(args, text, report_body(outcome), 1 if outcome.status == Phase.STOPPED else 0)


def register_cli(sub: Subcommands) -> None:
    p = add_command(
        sub,
        "rebase",
        cmd_rebase,
        help="take the series onto a new vLLM release or git ref",
        writes_checkout=True,
        needs=REBASE,
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--onto", metavar="VERSION", help="a vLLM release from the package index")
    what.add_argument("--onto-git", metavar="URL|PATH", help="a git repository holding vllm/")
    what.add_argument(
        "--continue", dest="resume", action="store_true", help="after a conflict or a decision"
    )
    what.add_argument("--abort", action="store_true", help="restore everything as it was")
    p.add_argument("--ref", metavar="REF", help="the ref of --onto-git")
    p.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="PATCH",
        help="park a patch that no longer applies in patches/parked/ (or carry an archived"
        " one that applies again); PATCH: file name or number (0002)",
    )
    p.add_argument("--drop", action="append", default=[], metavar="PATCH", help="remove a patch")
    p.add_argument(
        "--port",
        action="append",
        default=[],
        metavar="PATCH",
        help="take a patch whose bug is live but which no longer applies with `git am -3` in"
        " .rebase/worktree and stop there to port it by hand (`--continue` carries it)",
    )
    p.add_argument(
        "--resolve-upstream",
        action="append",
        default=[],
        metavar="PATCH",
        help="archive a conflicting or rewritten patch as fixed upstream",
    )
    p.add_argument(
        "--release", metavar="VERSION", help="for --resolve-upstream: the release with the fix"
    )
    p.add_argument(
        "--allow-downgrade",
        action="store_true",
        help="rebase onto a release older than the pin (refused without it)",
    )
