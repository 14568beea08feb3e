"""The engine check's Qwen3-MoE checkpoints, forward in float64: the exact model the engines
approximate, for their teacher-forced logprobs to be judged against.

Pure torch, read from the checkpoint folder the engines load (checkpoint.py writes it):
``config.json``, the safetensors files of ``model.safetensors.index.json`` and, for ModelOpt
NVFP4, ``hf_quant_config.json``. Everything is computed in float64:

- embedding, RMSNorm (``rms_norm_eps``), attention as Qwen3 has it: q, k, v projections, RMSNorm
  of each head's q and k (``q_norm``, ``k_norm``), rotary embedding of the neox kind (halves
  rotated, ``rope_theta``; the angles in float64), causal softmax attention with grouped KV heads,
  scaled by 1 / sqrt(head_dim), ``o_proj``; residual connections around attention and MoE;
- the router: softmax over the experts of ``mlp.gate``'s logits, the top k, renormalised to
  sum to one where ``norm_topk_prob`` says so;
- the experts, W4A4 (``activations="w4a4"``): the NVFP4 weights dequantized exactly
  (e2m1 * weight_scale * weight_scale_2, no rounding in float64), the input of gate/up and the
  input of down (silu(gate) * up) fake-quantized as vLLM's reference quantization defines it
  (``ref_nvfp4_quant``: per block of 16, scale = E4M3(global_scale * amax / 6), elements
  rounded to E2M1 nearest-even after scaling by global_scale / scale, clamped to +-6): the one
  implementation of it in this project, tests/gpu/nvfp4_reference.py ``quant_dequant``. Its
  codes and scales are decided in FP32, as vLLM defines them (it quantizes ``x.to(float32)``),
  and their value e2m1 * scale / global_scale is float64: with the global scales of these
  checkpoints the scaled elements fall just off the E2M1 thresholds often, and deciding in
  float64 broke those near-ties otherwise than any FP32 quantizer does (the emulations then
  looked 7% away from this model's layers on their own inputs). The activations' global
  scale is 1 / input_scale as vLLM's ModelOpt NVFP4 MoE takes it (the FP32 reciprocal of the
  largest input_scale over the experts; the checkpoint has one value).
  ``activations="w4a16"``: no activation quantization (what Marlin approximates); a BF16
  checkpoint's experts are its BF16 weights (``activations`` must be "none");
- the final RMSNorm, ``lm_head``, log-softmax over the vocabulary.

``prompt_logprobs(model, prompts)``: per prompt, the logprob of each token after the first
given the ones before it, as vLLM's ``SamplingParams(prompt_logprobs=0)`` reports them
(worker.py ``prompt_logprobs``); the check's ``reference`` command writes them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
from nvfp4_reference import dequantize, oracle_global_scale, quant_dequant

F64 = torch.float64
ACTIVATIONS = ("w4a4", "w4a16", "none")
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class Experts:
    """One layer's experts in float64: w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I],
    and the activations' global quantization factors (None: no activation quantization)."""

    w13: torch.Tensor
    w2: torch.Tensor
    a13_gscale: torch.Tensor | None
    a2_gscale: torch.Tensor | None


class Checkpoint:
    """A checkpoint folder's tensors, read a file at a time onto ``device``."""

    def __init__(self, folder: Path, device: str) -> None:
        self.folder, self.device = folder, device
        self.config: dict[str, Any] = json.loads((folder / "config.json").read_text())
        quant = folder / "hf_quant_config.json"
        self.quant: dict[str, Any] | None = (
            json.loads(quant.read_text())["quantization"] if quant.is_file() else None
        )
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        self.files: dict[str, str] = index["weight_map"]
        self._loaded: dict[str, dict[str, torch.Tensor]] = {}

    @property
    def nvfp4(self) -> bool:
        return self.quant is not None and self.quant.get("quant_algo") == "NVFP4"

    def tensor(self, name: str) -> torch.Tensor:
        file = self.files[name]
        if file not in self._loaded:
            self._loaded.clear()  # one file at a time: a layer's experts take gigabytes
            self._loaded[file] = load_file(str(self.folder / file), device=self.device)
        return self._loaded[file][name]

    def f64(self, name: str) -> torch.Tensor:
        return self.tensor(name).to(F64)

    def experts(self, layer: int, activations: str) -> Experts:
        if activations not in ACTIVATIONS:
            raise ValueError(f"activations {activations!r}: one of {ACTIVATIONS}")
        if not self.nvfp4 and activations != "none":
            raise ValueError("a checkpoint without NVFP4 experts takes activations='none'")
        if self.nvfp4 and activations == "none":
            raise ValueError("an NVFP4 checkpoint takes activations='w4a4' or 'w4a16'")
        count = int(self.config["num_experts"])
        prefix = f"model.layers.{layer}.mlp.experts"
        weights: dict[str, torch.Tensor] = {}
        input_scales: dict[str, torch.Tensor] = {}
        for proj in PROJECTIONS:
            rows = []
            for e in range(count):
                p = f"{prefix}.{e}.{proj}"
                if self.nvfp4:
                    rows.append(
                        dequantize(
                            self.tensor(f"{p}.weight"),
                            self.tensor(f"{p}.weight_scale"),
                            self.tensor(f"{p}.weight_scale_2"),
                            F64,
                        )
                    )
                else:
                    rows.append(self.f64(f"{p}.weight"))
            weights[proj] = torch.stack(rows)
            if self.nvfp4:
                scales = [self.tensor(f"{prefix}.{e}.{proj}.input_scale") for e in range(count)]
                input_scales[proj] = torch.stack(scales).float().max()
        w13 = torch.cat((weights["gate_proj"], weights["up_proj"]), dim=1)
        if activations != "w4a4":
            return Experts(w13, weights["down_proj"], None, None)
        # vLLM's ModelOpt NVFP4 MoE: one input scale for gate and up (the larger), the FP32
        # reciprocal as the quantization factor.
        a13 = torch.maximum(input_scales["gate_proj"], input_scales["up_proj"])
        return Experts(
            w13,
            weights["down_proj"],
            oracle_global_scale(a13).to(F64),
            oracle_global_scale(input_scales["down_proj"]).to(F64),
        )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox rotary embedding of x [batch, heads, tokens, head_dim], positions 0, 1, ..."""
    dim, tokens = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=F64, device=x.device) / dim)
    angles = torch.arange(tokens, dtype=F64, device=x.device)[:, None] * inv_freq
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    half = dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def attention(ckpt: Checkpoint, layer: int, x: torch.Tensor) -> torch.Tensor:
    """Qwen3's self-attention of x [batch, tokens, H], causal, positions from 0."""
    c = ckpt.config
    heads, kv_heads, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]
    p = f"model.layers.{layer}.self_attn"
    b, t, _ = x.shape

    def project(name: str, n: int) -> torch.Tensor:
        return (x @ ckpt.f64(f"{p}.{name}.weight").T).view(b, t, n, hd).transpose(1, 2)

    q = rms_norm(project("q_proj", heads), ckpt.f64(f"{p}.q_norm.weight"), eps)
    k = rms_norm(project("k_proj", kv_heads), ckpt.f64(f"{p}.k_norm.weight"), eps)
    v = project("v_proj", kv_heads)
    theta = float(c["rope_theta"])
    q, k = rope(q, theta), rope(k, theta)
    groups = heads // kv_heads
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)) * hd**-0.5
    causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    out = scores.softmax(dim=-1) @ v
    out = out.transpose(1, 2).reshape(b, t, heads * hd)
    return out @ ckpt.f64(f"{p}.o_proj.weight").T


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, ...]:
    """Softmax over the experts, the top k (weights, ids), renormalised where asked."""
    probs = logits.softmax(dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def experts_forward(
    experts: Experts, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """sum_k weight_k * down_e(q(silu(gate_e(q(x))) * up_e(q(x)))) over each token's top k,
    q the activations' NVFP4 quantize-dequantize where the experts have scales (W4A4)."""
    xq = x if experts.a13_gscale is None else quant_dequant(x, experts.a13_gscale)
    out = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():
        token, slot = torch.nonzero(ids == e, as_tuple=True)
        gate, up = (xq[token] @ experts.w13[e].T).chunk(2, dim=-1)
        h = F.silu(gate) * up
        if experts.a2_gscale is not None:
            h = quant_dequant(h, experts.a2_gscale)
        out.index_add_(0, token, (h @ experts.w2[e].T) * weights[token, slot, None])
    return out


def router(ckpt: Checkpoint, layer: int, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Layer ``layer``'s routing of the tokens ``flat`` [tokens, H]: (weights, ids), float64
    weights from float64 logits of ``flat``'s values."""
    c = ckpt.config
    logits = flat.to(F64) @ ckpt.f64(f"model.layers.{layer}.mlp.gate.weight").T
    return route(logits, int(c["num_experts_per_tok"]), bool(c["norm_topk_prob"]))


def moe(ckpt: Checkpoint, layer: int, x: torch.Tensor, activations: str) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    weights, ids = router(ckpt, layer, flat)
    experts = ckpt.experts(layer, activations)
    return experts_forward(experts, flat, weights, ids).view_as(x)


# One MoE layer's output for its input: (checkpoint, layer, hidden states, activations).
MoeLayer = Callable[[Checkpoint, int, torch.Tensor, str], torch.Tensor]


def logits(
    ckpt: Checkpoint, tokens: torch.Tensor, activations: str, moe_layer: MoeLayer = moe
) -> torch.Tensor:
    """The final logits [batch, tokens, vocab] (before the log-softmax), float64; ``moe_layer``
    computes every MoE layer (another arithmetic there: benchmarks/w4a4_logprob_floor.py)."""
    c = ckpt.config
    eps = c["rms_norm_eps"]
    x = ckpt.f64("model.embed_tokens.weight")[tokens]
    for layer in range(int(c["num_hidden_layers"])):
        p = f"model.layers.{layer}"
        x = x + attention(ckpt, layer, rms_norm(x, ckpt.f64(f"{p}.input_layernorm.weight"), eps))
        normed = rms_norm(x, ckpt.f64(f"{p}.post_attention_layernorm.weight"), eps)
        x = x + moe_layer(ckpt, layer, normed, activations)
    x = rms_norm(x, ckpt.f64("model.norm.weight"), eps)
    return x @ ckpt.f64("lm_head.weight").T


def prompt_logprobs(
    ckpt: Checkpoint,
    prompts: list[list[int]],
    activations: str,
    batch: int = 8,
    moe_layer: MoeLayer = moe,
) -> list[list[float]]:
    """Per prompt, the logprob of each token after the first given those before it."""
    out: list[list[float]] = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        if len({len(p) for p in chunk}) != 1:
            raise ValueError("prompts of one length only")
        tokens = torch.tensor(chunk, device=ckpt.device)
        logprobs = logits(ckpt, tokens, activations, moe_layer).log_softmax(dim=-1)
        picked = logprobs[:, :-1].gather(-1, tokens[:, 1:, None]).squeeze(-1)
        out += picked.tolist()
    return out
