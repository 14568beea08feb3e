"""How a benchmark script stops early: Ctrl-C (SIGINT), kill (SIGTERM), or the reader of its
output gone (``| head``). Each is one line on stderr and an exit status (130, 143, 141), not a
traceback. Standard library only: upstream_graft.py's ``tree`` runs on a bare GPU host.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

STOPS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A stop signal, raised where the run is (so that what it began is cleaned up there)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextmanager
def raised() -> Iterator[None]:
    """Ctrl-C and kill raise ``Interrupted`` inside the block; the handlers restored after."""
    kept = {signum: signal.signal(signum, _interrupt) for signum in STOPS}
    try:
        yield
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)


def status(exc: KeyboardInterrupt) -> int:
    """The exit status of a run stopped by ``exc``: 128 and the signal's number."""
    return 128 + getattr(exc, "signum", signal.SIGINT)


def reader_gone() -> int:
    """The output's reader went away: later lines go nowhere (no second error at exit); 141."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE
