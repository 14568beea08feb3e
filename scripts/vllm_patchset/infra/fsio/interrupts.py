"""SIGINT and SIGTERM: they raise `Interrupted` while a command runs (`signals_raise`), so that
cleanups and rollbacks run; swaps and rollbacks hold them until done (`deferred_signals`). What
an interrupt at this point leaves behind is noted on the `Interrupts` of the running block
(`interrupt_leaves`), for the one line `cli.main` prints. A script run alone (a GPU host's
`gpurun.py` and `kitparts.py`, the benchmarks) ends the same way through `command`. Standard
library only: the GPU bundle carries this file beside those scripts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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


def command(run: Callable[[], int | None], name: str) -> int:
    """A script's ``main`` run as a command-line tool (the scripts that travel alone to GPU
    hosts, the benchmarks): Ctrl-C or kill raise `Interrupted` while it runs, so that its
    cleanups run, and end it with one line on stderr, "NAME: interrupted" and what
    `interrupt_leaves` noted, exit 130 or 143; its reader gone (``| head``), quietly with 141,
    argparse's --help and usage errors included. Otherwise its main's exit status (None: 0)."""
    import sys

    interrupts = Interrupts()
    try:
        with signals_raise() as interrupts:
            try:
                return run() or 0
            finally:  # a pipe buffers: its error here, not at exit
                sys.stdout.flush()
    except BrokenPipeError:
        return reader_gone()
    except KeyboardInterrupt as exc:
        note = f": {interrupts.note}" if interrupts.note else ""
        print(f"{name}: interrupted{note}", file=sys.stderr)
        return exit_status(exc)


def exit_status(exc: KeyboardInterrupt) -> int:
    """The exit status of a run stopped by ``exc``: 128 and the signal's number."""
    import signal

    return 128 + (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)


def reader_gone() -> int:
    """The output's reader went away (``| head``): later writes go nowhere (no second error at
    exit); the exit status, 141, as other command-line tools give."""
    import os
    import signal
    import sys

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE
