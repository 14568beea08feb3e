"""How a benchmark script stops early: Ctrl-C (SIGINT), kill (SIGTERM), or the reader of its
output gone (``| head``). Each is one line on stderr and an exit status (130, 143, 141), not a
traceback. The signals raise the tool's own ``Interrupted`` (its ``signals_raise``, standard
library only), read from the repository's source where the tool is not installed: a bare GPU
host runs upstream_graft.py's ``tree`` and bench_nvfp4_moe.py from a checkout.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent / "scripts"))
from vllm_patchset.infra.fsio.interrupts import Interrupted
from vllm_patchset.infra.fsio.interrupts import signals_raise as raised

__all__ = ["Interrupted", "main", "raised", "reader_gone", "status"]


def status(exc: KeyboardInterrupt) -> int:
    """The exit status of a run stopped by ``exc``: 128 and the signal's number."""
    return 128 + (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)


def reader_gone() -> int:
    """The output's reader went away: later lines go nowhere (no second error at exit); 141."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def main(run: Callable[[], int | None], name: str) -> int:
    """A benchmark script's ``main`` run as the command: Ctrl-C or kill end it with one line on
    stderr, "NAME: interrupted" (what it writes at its end is not written), exit 130 or 143; its
    reader gone (``| head``), quietly with 141, argparse's --help and usage errors included."""
    try:
        with raised():
            try:
                return run() or 0
            finally:  # a pipe buffers: its error here, not at exit
                sys.stdout.flush()
    except BrokenPipeError:
        return reader_gone()
    except KeyboardInterrupt as exc:
        print(f"{name}: interrupted", file=sys.stderr)
        return status(exc)
