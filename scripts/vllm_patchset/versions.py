"""The one PEP 440 helper: every version the tool reads (trailers, `--onto`, `--release`, the
pin, tags, the package index) or prints goes through it. `nightly` (a bug that lived on
vLLM's main only) is the one word allowed beside versions, and only where a trailer says
when a bug came in."""

from __future__ import annotations

from collections.abc import Iterable

from packaging.version import InvalidVersion, Version

NIGHTLY = "nightly"


def parse(text: str) -> Version | None:
    """The PEP 440 version, or None when `text` is not one (e.g. "git:nightly")."""
    try:
        return Version(text)
    except InvalidVersion:
        return None


def is_version(text: str) -> bool:
    return parse(text) is not None


def normal(text: str) -> str | None:
    """PEP 440's normal form of `text` (`V0.25.0RC1` is 0.25.0rc1), or None: not a version."""
    version = parse(text)
    return None if version is None else str(version)


def spelt_as(version: str, spellings: Iterable[str]) -> str | None:
    """The one of `spellings` that PEP 440 holds equal to `version` (0.24 is 0.24.0, and
    0.24.0.0), or None."""
    wanted = parse(version)
    return next((s for s in spellings if wanted is not None and parse(s) == wanted), None)


def ordered(versions: Iterable[str]) -> list[str]:
    """PEP 440 order (0.22.0 < 0.22.1 < 0.25.0rc1 < 0.25.0 < 0.25.0.post1)."""
    return sorted(versions, key=Version)


def older(a: str, b: str) -> bool:
    """Whether release `a` comes before release `b` (False when either is not a version)."""
    pa, pb = parse(a), parse(b)
    return pa is not None and pb is not None and pa < pb


def trailer_problem(name: str, value: str, *, nightly: bool) -> str | None:
    """What is wrong with a version trailer's value (None: nothing; an empty value is the
    caller's to judge)."""
    if not value or (nightly and value == NIGHTLY) or is_version(value):
        return None
    allowed = f"a PEP 440 version{' or `nightly`' if nightly else ''}"
    return f"{name}: {value!r} is not {allowed}"
