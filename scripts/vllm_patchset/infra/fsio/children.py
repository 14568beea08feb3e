"""Child processes: every one the tool starts dies with it (PR_SET_PDEATHSIG), and every one is
started here (`run_child`) or, for git, with the command line `child` makes (gitrepo.py hands
it to GitPython); whether a process is still there (`process_alive`). Standard library only,
imported where it is used.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes a child get SIGKILL when this process dies (Linux prctl
    PR_SET_PDEATHSIG); None elsewhere. A git or python child must not outlive a killed run."""
    import sys

    if not sys.platform.startswith("linux"):
        return None
    if not _prctl:
        import ctypes

        _prctl.append(ctypes.CDLL(None, use_errno=True).prctl)
    import signal

    prctl, parent = _prctl[0], os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl ran: die now
            os._exit(1)

    return preexec


def child(argv: list[str]) -> tuple[list[str], Callable[[], None] | None]:
    """`argv` and a `preexec_fn` for a child that must die with this process. Where util-linux's
    `setpriv --pdeathsig` is there, it sets PR_SET_PDEATHSIG for the child and no `preexec_fn`
    is needed: with one, Python must fork() instead of vfork(), which costs about 10 ms a child
    in a process as large as one that has imported torch (the tests), against 1 ms. A parent
    that dies before setpriv's prctl sends no signal, so a shell then checks that the parent is
    still this process before it execs the command (about 0.5 ms more)."""
    import shutil
    import sys

    if not sys.platform.startswith("linux"):
        return argv, None
    if not _setpriv:
        _setpriv.append(shutil.which("setpriv") or "")
    if _setpriv[0]:
        alive = '[ "$PPID" = "$0" ] && exec "$@"'  # $0: this process's pid
        return [
            _setpriv[0],
            "--pdeathsig",
            "KILL",
            "/bin/sh",
            "-c",
            alive,
            str(os.getpid()),
            *argv,
        ], None
    return argv, die_with_parent()


def run_child(argv: list[str], **options: Any) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run(argv, **options)` for a child that dies with this process (`child`)."""
    import subprocess

    command, preexec = child(argv)
    return subprocess.run(command, preexec_fn=preexec, **options)


def process_alive(pid: int) -> bool:
    """Whether the process `pid` is there (signal 0 reaches it, or it is another user's): a
    leftover named by its pid (a staging dir, a download's `.part`) is swept only once its run
    is gone. (gpu/kitparts.py keeps its own copy: it travels alone, without this layer.)"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_setpriv: list[str] = []
_prctl: list[Callable[..., int]] = []
