"""`deploy/source.py`: which overlay a deploy command takes: none packed into a tool run from a
checkout, a checkout's when one is found, and the lock of no overlay."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_patchset.deploy.source import no_overlay, overlay_source, packaged_overlay
from vllm_patchset.overlay.lock import Lock


def test_a_tool_installed_from_its_checkout_carries_no_overlay() -> None:
    assert packaged_overlay() is None


def test_no_checkout_and_none_packed_is_no_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert overlay_source(None, None) is None


def test_the_lock_of_no_overlay() -> None:
    assert no_overlay("vllm", "0.24.0") == Lock("vllm", "0.24.0", "", "", (), ())
