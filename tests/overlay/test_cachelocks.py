"""overlay/cachelocks.py as a unit: a process's shared hold on the cache is taken once and
counted, keeps an exclusive lock (a prune) out while held, and is given up by the process's
own prune and taken again after it; imports are one at a time.

A second open file of this process stands for another run (flock is per open file)."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_patchset.errors import Finding
from vllm_patchset.infra import fsio
from vllm_patchset.infra.fsio.locks import LOCK_TIMEOUT_ENV
from vllm_patchset.overlay.cachelocks import (
    CACHE_LOCK,
    IMPORT_LOCK,
    cache_exclusive,
    hold_shared,
    importing,
    reading,
    release_shared,
)


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOCK_TIMEOUT_ENV, "0")


def another_run_may_prune(cache: Path) -> bool:
    try:
        with fsio.locked(cache / CACHE_LOCK):
            return True
    except Finding:
        return False


def another_run_may_import(cache: Path) -> bool:
    try:
        with fsio.locked(cache / IMPORT_LOCK):
            return True
    except Finding:
        return False


def test_the_shared_hold_is_counted(tmp_path: Path) -> None:
    hold_shared(tmp_path)
    hold_shared(tmp_path)
    release_shared(tmp_path)
    assert not another_run_may_prune(tmp_path)
    release_shared(tmp_path)
    assert another_run_may_prune(tmp_path)
    release_shared(tmp_path)  # one more than taken: nothing


def test_reading_holds_the_cache_for_the_block(tmp_path: Path) -> None:
    with reading(tmp_path):
        assert not another_run_may_prune(tmp_path)
        assert another_run_may_import(tmp_path)  # a reader never waits for an import
    assert another_run_may_prune(tmp_path)


def test_one_import_at_a_time(tmp_path: Path) -> None:
    with importing(tmp_path):
        assert not another_run_may_import(tmp_path)
        assert not another_run_may_prune(tmp_path)
    assert another_run_may_import(tmp_path) and another_run_may_prune(tmp_path)


def test_a_prune_gives_up_this_process_s_hold_and_takes_it_again(tmp_path: Path) -> None:
    with reading(tmp_path):
        # another run's reader waits for the prune
        with (
            cache_exclusive(tmp_path),
            pytest.raises(Finding),
            fsio.locked(tmp_path / CACHE_LOCK, shared=True),
        ):
            pass
        assert not another_run_may_prune(tmp_path)  # the hold is back
    assert another_run_may_prune(tmp_path)
