"""The deploy record (`applied.json`: the commit point of an apply) and the journal
(`journal.jsonl`: one intent line, then one line per file done), and their JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_patchset.errors import BadInput
from vllm_patchset.infra import fsio, jsonfile
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


@dataclass(frozen=True)
class Step:
    path: str
    before_sha256: str
    after_sha256: str


@dataclass(frozen=True)
class Journal:
    op: str  # "apply" or "revert"
    id: str
    steps: tuple[Step, ...]  # the intent; the lines after it (files done) are for people


def read_record(target: Target) -> Record | None:
    path = target.state_path(RECORD)
    text = fsio.read_regular(path)
    if text is None:
        return None
    try:
        doc = jsonfile.parse(text)
        if doc["schema"] != RECORD_SCHEMA:
            raise BadInput(f"{path}: record schema {doc['schema']} is not {RECORD_SCHEMA}")
        return Record(
            lock=Lock.from_doc(doc["lock"], str(path)),
            originals={str(k): str(v) for k, v in doc["originals"].items()},
            transaction=str(doc["transaction"]),
        )
    except KeyError as exc:
        raise BadInput(
            f"{path}: not a valid record (no {exc.args[0]!r}); move it away to continue"
        ) from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise BadInput(f"{path}: not a valid record ({exc}); move it away to continue") from None


def write_record(
    target: Target, lock: Lock, originals: dict[str, str], txid: str, sizes: dict[str, int]
) -> None:
    """`sizes`: each patched file's size, so that the start-up guard refuses a file of another
    size before it reads a byte of it (the lock has only sha256s)."""
    doc = {
        "schema": RECORD_SCHEMA,
        "transaction": txid,
        "lock": lock.to_doc(),
        "originals": dict(sorted(originals.items())),
        "patched_sizes": dict(sorted(sizes.items())),
    }
    fsio.atomic_write(target.state_path(RECORD), (json.dumps(doc, indent=2) + "\n").encode())


def read_journal(target: Target) -> Journal | None:
    path = target.state_path(JOURNAL)
    text = fsio.read_regular(path)
    if text is None:
        return None
    try:
        intent = jsonfile.parse(text.split(b"\n", 1)[0])
        steps = tuple(_step(s) for s in jsonfile.field(intent, "files", list))
        op = jsonfile.field(intent, "op", str)
        return Journal(op, jsonfile.field(intent, "id", str), steps)
    except ValueError as exc:
        raise BadInput(
            f"{path}: unreadable journal ({exc}): check the files, then remove it"
        ) from None


def _step(doc: object) -> Step:
    if not isinstance(doc, dict):
        raise jsonfile.BadJson("a file step is not a JSON object")
    fields = [jsonfile.field(doc, key, str) for key in ("path", "before_sha256", "after_sha256")]
    return Step(*fields)
