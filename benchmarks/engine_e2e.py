"""The engine end-to-end check's command line: `python benchmarks/engine_e2e.py --help`.

The check itself is the package benchmarks/engine_check/ (its cli.py says what it measures);
this script runs it, and the parent runs it again as each engine's worker process."""

from __future__ import annotations

import sys

import stops
from engine_check.cli import main

if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:  # an engine's own process: its signals as vLLM sets them
        raise SystemExit(main())
    raise SystemExit(stops.main(main, "engine_e2e"))
