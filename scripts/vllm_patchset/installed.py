"""Where things are in an installed vllm: the package, its dist-info, the deploy state beside it.

Shared by `deploy` and the runtime `guard`, which imports it at every vLLM start: stdlib only,
no dataclasses (each costs about a millisecond to create), so that import stays cheap.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

from vllm_patchset.errors import BadInput
from vllm_patchset.fsio import UnsafePath, plain_parts, read_regular

STATE_DIR = ".vllm-patchset"  # beside the package: <target>/.vllm-patchset/
LOCK_FILE = "lock"
JOURNAL = "journal.jsonl"
RECORD = "applied.json"
ORIGINALS = "originals"


def installed_version(root: Path, package: str) -> str:
    """The Version of the one `<package>-*.dist-info` beside the package in `root`."""
    try:
        names = [
            n
            for n in os.listdir(root)
            if n.endswith(".dist-info")
            and n.removesuffix(".dist-info").rsplit("-", 1)[0].lower().replace(".", "_") == package
        ]
        if len(names) != 1:
            what = "no" if not names else f"{len(names)}"
            raise BadInput(f"{root}: {what} {package}-*.dist-info beside the package")
        metadata = root / names[0] / "METADATA"
        data = read_regular(metadata, limit=1 << 20)  # no FIFO is opened: the guard reads this
    except (OSError, UnsafePath) as exc:
        raise BadInput(f"cannot read the {package} dist-info in {root}: {exc}") from None
    for line in (data or b"").decode("utf-8", "replace").splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
        if not line.strip():
            break  # end of the headers
    raise BadInput(f"{metadata}: no Version header")


def path_parts(package: str, rel: str) -> tuple[str, ...] | None:
    """The parts of a lock path, or None when it is not a plain relative path in the package."""
    return plain_parts(rel, package)


class Probe(NamedTuple):  # not a dataclass: the guard imports this module at every vLLM start
    origin: str | None  # the package's __init__.py, as find_spec sees it (not imported)
    version: str | None  # its distribution's version
    record: str | None  # its distribution's RECORD
    site_dirs: tuple[str, ...]  # where the interpreter installs packages


# Run by the interpreter of `--python` (or this one): finds the package without importing it,
# so neither vllm nor torch is loaded. `-c` puts the caller's cwd first on sys.path: drop it.
_PROBE = """\
import importlib.metadata as md, importlib.util, json, site, sys, sysconfig
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]
spec = importlib.util.find_spec(sys.argv[1])
try:
    dist = md.distribution(sys.argv[1])
    version, record = dist.version, dist.read_text("RECORD")
except md.PackageNotFoundError:
    version = record = None
dirs = [sysconfig.get_paths()["purelib"], *getattr(site, "getsitepackages", list)()]
answer = {"origin": spec and spec.origin, "version": version, "record": record, "dirs": dirs}
print("vllm-patchset-probe", json.dumps(answer))
"""


def probe(python: str, package: str) -> Probe:
    """Ask `python` where its `package` is; "cannot run --python …" when it gives no answer."""
    import subprocess

    from vllm_patchset.fsio import die_with_parent

    try:
        done = subprocess.run(
            [python, "-c", _PROBE, package],
            capture_output=True,
            timeout=120,
            preexec_fn=die_with_parent(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise BadInput(f"cannot run --python {python}: {why}") from None
    out = done.stdout.decode("utf-8", "replace").splitlines()
    answer = next((line for line in reversed(out) if line.startswith("vllm-patchset-probe ")), "")
    try:
        doc = json.loads(answer.partition(" ")[2]) if done.returncode == 0 else {}
        found: Probe | None = Probe(
            doc["origin"], doc["version"], doc["record"], tuple(str(d) for d in doc["dirs"])
        )
    except (ValueError, TypeError, KeyError):
        found = None
    if found is None or not all(
        isinstance(v, str | None) for v in (found.origin, found.version, found.record)
    ):
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()
        why = f"exit {done.returncode}: {err[-1]}" if done.returncode and err else "no answer"
        raise BadInput(f"cannot run --python {python}: {why} (is it a Python interpreter?)")
    return found
