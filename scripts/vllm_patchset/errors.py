"""The project's errors. `cli.main` is the one place that turns them into exit codes.

Exit codes: 0 success, 1 a finding (mismatch, conflict, drift), 2 bad usage or input, 3 an
internal error (a bug of the tool: what no check foresaw).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class PatchsetError(Exception):
    """Base class: the message is one line a user can act on."""

    exit_code = 2
    left: str | None = None  # what the failed run left behind, when it had begun to change things


class Finding(PatchsetError):
    """The tool ran and found something wrong (a mismatch, a conflict, drift)."""

    exit_code = 1


class BadInput(PatchsetError):
    """Bad usage or input: nothing was changed."""


INTERNAL_ERROR = 3  # the exit code of what no check foresaw (never 1: that is a finding)


class InternalError(PatchsetError):
    """What no check foresaw, said in one line with what the run left (e.g. git failing in
    the middle of a rebase): exit 3, never reported as bad input."""

    exit_code = INTERNAL_ERROR

    def __init__(self, message: str, left: str | None = None) -> None:
        super().__init__(message)
        self.left = left


class NoGit(BadInput):
    """No git executable: the commands that read the upstream mirror need one."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"git is not installed or not on PATH ({detail}): install git (the deploy commands,"
            " `overlay apply|verify|revert|status`, need none)"
        )


class GitError(BadInput):
    def __init__(self, command: str, detail: str) -> None:
        super().__init__(f"git {command} failed: {meaningful_line(detail)}")


def meaningful_line(detail: str) -> str:
    """What went wrong, from git's stderr: its first `fatal:` line, else its last line (an
    `error:` one last). git's last line is often advice after the fatal one (`and the
    repository exists.` after a fetch from a missing repository)."""
    lines = [line.strip() for line in detail.strip().splitlines() if line.strip()]
    fatal = [line for line in lines if line.startswith("fatal:")]
    errors = [line for line in lines if line.startswith("error:")]
    return (fatal[:1] or errors[-1:] or lines[-1:] or ["no output"])[0]


class MalformedPatch(BadInput):
    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"malformed patch {path}: {reason}")


class SeriesError(BadInput):
    pass


class UnknownVersion(BadInput):
    def __init__(self, package: str, version: str, where: str) -> None:
        super().__init__(f"{package} {version} is not available from {where}")


class DownloadFailed(BadInput):
    pass


class LockMismatch(Finding):
    pass


class PatchDoesNotApply(Finding):
    def __init__(self, patch: str, base: str, detail: str) -> None:
        super().__init__(f"{patch} does not apply to {base}: {detail}")


@contextmanager
def as_project_errors(kind: type[Exception]) -> Iterator[None]:
    """Within: an error of `kind` from a stdlib-only module that carries its exit code
    (kitparts' `KitError`, which cannot import this module) raised as the project's own, with
    its message: BadInput for exit code 2, else a Finding."""
    try:
        yield
    except kind as exc:
        message = str(exc)
        raise (
            BadInput(message) if getattr(exc, "exit_code", 1) == 2 else Finding(message)
        ) from None
