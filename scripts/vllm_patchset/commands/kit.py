"""`vllm-patchset kit build|verify|assemble`: the pin's vLLM with its compiled ops, for GPU
hosts (`gpu/kitbuild.py` writes a kit, `gpu/kitparts.py` checks and assembles one)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_patchset.commands import project_of
from vllm_patchset.commands.options import add_options
from vllm_patchset.console import emit, progress
from vllm_patchset.errors import as_project_errors
from vllm_patchset.gpu import KIT_NAME, KIT_PART_MIB, KIT_PLATFORM
from vllm_patchset.infra import fsio
from vllm_patchset.registry import Subcommands, add_command, add_group

if TYPE_CHECKING:
    from vllm_patchset.gpu.kitparts import Manifest


def _parts(manifest: Manifest) -> list[dict[str, object]]:
    return [{"name": p.name, "size": p.size, "sha256": p.sha256} for p in manifest.parts]


def part_mib(text: str) -> int:
    """`kit build --part-mib`: the parts' size limit, 1 to 60 MiB, refused when the line is
    parsed (before the build folder is claimed)."""
    if not (text.isdigit() and 1 <= int(text) <= KIT_PART_MIB):
        raise argparse.ArgumentTypeError(f"{text} MiB is not in 1..{KIT_PART_MIB}")
    return int(text)


def cmd_kit_build(args: argparse.Namespace) -> int:
    from vllm_patchset.gpu.kitbuild import build_kit

    project = project_of(args)
    out = args.out or fsio.build_dir(project.root) / KIT_NAME
    if args.out is None:  # our own build output, in the build folder we marked: replace it
        fsio.remove_output(out)
    manifest = build_kit(
        project,
        out,
        level=args.level,
        with_wheels=args.wheels,
        python_version=args.python_version,
        platform=args.platform,
        part_limit=args.part_mib * 2**20,
    )
    size = sum(p.size for p in manifest.parts) / 2**20
    wheels = len(manifest.wheels)
    lines = [f"wrote {out}: {len(manifest.parts)} parts, {size:.1f} MiB, {wheels} wheels"]
    lines += [f"  {part.name} {part.size} {part.sha256}" for part in manifest.parts]
    body = {"kit": str(out), "vllm": manifest.vllm, "parts": _parts(manifest), "wheels": wheels}
    return emit(args, "\n".join(lines), body)


def cmd_kit_verify(args: argparse.Namespace) -> int:
    from vllm_patchset.gpu import kitparts

    with as_project_errors(kitparts.KitError), progress("kit verify: checking the parts"):
        manifest = kitparts.verify(args.kit)
    text = f"kit for vllm {manifest.vllm}: {len(manifest.parts)} parts ok"
    return emit(
        args, text, {"kit": str(args.kit), "vllm": manifest.vllm, "parts": _parts(manifest)}
    )


def cmd_kit_assemble(args: argparse.Namespace) -> int:
    from vllm_patchset.gpu import kitparts

    with (
        as_project_errors(kitparts.KitError),
        progress("kit assemble: checking and unpacking the parts"),
    ):
        dest = kitparts.assemble(args.kit, args.dest)
    site = dest / "site"
    return emit(
        args, f"kit assembled in {dest}: PYTHONPATH={site}", {"dest": str(dest), "site": str(site)}
    )


def register_cli(sub: Subcommands) -> None:
    ksub = add_group(sub, "kit", help="the pin's vLLM with its compiled ops, for GPU hosts")
    p = add_command(
        ksub,
        "build",
        cmd_kit_build,
        help="download the pin's wheel, write the kit's parts",
        writes_checkout=False,
    )
    p.add_argument("--out", type=Path, help=f"a new folder (default: build/{KIT_NAME})")
    add_options(p, "--level", "--no-wheels", "--python-version", no_wheels="vLLM's wheel only")
    p.add_argument("--platform", default=KIT_PLATFORM, help="the wheel's platform tag")
    p.add_argument(
        "--part-mib",
        type=part_mib,
        default=KIT_PART_MIB,
        metavar="N",
        help=f"each part at most N MiB, 1..{KIT_PART_MIB} (default {KIT_PART_MIB}): smaller where"
        " what carries a part to the host carries other files beside it",
    )
    for name, handler, text in (
        ("verify", cmd_kit_verify, "check every part's size and sha256"),
        ("assemble", cmd_kit_assemble, "check, unpack, check every file against the RECORD"),
    ):
        p = add_command(ksub, name, handler, help=text, writes_checkout=False)
        p.add_argument(
            "kit", type=Path, metavar="KIT", help="the kit's folder (kit.json and parts)"
        )
    p.add_argument("--dest", type=Path, required=True, help="the folder to create")  # assemble's
