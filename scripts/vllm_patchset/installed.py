"""Where things are in an installed vllm: the package, its dist-info, the deploy state beside it.

Shared by `deploy` and the runtime `guard`, which imports it at every vLLM start: stdlib only,
no dataclasses (each costs about a millisecond to create), so that import stays cheap.
"""

from __future__ import annotations

import os
from pathlib import Path

from vllm_patchset.errors import BadInput

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
        with metadata.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
                if not line.strip():
                    break  # end of the headers
    except OSError as exc:
        raise BadInput(f"cannot read the {package} dist-info in {root}: {exc}") from None
    raise BadInput(f"{metadata}: no Version header")


def path_parts(package: str, rel: str) -> list[str] | None:
    """The parts of a lock path, or None when it is not a plain relative path in the package."""
    parts = rel.split("/")
    if (
        rel.startswith("/")
        or "\\" in rel
        or "\x00" in rel
        or parts[0] != package
        or len(parts) < 2
        or any(part in ("", ".", "..") for part in parts)
    ):
        return None
    return parts
