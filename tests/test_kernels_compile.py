"""The overlay's Triton kernels compile for MI300 (gfx942), MI355 (gfx950) and Hopper (sm_90) on
a CPU machine, with triton itself (`triton.compile(ASTSource(...), target=GPUTarget(...))`: an
hsaco through the wheel's ld.lld, a cubin through the wheel's ptxas), in every configuration
their launchers use; and so does vLLM 0.24.0's own Triton MoE kernel, which TritonExperts
launches on the overlaid path.

The kernels are the `@triton.jit` functions of every overlaid file, read from its source
(tests/overlay_kernels.py): a new kernel is covered without editing this file. Their configurations
are not written here: each launcher runs on CPU tensors of both benchmark shapes, both activation
dtypes and one token count at each end of each of its token buckets, with the launches recorded, and
triton's own binder turns each recorded launch into what a GPU launch would compile (signature,
constexprs, alignment, options). The counts are asserted: a walk that compiled nothing fails.

A kernel meant for one platform only declares it above its decorator (`# triton-platform:
cuda`) and is compiled for that platform's targets; every other kernel is portable and must
compile for all three. Compiled kernels are cached by triton under the test cache
(TRITON_CACHE_DIR, keyed by the source's hash): a warm run compiles nothing.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the launchers run on torch tensors (pip install torch)")
pytest.importorskip("triton", reason="triton compiles the kernels (pip install triton)")
import sys

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import overlay_kernels as kernels
import rocm_table_isa
import standins
from vllm_install import OVERLAID, Overlay, Pristine

pytestmark = pytest.mark.usefixtures("triton_cache")

# vLLM's fused_moe_kernel: token counts at the ends of get_default_config's decode, middle and
# prefill tiles (the emulation's unfused path and TritonExperts pick their tiles there).
VLLM_TOKENS = (1, 64, 512)
RED_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def ptx_only_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.inline_asm_elementwise(
        "mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1
    )
    tl.store(y_ptr + offs, y)


def launch(x, y):
    ptx_only_kernel[(1,)](x, y, BLOCK=64)
"""


PORTABLE = """

@triton.jit
def portable_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs))


def launch_either(x, y):
    from vllm.platforms import current_platform

    if current_platform.is_cuda():
        ptx_only_kernel[(1,)](x, y, BLOCK=64)
    else:
        portable_kernel[(1,)](x, y, BLOCK=64)
"""


def vllm_launches(pristine: Pristine, rocm: bool) -> list[Any]:
    """vLLM 0.24.0's fused_moe_kernel as TritonExperts launches it (BF16 / FP16 weights, the
    w13 GEMM with top_k, the w2 GEMM with the router weight), tiles of get_default_config for
    the platform."""
    platform = {"is_rocm": lambda: rocm, "is_cuda_alike": lambda: True}
    module = kernels.load(
        pristine.root / kernels.VLLM_FUSED_MOE,
        {
            "vllm.envs": type("envs", (), {"VLLM_BATCH_INVARIANT": False}),
            "vllm.platforms.current_platform": type("platform", (), platform),
        },
    )
    tl = kernels.tl
    with kernels.recording_launches() as launches:
        for e, h, i, top_k in kernels.SHAPES.values():
            for dtype, compute in ((torch.bfloat16, tl.bfloat16), (torch.float16, tl.float16)):
                for m in VLLM_TOKENS:
                    ids = torch.stack([torch.randperm(e)[:top_k] for _ in range(m)]).int()
                    weights = torch.rand(m, top_k)
                    for n, k, gemm_top_k, mul in ((2 * i, h, top_k, False), (h, i, 1, True)):
                        config = module.get_default_config(m, e, n, k, top_k, None, None)
                        block_m = config["BLOCK_SIZE_M"]
                        sorted_ids, expert_ids, post_pad = standin_align(ids, block_m, e)
                        module.invoke_fused_moe_triton_kernel(
                            torch.empty(m * top_k // gemm_top_k, k, dtype=dtype),
                            torch.empty(e, n, k, dtype=dtype),
                            torch.empty(m, top_k, n, dtype=dtype),
                            None,
                            None,
                            weights if mul else None,
                            sorted_ids,
                            expert_ids,
                            post_pad,
                            mul,
                            gemm_top_k,
                            config,
                            compute,
                            False,
                            False,
                            False,
                            False,
                            False,
                        )
    return launches


def standin_align(ids: torch.Tensor, block_m: int, experts: int) -> tuple[torch.Tensor, ...]:
    padded = ids.numel() + experts * (block_m - 1)
    sorted_ids = torch.empty(padded, dtype=torch.int32)
    expert_ids = torch.empty((padded + block_m - 1) // block_m, dtype=torch.int32)
    post_pad = torch.empty(1, dtype=torch.int32)
    standins.moe_align_block_size(ids, experts, block_m, sorted_ids, expert_ids, post_pad, None)
    return sorted_ids, expert_ids, post_pad


def overlaid_sources(overlay: Overlay) -> dict[str, dict[str, kernels.JitFunction]]:
    return {
        rel: kernels.jit_functions((overlay.project.overlay_dir / rel).read_text())
        for rel in OVERLAID
        if rel.endswith(".py")
    }


def for_target(launches: list[Any], declared: dict[str, str | None], target: str) -> list[Any]:
    """The launches to compile for `target`: a kernel that declares a platform, on that
    platform's targets only (a kernel of no overlaid file, vLLM's own, is portable)."""
    return [
        launch for launch in launches
        if target in kernels.PLATFORM_TARGETS[declared.get(launch.kernel.__name__)]
    ]  # fmt: skip


def compile_all(specs: list[kernels.Specialization]) -> list[str]:
    """Each specialization compiled; the failures as lines naming kernel, target, config."""
    failures = []
    for spec in specs:
        try:
            kernels.compile_for(spec)
        except Exception as exc:  # triton's compile errors have no common type
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            failures.append(f"{spec.kernel.__name__} on {spec.target} ({spec.label()}): {first}")
    return failures


@pytest.fixture(scope="module")
def fused(overlay: Overlay, full_pristine: Pristine) -> dict[str, tuple[list[Any], Any]]:
    """The fused experts' launches on each platform ("hip", "cuda"), and the table of tiles."""
    paths = (overlay.project.overlay_dir / "vllm", full_pristine.root / "vllm")
    return {p: kernels.fused_launches(*paths, rocm=p == "hip") for p in ("hip", "cuda")}


def backend(target: str) -> str:
    return str(kernels.TARGETS[target].backend)


def test_every_overlaid_kernel_is_launched(
    overlay: Overlay, fused: dict[str, tuple[list[Any], Any]]
) -> None:
    """Every @triton.jit function of the overlaid files is launched by the launchers driven
    here, or is a helper such a kernel calls: none escapes the compile tests."""
    launched = {launch.kernel.__name__ for launches, _ in fused.values() for launch in launches}
    for rel, functions in overlaid_sources(overlay).items():
        kernels_here = {f.name for f in functions.values() if f.launched}
        assert kernels_here <= launched, f"{rel}: never launched: {kernels_here - launched}"
        assert kernels.reached(functions, kernels_here) == set(functions), rel
    # Patch 0002's kernels module has its kernels and their helpers (the experts' module,
    # which launches them, none); triton_moe.py none either: it launches vLLM's
    # fused_moe_kernel, compiled below.
    counts = {rel: len(f) for rel, f in overlaid_sources(overlay).items()}
    assert counts[kernels.FUSED_KERNELS] >= 3 and counts[kernels.FUSED_MOE] == 0


@pytest.mark.parametrize("target", kernels.TARGETS)
def test_overlay_kernels_compile(
    target: str, overlay: Overlay, fused: dict[str, tuple[list[Any], Any]]
) -> None:
    launches, configs = fused[backend(target)]
    declared = {
        name: f.platform for functions in overlaid_sources(overlay).values()
        for name, f in functions.items()
    }  # fmt: skip
    specs = kernels.unique(
        [kernels.specialize(launch, target) for launch in for_target(launches, declared, target)]
    )
    portable = [
        s for s in specs if kernels.is_fused_gemm(s) and declared.get(s.kernel.__name__) is None
    ]
    # The portable path covers every configuration on every target: each tile set of the
    # launcher's table, gated (w13 + silu_and_mul + QDQ) and ungated (w2), BF16 and FP16.
    assert kernels.fused_tiles_compiled(portable) == kernels.fused_tiles(configs)
    start = time.monotonic()
    assert compile_all(specs) == []
    print(f"{target}: {len(specs)} specializations compiled in {time.monotonic() - start:.1f} s")


def fused_gemms(target: str, fused: dict[str, tuple[list[Any], Any]]) -> list[Any]:
    """The fused GEMM launches of the target's platform, as they compile for the target."""
    specs = kernels.unique([kernels.specialize(x, target) for x in fused[backend(target)][0]])
    return [s for s in specs if kernels.is_fused_gemm(s)]


def loop_mma(spec: kernels.Specialization) -> int:
    """The HMMAs (m16n8k16) one warp issues per K step of a fused GEMM: its weight rows (gate
    and up rows both, unless split) by its tokens by GEMM_BLOCK_K, over its warps."""
    rows = spec.constexpr("BLOCK_N") * (
        2 if spec.constexpr("GATED") and not spec.constexpr("SPLIT_GU") else 1
    )
    tiles = rows // 16 * spec.constexpr("BLOCK_M") // 8 * spec.constexpr("BLOCK_K") // 16
    return tiles // dict(spec.options)["num_warps"]


def test_k_loop_mix_reads_the_longest_backward_branch() -> None:
    """The K loop of a SASS listing: from the target of its longest backward branch to the
    branch, predicated instructions included; a forward branch and a shorter loop are not it."""
    sass = "\n".join(
        f"        /*{at:04x}*/   {text} ;   /* 0x0 */"
        for at, text in [
            (0x00, "MOV R1, c[0x0][0x28]"),
            (0x10, "@!P0 BRA 0x90"),
            (0x20, "LOP3.LUT R2, R3, 0xf, RZ, 0xc0, !PT"),
            (0x30, "HMMA.16816.F32.BF16 R4, R8, R12, R4"),
            (0x40, "@P1 BRA 0x30"),
            (0x50, "IMAD R2, R2, 0x1040, RZ"),
            (0x60, "HMUL2.BF16_V2 R5, R2, R6"),
            (0x70, "@!P5 BRA 0x20"),
            (0x80, "BRA 0x80"),
            (0x90, "EXIT"),
        ]
    )
    assert kernels.k_loop_mix(sass) == {"BRA": 2, "HMMA": 1, "HMUL2": 1, "IMAD": 1, "LOP3": 1}
    assert (
        kernels.k_loop_mix(sass.replace("BRA 0x20", "BRA 0x90").replace("BRA 0x30", "BRA 0x90"))
        == {}
    )


@pytest.mark.parametrize("target", kernels.TARGETS)
def test_isa_facts(target: str, fused: dict[str, tuple[list[Any], Any]]) -> None:
    """benchmarks/isa_facts.py's reading of the code objects: the registers, spills and matrix
    instructions are there (triton itself leaves them empty without a driver), and every fused GEMM
    configuration of the target has matrix instructions; on sm_90 its K loop issues exactly its
    tile's MMAs per step (no dot computed twice, none fallen back to FMA). A tile that triton
    compiles to FMA dots instead (ROCm's MFMA does not cover blocks of 8 tokens in narrow tiles) is
    slow, and it sums in another order than the tiles of the other token buckets: a token's output
    would then depend on the batch."""
    without = []
    for spec in fused_gemms(target, fused):
        facts = kernels.isa_facts(kernels.compile_for(spec), target)
        if kernels.TARGETS[target].backend == "hip":
            assert facts["vgprs"] > 0 and facts["sgprs"] > 0
            assert isinstance(facts["vgpr_spills"], int) and isinstance(facts["scratch_bytes"], int)
            matrix = facts["mfma"]
        else:
            assert facts["registers"] > 0 and isinstance(facts["local_bytes"], int)
            assert facts["sass_instructions"] == sum(facts["sass_mix"].values())
            assert facts["k_loop_mma"] == loop_mma(spec), spec.label()
            matrix = facts["mma"]
        if matrix == 0:
            without.append(spec.label())
    assert without == [], f"{target}: fused GEMMs without matrix instructions: {without}"


# The shared memory (LDS) one program may take: MI300's and MI355's (rocm_table_isa's rule),
# Hopper's.
SHARED_LIMIT = rocm_table_isa.LDS_BYTES | {"sm90": kernels.HOPPER_SHARED_BYTES}


@pytest.mark.parametrize("target", kernels.TARGETS)
def test_predecoded_gemms_compile_to_matrix_instructions(
    target: str, fused: dict[str, tuple[list[Any], Any]]
) -> None:
    """The GEMMs over predecoded weights that the target's platform launches (w13 gated and w2
    not; on CUDA with ROCm's tiles forced too) fit the target's shared memory and spill
    nothing: on sm_90 warpgroup MMAs (HGMMA: both operands from shared memory) and no local
    memory; on gfx942 and gfx950 MFMA instructions, no VGPR spill or scratch, and two waves
    per SIMD or more (GENERIC_PREDECODE's ROCm tiles: CUDA's three stages would take 96 KiB of
    LDS for w13)."""
    specs = kernels.unique([kernels.specialize(x, target) for x in fused[backend(target)][0]])
    gemms = [s for s in specs if kernels.is_predecoded_gemm(s)]
    assert {s.constexpr("GATED") for s in gemms} == {False, True}
    for spec in gemms:
        facts = kernels.isa_facts(kernels.compile_for(spec), target)
        assert facts["shared_bytes_triton"] <= SHARED_LIMIT[target], spec.label()
        if kernels.TARGETS[target].backend == "hip":
            assert facts["mfma"] > 0, spec.label()
            assert facts["vgpr_spills"] == facts["scratch_bytes"] == 0, spec.label()
            assert facts["occupancy_waves"] >= 2, spec.label()
        else:
            assert facts["local_bytes"] == 0, spec.label()
            assert facts["sass_mix"].get("HGMMA", 0) > 0, spec.label()


@pytest.mark.parametrize("target", [t for t, v in kernels.TARGETS.items() if v.backend == "hip"])
def test_portable_decode_is_exact_fp16_on_rocm(
    target: str, fused: dict[str, tuple[list[Any], Any]]
) -> None:
    """The portable decode's exactness on AMD (tests/test_nvfp4_portable_decode.py: every
    weight and quantized activation is exact in FP16, FP16 subnormals included) holds in the
    code objects: every fused GEMM keeps FP16 denormals (the kernel descriptor's
    float_denorm_mode_16_64 is 3, neither input nor output flushed), multiplies the weights in
    FP16 and runs FP16 matrix instructions, for BF16 models too."""
    gemms = fused_gemms(target, fused)
    assert gemms
    for spec in gemms:
        asm = kernels.compile_for(spec).asm["amdgcn"]
        assert ".amdhsa_float_denorm_mode_16_64 3" in asm, spec.label()
        # v_mul_f16 in any encoding (e32, e64, sdwa, dpp), or packed
        assert re.search(r"\bv_(pk_)?mul_f16(_e32|_e64|_sdwa|_dpp)?\b", asm), spec.label()
        mfmas = set(re.findall(r"\bv_mfma_\w+", asm))
        assert mfmas and all(m.endswith("_f16") for m in mfmas), (spec.label(), mfmas)


@pytest.mark.parametrize("target", kernels.TARGETS)
def test_vllm_fused_moe_kernel_compiles(target: str, full_pristine: Pristine) -> None:
    rocm = kernels.TARGETS[target].backend == "hip"
    launches = vllm_launches(full_pristine, rocm)
    assert {launch.kernel.__name__ for launch in launches} == {"fused_moe_kernel"}
    specs = kernels.unique([kernels.specialize(launch, target) for launch in launches])
    # Two dtypes, two GEMMs (top_k / router weight), three tile sets at least.
    assert len(specs) >= 2 * 2 * len(VLLM_TOKENS)
    assert compile_all(specs) == []


def test_cuda_only_construct_fails_the_hip_targets(tmp_path: Path) -> None:
    """Red proof: a portable kernel with inline PTX compiles for sm_90 and fails both hip
    targets, with a line naming the kernel and the target."""
    source = tmp_path / "ptx_kernel.py"
    source.write_text(RED_KERNEL)
    functions = kernels.jit_functions(RED_KERNEL)
    assert functions["ptx_only_kernel"].platform is None  # portable: no declaration
    module = kernels.load(source)
    with kernels.recording_launches() as launches:
        module.launch(torch.empty(64, dtype=torch.int32), torch.empty(64, dtype=torch.int32))
    failures = compile_all([kernels.specialize(launches[0], t) for t in kernels.TARGETS])
    assert [line.split(" (")[0] for line in failures] == [
        "ptx_only_kernel on gfx942",
        "ptx_only_kernel on gfx950",
    ]


def test_platform_declaration(tmp_path: Path) -> None:
    """The same PTX kernel declared `# triton-platform: cuda`, beside a portable one that the
    launcher picks elsewhere: sm_90 compiles the CUDA kernel, the hip targets the portable one,
    and nothing fails."""
    source = tmp_path / "declared.py"
    text = RED_KERNEL.replace("@triton.jit", "# triton-platform: cuda\n@triton.jit") + PORTABLE
    source.write_text(text)
    functions = kernels.jit_functions(text)
    assert {n: f.platform for n, f in functions.items()} == {
        "ptx_only_kernel": "cuda",
        "portable_kernel": None,
    }
    declared = {n: f.platform for n, f in functions.items()}
    compiled = {}
    for target in kernels.TARGETS:
        rocm = backend(target) == "hip"
        module = kernels.load(source, {"vllm.platforms.current_platform": kernels.platform(rocm)})
        with kernels.recording_launches() as launches:
            module.launch_either(
                torch.empty(64, dtype=torch.int32), torch.empty(64, dtype=torch.int32)
            )
        specs = [kernels.specialize(x, target) for x in for_target(launches, declared, target)]
        assert compile_all(specs) == []
        compiled[target] = [s.kernel.__name__ for s in specs]
    assert compiled == {
        "gfx942": ["portable_kernel"],
        "gfx950": ["portable_kernel"],
        "sm90": ["ptx_only_kernel"],
    }
