"""Random-weight Qwen3-MoE checkpoints that vLLM 0.24.0 loads natively, written without a hub.

One set of weights (seeded per layer), written in three formats:

- `nvfp4`: ModelOpt NVFP4, the format of NVIDIA's published NVFP4 checkpoints (e.g.
  Qwen3-30B-A3B-NVFP4). `hf_quant_config.json` says `{"producer": {"name": "modelopt"},
  "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": null,
  "exclude_modules": [...]}}`; each expert projection has `weight` uint8 [out, in / 2] (two E2M1
  codes a byte, even k in the low nibble), `weight_scale` float8_e4m3fn [out, in / 16] (one
  scale per block of 16), `weight_scale_2` and `input_scale` fp32 scalars. The dequantized
  weight is e2m1 * weight_scale * weight_scale_2; gate_proj and up_proj share weight_scale_2
  (vLLM fuses them into w13 with one global scale and warns when they differ). Attention, the
  router and lm_head stay BF16 (`exclude_modules`), as in NVIDIA's checkpoints.
- `bf16`: the same model with the experts' NVFP4 weights dequantized in FP32 and rounded to
  BF16, as vLLM 0.24.0's emulation dequantizes them, so that it computes what the emulation
  computes but for the activations' NVFP4 rounding.
- `fp8`: ModelOpt FP8 with static per-tensor scales (`quant_algo: FP8`): `weight`
  float8_e4m3fn, `weight_scale` and `input_scale` fp32 scalars per expert projection. Its
  static activation scale is what reaches `TritonExperts`' deferred input quantization with a
  tensor `a1_scale` (fix 2).

The shapes are Qwen3-30B-A3B's (hidden 2048, 128 experts of intermediate 768, top-8, 32 query
and 4 KV heads of 128) with a smaller vocabulary. Each layer is one safetensors file, so that
a model of fewer layers links the first layers' files of a deeper one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

# The NVFP4 and FP8 quantizers are the GPU tests' reference (tests/gpu/nvfp4_reference.py):
# what the checkpoint holds is what the tests check vLLM against.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
from nvfp4_reference import (
    BLOCK,
    E2M1_MAX,
    E4M3_MAX,
    dequantize,
    quantize_fp8_per_expert,
    quantize_weights,
    weight_global_scale,
)

# Activation amax the static scales are calibrated for: RMS-normed hidden states (unit RMS,
# 2048 wide) stay under 6; silu(gate) * up of unit-variance rows under 8. Not those round
# numbers, but values such as a calibration measures: with amax 6 and 8 the activations'
# global scales are 447.99997 and 336 (1 / input_scale), and then a few elements in a
# thousand of every activation lie within an FP32 ulp of an E2M1 rounding threshold, where
# two FP32 spellings of vLLM's own quantization (its Triton kernel's global_scale / scale,
# its torch reference's 1 / (scale * (1 / global_scale))) round apart: a whole FP4 step each,
# 6.6% of a layer's output on this checkpoint's first layer. Released checkpoints' calibrated
# scales put no element there; nor do these (tests/engine/test_checkpoint.py).
HIDDEN_AMAX = 5.83
INTERMEDIATE_AMAX = 7.61
FORMATS = ("nvfp4", "bf16", "fp8")
EXCLUDED = ["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"]


@dataclasses.dataclass(frozen=True)
class MoeModel:
    layers: int
    experts: int = 128
    hidden: int = 2048
    intermediate: int = 768
    top_k: int = 8
    vocab: int = 32768
    heads: int = 32
    kv_heads: int = 4
    head_dim: int = 128
    seed: int = 0

    def config(self) -> dict[str, object]:
        """config.json of a Qwen3-MoE model of these sizes (every layer sparse)."""
        return {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": 3 * self.hidden,  # dense MLP size: no layer has one
            "moe_intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "num_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 4096,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "bos_token_id": 1,
            "eos_token_id": 2,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": self.layers,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
            "initializer_range": 0.02,
        }


def quant_config(fmt: str) -> dict[str, object] | None:
    """hf_quant_config.json of a ModelOpt checkpoint; None for BF16."""
    if fmt == "bf16":
        return None
    quantization: dict[str, object] = {
        "quant_algo": {"nvfp4": "NVFP4", "fp8": "FP8"}[fmt],
        "kv_cache_quant_algo": None,
        "exclude_modules": EXCLUDED,
    }
    if fmt == "nvfp4":
        quantization["group_size"] = BLOCK
    return {"producer": {"name": "modelopt", "version": "0.37.0"}, "quantization": quantization}


# -- the weights --------------------------------------------------------------------------------
def _normal(gen: torch.Generator, device: str, *shape: int) -> torch.Tensor:
    """N(0, 1 / fan_in): every projection keeps its input's scale."""
    out = torch.randn(*shape, generator=gen, device=device)
    return out * shape[-1] ** -0.5


def dense_weights(model: MoeModel, device: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(model.seed * 1000 + 999)
    return {
        "model.embed_tokens.weight": torch.randn(
            model.vocab, model.hidden, generator=gen, device=device
        ),
        "model.norm.weight": torch.ones(model.hidden, device=device),
        # Logits of about 4 nats' spread: a peaked next-token distribution, as trained models have.
        "lm_head.weight": 4.0 * _normal(gen, device, model.vocab, model.hidden),
    }


def layer_weights(model: MoeModel, layer: int, device: str) -> dict[str, torch.Tensor]:
    """Layer `layer`'s FP32 weights (HF names), the same for every depth of model."""
    gen = torch.Generator(device=device).manual_seed(model.seed * 1000 + layer)
    m, h = model, model.hidden
    p = f"model.layers.{layer}"
    out = {
        f"{p}.input_layernorm.weight": torch.ones(h, device=device),
        f"{p}.post_attention_layernorm.weight": torch.ones(h, device=device),
        f"{p}.self_attn.q_proj.weight": _normal(gen, device, m.heads * m.head_dim, h),
        f"{p}.self_attn.k_proj.weight": _normal(gen, device, m.kv_heads * m.head_dim, h),
        f"{p}.self_attn.v_proj.weight": _normal(gen, device, m.kv_heads * m.head_dim, h),
        f"{p}.self_attn.o_proj.weight": _normal(gen, device, h, m.heads * m.head_dim),
        f"{p}.self_attn.q_norm.weight": torch.ones(m.head_dim, device=device),
        f"{p}.self_attn.k_norm.weight": torch.ones(m.head_dim, device=device),
        f"{p}.mlp.gate.weight": _normal(gen, device, m.experts, h),
    }
    out[f"{p}.mlp.experts.gate_proj"] = _normal(gen, device, m.experts, m.intermediate, h)
    out[f"{p}.mlp.experts.up_proj"] = _normal(gen, device, m.experts, m.intermediate, h)
    out[f"{p}.mlp.experts.down_proj"] = _normal(gen, device, m.experts, h, m.intermediate)
    return out


def _experts(
    prefix: str, name: str, tensors: dict[str, torch.Tensor]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Per-expert checkpoint tensors from stacked [E, ...] ones."""
    for key, stacked in tensors.items():
        for e in range(stacked.shape[0]):
            yield f"{prefix}.mlp.experts.{e}.{name}.{key}", stacked[e].contiguous()


def layer_tensors(model: MoeModel, layer: int, fmt: str, device: str) -> dict[str, torch.Tensor]:
    """Layer `layer` in checkpoint format `fmt`: what its safetensors file holds."""
    weights = layer_weights(model, layer, device)
    prefix = f"model.layers.{layer}"
    stacked = {
        n: weights.pop(f"{prefix}.mlp.experts.{n}") for n in ("gate_proj", "up_proj", "down_proj")
    }
    out = {name: w.to(torch.bfloat16) for name, w in weights.items()}
    if fmt == "fp8":
        for name, w in stacked.items():
            q, scale = quantize_fp8_per_expert(w)
            amax = INTERMEDIATE_AMAX if name == "down_proj" else HIDDEN_AMAX
            input_scale = torch.full((w.shape[0],), amax / E4M3_MAX, device=device)
            tensors = {"weight": q, "weight_scale": scale, "input_scale": input_scale}
            out.update(_experts(prefix, name, tensors))
        return out
    gscales = {
        "gate_proj": weight_global_scale(stacked["gate_proj"], stacked["up_proj"]),
        "down_proj": weight_global_scale(stacked["down_proj"]),
    }
    gscales["up_proj"] = gscales["gate_proj"].clone()  # one value, two tensors on disk
    for name, w in stacked.items():
        packed, scale = quantize_weights(w, gscales[name])
        if fmt == "bf16":
            deq = dequantize(packed, scale, gscales[name]).to(torch.bfloat16)
            out.update(_experts(prefix, name, {"weight": deq}))
            continue
        amax = INTERMEDIATE_AMAX if name == "down_proj" else HIDDEN_AMAX
        experts = w.shape[0]
        tensors = {
            "weight": packed,
            "weight_scale": scale,
            "weight_scale_2": gscales[name].reshape(experts),
            "input_scale": torch.full((experts,), amax / (E2M1_MAX * E4M3_MAX), device=device),
        }
        out.update(_experts(prefix, name, tensors))
    return out


def write_model(
    model: MoeModel, fmt: str, dest: Path, device: str = "cpu", reuse: Path | None = None
) -> Path:
    """Write a checkpoint of `model` in `fmt` into the new folder `dest`. With `reuse`, a
    checkpoint of the same weights and format with at least as many layers, link its files."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (one of {FORMATS})")
    dest.mkdir(parents=True)
    (dest / "config.json").write_text(json.dumps(model.config(), indent=2) + "\n")
    if (qc := quant_config(fmt)) is not None:
        (dest / "hf_quant_config.json").write_text(json.dumps(qc, indent=2) + "\n")
    (dest / "generation_config.json").write_text('{"bos_token_id": 1, "eos_token_id": 2}\n')
    weight_map: dict[str, str] = {}
    files = [("model-dense.safetensors", None)] + [
        (f"model-layer-{layer:03d}.safetensors", layer) for layer in range(model.layers)
    ]
    for file_name, layer in files:
        if reuse is not None and (reuse / file_name).is_file():
            os.symlink((reuse / file_name).resolve(), dest / file_name)
            names = json.loads((reuse / "model.safetensors.index.json").read_text())["weight_map"]
            weight_map.update({n: file_name for n, f in names.items() if f == file_name})
            continue
        if layer is None:
            tensors = {n: t.to(torch.bfloat16) for n, t in dense_weights(model, device).items()}
        else:
            tensors = layer_tensors(model, layer, fmt, device)
        # Per-expert scalars (weight_scale_2, input_scale, FP8 weight_scale) are 0-dim tensors,
        # as ModelOpt writes them.
        tensors = {n: t.contiguous().cpu() for n, t in tensors.items()}
        save_file(tensors, str(dest / file_name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file_name))
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return dest
