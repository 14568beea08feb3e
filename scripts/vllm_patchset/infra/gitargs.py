"""What a git child is given, decided before git runs (no git needed here).

Its environment (`git_env`): the caller's with its `GIT_*` variables dropped (a git hook that
runs the tool exports `GIT_DIR`, which would make every call act on the hook's repository),
but for the few that only say how to reach a remote (`TRANSPORT_ENV`); its command line
(`git_argv`); and the values from data or the command line on it, never something git could
read as an option: a source to fetch from (`check_source`: a URL of a known scheme, an
scp-like address or a local path) and a revision or ref (`check_rev`). The settings
(`config.py`) check a pin's git source and ref here without loading the git boundary.
"""

from __future__ import annotations

import os
import re

from vllm_patchset.errors import BadInput

# Sources a git repository is fetched from: a URL of one of these schemes, an scp-like
# `user@host:path`, or a local path.
URL_SCHEMES = ("https", "http", "ssh", "git", "file")
# [user@]host:path, as git reads it; never `<transport>::<address>` (`ext::` runs a command).
_SCP_LIKE = re.compile(r"^(?:[\w.-]+@)?[\w.-]+:(?!:)[^-]")
_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://")
# The caller's GIT_* variables that are kept: how to reach a remote (ssh, a proxy, TLS), none
# of which says which repository, index, work tree or configuration git uses.
TRANSPORT_ENV = frozenset(
    {
        "GIT_SSH",
        "GIT_SSH_COMMAND",
        "GIT_SSH_VARIANT",
        "GIT_ASKPASS",
        "GIT_PROXY_COMMAND",
        "GIT_SSL_CAINFO",
        "GIT_SSL_CAPATH",
        "GIT_SSL_NO_VERIFY",
        "GIT_HTTP_USER_AGENT",
    }
)


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every git child: the caller's without its GIT_* variables (but
    TRANSPORT_ENV), plain C messages, no prompt, then `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in TRANSPORT_ENV}
    return {**env, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", **(extra or {})}


def git_argv(args: list[str], env: dict[str, str]) -> list[str]:
    """The command line of a git child. GitPython starts every child with the caller's whole
    environment updated by the one given (it cannot drop a variable), so the caller's GIT_*
    variables that `env` lacks are unset by env(1) in front of git."""
    dropped = sorted(k for k in os.environ if k.startswith("GIT_") and k not in env)
    unset = ["env", *(a for k in dropped for a in ("-u", k))] if dropped else []
    return [*unset, "git", *args]


def check_source(source: str, what: str = "a git source") -> str:
    """`source` when it is a URL of a known scheme, an scp-like address or a local path, never
    something git could read as an option; else BadInput naming it."""
    scheme = _URL.match(source)
    plain = not any(c in source for c in "\x00\n\r") and source.strip() == source
    if scheme is not None:  # no host that ssh could read as an option (`ssh://-oProxy…`)
        rest = source[scheme.end() :]
        host = rest.rpartition("@")[2]
        ok = scheme.group(1) in URL_SCHEMES and plain
        ok = ok and not rest.startswith("-") and not host.startswith("-")
    else:
        ok = plain and bool(source) and not source.startswith("-")
        ok = ok and ("://" not in source)
        ok = ok and (bool(_SCP_LIKE.match(source)) or ":" not in source.split("/", 1)[0])
    if not ok:
        schemes = ", ".join(f"{s}://" for s in URL_SCHEMES)
        raise BadInput(
            f"{what} {source!r} is not a URL ({schemes}), user@host:path or a local path"
        )
    return source


def check_rev(rev: str, what: str = "a revision") -> str:
    """`rev` when git cannot read it as an option (no leading `-`, no space or control
    character); else BadInput naming it. (A ref to fetch may not hold `:` either: see
    `fetch`.)"""
    if not rev or rev.startswith("-") or any(c.isspace() or ord(c) < 32 for c in rev):
        raise BadInput(f"{what} {rev!r} is not a git ref or commit")
    return rev
