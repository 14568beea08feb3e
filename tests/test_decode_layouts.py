"""benchmarks/decode_layouts.py: the search's exact answers (no order for a decode of 11 or 14
instructions per word, one of 15), the found order decoding as the shipped PTX does on every
word, a wrong order refused, and the tree it writes differing from the overlay in the PTX alone."""

from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path

import pytest
from support import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import decode_layouts as dl


@pytest.fixture(scope="module")
def found() -> dl.Layout:
    regs = dl.three_rotations()
    assert regs is not None
    return dl.layout(regs)


def test_no_order_takes_fewer_than_fifteen() -> None:
    assert dl.mask_only() is False
    assert dl.one_in_place() is False


def test_found_order_takes_fifteen(found: dl.Layout) -> None:
    assert (found.rotations(), len(found.registers), found.total()) == (3, 4, 15)
    assert found.ptx().count("\n") + 1 == 2 + 3 + 4 * 3 + 1


def test_found_order_decodes_as_shipped(found: dl.Layout) -> None:
    dl.checked(found)
    words = random.Random(0).choices(range(1 << 32), k=2000)
    assert [found.decode(found.store(w)) for w in words] == [dl.shipped(w) for w in words]


def test_shipped_model_is_e2m1() -> None:
    # Code 0b1011 (sign, exponent 01, mantissa 1) in byte 1's low nibble: register 0, lane 1.
    assert dl.shipped(0x0B << 8) == [0x80C0 << 16, 0, 0, 0]


def test_wrong_order_refused(found: dl.Layout) -> None:
    order = list(found.order)
    order[0], order[1] = order[1], order[0]
    with pytest.raises(ValueError, match="decodes otherwise than shipped"):
        dl.checked(dataclasses.replace(found, order=order))


def test_tree_differs_in_the_ptx_alone(found: dl.Layout, tmp_path: Path) -> None:
    tree = dl.write_tree(found, tmp_path)
    shipped = (REPO / "overlay" / "vllm" / dl.KERNELS).read_text().splitlines()
    written = (tree / dl.KERNELS).read_text().splitlines()
    start = next(i for i, line in enumerate(shipped) if "prmt.b32 t0" in line) - 2
    end = start + shipped[start:].index("        }") + 1
    assert written[:start] == shipped[:start]
    assert written[start : start + 18] == ["        " + line for line in found.ptx().splitlines()]
    assert written[start + 18 :] == shipped[end:]


def test_tree_over_a_vllm_refused_before_anything_is_written(tmp_path: Path) -> None:
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "keep.py").write_text("x = 1\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"vllm exists; give --tree a folder without vllm/"):
        dl.main(["--tree", str(tmp_path), "--out", str(out)])
    assert [p.name for p in (tmp_path / "vllm").iterdir()] == ["keep.py"]
    assert (tmp_path / "vllm" / "keep.py").read_text() == "x = 1\n"
    assert not out.exists()
    assert not list(tmp_path.glob(".vllm*"))


def test_out_that_is_a_file_refused_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "file"
    out.write_text("kept\n")
    with pytest.raises(SystemExit, match=rf"^decode_layouts: File exists: {out}$"):
        dl.main(["--out", str(out)])
    assert out.read_text() == "kept\n"
