"""SIGINT and SIGTERM: they raise `Interrupted` while a command runs (`signals_raise`), so that
cleanups and rollbacks run; swaps and rollbacks hold them until done (`deferred_signals`). What
an interrupt at this point leaves behind is noted on the `Interrupts` of the running block
(`interrupt_leaves`), for the one line `cli.main` prints. Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM: raised in the main thread, so that `finally` and rollbacks run."""

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class Interrupts:
    """What an interrupt from now on would leave behind (None: nothing worth a word)."""

    note: str | None = None


_current: ContextVar[Interrupts | None] = ContextVar("vllm_patchset_interrupts", default=None)


def interrupt_leaves(note: str | None) -> None:
    """Say what an interrupt from now on leaves behind (printed by cli.main), or None. Outside
    a `signals_raise` block nothing is noted (no one would print it)."""
    interrupts = _current.get()
    if interrupts is not None:
        interrupts.note = note


def interrupted_note() -> str | None:
    """The note of the running `signals_raise` block."""
    interrupts = _current.get()
    return None if interrupts is None else interrupts.note


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


@contextmanager
def signals_raise() -> Iterator[Interrupts]:
    """SIGINT and SIGTERM raise `Interrupted` in the main thread while the block runs; the
    block's notes start empty and end with it."""
    import signal

    interrupts = Interrupts()
    token = _current.set(interrupts)
    try:
        if not _main_thread():
            yield interrupts
            return
        old = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield interrupts
        finally:
            for signum, handler in old.items():
                signal.signal(signum, handler)
    finally:
        _current.reset(token)


@contextmanager
def deferred_signals() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done (a rollback or a swap must not be cut
    short): they are noted, and raised again once the block is over. Not a signal mask: with
    other threads in the process (torch starts some) the kernel hands the signal to one of
    them, and Python would still run its handler in the main thread, inside the block."""
    import signal

    if not _main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, _frame: object) -> None:
        pending.append(signum)

    old = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
        if pending:
            signal.raise_signal(pending[0])  # the handler that was there runs now


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
