"""The trees and the fix of tests/tiny_series.py, made once a session."""

from __future__ import annotations

import pytest
from tiny_series import Trees
from vllm_patchset.series.patches import Patch


@pytest.fixture(scope="session")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Trees:
    return Trees(tmp_path_factory.mktemp("series-trees"))


@pytest.fixture(scope="session")
def fix(trees: Trees) -> Patch:
    return trees.fix()
