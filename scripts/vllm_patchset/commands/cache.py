"""`vllm-patchset cache list|prune`: what the cache holds, how big, and a prune (the inventory,
the locks and the prune are `overlay/cache.py`'s)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_patchset.commands.options import add_options
from vllm_patchset.console import emit
from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project, default_cache_dir
from vllm_patchset.registry import GIT, Subcommands, add_command, add_group


def _project(args: argparse.Namespace, *, required: bool) -> Project | None:
    root = args.project or Project.discover(Path.cwd())
    if root is None and not required:
        return None
    return Project.load(root, args.cache_dir)


def cmd_cache_list(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.cache import listing

    fsio.interrupt_leaves("nothing was changed")
    project = _project(args, required=False)
    cache = project.cache_dir if project else (args.cache_dir or default_cache_dir())
    return emit(args, *listing(cache, project.pin if project else None))


def cmd_cache_prune(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.cache import prune

    project = _project(args, required=True)
    assert project is not None
    return emit(args, *prune(project, dry_run=args.dry_run))


def register_cli(sub: Subcommands) -> None:
    csub = add_group(sub, "cache", help="what the cache holds, how big; prune it")
    add_command(
        csub,
        "list",
        cmd_cache_list,
        help="sdists and wheels per release, the mirror, their sizes",
        writes_checkout=False,
        needs=GIT,
    )
    p = add_command(
        csub,
        "prune",
        cmd_cache_prune,
        help="remove imported sdists, other releases' wheels, git junk",
        writes_checkout=False,
        needs=GIT,
    )
    add_options(p, "--dry-run", dry_run="say what would go, remove nothing")
