"""The engine check's float64 reference forward (benchmarks/engine_check/reference.py) on the CPU:
its architecture against transformers' own Qwen3-MoE in float64 (where transformers can be
installed), its NVFP4 weights exact, its W4A4 experts quantizing both activations with the one
NVFP4 reference (tests/gpu/nvfp4_reference.py), and its logprobs as the engine reports them."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the reference runs torch (pip install torch)")
pytest.importorskip("safetensors.torch", reason="it reads safetensors files")
import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "gpu"))

import nvfp4_reference  # noqa: E402
from engine_check import checkpoint as ckpt  # noqa: E402
from engine_check import reference as ref  # noqa: E402

TINY = ckpt.MoeModel(
    layers=2, experts=8, hidden=64, intermediate=32, top_k=3, vocab=256, heads=4, kv_heads=2,
    head_dim=16,
)  # fmt: skip
F64 = torch.float64


def write(tmp_path: Path, fmt: str) -> Path:
    """TINY in ``fmt``, its norms' weights made random (the writer's are ones), so that a norm
    applied to the wrong tensor shows."""
    folder = ckpt.write_model(TINY, fmt, tmp_path / fmt)
    gen = torch.Generator().manual_seed(5)
    for path in sorted(folder.glob("*.safetensors")):
        tensors = load_file(str(path))
        for name, t in tensors.items():
            if name.endswith("norm.weight"):
                noise = torch.randn(t.shape, generator=gen)
                tensors[name] = (1.0 + 0.2 * noise).to(t.dtype)
        save_file(tensors, str(path), metadata={"format": "pt"})
    return folder


def prompts(count: int = 3, length: int = 12) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(3, TINY.vocab, (count, length), generator=gen).tolist()


def float64_everywhere(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    """transformers computes three things in FP32 whatever the model's dtype: RMSNorm, the
    router's softmax and the rotary angles (and its eager attention's softmax: the test takes
    the SDPA attention, float64 on the CPU). Here they run in float64, the same formulas, so
    that the rest (attention, masking, grouped heads, q/k norms, routing, experts, residuals,
    lm_head) is transformers' own float64 forward."""

    def rms_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))

    def router_forward(self: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = x.reshape(-1, self.hidden_dim)
        logits = torch.nn.functional.linear(x, self.weight)
        probs = logits.softmax(dim=-1)
        top, idx = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, top, idx

    def rope_forward(self: Any, x: torch.Tensor, position_ids: torch.Tensor) -> Any:
        dim = self.config.head_dim
        theta = self.config.rope_parameters["rope_theta"]
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=F64) / dim)
        freqs = position_ids[..., None].to(F64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    monkeypatch.setattr(module.Qwen3MoeRMSNorm, "forward", rms_forward)
    monkeypatch.setattr(module.Qwen3MoeTopKRouter, "forward", router_forward)
    monkeypatch.setattr(module.Qwen3MoeRotaryEmbedding, "forward", rope_forward)


def test_architecture_matches_transformers_in_float64(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The BF16 checkpoint (the NVFP4 experts dequantized to BF16), no activation
    quantization: the reference's logits are transformers' Qwen3MoeForCausalLM's in float64 to
    1e-10 (the logits' spread is about 4)."""
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    module = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")
    folder = write(tmp_path, "bf16")
    float64_everywhere(monkeypatch, module)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=F64, attn_implementation="sdpa", experts_implementation="eager"
    ).eval()
    tokens = torch.tensor(prompts())
    with torch.no_grad():
        want = model(tokens).logits
    got = ref.logits(ref.Checkpoint(folder, "cpu"), tokens, "none")
    assert (got.dtype, got.shape) == (F64, (3, 12, TINY.vocab))
    assert float(want.std()) > 1.0  # logits of a few nats' spread, not a degenerate model
    assert float((got - want).abs().max()) < 1e-10


def test_nvfp4_experts_are_exact(tmp_path: Path) -> None:
    """The NVFP4 checkpoint's experts in float64: every weight an E2M1 value times its block's
    scale and the expert's weight_scale_2, and the BF16 checkpoint's weights (the writer's FP32
    dequantization rounded to BF16) within one BF16 step of them."""
    nvfp4 = ref.Checkpoint(ckpt.write_model(TINY, "nvfp4", tmp_path / "nvfp4"), "cpu")
    bf16 = ref.Checkpoint(ckpt.write_model(TINY, "bf16", tmp_path / "bf16"), "cpu")
    for layer in range(TINY.layers):
        exact = nvfp4.experts(layer, "w4a16")
        plain = bf16.experts(layer, "none")
        assert (exact.a13_gscale, exact.a2_gscale, plain.a13_gscale) == (None, None, None)
        for got, rounded in ((exact.w13, plain.w13), (exact.w2, plain.w2)):
            assert got.dtype == F64
            step = (rounded - got.to(torch.bfloat16).to(F64)).abs()
            ulp = got.abs() * 2.0**-7
            assert bool((step <= ulp).all())
            assert float((step == 0).double().mean()) > 0.999
        p = f"model.layers.{layer}.mlp.experts.5.down_proj"
        scale = nvfp4.tensor(f"{p}.weight_scale").to(F64).repeat_interleave(16, dim=-1)
        codes = exact.w2[5] / (scale * nvfp4.tensor(f"{p}.weight_scale_2").to(F64))
        values = torch.tensor(nvfp4_reference.E2M1_VALUES, dtype=F64)
        assert bool(torch.isin(codes.abs(), values).all())


def test_w4a4_scales_are_the_checkpoints(tmp_path: Path) -> None:
    """The activations' quantization factors: 1 / input_scale in FP32, as vLLM takes them
    (input_scale = amax / (448 * 6) for the writer's amax, 5.83 and 7.61)."""
    nvfp4 = ref.Checkpoint(ckpt.write_model(TINY, "nvfp4", tmp_path / "nvfp4"), "cpu")
    experts = nvfp4.experts(0, "w4a4")
    want13 = float(1.0 / torch.tensor(5.83 / (6 * 448), dtype=torch.float32))
    want2 = float(1.0 / torch.tensor(7.61 / (6 * 448), dtype=torch.float32))
    assert experts.a13_gscale is not None and experts.a2_gscale is not None
    assert (float(experts.a13_gscale), float(experts.a2_gscale)) == (want13, want2)


ACTIVATION_ERRORS = [
    ("bf16", "w4a4", "a checkpoint without NVFP4 experts takes activations='none'"),
    ("nvfp4", "none", "an NVFP4 checkpoint takes activations='w4a4' or 'w4a16'"),
    ("nvfp4", "w8a8", "activations 'w8a8': one of ('w4a4', 'w4a16', 'none')"),
]


@pytest.mark.parametrize(("fmt", "activations", "message"), ACTIVATION_ERRORS)
def test_activations_fit_the_checkpoint(
    tmp_path: Path, fmt: str, activations: str, message: str
) -> None:
    model = ref.Checkpoint(ckpt.write_model(TINY, fmt, tmp_path / fmt), "cpu")
    with pytest.raises(ValueError) as exc:
        model.experts(0, activations)
    assert str(exc.value) == message


def test_w4a4_experts_quantize_both_activations() -> None:
    """Each routed token: down(q2(silu(gate(q1(x))) * up(q1(x)))) * its weight, summed over its
    top k; q1, q2 the NVFP4 reference's quantize-dequantize in float64."""
    gen = torch.Generator().manual_seed(0)
    e, h, i, t = 4, 32, 16, 5
    a13, a2 = torch.tensor(448.0, dtype=F64), torch.tensor(336.0, dtype=F64)
    experts = ref.Experts(
        torch.randn(e, 2 * i, h, generator=gen, dtype=F64) / h**0.5,
        torch.randn(e, h, i, generator=gen, dtype=F64) / i**0.5,
        a13,
        a2,
    )
    x = torch.randn(t, h, generator=gen, dtype=F64)
    weights, ids = ref.route(torch.randn(t, e, generator=gen, dtype=F64), 2, True)
    got = ref.experts_forward(experts, x, weights, ids)
    want = torch.zeros(t, h, dtype=F64)
    for token in range(t):
        xq = nvfp4_reference.quant_dequant(x[token], a13)
        for k in range(2):
            e_ = int(ids[token, k])
            gate, up = (experts.w13[e_] @ xq).chunk(2)
            a = nvfp4_reference.quant_dequant(torch.nn.functional.silu(gate) * up, a2)
            want[token] += weights[token, k] * (experts.w2[e_] @ a)
    assert got.dtype == F64
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    plain = ref.experts_forward(ref.Experts(experts.w13, experts.w2, None, None), x, weights, ids)
    assert float((plain - got).abs().max()) > 1e-3  # the quantization shows


def test_w4a4_experts_agree_with_the_exact_fp32_arithmetic() -> None:
    """The float64 W4A4 experts against patch 0002's exact arithmetic in FP32 (the NVFP4
    reference's ``exact=True``), with the activations' global scales the oracle takes from the
    engine check's checkpoints (1 / input_scale, amax 6 and 8): 0.24% apart (relative
    Frobenius), near the 0.17% floor of a BF16 output. With the activations quantized in
    FLOAT64 (the reference until 2026-12-02) they were 4.2% apart, and 0.24.0's arithmetic
    4.8%: the float64 model broke the near-ties of those scales otherwise than FP32 does."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import moe_setup
    from w4a4_roundings import float64_experts, rel

    shape = moe_setup.shape_named("qwen3-30b-a3b-tp4")
    moe = dataclasses.replace(
        moe_setup.make_moe(shape, device="cpu"),
        a13_gscale=nvfp4_reference.oracle_global_scale(6.0 / 2688.0),
        a2_gscale=nvfp4_reference.oracle_global_scale(8.0 / 2688.0),
    )
    x, weights, ids = moe_setup.random_inputs(64, shape, seed=1, device="cpu")
    want = ref.experts_forward(float64_experts(moe), x.to(F64), weights.to(F64), ids.long())
    exact = rel(nvfp4_reference.nvfp4_moe_reference(moe, x, weights, ids, exact=True), want)
    pristine = rel(nvfp4_reference.nvfp4_moe_reference(moe, x, weights, ids), want)
    assert (round(exact, 4), round(pristine, 3)) == (0.0024, 0.034)


def test_route_renormalises_as_the_config_says() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]], dtype=F64)
    probs = logits.softmax(-1)
    weights, ids = ref.route(logits, 2, True)
    assert ids.tolist() == [[3, 2]]
    torch.testing.assert_close(weights, probs[:, [3, 2]] / probs[:, [3, 2]].sum(), rtol=0, atol=0)
    raw, _ = ref.route(logits, 2, False)
    torch.testing.assert_close(raw, probs[:, [3, 2]], rtol=0, atol=0)


def test_prompt_logprobs(tmp_path: Path) -> None:
    """Per prompt of n tokens, n - 1 logprobs: token j's given tokens 0 .. j-1, the same in
    batches of any size; W4A4 near W4A16, not equal."""
    model = ref.Checkpoint(ckpt.write_model(TINY, "nvfp4", tmp_path / "nvfp4"), "cpu")
    texts = prompts(count=3, length=10)
    got = ref.prompt_logprobs(model, texts, "w4a4", batch=2)
    assert [len(p) for p in got] == [9, 9, 9]
    full = ref.logits(model, torch.tensor(texts), "w4a4").log_softmax(-1)
    want = [[float(full[b, j - 1, texts[b][j]]) for j in range(1, 10)] for b in range(3)]
    assert flat(got) == pytest.approx(flat(want), abs=1e-12)
    one_by_one = ref.prompt_logprobs(model, texts, "w4a4", batch=1)
    assert flat(one_by_one) == pytest.approx(flat(got), abs=1e-12)
    a16 = ref.prompt_logprobs(model, texts, "w4a16", batch=3)
    gaps = [abs(x - y) for x, y in zip(flat(got), flat(a16), strict=True)]
    assert 0.01 < max(gaps) < 2.0  # 1.03 nats: a 64-wide model, coarse activation blocks


def flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


def test_prompt_logprobs_take_another_moe_layer(tmp_path: Path) -> None:
    """``moe_layer`` computes every MoE layer: the default one is ``moe``; another changes the
    logprobs (benchmarks/w4a4_logprob_floor.py swaps in other arithmetics)."""
    model = ref.Checkpoint(ckpt.write_model(TINY, "nvfp4", tmp_path / "nvfp4"), "cpu")
    texts = prompts()
    default = ref.prompt_logprobs(model, texts, "w4a4")
    assert ref.prompt_logprobs(model, texts, "w4a4", moe_layer=ref.moe) == default
    calls: list[int] = []

    def no_experts(c: ref.Checkpoint, layer: int, x: torch.Tensor, act: str) -> torch.Tensor:
        calls.append(layer)
        return torch.zeros_like(x)

    assert ref.prompt_logprobs(model, texts, "w4a4", moe_layer=no_experts) != default
    assert calls == [0, 1]  # once per layer for the batch of three prompts
