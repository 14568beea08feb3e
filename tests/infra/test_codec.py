"""infra/codec.py as a unit: a dataclass to JSON values and back, every kind of annotation it
reads (enums, optionals, tuples of any or fixed length, dicts, nested and keyed dataclasses),
and each value it refuses, named by its key."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import pytest
from vllm_patchset.infra.codec import from_doc, to_doc
from vllm_patchset.infra.jsonfile import BadJson


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass(frozen=True)
class Item:
    path: str
    size: int


@dataclasses.dataclass(frozen=True)
class Doc:
    name: str
    color: Color
    pair: tuple[str, int]
    tags: tuple[str, ...]
    counts: dict[str, int]
    item: Item
    items: tuple[Item, ...] = dataclasses.field(default=(), metadata={"keyed": "path"})
    note: str | None = None
    flag: bool = dataclasses.field(default=False, metadata={"json": "is-flag"})


DOC = Doc(
    "d", Color.BLUE, ("a", 1), ("x", "y"), {"k": 2}, Item("p", 3), (Item("q", 4),), None, True
)
DOC_JSON = {
    "name": "d",
    "color": "blue",
    "pair": ["a", 1],
    "tags": ["x", "y"],
    "counts": {"k": 2},
    "item": {"path": "p", "size": 3},
    "items": {"q": {"size": 4}},
    "note": None,
    "is-flag": True,
}


def test_a_dataclass_to_json_values_and_back() -> None:
    assert to_doc(DOC) == DOC_JSON
    assert list(to_doc(DOC)) == list(DOC_JSON)  # the fields in their order
    assert from_doc(Doc, DOC_JSON) == DOC


def test_defaults_fill_what_is_missing_and_unknown_keys_are_left() -> None:
    doc = {k: v for k, v in DOC_JSON.items() if k not in ("items", "note", "is-flag")}
    assert from_doc(Doc, {**doc, "later": 1}) == dataclasses.replace(DOC, items=(), flag=False)


REFUSED: list[tuple[dict[str, Any], str]] = [
    # (what replaces DOC_JSON's keys, the words)
    ({"name": 1}, "'name' is a JSON number, not a JSON string"),
    ({"color": "green"}, "'color' is 'green', not one of 'red', 'blue'"),
    ({"pair": ["a"]}, "'pair' has 1 items, not 2"),
    ({"pair": ["a", "b"]}, "'pair[1]' is a JSON string, not a JSON number"),
    ({"tags": "x"}, "'tags' is a JSON string, not a JSON array"),
    ({"counts": {"k": True}}, "\"counts['k']\" is a JSON boolean, not a JSON number"),
    ({"item": {"path": "p"}}, "no item: 'size'"),
    ({"item": []}, "'item' is a JSON array, not a JSON object"),
    ({"items": {"q": {"size": "4"}}}, "items['q']: 'size' is a JSON string, not a JSON number"),
    ({"items": {"q": 4}}, "items['q'] is a JSON number, not a JSON object"),
    ({"note": 5}, "'note' is a JSON number, not a JSON string"),
]


@pytest.mark.parametrize(("change", "words"), REFUSED)
def test_a_value_against_its_annotation(change: dict[str, Any], words: str) -> None:
    with pytest.raises(BadJson) as error:
        from_doc(Doc, {**DOC_JSON, **change})
    assert str(error.value) == words


def test_a_missing_field_and_the_whole_document() -> None:
    with pytest.raises(BadJson, match=r"^no 'name'$"):
        from_doc(Doc, {k: v for k, v in DOC_JSON.items() if k != "name"})
    with pytest.raises(BadJson, match=r"^a JSON array, not a JSON object$"):
        from_doc(Doc, [])
    with pytest.raises(BadJson, match=r"^steps\[2\]: 'name' is a JSON null, not a JSON string$"):
        from_doc(Doc, {**DOC_JSON, "name": None}, "steps[2]: ")
