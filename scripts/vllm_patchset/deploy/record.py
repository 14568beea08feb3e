"""The deploy record (`applied.json`: the commit point of an apply) and the journal
(`journal.jsonl`: one intent line, then one line per file done), and their JSON, through
`infra/codec.py` (the start-up guard reads the record with the standard library alone)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_patchset.errors import BadInput
from vllm_patchset.infra import codec, fsio, jsonfile
from vllm_patchset.infra.installed import JOURNAL, RECORD
from vllm_patchset.overlay.lock import Lock

if TYPE_CHECKING:
    from vllm_patchset.deploy.target import Target

RECORD_SCHEMA = 1


@dataclass(frozen=True)
class Record:
    lock: Lock
    originals: dict[str, str]  # path -> sha256 of the bytes saved in originals/
    transaction: str  # the journal id that wrote it (tells a committed apply from a killed one)
    # Each patched file's size, so that the start-up guard refuses a file of another size
    # before it reads a byte of it (the lock has only sha256s); records of before 0.x have none.
    patched_sizes: dict[str, int] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        """The file's JSON values: the schema, the transaction, then the fields in order (a
        key given twice in a dict display keeps its first place), the lock as its own file."""
        doc = codec.to_doc(self)
        return {"schema": RECORD_SCHEMA, "transaction": self.transaction, **doc} | {
            "lock": self.lock.to_doc()
        }

    @staticmethod
    def from_doc(doc: dict[str, Any], where: str) -> Record:
        """The inverse of `to_doc`; BadInput (a lock's own, or this schema's) or BadJson."""
        schema = jsonfile.field(doc, "schema", object)
        if schema != RECORD_SCHEMA:
            raise BadInput(f"{where}: record schema {schema} is not {RECORD_SCHEMA}")
        Lock.from_doc(jsonfile.field(doc, "lock", object), where)  # its schema, its messages
        return codec.from_doc(Record, doc)


ABSENT = ""  # a step's sha256 (and a record's original) of no file: one the overlay adds, deletes


def step_sha(sha: str | None) -> str:
    """A lock's sha256 (None: no file) as a step's."""
    return ABSENT if sha is None else sha


@dataclass(frozen=True)
class Step:
    path: str
    before_sha256: str  # ABSENT: no file before (the overlay adds it)
    after_sha256: str  # ABSENT: no file after (the overlay deletes it)


@dataclass(frozen=True, kw_only=True)
class Journal:
    """The journal's first line: the intent. The lines after it (files done) are for people."""

    op: str  # "apply" or "revert"
    id: str
    version: str = ""  # the installed version it was written for
    steps: tuple[Step, ...] = field(metadata={"json": "files"})

    def line(self) -> bytes:
        return (json.dumps(codec.to_doc(self)) + "\n").encode()

    @staticmethod
    def done_line(path: str) -> bytes:
        """A line after the intent: `path` is done."""
        return (json.dumps({"done": path}) + "\n").encode("utf-8")


def read_record(target: Target) -> Record | None:
    path = target.state_path(RECORD)
    text = fsio.read_regular(path)
    if text is None:
        return None
    try:
        return Record.from_doc(jsonfile.parse(text), str(path))
    except jsonfile.BadJson as exc:
        raise BadInput(f"{path}: not a valid record ({exc}); move it away to continue") from None


def write_record(
    target: Target, lock: Lock, originals: dict[str, str], txid: str, sizes: dict[str, int]
) -> None:
    record = Record(lock, dict(sorted(originals.items())), txid, dict(sorted(sizes.items())))
    text = json.dumps(record.to_doc(), indent=2) + "\n"
    fsio.atomic_write(target.state_path(RECORD), text.encode())


def read_journal(target: Target) -> Journal | None:
    path = target.state_path(JOURNAL)
    text = fsio.read_regular(path)
    if text is None:
        return None
    try:
        return codec.from_doc(Journal, jsonfile.parse(text.split(b"\n", 1)[0]))
    except ValueError as exc:
        raise BadInput(
            f"{path}: unreadable journal ({exc}): check the files, then remove it"
        ) from None
