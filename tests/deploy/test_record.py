"""The deploy record (`applied.json`) and the journal's intent line through infra/codec.py: the
exact bytes written, read back, and each damaged file refused with one line naming the key; the
start-up guard's standard-library reader agrees with `read_record` on a record. A small package
in a temp dir, no git, no vLLM."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from vllm_patchset.deploy import guard
from vllm_patchset.deploy.record import (
    Journal,
    Record,
    Step,
    read_journal,
    read_record,
    write_record,
)
from vllm_patchset.deploy.target import Target
from vllm_patchset.deploy.transaction import Transaction
from vllm_patchset.errors import BadInput
from vllm_patchset.infra import fsio
from vllm_patchset.infra.hashes import sha256_bytes
from vllm_patchset.infra.installed import JOURNAL, RECORD, STATE_DIR
from vllm_patchset.overlay.lock import Lock, LockEntry

A, B = "vllm/a.py", "vllm/b.py"
NEW = {A: b"a = 1\n", B: b"b = 22\n"}
ENTRIES = tuple(LockEntry(p, "0" * 4, sha256_bytes(NEW[p]), ("0001-x.patch",)) for p in (B, A))
LOCK = Lock("vllm", "0.24.0", "pypi:src", "c0", ("0001-x.patch",), ENTRIES)
SIZES = {B: 7, A: 6}
RECORD_DOC = {
    "schema": 1,
    "transaction": "t1",
    "lock": LOCK.to_doc(),
    "originals": {A: "a0", B: "b0"},
    "patched_sizes": {A: 6, B: 7},
}
# What the hand-written writer of before the codec wrote (the same bytes now).
RECORD_JSON = json.dumps(RECORD_DOC, indent=2) + "\n"
STEPS = (Step(A, "a0", "a1"), Step(B, "b0", "b1"))
INTENT = (
    '{"op": "apply", "id": "t1", "version": "0.24.0", "files": [{"path": "vllm/a.py",'
    ' "before_sha256": "a0", "after_sha256": "a1"}, {"path": "vllm/b.py", "before_sha256":'
    ' "b0", "after_sha256": "b1"}]}\n'
)


def _target(root: Path) -> Target:
    for rel, data in {"vllm/__init__.py": b"", **NEW}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    dist = root / "vllm-0.24.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.24.0\n\n")
    return Target(root, "vllm", "0.24.0")


def _without(doc: dict[str, object], key: str) -> dict[str, object]:
    return {k: v for k, v in doc.items() if k != key}


def test_a_record_as_json_and_back(tmp_path: Path) -> None:
    target = _target(tmp_path)
    write_record(target, LOCK, {B: "b0", A: "a0"}, "t1", SIZES)
    assert (tmp_path / STATE_DIR / RECORD).read_text() == RECORD_JSON
    in_order = dataclasses.replace(LOCK, entries=ENTRIES[::-1])  # the file's: sorted by path
    assert read_record(target) == Record(in_order, {A: "a0", B: "b0"}, "t1", {A: 6, B: 7})
    # A record of before the sizes were kept reads, with none.
    old = json.dumps(_without(RECORD_DOC, "patched_sizes"))
    fsio.atomic_write(target.state_path(RECORD), old.encode())
    assert read_record(target) == Record(in_order, {A: "a0", B: "b0"}, "t1")


LOCK_DOC = LOCK.to_doc()
# (the record's JSON values, what is wrong: after "<path>: not a valid record (")
BAD_RECORDS = [
    ([], "a JSON array, not a JSON object"),
    (_without(RECORD_DOC, "schema"), "no 'schema'"),
    (_without(RECORD_DOC, "transaction"), "no 'transaction'"),
    (_without(RECORD_DOC, "originals"), "no 'originals'"),
    (_without(RECORD_DOC, "lock"), "no 'lock'"),
    (RECORD_DOC | {"transaction": 7}, "'transaction' is a JSON number, not a JSON string"),
    (RECORD_DOC | {"originals": [A]}, "'originals' is a JSON array, not a JSON object"),
    (
        RECORD_DOC | {"originals": {A: None}},
        "\"originals['vllm/a.py']\" is a JSON null, not a JSON string",
    ),
    (
        RECORD_DOC | {"patched_sizes": {A: "6"}},
        "\"patched_sizes['vllm/a.py']\" is a JSON string, not a JSON number",
    ),
]


@pytest.mark.parametrize(("doc", "why"), BAD_RECORDS)
def test_a_damaged_record_says_what_is_wrong(tmp_path: Path, doc: object, why: str) -> None:
    target = _target(tmp_path)
    path = target.state_path(RECORD)
    fsio.atomic_write(path, json.dumps(doc).encode())
    with pytest.raises(BadInput) as error:
        read_record(target)
    assert str(error.value) == f"{path}: not a valid record ({why}); move it away to continue"


# (the record's JSON values, the whole message after "<path>: ")
BAD_LOCKS_IN_RECORDS = [
    (RECORD_DOC | {"schema": 2}, "record schema 2 is not 1"),
    (RECORD_DOC | {"lock": LOCK_DOC | {"schema": 3}}, "lock schema 3 is not one of 1, 2"),
    (RECORD_DOC | {"lock": _without(LOCK_DOC, "files")}, "not a valid overlay lock (no 'files')"),
    (
        RECORD_DOC | {"lock": LOCK_DOC | {"version": 24}},
        "not a valid overlay lock ('version' is a JSON number, not a JSON string)",
    ),
]


@pytest.mark.parametrize(("doc", "why"), BAD_LOCKS_IN_RECORDS)
def test_a_record_of_another_schema_or_a_damaged_lock(
    tmp_path: Path, doc: object, why: str
) -> None:
    target = _target(tmp_path)
    path = target.state_path(RECORD)
    fsio.atomic_write(path, json.dumps(doc).encode())
    with pytest.raises(BadInput) as error:
        read_record(target)
    assert str(error.value) == f"{path}: {why}"


def test_the_journal_intent_as_json_and_back(tmp_path: Path) -> None:
    target = _target(tmp_path)
    transaction = Transaction(target, "apply", STEPS)
    transaction.id = "t1"
    transaction.begin()
    transaction.mark_done(A)
    journal = tmp_path / STATE_DIR / JOURNAL
    assert journal.read_text() == INTENT + '{"done": "vllm/a.py"}\n'
    assert read_journal(target) == Journal(op="apply", id="t1", version="0.24.0", steps=STEPS)


INTENT_DOC = json.loads(INTENT)
# (the intent line's JSON values, what is wrong: after "<path>: unreadable journal (")
BAD_JOURNALS = [
    (_without(INTENT_DOC, "op"), "no 'op'"),
    (_without(INTENT_DOC, "files"), "no 'files'"),
    (INTENT_DOC | {"id": None}, "'id' is a JSON null, not a JSON string"),
    (INTENT_DOC | {"files": {}}, "'files' is a JSON object, not a JSON array"),
    (INTENT_DOC | {"files": [A]}, "'files[0]' is a JSON string, not a JSON object"),
    (INTENT_DOC | {"files": [{"path": A}]}, "no files[0]: 'before_sha256'"),
]


@pytest.mark.parametrize(("doc", "why"), BAD_JOURNALS)
def test_a_damaged_journal_says_what_is_wrong(tmp_path: Path, doc: object, why: str) -> None:
    target = _target(tmp_path)
    path = target.state_path(JOURNAL)
    fsio.atomic_write(path, (json.dumps(doc) + "\n").encode())
    with pytest.raises(BadInput) as error:
        read_journal(target)
    message = f"{path}: unreadable journal ({why}): check the files, then remove it"
    assert str(error.value) == message


# (the sizes written, the files changed after: what the guard and read_record both see)
GUARD_CASES = [
    (SIZES, {}),
    ({}, {}),  # a record of before the sizes were kept
    (SIZES, {B: b"b = 33\n"}),  # the same size, other bytes
    (SIZES, {B: b"b = 3\n"}),  # another size
    (SIZES, {A: b"a = 0\n", B: b"b = 33\n"}),
]


@pytest.mark.parametrize(("sizes", "changed"), GUARD_CASES)
def test_the_guard_reads_the_record_as_read_record_does(
    tmp_path: Path, sizes: dict[str, int], changed: dict[str, bytes]
) -> None:
    """guard.py reads the record with the standard library alone (it is imported at every
    vLLM start); its verdict is the one the codec's Record gives."""
    target = _target(tmp_path)
    write_record(target, LOCK, {A: "a0", B: "b0"}, "t1", sizes)
    for rel, data in changed.items():
        (tmp_path / rel).write_bytes(data)
    record = read_record(target)
    assert record is not None
    where = tmp_path / "vllm"
    unpatched = [
        e.path.rsplit("/", 1)[-1]
        for e in record.lock.entries
        if sha256_bytes((tmp_path / e.path).read_bytes()) != e.patched_sha256
    ]
    files, patches = len(record.lock.entries), ", ".join(record.lock.patches)
    if not unpatched:
        expected = guard.Outcome(
            True,
            f"vllm-patchset: overlay active on vllm {record.lock.version}: {patches}"
            f" ({files} files)",
        )
    elif len(unpatched) == files:
        expected = guard.Outcome(
            False,
            f"vllm-patchset: the overlay applied to vllm 0.24.0 at {where} is GONE (vllm"
            " reinstalled?): its fixes are NOT active (run `vllm-patchset overlay apply`)",
        )
    else:
        expected = guard.Outcome(
            False,
            f"vllm-patchset: the overlay on vllm 0.24.0 at {where} is PARTIAL:"
            f" {len(unpatched)} of {files} files are not patched ({', '.join(unpatched)}): its"
            " fixes are NOT active (run `vllm-patchset overlay status`, then apply)",
        )
    assert guard.check(tmp_path) == expected
