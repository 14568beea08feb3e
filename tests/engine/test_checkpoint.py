"""The engine check's checkpoint writer on the CPU: the files, names, shapes and dtypes vLLM
0.24.0's ModelOpt loaders expect, and the NVFP4 packing and scales (the writer quantizes with
tests/gpu's pure-torch reference, tests/gpu/nvfp4_reference.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the checkpoint writer runs torch (pip install torch)")
import torch

safetensors = pytest.importorskip("safetensors.torch", reason="it writes safetensors files")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "gpu"))

import nvfp4_reference  # noqa: E402
from engine_check import checkpoint as ckpt  # noqa: E402

TINY = ckpt.MoeModel(
    layers=2, experts=4, hidden=64, intermediate=32, top_k=2, vocab=128, heads=4, kv_heads=2,
    head_dim=16,
)  # fmt: skip
E, H, N, V = TINY.experts, TINY.hidden, TINY.intermediate, TINY.vocab  # N: intermediate
U8, F8, F32, BF16 = torch.uint8, torch.float8_e4m3fn, torch.float32, torch.bfloat16
PROJ_SHAPES = {"gate_proj": (N, H), "up_proj": (N, H), "down_proj": (H, N)}
DENSE = {
    "input_layernorm.weight": ((H,), BF16),
    "post_attention_layernorm.weight": ((H,), BF16),
    "self_attn.q_proj.weight": ((4 * 16, H), BF16),
    "self_attn.k_proj.weight": ((2 * 16, H), BF16),
    "self_attn.v_proj.weight": ((2 * 16, H), BF16),
    "self_attn.o_proj.weight": ((H, 4 * 16), BF16),
    "self_attn.q_norm.weight": ((16,), BF16),
    "self_attn.k_norm.weight": ((16,), BF16),
    "mlp.gate.weight": ((E, H), BF16),
}


def expert_tensors(fmt: str, name: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    out, inner = PROJ_SHAPES[name]
    if fmt == "nvfp4":
        return {
            "weight": ((out, inner // 2), U8),
            "weight_scale": ((out, inner // 16), F8),
            "weight_scale_2": ((), F32),
            "input_scale": ((), F32),
        }
    if fmt == "fp8":
        return {"weight": ((out, inner), F8), "weight_scale": ((), F32), "input_scale": ((), F32)}
    return {"weight": ((out, inner), BF16)}


def expected_layout(fmt: str, layers: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    layout = {
        "model.embed_tokens.weight": ((V, H), BF16),
        "model.norm.weight": ((H,), BF16),
        "lm_head.weight": ((V, H), BF16),
    }
    for layer in range(layers):
        p = f"model.layers.{layer}"
        layout.update({f"{p}.{n}": v for n, v in DENSE.items()})
        for e in range(E):
            for name in PROJ_SHAPES:
                for key, v in expert_tensors(fmt, name).items():
                    layout[f"{p}.mlp.experts.{e}.{name}.{key}"] = v
    return layout


def load(folder: Path) -> dict[str, torch.Tensor]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    tensors: dict[str, torch.Tensor] = {}
    for file_name in sorted(set(index.values())):
        part = safetensors.load_file(folder / file_name)
        assert {n for n, f in index.items() if f == file_name} == set(part)
        tensors.update(part)
    return tensors


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    for fmt in ckpt.FORMATS:
        ckpt.write_model(TINY, fmt, root / f"{fmt}-L2")
    # A shallower model of the same weights links the deeper one's files.
    ckpt.write_model(
        ckpt.MoeModel(**{**TINY.__dict__, "layers": 1}), "nvfp4", root / "nvfp4-L1",
        reuse=root / "nvfp4-L2",
    )  # fmt: skip
    return root


@pytest.mark.parametrize("fmt", ckpt.FORMATS)
def test_files_names_shapes_dtypes(models: Path, fmt: str) -> None:
    folder = models / f"{fmt}-L2"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [
            "config.json",
            "generation_config.json",
            "model-dense.safetensors",
            "model-layer-000.safetensors",
            "model-layer-001.safetensors",
            "model.safetensors.index.json",
            *(["hf_quant_config.json"] if fmt != "bf16" else []),
        ]
    )
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert (config["model_type"], config["num_hidden_layers"], config["num_experts"]) == (
        "qwen3_moe", 2, E,
    )  # fmt: skip
    assert (config["hidden_size"], config["moe_intermediate_size"]) == (H, N)
    assert (config["num_experts_per_tok"], config["decoder_sparse_step"]) == (2, 1)
    tensors = load(folder)
    layout = expected_layout(fmt, 2)
    assert sorted(tensors) == sorted(layout)
    for name, (shape, dtype) in layout.items():
        assert (tuple(tensors[name].shape), tensors[name].dtype) == (shape, dtype), name


QUANT_CONFIGS = [
    (
        "nvfp4",
        {
            "producer": {"name": "modelopt", "version": "0.37.0"},
            "quantization": {
                "quant_algo": "NVFP4",
                "kv_cache_quant_algo": None,
                "exclude_modules": [
                    "lm_head",
                    "model.layers.*.self_attn*",
                    "model.layers.*.mlp.gate",
                ],
                "group_size": 16,
            },
        },
    ),
    (
        "fp8",
        {
            "producer": {"name": "modelopt", "version": "0.37.0"},
            "quantization": {
                "quant_algo": "FP8",
                "kv_cache_quant_algo": None,
                "exclude_modules": [
                    "lm_head",
                    "model.layers.*.self_attn*",
                    "model.layers.*.mlp.gate",
                ],
            },
        },
    ),
]


@pytest.mark.parametrize(("fmt", "expected"), QUANT_CONFIGS)
def test_modelopt_quant_config(models: Path, fmt: str, expected: dict[str, object]) -> None:
    assert json.loads((models / f"{fmt}-L2" / "hf_quant_config.json").read_text()) == expected


def test_nvfp4_round_trip(models: Path) -> None:
    """Every NVFP4 expert weight: the reference dequantization of its codes and scales, rounded
    to BF16 as the emulation rounds it, is the BF16 checkpoint's weight exactly, and within one
    E2M1 step of the weight it came from."""
    nvfp4, bf16 = load(models / "nvfp4-L2"), load(models / "bf16-L2")
    for layer in range(2):
        source = ckpt.layer_weights(TINY, layer, "cpu")
        p = f"model.layers.{layer}.mlp.experts"
        for name in PROJ_SHAPES:
            for e in range(E):
                q = f"{p}.{e}.{name}"
                step = nvfp4[f"{q}.weight_scale"].float() * nvfp4[f"{q}.weight_scale_2"]
                deq = nvfp4_reference.dequantize(
                    nvfp4[f"{q}.weight"], nvfp4[f"{q}.weight_scale"], nvfp4[f"{q}.weight_scale_2"]
                )
                assert torch.equal(deq.to(BF16), bf16[f"{q}.weight"]), q
                err = (deq - source[f"{p}.{name}"][e]).abs()
                # Nearest E2M1 value: off by at most half the widest gap (2, between 4 and 6)
                # times the block's step; a block's amax, after its E4M3 scale rounds down,
                # clamps to 6 with an error under 0.4 steps.
                assert bool((err <= step.repeat_interleave(16, dim=-1) * 1.0).all()), q
            gate, up = (nvfp4[f"{p}.{e}.{n}.weight_scale_2"] for n in ("gate_proj", "up_proj"))
            assert torch.equal(gate, up)  # vLLM fuses gate and up under one global scale
        # The global scale is ModelOpt's amax / (6 * 448), per expert.
        w = source[f"{p}.down_proj"]
        for e in range(E):
            expected = w[e].abs().amax() / (6.0 * 448.0)
            assert torch.equal(nvfp4[f"{p}.{e}.down_proj.weight_scale_2"], expected)
            assert nvfp4[f"{p}.{e}.down_proj.input_scale"].item() == pytest.approx(7.61 / 2688.0)
            assert nvfp4[f"{p}.{e}.gate_proj.input_scale"].item() == pytest.approx(5.83 / 2688.0)


def test_nvfp4_packing_by_hand() -> None:
    """A block whose values are E2M1 values times 1: codes land in the nibbles as vLLM reads
    them (even k low), sign in bit 3, ties rounded to the even code."""
    row = torch.tensor(
        [6.0, -6.0, 0.5, 1.0, 0.0, -0.5, 1.5, 2.0, 3.0, 4.0, 0.25, 0.75, 1.25, 1.75, 2.5, 5.0]
    )
    packed, scale = nvfp4_reference.quantize_weights(row.reshape(1, 16), torch.tensor(1.0))
    assert scale.float().tolist() == [[1.0]]
    # codes: 7, 15, 1, 2, 0, 9, 3, 4, 5, 6, then ties 0.25->0, 0.75->2, 1.25->2, 1.75->4,
    # 2.5->4, 5.0->6
    assert packed.tolist() == [[0xF7, 0x21, 0x90, 0x43, 0x65, 0x20, 0x42, 0x64]]
    back = nvfp4_reference.dequantize(packed, scale, torch.tensor(1.0))
    assert back.tolist() == [
        [6.0, -6.0, 0.5, 1.0, 0.0, -0.5, 1.5, 2.0, 3.0, 4.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0]
    ]


def test_fp8_weights(models: Path) -> None:
    fp8 = load(models / "fp8-L2")
    source = ckpt.layer_weights(TINY, 0, "cpu")
    for name in PROJ_SHAPES:
        for e in range(E):
            q = f"model.layers.0.mlp.experts.{e}.{name}"
            w = source[f"model.layers.0.mlp.experts.{name}"][e]
            assert fp8[f"{q}.weight_scale"].item() == pytest.approx(w.abs().amax().item() / 448.0)
            deq = fp8[f"{q}.weight"].float() * fp8[f"{q}.weight_scale"]
            # E4M3 keeps 3 mantissa bits: within 2**-4 relative, or the subnormal step absolute.
            bound = w.abs() * 2**-4 + fp8[f"{q}.weight_scale"] * 2**-9
            assert bool(((deq - w).abs() <= bound).all()), q
            amax = 7.61 if name == "down_proj" else 5.83
            assert fp8[f"{q}.input_scale"].item() == pytest.approx(amax / 448.0)


def test_same_weights_in_every_format_and_depth(models: Path) -> None:
    nvfp4, bf16, fp8, shallow = (
        load(models / n) for n in ("nvfp4-L2", "bf16-L2", "fp8-L2", "nvfp4-L1")
    )
    dense = [n for n in nvfp4 if ".experts." not in n]
    for name in dense:
        assert torch.equal(nvfp4[name], bf16[name]) and torch.equal(nvfp4[name], fp8[name]), name
    assert set(shallow) == {n for n in nvfp4 if not n.startswith("model.layers.1.")}
    for name, tensor in shallow.items():
        assert torch.equal(tensor, nvfp4[name]), name
    layer_files = sorted(p.name for p in (models / "nvfp4-L1").iterdir() if p.is_symlink())
    assert layer_files == ["model-dense.safetensors", "model-layer-000.safetensors"]


@pytest.mark.parametrize("proj", ["gate_proj", "up_proj", "down_proj"])
def test_nvfp4_input_scales_put_no_activation_on_a_tie(models: Path, proj: str) -> None:
    """The checkpoint's static input scales, as calibrated ones: no activation lies where two
    FP32 spellings of the quantization disagree (each such element is a whole FP4 step)."""
    tensors = load(models / "nvfp4-L2")
    scales = [t for name, t in tensors.items() if name.endswith(f"{proj}.input_scale")]
    assert scales
    gs = nvfp4_reference.oracle_global_scale(torch.stack(scales))
    assert nvfp4_reference.activations_on_ties(gs) == 0


def test_round_amax_puts_activations_on_ties() -> None:
    """The regression pin: amax 6 (the writer's until 2026-12-02, global scale 447.99997)
    puts elements on ties that the two spellings round apart."""
    gs = nvfp4_reference.oracle_global_scale(torch.tensor([6.0 / 2688.0]))
    assert nvfp4_reference.activations_on_ties(gs) > 100
