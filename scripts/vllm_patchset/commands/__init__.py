"""Every command of the line, one module per command or command group, each with its handlers
and its `register_cli(sub)` (through `registry.add_command`); `cli.COMMANDS` lists them in
their order on the line. What the commands share is here: the project of a line, what an
interrupt leaves, the base options, and the options several commands take (`add_options`).

A command module imports at its top only what the deploy path has anyway (`overlay apply` on a
serving image imports every module here): the modules that do the work are imported by the
handler, so that building the parser imports no git, tomlkit, ruamel, rich or torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


# The options that several commands take, each spelled here once (argparse's keywords); a
# command may give one its own help (`add_options`).
SHARED_OPTIONS: dict[str, dict[str, Any]] = {
    "--git": {"metavar": "URL|PATH", "help": "a git repository holding vllm/"},
    "--ref": {"metavar": "REF", "help": "the ref of --git to use (tag, branch)"},
    "--target": {"type": Path, "metavar": "DIR", "help": "the vllm installed in DIR"},
    "--python": {"metavar": "EXE", "help": "the vllm of another interpreter"},
    "--dry-run": {"action": "store_true", "help": "say what would change, change nothing"},
    "--force": {"action": "store_true"},
    "--level": {"type": int, "default": 9, "help": "xz preset, 0 (fast) .. 9 (small)"},
    "--python-version": {"default": "3.12", "help": "the GPU host's Python (wheels)"},
    "--no-wheels": {"dest": "wheels", "action": "store_false"},
    "--kit": {"type": Path},
}


def add_options(parser: argparse._ActionsContainer, *flags: str, **helps: str) -> None:
    """The shared options `flags` on `parser` (or on a group of it), each as SHARED_OPTIONS
    spells it; `helps`: the command's own help of an option, keyed by its name
    (`python_version=` for `--python-version`)."""
    for flag in flags:
        spec = dict(SHARED_OPTIONS[flag])
        spec["help"] = helps.pop(flag.removeprefix("--").replace("-", "_"), spec.get("help"))
        assert spec["help"], f"{flag}: the command gives its help"
        parser.add_argument(flag, **spec)
    assert not helps, f"helps of options not added: {sorted(helps)}"


def add_base_options(parser: argparse.ArgumentParser, version_flag: str = "--base") -> None:
    parser.add_argument(
        version_flag, dest="base", metavar="VERSION", help="a vLLM release (default: the pin)"
    )
    add_options(parser, "--git", "--ref")
