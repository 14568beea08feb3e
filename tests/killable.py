"""`vllm-patchset ARGS` with the tests' kill hook: run as `python tests/killable.py ARGS` (the
`KILLABLE` command line), it shows the file-system layer an observer (`fsio.observed`) that
signals this process at a write point named in the environment, then runs `cli.main`. Without
those variables it is `python -m vllm_patchset`. The tool itself reads neither.

- KILL_ENV "N" / "N:TERM" / "N:INT" / "N:STOP": SIGKILL (as a crash or `kill -9` would), or
  that signal, at the N-th file write point (each whole file has two: the temp file complete,
  and renamed into place);
- KILL_AT_ENV "KIND:SIG:PATH": at the first write point of that kind (`fsio.writes`: moved,
  removed, created, ...) on PATH (a move of the swap, say); SIG empty for SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

KILL_ENV = "VLLM_PATCHSET_TEST_KILL_AFTER"
KILL_AT_ENV = "VLLM_PATCHSET_TEST_KILL_AT"
KILLABLE = [sys.executable, __file__]  # the command line of a killable `vllm-patchset`

Observer = Callable[[str, Path], None]


def killer(at: str | None, count: int | None, name: str) -> Observer:
    """An observer that signals this process at the `count`-th file write point, or at the
    first point `at` ("KIND:PATH")."""
    from vllm_patchset.infra.fsio import writes

    seen = [0]
    signum = getattr(signal, f"SIG{name}") if name else signal.SIGKILL

    def observe(kind: str, path: Path) -> None:
        if count is not None and kind in (writes.WRITTEN, writes.REPLACED):
            seen[0] += 1
            if seen[0] == count:
                os.kill(os.getpid(), signum)
        if at is not None and f"{kind}:{path}" == at and not seen[0]:
            seen[0] = 1
            os.kill(os.getpid(), signum)

    return observe


def observer_from(env: Mapping[str, str]) -> Observer | None:
    if setting := env.get(KILL_ENV):
        point, _, name = setting.partition(":")
        return killer(None, int(point), name)
    if setting := env.get(KILL_AT_ENV):
        kind, name, path = setting.split(":", 2)
        return killer(f"{kind}:{path}", None, name)
    return None


def main() -> int:
    from vllm_patchset import cli
    from vllm_patchset.infra import fsio

    observer = observer_from(os.environ)
    if observer is None:
        return cli.main(sys.argv[1:])
    with fsio.observed(observer):
        return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
