"""`versions.py`, the one PEP 440 helper: text in, a version (or None, or a problem) out."""

from __future__ import annotations

import pytest
from packaging.version import Version
from vllm_patchset import versions
from vllm_patchset.versions import parse as parse_version


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("0.24.0", Version("0.24.0")),
        ("0.25.0rc1", Version("0.25.0rc1")),
        ("1!2.0", Version("1!2.0")),
        ("0.24.0+cu130", Version("0.24.0+cu130")),
        ("latest", None),
        ("", None),
        ("git:nightly", None),
        ("0.24.0-nightly", None),
    ],
)
def test_parse_version(text: str, version: Version | None) -> None:
    assert parse_version(text) == version


NORMAL = [("V0.25.0RC1", "0.25.0rc1"), ("0.24", "0.24"), ("git:nightly", None), ("", None)]


@pytest.mark.parametrize(("text", "normal"), NORMAL)
def test_normal(text: str, normal: str | None) -> None:
    assert versions.normal(text) == normal
    assert versions.is_version(text) == (normal is not None)


SPELT_AS = [
    ("0.24", ["0.23.0", "0.24.0"], "0.24.0"),
    ("0.24.0.0", ["0.24.0"], "0.24.0"),
    ("0.24.1", ["0.24.0"], None),
    ("nightly", ["nightly"], None),
]


@pytest.mark.parametrize(("version", "spellings", "found"), SPELT_AS)
def test_spelt_as(version: str, spellings: list[str], found: str | None) -> None:
    assert versions.spelt_as(version, spellings) == found


def test_ordered_is_pep_440_order() -> None:
    given = ["0.25.0.post1", "0.25.0", "0.22.1", "0.25.0rc1", "0.22.0"]
    assert versions.ordered(given) == ["0.22.0", "0.22.1", "0.25.0rc1", "0.25.0", "0.25.0.post1"]


OLDER = [("0.9", "0.10", True), ("0.10", "0.9", False), ("0.24.0", "0.24", False)]
OLDER += [("nightly", "0.24.0", False), ("0.24.0", "git:main", False)]


@pytest.mark.parametrize(("a", "b", "older"), OLDER)
def test_older(a: str, b: str, older: bool) -> None:
    assert versions.older(a, b) is older


TRAILER_PROBLEMS = [
    ("Introduced-in", "0.21.0", True, None),
    ("Introduced-in", "nightly", True, None),
    ("Introduced-in", "", True, None),
    ("Applied-upstream", "nightly", False, "Applied-upstream: 'nightly' is not a PEP 440 version"),
    ("Introduced-in", "soon", True, "Introduced-in: 'soon' is not a PEP 440 version or `nightly`"),
]


@pytest.mark.parametrize(("name", "value", "nightly", "problem"), TRAILER_PROBLEMS)
def test_trailer_problem(name: str, value: str, nightly: bool, problem: str | None) -> None:
    assert versions.trailer_problem(name, value, nightly=nightly) == problem
