"""Where things are in an installed vllm: the package (in this or another interpreter), its
dist-info (version, RECORD), the deploy state beside it. The one package locator: `deploy`,
`fetch --installed` and the runtime `guard` use it.

The guard imports this module at every vLLM start: stdlib only, no dataclasses (each costs
about a millisecond to create), and what only the command line needs is imported where used.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

from vllm_patchset.errors import BadInput
from vllm_patchset.infra.fsio import UnsafePath, plain_parts, read_regular

STATE_DIR = ".vllm-patchset"  # beside the package: <target>/.vllm-patchset/
LOCK_FILE = "lock"
JOURNAL = "journal.jsonl"
RECORD = "applied.json"
ORIGINALS = "originals"


def canonical_name(name: str) -> str:
    """A distribution name as PEP 503 compares them (`Foo.Bar_baz` -> `foo-bar-baz`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_info(root: Path, package: str) -> Path:
    """The one `<package>-<version>.dist-info` directory beside the package in `root`."""
    try:
        names = [
            n
            for n in os.listdir(root)
            if n.endswith(".dist-info")
            and canonical_name(n.removesuffix(".dist-info").rsplit("-", 1)[0])
            == canonical_name(package)
        ]
    except OSError as exc:
        raise BadInput(f"cannot read the {package} dist-info in {root}: {exc}") from None
    if len(names) != 1:
        what = "no" if not names else f"{len(names)}"
        raise BadInput(f"{root}: {what} {package}-*.dist-info beside the package")
    return root / names[0]


def _dist_file(root: Path, package: str, name: str) -> bytes:
    path = dist_info(root, package) / name
    try:
        # no FIFO is opened: the guard reads this; a link to a regular file is read through (uv's
        # `--link-mode symlink` links every file of an install into its cache)
        data = read_regular(path, limit=64 << 20, follow=True)
    except UnsafePath as exc:  # it names the path
        raise BadInput(str(exc)) from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    if data is None:
        raise BadInput(f"{path} is missing")
    return data


def installed_version(root: Path, package: str) -> str:
    """The Version of the one `<package>-*.dist-info` beside the package in `root`."""
    for line in _dist_file(root, package, "METADATA").decode("utf-8", "replace").splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
        if not line.strip():
            break  # end of the headers
    raise BadInput(f"{dist_info(root, package) / 'METADATA'}: no Version header")


def parse_record(text: str) -> dict[str, str]:
    """A RECORD's rows: path -> hash (`sha256=<urlsafe base64>`, or "" where it has none)."""
    import csv  # here: the start-up guard imports this module and reads no RECORD

    return {row[0]: row[1] for row in csv.reader(io.StringIO(text)) if row and len(row) >= 2}


def installed_record(root: Path, package: str) -> dict[str, str]:
    """The RECORD of the dist-info beside the package in `root`."""
    data = _dist_file(root, package, "RECORD")
    try:
        return parse_record(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadInput(f"{dist_info(root, package) / 'RECORD'}: not UTF-8 ({exc})") from None


def path_parts(package: str, rel: str) -> tuple[str, ...] | None:
    """The parts of a lock path, or None when it is not a plain relative path in the package."""
    return plain_parts(rel, package)


# -- another interpreter's vllm ------------------------------------------------------------------
class Probe:
    """What `probe` found. A plain class: the start-up guard imports this module at every
    vLLM start, and a NamedTuple (or a dataclass) builds its class through exec at import,
    which cost a millisecond or more there."""

    __slots__ = ("origin", "record", "site_dirs", "version")

    def __init__(
        self,
        origin: str | None,  # the package's __init__.py, as find_spec sees it (not imported)
        version: str | None,  # its distribution's version
        record: str | None,  # its distribution's RECORD
        site_dirs: tuple[str, ...],  # where the interpreter installs packages
    ) -> None:
        self.origin, self.version, self.record, self.site_dirs = origin, version, record, site_dirs


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
    import shutil
    import subprocess  # here: the guard never runs another interpreter

    from vllm_patchset.infra.fsio import run_child

    if shutil.which(python) is None:  # said here: through setpriv it would be exit 127
        why = "Permission denied" if os.path.exists(python) else "No such file or directory"
        raise BadInput(f"cannot run --python {python}: {why}")
    try:
        done = run_child([python, "-c", _PROBE, package], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise BadInput(f"cannot run --python {python}: {why}") from None
    found = _answer(done.stdout) if done.returncode == 0 else None
    if found is None:
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()
        why = f"exit {done.returncode}: {err[-1]}" if done.returncode and err else "no answer"
        raise BadInput(f"cannot run --python {python}: {why} (is it a Python interpreter?)")
    return found


def _answer(stdout: bytes) -> Probe | None:
    """The probe's answer in what `_PROBE` printed (its last `vllm-patchset-probe` line), or
    None when there is none of the expected shape."""
    out = stdout.decode("utf-8", "replace").splitlines()
    answer = next((line for line in reversed(out) if line.startswith("vllm-patchset-probe ")), "")
    try:
        doc = json.loads(answer.partition(" ")[2])
        found = Probe(
            doc["origin"], doc["version"], doc["record"], tuple(str(d) for d in doc["dirs"])
        )
    except (ValueError, TypeError, KeyError):
        return None
    fields = (found.origin, found.version, found.record)
    return found if all(isinstance(v, str | None) for v in fields) else None
