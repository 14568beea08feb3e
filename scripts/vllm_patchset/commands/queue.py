"""`vllm-patchset queue import|export`: the series as git commits in `.queue/`, and back."""

from __future__ import annotations

import argparse

from vllm_patchset.commands import project_of, staged_only
from vllm_patchset.commands.options import add_options
from vllm_patchset.console import emit
from vllm_patchset.registry import GIT, Subcommands, add_command, add_group


def cmd_queue_import(args: argparse.Namespace) -> int:
    from vllm_patchset.sync.queue import import_queue

    staged_only()
    info = import_queue(project_of(args), force=args.force)
    text = (
        f"queue: {len(info.patches)} patch(es) as commits on {info.base} in {info.path}\n"
        f"next: change the code in {info.path} and `git commit` there (a patch's trailers:"
        " Upstream-PR, Introduced-by, Introduced-in, Applied-upstream, Regression-test),"
        " then `vllm-patchset queue export`"
    )
    body = {"path": str(info.path), "base": info.base, "patches": list(info.patches)}
    return emit(args, text, body)


def cmd_queue_export(args: argparse.Namespace) -> int:
    from vllm_patchset.sync.queue import export_queue, problems_body, problems_text

    staged_only()
    info = export_queue(project_of(args), keep=not args.drop)
    if info.problems:
        text = problems_text(info.path, info.problems, len(info.patches))
        return emit(args, text, {"problems": problems_body(info.problems)}, 1, verbatim=True)
    body = {"patches": list(info.patches)}
    text = (
        f"exported {len(info.patches)} patch(es) to patches/\n"
        "next: `vllm-patchset overlay build --update-lock`, then `vllm-patchset check`;"
        " commit patches/ and the lock"
    )
    return emit(args, text, body)


def register_cli(sub: Subcommands) -> None:
    qsub = add_group(sub, "queue", help="edit the series as git commits")
    p = add_command(
        qsub,
        "import",
        cmd_queue_import,
        help="the series as commits on the pin, in .queue/",
        writes_checkout=True,
        needs=GIT,
    )
    add_options(p, "--force", force="replace a queue this tool made")
    p = add_command(
        qsub,
        "export",
        cmd_queue_export,
        help="the queue's commits back to patches/ and patches/series",
        writes_checkout=True,
        needs=GIT,
    )
    p.add_argument("--drop", action="store_true", help="remove the worktree afterwards")
