"""The engine end-to-end check: the overlay inside vLLM's `LLM` engine, on a GPU host.

vLLM 0.24.0's engine (CUDA graphs on: piecewise and full decode graphs) serves generated
Qwen3-MoE checkpoints (checkpoint.py: ModelOpt NVFP4 at Qwen3-30B-A3B's MoE sizes, the
same weights in BF16, and an FP8 variant), prompts given as token ids (no tokenizer):

- teacher-forced logprobs (`prompt_logprobs=0`) of 32 prompts of 96 tokens on a 2-layer model,
  compared pristine vs overlay, with the scale to judge them by: the pristine batch of 32 vs
  the same prompts one by one, and the pristine emulation vs Marlin (0.24.0's default NVFP4
  MoE backend on Hopper); greedy tokens where the model is shallow enough for them to agree;
- the same logprobs against the model's exact forward: `reference` computes the 2-layer
  checkpoint's teacher-forced logprobs in float64 (reference.py: W4A4 as vLLM's
  reference quantization defines it, and W4A16), `numerics --runs N` repeats the overlay's,
  the pristine emulation's and Marlin's logprob runs (interleaved, as `rounds` does), and the
  report gives each engine's mean |Δ| in nats against the reference, with the spread over its
  runs (the `emulation`/`baselines` phases' runs count as one each), and the overlay paired
  with the pristine emulation prompt by prompt (paired.py: a bootstrap interval over prompts)
  beside the two emulations' |Δ| from each other; `--model nvfp4-L12` (both commands) does the
  same on the 12-layer model, the report giving each model a section against its own reference;
  `layers` runs the three engines once more, each MoE layer call of the batch compared in the
  worker with the float64 experts on exactly that call's inputs (layers.py);
- generation throughput (tokens/s at batch 1, 8 and 32, 128 greedy tokens, median of
  repeats) on a 12-layer model, where the MoE dominates the step: pristine emulation, the
  overlay's emulation, Marlin and the BF16 model; then one more generation per batch under
  torch's profiler, for the GPU's busy time per step (kernels, copies and memsets, their
  union): what the step costs the GPU, apart from the host's share, which drifts between
  runs on a shared host; `rounds` interleaves overlay and Marlin runs, so that the drift
  falls on both alike (`--model nvfp4-L48`: Qwen3-30B-A3B's 48 layers, where the GPU's share
  of a step is four times the 12-layer model's, the host's about the same), and the `nopdl`
  phase runs the overlay without programmatic dependent launch (VLLM_PATCHSET_NVFP4_NO_PDL=1);
- fix 2 at engine level: an FP8 (static per-tensor scales) model with LoRA enabled, data
  parallel 2 and expert parallel: the configuration in which TritonExperts defers the input
  quantization to apply() with a tensor a1_scale; CUDA graph capture fails at start-up on the
  pristine pin and passes with the overlay;
- with two GPUs: expert parallel 2 and tensor parallel 2, so that the fused kernel's expert
  map runs inside the engine.

The overlay is applied with `vllm-patchset overlay apply` to the very vLLM install the
pristine runs used (and reverted at the end); each engine's output shows the guard plugin's
start-up line. One command on a host with vLLM installed:

    python benchmarks/engine_e2e.py all --work /tmp/engine-e2e

and on a host with torch but no vLLM, with a native-ops kit (`vllm-patchset kit build`):

    python benchmarks/engine_e2e.py all --work /tmp/engine-e2e --kit KIT

Results (JSON per run, logs) go to WORK/results; `report` writes
benchmarks/results/engine_e2e_<GPU>.{json,md,png}, the GPU the runs recorded (engine_e2e_h200 on
an H200). Every engine runs in a process of its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from results_names import by_gpu

from .figure import plot, plot_rows
from .host import gpu_count, host_of, run_engine
from .numerics import reference_logprobs
from .report import markdown, summarize
from .results import (
    REFERENCE_MODEL,
    REFERENCE_PREFIX,
    load_references,
    load_results,
    measured,
    recorded_gpus,
    summary_line,
)
from .runs import (
    DEFAULT_MODELS,
    LAYER_ENGINES,
    LOGPROB_LEN,
    LOGPROB_PROMPTS,
    MODELS,
    PHASES,
    REPO,
    RESULTS,
    VARIANCE_RUNS,
    Run,
    layer_runs,
    numerics_runs,
    prompts,
    round_runs,
    run_from_json,
)
from .schedule import run_phases
from .variance import variance_markdown, variance_summary
from .worker import worker


def cmd_variance(args: argparse.Namespace) -> int:
    """The logprob check with each control, on the install as it is; the variance report of
    every variance run in WORK/results (both installs, where both ran)."""
    host = host_of(args.work)
    state = host.state()
    cmd_checkpoints(argparse.Namespace(work=args.work, models=["nvfp4-L2"], device="cuda"))
    host.results.mkdir(parents=True, exist_ok=True)
    for run in VARIANCE_RUNS:
        if args.runs and run.name not in args.runs:
            continue
        print(summary_line(run_engine(host, run, state, [0])), flush=True)
    results = load_results(host.results)
    rows = variance_summary(results)
    out = args.out or RESULTS / by_gpu("engine_variance", the_gpu(results))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    text = variance_markdown(rows)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0 if all(r["ok"] for r in rows) else 1


def cmd_worker(args: argparse.Namespace) -> int:
    worker(run_from_json(args.spec), args.model, args.out)
    return 0


def cmd_setup(args: argparse.Namespace) -> int:
    """Assemble a native-ops kit into WORK/native and install vllm-patchset into its site/."""
    sys.path.insert(0, str(REPO / "scripts"))  # stdlib-only modules: no install needed
    from vllm_patchset.gpu import kitparts

    dest = kitparts.assemble(args.kit, args.work / "native")
    site = dest / "site"
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    command += [
        "--no-build-isolation",
        "--upgrade",
        "--target",
        str(site),
        str(args.project or REPO),
    ]
    subprocess.run(command, check=True)
    print(f"vLLM with its compiled ops and vllm-patchset in {site}")
    return 0


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from .checkpoint import MoeModel, write_model

    models = args.work / "models"
    # Deepest first: a shallower model of the same format links the deeper one's files.
    for name in sorted(args.models or DEFAULT_MODELS, key=lambda n: -MODELS[n][1]):
        fmt, layers = MODELS[name]
        dest = models / name
        if dest.is_dir():
            continue
        deeper = [
            n for n, (f, d) in MODELS.items() if f == fmt and d > layers and (models / n).is_dir()
        ]
        begin = time.monotonic()
        write_model(
            MoeModel(layers=layers),
            fmt,
            dest,
            device=args.device,
            reuse=models / deeper[0] if deeper else None,
        )
        print(f"{dest}: {time.monotonic() - begin:.0f} s", flush=True)
    return 0


def cmd_phases(args: argparse.Namespace) -> int:
    results = run_phases(host_of(args.work), args.names, args.gpus or gpu_count())
    return 0 if results else 1


def cmd_overlay(args: argparse.Namespace) -> int:
    host = host_of(args.work)
    host.results.mkdir(parents=True, exist_ok=True)
    result = host.patchset("overlay", args.action, "--json")
    (host.results / f"deploy-{args.action}.json").write_text(result.stdout)
    print(result.stdout.strip(), result.stderr.strip(), sep="\n")
    return result.returncode


def cmd_rounds(args: argparse.Namespace) -> int:
    """The overlay's and Marlin's speed runs on ``args.model``, interleaved ``args.rounds``
    times: the overlay applied and its run, then reverted and Marlin's, so that a host whose
    speed drifts between runs minutes apart slows both alike. Results named ``...-rN`` from
    N = ``args.first`` (a later call adds rounds); the install is left pristine."""

    def runs(i: int) -> tuple[tuple[str, Run], ...]:
        return tuple(
            (state, dataclasses.replace(run, name=f"{run.name}-r{i}"))
            for state, run in round_runs(args.model)
        )

    return _interleaved(args, runs, args.rounds)


def _interleaved(args: argparse.Namespace, runs_of: Any, count: int) -> int:
    """``count`` rounds from ``args.first`` of ``runs_of(i)``'s (state, run) pairs: the
    overlay applied for each overlay run and reverted after it."""
    host = host_of(args.work)
    if not (host.models / args.model).is_dir():
        raise SystemExit(
            f"no checkpoint {host.models / args.model}: run `checkpoints {args.model}`"
        )
    if host.state() != "pristine":
        raise SystemExit("the vLLM install holds the overlay: revert it first (overlay revert)")
    host.results.mkdir(parents=True, exist_ok=True)
    for i in range(args.first, args.first + count):
        for state, run in runs_of(i):
            if state == "overlay" and cmd_overlay(
                argparse.Namespace(work=args.work, action="apply")
            ):
                raise SystemExit("overlay apply failed (above): no more rounds")
            try:
                result = run_engine(host, run, state, [0])
            finally:
                if state == "overlay":
                    cmd_overlay(argparse.Namespace(work=args.work, action="revert"))
            print(summary_line(result), flush=True)
            if not measured(result):
                return 1
    return 0


def cmd_reference(args: argparse.Namespace) -> int:
    """The float64 reference's logprobs of the logprob check's prompts, into WORK/results."""
    host = host_of(args.work)
    model = host.models / args.model
    if not model.is_dir():
        raise SystemExit(f"no checkpoint {model}: run `checkpoints {args.model}`")
    begin = time.monotonic()
    texts = prompts(LOGPROB_PROMPTS, LOGPROB_LEN, seed=1)
    result = reference_logprobs(model, texts, args.device)
    result["seconds"] = round(time.monotonic() - begin, 1)
    host.results.mkdir(parents=True, exist_ok=True)
    out = host.results / f"{REFERENCE_PREFIX}{args.model}.json"
    out.write_text(json.dumps(result) + "\n")
    print(f"{out}: W4A4 and W4A16 in {result['seconds']} s")
    return 0


def cmd_numerics(args: argparse.Namespace) -> int:
    """The logprob check's engines (overlay, pristine emulation, Marlin) on ``args.model``,
    ``args.runs`` times, interleaved as `rounds` interleaves its runs; named ``...-nI`` from I =
    ``args.first``; the install is left pristine. `report` compares each run with the float64
    reference (`reference`)."""
    return _interleaved(args, lambda i: numerics_runs(args.model, i), args.runs)


def cmd_layers(args: argparse.Namespace) -> int:
    """The logprob check's engines (overlay, pristine emulation, Marlin) on the 2-layer model,
    once each, every MoE layer call compared in the worker with the float64 experts on its
    inputs (layers.py); the install is left pristine. `report` shows the figures."""
    once = argparse.Namespace(work=args.work, model=REFERENCE_MODEL, first=1)
    engines = tuple(args.engines)
    return _interleaved(once, lambda i: layer_runs(REFERENCE_MODEL, engines), 1)


def cmd_report(args: argparse.Namespace) -> int:
    results = load_results(args.work / "results")
    if not results:  # a mistyped --work must not overwrite a report with an empty one
        raise SystemExit(f"no run results in {args.work / 'results'}: nothing to report")
    summary = summarize(results, load_references(args.work / "results"))
    summary["notes"] = list(args.note)
    gpu = None if args.out and args.title else the_gpu(results)
    title = args.title or f"{DEFAULT_TITLE}, {gpu or 'GPU'}"
    prefix = args.out or RESULTS / by_gpu("engine_e2e", gpu)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    text = markdown(summary, title, args.note)
    prefix.with_suffix(".md").write_text(text)
    if rows := plot_rows(summary):
        plot(rows, prefix.with_suffix(".png"), title)
    print(text)
    return 0


def cmd_all(args: argparse.Namespace) -> int:
    """Everything, in order, on this host (kit or installed vLLM), the overlay reverted last."""
    work = args.work
    if args.kit is not None:
        cmd_setup(args)
    cmd_checkpoints(argparse.Namespace(work=work, models=None, device="cuda"))
    host, gpus = host_of(work), args.gpus or gpu_count()
    if host.state() != "pristine":
        raise SystemExit("the vLLM install holds the overlay: revert it first (overlay revert)")
    run_phases(host, ["emulation", "baselines"], gpus)
    if gpus >= 2:
        run_phases(host, ["fix2"], gpus)
        run_phases(host, ["parallel"], gpus)
    try:
        if cmd_overlay(argparse.Namespace(work=work, action="apply")) != 0:
            raise SystemExit("overlay apply failed (above): no overlay runs")
        run_phases(host, ["emulation"], gpus)
        if gpus >= 2:
            run_phases(host, ["fix2"], gpus)
            run_phases(host, ["parallel"], gpus)
    finally:
        cmd_overlay(argparse.Namespace(work=work, action="revert"))
    return cmd_report(argparse.Namespace(work=work, out=args.out, title=args.title, note=[]))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))


# A report's title, the GPU after it; its default name is engine_e2e_<GPU> (the_gpu).
DEFAULT_TITLE = "vLLM 0.24.0 engine, NVFP4 Qwen3-MoE (E=128, H=2048, I=768, top-8)"


def the_gpu(results: dict[str, dict[str, Any]]) -> str | None:
    """The GPU the runs recorded, for a report's default name and title (None where no run
    recorded one: results from before runs did); runs of several GPUs stop here, in one line."""
    gpus = recorded_gpus(results)
    if len(gpus) > 1:
        raise SystemExit(
            f"runs of several GPUs in the results ({', '.join(gpus)}):"
            " name the report (--out and --title)"
        )
    return gpus[0] if gpus else None


NVFP4_MODELS = [name for name, (fmt, _) in MODELS.items() if fmt == "nvfp4"]


def parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per step of the check (`all` runs them in order)."""
    top = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = top.add_subparsers(dest="command", required=True)
    _setup_commands(sub)
    _measure_commands(sub)
    _install_report_commands(sub)
    return top


def _with_work(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--work", type=Path, default=Path("/tmp/engine-e2e"), help="models, results")
    return p


def _setup_commands(sub: Any) -> None:
    """all, setup, checkpoints: the whole check, and the host's set-up."""
    p = _with_work(
        sub.add_parser("all", help="setup (with --kit), checkpoints, every phase, report")
    )
    p.add_argument("--kit", type=Path, help="a native-ops kit, for a host without vLLM")
    p.add_argument("--project", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--gpus", type=int)
    p.add_argument("--out", type=Path, help="default: benchmarks/results/engine_e2e_<GPU>")
    p.add_argument("--title", help="default: the check's model and the GPU")
    p.set_defaults(func=cmd_all)
    p = _with_work(
        sub.add_parser("setup", help="assemble a kit into WORK/native, vllm-patchset into it")
    )
    p.add_argument("--kit", type=Path, required=True)
    p.add_argument("--project", type=Path, help="vllm-patchset to install (a wheel or a folder)")
    p.set_defaults(func=cmd_setup)
    p = _with_work(sub.add_parser("checkpoints", help="write the checkpoints into WORK/models"))
    p.add_argument("models", nargs="*", metavar="MODEL", help=", ".join(MODELS))
    p.add_argument("--device", default="cuda")
    p.set_defaults(func=cmd_checkpoints)


def _measure_commands(sub: Any) -> None:
    """phases, rounds, reference, numerics, layers: the engines' runs and the float64
    reference."""
    p = _with_work(sub.add_parser("phases", help="run phases side by side: " + ", ".join(PHASES)))
    p.add_argument("names", nargs="+", choices=list(PHASES))
    p.add_argument("--gpus", type=int)
    p.set_defaults(func=cmd_phases)
    p = _with_work(sub.add_parser("rounds", help="overlay and Marlin speed runs, interleaved"))
    p.add_argument("--rounds", type=_count, default=2)
    p.add_argument("--first", type=_count, default=1, help="the first round's number")
    p.add_argument("--model", choices=NVFP4_MODELS, default="nvfp4-L12")
    p.set_defaults(func=cmd_rounds)
    p = _with_work(
        sub.add_parser("reference", help="the float64 reference's logprobs into WORK/results")
    )
    p.add_argument("--model", choices=NVFP4_MODELS, default=REFERENCE_MODEL)
    p.add_argument("--device", default="cuda")
    p.set_defaults(func=cmd_reference)
    p = _with_work(
        sub.add_parser(
            "numerics", help="the logprob check's engines, repeated, for the float64 comparison"
        )
    )
    p.add_argument(
        "--runs",
        type=_count,
        default=2,
        help="runs of each engine (the emulation and baselines phases' count as one more)",
    )
    p.add_argument("--first", type=_count, default=1, help="the first run's number")
    p.add_argument("--model", choices=NVFP4_MODELS, default=REFERENCE_MODEL)
    p.set_defaults(func=cmd_numerics)
    p = _with_work(
        sub.add_parser(
            "layers",
            help="the logprob check's engines once, each MoE layer call against float64",
        )
    )
    p.add_argument(
        "--engines",
        nargs="+",
        choices=LAYER_ENGINES,
        default=list(LAYER_ENGINES),
        help="these engines only (default: all three)",
    )
    p.set_defaults(func=cmd_layers)


def _install_report_commands(sub: Any) -> None:
    """overlay, report, variance, worker: the install's overlay, the reports, one engine."""
    p = _with_work(
        sub.add_parser(
            "overlay", help="vllm-patchset overlay apply|revert|status on the engine's vLLM"
        )
    )
    p.add_argument("action", choices=["apply", "revert", "status"])
    p.set_defaults(func=cmd_overlay)
    p = _with_work(sub.add_parser("report", help="WORK/results -> JSON, Markdown and PNG"))
    p.add_argument("--note", action="append", default=[], help="a line for the Markdown")
    p.add_argument("--out", type=Path, help="default: benchmarks/results/engine_e2e_<GPU>")
    p.add_argument("--title", help="default: the check's model and the GPU")
    p.set_defaults(func=cmd_report)
    p = _with_work(
        sub.add_parser("variance", help="the logprob check with controls, MoE layer dumps")
    )
    names = [r.name for r in VARIANCE_RUNS]
    p.add_argument("--runs", nargs="+", choices=names, help="these only (default: all)")
    p.add_argument("--out", type=Path, help="default: benchmarks/results/engine_variance_<GPU>")
    p.set_defaults(func=cmd_variance)
    p = sub.add_parser("worker", help=argparse.SUPPRESS)
    p.add_argument("spec")
    p.add_argument("model", type=Path)
    p.add_argument("out", type=Path)
    p.set_defaults(func=cmd_worker)


def _count(text: str) -> int:
    """An argument that counts or numbers rounds: 1 or more."""
    value = int(text) if text.isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of 1 or more: {text!r}")
    return value
