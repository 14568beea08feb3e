"""The host: the vLLM install the engines run on (a kit's site or the installed vLLM), its
overlay state through `vllm-patchset`, and one run's engine in processes of its own (one per
data-parallel rank), read back from its result file and its log."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from .runs import REPO, Run

# The worker's command: the check's entry script, run again in a process of its own.
ENTRY = REPO / "benchmarks" / "engine_e2e.py"
RUN_TIMEOUT = 480  # seconds: a hung engine must not eat a whole GPU visit
RANK_GRACE = 45  # seconds the other data-parallel ranks get once one has ended
# What a failed CUDA graph capture says (CUDA, then HIP).
CAPTURE_ERRORS = re.compile(
    r"operation not permitted when stream is capturing|cudaErrorStreamCaptureInvalidated"
    r"|capture.*(invalidated|unsupported)|hipErrorStreamCaptureUnsupported",
    re.IGNORECASE,
)
TRACEBACK_FRAME = re.compile(r'\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')
# The environment every engine gets: no flashinfer sampler, no DeepGEMM (neither is in the
# kit), nothing from a hub, NVLink multicast off (it can wedge a shared host's GPUs).
ENGINE_ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_USE_DEEP_GEMM": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "GIT_PYTHON_REFRESH": "quiet",
    "PYTHONUNBUFFERED": "1",
}


@dataclasses.dataclass(frozen=True)
class Host:
    site: Path | None  # an assembled kit's site/ (PYTHONPATH), or None for the installed vllm
    models: Path
    results: Path
    python: str = sys.executable

    def env(self, gpus: Sequence[int]) -> dict[str, str]:
        env = {**os.environ, **ENGINE_ENV, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
        env.setdefault("VLLM_CACHE_ROOT", str(self.results.parent / "vllm-cache"))
        if self.site is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, (str(self.site), env.get("PYTHONPATH")))
            )
        return env

    def packed(self) -> bool:
        """The site's vllm-patchset is a wheel `overlay pack` built: it carries its overlay."""
        lock = Path("vllm_patchset", "_overlay", "overlay.lock.json")
        return self.site is not None and (self.site / lock).is_file()

    def patchset(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`vllm-patchset ARGS` on this host's vLLM (the kit's site, or the installed one).

        With the packed wheel in the site (`setup --project WHEEL`), the site's vllm-patchset
        deploys the overlay it carries: run outside the checkout, whose overlay/vllm/** a GPU
        host without network has not built. Otherwise the checkout's overlay."""
        target = ["--target", str(self.site)] if self.site is not None else []
        project = [] if self.packed() else ["--project", str(REPO)]
        command = [self.python, "-m", "vllm_patchset", *project, *args, *target]
        cwd = self.results.parent if self.packed() else None
        if cwd is not None:
            cwd.mkdir(parents=True, exist_ok=True)
        return subprocess.run(command, env=self.env([]), capture_output=True, text=True, cwd=cwd)

    def state(self) -> str:
        result = self.patchset("overlay", "status", "--json")
        if result.returncode != 0:
            raise SystemExit(f"overlay status failed: {result.stderr.strip()}")
        outcome = json.loads(result.stdout)["outcome"]
        states = {"applied": "overlay", "not applied": "pristine"}
        if outcome not in states:
            raise SystemExit(
                f"the vLLM install holds neither the pristine files nor the overlay: {outcome}"
            )
        return states[outcome]


def host_of(work: Path) -> Host:
    """The host of a work area: the kit's site where `setup` assembled one, else the installed
    vLLM."""
    site = work / "native" / "site"
    return Host(site if (site / "vllm").is_dir() else None, work / "models", work / "results")


def run_engine(host: Host, run: Run, state: str, gpus: Sequence[int]) -> dict[str, Any]:
    """One run in processes of its own (one per data-parallel rank); its result, with the
    guard plugin's lines and what a failed capture said."""
    name = f"{state}-{run.name}"
    procs = _start_ranks(host, run, name, gpus)
    begin = time.monotonic()
    try:
        _wait_all([proc for proc, _, _ in procs], begin)
    finally:  # what the engine left running (compile workers, a stuck core; all, if stopped)
        for proc, log, _ in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.close()
    ranks = []
    for proc, log, out in procs:
        ranks.append(rank_report(proc.returncode, Path(log.name).read_text(errors="replace"), out))
    result = {
        **ranks[0],
        "name": name,
        "state": state,
        "gpus": list(gpus),
        "seconds": round(time.monotonic() - begin, 1),
    }
    if run.dp > 1:
        result.update(across_ranks(ranks))
    (host.results / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _start_ranks(
    host: Host, run: Run, name: str, gpus: Sequence[int]
) -> list[tuple[subprocess.Popen[bytes], IO[str], Path]]:
    """Each rank's worker process, its log file and its result file."""
    model = host.models / run.model
    spec = json.dumps(dataclasses.asdict(run))
    port = _free_port()
    procs: list[tuple[subprocess.Popen[bytes], IO[str], Path]] = []
    for rank in range(run.dp):
        out = host.results / f"{name}.rank{rank}.json"
        out.unlink(missing_ok=True)
        log = (host.results / f"{name}.rank{rank}.log").open("w")
        env = {**host.env(gpus), **dict(run.env)}
        if run.dp > 1:  # vLLM's offline data parallel: one engine per rank, told by env
            env.update(
                VLLM_DP_RANK=str(rank),
                VLLM_DP_RANK_LOCAL=str(rank),
                VLLM_DP_SIZE=str(run.dp),
                VLLM_DP_MASTER_IP="127.0.0.1",
                VLLM_DP_MASTER_PORT=str(port),
            )
        command = [host.python, str(ENTRY), "worker", spec, str(model), str(out)]
        # A session of its own: a timeout kills the engine's own processes with it.
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        procs.append((proc, log, out))
    return procs


def rank_report(returncode: int | None, log: str, out: Path) -> dict[str, Any]:
    """One rank's result: what its worker wrote to ``out`` (nothing where it wrote none), its
    exit code, the guard plugin's lines and the capture errors of its ``log``, where a failed
    capture broke, and the log's tail where it failed otherwise."""
    report: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    report["exit_code"] = returncode
    report["guard"] = sorted(
        {
            line.split("vllm-patchset: ", 1)[1]
            for line in log.splitlines()
            if "vllm-patchset: " in line
        }
    )
    report["capture_errors"] = sorted({m.group(0) for m in CAPTURE_ERRORS.finditer(log)})
    if frame := failing_frame(log):
        report["failing_frame"] = frame
    if returncode != 0 and "startup_error" not in report:
        report["error_tail"] = log.splitlines()[-15:]
    return report


def across_ranks(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """A data-parallel run's ranks taken together: each rank's report, the guard lines and
    capture errors of any, and the first failing frame."""
    result: dict[str, Any] = {
        "ranks": ranks,
        "guard": sorted({line for r in ranks for line in r["guard"]}),
        "capture_errors": sorted({e for r in ranks for e in r["capture_errors"]}),
    }
    frames = sorted({r["failing_frame"] for r in ranks if "failing_frame" in r})
    if frames:
        result["failing_frame"] = frames[0]
    return result


def failing_frame(log: str) -> str | None:
    """The innermost traceback frame logged before the first capture error: where it broke."""
    lines = [line.split("] ", 1)[-1] for line in log.splitlines()]
    first = next((i for i, line in enumerate(lines) if CAPTURE_ERRORS.search(line)), None)
    frames = [i for i in range(first or 0) if lines[i].lstrip().startswith('File "')]
    if not frames or frames[-1] + 1 >= len(lines):
        return None
    frame = TRACEBACK_FRAME.match(lines[frames[-1]])
    if frame is None:
        return None
    path = frame["path"][frame["path"].rfind("/vllm/") + 1 :]  # the path inside the package
    return f"{path}:{frame['line']} ({frame['fn']}): {lines[frames[-1] + 1].strip()}"


def _wait_all(procs: list[subprocess.Popen[bytes]], begin: float) -> None:
    """Wait for every rank, at most RUN_TIMEOUT; once one has ended, the others get
    RANK_GRACE seconds (a rank whose engine failed leaves the others waiting in a collective)."""
    first_end: float | None = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if first_end is None and any(p.poll() is not None for p in procs):
            first_end = now
        late = first_end is not None and now - first_end > RANK_GRACE
        if now - begin > RUN_TIMEOUT or late:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            return
        time.sleep(1.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return max(1, sum(line.startswith("GPU ") for line in out.splitlines()))
