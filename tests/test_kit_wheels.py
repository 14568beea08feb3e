"""The kit's wheels for vllm-patchset itself are pyproject.toml's [project].dependencies,
resolved for the GPU host (CPython 3.12 on Linux, no extras): every dependency and every
dependency of theirs is pinned there, at a version its specifier allows. The host of issue 19
had none of tomlkit (and rich only by chance), so every command died on import."""

from __future__ import annotations

import importlib.metadata
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from support import REPO
from vllm_patchset.gpu.kitbuild import ENGINE_WHEELS, TOOL_WHEELS, VLLM_WHEELS

HOST = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
        "platform_system": "Linux", "implementation_name": "cpython", "extra": ""}  # fmt: skip


def pins(wheels: tuple[str, ...]) -> dict[str, Version]:
    pairs = (w.split("==") for w in wheels)
    return {canonicalize_name(name): Version(version) for name, version in pairs}


def needed(requirements: list[str]) -> list[Requirement]:
    reqs = [Requirement(r) for r in requirements]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(HOST)]


def test_tool_wheels_are_the_project_dependencies_resolved() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pinned = pins(TOOL_WHEELS)
    todo = needed(project["dependencies"])
    seen = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req}: not among the kit's wheels for vllm-patchset"
        assert req.specifier.contains(pinned[name], prereleases=True), (req, pinned[name])
        if name not in seen:
            seen.add(name)
            todo += needed(importlib.metadata.requires(req.name) or [])
    assert seen == set(pinned), f"pinned but needed by nothing: {set(pinned) - seen}"


def test_engine_wheels_hold_both_lists_once() -> None:
    assert ENGINE_WHEELS == VLLM_WHEELS + TOOL_WHEELS
    assert len(pins(ENGINE_WHEELS)) == len(ENGINE_WHEELS)
