"""`vllm-patchset bundle`: one archive to run the GPU validation on a host without network
(`gpu/bundle.py` writes it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_patchset.commands import project_of
from vllm_patchset.commands.options import add_options
from vllm_patchset.console import emit
from vllm_patchset.gpu import BUNDLE_NAME, KIT_NAME
from vllm_patchset.infra import fsio
from vllm_patchset.registry import GIT, Subcommands, add_command


def cmd_bundle(args: argparse.Namespace) -> int:
    from vllm_patchset.gpu.bundle import make_bundle

    project = project_of(args)
    out = args.out or fsio.build_dir(project.root) / f"{BUNDLE_NAME}.tar.xz"
    if args.out is None:  # our own build outputs, in the build folder we marked: replace them
        fsio.remove_output(out)
        if args.kit is None or not fsio.same_path(args.kit, out.with_name(KIT_NAME)):
            fsio.remove_output(out.with_name(KIT_NAME))
    archive = make_bundle(
        project,
        out,
        wheels=args.wheels,
        python_version=args.python_version,
        level=args.level,
        kit=args.kit,
    )
    size = archive.stat().st_size
    lines = [f"wrote {archive} ({size / 2**20:.1f} MiB)"]
    kit_copy = archive.with_name(KIT_NAME) if args.kit is not None else None
    if kit_copy is not None:
        lines.append(f"wrote {kit_copy} (the kit's parts: copy them beside it)")
    run = f"tar -xJf {archive.name} && sh {BUNDLE_NAME}/run.sh"
    lines.append(f"on the GPU host: {run}")
    body = {
        "archive": str(archive),
        "size": size,
        "kit": str(kit_copy) if kit_copy else None,
        "run": run,
    }
    return emit(args, "\n".join(lines), body)


def register_cli(sub: Subcommands) -> None:
    p = add_command(
        sub,
        "bundle",
        cmd_bundle,
        help="one archive to run the GPU validation offline",
        writes_checkout=False,
        needs=GIT,
    )
    p.add_argument("--out", type=Path, help=f"the archive (default: build/{BUNDLE_NAME}.tar.xz)")
    add_options(
        p,
        "--no-wheels",
        "--python-version",
        "--level",
        "--kit",
        no_wheels="leave wheels out",
        kit=f"a native-ops kit (kit build), copied to {KIT_NAME}/",
    )
