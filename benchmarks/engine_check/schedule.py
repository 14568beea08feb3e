"""In what order and on which GPUs the phases' runs go: one phase's runs one after the
other (a lane), phases given together side by side on GPUs of their own when there are
enough, refused before any engine starts when a checkpoint or the install's state is wrong."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .host import Host, run_engine
from .results import measured, summary_line
from .runs import PHASES


def gpu_blocks(needs: Sequence[int], gpus: int) -> list[list[int]] | None:
    """Consecutive GPUs for phases side by side, or None when there are not enough."""
    if sum(needs) > gpus:
        return None
    starts = [sum(needs[:i]) for i in range(len(needs))]
    return [list(range(start, start + need)) for start, need in zip(starts, needs, strict=True)]


def run_phases(host: Host, names: Sequence[str], gpus: int) -> list[dict[str, Any]]:
    """The phases `names`, side by side when there are GPUs enough, else one after another.
    Refused in one line, before any engine starts, when a checkpoint they read is not
    written (`checkpoints` writes them)."""
    refuse_missing_checkpoints(host.models, names)
    state = host.state()
    for name in names:
        required = PHASES[name][0]
        if required not in ("any", state):
            raise SystemExit(f"phase {name} needs the {required} install; it holds the {state}")
    host.results.mkdir(parents=True, exist_ok=True)
    needs = [max(r.gpus for r in PHASES[name][1]) for name in names]
    # Throughput is measured with no other engine on the host: one starting beside it (its
    # torch.compile workers, its Triton JIT) slowed some repeats by up to 5x on the H200 host.
    timed = any(r.batches for name in names for r in PHASES[name][1])
    blocks = None if timed and len(names) > 1 else gpu_blocks(needs, gpus)
    results: list[dict[str, Any]] = []
    if blocks is None:
        for name, need in zip(names, needs, strict=True):
            results += run_lane(host, name, state, list(range(min(need, gpus))), gpus)
        return results
    threads = [
        threading.Thread(
            target=lambda n, b: results.extend(run_lane(host, n, state, b, gpus)), args=(n, b)
        )
        for n, b in zip(names, blocks, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def refuse_missing_checkpoints(models: Path, names: Sequence[str]) -> None:
    """SystemExit naming the checkpoints the phases ``names`` read that are not written."""
    missing = list(dict.fromkeys(r.model for n in names for r in PHASES[n][1]))
    missing = [m for m in missing if not (models / m).is_dir()]
    if missing:
        raise SystemExit(
            f"no checkpoint {models / missing[0]}"
            + (f" (nor {', '.join(missing[1:])})" if missing[1:] else "")
            + f": run `checkpoints {' '.join(missing)}`"
        )


def run_lane(
    host: Host, name: str, state: str, devices: list[int], gpus: int
) -> list[dict[str, Any]]:
    """The runs of the phase ``name``, one after the other on ``devices``; after a failed one
    the rest are not run (they would fail alike), but for fix 2, whose runs are each a case."""
    results = []
    for run in PHASES[name][1]:
        if run.gpus > gpus:
            print(f"{state}-{run.name}: not run ({run.gpus} GPUs needed, {gpus} here)")
            continue
        result = run_engine(host, run, state, devices[: run.gpus])
        results.append(result)
        print(summary_line(result), flush=True)
        if not measured(result) and name != "fix2":  # the rest would fail alike: save the time
            print(f"phase {name}: stopped after {result['name']} failed", flush=True)
            break
    return results
