"""infra/fsio/__init__.py names its API three times (the imports mypy reads, the lazy table
`_HOMES` that imports each name's module on first use, `__all__`): the three must agree."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from vllm_patchset.infra import fsio
from vllm_patchset.infra.fsio import _HOMES


def _checked_imports() -> dict[str, str]:
    """Name -> module of the `if TYPE_CHECKING:` imports."""
    tree = ast.parse(Path(fsio.__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If))
    return {
        alias.name: node.module.rsplit(".", 1)[-1]
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


def test_the_lazy_table_the_checked_imports_and_all_name_the_same_api() -> None:
    homes = {name: module for module, names in _HOMES.items() for name in names}
    assert homes == _checked_imports()
    assert sorted(fsio.__all__) == sorted(homes)


def test_every_name_resolves_to_its_modules_object() -> None:
    for module, names in _HOMES.items():
        home = importlib.import_module(f"vllm_patchset.infra.fsio.{module}")
        for name in names:
            assert getattr(fsio, name) is getattr(home, name), name
