"""`deploy/bytecode.py`: the pycs beside an overlaid module removed (an unchecked-hash pyc runs
without looking at its source), and nothing said of a module that has none."""

from __future__ import annotations

import sys
from pathlib import Path

from vllm_patchset.deploy.bytecode import left_bytecode, remove_bytecode, stale_notes

TAG = sys.implementation.cache_tag


def test_the_pycs_of_a_module_are_removed(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text("X = 1\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    for name in (f"x.{TAG}.pyc", f"x.{TAG}.opt-1.pyc", f"y.{TAG}.pyc"):
        (cache / name).write_bytes(b"pyc")
    pycs = [cache / f"x.{TAG}.opt-1.pyc", cache / f"x.{TAG}.pyc"]
    assert sorted(left_bytecode([source])) == [
        f"could not remove {p}: remove it by hand" for p in pycs
    ]
    remove_bytecode(source)
    assert sorted(p.name for p in cache.iterdir()) == [f"y.{TAG}.pyc"]
    assert left_bytecode([source]) == []
    assert stale_notes(source) == []
