"""How a benchmark script stops early: Ctrl-C (SIGINT), kill (SIGTERM), or the reader of its
output gone (``| head``). Each is one line on stderr and an exit status (130, 143, 141), not a
traceback: each script runs as the tool's own ``command`` (its ``signals_raise`` raising
``Interrupted``; standard library only), read from the repository's source where the tool is not
installed: a bare GPU host runs upstream_graft.py's ``tree`` and bench_nvfp4_moe.py from a
checkout.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent / "scripts"))
from vllm_patchset.infra.fsio.interrupts import Interrupted, reader_gone
from vllm_patchset.infra.fsio.interrupts import command as main
from vllm_patchset.infra.fsio.interrupts import exit_status as status
from vllm_patchset.infra.fsio.interrupts import signals_raise as raised

__all__ = ["Interrupted", "main", "raised", "reader_gone", "status"]
