"""The commands that live with the command line, one module per command or command group, each
with its handler and its `register_cli(sub)` (through `registry.add_command`). The commands of
the rebase, deploy and GPU modules register themselves the same way from their own modules.

A command module imports at its top only what the deploy path has anyway (`overlay apply` on a
serving image imports every module here): the modules that do the work are imported by the
handler.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project

if TYPE_CHECKING:
    from vllm_patchset.overlay.upstream import Upstream


def project_of(args: argparse.Namespace) -> Project:
    return Project.load(args.project, args.cache_dir)


def reads_only() -> None:
    """The command changes nothing in the checkout (the mirror in the cache may grow)."""
    fsio.interrupt_leaves("nothing in the checkout was changed")


def staged_only() -> None:
    """An interrupt leaves nothing: what the command staged is removed."""
    fsio.interrupt_leaves("nothing was changed (what was staged is removed)")


def base_of(project: Project, args: argparse.Namespace) -> Upstream:
    """The upstream named by --base/--pin, --git and --ref, else the pin."""
    from vllm_patchset.overlay.upstream import mirror_for, resolve_base

    return resolve_base(project, mirror_for(project), args.base, args.git, args.ref)


def add_base_options(parser: argparse.ArgumentParser, version_flag: str = "--base") -> None:
    parser.add_argument(
        version_flag, dest="base", metavar="VERSION", help="a vLLM release (default: the pin)"
    )
    parser.add_argument("--git", metavar="URL|PATH", help="a git repository holding vllm/")
    parser.add_argument("--ref", metavar="REF", help="the ref of --git to use (tag, branch)")
