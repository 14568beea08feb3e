"""The overlay's Triton kernels on a CPU machine, for the compile, interpreter and ISA checks
(tests/test_kernels_compile.py, tests/test_kernels_interpret.py, benchmarks/isa_facts.py).

- ``jit_functions``: every ``@triton.jit`` function of a file, read from its source with ``ast``
  (a new kernel is covered without editing a test), with the platform it declares.
- ``load``: a vLLM module executed from its file with every ``vllm.*`` import answered by a
  stand-in (``Stub``, or an object from ``provides``) and ``vllm.triton_utils`` by the real
  triton. Importing the real vllm is not possible here (its dependencies are not installed), and
  would not help: vllm.triton_utils hands out placeholders where no GPU driver is active, so a
  walk through real imports could pass while compiling nothing.
- ``recording_launches``: every ``kernel[grid](...)`` recorded instead of run; ``specialize``
  binds a recorded launch with triton's own binder for a target (the signature, constexprs,
  alignment attributes and options a GPU launch would compile), ``compile_for`` compiles it.
- ``fused_experts``: patch 0002's experts class over a stand-in for the vLLM base class.

The assumptions about the fused kernel's internals (what ``apply`` reads of its base class and
its quant config, and the name of the table of tiles) are kept in ``FUSED_*`` and
``fused_experts`` below, so that a rewrite of the kernel changes this one place.
"""

from __future__ import annotations

import ast
import builtins
import collections
import contextlib
import dataclasses
import functools
import hashlib
import math
import os
import re
import subprocess
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

# Triton 3.9 warns when this is unset (its default changes in 3.10); warnings fail the tests.
# Enabled: the behaviour of the triton that vLLM runs today.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

FUSED_MOE = "vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py"
# Patch 0002's kernels, launchers and tile tables: a module of their own beside FUSED_MOE,
# which imports them (its public names are importable from FUSED_MOE too).
FUSED_KERNELS = "vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_kernels.py"
FUSED_KERNELS_MODULE = "vllm.model_executor.layers.fused_moe.experts.nvfp4_emulation_kernels"
# vLLM 0.24.0's own Triton MoE kernel, which TritonExperts (triton_moe.py, overlaid) launches.
VLLM_FUSED_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
ALIGN = "vllm/model_executor/layers/fused_moe/moe_align_block_size.py"
NVFP4_UTILS = "vllm/model_executor/layers/quantization/utils/nvfp4_emulation_utils.py"

# The targets: MI300 (gfx942), MI355 (gfx950), Hopper (sm_90).
TARGETS = {
    "gfx942": GPUTarget("hip", "gfx942", 64),
    "gfx950": GPUTarget("hip", "gfx950", 64),
    "sm90": GPUTarget("cuda", 90, 32),
}
# Other GPUs a test compiles for (tests/test_kernels_archs.py): NVIDIA before and after Hopper
# (by compute capability) and AMD's MI210/MI250. Not TARGETS, which every kernel compiles for.
OTHER_TARGETS = {f"sm{c}": GPUTarget("cuda", c, 32) for c in (80, 86, 89, 100, 120)} | {
    "gfx90a": GPUTarget("hip", "gfx90a", 64)
}
# A kernel meant for one platform only says so on the line above its first decorator:
#     # triton-platform: cuda
# and is compiled for that platform's targets only; every other kernel is portable.
PLATFORM_COMMENT = re.compile(r"#\s*triton-platform:\s*(?P<platform>cuda|hip)\s*$")
PLATFORM_TARGETS = {"cuda": ("sm90",), "hip": ("gfx942", "gfx950"), None: tuple(TARGETS)}
# The shared memory one block may take on Hopper (an H100's or H200's: 227 KiB); a kernel that
# asks for more does not launch (triton's OutOfResources). AMD's: rocm_table_isa.LDS_BYTES.
HOPPER_SHARED_BYTES = 227 << 10


# -- the kernels of a file -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class JitFunction:
    name: str
    platform: str | None  # "cuda" or "hip" when it declares one, else None (portable)
    calls: frozenset[str]  # the names it calls (its jit helpers among them)
    launched: bool  # launched as name[grid](...) in the file: a kernel, not a helper


def _is_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "jit"


def jit_functions(source: str) -> dict[str, JitFunction]:
    tree = ast.parse(source)
    lines = source.splitlines()
    launched = {
        node.func.value.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Subscript)
        and isinstance(node.func.value, ast.Name)
    }
    found = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or not any(map(_is_jit, node.decorator_list)):
            continue
        first = min(d.lineno for d in node.decorator_list)
        above = PLATFORM_COMMENT.search(lines[first - 2]) if first > 1 else None
        calls = frozenset(
            n.func.id
            for n in ast.walk(node)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        )
        platform = above["platform"] if above else None
        found[node.name] = JitFunction(node.name, platform, calls, node.name in launched)
    return found


def reached(functions: Mapping[str, JitFunction], kernels: set[str]) -> set[str]:
    """The jit functions the kernels compile: themselves and the helpers they call."""
    seen, todo = set(), list(kernels)
    while todo:
        name = todo.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        todo.extend(functions[name].calls)
    return seen


# -- loading a vLLM module without vLLM ------------------------------------------------------
class Stub(type):
    """What a ``vllm.*`` import gives: a class (it may be subclassed, called, subscripted or put
    in a type union) whose attributes are more stubs. Called with one function or class, it
    gives that back (a decorator); otherwise another stub."""

    _path: str
    _provides: Mapping[str, Any]

    @classmethod
    def make(mcs, path: str, provides: Mapping[str, Any]) -> Any:
        if path in provides:
            return provides[path]
        return mcs(path.rsplit(".", 1)[-1], (), {"_path": path, "_provides": provides})

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = Stub.make(f"{cls._path}.{name}", cls._provides)
        setattr(cls, name, value)  # the same object every time: SILU is SILU
        return value

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and (callable(args[0]) or isinstance(args[0], type)):
            return args[0]
        return Stub.make(f"{cls._path}()", cls._provides)

    def __getitem__(cls, item: Any) -> Any:
        return cls


_loaded = 0


def load(path: Path, provides: Mapping[str, Any] = {}) -> types.ModuleType:
    """The module at ``path`` (a vLLM file), its ``vllm.*`` imports answered by ``provides``
    ("vllm.x.y.name" -> object) or stubs, and vllm.triton_utils by the real triton. Executed
    from the file itself, so that triton reads the kernels' source from it."""
    global _loaded
    answers = {"vllm.triton_utils.tl": tl, "vllm.triton_utils.triton": triton, **provides}
    real_import = builtins.__import__

    def import_(name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (),
                level: int = 0) -> Any:  # fmt: skip
        if level == 0 and name.split(".")[0] == "vllm":
            return Stub.make(name if fromlist else "vllm", answers)
        return real_import(name, globals_, locals_, fromlist, level)

    _loaded += 1
    name = f"vllm_patchset_kernels_{_loaded}.{path.stem}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": import_}
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


# -- launches, recorded and compiled ---------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Launch:
    kernel: JITFunction
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]


@contextlib.contextmanager
def recording_launches() -> Iterator[list[Launch]]:
    """Every ``kernel[grid](...)`` of a JITFunction appended to the list instead of run (the
    tensors stay on the CPU: nothing reads them)."""
    launches: list[Launch] = []
    original = JITFunction.run

    def record(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        launches.append(Launch(self, args, dict(kwargs)))

    JITFunction.run = record  # type: ignore[method-assign]
    try:
        yield launches
    finally:
        JITFunction.run = original  # type: ignore[method-assign]


@dataclasses.dataclass(frozen=True)
class Specialization:
    """What a launch compiles for one target, as triton's own launcher binds it."""

    kernel: JITFunction
    target: str
    signature: Mapping[str, str]
    constexprs: Mapping[Any, Any]
    attrs: Mapping[Any, Any]
    options: Mapping[str, Any]

    @functools.cached_property
    def key(self) -> str:
        text = repr((self.kernel.cache_key, self.target, sorted(self.signature.items()),
                     sorted(map(repr, self.constexprs.items())), repr(self.attrs),
                     sorted(self.options.items())))  # fmt: skip
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def constexpr(self, name: str) -> Any:
        return self.constexprs[(self.kernel.arg_names.index(name),)]

    def label(self) -> str:
        named = {
            self.kernel.arg_names[path[0]]: value
            for path, value in self.constexprs.items()
            if len(path) == 1 and self.kernel.params[path[0]].is_constexpr
        }
        pointers = [f"{k}={v}" for k, v in self.signature.items() if v.startswith("*")]
        parts = pointers[:1] + [f"{k}={_short(v)}" for k, v in named.items()]
        parts += [f"{k}={self.options[k]}" for k in ("num_warps", "num_stages")]
        return ",".join(parts)


def _short(value: Any) -> str:
    return str(value).removeprefix("triton.language.").replace(" ", "")


@functools.cache
def _backend(target: str) -> Any:
    return make_backend(gpu_target(target))


def gpu_target(name: str) -> GPUTarget:
    """The target of that name, in TARGETS or OTHER_TARGETS."""
    return TARGETS.get(name) or OTHER_TARGETS[name]


def specialize(launch: Launch, target: str) -> Specialization:
    backend = _backend(target)
    fn = launch.kernel
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = dict(launch.kwargs)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(
        backend, kwargs, bound, specialization, options
    )
    kept = {k: v for k, v in vars(options).items() if k in ("num_warps", "num_stages")}
    return Specialization(fn, target, signature, constexprs, attrs, kept)


def compile_for(spec: Specialization) -> Any:
    """The compiled kernel (triton's cache, TRITON_CACHE_DIR, keyed by the source's hash)."""
    source = ASTSource(spec.kernel, dict(spec.signature), dict(spec.constexprs), dict(spec.attrs))
    return triton.compile(source, target=gpu_target(spec.target), options=dict(spec.options))


def unique(specs: list[Specialization]) -> list[Specialization]:
    return list({s.key: s for s in specs}.values())


# -- the interpreter ----------------------------------------------------------------------
def bf16_to_f32(bits: Any) -> Any:
    """BF16 values held as uint16 (the interpreter's storage) -> FP32, exactly."""
    return (bits.astype("uint32") << 16).view("float32")


def fix_interpreter() -> None:
    """Faults of triton 3.9.0's interpreter that a GPU build does not have, mended here:

    - ``tl.dot`` of BF16 operands multiplies their uint16 storage as integers (max error 9e10
      on a 64x64 product); they are widened to FP32 first (exact: products of BF16 values fit
      FP32's mantissa), as the GPU's MMA takes them;
    - FP32 -> BF16 (``x.to(tl.bfloat16)``) truncates; the GPU rounds to nearest even, and so
      does torch, which casts instead;

    - FP32 -> FP8 E4M3 (``x.to(tl.float8e4nv)``) rounds without carrying into the exponent
      (124.2 becomes 64, not 128: 47 of 4096 random values in [0, 440) wrong); the cast is done
      by torch instead (round to nearest even, as the GPU's cvt.rn.satfinite.e4m3x2.f32);
    - a scalar mask (``mask=k0 + BLOCK_K < K``, a comparison of scalars) is broadcast to int32,
      which the interpreter's own load then refuses ("mask has unsupported dtype"); masks reach
      the loads and stores as booleans.
    """
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    def as_bool(mask: Any) -> Any:
        if mask.data.dtype == bool:
            return mask
        return TensorHandle(mask.data.astype(bool), tl.int1)

    load, store = InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store
    fp_to_fp = InterpreterBuilder.create_fp_to_fp

    def masked_load(self: Any, ptrs: Any, mask: Any, *args: Any) -> Any:
        return load(self, ptrs, as_bool(mask), *args)

    def masked_store(self: Any, ptrs: Any, value: Any, mask: Any, *args: Any) -> Any:
        return store(self, ptrs, value, as_bool(mask), *args)

    def to_fp8(self: Any, src: Any, dst_type: Any, rounding_mode: Any) -> Any:
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.float8e4nv:
            return fp_to_fp(self, src, dst_type, rounding_mode)
        fp8 = torch.from_numpy(src.data.copy()).to(torch.float8_e4m3fn)
        return TensorHandle(fp8.view(torch.uint8).numpy(), dst_type.scalar)

    def dot(self: Any, a: Any, b: Any, d: Any, *args: Any) -> Any:
        if a.dtype.scalar == tl.bfloat16 and b.dtype.scalar == tl.bfloat16:
            a, b = (TensorHandle(bf16_to_f32(h.data), tl.float32) for h in (a, b))
        return create_dot(self, a, b, d, *args)

    def cast(self: Any, src: Any, dst_type: Any) -> Any:
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return cast_impl(self, src, dst_type)
        bf16 = torch.from_numpy(src.data.astype("float32")).to(torch.bfloat16)
        return TensorHandle(bf16.view(torch.int16).numpy().view("uint16"), dst_type.scalar)

    create_dot, cast_impl = InterpreterBuilder.create_dot, InterpreterBuilder.cast_impl
    InterpreterBuilder.create_dot = dot
    InterpreterBuilder.cast_impl = cast
    InterpreterBuilder.create_masked_load = masked_load
    InterpreterBuilder.create_masked_store = masked_store
    InterpreterBuilder.create_fp_to_fp = to_fp8


# -- patch 0002's experts on the CPU -------------------------------------------------------
# The benchmark shapes (E, hidden, intermediate, top-k) of tests/gpu/moe_setup.py, and a
# ragged one: both GEMM depths not multiples of the K step (128), so that the masked step
# over the last columns (K_TAIL) compiles for w13 (hidden 2704 = 21 * 128 + 16) and w2
# (intermediate 192, a tensor-parallel shard of Qwen3-30B-A3B), and 192 is no multiple of the
# wider tiles' rows.
SHAPES = {
    "h2048": (128, 2048, 768, 8),
    "h4096": (128, 4096, 1536, 8),
    "ragged": (128, 2704, 192, 8),
}
# Where the fused launcher keeps its generic tiles, per platform ("cuda", "rocm"): largest
# token count of a bucket -> tiles.
FUSED_CONFIGS = "GENERIC_CONFIGS"


def is_fused_gemm(spec: Specialization) -> bool:
    """A specialization of the fused MoE GEMM (the kernel that decodes its weights: a GATED
    switch and a weight-scale pointer)."""
    names = spec.kernel.arg_names
    return "GATED" in names and "w_scale_ptr" in names and spec.target in TARGETS


def is_predecoded_gemm(spec: Specialization) -> bool:
    """A specialization of the GEMM over predecoded weights (a GATED switch, no weight scales)."""
    names = spec.kernel.arg_names
    return "GATED" in names and "w_scale_ptr" not in names and spec.target in TARGETS


def fused_tiles(configs: Mapping[int, Any]) -> set[tuple[Any, ...]]:
    """Every configuration the table asks for: (gated, dtype, BLOCK_M, BLOCK_N, BLOCK_K,
    num_warps, num_stages), the w13 tiles gated, the w2 tiles not, in BF16 and FP16."""
    return {
        (gated, dtype, c.block_m, g.block_n, g.block_k, g.num_warps, g.num_stages)
        for c in configs.values()
        for gated, g in ((True, c.w13), (False, c.w2))
        for dtype in ("bf16", "fp16")
    }


def fused_tiles_compiled(specs: list[Specialization]) -> set[tuple[Any, ...]]:
    """The same tuple for each compiled specialization of the fused kernel."""
    return {
        (s.constexpr("GATED"), _short(s.constexpr("dtype")), s.constexpr("BLOCK_M"),
         s.constexpr("BLOCK_N"), s.constexpr("BLOCK_K"), s.options["num_warps"],
         s.options["num_stages"])
        for s in specs
    }  # fmt: skip


def _resize_cache(x: torch.Tensor, v: tuple[int, ...]) -> torch.Tensor:
    return x.flatten()[: math.prod(v)].view(*v)


# An experts' moe_config under all-to-all kernels (what patch 0002's experts read of it).
ALL2ALL_MOE_CONFIG = types.SimpleNamespace(
    moe_parallel_config=types.SimpleNamespace(use_all2all_kernels=True)
)


class TopKWeightAndReduce:
    """Stands in for vLLM's mk.TopKWeightAndReduce, the finalize's weight-and-reduce step."""

    def apply(self, output: Any, fused_expert_output: Any, topk_weights: Any, topk_ids: Any,
              apply_router_weight_on_input: bool) -> Any:  # fmt: skip
        raise NotImplementedError


class CopyToOutput(TopKWeightAndReduce):
    """vLLM's TopKWeightAndReduceNoOP: the experts' output is the layer's, copied."""

    def apply(self, output: Any, fused_expert_output: Any, topk_weights: Any, topk_ids: Any,
              apply_router_weight_on_input: bool) -> Any:  # fmt: skip
        output.copy_(fused_expert_output)
        return output


class ExpertsBase:
    """Stands in for vLLM's TritonExperts: what the fused ``apply`` uses of it (the quant
    config, the problem size, LoRA and bias off, the top-k sum)."""

    def __init__(self, moe_config: Any, quant_config: Any) -> None:
        self.moe_config = moe_config
        self.quant_config = quant_config
        self._lora_context = None
        self.w1_bias = None
        self.w2_bias = None

    @property
    def a1_gscale(self) -> Any:
        return self.quant_config.a1_gscale

    def moe_problem_size(self, a1: Any, w1: Any, w2: Any, topk_ids: Any) -> tuple[int, ...]:
        e, n, _ = w1.shape  # mk.FusedMoEExpertsModular.moe_problem_size, the 2-D case
        return e, a1.size(0), n, a1.size(-1), topk_ids.size(1)

    def workspace_shapes(
        self, M: int, N: int, K: int, topk: int, *args: Any
    ) -> tuple[tuple[int, ...], ...]:
        # TritonExperts.workspace_shapes (0.24.0) for SiLU-and-mul: its output is N // 2 wide.
        return (M, topk, max(N // 2, K)), (M, topk, max(N, K)), (M, K)

    def moe_sum(self, input: torch.Tensor, output: torch.Tensor) -> None:
        output.copy_(input.sum(dim=1))  # vLLM's moe_sum op, as tests/gpu/standins.py has it

    def finalize_weight_and_reduce_impl(self) -> Any:
        return CopyToOutput()  # TritonExperts' TopKWeightAndReduceNoOP

    def process_weights_after_loading(self, layer: Any) -> None:
        pass  # FusedMoEExpertsModular's: nothing to do


def laid_out(experts: Any, w13: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The weights ``experts.apply`` takes after vLLM's loading: copies of w13 and w2, given to
    its ``process_weights_after_loading`` (which may lay them out in place, with the scales
    of its quant config) as a layer's ``w13_weight`` and ``w2_weight``."""
    layer = types.SimpleNamespace(w13_weight=w13.clone(), w2_weight=w2.clone())
    experts.process_weights_after_loading(layer)
    return layer.w13_weight, layer.w2_weight


@dataclasses.dataclass(frozen=True)
class FusedModule:
    module: types.ModuleType
    experts: type  # Nvfp4QuantizationEmulationTritonExperts over ExpertsBase
    silu: Any  # the MoEActivation.SILU that apply compares with

    @property
    def configs(self) -> Mapping[int, Any]:
        """The table of tiles as the module's platform runs it (its smallest token block)."""
        platform = self.module.nvfp4_platform()
        table: Mapping[int, Any] = getattr(self.module, FUSED_CONFIGS)[platform]
        least = self.module.platform_min_block_m(platform)
        return {
            bound: dataclasses.replace(c, block_m=max(c.block_m, least))
            for bound, c in table.items()
        }


def forbid_unfused(fused: FusedModule) -> None:
    """apply's fallback to 0.24.0's dequantize-everything path (``_apply_dequantized``, which
    needs the real TritonExperts) raises with a sentence instead: a case that does not fuse
    says so."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("apply took the unfused path (_can_fuse said no): not a kernel case")

    fused.experts._apply_dequantized = refuse  # type: ignore[attr-defined]


def small_fused_sizes(module: types.ModuleType) -> tuple[int, int]:
    """The smallest (hidden, intermediate), multiples of 128 (whole K steps of both GEMMs:
    the masked step of other depths has tests/test_kernels_ragged.py), that the
    module's fused path takes (its supports_fused_nvfp4_moe): interpreter cases stay small
    and fused."""
    sizes = [(h, i) for h in range(128, 4097, 128) for i in range(128, h + 1, 128)]
    supports = module.supports_fused_nvfp4_moe
    return min((s for s in sizes if supports(*s)), key=lambda s: (s[0] * s[1], s))


def platform(rocm: bool) -> Any:
    """vllm.platforms.current_platform of a ROCm machine or a Hopper (what a launcher asks)."""
    return types.SimpleNamespace(
        is_rocm=lambda: rocm,
        is_cuda=lambda: not rocm,
        is_cuda_alike=lambda: True,
        has_device_capability=lambda capability: not rocm and capability <= 90,  # an H200
        # A name no tuned table carries: the launchers take the generic tables compiled here.
        get_device_name=lambda: "CPU stand-in for " + ("an MI300" if rocm else "an H200"),
    )


def load_fused(
    overlay_vllm: Path,
    pristine_vllm: Path,
    align: Callable[..., None],
    rocm: bool = False,
    provides: Mapping[str, Any] = {},
) -> FusedModule:
    """Patch 0002's module from the overlay, as on a ROCm or a CUDA machine (a launcher may
    pick a platform's kernel); moe_align_block_size and ref_nvfp4_quant_dequant are vLLM
    0.24.0's own Python (``pristine_vllm``), over ``align`` for the C++ op; ``provides``:
    more ``vllm.*`` names answered (a logger that records, another platform)."""
    root = pristine_vllm.parent
    ops = types.SimpleNamespace(moe_align_block_size=align)
    align_module = load(
        root / ALIGN,
        {
            "vllm._custom_ops": ops,
            "vllm.utils.math_utils.round_up": lambda x, m: (x + m - 1) // m * m,
        },
    )
    e2m1 = types.SimpleNamespace(float4_e2m1f=types.SimpleNamespace(max=lambda: 6.0))
    utils = load(
        root / NVFP4_UTILS,
        {"vllm.platforms.current_platform": platform(rocm), "vllm.scalar_type.scalar_types": e2m1},
    )
    base = "vllm.model_executor.layers"
    answers = {"vllm.platforms.current_platform": platform(rocm), **provides}
    moved = overlay_vllm.parent / FUSED_KERNELS  # absent from an overlay before the move
    kernels_module = load(moved, answers) if moved.exists() else None
    module = load(
        overlay_vllm.parent / FUSED_MOE,
        {
            FUSED_KERNELS_MODULE: kernels_module,
            "vllm.platforms.current_platform": platform(rocm),
            f"{base}.fused_moe.experts.triton_moe.TritonExperts": ExpertsBase,
            f"{base}.fused_moe.moe_align_block_size.moe_align_block_size": (
                align_module.moe_align_block_size
            ),
            f"{base}.fused_moe.utils._resize_cache": _resize_cache,
            f"{base}.fused_moe.modular_kernel.TopKWeightAndReduce": TopKWeightAndReduce,
            f"{base}.quantization.utils.nvfp4_emulation_utils.ref_nvfp4_quant_dequant": (
                utils.ref_nvfp4_quant_dequant
            ),
            f"{base}.quantization.utils.nvfp4_emulation_utils.dequantize_to_dtype": (
                utils.dequantize_to_dtype
            ),
            **provides,
        },
    )
    experts = module.Nvfp4QuantizationEmulationTritonExperts
    return FusedModule(module, experts, module.MoEActivation.SILU)


def overlay_fused(
    overlay: Any, pristine: Any, rocm: bool = False, platform: Any = None, log: Any = None
) -> FusedModule:
    """load_fused on the tests' overlay (vllm_install.Overlay) over the pin's pristine tree
    (vllm_install.Pristine), with the alignment op of tests/gpu/standins.py; ``platform``:
    another vllm.platforms.current_platform, ``log``: vLLM's logger (one that records)."""
    import standins

    provides: dict[str, Any] = {}
    if platform is not None:
        provides["vllm.platforms.current_platform"] = platform
    if log is not None:
        provides["vllm.logger.init_logger"] = lambda name: log
    return load_fused(
        overlay.project.overlay_dir / "vllm",
        pristine.root / "vllm",
        standins.moe_align_block_size,
        rocm=rocm,
        provides=provides,
    )


def shaped_quant_config(experts: int, hidden: int, intermediate: int, scale: float = 0.0) -> Any:
    """quant_config for experts of that shape: every block scale `scale` (0.0: left as
    torch.empty makes them, for launches nobody runs), unit global scales."""

    def scales(*size: int) -> torch.Tensor:
        if not scale:
            return torch.empty(*size, dtype=torch.float8_e4m3fn)
        return torch.full(size, scale).to(torch.float8_e4m3fn)

    return quant_config(
        scales(experts, 2 * intermediate, hidden // 16),
        scales(experts, hidden, intermediate // 16),
        torch.ones(experts),
        torch.ones(experts),
        torch.tensor(1.0),
        torch.tensor(1.0),
    )


def quant_config(
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    g1_alphas: torch.Tensor,
    g2_alphas: torch.Tensor,
    a1_gscale: torch.Tensor,
    a2_gscale: torch.Tensor,
) -> Any:
    """What the fused experts read of vLLM's FusedMoEQuantConfig (nvfp4_moe_quant_config)."""
    return types.SimpleNamespace(
        w1_scale=w13_scale,
        w2_scale=w2_scale,
        g1_alphas=g1_alphas,
        g2_alphas=g2_alphas,
        a1_gscale=a1_gscale,
        a2_gscale=a2_gscale,
        gemm1_clamp_limit=None,
        _w1=types.SimpleNamespace(scale=w13_scale),
        _w2=types.SimpleNamespace(scale=w2_scale),
    )


def fused_apply(
    fused: FusedModule,
    experts: Any,
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor | None = None,
    global_num_experts: int = -1,
    nan_filled: bool = True,
) -> torch.Tensor:
    """``experts.apply`` then the finalize's weight-and-reduce step, as FusedMoEKernel calls
    them: on NaN-filled workspaces of the experts' ``workspace_shapes``, the experts' output
    laid over workspace13's start as FusedMoEKernel lays it (it reuses workspace13 for it),
    and the layer's output (NaN first, as all of them: every element must be written; a read
    of an unwritten one shows). Not ``nan_filled``: left as torch.empty makes them, for
    launches recorded and never run (recording_launches keeps every launch's tensors, and
    filled ones held 6 GB of memory over fused_launches' two walks)."""
    tokens, hidden_size = hidden.shape
    top_k = topk_ids.size(1)
    shapes = experts.workspace_shapes(
        tokens, w13.size(1), hidden_size, top_k, global_num_experts, w13.size(0), None,
        fused.silu,
    )  # fmt: skip
    ws13, ws2, out = (max(math.prod(s), 1) for s in shapes)

    def buffer(*size: int) -> torch.Tensor:
        if not nan_filled:
            return torch.empty(size, dtype=hidden.dtype)
        return torch.full(size, float("nan"), dtype=hidden.dtype)

    common = buffer(max(ws13, out))
    fused_out = common[:out].view(shapes[2])
    experts.apply(
        output=fused_out,
        hidden_states=hidden,
        w1=w13,
        w2=w2,
        topk_weights=topk_weights,
        topk_ids=topk_ids,
        activation=fused.silu,
        global_num_experts=global_num_experts,
        expert_map=expert_map,
        a1q_scale=None,
        a2_scale=None,
        workspace13=common[:ws13],
        workspace2=buffer(ws2),
        expert_tokens_meta=None,
        apply_router_weight_on_input=False,
    )
    output = buffer(tokens, hidden_size)
    reduce = experts.finalize_weight_and_reduce_impl()
    return reduce.apply(output, fused_out, topk_weights, topk_ids, False)


# The dtypes of the interpreter modules' case tables, by name.
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def case_layer(
    name: str, case: tuple[int, int, int, int, int, str, bool]
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One case of an interpreter module's table, (experts, hidden, intermediate, top-k,
    tokens, dtype name, expert parallelism), on the CPU: its layer of random NVFP4 weights
    (seed 0) and its inputs (seed 1), the hidden states in that dtype: (moe, hidden,
    topk_weights, topk_ids)."""
    import moe_setup  # tests/gpu

    experts, hidden_size, intermediate, top_k, tokens, dtype, _ = case
    shape = moe_setup.MoeShape(name, experts, hidden_size, intermediate, top_k)
    moe = moe_setup.make_moe(shape, seed=0, device="cpu")
    hidden, weights, ids = moe_setup.random_inputs(tokens, shape, seed=1, device="cpu")
    return moe, hidden.to(DTYPES[dtype]), weights, ids


def run_experts(
    fused: FusedModule,
    moe: Any,
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    ep: bool = False,
    layout: bool = True,
    retile: Callable[[Mapping[int, Any]], Mapping[int, Any]] | None = None,
) -> torch.Tensor:
    """The fused experts over ``moe`` (an Nvfp4Moe of every expert) through fused_apply. ep: as
    the expert-parallel rank that holds the even experts (an expert map with -1 for the odd
    ones); layout: the weights as ``process_weights_after_loading`` lays them out, else the
    checkpoint's rows; retile: the tiles to run instead of the table the experts take (a
    function of that table)."""
    experts_total = moe.w13.size(0)
    pick: Any = slice(None)
    emap = None
    if ep:
        pick = torch.arange(0, experts_total, 2)
        emap = torch.full((experts_total,), -1, dtype=torch.int32)
        emap[pick] = torch.arange(pick.numel(), dtype=torch.int32)
    config = quant_config(
        moe.w13_scale[pick].clone(),
        moe.w2_scale[pick].clone(),
        moe.w13_gscale[pick],
        moe.w2_gscale[pick],
        moe.a13_gscale,
        moe.a2_gscale,
    )
    experts = fused.experts(None, config)
    if retile is not None:
        table = experts._configs
        experts._configs = lambda *shape: retile(table(*shape))
    w13, w2 = moe.w13[pick].clone(), moe.w2[pick].clone()
    if layout:
        w13, w2 = laid_out(experts, w13, w2)
    return fused_apply(fused, experts, hidden, w13, w2, topk_weights, topk_ids, emap, experts_total)


def token_counts(bounds: list[int]) -> list[int]:
    """Both ends of each bucket of a table keyed by its largest token count."""
    counts, low = [], 1
    for bound in sorted(bounds):
        high = bound if bound < 1 << 20 else 2 * low
        counts += [low, high]
        low = bound + 1
    return sorted(set(counts))


def fused_launches(overlay_vllm: Path, pristine_vllm: Path, rocm: bool) -> tuple[list[Launch], Any]:
    """Every launch of the fused experts' apply on a ROCm or a CUDA machine, over the shapes,
    dtypes, token buckets, with and without an expert map (-1 entries), on CPU tensors nobody
    reads; and the tables of tiles the launcher chose from, keyed (platform, token bound). On
    a CUDA machine also with ROCm's table and token block forced (PLATFORM_ENV=rocm, what the
    ROCm configuration measured on an NVIDIA GPU compiles). BF16 takes the weights as laid
    out by the experts' ``process_weights_after_loading`` (their record of it, set here:
    ``tests/test_kernels_interpret.py`` runs the hook itself), with block scales that the
    hook found fit for the PTX decode's one-operation conversion, and (with the expert map)
    not; FP16 the checkpoint's rows: both layouts and both conversions compile."""
    import standins  # tests/gpu: the C++ alignment op in plain torch

    fused = load_fused(overlay_vllm, pristine_vllm, standins.moe_align_block_size, rocm)
    forced = [None] if rocm or not hasattr(fused.module, PLATFORM_ENV_NAME) else [None, "rocm"]
    tables: dict[tuple[str, int], Any] = {}
    with recording_launches() as launches:
        for platform_forced in forced:
            with _environ(fused.module.PLATFORM_ENV if platform_forced else "", platform_forced):
                configs = fused.configs
                tables |= {(platform_forced or "native", b): c for b, c in configs.items()}
                counts = token_counts(list(configs))  # (the table's keys: token bounds)
                _drive(fused, counts)
                with predecoding(fused):
                    _drive(fused, counts[-1:])
    return launches, tables


# The module's name of the platform switch (an overlay before it has none).
PLATFORM_ENV_NAME = "PLATFORM_ENV"


@contextlib.contextmanager
def _environ(name: str, value: str | None) -> Iterator[None]:
    """os.environ[name] = value for the block (nothing where name or value is empty)."""
    old = os.environ.get(name) if name else None
    if name and value:
        os.environ[name] = value
    try:
        yield
    finally:
        if name and value:
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old


def _drive(fused: FusedModule, tokens: list[int], fp16_rows: bool = True) -> None:
    """The experts' apply over the shapes, dtypes, token counts, with and without an expert
    map (fused_launches); FP16 on the checkpoint's rows (fp16_rows) or, as BF16 always, on the
    weights as the experts' process_weights_after_loading lays them out (what every layer
    whose weights tile runs)."""
    for e, h, i, top_k in SHAPES.values():
        for dtype in (torch.bfloat16, torch.float16):
            for m in tokens:
                experts = fused.experts(None, shaped_quant_config(e, h, i))
                w13 = torch.empty(e, 2 * i, h // 2, dtype=torch.uint8)
                w2 = torch.empty(e, h, i // 2, dtype=torch.uint8)
                if dtype == torch.bfloat16 or not fp16_rows:  # as vLLM's loading leaves them
                    experts.tiled_weights = (w13, w2)  # what the hook records (no bytes
                    # are read here: moving 1.2 GB of them would only cost time)
                ids = torch.stack([torch.randperm(e)[:top_k] for _ in range(m)]).int()
                weights = torch.rand(m, top_k)
                hidden = torch.zeros(m, h, dtype=dtype)
                emap = torch.where(torch.arange(e) % 2 == 0, torch.arange(e) // 2, -1).int()
                for expert_map in (None, emap):
                    # The hook's record of the block scales: fit for the PTX decode's
                    # one-operation conversion, and (with the expert map) not, so that
                    # both conversions compile.
                    experts.fast_scales = expert_map is None
                    fused_apply(
                        fused, experts, hidden, w13, w2, weights, ids, expert_map, e,
                        nan_filled=False,
                    )  # fmt: skip


# The kernels module's name of its generic predecode per platform (threshold and tiles).
PREDECODE_NAME = "GENERIC_PREDECODE"


@contextlib.contextmanager
def predecoding(fused: FusedModule) -> Iterator[None]:
    """The module's generic predecode (where it has one: none before) from one pair an expert
    for the block, its tables read again: its predecoded GEMMs run at any count, so that
    their launches are recorded without the thousands of tokens (and gigabytes of CPU
    tensors) the thresholds ask for."""
    rule = getattr(fused.module, "predecodes", None)
    names = {} if rule is None else rule.__globals__
    old = names.get(PREDECODE_NAME)
    if old is None:
        yield
        return
    read = names["_TABLES"]
    kept = dict(read)
    names[PREDECODE_NAME] = {
        p: dataclasses.replace(c, min_pairs_per_expert=1) for p, c in old.items()
    }
    read.clear()
    try:
        yield
    finally:
        names[PREDECODE_NAME] = old
        read.clear()
        read.update(kept)


# -- ISA facts ---------------------------------------------------------------------------------
# Without a driver triton leaves n_regs / n_spills empty: the facts are read from the code
# objects. AMD: the hsaco's metadata, as its amdgcn text carries it. NVIDIA: the cubin, through
# the cuobjdump that comes with triton's wheel (resources, and the SASS for the instruction mix).
AMDGCN_FIELDS = {
    "vgprs": ".vgpr_count",
    "agprs": ".agpr_count",
    "sgprs": ".sgpr_count",
    "vgpr_spills": ".vgpr_spill_count",
    "sgpr_spills": ".sgpr_spill_count",
    "lds_bytes": ".group_segment_fixed_size",
    "scratch_bytes": ".private_segment_fixed_size",
}
CUBIN_FIELDS = {"registers": "REG", "stack_bytes": "STACK", "shared_bytes": "SHARED",
                "local_bytes": "LOCAL"}  # fmt: skip
# An instruction of cuobjdump's listing: its address, its opcode and (a branch) its target.
SASS_LINE = re.compile(r"^\s+/\*(?P<at>[0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?(?P<op>[A-Z][A-Z0-9_]*)"
                       r"(?:[.\w]*\s+0x(?P<to>[0-9a-f]+))?")  # fmt: skip


def sass_code(sass: str) -> list[tuple[int, str, str | None]]:
    """(address, opcode, branch target or None) of each instruction of a SASS listing."""
    return [
        (int(m["at"], 16), m["op"], m["to"]) for m in map(SASS_LINE.match, sass.splitlines()) if m
    ]


def op_counts(ops: Iterable[str]) -> dict[str, int]:
    """Opcodes by count, the most frequent first (then by name)."""
    return dict(sorted(collections.Counter(ops).items(), key=lambda kv: (-kv[1], kv[0])))


def k_loop_mix(sass: str) -> dict[str, int]:
    """The SASS opcodes of the kernel's longest loop (from a backward branch's target to the
    branch), by count: what a fused GEMM issues per K step, where its time goes once the
    weights stream (empty where the kernel has no loop)."""
    code = sass_code(sass)
    loops = [(int(to, 16), at) for at, op, to in code if op == "BRA" and to and int(to, 16) < at]
    if not loops:
        return {}
    start, end = max(loops, key=lambda loop: loop[1] - loop[0])
    return op_counts(op for at, op, _ in code if start <= at <= end)


def isa_facts(compiled: Any, target: str) -> dict[str, Any]:
    """Registers, spills, memory and (sm_90) the SASS instruction mix of a compiled kernel."""
    facts: dict[str, Any] = {"shared_bytes_triton": compiled.metadata.shared}
    if TARGETS[target].backend == "hip":
        text = compiled.asm["amdgcn"]
        for key, field in AMDGCN_FIELDS.items():
            found = re.search(rf"^\s+(?:- )?{re.escape(field)}:\s+(\d+)", text, re.MULTILINE)
            facts[key] = int(found[1]) if found else None
        occupancy = re.search(r"^; Occupancy: (\d+)", text, re.MULTILINE)
        facts["occupancy_waves"] = int(occupancy[1]) if occupancy else None
        facts["mfma"] = len(re.findall(r"^\s+v_mfma_", text, re.MULTILINE))
        return facts
    import subprocess
    import tempfile

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([tool, "--dump-resource-usage", cubin], capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
        sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
    for key, field in CUBIN_FIELDS.items():
        found = re.search(rf"\b{field}:(\d+)", usage)
        facts[key] = int(found[1]) if found else None
    mix = op_counts(op for _, op, _ in sass_code(sass))
    facts["sass_instructions"] = sum(mix.values())
    facts["mma"] = sum(n for op, n in mix.items() if op in ("HMMA", "HGMMA"))
    facts["sass_mix"] = mix
    loop = k_loop_mix(sass)
    facts["k_loop_instructions"] = sum(loop.values())
    facts["k_loop_mma"] = sum(n for op, n in loop.items() if op in ("HMMA", "HGMMA"))
    facts["k_loop_mix"] = loop
    return facts


# tests/ and tests/gpu: what a child process that runs a test module's `__main__` imports from.
TEST_PATHS = (str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent / "gpu"))


def interpreted_fused(overlay_vllm: str, pristine_vllm: str) -> FusedModule:
    """In a run_interpreted child: the interpreter's faults mended, patch 0002's module loaded
    as on a ROCm machine (the portable kernels: the interpreter runs no inline PTX), its
    fallback to the unfused path refused."""
    import standins  # tests/gpu: the C++ alignment op in plain torch

    assert os.environ.get("TRITON_INTERPRET") == "1"
    fix_interpreter()
    fused = load_fused(
        Path(overlay_vllm), Path(pristine_vllm), standins.moe_align_block_size, rocm=True
    )
    forbid_unfused(fused)
    return fused


@dataclasses.dataclass
class BlockCalls:
    """How often the experts' apply sorted its pairs into blocks, and how: vLLM's alignment op
    (``aligned``) or patch 0002's route program (``routed``, its ``routing`` buffers)."""

    aligned: int = 0
    routed: int = 0


def counting_fused(overlay_vllm: str, pristine_vllm: str) -> tuple[FusedModule, BlockCalls]:
    """Patch 0002's module as on a ROCm machine (load_fused over the C++ alignment op's
    stand-in), with each call of the alignment op and of the module's ``routing`` counted."""
    import standins  # tests/gpu: the C++ alignment op in plain torch

    calls = BlockCalls()

    def align(*args: Any, **kwargs: Any) -> Any:
        calls.aligned += 1
        return standins.moe_align_block_size(*args, **kwargs)

    fused = load_fused(Path(overlay_vllm), Path(pristine_vllm), align, rocm=True)
    route = fused.module.routing

    def counted_route(*args: Any, **kwargs: Any) -> Any:
        calls.routed += 1
        return route(*args, **kwargs)

    fused.module.routing = counted_route  # type: ignore[attr-defined]
    return fused, calls


def interpreted_results_fixture() -> Any:
    """A kernel test module's ``results`` fixture (``results = kernels.interpreted_results_fixture()``
    at its top level): the module run once as a script by run_interpreted, on the overlay and
    the pristine pin (tests/vllm_install.py's fixtures), what its ``main`` saved loaded."""
    import pytest

    @pytest.fixture(scope="module")
    def results(
        request: Any, overlay: Any, full_pristine: Any, tmp_path_factory: Any
    ) -> dict[str, Any]:
        script = request.module.__file__
        out = tmp_path_factory.mktemp(Path(script).stem) / "results.pt"
        overlay_vllm = overlay.project.overlay_dir / "vllm"
        found: dict[str, Any] = run_interpreted(
            script, overlay_vllm, full_pristine.root / "vllm", out
        )
        return found

    return results


def run_interpreted(script: str, overlay_vllm: Path, pristine_vllm: Path, out: Path) -> Any:
    """Run `script` (a test module, its `__main__` with these three arguments) in a child
    process under Triton's interpreter, and load what it saved to `out`. A child of its own:
    the interpreter must be on before triton's first import (triton.language's own functions
    are jit'd when it is imported), and the test session's triton compiles for real GPUs
    (tests/test_kernels_compile.py)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(TEST_PATHS)}
    args = [str(overlay_vllm), str(pristine_vllm), str(out)]
    child = subprocess.run([sys.executable, script, *args], env=env, capture_output=True, text=True)
    assert child.returncode == 0, child.stderr[-4000:]
    return torch.load(out)
