"""`vllm-patchset overlay pack`: a wheel of this tool with the overlay and its lock inside
(`vllm_patchset/_overlay/`), for a serving image. Installed there, `vllm-patchset overlay
apply|verify|status|revert|diff` need no checkout, and the start-up guard plugin comes with it.

The wheel is written here (a zip with the dist-info that PEP 427 asks for) rather than by a
build backend: packing needs no setuptools and no network, and the same code and overlay give
the same bytes. Its version is the tool's, tagged with the pin and the lock:
`0.1.0+vllm0.24.0.<first 8 hex of the lock's sha256>`, so that pip sees a new overlay as a new
version.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import io
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from vllm_patchset import fsio
from vllm_patchset.config import Project
from vllm_patchset.console import emit
from vllm_patchset.deploy import PACKED, overlay_files
from vllm_patchset.errors import BadInput
from vllm_patchset.lock import Lock, sha256_bytes

DIST = "vllm-patchset"
PACKAGE = "vllm_patchset"
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest zip date: the same bytes on every build


@dataclass(frozen=True)
class Packed:
    wheel: Path
    version: str
    sha256: str
    lock: Lock


def wheel_version(tool_version: str, lock_bytes: bytes, vllm_version: str) -> str:
    pin = re.sub(r"[^a-z0-9]+", ".", vllm_version.lower()).strip(".")
    return f"{Version(tool_version).public}+vllm{pin}.{sha256_bytes(lock_bytes)[:8]}"


def _metadata(dist: importlib.metadata.Distribution, version: str, lock: Lock) -> str:
    meta = dist.metadata
    lines = ["Metadata-Version: 2.1", f"Name: {meta['Name']}", f"Version: {version}"]
    for key in ("Summary", "License", "Requires-Python"):
        if meta[key]:
            lines.append(f"{key}: {meta[key]}")
    lines += [f"Requires-Dist: {r}" for r in meta.get_all("Requires-Dist") or []]
    lines += [f"Provides-Extra: {e}" for e in meta.get_all("Provides-Extra") or []]
    patches = ", ".join(lock.patches) or "no patches"
    body = f"vllm-patchset with the overlay for {lock.package} {lock.version}: {patches}.\n"
    return "\n".join(lines) + "\n\n" + body


def _entry_points(dist: importlib.metadata.Distribution) -> str:
    groups: dict[str, list[str]] = {}
    for point in sorted(dist.entry_points, key=lambda p: (p.group, p.name)):
        groups.setdefault(point.group, []).append(f"{point.name} = {point.value}")
    return "".join(f"[{g}]\n" + "\n".join(lines) + "\n\n" for g, lines in groups.items())


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def wheel_files(project: Project) -> tuple[dict[str, bytes], str, Lock]:
    """The wheel's files (path -> bytes, RECORD last) and its version."""
    try:
        dist = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        raise BadInput(
            f"{DIST} is not installed (`pip install -e .` in the checkout): packing copies its"
            " installed metadata"
        ) from None
    lock_bytes = fsio.read_regular(project.lock_path)
    if lock_bytes is None:
        raise BadInput(f"no overlay lock at {project.lock_path}: run `vllm-patchset overlay build`")
    lock = Lock.from_json(lock_bytes.decode("utf-8"), str(project.lock_path))
    overlay = overlay_files(lock, project.overlay_dir)  # each checked against the lock
    version = wheel_version(dist.version, lock_bytes, lock.version)
    # The code is the running tool's own package (a checkout's, or an installed wheel's).
    source = Path(__file__).resolve().parent
    files = {f"{PACKAGE}/{path.name}": path.read_bytes() for path in sorted(source.glob("*.py"))}
    files[f"{PACKAGE}/{PACKED}/overlay.lock.json"] = lock_bytes
    files.update({f"{PACKAGE}/{PACKED}/{path}": data for path, data in sorted(overlay.items())})
    info = f"{PACKAGE}-{version}.dist-info"
    files[f"{info}/METADATA"] = _metadata(dist, version, lock).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: vllm-patchset overlay pack\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n"
    )
    files[f"{info}/entry_points.txt"] = _entry_points(dist).encode()
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in files.items())
    files[f"{info}/RECORD"] = f"{record}{info}/RECORD,,\n".encode()
    return files, version, lock


def pack(project: Project, out_dir: Path) -> Packed:
    """Write the wheel into `out_dir` (made if missing; a wheel of the same name replaced)."""
    files, version, lock = wheel_files(project)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            entry = zipfile.ZipInfo(path, ZIP_DATE)
            entry.external_attr = 0o100644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, data)
    wheel = out_dir / f"{PACKAGE}-{version}-py3-none-any.whl"
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"{out_dir} is not a directory")
    fsio.atomic_write(wheel, buffer.getvalue())
    return Packed(wheel, version, sha256_bytes(buffer.getvalue()), lock)


def register_cli(osub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = osub.add_parser(
        "pack", help="a wheel of vllm-patchset with the overlay inside, for a serving image"
    )
    p.add_argument(
        "--out", type=Path, metavar="DIR", help="where to write the wheel (default: dist/)"
    )
    p.set_defaults(func=cmd_pack)


def cmd_pack(args: argparse.Namespace) -> int:
    project = Project.load(args.project, args.cache_dir)
    packed = pack(project, args.out or project.root / "dist")
    lock = packed.lock
    patches = ", ".join(lock.patches) or "no patches"
    text = (
        f"wrote {packed.wheel}: vllm-patchset with the overlay for {lock.package} {lock.version}"
        f" ({patches}; {len(lock.entries)} file(s))\n"
        f"in the serving image: pip install {packed.wheel.name} && vllm-patchset overlay apply"
    )
    body = {
        "wheel": str(packed.wheel),
        "version": packed.version,
        "sha256": packed.sha256,
        "vllm": lock.version,
        "patches": list(lock.patches),
    }
    return emit(args, text, body)
