"""The native-ops kit written (`vllm-patchset kit build`; the commands are `commands/kit.py`):
the pin's vLLM, with its compiled ops, for a GPU host that has torch but no vLLM install and no
network. This module runs on the workstation; `kitparts.py` (the kit's format, its check and
its assembly) travels alone to the host.

`build` downloads the pin's wheel from the package index (sha256 checked against the index,
cached), keeps the files that vLLM's engine and MoE path need, adds the wheels of the packages
vLLM imports that such a host lacks, and writes one xz stream cut into parts of at most
60 MiB with a manifest (kitparts.py has the format and the host side). What it leaves out of
the wheel, and why:

- `vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so` (191 MB): FlashAttention 2; Hopper runs FA3,
  which the kit carries (`vllm.vllm_flash_attn` refuses to import when neither loads);
- `vllm/vllm-rs` (37 MB): the Rust front-end binary, which the offline engine never runs;
- `vllm/third_party/**` but its Python files (63 MB of CUDA headers and DeepGEMM builds for
  JIT kernels that an NVFP4 or FP8 MoE on Hopper does not use), and the OpenAPI page's static
  files (the offline engine serves no page).

A host with a normal vLLM install (users' CI, vLLM's images) needs none of this.
"""

from __future__ import annotations

import io
import lzma
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, cast

from vllm_patchset.console import progress
from vllm_patchset.errors import BadInput
from vllm_patchset.gpu import KIT_PLATFORM, kitparts
from vllm_patchset.gpu.bundle import download_wheels
from vllm_patchset.infra import fsio, index, indexsettings
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.hashes import sha256_bytes, sha256_file

LEFT_OUT_FILES = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs")
LEFT_OUT_DIRS = ("vllm/entrypoints/serve/instrumentator/static/",)
THIRD_PARTY = "vllm/third_party/"

# What vLLM 0.24.0's engine imports beyond a GPU host with torch, triton, transformers, numpy,
# safetensors, aiohttp and their dependencies, found by importing the engine's modules with
# only the host's packages (pinned: the same kit every time). pydantic-core is added at the
# version pydantic pins. openai < 3 (3.x needs httpx2); xgrammar and llguidance are imported
# where the structured-output classes are defined.
VLLM_WHEELS = (
    "pydantic==2.14.4",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "msgspec==0.23.0",
    "cbor2==6.3.0",
    "pyzmq==27.3.0",
    "multidict==7.2.1",
    "frozenlist==1.8.0",
    "openai==2.54.0",
    "jiter==0.19.0",
    "sniffio==1.3.1",
    "distro==1.9.0",
    "openai-harmony==0.0.8",
    "pybase64==1.5.1",
    "cachetools==8.0.2",
    "llguidance==1.7.6",
    "xgrammar==0.2.3",
    "apache-tvm-ffi==0.1.9",
    "fastapi==0.136.3",
    "starlette==1.10.0",
    "partial-json-parser==0.2.1.1.post7",
    "compressed-tensors==0.17.0",
    "loguru==0.7.3",
)
# vllm-patchset itself on the host (`overlay apply`, the engine check): pyproject.toml's
# [project].dependencies resolved for the GPU host (Python 3.12, no extras: the deploy
# commands need packaging alone), pinned. A test (tests/gpu_jobs/test_kitbuild.py) fails when they
# drift from pyproject.toml or miss a dependency.
TOOL_WHEELS = ("packaging==26.4",)
ENGINE_WHEELS = VLLM_WHEELS + TOOL_WHEELS


def kit_member(path: str) -> bool:
    """Whether a file of the pin's wheel goes into the kit (see the module's docstring)."""
    if path.startswith("vllm-") and ".dist-info/" in path:
        return True
    if not path.startswith("vllm/") or path in LEFT_OUT_FILES:
        return False
    if path.startswith(LEFT_OUT_DIRS):
        return False
    if path.startswith(THIRD_PARTY):
        return path.endswith(".py")  # vLLM imports these; the headers and builds are for JIT
    return True


def _index_wheel(
    project: Project, platform: str, setting: indexsettings.IndexSetting
) -> index.IndexFile:
    """The pin's wheel for `platform` on the package index (uv's, pip's or the project's)."""
    prefix = f"{project.package}-{project.pin}-"
    found = index.files(
        setting.url,
        project.package,
        unreachable=f": index-url from {setting.origin}",
        auth=setting,
    )
    for entry in found:
        if entry.filename.startswith(prefix) and entry.filename.endswith(f"-{platform}.whl"):
            return entry
    raise BadInput(
        f"the index {setting.url} (from {setting.origin}) has no {project.package}"
        f" {project.pin} wheel for {platform}"
    )


def pin_wheel(project: Project, platform: str = KIT_PLATFORM) -> tuple[Path, str]:
    """The pin's wheel in the cache (`<cache>/wheels/`), downloaded once; sha256 checked against
    the index every time the index is reachable, and against the cached check otherwise."""
    setting = indexsettings.for_project(project)
    entry = _index_wheel(project, platform, setting)
    from vllm_patchset.overlay.cachelocks import reading

    with reading(project.cache_dir):  # a prune waits
        wheel = index.fetch(entry, project.cache_dir / "wheels", setting)
    # fetch refuses an entry without a sha256, but from a `file:` index (the user's folder)
    return wheel, entry.sha256 or sha256_file(wheel)


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def write_kit(
    wheel: Path,
    wheel_sha256: str,
    version: str,
    dest: Path,
    *,
    wheels: Sequence[Path] = (),
    level: int = 9,
    part_limit: int = kitparts.PART_LIMIT,
) -> kitparts.Manifest:
    """Write the kit of `wheel` (plus dependency `wheels`) into the new folder `dest`."""
    if dest.exists():
        raise BadInput(f"{dest} exists already: give a new folder")
    fsio.make_dir(dest.parent, parents=True, exist_ok=True)
    staging = dest.with_name(f".{dest.name}.partial")
    fsio.discard_tree(staging)
    fsio.make_dir(staging)
    # The x86 branch filter makes the compiled extensions about a tenth smaller.
    filters = [{"id": lzma.FILTER_X86}, {"id": lzma.FILTER_LZMA2, "preset": level}]
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = sorted(n for n in archive.namelist() if kit_member(n) and not n.endswith("/"))
            records = [n for n in names if n.endswith(".dist-info/RECORD")]
            if len(records) != 1:
                raise BadInput(f"{wheel.name} holds {len(records)} dist-info RECORDs, expected 1")
            record_sha256 = sha256_bytes(archive.read(records[0]))
            with (
                kitparts.PartWriter(staging, part_limit) as parts,
                lzma.open(cast(BinaryIO, parts), "wb", filters=filters) as xz,
                tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as tar,
            ):
                for name in names:
                    mode = (archive.getinfo(name).external_attr >> 16) & 0o777
                    _add(tar, f"site/{name}", archive.read(name), 0o755 if mode & 0o111 else 0o644)
                for path in sorted(wheels):
                    _add(tar, f"wheels/{path.name}", path.read_bytes())
        manifest = kitparts.Manifest(
            vllm=version,
            wheel=wheel.name,
            wheel_sha256=wheel_sha256,
            record_sha256=record_sha256,
            site_files=len(names),
            wheels={p.name: sha256_file(p) for p in wheels},
            parts=tuple(parts.parts),
        )
        fsio.write_file(staging / kitparts.MANIFEST, manifest.to_json())
        fsio.move(staging, dest)
    except (zipfile.BadZipFile, OSError) as exc:
        raise BadInput(f"cannot write the kit of {wheel.name}: {exc}") from None
    finally:
        fsio.discard_tree(staging)
    return manifest


def build_kit(
    project: Project,
    dest: Path,
    *,
    level: int = 9,
    with_wheels: bool = True,
    python_version: str = "3.12",
    platform: str = KIT_PLATFORM,
    part_limit: int = kitparts.PART_LIMIT,
) -> kitparts.Manifest:
    wheel, sha256 = pin_wheel(project, platform)
    scratch = dest.with_name(f".{dest.name}.wheels")
    fsio.discard_tree(scratch)
    try:
        wheels = []
        if with_wheels:
            with progress("kit build: downloading the wheels vLLM imports"):
                wheels = download_wheels(scratch, python_version, ENGINE_WHEELS)
        with progress(f"kit build: compressing {wheel.name} into parts"):
            return write_kit(
                wheel, sha256, project.pin, dest, wheels=wheels, level=level, part_limit=part_limit
            )
    finally:
        fsio.discard_tree(scratch)
