"""A vLLM general plugin: at start, in every vLLM process, say whether the overlay is active.

vLLM calls `register()` through the entry point `vllm_patchset_guard` (group
`vllm.general_plugins`, see pyproject.toml) from `vllm.plugins.load_general_plugins()`, in the
API server, the engine core and each worker. It logs one line: the overlay is active with its
patches, or a loud warning when it is missing, partial, or was applied to another vLLM version
(as after `pip install -U vllm`). With VLLM_PATCHSET_STRICT=1 that warning is a startup error
instead. Nothing else it meets may stop vLLM: its own failures are logged and swallowed.

It checks against the record that `overlay apply` leaves beside the install
(`<site-packages>/.vllm-patchset/applied.json`), not a copy of the lock shipped in this
package: the record says what was applied to *this* install, so it stays right when vllm and
vllm-patchset are upgraded separately or deployed with `--target`/`--python`, and there is no
second copy of the lock to keep in sync. The check reads one small JSON file and the METADATA
and hashes the overlaid files (a few tens of kB): about 0.1 ms, and a few ms with the import
of this module in a vLLM process (benchmarks/bench_guard.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import NamedTuple

from vllm_patchset.errors import PatchsetError
from vllm_patchset.infra import jsonfile
from vllm_patchset.infra.fsio import read_chunks, read_regular
from vllm_patchset.infra.installed import JOURNAL, RECORD, STATE_DIR, installed_version, path_parts

STRICT_ENV = "VLLM_PATCHSET_STRICT"
# Under "vllm": vLLM's own handler and format print it, at vLLM's log level.
logger = logging.getLogger("vllm.vllm_patchset")


class OverlayNotActive(RuntimeError):
    """Raised at vLLM start under VLLM_PATCHSET_STRICT=1 when the overlay is not active."""


class Outcome(NamedTuple):  # not a dataclass: this module is imported at every vLLM start
    active: bool
    message: str


def check(root: Path, package: str = "vllm") -> Outcome:
    """Is the overlay recorded in `root` (the dir holding the package) active there?

    Reads the record as plain JSON (`deploy.record.read_record` would import the dataclasses)."""
    where = root / package
    state = root / STATE_DIR
    try:
        version = installed_version(root, package)
    except PatchsetError as exc:
        return Outcome(False, f"vllm-patchset: cannot check the overlay of {where}: {exc}")
    if (state / JOURNAL).exists():
        return Outcome(
            False,
            f"vllm-patchset: an interrupted `overlay apply` left {where} half-done: run"
            f" `vllm-patchset overlay status --target {root}`",
        )
    try:
        record = read_regular(state / RECORD)  # a FIFO there is refused, never opened
        if record is None:
            return Outcome(
                False,
                f"vllm-patchset: NO overlay applied to {package} {version} at {where}: its fixes"
                " are NOT active (run `vllm-patchset overlay apply`)",
            )
        doc = jsonfile.parse(record)
        lock = doc["lock"]
        locked_version = str(lock["version"])
        patches = [str(p) for p in lock["patches"]]
        files = {str(k): _sha_of(v["patched_sha256"]) for k, v in lock["files"].items()}
        # The files vLLM ships (a reinstall replaces them; it leaves a file the overlay added).
        shipped = {str(k) for k, v in lock["files"].items() if v["pristine_sha256"] is not None}
        sizes = doc.get("patched_sizes") or {}  # records of before 0.x have none
        sizes = {str(k): v for k, v in sizes.items() if isinstance(v, int)}
    except (PatchsetError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, OSError):
            why = exc.strerror or type(exc).__name__
        elif isinstance(exc, PatchsetError | jsonfile.BadJson):
            why = str(exc)  # in words, naming what is wrong
        else:
            why = type(exc).__name__  # a field missing or of another type
        return Outcome(
            False,
            f"vllm-patchset: unreadable record {state / RECORD} ({why}): the overlay cannot be"
            " confirmed (run `vllm-patchset overlay status`)",
        )
    if version != locked_version:
        return Outcome(
            False,
            f"vllm-patchset: the overlay was applied to {package} {locked_version}, but"
            f" {package} {version} is installed at {where} now (upgraded?): its fixes are NOT"
            f" active (rebase the patch set onto {version} and apply it)",
        )
    unpatched = {
        rel: rel.rsplit("/", 1)[-1]
        for rel, sha in files.items()
        if (_sha256(root, package, rel, sizes.get(rel)) if sha else _there(root, package, rel))
        != sha
    }
    if unpatched and set(unpatched) >= (shipped or set(files)):
        return Outcome(
            False,
            f"vllm-patchset: the overlay applied to {package} {version} at {where} is GONE"
            " (vllm reinstalled?): its fixes are NOT active (run `vllm-patchset overlay apply`)",
        )
    if unpatched:
        return Outcome(
            False,
            f"vllm-patchset: the overlay on {package} {version} at {where} is PARTIAL:"
            f" {len(unpatched)} of {len(files)} files are not patched"
            f" ({', '.join(unpatched.values())}): its fixes are NOT active (run"
            " `vllm-patchset overlay status`, then apply)",
        )
    stale = [pyc for rel, sha in files.items() if sha for pyc in _stale_of(root, package, rel)]
    if stale:
        return Outcome(
            False,
            f"vllm-patchset: the overlay on {package} {version} at {where} is NOT active:"
            f" {STALE} {stale[0]} runs instead of the patched file"
            + (f" (and {len(stale) - 1} more)" if len(stale) > 1 else "")
            + " (run `vllm-patchset overlay apply`: it removes them)",
        )
    return Outcome(
        True,
        f"vllm-patchset: overlay active on {package} {version}:"
        f" {', '.join(patches) or 'no patches'} ({len(files)} files)",
    )


def _sha_of(value: object) -> str | None:
    """A record's patched sha256: a string, or None (null) for a file the overlay deletes."""
    return None if value is None else str(value)


def _there(root: Path, package: str, rel: str) -> str | None:
    """For a file the overlay deletes: None where nothing is at its path (patched), else
    "there"."""
    parts = path_parts(package, rel)
    return "there" if parts is None or os.path.lexists(root.joinpath(*parts)) else None


def _sha256(root: Path, package: str, rel: str, size: int | None) -> str | None:
    """The file's sha256, streamed in chunks (a large file is never held whole), or None: it
    is missing, not a regular file, or not of the `size` the record gives (not read at all).
    A symlink to a regular file is read through (an install made of links, as uv's
    `--link-mode symlink` makes: this only reads)."""
    parts = path_parts(package, rel)
    if parts is None:
        return None
    digest = hashlib.sha256()
    try:
        for chunk in read_chunks(root.joinpath(*parts), size=size, follow=True):
            digest.update(chunk)
    except (PatchsetError, OSError):  # a FIFO, another size, missing: not the patched file
        return None
    return digest.hexdigest()


STALE = "stale unchecked-hash bytecode"  # the words of status, verify and this guard


def bytecode_files(source: Path) -> list[Path]:
    """`__pycache__/<module>.*.pyc` of a module, for every interpreter and optimization level."""
    cache = source.parent / "__pycache__"
    if not cache.is_dir() or cache.is_symlink():
        return []
    prefix = source.name.removesuffix(".py") + "."
    return sorted(p for p in cache.iterdir() if p.name.startswith(prefix) and p.suffix == ".pyc")


def stale_bytecode(source: Path, data: bytes | None = None) -> list[Path]:
    """Unchecked-hash pycs that do not match the source (`data`, else read only when such a
    pyc is there): Python would run them instead of it. Cheap where there is none."""
    stale = []
    for pyc in bytecode_files(source):
        try:
            head = read_regular(pyc, limit=16) or b""
        except PatchsetError:
            stale.append(pyc)  # not a regular file where a pyc should be: not the patched code
            continue
        flags = int.from_bytes(head[4:8], "little")
        if flags & 0b01 and not flags & 0b10:  # hash-based, check_source off (PEP 552)
            if data is None:
                data = read_regular(source, follow=True) or b""
            current = head[:4] == importlib.util.MAGIC_NUMBER
            if not (current and head[8:16] == importlib.util.source_hash(data)):
                stale.append(pyc)
    return stale


def _stale_of(root: Path, package: str, rel: str) -> list[Path]:
    parts = path_parts(package, rel)
    try:
        return stale_bytecode(root.joinpath(*parts)) if parts is not None else []
    except (PatchsetError, OSError):
        return []


def _installed_root(package: str) -> Path | None:
    """The dir holding the package this process imports (vllm is importing us: it is loaded)."""
    module = sys.modules.get(package)
    origin = getattr(module, "__file__", None) if module is not None else None
    if origin is None:
        spec = importlib.util.find_spec(package)
        origin = spec.origin if spec is not None else None
    return Path(origin).parent.parent if origin else None


def register() -> None:
    strict = os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes")
    try:
        root = _installed_root("vllm")
        outcome = (
            check(root)
            if root is not None
            else Outcome(False, "vllm-patchset: vllm is not importable: no overlay to check")
        )
    except Exception as exc:  # the guard must never be the reason vLLM does not start...
        message = f"vllm-patchset: could not check the overlay ({type(exc).__name__}: {exc})"
        if strict:  # ...but under STRICT, an overlay it cannot confirm stops it, whatever failed
            raise OverlayNotActive(f"{message} [{STRICT_ENV}=1]") from None
        logger.warning("%s", message)
        return
    if outcome.active:
        logger.info("%s", outcome.message)
    elif strict:
        raise OverlayNotActive(f"{outcome.message} [{STRICT_ENV}=1]")
    else:
        logger.warning("%s", outcome.message)
