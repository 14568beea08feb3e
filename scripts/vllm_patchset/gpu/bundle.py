"""`vllm-patchset bundle`: one archive for a GPU host without network.

It holds what `validate` runs (the pristine, overlaid and buggy vLLM trees, tests/gpu, the
manifest of red/green expectations and gpurun.py, the checker), optionally the wheels of the
pure-Python packages that vLLM's MoE code imports and such a host lacks, and run.sh. It must stay
under 64 MiB so that it travels over narrow channels. A native-ops kit (`--kit`, kitbuild.py)
goes beside it as its own folder of parts; with it, the pin's trees run vLLM's real compiled
ops. The command is `commands/bundle.py`.
"""

from __future__ import annotations

import lzma
import sys
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from vllm_patchset.console import progress
from vllm_patchset.errors import BadInput, Finding, as_project_errors
from vllm_patchset.gpu import BUNDLE_NAME, KIT_NAME, gpurun, kitparts
from vllm_patchset.gpu.validate import build_trees
from vllm_patchset.infra import archives, fsio, jsonfile
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.fsio import interrupts

LIMIT = 64 * 1024 * 1024

# What importing vLLM's fused MoE code needs beyond a GPU host with torch, triton, numpy,
# transformers and their dependencies (seen on an H200 host; gguf for 0.21.0). openai < 3:
# 3.x needs httpx2. pydantic-core is added at the version the chosen pydantic pins.
HOST_WHEELS = (
    "pyzmq",
    "pydantic",
    "annotated-types",
    "typing-inspection",
    "typing-extensions",
    "cbor2",
    "openai-harmony",
    "openai<3",
    "distro",
    "jiter",
    "sniffio",
    "gguf",
)
PLATFORMS = (
    "manylinux_2_31_x86_64",  # llguidance (the kit's wheels) is built for 2.31 only
    "manylinux_2_28_x86_64",
    "manylinux_2_26_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)

RUN_SH = """\
#!/bin/sh
# GPU validation of the vllm-patchset trees on this host: python3 with torch and a CUDA or
# ROCm GPU; no network. Usage: sh run.sh [--only TREE]... [--part K/N] [--out DIR]
# (PYTHON=... to pick python3; --part K/N runs the K-th of N parts of each tree's tests).
# A native-ops kit in ../{kit} (or VLLM_PATCHSET_KIT=DIR): the pin's trees run vLLM's real ops.
set -e
cd "$(dirname "$0")"
PY=${{PYTHON:-python3}}
# Folders of its own, made by mktemp -d (mode 0700, a name no other user can take first),
# never a fixed path under /tmp; VLLM_PATCHSET_SITE and VLLM_PATCHSET_NATIVE name others.
TMP=${{TMPDIR:-/tmp}}
if ls wheels/*.whl >/dev/null 2>&1; then
    SITE=${{VLLM_PATCHSET_SITE:-$(mktemp -d "$TMP/vllm-patchset-site.XXXXXXXX")}}
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade \\
        --target "$SITE" wheels/*.whl
    PYTHONPATH="$SITE${{PYTHONPATH:+:$PYTHONPATH}}"
    export PYTHONPATH
fi
KIT=${{VLLM_PATCHSET_KIT:-../{kit}}}
if [ -f "$KIT/kit.json" ]; then
    NATIVE=${{VLLM_PATCHSET_NATIVE:-$(mktemp -d "$TMP/vllm-patchset-native.XXXXXXXX")/kit}}
    "$PY" kitparts.py assemble "$KIT" --dest "$NATIVE"
    exec "$PY" gpurun.py . --native "$NATIVE/site" "$@"
fi
exec "$PY" gpurun.py . "$@"
"""

README = """\
vllm-patchset GPU bundle
========================

Run on a host with python3, torch and a CUDA or ROCm GPU (no network needed):

    tar -xJf {archive} && sh {name}/run.sh

run.sh installs wheels/ (if any) into a new folder of its own (mktemp -d), then gpurun.py
runs tests/gpu against each tree in trees/ (VLLM_PATCHSET_VLLM_TREE=trees/NAME), with vLLM's
compiled ops if the tree has them, else the stand-ins of tests/gpu/standins.py, and checks
manifest.json's red/green expectations. It prints a table and exits 1 if one is unmet; logs
and per-tree reports are in results/. One tree: sh run.sh --only pristine-0.24.0. Ctrl-C or
kill stops it in one line: the pytest run going on is killed with what it started, the logs
and reports of the trees run so far stay in results/.

With a native-ops kit beside the archive (vllm-patchset-kit/: kit.json and its parts), run.sh
first checks every part and reassembles the pin's vLLM with its compiled ops
(python3 kitparts.py assemble), and the pin's two trees run with those real ops (mode=native).

Trees:
{trees}
"""


def download_wheels(
    dest: Path, python_version: str = "3.12", requirements: tuple[str, ...] = HOST_WHEELS
) -> list[Path]:
    """cp<python_version> manylinux wheels of `requirements` (no dependencies of their own: the
    host has them), and the pydantic-core that the downloaded pydantic pins."""
    fsio.make_dir(dest, parents=True, exist_ok=True)
    _pip_download(dest, python_version, requirements)
    for pydantic in dest.glob("pydantic-[0-9]*.whl"):
        _pip_download(dest, python_version, (_pinned(pydantic, "pydantic-core"),))
    return sorted(dest.glob("*.whl"))


def _pip_download(dest: Path, python_version: str, requirements: tuple[str, ...]) -> None:
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    command += ["--only-binary=:all:", "--python-version", python_version, "--implementation"]
    command += ["cp", *(f"--platform={p}" for p in PLATFORMS), "--dest", str(dest)]
    result = fsio.run_child([*command, *requirements], capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise BadInput(f"pip download {' '.join(requirements)} failed: {last}")


def _pinned(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        for line in archive.read(metadata).decode("utf-8").splitlines():
            if line.startswith(f"Requires-Dist: {name}=="):
                return line.removeprefix("Requires-Dist: ").split(";")[0].strip()
    raise BadInput(f"{wheel.name} pins no {name}")


def make_bundle(
    project: Project,
    archive: Path,
    *,
    wheels: bool,
    python_version: str = "3.12",
    level: int = 9,
    kit: Path | None = None,
) -> Path:
    """Write the archive; with `kit` (a folder from `kit build`), check it and copy it beside
    the archive as vllm-patchset-kit/ (its parts travel on their own: each is under 60 MiB)."""
    if archive.exists():
        raise BadInput(f"{archive} exists already")
    kit_copy = archive.with_name(KIT_NAME)
    # A kit already where the archive's kit goes (`kit build`'s default output, beside the
    # default archive) stays as it is: it is the input, never copied onto itself or removed.
    in_place = kit is not None and fsio.same_path(kit, kit_copy)
    kit_files = _kit_files(kit, kit_copy, in_place=in_place) if kit is not None else []
    with fsio.temp_dir("vllm-patchset-bundle-") as tmp:
        root = tmp / BUNDLE_NAME
        _stage(project, root, archive.name, wheels=wheels, python_version=python_version)
        fsio.make_dir(archive.parent, parents=True, exist_ok=True)
        partial = archive.with_name(archive.name + ".part")
        _compress(root, partial, level)
    size = partial.stat().st_size
    if size >= LIMIT:
        fsio.remove_file(partial)
        raise Finding(f"bundle is {size / 2**20:.1f} MiB, over the 64 MiB limit (try --no-wheels)")
    if kit is not None and not in_place:
        # What verify checked, and only that: kit.json and its parts (regular files, each
        # lstat-checked), nothing else the folder may hold.
        with progress(f"bundle: copying the kit to {kit_copy}"):
            fsio.make_dir(kit_copy, parents=True)
            for name in kit_files:
                fsio.copy_file(kit / name, kit_copy / name, follow_symlinks=False)
    fsio.move(partial, archive)
    return archive


def _kit_files(kit: Path, kit_copy: Path, *, in_place: bool) -> list[str]:
    """The files of the kit that go beside the archive (kit.json and its parts), each part
    checked first; BadInput where another kit is there already."""
    if kit_copy.exists() and not in_place:
        raise BadInput(f"{kit_copy} exists already")
    with as_project_errors(kitparts.KitError):
        manifest = kitparts.verify(kit)
    return [kitparts.MANIFEST, *(part.name for part in manifest.parts)]


def _stage(
    project: Project, root: Path, archive_name: str, *, wheels: bool, python_version: str
) -> None:
    """The bundle's folder: the trees, the scripts that travel alone, the wheels, run.sh and
    the README."""
    with progress("bundle: building the trees"):
        built = build_trees(project, root)
    fsio.copy_file(Path(gpurun.__file__), root / "gpurun.py", metadata=True)
    for module in (kitparts, archives, jsonfile, interrupts):  # kitparts and gpurun import them
        source = Path(module.__file__ or "")
        fsio.copy_file(source, root / source.name, metadata=True)
    if wheels:
        with progress("bundle: downloading the wheels"):
            download_wheels(root / "wheels", python_version)
    fsio.write_file(root / "run.sh", RUN_SH.format(kit=KIT_NAME))
    fsio.write_file(root / "README.txt", readme(archive_name, built.specs))


def readme(archive_name: str, specs: Sequence[gpurun.TreeSpec]) -> str:
    """README.txt: how to run the bundle, and each tree's expectations (or why it was not
    built)."""
    trees = "\n".join(
        f"  {s.name}: "
        + (
            f"not built: {s.skipped}"
            if s.skipped
            else ", ".join(f"{e.test.split('::')[-1]} {e.expect}" for e in s.expectations)
        )
        for s in specs
    )
    return README.format(archive=archive_name, name=BUNDLE_NAME, trees=trees)


def _compress(root: Path, partial: Path, level: int) -> None:
    """`root` as one xz stream with a 64 MiB window into `partial` (removed on any error): the
    trees share most files, so they compress together to little more than one."""
    try:
        with (
            progress(f"bundle: compressing {partial.name.removesuffix('.part')}"),
            fsio.writing(partial) as raw,
            lzma.open(raw, "wb", preset=level) as xz,
            tarfile.open(fileobj=xz, mode="w") as tar,
        ):
            tar.add(root, arcname=BUNDLE_NAME)
    except BaseException:
        fsio.remove_file(partial)
        raise
