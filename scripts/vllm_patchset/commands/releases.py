"""`vllm-patchset releases`: the vLLM releases on the package index."""

from __future__ import annotations

import argparse

from packaging.version import Version

from vllm_patchset.commands import project_of
from vllm_patchset.console import emit
from vllm_patchset.errors import BadInput
from vllm_patchset.registry import Subcommands, add_command


def cmd_releases(args: argparse.Namespace) -> int:
    from vllm_patchset import versions
    from vllm_patchset.overlay.upstream import mirror_for

    project = project_of(args)
    releases = mirror_for(project).available_versions(pre=args.pre)
    if args.newer_than_pin:
        pin = versions.parse(project.pin)
        if pin is None:
            raise BadInput(f"the pin {project.pin} is not a release version")
        releases = [v for v in releases if Version(v) > pin]
    newest = releases[-1] if releases else None
    body = {"pin": project.pin, "releases": releases, "newest": newest}
    return emit(args, "\n".join(releases), body)


def register_cli(sub: Subcommands) -> None:
    p = add_command(
        sub,
        "releases",
        cmd_releases,
        help="the vLLM releases on the package index, oldest first",
        writes_checkout=False,
    )
    p.add_argument("--newer-than-pin", action="store_true", help="only those newer than the pin")
    p.add_argument("--pre", action="store_true", help="pre-releases too (rc, beta, dev)")
