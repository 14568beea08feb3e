"""infra/fsio/interrupts.py as a unit: SIGINT and SIGTERM raise `Interrupted` inside
`signals_raise` and the old handlers come back after it; inside `deferred_signals` they wait
for the block's end; a note of what an interrupt leaves lives as long as its block."""

from __future__ import annotations

import signal

import pytest
from vllm_patchset.infra.fsio.interrupts import (
    Interrupted,
    deferred_signals,
    interrupt_leaves,
    interrupted_note,
    signals_raise,
)

SIGNALS = [(signal.SIGINT, "SIGINT"), (signal.SIGTERM, "SIGTERM")]


@pytest.mark.parametrize(("signum", "name"), SIGNALS)
def test_a_signal_raises_interrupted_in_the_block(signum: int, name: str) -> None:
    before = signal.getsignal(signum)
    with pytest.raises(Interrupted) as error, signals_raise():
        signal.raise_signal(signum)
    assert (error.value.signum, str(error.value)) == (signum, name)
    assert signal.getsignal(signum) == before


@pytest.mark.parametrize(("signum", "name"), SIGNALS)
def test_a_deferred_signal_is_raised_after_the_block(signum: int, name: str) -> None:
    done = []
    with pytest.raises(Interrupted), signals_raise():
        with deferred_signals():
            signal.raise_signal(signum)
            done.append("the block ran to its end")
        done.append("never")
    assert done == ["the block ran to its end"]


def test_a_note_lives_as_long_as_its_block() -> None:
    interrupt_leaves("ignored: no block")
    assert interrupted_note() is None
    with signals_raise() as interrupts:
        assert interrupted_note() is None
        interrupt_leaves("a half-built overlay in build/")
        assert (interrupted_note(), interrupts.note) == ("a half-built overlay in build/",) * 2
        interrupt_leaves(None)
        assert interrupted_note() is None
    assert interrupted_note() is None
