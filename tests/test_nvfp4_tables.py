"""Patch 0002's tile tables as data, its platform switch and what its experts say in vLLM's log,
on the CPU (the overlaid module loaded without vLLM, tests/overlay_kernels.py, its logger recording):

- a tuned table is a JSON file per device and shape
  (``nvfp4_emulation_moe_tiles.E.._H.._I.....json``, then
  ``nvfp4_emulation_moe_tiles.<device>.json``) in the folder named by
  VLLM_PATCHSET_NVFP4_CONFIG_DIR or beside the module (patch 0002 ships the H200's there); a file with a tile whose K step is not 128 is refused at load, one error naming
  the file and the entry; no file: the platform's generic table, said once in the log;
- a table file's optional "predecode" entry (threshold, block of pairs, tiles of the
  predecoded GEMMs) replaces the platform's generic predecode for its shape: taken, deciding
  and launched as written, refused at load where the predecoded GEMMs cannot take it; the
  tuner (benchmarks/tune_nvfp4_moe.py) writes and keeps it, and names its files as the module
  reads them;
- VLLM_PATCHSET_NVFP4_PLATFORM=rocm gives ROCm's generic table and blocks of 16 tokens on an
  NVIDIA GPU (the configuration an MI300 runs, measurable on an H200);
- a layer that takes the unfused path says so once, with why.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the experts take torch tensors (pip install torch)")
pytest.importorskip("triton", reason="the module defines triton kernels (pip install triton)")
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_nvfp4_moe as bench
import moe_setup
import overlay_kernels as kernels
import standins
from vllm_install import Overlay, Pristine

SHAPE = (8, 256, 192)  # experts, hidden, intermediate
DEVICE = "NVIDIA H200"
FILE = "nvfp4_emulation_moe_tiles.E8_H256_I192.NVIDIA_H200.json"
DEVICE_FILE = "nvfp4_emulation_moe_tiles.NVIDIA_H200.json"


@dataclasses.dataclass
class Log:
    """vLLM's logger, recording: (level, message with its arguments)."""

    lines: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def _say(self, level: str, msg: str, *args: Any) -> None:
        text = msg % args if args else msg
        if text.startswith("NVFP4 emulation MoE"):  # the patch's lines, not vLLM's own
            self.lines.append((level, text))

    def info(self, msg: str, *args: Any) -> None:
        self._say("info", msg, *args)

    def warning(self, msg: str, *args: Any) -> None:
        self._say("warning", msg, *args)

    def warning_once(self, msg: str, *args: Any) -> None:
        self._say("warning", msg, *args)

    def debug(self, msg: str, *args: Any) -> None:
        pass


def cuda_platform(rocm: bool = False, device: str = DEVICE) -> Any:
    return types.SimpleNamespace(
        is_rocm=lambda: rocm,
        is_cuda=lambda: not rocm,
        is_cuda_alike=lambda: True,
        has_device_capability=lambda capability: not rocm and capability <= 90,
        get_device_name=lambda: "AMD Instinct MI300X" if rocm else device,
    )


@pytest.fixture
def load(
    overlay: Overlay, full_pristine: Pristine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Any:
    """A fresh module each call (its caches and what it said are its own), with a recording
    logger; the tables folder: tmp_path/tables (empty)."""
    monkeypatch.setenv("VLLM_PATCHSET_NVFP4_CONFIG_DIR", str(tmp_path / "tables"))
    (tmp_path / "tables").mkdir()

    def make(rocm: bool = False, device: str = DEVICE) -> tuple[kernels.FusedModule, Log]:
        log = Log()
        fused = kernels.overlay_fused(
            overlay, full_pristine, platform=cuda_platform(rocm, device), log=log
        )
        return fused, log

    return make


def entry(block_k: int = 128) -> dict[str, Any]:
    gemm = {"block_n": 32, "block_k": block_k, "num_warps": 2, "num_stages": 3}
    return {"naive": False, "block_m": 16, "fuse_a1_qdq": False, "w13": gemm, "w2": dict(gemm)}


def test_generic_table_without_a_file_said_once(load: Any) -> None:
    """A GPU without a table (none shipped, none in the folder): the generic table, said once
    however many layers ask."""
    fused, log = load(device="NVIDIA H100 80GB HBM3")
    module = fused.module
    for _ in range(3):
        assert module.nvfp4_moe_configs(*SHAPE) is module.GENERIC_CONFIGS["cuda"]
    h100 = "NVIDIA_H100_80GB_HBM3"
    assert log.lines == [
        (
            "info",
            f"NVFP4 emulation MoE (E=8 H=256 I=192, {h100}): no tuned tile table"
            f" (nvfp4_emulation_moe_tiles.E8_H256_I192.{h100}.json or"
            f" nvfp4_emulation_moe_tiles.{h100}.json); using the generic cuda table",
        )
    ]


def test_shipped_h200_table(load: Any, overlay: Overlay) -> None:
    """Patch 0002 ships the H200's table beside the module (its generic CUDA table, as data):
    an H200 without a table of its own for the shape takes it."""
    fused, log = load()
    module = fused.module
    shipped = overlay.project.overlay_dir / kernels.FUSED_KERNELS
    shipped = shipped.parent / DEVICE_FILE
    assert module.nvfp4_moe_configs(*SHAPE) == module.CUDA_CONFIGS
    assert module.parse_table(shipped.read_text(), "x") == module.CUDA_CONFIGS
    assert log.lines == [
        ("info", f"NVFP4 emulation MoE (E=8 H=256 I=192, NVIDIA_H200): tile table {shipped}")
    ]


def test_every_shipped_table_is_read(load: Any) -> None:
    """Every tile table file patch 0002 ships beside the module, read as the module reads it at
    load (a file it refused would stop the first layer of its shape on its GPU): the H200's (its
    table for any shape and 45 shapes') and the H100's, one for each released layer and shard of
    moe_setup.SHAPES (experts held, hidden, intermediate)."""
    module = load()[0].module
    files = sorted(Path(module.TABLES_DIR).glob(f"{module.TABLE_PREFIX}*.json"))
    for path in files:
        assert module.parse_table(path.read_text(), str(path))
        module.parse_predecode(path.read_text(), str(path))
    devices = Counter(path.name.split(".")[-2] for path in files)
    assert devices == {"NVIDIA_H200": 46, "NVIDIA_H100_80GB_HBM3": 49}
    h100 = sorted(path.name.split(".")[1] for path in files if "H100" in path.name)
    shapes = {f"E{s.held_experts}_H{s.hidden}_I{s.intermediate}" for s in moe_setup.SHAPES}
    assert h100 == sorted(shapes)


def test_a_partial_keep_of_every_shipped_table_is_the_sweep_of_its_counts(load: Any) -> None:
    """benchmarks/keep_faster_tables.py's partial keep, over every tile table patch 0002 ships
    (their real bucket layouts: keys the sweep adds, keys it replaces, predecode entries): a
    sweep of 1, 32 and 512 tokens over the shipped table (written as the tuner writes it, each
    swept count's key its pick), kept at some of those counts, is the table a sweep of those
    counts alone writes, key for key and in the same order; only its note says more."""
    import keep_faster_tables as keep

    module = load()[0].module
    files = sorted(Path(module.TABLES_DIR).glob(f"{module.TABLE_PREFIX}*.json"))
    generic = list(module.GENERIC_CONFIGS["cuda"].values())
    swept = (1, 32, 512)
    kept_sets = [(1,), (32,), (512,), (1, 32), (1, 512), (32, 512)]

    def sweep(shipped: dict, counts: tuple[int, ...], text: str, origin: str) -> dict:
        table = module.parse_table(text, origin)
        for count in counts:  # a pick unlike the shipped entry at its key
            table[count] = next(c for c in generic if c != table.get(count))
        notes = {"tuned": "a sweep", "torch": "t", "shapes": shipped.get("_shapes", "")}
        return json.loads(module.table_json(table, notes, module.parse_predecode(text, origin)))

    checked = 0
    for path in files:
        text = path.read_text()
        shipped = json.loads(text)
        swept_table = sweep(shipped, swept, text, str(path))
        for counts in kept_sets:
            got = keep.restored(path.name, swept_table, shipped, list(counts), set(swept))
            want = sweep(shipped, counts, text, str(path))
            assert list(got) == list(want), path.name
            assert {k: v for k, v in got.items() if k != "_tuned"} == {
                k: v for k, v in want.items() if k != "_tuned"
            }, (path.name, counts)
            back = " ".join(str(c) for c in swept if c not in counts)
            assert got["_tuned"] == (
                f"a sweep; benchmarks/keep_faster_tables.py kept the picks of"
                f" {' '.join(map(str, counts))} tokens (faster in the layer) and gave the"
                f" shipped entries back at {back}"
            )
            checked += 1
    assert checked == 6 * 95


def test_table_file_taken(load: Any, tmp_path: Path) -> None:
    fused, log = load()
    module = fused.module
    table = {1: module.MoeConfig(False, 16, False, module.GemmConfig(32, 128, 2, 3),
                                 module.GemmConfig(64, 128, 2, 3))}  # fmt: skip
    path = tmp_path / "tables" / FILE
    path.write_text(module.table_json(table, {"tuned": "test"}))
    assert module.nvfp4_moe_configs(*SHAPE) == table
    assert module.nvfp4_moe_configs(*SHAPE) == table
    assert log.lines == [("info", f"NVFP4 emulation MoE (E=8 H=256 I=192, NVIDIA_H200): tile"
                                  f" table {path}")]  # fmt: skip
    # A count above the last bound takes the last bucket.
    assert module.get_nvfp4_moe_config(4096, 8, 8, 8, table) == table[1]


def test_device_table_for_any_shape(load: Any, tmp_path: Path) -> None:
    fused, _ = load()
    (tmp_path / "tables" / DEVICE_FILE).write_text(json.dumps({"64": entry()}))
    assert list(fused.module.nvfp4_moe_configs(*SHAPE)) == [64]


def test_generic_tables_round_trip(load: Any) -> None:
    module = load()[0].module
    for table in module.GENERIC_CONFIGS.values():
        assert module.parse_table(module.table_json(table), "x") == table


def test_split_gate_up_in_a_table(load: Any) -> None:
    """w13's optional split_gate_up: read where a table has it, false where absent, and written
    only where true (the tables written before it read and write as they did)."""
    module = load()[0].module
    split = {"16": {**entry(), "w13": {**entry()["w13"], "split_gate_up": True}}}
    table = module.parse_table(json.dumps(split), "x")
    assert (table[16].w13.split_gate_up, table[16].w2.split_gate_up) == (True, False)
    assert json.loads(module.table_json(table)) == split
    plain = module.parse_table(json.dumps({"16": entry()}), "x")
    assert json.loads(module.table_json(plain)) == {"16": entry()}


def loaded_experts(fused: kernels.FusedModule, shape: tuple[int, int, int]) -> tuple[Any, ...]:
    """Experts of shape over zero weights and unit scales, their weights laid out by their own
    process_weights_after_loading (which reads the shape's tile table): (experts, w13, w2)."""
    e, h, i = shape
    experts = fused.experts(None, kernels.shaped_quant_config(e, h, i, scale=1.0))
    w13 = torch.zeros(e, 2 * i, h // 2, dtype=torch.uint8)
    w2 = torch.zeros(e, h, i // 2, dtype=torch.uint8)
    return (experts, *kernels.laid_out(experts, w13, w2))


K_STEP = (
    "; every tile walks K in steps of 128 (GEMM_BLOCK_K), whatever the token count: a token's"
    " output is then the same bits alone and in any batch"
)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"16": entry(64)}, "entry '16' w13: K step 64" + K_STEP),
        ({"16": {**entry(), "w2": entry(256)["w2"]}}, "entry '16' w2: K step 256" + K_STEP),
        ({"many": entry()}, "entry 'many': a bucket's key is its largest token count"),
        (
            {"16": {**entry(), "block_m": 12}},
            "entry '16': block_m must be a power of two, 8 or more",
        ),
        ({"_note": "only notes"}, "no token-count bucket"),
        (
            {"16": {**entry(), "w2": {**entry()["w2"], "split_gate_up": True}}},
            "entry '16' w2: split_gate_up is for the gated w13 GEMM",
        ),
        (
            {"16": {**entry(), "w13": {**entry()["w13"], "split_gate_up": 1}}},
            "entry '16' w13: split_gate_up is true or false",
        ),
    ],
)
def test_bad_table_refused_at_load(
    load: Any, tmp_path: Path, data: dict[str, Any], error: str
) -> None:
    """One error naming the file and the entry, when the experts' weights are loaded
    (process_weights_after_loading), before any forward."""
    fused, _ = load()
    path = tmp_path / "tables" / FILE
    path.write_text(json.dumps(data))
    with pytest.raises(fused.module.Nvfp4MoeTableError) as raised:
        loaded_experts(fused, SHAPE)
    assert str(raised.value) == f"{path}: {error}"


@pytest.mark.parametrize("forced", ["", "rocm", "cuda"])
def test_platform_switch(load: Any, monkeypatch: pytest.MonkeyPatch, forced: str) -> None:
    """On an NVIDIA GPU, VLLM_PATCHSET_NVFP4_PLATFORM=rocm takes ROCm's generic table and
    blocks of 16 tokens (its own table name: no H200 table applies)."""
    monkeypatch.setenv("VLLM_PATCHSET_NVFP4_PLATFORM", forced)
    fused, log = load()
    module = fused.module
    experts = fused.experts(None, kernels.quant_config(*[torch.ones(1)] * 6))
    platform = forced or "cuda"
    assert experts.platform == platform
    assert experts.min_block_m == {"cuda": 8, "rocm": 16}[platform]
    assert module.nvfp4_moe_configs(*SHAPE, experts.platform) == module.GENERIC_CONFIGS[platform]
    said = {
        "cuda": "NVIDIA_H200): tile table ",  # the H200's table, shipped beside the module
        "rocm": "rocm_generic): no tuned tile table",  # no H200 table applies
    }[platform]
    assert said in log.lines[0][1]


def test_platform_switch_refuses_other_names(load: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_PATCHSET_NVFP4_PLATFORM", "xpu")
    fused, _ = load()
    with pytest.raises(ValueError, match="VLLM_PATCHSET_NVFP4_PLATFORM='xpu': expected one of"):
        fused.module.nvfp4_platform()


# A shape whose depths are whole K steps (128): the predecoded GEMMs may run on it.
PREDECODE_SHAPE = (8, 256, 256)  # experts, hidden, intermediate
PREDECODE_FILE = "nvfp4_emulation_moe_tiles.E8_H256_I256.NVIDIA_H200.json"


def predecode_entry(pairs: int = 4) -> dict[str, Any]:
    """A predecode entry whose tiles are none of the generic ones."""
    return {
        "min_pairs_per_expert": pairs,
        "block_m": 32,
        "w13": {"block_n": 256, "block_k": 32, "num_warps": 4, "num_stages": 2},
        "w2": {"block_n": 48, "block_k": 16, "num_warps": 2, "num_stages": 4},
    }


@pytest.mark.parametrize("forced", ["", "rocm"])
def test_generic_predecode_without_an_entry(
    load: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forced: str
) -> None:
    """A shape without a table file, and one whose table file has no predecode entry (every
    table written before it): the platform's generic predecode."""
    monkeypatch.setenv("VLLM_PATCHSET_NVFP4_PLATFORM", forced)
    module = load()[0].module
    generic = module.GENERIC_PREDECODE[forced or "cuda"]
    assert module.nvfp4_predecode_config(*SHAPE) is generic
    device = "rocm_generic" if forced else "NVIDIA_H200"
    name = f"nvfp4_emulation_moe_tiles.E8_H256_I256.{device}.json"
    (tmp_path / "tables" / name).write_text(json.dumps({"64": entry()}))
    assert module.nvfp4_predecode_config(*PREDECODE_SHAPE) is generic
    assert list(module.nvfp4_moe_configs(*PREDECODE_SHAPE)) == [64]


def test_shipped_h200_predecode_entries(load: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch 0002's H200 tables carry a predecode entry for exactly the shapes of
    moe_setup.H200_PREDECODE (what tests/gpu/test_predecode.py expects on an H200), as it gives
    them; an H200 takes it for those shapes, another GPU and ROCm's configuration the generic."""
    module = load()[0].module
    h100 = load(device="NVIDIA H100 80GB HBM3")[0].module
    with_entry = {
        path.name
        for path in Path(module.TABLES_DIR).glob("nvfp4_emulation_moe_tiles.*.json")
        if "predecode" in json.loads(path.read_text())
    }
    sizes = {
        name: (shape.held_experts, shape.hidden, shape.intermediate)
        for name in moe_setup.H200_PREDECODE
        for shape in [moe_setup.shape_named(name)]
    }
    assert with_entry == {module.table_file_names(*s, "NVIDIA_H200")[0] for s in sizes.values()}
    for name, shape in sizes.items():
        assert module.nvfp4_predecode_config(*shape) == moe_setup.h200_predecode(module, name)
        assert h100.nvfp4_predecode_config(*shape) is h100.GENERIC_PREDECODE["cuda"]
    monkeypatch.setenv("VLLM_PATCHSET_NVFP4_PLATFORM", "rocm")
    rocm = load()[0].module
    for shape in sizes.values():
        assert rocm.nvfp4_predecode_config(*shape) is rocm.GENERIC_PREDECODE["rocm"]


def test_predecode_entry_round_trip(load: Any) -> None:
    """table_json writes a predecode entry as parse_predecode reads it, and parse_table reads
    the same file's buckets past it; the generic predecodes as entries."""
    module = load()[0].module
    data = {"64": entry(), "predecode": predecode_entry()}
    predecode = module.parse_predecode(json.dumps(data), "x")
    table = module.parse_table(json.dumps(data), "x")
    assert (predecode.min_pairs_per_expert, predecode.block_m) == (4, 32)
    assert (predecode.w13.block_n, predecode.w2.block_k) == (256, 16)
    assert json.loads(module.table_json(table, None, predecode)) == data
    assert module.parse_predecode(json.dumps({"64": entry()}), "x") is None
    for generic in module.GENERIC_PREDECODE.values():
        text = module.table_json(table, None, generic)
        assert module.parse_predecode(text, "x") == generic


@pytest.mark.parametrize(("pairs", "predecoded"), [(1, True), (4, True), (5, False)])
def test_predecode_entry_decides_and_tiles(
    load: Any, tmp_path: Path, pairs: int, predecoded: bool
) -> None:
    """A table's predecode entry replaces the platform's generic one for its shape: 8 tokens
    at top-4 over 8 experts are 4 routed pairs an expert, predecoded from a threshold of 1 or 4
    and not from 5; the predecoded GEMMs launch with the entry's block of pairs and tiles
    (recorded, not run), and the log names the entry with the table, once."""
    fused, log = load()
    module = fused.module
    path = tmp_path / "tables" / PREDECODE_FILE
    path.write_text(json.dumps({"64": entry(), "predecode": predecode_entry(pairs)}))
    experts, w13, w2 = loaded_experts(fused, PREDECODE_SHAPE)
    assert experts.predecode_config == module.parse_predecode(path.read_text(), "x")
    e, h, _ = PREDECODE_SHAPE
    ids = torch.stack([torch.randperm(e)[:4] for _ in range(8)]).int()
    with kernels.recording_launches() as launches:
        kernels.fused_apply(fused, experts, torch.zeros(8, h, dtype=torch.bfloat16), w13, w2,
                            torch.rand(8, 4), ids)  # fmt: skip
    names = [launch.kernel.fn.__name__ for launch in launches]
    if not predecoded:
        assert names.count("_nvfp4_moe_gemm_kernel") == 2 and "_nvfp4_predecode_kernel" not in names
        return
    assert names.count("_nvfp4_predecode_kernel") == 2 and "_nvfp4_moe_gemm_kernel" not in names
    gemms = [x for x in launches if x.kernel.fn.__name__ == "_predecoded_moe_gemm_kernel"]
    tiles = [
        (x.kwargs["GATED"], x.kwargs["BLOCK_M"], x.kwargs["BLOCK_N"], x.kwargs["BLOCK_K"],
         x.kwargs["num_warps"], x.kwargs["num_stages"])
        for x in gemms
    ]  # fmt: skip
    assert tiles == [(True, 32, 256, 32, 4, 2), (False, 32, 48, 16, 2, 4)]
    assert log.lines == [
        (
            "info",
            f"NVFP4 emulation MoE (E=8 H=256 I=256, NVIDIA_H200): tile table {path}, with its"
            " predecode entry",
        )
    ]


PREDECODE_FIELDS = "min_pairs_per_expert, block_m, w13, w2"
TILE_FIELDS = "block_n, block_k, num_warps, num_stages"
SAME_ORDER = (
    "; a predecoded product spans 16 to 64 columns and divides 64 (half a GEMM_BLOCK_K step):"
    " the fused kernel's order of sums, the same bits"
)


def bad_predecode_entries() -> list[tuple[Any, str]]:
    """Every way a predecode entry can be wrong, field by field: (the entry, the error after
    "<file>: entry 'predecode'")."""
    good = predecode_entry()
    cases: list[tuple[Any, str]] = [
        ([], f": expected an object with {PREDECODE_FIELDS}"),
        (None, f": expected an object with {PREDECODE_FIELDS}"),
        ({k: v for k, v in good.items() if k != "w2"}, f": expected an object with {PREDECODE_FIELDS}"),
        ({**good, "split": True}, f": expected an object with {PREDECODE_FIELDS}"),
    ]  # fmt: skip
    for bad in (0, -512, "512", 512.0, True, None):
        cases.append(({**good, "min_pairs_per_expert": bad},
                      ": min_pairs_per_expert must be a positive integer"))  # fmt: skip
    for bad in (8, 24, 0, -128, "128", 128.0, False):
        cases.append(({**good, "block_m": bad}, ": block_m must be a power of two, 16 or more"))
    for gemm in ("w13", "w2"):
        tile = good[gemm]
        cases.append(({**good, gemm: [1, 2]}, f" {gemm}: expected an object with {TILE_FIELDS}"))
        cases.append(({**good, gemm: {**tile, "split_gate_up": False}},
                      f" {gemm}: expected an object with {TILE_FIELDS}"))  # fmt: skip
        for field in ("block_n", "block_k", "num_warps", "num_stages"):
            for bad in (0, -16, "16", 16.0, True):
                cases.append(({**good, gemm: {**tile, field: bad}},
                              f" {gemm}: every field must be a positive integer"))  # fmt: skip
        for step in (128, 256, 48, 8, 96):
            cases.append(({**good, gemm: {**tile, "block_k": step}},
                          f" {gemm}: K step {step}" + SAME_ORDER))  # fmt: skip
    cases.append(({**good, "w13": {**good["w13"], "block_n": 64}},
                  " w13: block_n 64 is not a multiple of 128"))  # fmt: skip
    cases.append(({**good, "w2": {**good["w2"], "block_n": 24}},
                  " w2: block_n 24 is not a multiple of 16"))  # fmt: skip
    return cases


BAD_PREDECODE = bad_predecode_entries()


@pytest.mark.parametrize(("bad", "error"), BAD_PREDECODE, ids=range(len(BAD_PREDECODE)))
def test_bad_predecode_entry_refused_at_load(
    load: Any, tmp_path: Path, bad: Any, error: str
) -> None:
    """A predecode entry the predecoded GEMMs cannot take (a K step that would change the
    order of sums among them): one error naming the file and the entry when the weights are
    loaded, before any forward; the experts keep nothing of it."""
    fused, _ = load()
    path = tmp_path / "tables" / PREDECODE_FILE
    path.write_text(json.dumps({"64": entry(), "predecode": bad}))
    with pytest.raises(fused.module.Nvfp4MoeTableError) as raised:
        loaded_experts(fused, PREDECODE_SHAPE)
    assert str(raised.value) == f"{path}: entry 'predecode'{error}"


def test_every_depth_of_16_fuses(load: Any) -> None:
    """The shapes of released checkpoints and their shards take the fused path; depths that
    are not multiples of the NVFP4 block cannot exist in a checkpoint and do not."""
    supports = load()[0].module.supports_fused_nvfp4_moe
    for hidden, inter in [(2048, 192), (4096, 192), (2816, 704), (2688, 1856), (7168, 256),
                          (2704, 16), (16, 48), (5120, 1024)]:  # fmt: skip
        assert supports(hidden, inter), (hidden, inter)
    assert not supports(2048, 200) and not supports(2056, 192)


def test_tail_step_width(load: Any) -> None:
    """The masked K step over the last columns is as wide as the tail needs, a power of two
    from 32 (16 pairs of each parity, what a BF16 GEMM step takes), never wider than the K
    step; every depth of every checkpoint shard, and every tail a multiple of 16 can leave."""
    # The kernel module's, through a function the experts' module imports from it.
    width = load()[0].module.supports_fused_nvfp4_moe.__globals__["tail_width"]
    widths = {tail: width(tail, 128) for tail in range(0, 128, 16)}
    assert widths == {0: 128, 16: 32, 32: 32, 48: 64, 64: 64, 80: 128, 96: 128, 112: 128}
    # intermediate 192 (Qwen3 TP4 and TP8 shards, MiniMax TP8), 176 (Gemma-4 TP4), 704, 1856,
    # 64 (Qwen3.6 TP8), 928 (Nemotron TP2): 64, 64, 64, 64, 64, 32.
    assert [width(i % 128, 128) for i in (192, 176, 704, 1856, 64, 928)] == [64] * 5 + [32]


def test_unfused_path_said_once_with_why(load: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """FP32 hidden states take the unfused path: said once (one layer, two calls; a second
    layer of the same shape and reason adds no line), with the reason and the shapes."""
    fused, log = load()
    e, h, i = SHAPE
    taken = []
    fused.experts._apply_dequantized = lambda self, *args: taken.append(1)  # type: ignore[attr-defined]
    # The finalize's top-k sum is a Triton launch (no driver here); the log is what counts.
    monkeypatch.setattr(fused.module, "invoke_topk_sum", lambda *args, **kwargs: None)
    config = kernels.quant_config(*[torch.ones(1)] * 6)
    w13 = torch.zeros(e, 2 * i, h // 2, dtype=torch.uint8)
    w2 = torch.zeros(e, h, i // 2, dtype=torch.uint8)
    hidden = torch.zeros(3, h)
    ids = torch.zeros(3, 2, dtype=torch.int32)
    for _ in range(2):
        experts = fused.experts(None, config)
        for _ in range(2):
            kernels.fused_apply(fused, experts, hidden, w13, w2, torch.ones(3, 2), ids)
    assert len(taken) == 4
    assert log.lines == [
        (
            "warning",
            "NVFP4 emulation MoE (w13 (8, 384, 128), w2 (8, 256, 96)): torch.float32"
            " activations (the fused path takes BF16 or FP16); this layer takes vLLM 0.24.0's"
            " unfused path (every expert's weights dequantized on every call: slow)",
        )
    ]


@pytest.mark.parametrize("depth", [16, 48, 128, 144, 192, 704, 2704])
def test_tiled_layout_at_ragged_depths(load: Any, depth: int) -> None:
    """The tiled layout the kernel addresses (TILED): byte c of row n at
    (n // 16) * 16 * C + (c // W) * 16 * W + (n % 16) * w + c % W, where C = depth // 2 bytes a
    row, W = 64 (128 weights) and w = W, or C % W in the last, narrower tile of a row block
    (no padding). Untiled, the checkpoint's rows again, byte for byte: what the unfused path
    dequantizes."""
    module = load()[0].module
    relayout = module.tile_nvfp4_weights.__globals__["_relayout"]  # the kernels module's
    rows, c, width = 32, depth // 2, 64
    index = torch.arange(rows * c, dtype=torch.int32).view(1, rows, c)
    tiled = index.clone()
    relayout(tiled, width, to_tiles=True)
    n = torch.arange(rows)[:, None]
    col = torch.arange(c)[None, :]
    full = c - c % width
    w = torch.where(col < full, width, c - full)
    where = (n // 16) * 16 * c + (col // width) * 16 * width + (n % 16) * w + col % width
    assert torch.equal(tiled.flatten()[where.flatten()], index.flatten())
    back = tiled.clone()
    relayout(back, width, to_tiles=False)
    assert torch.equal(back, index)
    # The experts' own copies back (untiled_nvfp4_weights), weights and block scales.
    packed = torch.randint(0, 256, (2, rows, c), dtype=torch.uint8)
    scales = torch.randint(0, 256, (2, rows, depth // 16), dtype=torch.uint8)
    laid = packed.clone(), scales.clone().view(torch.float8_e4m3fn)
    module.tile_nvfp4_weights(*laid)
    assert depth <= 128 or not torch.equal(laid[0], packed)  # one tile a row block: rows
    again = module.untiled_nvfp4_weights(*laid)
    assert torch.equal(again[0], packed) and torch.equal(again[1].view(torch.uint8), scales)


def test_whole_steps_in_the_gemm_order(load: Any) -> None:
    """Each whole K step's nibbles in the order the GEMM steps multiply (step_order,
    order_steps; the kernel's _step_k): byte j pairs k and k + 8 of one block scale, k =
    64q + 16t + 4i + 2b + c for j = 32q + 16b + 4t + 2i + c; a last narrower step keeps the
    checkpoint's pairs (k, k + 1); back to the checkpoint's bytes exactly."""
    kernels_module = load()[0].module.tile_nvfp4_weights.__globals__  # the kernels module's
    order, order_steps = kernels_module["step_order"](), kernels_module["order_steps"]
    assert sorted(order.tolist()) == list(range(128))
    low, high = order[0::2], order[1::2]
    assert torch.equal(high, low + 8) and torch.equal(low // 16, high // 16)
    assert low[:20].tolist() == [0, 1, 4, 5, 16, 17, 20, 21, 32, 33, 36, 37, 48, 49, 52, 53, 2,
                                 3, 6, 7]  # fmt: skip
    assert low[32:36].tolist() == [64, 65, 68, 69]
    depth = 2704  # 21 whole steps and a last one of 16 columns
    packed = torch.randint(0, 256, (2, 32, depth // 2), dtype=torch.uint8)
    ordered = packed.clone()
    order_steps(ordered, to_gemm=True)
    nibbles = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)  # [.., k]
    steps = nibbles[..., : 21 * 128].unflatten(-1, (21, 128))[..., order]
    assert torch.equal(
        ordered[..., : 21 * 64], (steps[..., 0::2] | steps[..., 1::2] << 4).flatten(-2)
    )
    assert torch.equal(ordered[..., 21 * 64 :], packed[..., 21 * 64 :])
    order_steps(ordered, to_gemm=False)
    assert torch.equal(ordered, packed)


def test_experts_output_is_per_pair_and_the_finalize_sums_it(
    load: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The experts' output is [M, top_k, K] (FusedMoEKernel lays it over workspace13, which is
    no smaller; the workspaces are TritonExperts'), and their finalize is the top-k sum into
    the layer's output: one launch, none for a rank that no token reached. Under all-to-all
    kernels, TritonExperts' output and finalize."""
    fused, _ = load()
    e, h, i = SHAPE
    experts = fused.experts(None, kernels.quant_config(*[torch.ones(1)] * 6))
    shapes = experts.workspace_shapes(5, 2 * i, h, 3, e, e, None, fused.silu)
    assert shapes == ((5, 3, 256), (5, 3, 384), (5, 3, 256))
    reduce = experts.finalize_weight_and_reduce_impl()
    assert type(reduce).__name__ == "Nvfp4TopKSum" and reduce == fused.module.Nvfp4TopKSum(
        experts.pdl
    )
    sums: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    monkeypatch.setattr(
        fused.module,
        "invoke_topk_sum",
        lambda x, out, pdl: sums.append((tuple(x.shape), tuple(out.shape))),
    )
    # Under all-to-all kernels: TritonExperts' output and finalize (the experts reduce).
    all2all = fused.experts(kernels.ALL2ALL_MOE_CONFIG, kernels.quant_config(*[torch.ones(1)] * 6))
    assert all2all.workspace_shapes(5, 2 * i, h, 3, e, e, None, fused.silu)[2] == (5, h)
    assert type(all2all.finalize_weight_and_reduce_impl()).__name__ == "CopyToOutput"
    output = torch.zeros(5, h)
    assert reduce.apply(output, torch.zeros(5, 3, h), None, torch.zeros(5, 3), False) is output
    made = reduce.apply(None, torch.zeros(15, h), None, torch.zeros(5, 3), False)
    assert made.shape == (5, h)
    assert reduce.apply(None, torch.zeros(0, h), None, torch.zeros(0, 3), False).shape == (0, h)
    assert sums == [((5, 3, h), (5, h)), ((5, 3, h), (5, h))]


def test_unfused_result_comes_through_the_finalize_exactly(
    load: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unfused fallback (0.24.0's path, which reduces over the slots itself) lays its
    [M, K] result in slot 0 of the experts' per-pair output and zeros in the others; the
    finalize's slot-order sum (here in torch, as the kernel sums: FP32, rounded once) gives it
    back exactly, but for the sign of a zero (-0.0 + 0.0 is +0.0)."""
    fused, _ = load()
    e, h, i = SHAPE
    result = torch.randn(3, h)  # the hidden states' dtype, FP32 here
    result[0, :4] = torch.tensor([0.0, -0.0, -1.5, 3.0e38])

    def unfused(self: Any, output: torch.Tensor, *args: Any) -> None:
        output.copy_(result)

    def topk_sum(x: torch.Tensor, out: torch.Tensor, pdl: bool) -> None:
        out.copy_(x.float().sum(dim=1).to(out.dtype))

    fused.experts._apply_dequantized = unfused  # type: ignore[attr-defined]
    monkeypatch.setattr(fused.module, "invoke_topk_sum", topk_sum)
    experts = fused.experts(None, kernels.quant_config(*[torch.ones(1)] * 6))
    w13 = torch.zeros(e, 2 * i, h // 2, dtype=torch.uint8)
    w2 = torch.zeros(e, h, i // 2, dtype=torch.uint8)
    hidden = torch.zeros(3, h)  # FP32: the unfused path
    ids = torch.zeros(3, 4, dtype=torch.int32)
    got = kernels.fused_apply(fused, experts, hidden, w13, w2, torch.ones(3, 4), ids)
    assert torch.equal(got, result)
    assert torch.equal(got.view(torch.int32)[:, 2:], result.view(torch.int32)[:, 2:])
    assert got[0, 1].item() == 0.0 and not got[0, 1].signbit()


def test_tuner_times_every_token_block_it_may_pick() -> None:
    """benchmarks/tune_nvfp4_moe.py: every token block a group may pick is aligned for each case
    and has candidate tiles for both GEMMs (blocks of 128 tokens, in the 8192-token groups, had
    no alignment, and every such timing failed with a KeyError the sweep recorded as inf); the
    default sweep is the buckets' counts, and 2048 and 8192 are counts --tokens may name."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import tune_nvfp4_moe as tune

    assert tune.BLOCK_MS == [8, 16, 32, 64, 128]
    assert set(tune.BLOCK_MS) <= set(tune.W13) and set(tune.BLOCK_MS) <= set(tune.W2)
    assert tune.SWEPT == [1, 8, 32, 128, 256, 512]
    assert sorted(tune.GROUPS) == [*tune.SWEPT, 2048, 8192]
    assert all(bm in (32, 64, 128) for t in (2048, 8192) for bm, _, _ in tune.GROUPS[t])


def test_tuner_keeps_where_a_table_came_from(
    load: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """benchmarks/tune_nvfp4_moe.py, sweeping some token counts, keeps a shipped table's other
    buckets and says so: the written file's "_tuned" note is the shipped file's, then the sweep
    with its options; a shape without a table of its own names the GPU's file it came from."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import tune_nvfp4_moe as tune

    fused, _ = load()
    monkeypatch.setattr(tune, "K", fused.module, raising=False)
    monkeypatch.setattr(tune, "device_name", lambda: "NVIDIA_H200")
    folder = Path(fused.module.TABLES_DIR)
    own = tune.shape_named("qwen3-30b-a3b-tp8")  # ships E128_H2048_I96's table
    shipped = folder / "nvfp4_emulation_moe_tiles.E128_H2048_I96.NVIDIA_H200.json"
    table, origin = tune.shipped_table(own)
    assert origin == json.loads(shipped.read_text())["_tuned"]
    parsed = fused.module.parse_table(shipped.read_text(), "x")
    assert table == {bound: tune.config_tuple(c) for bound, c in parsed.items()}

    other = tune.shape_named("qwen3-235b-a22b-tp2")  # no table of its own: the H200's
    device_note = json.loads((folder / DEVICE_FILE).read_text())["_tuned"]
    assert tune.shipped_table(other)[1] == f"{DEVICE_FILE} ({device_note})"

    sweep = "benchmarks/tune_nvfp4_moe.py --wide --tokens 32 on NVIDIA H200"
    assert tune.sweep_note(sweep, None) == sweep
    notes = {own.name: {"tuned": tune.sweep_note(sweep, origin), "torch": "t"}}
    (written,) = tune.write_tables(tmp_path, {own.name: table}, notes)
    assert written.name == shipped.name
    text = json.loads(written.read_text())
    assert text["_tuned"] == (
        f"{origin}; then {sweep}: the buckets of the token counts swept are its picks"
    )
    assert (text["_torch"], text["_shapes"]) == ("t", own.name)
    assert fused.module.parse_table(written.read_text(), "x") == parsed


@pytest.mark.parametrize("forced", ["", "rocm"])
def test_tuner_names_tables_as_the_module_reads_them(
    load: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, forced: str
) -> None:
    """benchmarks/tune_nvfp4_moe.py names the files it writes as the kernel module names the
    ones it reads (its device_table_name): on an H200 NVIDIA_H200, and with ROCm's
    configuration forced there rocm_generic, where the tables shipped for the H200 do not
    apply and a shape's table starts from ROCm's generic one. A table it writes is the one the
    module then takes."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import tune_nvfp4_moe as tune

    monkeypatch.setenv("VLLM_PATCHSET_NVFP4_PLATFORM", forced)
    module = load()[0].module
    monkeypatch.setattr(tune, "K", module, raising=False)
    assert tune.device_name() == ("rocm_generic" if forced else "NVIDIA_H200")
    shape = tune.shape_named("qwen3-30b-a3b-tp8")  # ships an H200 table of its own
    table, origin = tune.shipped_table(shape)
    if forced:
        assert origin == "the generic rocm table"
        assert table == {b: tune.config_tuple(c) for b, c in module.ROCM_CONFIGS.items()}
    (written,) = tune.write_tables(tmp_path / "tables", {shape.name: table}, {shape.name: {}})
    e, h, i = tune.held_experts(shape), shape.hidden, shape.intermediate
    assert written.name == module.table_file_names(e, h, i, tune.device_name())[0]
    assert module.nvfp4_moe_configs(e, h, i) == tune.moe_configs(table)


def test_tuner_tables_for_a_layer_named_by_its_sizes(
    load: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A checkpoint no shape of the table has (--shapes e<E>-h<H>-i<I>-k<top-k>[-ep<N>]): the
    tuner starts from the GPU's table for any shape (the H200's here) and writes the file the module then takes for
    that layer, named for the experts this GPU holds; sizes of no layer stop in one line."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import tune_nvfp4_moe as tune

    module = load()[0].module
    monkeypatch.setattr(tune, "K", module, raising=False)
    shape = tune.shape_named("e64-h3584-i1280-k6-ep4")
    table, origin = tune.shipped_table(shape)
    assert origin.startswith("nvfp4_emulation_moe_tiles.NVIDIA_H200.json (")  # any shape's
    assert table == {b: tune.config_tuple(c) for b, c in module.CUDA_CONFIGS.items()}
    (written,) = tune.write_tables(tmp_path / "tables", {shape.name: table}, {shape.name: {}})
    assert written.name == "nvfp4_emulation_moe_tiles.E16_H3584_I1280.NVIDIA_H200.json"
    monkeypatch.setenv(module.CONFIG_DIR_ENV, str(tmp_path / "tables"))
    assert module.nvfp4_moe_configs(16, 3584, 1280) == tune.moe_configs(table)
    with pytest.raises(SystemExit) as exc:
        tune.shape_named("e64-h3584-i1280-k65")
    assert str(exc.value) == "--shapes: e64-h3584-i1280-k65: top-k is 1 to the 64 experts"
    with pytest.raises(SystemExit) as exc:
        tune.shape_named("nope")
    assert str(exc.value).startswith("--shapes: unknown MoE shape 'nope'; known: qwen3-30b-a3b,")


def test_tuner_times_only_the_blocks_the_platform_runs(
    load: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks/tune_nvfp4_moe.py with ROCm's configuration forced times no block of 8 tokens
    (the module raises it to 16 there: such a timing would be of a tile that never runs), and
    every bucket keeps groups to pick from; on CUDA every group stays."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import tune_nvfp4_moe as tune

    shape = tune.shape_named("qwen3-30b-a3b")
    for forced, least in (("", 8), ("rocm", 16)):
        monkeypatch.setenv("VLLM_PATCHSET_NVFP4_PLATFORM", forced)
        module = load()[0].module
        monkeypatch.setattr(tune, "GROUPS", {t: list(g) for t, g in tune.GROUPS.items()})
        monkeypatch.setattr(tune, "BUCKETS", dict(tune.BUCKETS))
        everything = tune.all_tasks([shape], tune.SWEPT)
        tune.keep_blocks_from(module.platform_min_block_m())
        tasks = tune.all_tasks([shape], tune.SWEPT)
        assert min(task[3] for task in tasks) == least
        assert all(groups for _, groups in tune.BUCKETS.values())
        assert tasks == [task for task in everything if task[3] >= least]
        assert (len(tasks) == len(everything)) is (least == 8)


def test_tuner_writes_and_keeps_predecode_entries(
    load: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """benchmarks/tune_nvfp4_moe.py writes a shape's predecode entry beside its buckets (as
    --predecode does), reads the entry of the table it replaces (shipped_predecode: what a
    sweep of buckets keeps), and none where that table has none (every shipped H200 table)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import tune_nvfp4_moe as tune

    module = load()[0].module
    monkeypatch.setattr(tune, "K", module, raising=False)
    monkeypatch.setattr(tune, "device_name", lambda: "NVIDIA_H200")
    own = tune.shape_named("qwen3-30b-a3b-tp8")
    assert tune.shipped_predecode(own) is None
    table, origin = tune.shipped_table(own)
    entry = tune.predecode_config(tune.PREDECODE_NEVER, tune.PREDECODE_TILES[4])
    notes = {own.name: {"tuned": f"{origin}; then a sweep: its predecode entry"}}
    (written,) = tune.write_tables(tmp_path, {own.name: table}, notes, {own.name: entry})
    text = written.read_text()
    assert module.parse_predecode(text, "x") == entry
    assert json.loads(text)["predecode"] == {
        "min_pairs_per_expert": 1 << 40,
        "block_m": 128,
        "w13": {"block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 3},
        "w2": {"block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 3},
    }
    assert module.parse_table(text, "x") == tune.moe_configs(table)
    monkeypatch.setattr(module, "TABLES_DIR", str(tmp_path))
    assert tune.shipped_predecode(own) == entry
    assert tune.shipped_table(own) == (table, notes[own.name]["tuned"])
    # Every candidate is an entry the kernel module takes.
    for tiles in tune.PREDECODE_TILES:
        config = tune.predecode_config(512, tiles)
        text = module.table_json(tune.moe_configs(table), None, config)
        assert module.parse_predecode(text, "x") == config


def test_tuner_aligns_as_vllms_wrapper(full_pristine: Pristine) -> None:
    """benchmarks/tune_nvfp4_moe.py aligns an expert-parallel rank's pairs as vLLM 0.24.0's
    moe_align_block_size wrapper does for the experts (its own Python over the stand-in op):
    every pair in a block, other ranks' blocks named -1, so that w2 writes those pairs as
    zeros. (It passed the map to the op, which drops those pairs: their rows of the per-pair
    output were never written, and the tuner's check of its picks summed garbage.)"""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import tune_nvfp4_moe as tune

    ops = types.SimpleNamespace(moe_align_block_size=standins.moe_align_block_size)
    wrapper = kernels.load(
        full_pristine.root / kernels.ALIGN,
        {
            "vllm._custom_ops": ops,
            "vllm.utils.math_utils.round_up": lambda x, m: (x + m - 1) // m * m,
        },
    ).moe_align_block_size
    emap = torch.tensor([-1, 0, -1, 1, -1, -1, 2, -1], dtype=torch.int32)  # 3 of 8 experts held
    ids = torch.tensor([[1, 2], [3, 6], [0, 1], [5, 3], [6, 7]], dtype=torch.int32)
    for block_m in (2, 4):
        got = tune.align(ids, block_m, 8, emap)
        want = wrapper(ids, block_m, 8, emap)
        blocks = int(want[2].item()) // block_m
        assert int(got[2].item()) == int(want[2].item())
        assert torch.equal(got[0][: blocks * block_m], want[0][: blocks * block_m])
        assert torch.equal(got[1][:blocks], want[1][:blocks])
        # Every pair is in a block; the -1 blocks hold exactly the other ranks' pairs.
        kept = got[0][: blocks * block_m].view(blocks, block_m)
        pairs = kept[kept < ids.numel()]
        assert sorted(pairs.tolist()) == list(range(ids.numel()))
        other = kept[got[1][:blocks] == -1]
        assert sorted(other[other < ids.numel()].tolist()) == [1, 4, 6, 9]


def test_tuner_pick_line_names_the_ep_rank() -> None:
    """benchmarks/tune_nvfp4_moe.py prints each pick as the 2026-12-03 sweep logged it, and an
    expert-parallel shape's pick with the rank it was timed on (moe_setup.busiest_rank) and how
    many of that rank's experts the tokens route."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import tune_nvfp4_moe as tune

    pick = dict(bucket=64, shape="qwen3-30b-a3b-tp2", tokens=32, naive=False, block_m=8,
                qdq_a=False, w13=(64, 128, 4, 3), w2=(64, 128, 2, 4), gemms_us=69.5,
                rel_err=1.2e-05)  # fmt: skip
    assert tune.pick_line(pick) == (
        "<=                  64 qwen3-30b-a3b-tp2  t=  32 naive=0 bm=8 qdq=0 w13 (64, 128, 4, 3)"
        " w2 (64, 128, 2, 4): both GEMMs    69.5 us, rel err 1.2e-05"
    )
    ep = dict(pick, bucket=1, shape="deepseek-r1-ep8", tokens=1, naive=True, rank=6,
              active_experts=2)  # fmt: skip
    assert tune.pick_line(ep) == (
        "<=                   1 deepseek-r1-ep8    t=   1 naive=1 bm=8 qdq=0 w13 (64, 128, 4, 3)"
        " w2 (64, 128, 2, 4): both GEMMs    69.5 us, rel err 1.2e-05 (EP rank 6: 2 experts"
        " routed)"
    )


def test_tuner_refuses_picks_off_exact_w4a4() -> None:
    """benchmarks/tune_nvfp4_moe.py checks each pick's layer against exact W4A4 and writes no
    table where one is off by REL_FROBENIUS or more (NaN included), in one line naming them; an
    expert-parallel rank whose tokens' experts are all elsewhere must give exact zeros."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import tune_nvfp4_moe as tune

    want = torch.tensor([[3.0, 4.0]])
    assert tune.pick_error(want.to(torch.bfloat16), want) == 0.0
    assert tune.pick_error(torch.tensor([[3.0, 4.25]]), want) == torch.tensor(0.05).item()
    zeros = torch.zeros(1, 2)
    assert tune.pick_error(zeros, zeros) == 0.0
    assert tune.pick_error(torch.tensor([[0.0, 1e-30]]), zeros) == math.inf

    def pick(shape: str, rel: float) -> dict[str, Any]:
        return {"shape": shape, "tokens": 32, "rel_err": rel}

    tune.refuse_wrong_picks([pick("a", 0.0), pick("b", 0.0099)])
    with pytest.raises(SystemExit) as stop:
        tune.refuse_wrong_picks([pick("a", 0.0), pick("b", 3.9), pick("c", math.nan)])
    assert str(stop.value) == (
        "tune_nvfp4_moe: picks off exact W4A4 by 0.01 or more: b at 32 tokens (3.9e+00),"
        " c at 32 tokens (nan); no table written (the sweep's timings are in tune.json)"
    )


def test_the_bench_names_the_tiles_apply_launches(load: Any, tmp_path: Path) -> None:
    """bench_nvfp4_moe.tiles_taken (each row's ``tiles``, by which keep_faster_tables leaves
    out the counts a table does not change) names what the experts' apply launches, at every
    token count from 1 to 16 over a table of two buckets and a predecode entry (from 4 pairs an
    expert: 8 tokens at top-4 over 8 experts): "predecode" where it predecodes, else the
    bucket's block of pairs and each GEMM's tiles."""
    fused, _ = load()
    small = {**entry(), "block_m": 8}
    small["w13"] = {"block_n": 16, "block_k": 128, "num_warps": 1, "num_stages": 4}
    table = {"4": small, "64": entry(), "predecode": predecode_entry(4)}
    (tmp_path / "tables" / PREDECODE_FILE).write_text(json.dumps(table))
    experts, w13, w2 = loaded_experts(fused, PREDECODE_SHAPE)
    e, h, i = PREDECODE_SHAPE
    shape = types.SimpleNamespace(experts=e, held_experts=e, hidden=h, intermediate=i, top_k=4)
    seen = []
    for tokens in range(1, 17):
        ids = torch.stack([torch.randperm(e)[:4] for _ in range(tokens)]).int()
        with kernels.recording_launches() as launches:
            kernels.fused_apply(fused, experts, torch.zeros(tokens, h, dtype=torch.bfloat16),
                                w13, w2, torch.rand(tokens, 4), ids)  # fmt: skip
        taken = bench.tiles_taken(experts, shape, tokens)
        assert taken is not None
        names = [launch.kernel.fn.__name__ for launch in launches]
        if "_nvfp4_predecode_kernel" in names:
            assert taken.startswith("predecode ")
            seen.append((tokens, "predecode"))
            continue
        gemms = [x.kwargs for x in launches if x.kernel.fn.__name__ == "_nvfp4_moe_gemm_kernel"]
        assert len(gemms) == 2 and f"block_m={gemms[0]['BLOCK_M']}," in taken
        for gemm, kw in zip(("w13", "w2"), gemms, strict=True):
            tile = f"block_n={kw['BLOCK_N']}, block_k=128, num_warps={kw['num_warps']}"
            assert f"{gemm}=GemmConfig({tile}, num_stages={kw['num_stages']}" in taken
        seen.append((tokens, f"block_m={gemms[0]['BLOCK_M']} w13 {gemms[0]['BLOCK_N']}"))
    assert seen == [
        *((t, "block_m=8 w13 16") for t in range(1, 5)),
        *((t, "block_m=16 w13 32") for t in range(5, 8)),
        *((t, "predecode") for t in range(8, 17)),
    ]
