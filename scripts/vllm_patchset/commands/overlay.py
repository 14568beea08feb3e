"""`vllm-patchset overlay build`, and the group `overlay` that the deploy commands (`deploy/`)
and `overlay pack` (`deploy/pack.py`) join."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_patchset.commands import add_base_options, base_of, project_of, staged_only
from vllm_patchset.console import emit, progress
from vllm_patchset.deploy import deploy, pack
from vllm_patchset.registry import Subcommands, add_command, add_group


def cmd_overlay_build(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.build import build_overlay

    staged_only()
    project = project_of(args)
    with progress("overlay build: the upstream tree") as step:
        base = base_of(project, args)
        step.describe(f"overlay build: patching {base.label}")
        lock, where = build_overlay(
            project,
            update_lock=args.update_lock,
            base=base,
            out_dir=args.out,
            skip=tuple(args.skip),
        )
    lines = [
        f"overlay for {project.package} {lock.version}: {len(lock.entries)} file(s) in {where}"
    ]
    lines += [
        f"  {e.path} {_sha_words(e.patched_sha256, e.change)} <- {', '.join(e.patches)}"
        for e in lock.entries
    ]
    body = {
        "version": lock.version,
        "dir": str(where),
        "patches": list(lock.patches),
        "files": [
            {
                "path": e.path,
                "change": e.change,
                "patched_sha256": e.patched_sha256,
                "patches": list(e.patches),
            }
            for e in lock.entries
        ],
    }
    return emit(args, "\n".join(lines), body)


def _sha_words(sha: str | None, change: str) -> str:
    """A file's patched sha256, short; an added file says so, a deleted one has none."""
    if sha is None:
        return "(deleted)"
    return f"{sha[:12]} (added)" if change == "added" else sha[:12]


def register_cli(sub: Subcommands) -> None:
    osub = add_group(sub, "overlay", help="build the overlay, or deploy it to an installed vllm")
    p = add_command(
        osub,
        "build",
        cmd_overlay_build,
        help="regenerate overlay/vllm/** and check it against the lock",
        writes_checkout=True,
    )
    p.add_argument("--update-lock", action="store_true", help="rewrite the lock")
    p.add_argument(
        "--out", type=Path, metavar="DIR", help="output dir (default: overlay/ for the pin)"
    )
    p.add_argument(
        "--skip", action="append", default=[], metavar="PATCH", help="leave a patch out (repeat)"
    )
    add_base_options(p, "--pin")
    pack.register_cli(osub)
    deploy.register_cli(osub)
