"""`vllm-patchset check`: the CI lint (the rules are `sync/checks.py`'s)."""

from __future__ import annotations

import argparse
import sys

from vllm_patchset.commands import project_of, reads_only
from vllm_patchset.console import emit
from vllm_patchset.registry import GIT, Subcommands, add_command


def cmd_check(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.upstream import mirror_for
    from vllm_patchset.sync.checks import problems

    reads_only()
    project = project_of(args)
    n, found = problems(project, mirror_for(project))
    for problem in found:
        print(problem, file=sys.stderr)
    text = f"check: {n} patches, {len(found)} problem(s)"
    return emit(args, text, {"patches": n, "problems": found}, 1 if found else 0)


def register_cli(sub: Subcommands) -> None:
    add_command(
        sub,
        "check",
        cmd_check,
        help="CI lint: series and files, trailers, clean apply on the pin, lock fresh",
        writes_checkout=False,
        needs=GIT,
    )
