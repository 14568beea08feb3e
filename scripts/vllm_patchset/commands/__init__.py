"""Every command of the line, one module per command or command group, each with its handlers
and its `register_cli(sub)` (through `registry.add_command`); `cli.COMMANDS` lists them in
their order on the line. What the commands share is here: the project of a line, what an
interrupt leaves, the base a command works on; `options.py` spells the options several
commands take.

A command module imports at its top only what the deploy path has anyway (`overlay apply` on a
serving image imports every module here): the modules that do the work are imported by the
handler, so that building the parser imports no git, tomlkit, ruamel, rich or torch.
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
