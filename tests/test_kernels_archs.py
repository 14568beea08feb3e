"""Patch 0002 on the GPUs besides Hopper and MI300 that NVFP4 emulation can meet, without one:
the experts as each runs them (NVIDIA by compute capability, sm_80: A100; sm_86: A10, A40,
RTX 30xx; sm_89: L40S, L4, RTX 40xx; sm_90: H100, H200; sm_100: B200; sm_120: RTX 50xx; and
AMD's MI210/MI250, gfx90a), their launches recorded on CPU tensors and compiled for that target
with triton's own ptxas or ld.lld. From sm_89, and on gfx90a, every launch compiles within the
GPU's shared memory. Before sm_89, Triton refuses the kernels' FP8 E4M3 scale rounding ("type
fp8e4nv not supported in this architecture"); there, the layer keeps vLLM 0.24.0's unfused
path, leaves its weights in the checkpoint's rows, and says why once in the log."""

from __future__ import annotations

import contextlib
import sys
import types
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the launchers run on torch tensors (pip install torch)")
pytest.importorskip("triton", reason="triton compiles the kernels (pip install triton)")
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import overlay_kernels as kernels
from test_nvfp4_tables import Log
from vllm_install import Overlay, Pristine

pytestmark = pytest.mark.usefixtures("triton_cache")

# (experts, hidden, intermediate, top-k): depths not multiples of 128 (the K tails) for the
# fused GEMMs; both multiples of 128 for the predecoded ones, which take no tail.
RAGGED = (32, 2704, 192, 8)
ALIGNED = (32, 512, 256, 8)
TOKENS = (1, 64)  # one block per pair, and blocks of the alignment's
REASON = (
    "an sm_{}{} GPU (the fused kernels round scales through FP8 E4M3, which Triton compiles"
    " from sm_89)"
)


def gpu(capability: int) -> Any:
    """vllm.platforms.current_platform of an NVIDIA GPU of that compute capability."""
    return types.SimpleNamespace(
        is_rocm=lambda: False,
        is_cuda=lambda: True,
        is_cuda_alike=lambda: True,
        has_device_capability=lambda wanted: wanted <= capability,
        get_device_capability=lambda: types.SimpleNamespace(
            major=capability // 10, minor=capability % 10
        ),
        get_device_name=lambda: f"CPU stand-in for an sm_{capability} GPU",
    )


def run(overlay: Overlay, pristine: Pristine, platform: Any) -> dict[str, Any]:
    """The experts on that platform's GPU: the hook on a layer's weights, then apply at TOKENS
    in BF16 and FP16, and with the predecoded GEMMs; what they launched, how many calls took the
    unfused path, what the log said and whether the hook tiled the weights."""
    log = Log()
    fused = kernels.overlay_fused(overlay, pristine, platform=platform, log=log)
    unfused = []
    with kernels.recording_launches() as launches:
        for predecode in (False, True):
            e, h, i, top_k = ALIGNED if predecode else RAGGED
            w13 = torch.randint(0, 256, (e, 2 * i, h // 2), dtype=torch.uint8)
            w2 = torch.randint(0, 256, (e, h, i // 2), dtype=torch.uint8)
            for dtype in (torch.bfloat16, torch.float16):
                for m in TOKENS[-1:] if predecode else TOKENS:
                    with kernels.predecoding(fused) if predecode else contextlib.nullcontext():
                        experts = fused.experts(None, kernels.shaped_quant_config(e, h, i, 1.0))
                        experts._apply_dequantized = lambda *a, m=m, **k: unfused.append(m)
                        w1_laid, w2_laid = kernels.laid_out(experts, w13, w2)
                        tiled = not torch.equal(w1_laid, w13)
                        ids = torch.stack([torch.randperm(e)[:top_k] for _ in range(m)]).int()
                        hidden = torch.zeros(m, h, dtype=dtype)
                        kernels.fused_apply(
                            fused, experts, hidden, w1_laid, w2_laid, torch.rand(m, top_k), ids,
                            nan_filled=False,
                        )  # fmt: skip
    return {"launches": launches, "unfused": len(unfused), "log": log.lines, "tiled": tiled}


# The shared memory one program may take (CUDA's opt-in maximum per block), by capability: a
# kernel that asks for more does not launch (triton's OutOfResources).
SHARED_BYTES = {80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448, 120: 101376}
# AMD Instinct MI210/MI250 (CDNA2): ROCm's path as on MI300 (gfx942 and gfx950 are
# test_kernels_compile's), its LDS 64 KiB a workgroup.
CDNA2, CDNA2_LDS_BYTES = "gfx90a", 64 << 10


@pytest.fixture(scope="module")
def runs(overlay: Overlay, full_pristine: Pristine) -> Any:
    """run() per NVIDIA capability, or "gfx90a" (ROCm), once each for the module."""
    done: dict[int | str, dict[str, Any]] = {}

    def at(gpu_of: int | str) -> dict[str, Any]:
        if gpu_of not in done:
            platform = kernels.platform(rocm=True) if gpu_of == CDNA2 else gpu(int(gpu_of))
            done[gpu_of] = run(overlay, full_pristine, platform)
        return done[gpu_of]

    return at


def target(capability: int) -> str:
    """overlay_kernels' name of the sm_<capability> target."""
    return f"sm{capability}"


def compile_fused(seen: dict[str, Any], name: str, shared_bytes: int) -> None:
    """Both fused GEMMs were launched, and every launch compiles for the target within
    shared_bytes a program (raises where triton refuses one)."""
    names = {launch.kernel.fn.__name__ for launch in seen["launches"]}
    assert {"_nvfp4_moe_gemm_kernel", "_predecoded_moe_gemm_kernel"} <= names
    specs = kernels.unique([kernels.specialize(x, name) for x in seen["launches"]])
    assert len(specs) >= 8
    for spec in specs:
        assert kernels.compile_for(spec).metadata.shared <= shared_bytes, spec.label


def generic_table_said(device: str, platform: str) -> list[tuple[str, str]]:
    """The log of a GPU no table names (device, as table file names spell it): the platform's
    generic table, once per layer shape."""
    return [
        (
            "info",
            f"NVFP4 emulation MoE (E={e} H={h} I={i}, {device}): no tuned tile table"
            f" (nvfp4_emulation_moe_tiles.E{e}_H{h}_I{i}.{device}.json or"
            f" nvfp4_emulation_moe_tiles.{device}.json); using the generic {platform} table",
        )
        for e, h, i, _ in (RAGGED, ALIGNED)
    ]


@pytest.mark.parametrize("capability", [80, 86])
def test_unfused_before_sm89(runs: Any, capability: int) -> None:
    """Before sm_89 no GEMM of the patch launches: every call takes the unfused path (whose
    slots the finalize's top-k sum adds, a kernel that compiles there), the weights stay in
    the checkpoint's rows, and the log says why once."""
    seen = runs(capability)
    assert {launch.kernel.fn.__name__ for launch in seen["launches"]} == {"_topk_sum_kernel"}
    for spec in kernels.unique(
        [kernels.specialize(x, target(capability)) for x in seen["launches"]]
    ):
        kernels.compile_for(spec)
    assert seen["unfused"] == 6
    assert seen["tiled"] is False
    said = [
        f"NVFP4 emulation MoE (w13 {(e, 2 * i, h // 2)}, w2 {(e, h, i // 2)}): "
        + REASON.format(capability // 10, capability % 10)
        + "; this layer takes vLLM 0.24.0's unfused path (every expert's weights"
        " dequantized on every call: slow)"
        for e, h, i, _ in (RAGGED, ALIGNED)
    ]
    assert seen["log"] == [("warning", line) for line in said]


@pytest.mark.parametrize("capability", [89, 90, 100, 120])
def test_fused_from_sm89(runs: Any, capability: int) -> None:
    """From sm_89 the layer takes the fused path on tiled weights, and every launch compiles
    for the GPU within its shared memory (the predecoded w13 tile: 96 KiB where the GPU has
    99, 144 KiB on sm_90's 227)."""
    seen = runs(capability)
    assert seen["unfused"] == 0 and seen["tiled"] is True
    assert seen["log"] == generic_table_said(f"CPU_stand-in_for_an_sm_{capability}_GPU", "cuda")
    compile_fused(seen, target(capability), SHARED_BYTES[capability])


def test_fused_on_cdna2(runs: Any) -> None:
    """MI210/MI250 (gfx90a) take ROCm's fused path, and every launch compiles for gfx90a
    within its LDS (Triton converts FP8 E4M3 there in software)."""
    seen = runs(CDNA2)
    assert seen["unfused"] == 0 and seen["tiled"] is True
    assert seen["log"] == generic_table_said("CPU_stand-in_for_an_MI300", "rocm")
    compile_fused(seen, CDNA2, CDNA2_LDS_BYTES)


@pytest.mark.parametrize("capability", [80, 86])
def test_triton_refuses_the_kernels_before_sm89(runs: Any, capability: int) -> None:
    """Why the rule is sm_89: the fused GEMM an sm_89 GPU launches does not compile for sm_80
    or sm_86 (what the layer would fail on at its first call without the rule)."""
    gemm = next(x for x in runs(89)["launches"] if x.kernel.fn.__name__ == "_nvfp4_moe_gemm_kernel")
    with pytest.raises(Exception) as refused:
        kernels.compile_for(kernels.specialize(gemm, target(capability)))
    causes: list[BaseException] = []
    error: BaseException | None = refused.value
    while error is not None:  # triton's CompilationError of each call level, then the cause
        causes.append(error)
        error = error.__cause__
    assert str(causes[-1]).startswith("type fp8e4nv not supported in this architecture")


# vLLM's platform where NVML cannot read the GPU: no capability, none asked for is had.
unread = types.SimpleNamespace(
    **vars(gpu(90))
    | {"get_device_capability": lambda: None, "has_device_capability": lambda c: False}
)


@pytest.mark.parametrize(
    ("platform", "reason"),
    [
        (gpu(80), REASON.format(8, 0)),
        (gpu(86), REASON.format(8, 6)),
        (gpu(89), None),
        (gpu(120), None),  # Blackwell
        (unread, None),
        (kernels.platform(rocm=True), None),  # CDNA: the kernels compile (test_kernels_compile)
    ],
    ids=["sm80", "sm86", "sm89", "sm120", "unread", "rocm"],
)
def test_device_reason(
    overlay: Overlay, full_pristine: Pristine, platform: Any, reason: str | None
) -> None:
    """The rule alone: NVIDIA before sm_89 has a reason; from it, on ROCm, or where vLLM cannot
    read the capability (NVML failed: the fused path, as before the rule), none."""
    fused = kernels.overlay_fused(overlay, full_pristine, platform=platform)
    assert fused.module.fused_device_reason() == reason
