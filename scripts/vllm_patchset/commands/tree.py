"""`vllm-patchset tree`: a full pristine or patched `vllm/` tree in a new folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_patchset.commands import base_of, project_of, staged_only
from vllm_patchset.commands.options import add_base_options
from vllm_patchset.console import emit, progress
from vllm_patchset.registry import GIT, Subcommands, add_command


def cmd_tree(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.build import export_tree

    staged_only()
    project = project_of(args)
    kind = "pristine" if args.pristine else "patched"
    with progress(f"tree: writing a {kind} tree"):
        dest = export_tree(project, base_of(project, args), args.dest, pristine=args.pristine)
    return emit(args, f"wrote {kind} tree to {dest}", {"dest": str(dest), "kind": kind})


def register_cli(sub: Subcommands) -> None:
    p = add_command(
        sub,
        "tree",
        cmd_tree,
        help="write a full pristine or patched vllm/ tree",
        writes_checkout=False,
        needs=GIT,
    )
    p.add_argument("dest", type=Path, metavar="DEST", help="a new or empty directory")
    p.add_argument("--pristine", action="store_true", help="upstream's tree, no patch applied")
    add_base_options(p)
