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
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent / "scripts"))
from vllm_patchset.infra.fsio.interrupts import Interrupted
from vllm_patchset.infra.fsio.interrupts import signals_raise as raised

__all__ = ["Interrupted", "raised", "reader_gone", "status"]


def status(exc: KeyboardInterrupt) -> int:
    """The exit status of a run stopped by ``exc``: 128 and the signal's number."""
    return 128 + (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)


def reader_gone() -> int:
    """The output's reader went away: later lines go nowhere (no second error at exit); 141."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE
