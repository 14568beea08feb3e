"""infra/fsio/locks.py as a unit: the wait read from the environment, a lock file made readable
by all, a shared lock on no file, a lock file that is a link or a FIFO refused, and a lock held
by another open file waited for, then refused in one line."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from vllm_patchset.errors import BadInput, Finding
from vllm_patchset.infra.fsio.locks import LOCK_TIMEOUT_ENV, lock_timeout, locked, locked_dir
from vllm_patchset.infra.fsio.paths import UnsafePath

TIMEOUTS = [
    # (the variable, the wait or the refusal's words)
    (None, 60.0),
    ("", 60.0),
    ("0", 0.0),
    ("2.5", 2.5),
    ("-1", f"{LOCK_TIMEOUT_ENV}='-1': expected a number of seconds, e.g. 60"),
    ("soon", f"{LOCK_TIMEOUT_ENV}='soon': expected a number of seconds, e.g. 60"),
    ("inf", f"{LOCK_TIMEOUT_ENV}='inf': expected a number of seconds, e.g. 60"),
]


@pytest.mark.parametrize(("raw", "expected"), TIMEOUTS)
def test_lock_timeout(monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: object) -> None:
    if raw is None:
        monkeypatch.delenv(LOCK_TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(LOCK_TIMEOUT_ENV, raw)
    if isinstance(expected, str):
        with pytest.raises(BadInput) as error:
            lock_timeout()
        assert str(error.value) == expected
    else:
        assert lock_timeout() == expected


def test_an_exclusive_lock_makes_its_file_readable_by_all(tmp_path: Path) -> None:
    path = tmp_path / "state" / "lock"
    old = os.umask(0o077)
    try:
        with locked(path):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o755


def test_a_shared_lock_on_no_file_holds_nothing(tmp_path: Path) -> None:
    with locked(tmp_path / "none" / "lock", shared=True):
        pass
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize(("shared"), [False, True])
def test_a_lock_file_that_is_no_regular_file_is_refused(tmp_path: Path, shared: bool) -> None:
    (tmp_path / "link").symlink_to("target")
    os.mkfifo(tmp_path / "fifo")
    for name, what in (("link", "a symlink"), ("fifo", "a FIFO")):
        with pytest.raises(UnsafePath) as error, locked(tmp_path / name, shared=shared):
            pass
        assert str(error.value) == f"refusing {tmp_path / name}: it is {what}, not a regular file"


def test_a_held_lock_is_waited_for_then_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOCK_TIMEOUT_ENV, "0")
    path = tmp_path / "lock"
    with locked(path, holder="a test"):
        with pytest.raises(Finding) as error, locked(path, holder="another"):
            pass
        assert str(error.value) == f"another holds {path} (waited 0 s): nothing was changed"
        with pytest.raises(Finding) as error, locked(path, shared=True):
            pass
        assert str(error.value).startswith("another vllm-patchset run holds")
    with locked(path, shared=True), locked(path, shared=True):  # readers share
        pass


def test_locked_dir_makes_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOCK_TIMEOUT_ENV, "0")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    with locked_dir(checkout, holder="a rebase"):
        with pytest.raises(Finding) as error, locked_dir(checkout, holder="a rebase"):
            pass
        assert str(error.value) == (
            f"a rebase is running in {checkout} (waited 0 s): nothing was changed"
        )
    assert list(checkout.iterdir()) == []
