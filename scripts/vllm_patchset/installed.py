"""Where things are in an installed vllm: the package, its dist-info, the deploy state beside it.

Shared by `deploy` and the runtime `guard`, which imports it at every vLLM start: stdlib only,
no dataclasses (each costs about a millisecond to create), so that import stays cheap.
"""

from __future__ import annotations

import os
from pathlib import Path

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
