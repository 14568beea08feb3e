"""The one codec between the tool's frozen dataclasses and JSON values, with type checks.

`to_doc(value)`: a dataclass as an object of its fields in their order, an enum as its value,
a tuple as an array, everything else as it is. `from_doc(cls, doc)`: the inverse, every value
checked against the field's annotation (str, int, bool, None, enums, `X | None`,
`tuple[X, ...]`, `tuple[X, Y]`, `dict[str, X]`, nested dataclasses); a field missing from the
document takes its default, keys the class does not know are left alone. What is wrong is a
`jsonfile.BadJson` naming the key, in words.

A field's metadata may give its JSON key (`{"json": "files"}`) and, for a tuple of
dataclasses, the field that keys them as an object (`{"keyed": "path"}`: the lock's files).

The standard library only (the deploy path runs in serving images, and the tool's wheel
installs without vLLM, so msgspec may be missing); the documents are read with
`jsonfile`'s checked reader first.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from functools import cache
from typing import Any, TypeVar

from vllm_patchset.infra.jsonfile import BadJson

T = TypeVar("T")


def to_doc(value: Any) -> Any:
    """`value` as JSON values (see the module's docstring)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.metadata.get("json", f.name): _field_doc(f, getattr(value, f.name))
            for f in dataclasses.fields(value)
        }
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [to_doc(v) for v in value]
    if isinstance(value, dict):
        return {k: to_doc(v) for k, v in value.items()}
    return value


def _field_doc(field: dataclasses.Field[Any], value: Any) -> Any:
    key = field.metadata.get("keyed")
    if key is None:
        return to_doc(value)
    docs = {}
    for item in value:
        doc = to_doc(item)
        docs[doc.pop(key)] = doc
    return docs


def from_doc(cls: type[T], doc: Any, where: str = "") -> T:
    """The `cls` of the JSON value `doc`, type-checked; BadJson names what is wrong, after
    `where` (a prefix such as "steps[2]: ")."""
    value: T = _decode(cls, doc, where, "")
    return value


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _kind(value: Any) -> str:
    for kind, name in ((bool, "boolean"), (dict, "object"), (list, "array"), (str, "string")):
        if isinstance(value, kind):
            return name
    return "number" if isinstance(value, (int, float)) else "null"


def _decode(hint: Any, value: Any, where: str, key: str) -> Any:
    name = f"{where}{key!r}" if key else where.removesuffix(": ")
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(inner, value, where, key)
    if dataclasses.is_dataclass(hint):
        inner_where = f"{where}{key}: " if key else where
        return _dataclass(typing.cast("type", hint), _expect(value, dict, name), inner_where)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum(hint, value, name)
    if origin is tuple:
        return _tuple(args, _expect(value, list, name), where, key)
    if origin is dict:
        items = _expect(value, dict, name)
        return {k: _decode(args[1], v, where, f"{key}[{k!r}]") for k, v in items.items()}
    return value if hint is Any else _expect(value, hint, name)


def _enum(kind: type[enum.Enum], value: Any, name: str) -> enum.Enum:
    try:
        return kind(value)
    except ValueError:
        known = ", ".join(repr(m.value) for m in kind)
        raise BadJson(f"{name} is {value!r}, not one of {known}") from None


def _tuple(args: tuple[Any, ...], items: list[Any], where: str, key: str) -> tuple[Any, ...]:
    """`tuple[X, ...]` (any length) or `tuple[X, Y]` (that many)."""
    kinds = [args[0]] * len(items) if len(args) == 2 and args[1] is Ellipsis else list(args)
    if len(items) != len(kinds):
        raise BadJson(f"{where}{key!r} has {len(items)} items, not {len(kinds)}")
    return tuple(
        _decode(k, v, where, f"{key}[{i}]")
        for i, (k, v) in enumerate(zip(kinds, items, strict=True))
    )


def _expect(value: Any, kind: type, name: str) -> Any:
    """`value` when it is a `kind`; else BadJson: "'key' is a JSON string, not a JSON number"
    (without a name, for the whole document, as jsonfile says it)."""
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        named = f"{name} is " if name else ""
        raise BadJson(f"{named}a JSON {_kind(value)}, not a JSON {_kind(kind())}")
    return value


def _dataclass(cls: type, doc: dict[str, Any], where: str) -> Any:
    hints, values = _hints(cls), {}
    for field in dataclasses.fields(cls):
        key = field.metadata.get("json", field.name)
        if key not in doc:
            if (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise BadJson(f"no {where}{key!r}")
            continue
        keyed = field.metadata.get("keyed")
        if keyed is None:
            values[field.name] = _decode(hints[field.name], doc[key], where, key)
            continue
        # A tuple of dataclasses kept as an object by one of their fields (the lock's files).
        item = typing.get_args(hints[field.name])[0]
        items = _expect(doc[key], dict, f"{where}{key!r}")
        values[field.name] = tuple(
            _decode(
                item,
                {keyed: k, **_expect(v, dict, f"{where}{key}[{k!r}]")},
                f"{where}{key}[{k!r}]: ",
                "",
            )
            for k, v in items.items()
        )
    return cls(**values)
