"""`vllm-patchset fetch`: an upstream vLLM tree into the local mirror."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_patchset.commands import project_of, reads_only
from vllm_patchset.commands.options import add_options
from vllm_patchset.console import emit
from vllm_patchset.registry import GIT, Subcommands, add_command


def cmd_fetch(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.upstream import applied_overlay, mirror_for, resolve_base

    reads_only()
    project = project_of(args)
    mirror = mirror_for(project)
    if args.installed or args.python or args.target:
        upstream = mirror.installed(args.python, args.target)
    else:
        upstream = resolve_base(project, mirror, args.version, args.git, args.ref)
    text = f"{upstream.label}: {upstream.tag} {upstream.commit[:12]} ({upstream.source})"
    site = Path(upstream.source.removeprefix("installed:"))
    if upstream.source.startswith("installed:") and applied_overlay(site):
        text += (
            f"\nnote: the overlay applied there was set aside: its files were taken from the"
            f" originals `overlay apply` kept, so the mirror holds the pristine"
            f" {upstream.label}"
        )
    body = {
        "label": upstream.label,
        "version": upstream.version,
        "tag": upstream.tag,
        "commit": upstream.commit,
        "source": upstream.source,
    }
    return emit(args, text, body)


def register_cli(sub: Subcommands) -> None:
    p = add_command(
        sub,
        "fetch",
        cmd_fetch,
        help="put an upstream vLLM tree in the local mirror",
        writes_checkout=False,
        needs=GIT,
    )
    p.add_argument("version", nargs="?", metavar="VERSION", help="a vLLM release from the index")
    add_options(p, "--git", "--ref", ref="the ref of --git to fetch (tag, branch)")
    p.add_argument("--installed", action="store_true", help="the vllm of this interpreter")
    add_options(p, "--python", "--target")
