"""The one checked reader of the tool's JSON files: the lock, the deploy record and journal,
the rebase journal, a kit's kit.json, and the package index's answers.

Before a value is used, the file is a regular file (lstat first: a FIFO is never opened),
within a size bound, UTF-8, JSON nested at most `MAX_DEPTH` deep (a document nested 200,000
deep would end in a RecursionError inside json), and of the expected type at the top. Every
failure is `BadJson`, whose message says what is wrong in words; the caller adds which file
and what to do.

Standard library only: `kitparts.py` uses it on GPU hosts without vllm-patchset (the bundle
carries this file beside it), and the start-up guard reads the deploy record through it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_BYTES = 64 << 20
MAX_DEPTH = 32


class BadJson(ValueError):
    """A JSON file or document that cannot be used: the message is what is wrong, in words."""


def parse(data: bytes, *, expect: type = dict, limit: int = MAX_BYTES) -> Any:
    """The JSON value of `data`, checked (size, UTF-8, syntax, depth, type at the top)."""
    if len(data) > limit:
        raise BadJson(f"larger than {limit} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadJson(f"not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise BadJson(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        where = getattr(exc, "lineno", None)
        at = f" at line {where} column {getattr(exc, 'colno', 0)}" if where else ""
        why = getattr(exc, "msg", str(exc))
        raise BadJson(f"not JSON ({why}{at})") from None
    _check_depth(value)
    if not isinstance(value, expect):
        raise BadJson(f"a JSON {_kind(value)}, not a JSON {_kind(expect())}")
    return value


def load(path: Path, *, expect: type = dict, limit: int = MAX_BYTES) -> Any:
    """The checked JSON value of the file `path`; FileNotFoundError when it is missing."""
    return parse(read(path, limit=limit), expect=expect, limit=limit)


def read(path: Path, *, limit: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file `path` (lstat-checked, opened without following a link
    or blocking), at most `limit` of them; FileNotFoundError when it is missing."""
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        raise BadJson("not a regular file (a link, FIFO, device or folder)")
    if info.st_size > limit:
        raise BadJson(f"larger than {limit} bytes")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadJson("not a regular file")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > limit:
                raise BadJson(f"larger than {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _check_depth(value: Any) -> None:
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise BadJson(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            todo.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            todo.extend((v, depth + 1) for v in item)


def _kind(value: Any) -> str:
    for kind, name in (
        (bool, "boolean"),
        (dict, "object"),
        (list, "array"),
        (str, "string"),
        (int, "number"),
        (float, "number"),
    ):
        if isinstance(value, kind):
            return name
    return "null"


def field(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    """`doc[key]` when it is there and of `kind`; BadJson naming the key otherwise."""
    if key not in doc:
        raise BadJson(f"no {where}{key!r}")
    value = doc[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, (int,))):
        want = kind if isinstance(kind, tuple) else (kind,)
        names = " or ".join(_kind(k()) for k in want)
        raise BadJson(f"{where}{key!r} is a JSON {_kind(value)}, not a JSON {names}")
    return value
