"""Results shaped like the engine check's runs (benchmarks/engine_check/), for the tests of
its report, numerics and command line (tests/engine/)."""

from __future__ import annotations

from typing import Any

from engine_check.runs import CAPTURE_SIZES

# The engine arguments' compilation config of every run.
CAPTURE = {"cudagraph_capture_sizes": CAPTURE_SIZES}
FRAME = "vllm/model_executor/layers/fused_moe/experts/triton_moe.py:248 (apply): self.a1_scale or self.a1_gscale,"


def run_result(name: str, **extra: object) -> dict[str, Any]:
    return {"name": name, "finished": True, "startup_s": 40.0, "gpus": [0], "guard": ["g"], **extra}


EMULATION = "Nvfp4QuantizationEmulationTritonExperts"


def moe_record(*records: tuple[bool | None, bool | None]) -> list[dict[str, Any]]:
    """moe_layers' answer from one worker: a layer per (tiled, fast_scales)."""
    return [
        {
            f"layers.{n}.mlp.experts": {"experts": EMULATION, "tiled": t, "fast_scales": f}
            for n, (t, f) in enumerate(records)
        }
    ]


RESULTS = {
    "pristine-emulation-L2": run_result(
        "pristine-emulation-L2",
        logprobs_batch=[[-1.0, -2.0]],
        logprobs_single=[[-1.0, -2.0]],
        greedy=[[5, 6, 7]],
        moe_layers=moe_record((None, None), (None, None)),
    ),
    "overlay-emulation-L2": run_result(
        "overlay-emulation-L2",
        logprobs_batch=[[-1.0, -2.5]],
        logprobs_single=[[-1.0, -2.0]],
        greedy=[[5, 6, 8]],
        moe_layers=moe_record((True, True), (True, False)),
    ),
    "pristine-emulation-L12": run_result(
        "pristine-emulation-L12",
        throughput={"1": {"median": 100.0, "repeats": [99.0, 100.0, 101.0]}},
        moe_layers_error="RuntimeError: no pickling",
    ),
    "pristine-fix2-fp8-lora-dp2-ep": {
        "name": "pristine-fix2-fp8-lora-dp2-ep",
        "startup_error": "RuntimeError: Engine core initialization failed.",
        "gpus": [0, 1],
        "guard": [],
        "capture_errors": ["operation not permitted when stream is capturing"],
        "failing_frame": FRAME,
        "ranks": [{"startup_error": "RuntimeError: Engine core initialization failed."}],
    },
}


def speed_result(name: str, medians: dict[str, float], busy: dict[str, float]) -> dict[str, Any]:
    return run_result(
        name,
        throughput={b: {"median": m, "repeats": [m]} for b, m in medians.items()},
        gpu_profile={
            b: {"busy_us_per_step": u, "kernels_per_step": 100.0} for b, u in busy.items()
        },
    )


ROUND_RESULTS = {
    "overlay-emulation-L12-r1": speed_result(
        "overlay-emulation-L12-r1", {"1": 500.0}, {"1": 800.0}
    ),
    "pristine-marlin-L12-r1": speed_result("pristine-marlin-L12-r1", {"1": 400.0}, {"1": 1000.0}),
    "overlay-emulation-L12-r2": speed_result(
        "overlay-emulation-L12-r2", {"1": 450.0}, {"1": 790.0}
    ),
}


# -- the float64 reference -----------------------------------------------------------------------
REFERENCE = {"w4a4": [[-1.0, -2.0], [-3.0, -0.5]], "w4a16": [[-1.25, -2.0], [-3.0, -0.5]]}


def logprob_runs() -> dict[str, dict[str, Any]]:
    """Two runs of the pristine emulation (the phase's and numerics' first), one of the overlay
    and of Marlin, a failed one (left out), and one of another check (not an engine judged)."""
    series = {
        "pristine-emulation-L2": [[-1.5, -2.0], [-3.0, -0.5]],  # |Δ| 0.5, 0, 0, 0
        "pristine-emulation-L2-n1": [[-1.0, -2.0], [-3.0, -0.1]],  # 0, 0, 0, 0.4
        "overlay-emulation-L2-n1": [[-1.0, -2.25], [-3.0, -0.5]],  # 0, 0.25, 0, 0
        "pristine-marlin-L2-n1": [[-1.25, -2.0], [-3.0, -0.5]],  # 0.25, 0, 0, 0
        "overlay-emulation-L2-ep2": [[-9.0, -9.0], [-9.0, -9.0]],
    }
    runs = {name: run_result(name, logprobs_batch=s) for name, s in series.items()}
    runs["overlay-emulation-L2-n2"] = {"name": "overlay-emulation-L2-n2", "startup_error": "x"}
    return runs


# A second model with its own reference: the 12-layer model's numerics runs (two of the
# overlay, one of the pristine emulation and of Marlin), its throughput run (no logprobs),
# and the 2-layer model's `layers` runs (batch logprobs far off: no engine's numerics runs).
REFERENCE_L12 = {"w4a4": [[-1.0, -1.0], [-1.0, -1.0]], "w4a16": [[-1.5, -1.0], [-1.0, -1.0]]}


def two_model_runs() -> dict[str, dict[str, Any]]:
    series = {
        "overlay-emulation-L12-n1": [[-1.5, -1.0], [-1.0, -1.0]],  # W4A4 |Δ| 0.5, 0, 0, 0
        "overlay-emulation-L12-n2": [[-1.0, -1.0], [-1.25, -1.0]],  # 0, 0, 0.25, 0
        "pristine-emulation-L12-n1": [[-1.0, -0.5], [-1.0, -1.0]],  # 0, 0.5, 0, 0
        "pristine-marlin-L12-n1": [[-1.5, -1.0], [-1.0, -1.0]],  # W4A16 |Δ| 0
        "pristine-emulation-L2-layers": [[-9.0, -9.0], [-9.0, -9.0]],
        "overlay-emulation-L2-layers": [[-9.0, -9.0], [-9.0, -9.0]],
        "pristine-marlin-L2-layers": [[-9.0, -9.0], [-9.0, -9.0]],
    }
    runs = {name: run_result(name, logprobs_batch=s) for name, s in series.items()}
    runs["pristine-emulation-L12"] = run_result("pristine-emulation-L12")
    return {**logprob_runs(), **runs}
