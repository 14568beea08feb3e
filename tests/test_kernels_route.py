"""Patch 0002's route program under Triton's interpreter (TRITON_INTERPRET=1) on the CPU: up to
ROUTE_MAX_PAIRS routed (token, expert) pairs over at most ROUTE_MAX_GROUPS groups (the rank's
experts + 1, rounded up to a power of two), one more program of the QDQ pass sorts the pairs
into blocks of one expert (moe_align_block_size's layout) instead of vLLM's alignment kernels.

- The blocks, over the classes a layer meets (a generator, not a list of cases): the expert
  counts the route takes (the released checkpoints' up to Kimi-K2's 384, and every EP8 rank's,
  from 512 experts down to 32), top-k 1 to 10, token counts from 1 pair to exactly
  ROUTE_MAX_PAIRS, token blocks of 8 to 64, int32 and int64 ids;
  with no expert map against vLLM 0.24.0's own ``moe_align_block_size`` over the C++ op's
  stand-in (tests/gpu/standins.py: ascending expert, ascending pair), exactly; with an EP8
  rank's map, and with ids outside the router's range, against a plain statement of the
  route's groups (this rank's experts in order, then one group of expert -1 for the pairs of
  other ranks and the ids outside, whose outputs w2 stores as zeros).
- The layer: the experts' own ``apply`` with the route program against the same apply with
  vLLM's alignment (ROUTE_MAX_PAIRS 0 in the kernels' module), the same bits (``torch.equal``), with and
  without an expert map, FP16 and BF16; the alignment op is called only in the latter, the
  route only in the former.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the kernels run on torch tensors (pip install torch)")
pytest.importorskip("triton", reason="triton's interpreter runs the kernels (pip install triton)")
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import overlay_kernels as kernels

# The module's limits (asserted against it in the child): the generator reaches them exactly.
ROUTE_MAX_PAIRS, ROUTE_MAX_GROUPS = 512, 512
# 16 .. 384: checkpoints the route takes (Qwen3.5-397B's 512 experts whole are not: 1024 groups);
# 4: the smallest layer; EP8 ranks of 256, 384 and 512 experts: 32, 48, 64 local experts.
EXPERTS = (4, 16, 128, 256, 384, 512)
TOP_K = (1, 2, 6, 8, 10)
BLOCK_M = (8, 16, 32, 64)
MAPS = ("none", "ep8", "ep8-outside")


def block_cases() -> list[tuple[int, int, int, int, str, str]]:
    """(experts, top_k, tokens, block_m, map, id dtype): every expert count with every top-k it
    allows, at 1 token, a ragged count, and the most tokens whose pairs fit ROUTE_MAX_PAIRS
    (exactly the limit where top-k divides it), the block and the map cycling; 512 experts
    only as an EP8 rank's (64 local experts)."""
    cases = []
    cycle = itertools.cycle(itertools.product(BLOCK_M, MAPS, ("int32", "int64")))
    for experts, top_k in itertools.product(EXPERTS, TOP_K):
        if top_k > experts or (experts < 16 and top_k > 2):
            continue
        for tokens in (1, 13, ROUTE_MAX_PAIRS // top_k):
            block_m, emap, dtype = next(cycle)
            if emap != "none" and experts < 16:
                emap = "none"  # an EP8 rank needs 8 ranks of experts
            if experts == 512:
                emap = "ep8-outside" if emap == "ep8-outside" else "ep8"
            cases.append((experts, top_k, tokens, block_m, emap, dtype))
    return cases


BLOCK_CASES = block_cases()
BLOCK_IDS = [f"e{e}-k{k}-t{t}-bm{b}-{m}-{d}" for e, k, t, b, m, d in BLOCK_CASES]

# The layer: (experts, hidden, intermediate, top-k, tokens, dtype, expert parallelism).
LAYERS = {
    "t5": (4, 256, 64, 2, 5, "fp16", False),
    "t17-ep": (4, 256, 64, 2, 17, "fp16", True),
    "t40-bf16": (8, 256, 96, 2, 40, "bf16", False),
    "t3-ep-sparse": (32, 256, 64, 2, 3, "bf16", True),
}

# Every case run once, under the interpreter, in a child process (kernels.run_interpreted).
results = kernels.interpreted_results_fixture()


def test_the_generator_reaches_every_class() -> None:
    """The classes above are all reached: each expert count, top-k, block, map and id dtype,
    one pair, and exactly the limit."""
    seen = list(zip(*BLOCK_CASES, strict=True))
    assert set(seen[0]) == set(EXPERTS) and set(seen[1]) == set(TOP_K)
    assert set(seen[3]) == set(BLOCK_M) and set(seen[4]) == set(MAPS)
    assert set(seen[5]) == {"int32", "int64"}
    pairs = {k * t for _, k, t, *_ in BLOCK_CASES}
    assert 1 in pairs and ROUTE_MAX_PAIRS in pairs and max(pairs) == ROUTE_MAX_PAIRS


@pytest.mark.parametrize("case", BLOCK_IDS)
def test_route_blocks_are_the_alignment(results: dict[str, Any], case: str) -> None:
    got, want = results["blocks"][case]
    assert got == want


def test_route_limits_are_the_modules(results: dict[str, Any]) -> None:
    assert results["limits"] == (ROUTE_MAX_PAIRS, ROUTE_MAX_GROUPS)


def test_route_refuses_what_its_program_does_not_take(results: dict[str, Any]) -> None:
    """routes() and routing(): one pair more than the limit, and 511 experts (1024 groups),
    are refused; the limit itself and 510 experts (512 groups) are taken."""
    assert results["over_limit"] == {
        "pairs": "refused",
        "groups": "refused",
        "at the limits": "taken",
    }


@pytest.mark.parametrize("case", LAYERS)
def test_route_gives_the_alignment_pass_bits(results: dict[str, Any], case: str) -> None:
    routed, aligned = results["layers"][case]
    assert not routed.isnan().any(), "output elements left unwritten (NaN)"
    assert torch.equal(routed, aligned), f"{int((routed != aligned).sum())} elements differ"


@pytest.mark.parametrize("case", LAYERS)
def test_route_replaces_the_alignment_op(results: dict[str, Any], case: str) -> None:
    """(alignment op calls, route calls) with the route program, then with ROUTE_MAX_PAIRS 0."""
    assert results["calls"][case] == ((0, 1), (1, 0))


# -- the child process ------------------------------------------------------------------------


def ids_for(experts: int, top_k: int, tokens: int, emap: str, dtype: str) -> torch.Tensor:
    """Distinct experts per token, as a router picks them; with ep8-outside one id per 7
    pairs replaced by one outside [0, experts) (negative or too large)."""
    gen = torch.Generator().manual_seed(experts * 1000 + top_k * 10 + tokens)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    if emap == "ep8-outside":
        flat = ids.view(-1)
        flat[::7] = torch.where(torch.arange(flat[::7].numel()) % 2 == 0, -1, experts + 3)
    return ids.to(getattr(torch, dtype))


def rank_map(experts: int) -> torch.Tensor:
    """EP8 rank 3's expert map: its eighth of the experts, in order; -1 for the others."""
    local = experts // 8
    emap = torch.full((experts,), -1, dtype=torch.int32)
    emap[3 * local : 4 * local] = torch.arange(local, dtype=torch.int32)
    return emap


def groups_reference(
    ids: torch.Tensor, block_m: int, experts: int, emap: torch.Tensor
) -> tuple[list[int], list[int], int]:
    """The route's blocks, stated plainly: this rank's experts in order, each expert's pairs in
    pair order padded with numel to a multiple of block_m, then the pairs of every other id
    (other ranks', outside the range) in one group whose blocks have expert -1."""
    flat = ids.view(-1).tolist()
    local = emap.size(0) // 8 if emap is not None else experts
    groups: dict[int, list[int]] = {}
    for pair, e in enumerate(flat):
        g = int(emap[e]) if 0 <= e < experts else -1
        groups.setdefault(g if g >= 0 else local, []).append(pair)
    sorted_ids, expert_ids = [], []
    for g in sorted(groups):
        pairs = groups[g]
        n = -(-len(pairs) // block_m) * block_m
        sorted_ids += pairs + [len(flat)] * (n - len(pairs))
        expert_ids += [g if g < local else -1] * (n // block_m)
    return sorted_ids, expert_ids, len(sorted_ids)


def route_blocks(
    kmod: Any, ids: torch.Tensor, block_m: int, experts: int, emap: torch.Tensor | None
) -> tuple[list[int], list[int], int]:
    """The route program alone (the QDQ pass with no rows): its blocks up to num_post_pad."""
    r = kmod.routing(ids, block_m, experts, emap)
    kmod.invoke_nvfp4_qdq(None, torch.ones(1), route=r)
    total = int(r.num_post_pad)
    return r.sorted_ids[:total].tolist(), r.expert_ids[: total // block_m].tolist(), total


def main(overlay_vllm: str, pristine_vllm: str, out: str) -> None:
    kernels.fix_interpreter()
    fused, calls = kernels.counting_fused(overlay_vllm, pristine_vllm)
    kernels.forbid_unfused(fused)
    kmod = sys.modules[fused.module.routes.__module__]  # the kernels module (routing is wrapped)
    vllm_align = fused.module.moe_align_block_size

    blocks = {}
    for case, (experts, top_k, tokens, block_m, emap_kind, dtype) in zip(
        BLOCK_IDS, BLOCK_CASES, strict=True
    ):
        ids = ids_for(experts, top_k, tokens, emap_kind, dtype)
        if emap_kind == "none":
            got = route_blocks(kmod, ids, block_m, experts, None)
            s, e, n = vllm_align(ids, block_m, experts)
            total = int(n)
            want = (s[:total].tolist(), e[: total // block_m].tolist(), total)
        else:
            emap = rank_map(experts)
            got = route_blocks(kmod, ids, block_m, experts // 8, emap)
            want = groups_reference(ids, block_m, experts, emap)
        blocks[case] = (got, want)

    def taken(pairs: int, experts: int) -> str:
        try:
            kmod.routing(torch.zeros(pairs, dtype=torch.int32), 16, experts, None)
        except AssertionError:
            assert not kmod.routes(pairs, experts)
            return "refused"
        assert kmod.routes(pairs, experts)
        return "taken"

    over_limit = {
        "pairs": taken(kmod.ROUTE_MAX_PAIRS + 1, 8),
        "groups": taken(16, 511),
        "at the limits": taken(kmod.ROUTE_MAX_PAIRS, 510),
    }

    layers, counted = {}, {}
    for case, layer in LAYERS.items():
        moe, hidden, weights, ids = kernels.case_layer(case, layer)
        ep = layer[-1]
        outputs, counts = [], []
        limit = kmod.ROUTE_MAX_PAIRS
        for pairs in (limit, 0):
            kmod.ROUTE_MAX_PAIRS = pairs  # type: ignore[attr-defined]
            calls.aligned = calls.routed = 0
            outputs.append(kernels.run_experts(fused, moe, hidden, weights, ids, ep=ep))
            counts.append((calls.aligned, calls.routed))
        kmod.ROUTE_MAX_PAIRS = limit  # type: ignore[attr-defined]
        layers[case], counted[case] = tuple(outputs), tuple(counts)
    limits = (kmod.ROUTE_MAX_PAIRS, kmod.ROUTE_MAX_GROUPS)
    saved = {"blocks": blocks, "over_limit": over_limit, "layers": layers, "calls": counted}
    torch.save({**saved, "limits": limits}, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
