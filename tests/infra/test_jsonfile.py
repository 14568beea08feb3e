"""infra/jsonfile.py as a unit: every way a document is refused, in the words the callers
show, and a file read as a regular file only, within its bound."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from vllm_patchset.infra.jsonfile import MAX_DEPTH, BadJson, field, load, parse

PARSES: list[tuple[bytes, type, Any]] = [
    # (the bytes, the type expected at the top, the value or the refusal's words)
    (b'{"a": [1, 2.5, true, null]}', dict, {"a": [1, 2.5, True, None]}),
    (b"[]", list, []),
    (
        b"[" * MAX_DEPTH + b"]" * MAX_DEPTH,
        list,
        json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH),  # the deepest kept
    ),
    (
        b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1),
        list,
        f"nested deeper than {MAX_DEPTH} levels",
    ),
    (b"{", dict, "not JSON (Expecting property name enclosed in double quotes at line 1 column 2)"),
    (b"", dict, "not JSON (Expecting value at line 1 column 1)"),
    (b'{"a": "\xff"}', dict, "not UTF-8 (byte 0xff at offset 7)"),
    (b"[]", dict, "a JSON array, not a JSON object"),
    (b'"text"', dict, "a JSON string, not a JSON object"),
    (b"true", list, "a JSON boolean, not a JSON array"),
    (b"null", dict, "a JSON null, not a JSON object"),
    (b"3", dict, "a JSON number, not a JSON object"),
]


@pytest.mark.parametrize(("data", "expect", "expected"), PARSES)
def test_parse(data: bytes, expect: type, expected: Any) -> None:
    if isinstance(expected, str):
        with pytest.raises(BadJson) as error:
            parse(data, expect=expect)
        assert str(error.value) == expected
    else:
        assert parse(data, expect=expect) == expected


def test_the_size_bound() -> None:
    assert parse(b"[1]", expect=list, limit=3) == [1]
    with pytest.raises(BadJson, match=r"^larger than 2 bytes$"):
        parse(b"[1]", expect=list, limit=2)


FIELDS: list[tuple[dict[str, Any], type | tuple[type, ...], Any]] = [
    # (the document, the kind of its key "k", the value or the refusal's words)
    ({"k": "v"}, str, "v"),
    ({"k": 3}, int, 3),
    ({"k": True}, int, "'k' is a JSON boolean, not a JSON number"),
    ({"k": True}, bool, True),
    ({"k": None}, (str, type(None)), None),
    ({"k": 3}, (str, list), "'k' is a JSON number, not a JSON string or array"),
    ({}, str, "no 'k'"),
]


@pytest.mark.parametrize(("doc", "kind", "expected"), FIELDS)
def test_field(doc: dict[str, Any], kind: type | tuple[type, ...], expected: Any) -> None:
    if isinstance(expected, str) and expected.startswith(("'k'", "no ")):
        with pytest.raises(BadJson) as error:
            field(doc, "k", kind)
        assert str(error.value) == expected
    else:
        assert field(doc, "k", kind) == expected


def test_a_file_is_read_only_when_regular_and_small(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_bytes(b'{"a": 1}')
    assert load(good) == {"a": 1}
    (tmp_path / "link.json").symlink_to("good.json")
    os.mkfifo(tmp_path / "fifo.json")
    for name in ("link.json", "fifo.json"):
        with pytest.raises(
            BadJson, match=r"^not a regular file \(a link, FIFO, device or folder\)$"
        ):
            load(tmp_path / name)
    with pytest.raises(BadJson, match=r"^larger than 4 bytes$"):
        load(good, limit=4)
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "none.json")
