"""The file-system layer: every write, rename and removal of the tool, every read of a path
that came from data (a RECORD, a lock, a journal, a series, a patch header), locks, interrupts
and child processes go through here. By concern:

- `paths`: paths from data (`plain_parts`, `no_symlink_below`) and checked reads
  (`read_regular`, `read_chunks`: regular files only, never blocking);
- `writes`: atomic writes, staging dirs, owned destinations, the build folder, removal, the
  plain steps of a staged build (`write_file`, `move`, `make_dir`, …), and the write-point
  observers (`observed`: none in production, the tests' kill hook);
- `locks`: flocks, one writer at a time;
- `interrupts`: SIGINT/SIGTERM raise or wait, and what an interrupt leaves (`signals_raise`
  yields the block's `Interrupts`, `interrupt_leaves` notes on it);
- `children`: every child process dies with the run (`child`, `run_child`); whether a
  process is still there (`process_alive`).

Callers import this package (`from vllm_patchset.infra import fsio`); the names below are its
API. Standard library only. Each name's module is imported when the name is first used
(PEP 562), so that the start-up guard, which reads through `read_regular` and `read_chunks`,
imports `paths` alone (not `interrupts` and `locks`, with their dataclasses and inspect: most
of the guard's cost at every vLLM start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_patchset.infra.fsio.children import (
        child,
        die_with_parent,
        process_alive,
        run_child,
    )
    from vllm_patchset.infra.fsio.interrupts import (
        Interrupted,
        Interrupts,
        deferred_signals,
        interrupt_leaves,
        interrupted_note,
        reader_gone,
        signals_raise,
    )
    from vllm_patchset.infra.fsio.locks import LOCK_TIMEOUT_ENV, lock_timeout, locked, locked_dir
    from vllm_patchset.infra.fsio.paths import (
        ReadFailed,
        UnsafePath,
        is_regular,
        kind_of,
        no_symlink_below,
        plain_parts,
        read_chunks,
        read_regular,
        same_path,
    )
    from vllm_patchset.infra.fsio.writes import (
        OWNER_MARKER,
        STAGING_PREFIX,
        TMP_SUFFIX,
        NotOwned,
        Observer,
        WriteFailed,
        atomic_write,
        build_dir,
        claim_dir,
        copy_file,
        copy_tree,
        discard_tree,
        fsync_dir,
        is_temp_name,
        link,
        make_dir,
        make_dirs,
        move,
        observed,
        remove_dir,
        remove_file,
        remove_output,
        remove_tree,
        replace_dir,
        scratch_file,
        staging_dir,
        sweep_staging,
        sweep_temp,
        temp_dir,
        touch,
        write_file,
        writing,
    )

# Each name of the API by the module that defines it.
_HOMES = {
    "children": ("child", "die_with_parent", "process_alive", "run_child"),
    "interrupts": (
        "Interrupted",
        "Interrupts",
        "deferred_signals",
        "interrupt_leaves",
        "interrupted_note",
        "reader_gone",
        "signals_raise",
    ),
    "locks": ("LOCK_TIMEOUT_ENV", "lock_timeout", "locked", "locked_dir"),
    "paths": (
        "ReadFailed",
        "UnsafePath",
        "is_regular",
        "kind_of",
        "no_symlink_below",
        "plain_parts",
        "read_chunks",
        "read_regular",
        "same_path",
    ),
    "writes": (
        "OWNER_MARKER",
        "STAGING_PREFIX",
        "TMP_SUFFIX",
        "NotOwned",
        "Observer",
        "WriteFailed",
        "atomic_write",
        "build_dir",
        "claim_dir",
        "copy_file",
        "copy_tree",
        "discard_tree",
        "fsync_dir",
        "is_temp_name",
        "link",
        "make_dir",
        "make_dirs",
        "move",
        "observed",
        "remove_dir",
        "remove_file",
        "remove_output",
        "remove_tree",
        "replace_dir",
        "scratch_file",
        "staging_dir",
        "sweep_staging",
        "sweep_temp",
        "temp_dir",
        "touch",
        "write_file",
        "writing",
    ),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    """A name of the API, its module imported on first use (then kept as this module's)."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "LOCK_TIMEOUT_ENV",
    "OWNER_MARKER",
    "STAGING_PREFIX",
    "TMP_SUFFIX",
    "Interrupted",
    "Interrupts",
    "NotOwned",
    "Observer",
    "ReadFailed",
    "UnsafePath",
    "WriteFailed",
    "atomic_write",
    "build_dir",
    "child",
    "claim_dir",
    "copy_file",
    "copy_tree",
    "deferred_signals",
    "die_with_parent",
    "discard_tree",
    "fsync_dir",
    "interrupt_leaves",
    "interrupted_note",
    "is_regular",
    "is_temp_name",
    "kind_of",
    "link",
    "lock_timeout",
    "locked",
    "locked_dir",
    "make_dir",
    "make_dirs",
    "move",
    "no_symlink_below",
    "observed",
    "plain_parts",
    "process_alive",
    "read_chunks",
    "read_regular",
    "reader_gone",
    "remove_dir",
    "remove_file",
    "remove_output",
    "remove_tree",
    "replace_dir",
    "run_child",
    "same_path",
    "scratch_file",
    "signals_raise",
    "staging_dir",
    "sweep_staging",
    "sweep_temp",
    "temp_dir",
    "touch",
    "write_file",
    "writing",
]
