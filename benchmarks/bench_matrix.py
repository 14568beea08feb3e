"""How long `vllm-patchset matrix` takes over many releases with a warm cache.

    python benchmarks/bench_matrix.py [--versions 0.20.0 0.21.0 ...] [--repeat 3]

Default: every release on the package index from 0.20.0 on, in PEP 440 order (patch releases
such as 0.22.1, 0.25.1, 0.27.1 included; pre-releases aside). The goal: under 60 s on a 2-core
machine.
Releases missing from the mirror are fetched first (timed apart, as `fetch_s`); then the
whole command is run `--repeat` times as a user runs it (`vllm-patchset matrix V...`, a new
interpreter each time) and, in this process, the walk of every patch over every release.
Prints the figures and writes them to benchmarks/results/matrix.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import stops
from packaging.version import Version
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.build import patches_for, walk
from vllm_patchset.overlay.upstream import mirror_for

REPO = Path(__file__).resolve().parent.parent
FIRST = Version("0.20.0")
LIMIT_S = 60.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", nargs="+", help="default: the index's releases >= 0.20.0")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "matrix.json")
    args = parser.parse_args()

    project = Project.load(REPO)
    mirror = mirror_for(project)
    if not args.versions:
        args.versions = [v for v in mirror.available_versions() if Version(v) >= FIRST]
    started = time.perf_counter()
    missing = [v for v in args.versions if mirror.get(f"v{v}") is None]
    for version in missing:
        mirror.release(version)
    fetch_s = time.perf_counter() - started

    command = [sys.executable, "-m", "vllm_patchset", "--project", str(REPO), "matrix"]
    env = {**os.environ, "VLLM_PATCHSET_CACHE": str(project.cache_dir)}
    cli_s = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        subprocess.run([*command, *args.versions], env=env, check=True, capture_output=True)
        cli_s.append(time.perf_counter() - started)

    patches = patches_for(project)
    walk_s = []
    states: dict[str, dict[str, str]] = {}
    for _ in range(args.repeat):
        started = time.perf_counter()
        for version in args.versions:
            result = walk(mirror, mirror.release(version), patches)
            states[version] = {v.patch: v.state.value for v in result.verdicts}
        walk_s.append(time.perf_counter() - started)

    figures = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "releases": args.versions,
        "patches": [p.key for p in patches],
        "fetched_first": missing,
        "fetch_s": round(fetch_s, 2),
        "cli_s": {"min": round(min(cli_s), 2), "median": round(statistics.median(cli_s), 2)},
        "walk_s": {"min": round(min(walk_s), 2), "median": round(statistics.median(walk_s), 2)},
        "limit_s": LIMIT_S,
        "within_limit": max(cli_s) < LIMIT_S,
        "states": states,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(
        f"matrix: {len(args.versions)} releases x {len(patches)} patches, warm cache:"
        f" `vllm-patchset matrix` {figures['cli_s']['median']} s (median of {args.repeat},"
        f" min {figures['cli_s']['min']} s), walk alone {figures['walk_s']['median']} s;"
        f" limit {LIMIT_S:.0f} s on {os.cpu_count()} CPUs"
        + (f"; fetched first: {', '.join(missing)} in {fetch_s:.1f} s" if missing else "")
    )
    print(f"wrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}")
    return 0 if figures["within_limit"] else 1


if __name__ == "__main__":
    raise SystemExit(stops.main(main, "bench_matrix"))
