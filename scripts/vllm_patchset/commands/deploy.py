"""`overlay apply | verify | revert | status | diff` on the command line: which overlay (the
checkout's, else the one a packed wheel carries, else the target's record), which target, and
the report printed. The work is done by `deploy/` (its modules are named in its `__init__`),
imported by the handler.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_patchset.commands.options import add_options
from vllm_patchset.console import colours, emit, fit
from vllm_patchset.errors import BadInput
from vllm_patchset.infra import fsio
from vllm_patchset.registry import DEPLOY_PYTHON, Subcommands, add_command

if TYPE_CHECKING:
    import argparse

    from vllm_patchset.deploy.report import Report
    from vllm_patchset.deploy.source import Source
    from vllm_patchset.deploy.target import Target
    from vllm_patchset.overlay.lock import Lock

HELPS = {
    "apply": "install the overlay into an installed vllm (every file or none)",
    "verify": "exit 0 only when the installed vllm holds exactly the overlay of the lock",
    "revert": "restore the files that apply replaced, byte for byte",
    "status": "what the installed vllm holds (repairs an interrupted apply first)",
    "diff": "the overlay's changes to the installed files, as a unified diff",
}
FORCES = {
    "apply": "override the hash guard only: replace files that are neither pristine nor"
    " patched (their bytes are kept for revert, unless an original is saved already)",
    "revert": "override the hash guard only: restore the saved originals over files that"
    " changed since apply",
}


def register_cli(osub: Subcommands) -> None:
    """`overlay apply|verify|revert|status|diff`, in the group `overlay` (commands/overlay.py)."""
    for name, text in HELPS.items():
        p = add_command(
            osub, name, cmd_deploy, help=text, writes_checkout=False, python=DEPLOY_PYTHON
        )
        add_options(
            p.add_mutually_exclusive_group(),
            "--target",
            "--python",
            target="the dir holding the vllm package (site-packages, pip's --target)",
            python="the vllm of this interpreter (default: the one running vllm-patchset)",
        )
        if name in FORCES:
            add_options(p, "--dry-run", "--force", force=FORCES[name])
        if name == "apply":
            p.add_argument(
                "--diff", action="store_true", help="also print the changes as a unified diff"
            )
        if name == "diff":
            p.add_argument(
                "--pristine",
                action="store_true",
                help="pristine vllm -> overlay (what the overlay changes), also once applied;"
                " default: installed -> overlay (what apply would change)",
            )


NO_OVERLAY = (
    "overlay {command} needs an overlay: {cwd} is not in a vllm-patchset checkout and this"
    " vllm-patchset carries none; pass --project DIR (a checkout with a built overlay), or"
    " install the wheel that `vllm-patchset overlay pack` builds"
)
NEEDS_NO_OVERLAY = ("status", "revert")  # these compare with the target's record, else none


def cmd_deploy(args: argparse.Namespace) -> int:
    from vllm_patchset.deploy import guard
    from vllm_patchset.deploy.operations import orphaned
    from vllm_patchset.deploy.source import overlay_source
    from vllm_patchset.deploy.target import NoPackage, Target

    command = args.overlay_command
    fsio.interrupt_leaves("nothing was changed")
    source = overlay_source(args.project, args.cache_dir)
    if source is None and command not in NEEDS_NO_OVERLAY:
        raise BadInput(NO_OVERLAY.format(command=command, cwd=Path.cwd()))
    package = source.lock.package if source else "vllm"
    try:
        target = Target.find(package, target_dir=args.target, python=args.python)
    except NoPackage as exc:
        if command not in NEEDS_NO_OVERLAY or not _state_left(exc.root):
            raise
        assert exc.root is not None
        lock = source.lock if source else None
        report, diffs = orphaned(exc.root, package, lock, command, str(exc)), dict[str, str]()
    else:
        report, diffs = _run(args, target, source)
    if source is None:
        recorded = (
            "compared with the one recorded at apply"
            if report.patches
            else "none is recorded here either"
        )
        why = f"no overlay given (no checkout here, none packed in this vllm-patchset): {recorded}"
        report = dataclasses.replace(report, notes=(*report.notes, why))
    skipped = guard.skipped_by(os.environ) if command == "status" else None
    if skipped:
        report = dataclasses.replace(report, notes=(*report.notes, skipped))
    return _emit(args, report, diffs)


def _state_left(root: Path | None) -> bool:
    """Is the state of an overlay left where the package is gone?"""
    from vllm_patchset.infra.installed import STATE_DIR

    return root is not None and (root / STATE_DIR).is_dir() and not (root / STATE_DIR).is_symlink()


def _run(
    args: argparse.Namespace, target: Target, source: Source | None
) -> tuple[Report, dict[str, str]]:
    """The command on `target`: its report, and the diffs it shows."""
    from vllm_patchset.deploy.operations import apply, diff, revert, status, verify

    command = args.overlay_command
    lock = source.lock if source else _recorded(target)
    if command == "diff":
        assert source is not None
        return diff(target, lock, source.files, pristine=args.pristine)
    if command == "apply":
        assert source is not None
        diffs = diff(target, lock, source.files)[1] if args.diff else {}
        return apply(target, lock, source.files, dry_run=args.dry_run, force=args.force), diffs
    if command == "revert":
        return revert(target, lock, dry_run=args.dry_run, force=args.force), {}
    if command == "verify":
        return verify(target, lock), {}
    return status(target, lock), {}


def _emit(args: argparse.Namespace, report: Report, diffs: dict[str, str]) -> int:
    from vllm_patchset.deploy.operations import DIFF_SHOWS
    from vllm_patchset.deploy.report import diff_text

    doc = dataclasses.asdict(report)
    if diffs:
        for item in doc["files"]:
            item["diff"] = diffs[item["path"]]
    code = 0 if report.ok else 1
    changes = diff_text(diffs, colour=colours())
    if args.overlay_command == "diff":
        shows, meaning = DIFF_SHOWS[args.pristine]
        meaning = meaning.format(package=Path(report.target).name, version=report.version)
        doc["shows"] = shows
        head = [report.head(), f"  shows: {shows} ({meaning})"]
        head += [f"  note: {note}" for note in report.notes]
        text = "\n".join([fit("\n".join(head)), changes.rstrip("\n")]).rstrip("\n")
        return emit(args, text, doc, code, verbatim=True)  # the head fitted, the diff as it is
    text = fit(report.text()) + ("\n" + changes.rstrip("\n") if changes else "")
    return emit(args, text, doc, code, verbatim=True)  # the report fitted, the diff as it is


def _recorded(target: Target) -> Lock:
    """The lock of the overlay recorded at `target` (none given): status and revert need only
    that record."""
    from vllm_patchset.deploy.record import read_record
    from vllm_patchset.deploy.source import no_overlay

    target.refuse_symlinked_state()
    record = read_record(target)
    return record.lock if record is not None else no_overlay(target.package, target.version)
