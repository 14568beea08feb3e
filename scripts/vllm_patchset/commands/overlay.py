"""The group `overlay`: `overlay build`, `overlay pack` (the wheel for a serving image,
`deploy/pack.py`), and the deploy commands (`commands/deploy.py`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_patchset.commands import base_of, deploy, project_of, staged_only
from vllm_patchset.commands.options import add_base_options
from vllm_patchset.console import emit, progress
from vllm_patchset.registry import GIT, Subcommands, add_command, add_group


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


def cmd_pack(args: argparse.Namespace) -> int:
    from vllm_patchset.deploy.pack import pack

    project = project_of(args)
    packed = pack(project, args.out or project.root / "dist")
    lock = packed.lock
    patches = ", ".join(lock.patches) or "no patches"
    text = (
        f"wrote {packed.wheel}: vllm-patchset with the overlay for {lock.package} {lock.version}"
        f" ({patches}; {len(lock.entries)} file(s))\n"
        f"in the serving image: `pip install {packed.wheel.name} && vllm-patchset overlay apply`"
    )
    body = {
        "wheel": str(packed.wheel),
        "version": packed.version,
        "sha256": packed.sha256,
        "vllm": lock.version,
        "patches": list(lock.patches),
    }
    return emit(args, text, body)


def register_cli(sub: Subcommands) -> None:
    osub = add_group(sub, "overlay", help="build the overlay, or deploy it to an installed vllm")
    p = add_command(
        osub,
        "build",
        cmd_overlay_build,
        help="regenerate overlay/vllm/** and check it against the lock",
        writes_checkout=True,
        needs=GIT,
    )
    p.add_argument("--update-lock", action="store_true", help="rewrite the lock")
    p.add_argument(
        "--out", type=Path, metavar="DIR", help="output dir (default: overlay/ for the pin)"
    )
    p.add_argument(
        "--skip", action="append", default=[], metavar="PATCH", help="leave a patch out (repeat)"
    )
    add_base_options(p, "--pin")
    p = add_command(
        osub,
        "pack",
        cmd_pack,
        help="a wheel of vllm-patchset with the overlay inside, for a serving image",
        writes_checkout=True,  # it reads the overlay whole
    )
    p.add_argument(
        "--out", type=Path, metavar="DIR", help="where to write the wheel (default: dist/)"
    )
    deploy.register_cli(osub)
