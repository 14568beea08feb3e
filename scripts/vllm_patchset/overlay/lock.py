"""The overlay lock: which upstream the overlay was built from, and for every
overlaid file its pristine and patched sha256 and the patches that touch it.

Schema 2 (this tool writes it) lets a file be absent on one side: `pristine_sha256` is null
for a file the patches add, `patched_sha256` null for one they delete. Schema 1 (no nulls) is
still read: a deploy record written by an earlier version keeps its copy of the lock."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vllm_patchset.errors import BadInput
from vllm_patchset.infra import codec, jsonfile
from vllm_patchset.infra.fsio import read_regular

LOCK_SCHEMA = 2
READ_SCHEMAS = (1, 2)


@dataclass(frozen=True)
class LockEntry:
    path: str  # relative to the directory holding the `vllm` package, e.g. "vllm/.../triton_moe.py"
    pristine_sha256: str | None  # None: the file is absent upstream (the patches add it)
    patched_sha256: str | None  # None: the patches delete the file
    patches: tuple[str, ...]

    @property
    def change(self) -> str:
        """ "added", "deleted" or "modified" (by the patches, on the pristine tree)."""
        if self.pristine_sha256 is None:
            return "added"
        return "deleted" if self.patched_sha256 is None else "modified"


@dataclass(frozen=True)
class Lock:
    package: str
    version: str
    source: str  # where the pristine upstream came from, e.g. "pypi:vllm-0.24.0.tar.gz sha256:…"
    upstream_commit: str  # mirror commit of the pristine tree (git ids are content hashes)
    patches: tuple[str, ...]  # the patches applied, in order
    # In the file: "files", an object of the entries by path (sorted).
    entries: tuple[LockEntry, ...] = field(metadata={"json": "files", "keyed": "path"})

    def entry(self, path: str) -> LockEntry | None:
        return next((e for e in self.entries if e.path == path), None)

    def to_doc(self) -> dict[str, Any]:
        """The lock as JSON values (the file, and the deploy record's copy): the schema first."""
        entries = tuple(sorted(self.entries, key=lambda e: e.path))
        return {"schema": LOCK_SCHEMA, **codec.to_doc(replace(self, entries=entries))}

    def to_json(self) -> str:
        return json.dumps(self.to_doc(), indent=2) + "\n"

    @staticmethod
    def from_json(text: str, where: str) -> Lock:
        try:
            doc = jsonfile.parse(text.encode("utf-8", "surrogateescape"))
        except jsonfile.BadJson as exc:
            raise BadInput(f"{where}: not a valid overlay lock ({exc})") from None
        return Lock.from_doc(doc, where)

    @staticmethod
    def from_doc(doc: Any, where: str) -> Lock:
        """The inverse of `to_doc`; BadInput saying what is wrong, after `where`."""
        try:
            if isinstance(doc, dict):
                if jsonfile.field(doc, "schema", object) not in READ_SCHEMAS:
                    raise BadInput(
                        f"{where}: lock schema {doc['schema']} is not one of"
                        f" {', '.join(map(str, READ_SCHEMAS))}"
                    )
                jsonfile.field(doc, "files", object)  # a lock cut short: its files are missing
            lock = codec.from_doc(Lock, doc)
        except jsonfile.BadJson as exc:
            raise BadInput(f"{where}: not a valid overlay lock ({exc})") from None
        for entry in lock.entries:
            why = (
                "absent on both sides"
                if entry.pristine_sha256 is None and entry.patched_sha256 is None
                else "a null sha256 in a schema 1 lock"
                if doc["schema"] == 1 and entry.change != "modified"
                else None
            )
            if why:
                raise BadInput(f"{where}: not a valid overlay lock (files[{entry.path!r}]: {why})")
        return lock

    @staticmethod
    def load(path: Path) -> Lock:
        data = read_regular(path, limit=jsonfile.MAX_BYTES + 1)  # a FIFO is refused, not opened
        if data is None:
            raise BadInput(
                f"no overlay lock at {path}: run `vllm-patchset overlay build --update-lock`"
            )
        return Lock.from_json(data.decode("utf-8", "surrogateescape"), str(path))


def compare_locks(built: Lock, committed: Lock) -> str | None:
    """A one-line description of the first difference, or None."""
    if (built.version, built.upstream_commit) != (committed.version, committed.upstream_commit):
        return (
            f"lock is for {committed.version} ({committed.upstream_commit[:12]}), "
            f"build is for {built.version} ({built.upstream_commit[:12]})"
        )
    paths = sorted({e.path for e in built.entries} | {e.path for e in committed.entries})
    for path in paths:
        a, b = built.entry(path), committed.entry(path)
        if a != b:
            what = (
                "missing from the lock"
                if b is None
                else "not built"
                if a is None
                else (
                    "patched sha256 differs"
                    if a.patched_sha256 != b.patched_sha256
                    else "pristine sha256 differs"
                    if a.pristine_sha256 != b.pristine_sha256
                    else "patch list differs"
                )
            )
            return f"{path}: {what}"
    if built.patches != committed.patches:
        return f"applied patches {list(built.patches)} differ from {list(committed.patches)}"
    return None
