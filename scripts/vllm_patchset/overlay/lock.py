"""The overlay lock: which upstream the overlay was built from, and for every
overlaid file its pristine and patched sha256 and the patches that touch it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vllm_patchset.errors import BadInput
from vllm_patchset.infra import jsonfile
from vllm_patchset.infra.fsio import read_regular

LOCK_SCHEMA = 1


@dataclass(frozen=True)
class LockEntry:
    path: str  # relative to the directory holding the `vllm` package, e.g. "vllm/.../triton_moe.py"
    pristine_sha256: str
    patched_sha256: str
    patches: tuple[str, ...]


@dataclass(frozen=True)
class Lock:
    package: str
    version: str
    source: str  # where the pristine upstream came from, e.g. "pypi:vllm-0.24.0.tar.gz sha256:…"
    upstream_commit: str  # mirror commit of the pristine tree (git ids are content hashes)
    patches: tuple[str, ...]  # the patches applied, in order
    entries: tuple[LockEntry, ...]

    def entry(self, path: str) -> LockEntry | None:
        return next((e for e in self.entries if e.path == path), None)

    def to_json(self) -> str:
        doc = {
            "schema": LOCK_SCHEMA,
            "package": self.package,
            "version": self.version,
            "source": self.source,
            "upstream_commit": self.upstream_commit,
            "patches": list(self.patches),
            "files": {
                e.path: {
                    "pristine_sha256": e.pristine_sha256,
                    "patched_sha256": e.patched_sha256,
                    "patches": list(e.patches),
                }
                for e in sorted(self.entries, key=lambda e: e.path)
            },
        }
        return json.dumps(doc, indent=2) + "\n"

    @staticmethod
    def from_json(text: str, where: str) -> Lock:
        try:
            doc = jsonfile.parse(text.encode("utf-8", "surrogateescape"))
            if doc["schema"] != LOCK_SCHEMA:
                raise BadInput(f"{where}: lock schema {doc['schema']} is not {LOCK_SCHEMA}")
            entries = tuple(
                LockEntry(
                    path=path,
                    pristine_sha256=str(f["pristine_sha256"]),
                    patched_sha256=str(f["patched_sha256"]),
                    patches=tuple(str(p) for p in f["patches"]),
                )
                for path, f in doc["files"].items()
            )
            return Lock(
                package=str(doc["package"]),
                version=str(doc["version"]),
                source=str(doc["source"]),
                upstream_commit=str(doc["upstream_commit"]),
                patches=tuple(str(p) for p in doc["patches"]),
                entries=entries,
            )
        except KeyError as exc:
            raise BadInput(f"{where}: not a valid overlay lock (no {exc.args[0]!r})") from None
        except (ValueError, TypeError, AttributeError) as exc:
            raise BadInput(f"{where}: not a valid overlay lock ({exc})") from None

    @staticmethod
    def load(path: Path) -> Lock:
        data = read_regular(path, limit=jsonfile.MAX_BYTES + 1)  # a FIFO is refused, not opened
        if data is None:
            raise BadInput(
                f"no overlay lock at {path}: run `vllm-patchset overlay build --update-lock`"
            )
        return Lock.from_json(data.decode("utf-8", "surrogateescape"), str(path))
