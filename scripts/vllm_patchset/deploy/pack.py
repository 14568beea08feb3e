"""`vllm-patchset overlay pack`: a wheel of this tool with the overlay and its lock inside
(`vllm_patchset/_overlay/`), for a serving image. Installed there, `vllm-patchset overlay
apply|verify|status|revert|diff` need no checkout, and the start-up guard plugin comes with it;
they run from Python 3.10 (the oldest the pin supports), which the wheel declares.

The wheel is written here (a zip with the dist-info that PEP 427 asks for) rather than by a
build backend: packing needs no setuptools and no network, and the same code and overlay give
the same bytes. Its version is the tool's, tagged with the pin and the lock:
`0.1.0+vllm0.24.0.<first 8 hex of the lock's sha256>`, so that pip sees a new overlay as a new
version.
"""

from __future__ import annotations

import importlib.metadata
import io
import re
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from vllm_patchset.deploy.source import PACKED, overlay_files
from vllm_patchset.errors import BadInput
from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.hashes import record_hash, sha256_bytes
from vllm_patchset.overlay.lock import Lock
from vllm_patchset.registry import DEPLOY_PYTHON

DIST = "vllm-patchset"
PACKAGE = "vllm_patchset"
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest zip date: the same bytes on every build
# The wheel's Python is what its deploy commands need (the checkout's pyproject: the tool's).
REQUIRES_PYTHON = ">={}.{}".format(*DEPLOY_PYTHON)


@dataclass(frozen=True)
class Packed:
    wheel: Path
    version: str
    sha256: str
    lock: Lock


def wheel_version(tool_version: str, lock_bytes: bytes, vllm_version: str) -> str:
    pin = re.sub(r"[^a-z0-9]+", ".", vllm_version.lower()).strip(".")
    return f"{Version(tool_version).public}+vllm{pin}.{sha256_bytes(lock_bytes)[:8]}"


@dataclass(frozen=True)
class Metadata:
    """What the wheel's METADATA and entry_points.txt say, from the tool's pyproject.toml
    (running from a checkout: an editable install's metadata is as old as the install) or
    from the installed distribution (running from a wheel)."""

    name: str
    version: str
    headers: tuple[tuple[str, str], ...]  # Summary, License, Requires-Python, Requires-Dist…
    entry_points: tuple[tuple[str, str, str], ...]  # (group, name, value)

    @staticmethod
    def from_pyproject(path: Path) -> Metadata:
        table = tomllib.loads(path.read_text("utf-8"))["project"]
        headers = [("Summary", str(table.get("description", "")))]
        license = table.get("license", {})  # an SPDX string, or the older {text = "..."}
        text = license.get("text") if isinstance(license, dict) else license
        if text:
            headers.append(("License", str(text)))
        headers.append(("Requires-Python", REQUIRES_PYTHON))
        headers += [("Requires-Dist", str(r)) for r in table.get("dependencies", [])]
        for extra, requirements in table.get("optional-dependencies", {}).items():
            headers.append(("Provides-Extra", extra))
            headers += [("Requires-Dist", _with_extra(str(r), extra)) for r in requirements]
        points = [("console_scripts", n, v) for n, v in table.get("scripts", {}).items()]
        for group, entries in table.get("entry-points", {}).items():
            points += [(group, n, v) for n, v in entries.items()]
        return Metadata(str(table["name"]), str(table["version"]), tuple(headers), tuple(points))

    @staticmethod
    def from_dist(dist: importlib.metadata.Distribution) -> Metadata:
        meta = dist.metadata
        keys = ("Summary", "License", "Requires-Python", "Provides-Extra", "Requires-Dist")
        headers = tuple(
            (k, REQUIRES_PYTHON if k == "Requires-Python" else str(v))
            for k in keys
            for v in meta.get_all(k) or []
        )
        points = tuple((p.group, p.name, p.value) for p in dist.entry_points)
        return Metadata(str(meta["Name"]), dist.version, headers, points)

    def metadata_file(self, version: str, lock: Lock) -> bytes:
        lines = ["Metadata-Version: 2.1", f"Name: {self.name}", f"Version: {version}"]
        lines += [f"{key}: {value}" for key, value in self.headers if value]
        patches = ", ".join(lock.patches) or "no patches"
        body = f"vllm-patchset with the overlay for {lock.package} {lock.version}: {patches}.\n"
        return ("\n".join(lines) + "\n\n" + body).encode()

    def entry_points_file(self) -> bytes:
        groups: dict[str, list[str]] = {}
        for group, name, value in sorted(self.entry_points):
            groups.setdefault(group, []).append(f"{name} = {value}\n")
        return "".join(f"[{g}]\n{''.join(lines)}\n" for g, lines in groups.items()).encode()


def _with_extra(requirement: str, extra: str) -> str:
    name, _, marker = requirement.partition(";")
    marker = f"({marker.strip()}) and " if marker.strip() else ""
    return f'{name.strip()}; {marker}extra == "{extra}"'


def tool_metadata(source: Path) -> Metadata:
    """The metadata of the tool whose package is `source`."""
    pyproject = source.parent.parent / "pyproject.toml"  # a checkout: scripts/vllm_patchset
    if pyproject.is_file():
        try:
            meta = Metadata.from_pyproject(pyproject)
        except (KeyError, TypeError, AttributeError, tomllib.TOMLDecodeError):
            meta = None
        if meta is not None and meta.name == DIST:
            return meta
    try:
        return Metadata.from_dist(importlib.metadata.distribution(DIST))
    except importlib.metadata.PackageNotFoundError:
        raise BadInput(f"{DIST} is not installed, and {source} is not in its checkout") from None


def wheel_files(project: Project) -> tuple[dict[str, bytes], str, Lock]:
    """The wheel's files (path -> bytes, RECORD last), its version and the lock inside."""
    # The code is the running tool's own package (a checkout's, or an installed wheel's).
    source = Path(__file__).resolve().parents[1]
    meta = tool_metadata(source)
    lock_bytes = fsio.read_regular(project.lock_path)
    if lock_bytes is None:
        raise BadInput(f"no overlay lock at {project.lock_path}: run `vllm-patchset overlay build`")
    lock = Lock.from_json(lock_bytes.decode("utf-8"), str(project.lock_path))
    overlay = overlay_files(lock, project.overlay_dir)  # each checked against the lock
    version = wheel_version(meta.version, lock_bytes, lock.version)
    files = {
        f"{PACKAGE}/{path.relative_to(source).as_posix()}": path.read_bytes()
        for path in sorted(source.rglob("*.py"))
    }
    files[f"{PACKAGE}/{PACKED}/overlay.lock.json"] = lock_bytes
    files.update({f"{PACKAGE}/{PACKED}/{path}": data for path, data in sorted(overlay.items())})
    info = f"{PACKAGE}-{version}.dist-info"
    files[f"{info}/METADATA"] = meta.metadata_file(version, lock)
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: vllm-patchset overlay pack\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n"
    )
    files[f"{info}/entry_points.txt"] = meta.entry_points_file()
    record = "".join(f"{p},{record_hash(d)},{len(d)}\n" for p, d in files.items())
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
