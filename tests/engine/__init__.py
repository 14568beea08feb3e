"""The tests of the engine check's package, benchmarks/engine_check/ (importable from here)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
