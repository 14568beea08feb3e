"""How few instructions patch 0002's PTX decode can take for eight weights (one 32-bit word of
E2M1 codes), and a stored bit order that takes fewer than the shipped 18; on the CPU, nothing
timed, no GPU.

    python benchmarks/decode_layouts.py [--tree DIR] [--out DIR]

The decode forms four BF16x2 registers, each 16-bit lane holding one weight's E2M1 code at the
bits it decodes from: sign at bit 15, exponent at bits 8..7, mantissa at bit 6 (mask
0x81C081C0), then multiplies each by its block scales (`mul.rn.bf16x2`, four a word whatever
the order). The shipped decode spreads the word's bytes over 16-bit lanes (two `prmt`), and per
register masks one nibble a lane, moves its sign and its three other bits with one multiply
and masks again: 2 + 4 * 3 = 14 before the four multiplies, 18 in all.

The tiled layout is the patch's own (written at load), so the bits of a word may be stored in
any order. The family searched here: registers that are the stored word rotated (`shf.r.wrap`,
one instruction each but the word itself), bytes picked from two of them (`prmt`, one a register,
none where one rotation already has the register's bytes in place) and one mask (`and`). Each
register takes one lane's sign and exponent's high bit from bits 7 and 0 of one byte, and its
exponent's low bit and mantissa from bits 7 and 6 of another: 16 bytes' bit 7 in all, and a
register has 4 bytes, so at least four registers (three rotations). The search gives:
- with the mask alone (four rotations, no `prmt`): no order of the bits exists;
- with three rotations and no more than two registers per `prmt`: orders exist, and none with a
  register taken without `prmt`: 3 + 4 + 4 = 11 before the multiplies, **15 in all**.
Prints one such order, the decode's PTX and the stored position of each checkpoint bit, and
checks on the word of each single bit (every output bit is a copy of one stored bit or 0, so
those 32 words prove it for all) that it gives the shipped decode's registers bit for bit.

--tree DIR writes DIR/vllm (never over one: an existing DIR/vllm is refused), the built
overlay (overlay/vllm) with that PTX instead of the shipped one, for `isa_facts.py --overlay
DIR/vllm` to compile (a decode whose load-time permutation is not written: for counting
instructions, not for running).

Output: the table on stdout and ``decode_layouts.md`` under --out.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import stops
from upstream_graft import GraftError, staged

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results"
KERNELS = Path("model_executor/layers/fused_moe/experts/nvfp4_emulation_kernels.py")
MASK = 0x81C081C0
SHIPPED_PTX = 18


@dataclass(frozen=True)
class Pick:
    """Byte ``byte`` of the word rotated right by ``rotation``, as a register's byte: ``high``
    (its bits 7 and 0 give a lane's bits 15 and 8) or low (bits 7 and 6 give bits 7 and 6)."""

    rotation: int
    byte: int
    high: bool

    def stored(self) -> tuple[int, int]:
        """The stored word's bits of (bit 7, bit 0 or 6) of this byte."""
        at = 8 * self.byte + self.rotation
        return (at + 7) % 32, (at + (0 if self.high else 6)) % 32


# One register: lane 0's low and high byte, lane 1's low and high byte.
Register = tuple[Pick, Pick, Pick, Pick]


def covers(rotations: tuple[int, ...], taken: frozenset[int]) -> Iterator[list[Pick]]:
    """Every set of picks from these rotations whose bits are the stored word's bits not
    ``taken``, each once (the lowest free bit first)."""
    picks = [Pick(r, b, h) for r in rotations for b in range(4) for h in (True, False)]

    def walk(used: frozenset[int], chosen: list[Pick]) -> Iterator[list[Pick]]:
        if len(used) == 32:
            yield list(chosen)
            return
        free = min(set(range(32)) - used)
        for pick in picks:
            bits = set(pick.stored())
            if free in bits and not bits & used:
                yield from walk(used | bits, [*chosen, pick])

    yield from walk(taken, [])


def registers(picks: list[Pick]) -> Iterator[list[Register]]:
    """The picks grouped into registers of two high and two low bytes from at most two
    rotations (what one `prmt` takes)."""
    high = [p for p in picks if p.high]
    low = [p for p in picks if not p.high]
    if len(high) != len(low):
        return

    def walk(high: list[Pick], low: list[Pick], done: list[Register]) -> Iterator[list[Register]]:
        if not high:
            yield list(done)
            return
        for h1 in high[1:]:
            for l0, l1 in itertools.combinations(low, 2):
                if len({high[0].rotation, h1.rotation, l0.rotation, l1.rotation}) <= 2:
                    rest_h = [p for p in high[1:] if p != h1]
                    rest_l = [p for p in low if p not in (l0, l1)]
                    yield from walk(rest_h, rest_l, [*done, (l0, high[0], l1, h1)])

    yield from walk(high, low, [])


def in_place(rotation: int) -> frozenset[int]:
    """The stored bits a rotation's own bytes give a register with no `prmt`."""
    return frozenset((b + rotation) % 32 for b in (6, 7, 8, 15, 22, 23, 24, 31))


def mask_only() -> bool:
    """Whether four rotations' registers, masked alone, can take every stored bit once."""
    for rotations in itertools.combinations(range(32), 4):
        bits = [in_place(r) for r in rotations]
        if len(frozenset().union(*bits)) == 32:
            return True
    return False


def fits(rotations: tuple[int, ...], taken: frozenset[int], count: int) -> list[Register] | None:
    """``count`` registers of one `prmt` each from these rotations over the bits not taken."""
    for picks in covers(rotations, taken):
        for regs in registers(picks):
            if len(regs) == count:
                return regs
    return None


def three_rotations() -> list[Register] | None:
    """Four registers of one `prmt` each from the word and three rotations of it."""
    for rest in itertools.combinations(range(1, 32), 3):
        found = fits((0, *rest), frozenset(), 4)
        if found:
            return found
    return None


def one_in_place() -> bool:
    """Whether one register can be a rotation's own bytes (no `prmt`), the other three from
    three more rotations, one `prmt` each."""
    for alone in range(32):
        for rest in itertools.combinations([r for r in range(32) if r != alone], 3):
            if fits(rest, in_place(alone), 3):
                return True
    return False


def rotr(x: int, r: int) -> int:
    return ((x >> r) | (x << (32 - r))) & 0xFFFFFFFF if r else x


def prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32 (default mode, selectors 0-7)."""
    pool = [(a >> 8 * i) & 0xFF for i in range(4)] + [(b >> 8 * i) & 0xFF for i in range(4)]
    return sum(pool[(selector >> 4 * i) & 7] << 8 * i for i in range(4))


def shipped(word: int) -> list[int]:
    """The shipped decode's four registers (before the scales) of a checkpoint word: the low
    nibbles of bytes 0 and 1, of bytes 2 and 3, then the high nibbles alike."""
    t0 = (word & 0xFF) | ((word >> 8) & 0xFF) << 16
    t1 = ((word >> 16) & 0xFF) | ((word >> 24) & 0xFF) << 16

    def field(t: int, nibbles: int, factor: int) -> int:
        return (((t & nibbles) * factor) & 0xFFFFFFFF) & MASK

    return [field(t0, 0x000F000F, 4160), field(t1, 0x000F000F, 4160),
            field(t0, 0x00F000F0, 260), field(t1, 0x00F000F0, 260)]  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """A decode of this family: each register's two rotations and `prmt` selector, and the
    stored bit of each checkpoint bit (``order[i]``: where the word's bit i is stored)."""

    registers: list[tuple[int, int, int]]
    order: list[int]

    def rotated(self) -> list[int]:
        """The rotations (other than none) the registers take bytes from."""
        return sorted({r for a, b, _ in self.registers for r in (a, b)} - {0})

    def rotations(self) -> int:
        return len(self.rotated())

    def total(self) -> int:
        """Instructions per word: the rotations, then a prmt, a mask and a multiply a register."""
        return self.rotations() + 3 * len(self.registers)

    def decode(self, stored: int) -> list[int]:
        return [prmt(rotr(stored, a), rotr(stored, b), s) & MASK for a, b, s in self.registers]

    def store(self, word: int) -> int:
        return sum(((word >> i) & 1) << self.order[i] for i in range(32))

    def ptx(self) -> str:
        rotations = self.rotated()
        names = {0: "$4"} | {r: f"r{r}" for r in rotations}
        lines = ["{", f".reg .b32 {', '.join(names[r] for r in rotations)}, a;"]
        lines += [f"shf.r.wrap.b32 r{r}, $4, $4, {r};" for r in rotations]
        for out, (a, b, selector) in enumerate(self.registers):
            lines += [f"prmt.b32 a, {names[a]}, {names[b]}, {selector:#06x};",
                      f"and.b32 a, a, 0x{MASK:08X};",
                      f"mul.rn.bf16x2 ${out}, a, ${5 + out % 2};"]  # fmt: skip
        return "\n".join([*lines, "}"])


def layout(regs: list[Register]) -> Layout:
    """The registers in the shipped decode's order of weights (register o, lane l: the nibble
    of shipped()), the checkpoint bits stored where the picks read them."""
    order = [0] * 32
    chosen = []
    for out, (l0, h0, l1, h1) in enumerate(regs):
        pair = sorted({p.rotation for p in (l0, h0, l1, h1)})
        a, b = (pair * 2)[:2]
        selector = 0
        for position, pick in enumerate((l0, h0, l1, h1)):
            selector |= (pick.byte + (0 if pick.rotation == a else 4)) << 4 * position
        chosen.append((a, b, selector))
        for lane, (high, low) in enumerate(((h0, l0), (h1, l1))):
            base = 8 * (2 * (out % 2) + lane) + 4 * (out // 2)
            order[base + 3], order[base + 2] = high.stored()  # sign, exponent's high bit
            order[base + 1], order[base + 0] = low.stored()  # exponent's low bit, mantissa
    return Layout(chosen, order)


def checked(found: Layout) -> None:
    """The 32 single-bit words (and 0) decode as shipped from their stored order."""
    if sorted(found.order) != list(range(32)):
        raise ValueError("the stored order is not a permutation of the word's 32 bits")
    for word in [0] + [1 << i for i in range(32)]:
        if found.decode(found.store(word)) != shipped(word):
            raise ValueError(f"word {word:#010x} decodes otherwise than shipped")


def tree_target(tree: Path) -> Path:
    """DIR/vllm, refused (before anything is written) where the overlay is not built or DIR/vllm
    exists: the tree is written new, never over a vllm/ (an installed one, say)."""
    if not (REPO / "overlay" / "vllm" / KERNELS).is_file():
        raise SystemExit("decode_layouts: no built overlay (run vllm-patchset overlay build)")
    target = tree / "vllm"
    if target.exists():
        raise SystemExit(f"decode_layouts: {target} exists; give --tree a folder without vllm/")
    return target


def write_tree(found: Layout, tree: Path) -> Path:
    """DIR/vllm: the built overlay with the found PTX in _decode_ptx, written in a folder beside
    it and renamed into place (upstream_graft.staged: an interrupted run leaves no DIR/vllm)."""
    target = tree_target(tree)
    tree.mkdir(parents=True, exist_ok=True)
    with staged(target) as stage:
        shutil.copytree(REPO / "overlay" / "vllm", stage, dirs_exist_ok=True)
        text = (stage / KERNELS).read_text()
        start = text.index('asm="""', text.index("def _decode_ptx(")) + len('asm="""\n')
        end = text.index('"""', start)
        indent = " " * 8
        body = "".join(f"{indent}{line}\n" for line in found.ptx().splitlines())
        (stage / KERNELS).write_text(text[:start] + body + indent + text[end:])
    return target


def verdict(exists: bool, total: int) -> str:
    return str(total) if exists else "no order exists"


def report(found: Layout, masked_alone: bool, one_without_prmt: bool) -> str:
    stored = ", ".join(f"{i}->{s}" for i, s in enumerate(found.order))
    return "\n".join([
        "# The PTX decode's instructions per eight weights",
        "",
        "`benchmarks/decode_layouts.py` (the search on the CPU; nothing timed).",
        "",
        "| decode | rotations | prmt | and | mul (IMAD) | bf16x2 multiplies | in all |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| shipped (checkpoint nibbles, tiled) | 0 | 2 | 8 | 4 | 4 | {SHIPPED_PTX} |",
        f"| four rotations, masked alone | 3 | 0 | 4 | 0 | 4 | {verdict(masked_alone, 11)} |",
        f"| one in place, three by prmt | 3 | 3 | 4 | 0 | 4 | {verdict(one_without_prmt, 14)} |",
        f"| three rotations, prmt each | {found.rotations()} | 4 | 4 | 0 | 4 | {found.total()} |",
        "",
        "One order of the stored bits (checkpoint bit -> stored bit, bit i of the word: byte",
        "i // 8, the low nibble at i % 8 < 4, sign its top bit):",
        "",
        f"`{stored}`",
        "",
        "Its decode (the shipped `_decode_ptx`'s operands: $4 the word, $5 and $6 the scales):",
        "",
        "```",
        found.ptx(),
        "```",
        "",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, help="write DIR/vllm with the found decode")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    args = parser.parse_args(argv)
    if args.tree:
        tree_target(args.tree)
    regs = three_rotations()
    if regs is None:
        raise SystemExit("decode_layouts: no order with three rotations and one prmt a register")
    found = layout(regs)
    checked(found)
    text = report(found, mask_only(), one_in_place())
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "decode_layouts.md").write_text(text)
        print(text)
        if args.tree:
            print(f"wrote {write_tree(found, args.tree)}", file=sys.stderr)
    except OSError as e:
        raise SystemExit(f"decode_layouts: {e.strerror}: {e.filename}") from None
    except GraftError as e:
        raise SystemExit(f"decode_layouts: {e}") from None
    return 0


if __name__ == "__main__":
    raise SystemExit(stops.main(main, "decode_layouts"))
