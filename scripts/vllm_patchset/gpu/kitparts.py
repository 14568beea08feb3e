"""The native-ops kit's parts: write, check and reassemble them (standard library only).

A kit is one xz-compressed tar stream cut into parts of at most 60 MiB, so that each part can
travel over a narrow channel on its own, plus `kit.json`: the sha256 and size of every part,
the pin's wheel (name and the index's sha256), the sha256 of that wheel's RECORD and of every
dependency wheel. The stream holds:

- `site/vllm/**` and `site/vllm-<version>.dist-info/**`: the files of the pin's wheel that
  vLLM's engine and MoE path need (the pure-Python package and the compiled extensions),
  byte for byte as the wheel has them;
- `wheels/*.whl`: the pure-Python and binary packages vLLM imports that a GPU host with torch
  lacks.

On the host (`python3 kitparts.py assemble KIT --dest DIR`), every part is checked before any
byte is unpacked; the stream is unpacked into a staging folder, every `site/` file is checked
against the wheel's RECORD (itself checked against kit.json), the wheels are checked and
installed into `site/` with pip (no index), and only then is the staging folder renamed to
DIR. A missing, truncated or altered part, or a file that is not the wheel's, is one line on
stderr and nothing is written. `vllm-patchset kit build` (kitbuild.py) writes kits; this module
is also copied into `vllm-patchset bundle`'s archive, for hosts without vllm-patchset.

Since it travels alone, it keeps its own standard-library writes and children (open, rename,
rmtree, mkdtemp, subprocess for pip) instead of the file-system layer (`infra/fsio/`), which
does not travel; tests/test_fs_layer.py lets it. For the same reason kit.json has its own
reader and writer here (`Manifest.load`, `Manifest.to_json`), not the tool's one codec
(`infra/codec.py`, which does not travel; `infra/jsonfile.py`, its checked reader, does).
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, cast

try:
    from vllm_patchset.infra import archives, jsonfile
    from vllm_patchset.infra.fsio import interrupts
except ImportError:  # in a GPU bundle, without vllm-patchset: the three files beside this one
    import archives  # type: ignore[import-not-found,no-redef]
    import interrupts  # type: ignore[import-not-found,no-redef]
    import jsonfile  # type: ignore[import-not-found,no-redef]

MANIFEST = "kit.json"
PART_LIMIT = 60 * 2**20  # each part fits a channel of 64 MiB with room for what travels beside
PART_PREFIX = "kit.tar.xz."
COMPLETE = ".kit-complete"  # in an assembled kit: the manifest it came from
FORMAT = 1


class KitError(Exception):
    """A kit that is incomplete, altered or not the wheel's: one line a user can act on."""

    exit_code = 1  # a finding, as vllm-patchset's exit codes go


class KitUsage(KitError):
    """Not a kit folder, or a destination that is taken: bad usage."""

    exit_code = 2


@dataclass(frozen=True)
class Part:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    vllm: str  # the pin
    wheel: str  # the pin's wheel file name
    wheel_sha256: str  # as the package index gives it
    record_sha256: str  # sha256 of the wheel's dist-info/RECORD
    site_files: int  # files under site/ (the RECORD itself included)
    wheels: dict[str, str]  # dependency wheel file name -> sha256
    parts: tuple[Part, ...]

    def to_json(self) -> str:
        data = {
            "format": FORMAT,
            "vllm": self.vllm,
            "wheel": self.wheel,
            "wheel_sha256": self.wheel_sha256,
            "record_sha256": self.record_sha256,
            "site_files": self.site_files,
            "wheels": dict(sorted(self.wheels.items())),
            "parts": [p.__dict__ for p in self.parts],
        }
        return json.dumps(data, indent=2) + "\n"

    @staticmethod
    def load(kit: Path) -> Manifest:
        path = kit / MANIFEST
        try:
            data = jsonfile.load(path, limit=1 << 20)
            if data.get("format") != FORMAT:
                raise KitError(f"{path}: format {data.get('format')!r}, expected {FORMAT}")
            return Manifest(
                vllm=str(data["vllm"]),
                wheel=str(data["wheel"]),
                wheel_sha256=str(data["wheel_sha256"]),
                record_sha256=str(data["record_sha256"]),
                site_files=int(data["site_files"]),
                wheels={str(k): str(v) for k, v in data["wheels"].items()},
                parts=tuple(
                    Part(str(p["name"]), int(p["size"]), str(p["sha256"])) for p in data["parts"]
                ),
            )
        except FileNotFoundError:
            raise KitUsage(f"no {MANIFEST} in {kit}: not a kit folder") from None
        except KeyError as exc:
            raise KitError(f"{path} is malformed (no {exc.args[0]!r})") from None
        except OSError as exc:
            raise KitError(f"{path} is unreadable ({exc.strerror or exc})") from None
        except (ValueError, TypeError, AttributeError) as exc:
            raise KitError(f"{path} is malformed ({exc})") from None


# -- writing -----------------------------------------------------------------------------------
class PartWriter(io.RawIOBase):
    """A binary sink that cuts what is written into files `<prefix>00`, `<prefix>01`, ... of at
    most `limit` bytes each, hashing each part as it goes."""

    def __init__(self, folder: Path, limit: int = PART_LIMIT, prefix: str = PART_PREFIX) -> None:
        super().__init__()
        if limit < 1:
            raise ValueError(f"part limit {limit} is not positive")
        self.folder, self.limit, self.prefix = folder, limit, prefix
        self.parts: list[Part] = []
        self._handle: BinaryIO | None = None
        self._digest = hashlib.sha256()
        self._size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        while view:
            if self._handle is None or self._size == self.limit:
                self._next_part()
            assert self._handle is not None
            chunk = view[: self.limit - self._size]
            self._handle.write(chunk)
            self._digest.update(chunk)
            self._size += len(chunk)
            view = view[len(chunk) :]
        return len(data)

    def _next_part(self) -> None:
        self._finish_part()
        name = f"{self.prefix}{len(self.parts):02d}"
        self._handle = (self.folder / name).open("wb")
        self._digest = hashlib.sha256()
        self._size = 0

    def _finish_part(self) -> None:
        if self._handle is not None:
            self._handle.close()
            name = Path(self._handle.name).name
            self.parts.append(Part(name, self._size, self._digest.hexdigest()))
            self._handle = None

    def close(self) -> None:
        if not self.closed:
            self._finish_part()
        super().close()


# -- checking and reading ----------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify(kit: Path) -> Manifest:
    """Every part of the manifest present, of its size and sha256; raise KitError otherwise."""
    manifest = Manifest.load(kit)
    if not manifest.parts:
        raise KitError(f"{kit / MANIFEST} lists no parts")
    for part in manifest.parts:
        if PurePosixPath(part.name).name != part.name or part.name in ("", ".", ".."):
            raise KitError(f"{kit / MANIFEST}: part name {part.name!r} is not a plain file name")
        path = kit / part.name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise KitError(f"kit part {part.name} in {kit} is not a regular file")
        if not path.is_file():
            raise KitError(f"kit part {part.name} is missing from {kit}")
        size = path.stat().st_size
        if size != part.size:
            raise KitError(
                f"kit part {part.name} is {size} bytes, the manifest says {part.size}"
                " (truncated or incomplete copy)"
            )
        got = sha256_file(path)
        if got != part.sha256:
            raise KitError(
                f"kit part {part.name}: sha256 {got} is not the manifest's {part.sha256} (altered)"
            )
    return manifest


class _Joined(io.RawIOBase):
    """The parts, read back to back as one stream."""

    def __init__(self, paths: list[Path]) -> None:
        super().__init__()
        self._paths = list(paths)
        self._handle: io.BufferedReader | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while True:
            if self._handle is None:
                if not self._paths:
                    return 0
                self._handle = self._paths.pop(0).open("rb")
            n = self._handle.readinto(buffer)
            if n:
                return n
            self._handle.close()
            self._handle = None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
        super().close()


def record_hashes(record: bytes) -> dict[str, str]:
    """A wheel RECORD as {path: sha256 hex}; paths listed without a hash map to ""."""
    hashes = {}
    for row in csv.reader(io.StringIO(record.decode("utf-8"))):
        if not row:
            continue
        algorithm, _, value = row[1].partition("=") if len(row) > 1 else ("", "", "")
        if algorithm and algorithm != "sha256":
            raise KitError(f"RECORD entry {row[0]} uses {algorithm}, not sha256")
        hashes[row[0]] = base64.urlsafe_b64decode(value + "==").hex() if value else ""
    return hashes


def _check_site(site: Path, manifest: Manifest) -> int:
    infos = list(site.glob("*.dist-info/RECORD"))
    if len(infos) != 1:
        raise KitError(f"the kit's site/ holds {len(infos)} dist-info RECORDs, expected 1")
    record = infos[0].read_bytes()
    if hashlib.sha256(record).hexdigest() != manifest.record_sha256:
        raise KitError(f"{infos[0].relative_to(site)} is not the RECORD of {manifest.wheel}")
    expected = record_hashes(record)
    count = 0
    for path in sorted(p for p in site.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(site).as_posix()
        if path.is_symlink():
            raise KitError(f"site/{rel} is a symbolic link; a wheel has none")
        if rel not in expected:
            raise KitError(f"site/{rel} is not a file of {manifest.wheel}")
        if expected[rel] and sha256_file(path) != expected[rel]:
            raise KitError(f"site/{rel} does not match the sha256 in {manifest.wheel}'s RECORD")
        count += 1
    if count != manifest.site_files:
        raise KitError(f"the kit's site/ holds {count} files, the manifest {manifest.site_files}")
    return count


def _check_wheels(folder: Path, manifest: Manifest) -> list[Path]:
    found = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    names = {p.name for p in found}
    if names != set(manifest.wheels):
        missing = sorted(set(manifest.wheels) - names)
        extra = sorted(names - set(manifest.wheels))
        raise KitError(f"the kit's wheels: missing {missing}, unexpected {extra}")
    for path in found:
        if sha256_file(path) != manifest.wheels[path.name]:
            raise KitError(f"wheels/{path.name} does not match its sha256 in the manifest")
    return found


PARTIAL = ".partial-"  # staging folders: .<dest name>.partial-<pid>-<random>


@contextmanager
def _staging(dest: Path) -> Iterator[Path]:
    """A fresh private folder beside `dest` (mkdtemp: mode 0700, a name no one else holds),
    removed unless the caller renamed it. What killed assemblies left (the pid in the name is
    gone) is removed first."""
    import tempfile

    prefix = f".{dest.name}{PARTIAL}"
    for name in os.listdir(dest.parent):
        pid = name.removeprefix(prefix).split("-")[0]
        if name.startswith(prefix) and pid.isdigit() and not _alive(int(pid)):
            path = dest.parent / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=dest.parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# A copy of `infra/fsio/children.py`'s `process_alive`: this module travels alone to GPU
# hosts, where the file-system layer is not.
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _listing(root: Path) -> dict[str, str]:
    """Every file below `root` (but the completion marker) and its sha256; KitError for a
    link or a special file."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                raise KitError(f"{root}/{rel} is a symbolic link: not what the kit assembled")
            if name in files and rel != COMPLETE:
                if not path.is_file():
                    raise KitError(f"{root}/{rel} is not a regular file")
                found[rel] = sha256_file(path)
    return found


def _assembled(dest: Path, text: str) -> bool:
    """Whether `dest` is an assembly of this manifest, checked file by file against the list
    its completion marker holds (a marker alone proves nothing)."""
    marker = dest / COMPLETE
    if dest.is_symlink() or not dest.is_dir() or marker.is_symlink() or not marker.is_file():
        return False
    try:
        doc = jsonfile.load(marker)
    except (OSError, ValueError):
        return False
    if doc.get("manifest") != text or not isinstance(doc.get("files"), dict):
        return False
    listed = doc["files"]
    found = _listing(dest)
    if found != listed:
        changed = sorted(set(found) ^ set(listed)) or sorted(
            r for r in found if found[r] != listed.get(r)
        )
        raise KitUsage(
            f"{dest} was assembled from this kit, but {dest}/{changed[0]} is not as assembled:"
            " remove the folder and assemble again"
        )
    return True


def assemble(kit: Path, dest: Path, python: str = sys.executable) -> Path:
    """Check every part, unpack, check every file, install the wheels into site/; return
    `dest`. Already assembled from the same manifest, every file as it was written: a no-op.
    Nothing is written on error."""
    manifest = verify(kit)
    text = manifest.to_json()
    if dest.exists() or dest.is_symlink():
        if _assembled(dest, text):
            return dest
        raise KitUsage(f"{dest} exists already and holds no assembly of this kit")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with _staging(dest) as staging:
            paths = [kit / p.name for p in manifest.parts]
            try:
                with (
                    _Joined(paths) as joined,
                    lzma.open(cast(BinaryIO, joined)) as xz,
                    tarfile.open(fileobj=xz, mode="r|") as tar,
                ):
                    archives.extract(
                        tar,
                        staging,
                        what="the kit's archive",
                        tops=("site", "wheels"),
                        bounds=archives.KIT_BOUNDS,
                        stream=True,
                    )
            except archives.ArchiveRefused as exc:
                raise KitError(str(exc)) from None
            except (lzma.LZMAError, tarfile.TarError, EOFError) as exc:
                raise KitError(f"the kit's archive does not unpack ({exc})") from None
            _check_site(staging / "site", manifest)
            wheels = _check_wheels(staging / "wheels", manifest)
            if wheels:
                _pip_install(python, wheels, staging / "site")
            done = {"manifest": text, "files": _listing(staging)}
            (staging / COMPLETE).write_text(json.dumps(done, indent=1) + "\n", encoding="utf-8")
            os.chmod(staging, 0o755)  # mkdtemp made it 0700
            staging.rename(dest)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise KitError(f"cannot assemble the kit in {dest}: {exc.strerror or exc}{where}") from None
    return dest


def _pip_install(python: str, wheels: list[Path], site: Path) -> None:
    command = [python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    command += ["--no-compile", "--disable-pip-version-check", "--target", str(site)]
    result = subprocess.run([*command, *map(str, wheels)], capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise KitError(f"pip could not install the kit's wheels: {last}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("verify", help="check every part's size and sha256")
    p.add_argument("kit", type=Path)
    p = sub.add_parser("assemble", help="check, unpack and check every file; install the wheels")
    p.add_argument("kit", type=Path)
    p.add_argument("--dest", type=Path, required=True, help="the folder to create")
    args = parser.parse_args(argv)
    try:
        if args.command == "verify":
            manifest = verify(args.kit)
            size = sum(p.size for p in manifest.parts) / 2**20
            print(f"kit for vllm {manifest.vllm}: {len(manifest.parts)} parts ({size:.1f} MiB) ok")
        else:
            dest = assemble(args.kit, args.dest)
            print(f"kit assembled in {dest}: PYTHONPATH={dest / 'site'}")
    except KitError as exc:
        print(f"kitparts: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a full disk, a folder that cannot be read: one line
        where = f": {exc.filename}" if exc.filename else ""
        print(f"kitparts: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(interrupts.command(main, "kitparts"))
