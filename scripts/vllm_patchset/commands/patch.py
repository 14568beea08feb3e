"""`vllm-patchset patch new NAME`: a template commit in `.queue/` whose trailers say what each
needs, and the steps that make it a patch of the series."""

from __future__ import annotations

import argparse

from vllm_patchset.commands import project_of, staged_only
from vllm_patchset.console import emit
from vllm_patchset.registry import GIT, Subcommands, add_command, add_group


def cmd_patch_new(args: argparse.Namespace) -> int:
    from vllm_patchset.sync.queue import new_patch, queue_path, shown

    staged_only()
    project = project_of(args)
    imported, commit = new_patch(project, args.name)
    queue = shown(queue_path(project))
    lines = []
    if imported is not None:
        lines.append(
            f"queue: {len(imported.patches)} patch(es) as commits on {imported.base} in {queue}"
        )
    lines += [
        f"patch new: a template commit {commit[:12]} {args.name.strip()!r} on top of {queue}",
        "next:",
        f"  1. make the fix in {queue}/{project.package}/",
        f"  2. git -C {queue} commit -a --amend",
        "     (fill each trailer: the # line above it says what it needs)",
        "  3. write its regression test in tests/gpu/ (the Regression-test: trailer names it)",
        "  4. vllm-patchset queue export  (lists every problem left, else writes patches/)",
        "  5. vllm-patchset overlay build --update-lock",
        "  6. vllm-patchset check",
    ]
    body = {"commit": commit, "queue": str(queue_path(project)), "imported": imported is not None}
    return emit(args, "\n".join(lines), body, verbatim=True)


def register_cli(sub: Subcommands) -> None:
    psub = add_group(sub, "patch", help="start a patch of the series")
    p = add_command(
        psub,
        "new",
        cmd_patch_new,
        help="a template commit in .queue/ whose trailers say what each needs",
        writes_checkout=True,
        needs=GIT,
    )
    p.add_argument("name", metavar="NAME", help="its subject, e.g. 'moe: no tensor truthiness'")
