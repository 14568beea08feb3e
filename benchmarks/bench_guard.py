"""Time the runtime guard (`vllm_patchset.deploy.guard.register`) the way a vLLM process
pays for it.

    python benchmarks/bench_guard.py --target DIR [--runs N] [--out FILE]

DIR holds an installed vllm (a pip --target dir, or site-packages), overlay applied or not; the
guard's outcome there is printed with the figures:
- check: `guard.check()` alone, warm, in this process;
- start: a fresh interpreter that has already imported what vLLM has loaded by the time it loads
  its plugins (logging, json, hashlib, pathlib, typing, importlib.util), then imports the guard
  and calls `register()`: what each vLLM process pays;
- cold: the same in a bare interpreter, nothing preloaded: an upper bound.
Median and max of --runs each, in milliseconds, printed and saved as JSON to --out. The
children import the tool from its bytecode, as an installed wheel does (pip compiles it):
written once into a scratch `PYTHONPYCACHEPREFIX` by a first, unmeasured run, also where
PYTHONDONTWRITEBYTECODE is set (without it every start would compile the tool's sources).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import stops
from vllm_patchset.deploy import guard

PRELOADED = "import logging, json, hashlib, pathlib, typing, importlib.util\n"
CHILD = """\
import time
t = time.perf_counter()
import vllm_patchset.deploy.guard
vllm_patchset.deploy.guard.register()
print((time.perf_counter() - t) * 1e3)
"""


def child_ms(target: Path, preload: str, pycache: Path) -> float:
    path = os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONPYCACHEPREFIX": str(pycache)}
    for name in (guard.STRICT_ENV, guard.PLUGINS_ENV, "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", preload + CHILD], env=env, capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip().splitlines()[-1])


def summary(samples: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(samples), 3), "max_ms": round(max(samples), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True, help="dir holding the vllm package")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path(".cache/bench/guard.json"))
    args = parser.parse_args()
    target = args.target.resolve()

    outcome = guard.check(target)
    warm = []
    for _ in range(args.runs):
        started = time.perf_counter()
        guard.check(target)
        warm.append((time.perf_counter() - started) * 1e3)
    warm_summary = summary(warm)
    with tempfile.TemporaryDirectory(prefix="bench-guard-pyc-") as scratch:
        pycache = Path(scratch)
        child_ms(target, "", pycache)  # writes the bytecode
        start = summary([child_ms(target, PRELOADED, pycache) for _ in range(args.runs)])
        cold = summary([child_ms(target, "", pycache) for _ in range(args.runs)])
    figures = {
        "target": str(target),
        "outcome": outcome.message,
        "runs": args.runs,
        "check": warm_summary,
        "start": start,
        "cold": cold,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(f"guard on {target}: {outcome.message}")
    for key, samples in (("check", warm_summary), ("start", start), ("cold", cold)):
        print(f"  {key:6} median {samples['median_ms']:7.2f} ms   max {samples['max_ms']:7.2f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(stops.main(main, "bench_guard"))
