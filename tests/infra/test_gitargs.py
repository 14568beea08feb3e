"""infra/gitargs.py as a unit: which sources and revisions may reach git (never one it could
read as an option), and the environment and command line of a git child."""

from __future__ import annotations

import pytest
from vllm_patchset.errors import BadInput
from vllm_patchset.infra.gitargs import check_rev, check_source, git_argv, git_env

SOURCES = [
    # (a source, whether it may reach git)
    ("https://github.com/vllm-project/vllm", True),
    ("http://example.com/vllm.git", True),
    ("ssh://git@example.com/vllm.git", True),
    ("git://example.com/vllm", True),
    ("file:///srv/vllm", True),
    ("git@github.com:vllm-project/vllm.git", True),
    ("host:path", True),
    ("/home/me/vllm", True),
    ("../vllm", True),
    ("vllm", True),
    ("-uhack", False),  # an option
    ("--upload-pack=touch /tmp/x", False),
    ("ext::sh -c touch% /tmp/x", False),  # a transport that runs a command
    ("ftp://example.com/vllm", False),
    ("ssh://-oProxyCommand=x/vllm", False),  # a host ssh reads as an option
    ("ssh://user@-oProxyCommand=x/vllm", False),
    ("host:-path", False),
    ("", False),
    (" /home/me/vllm", False),
    ("https://example.com/v\nllm", False),
    ("a://b", False),
]


@pytest.mark.parametrize(("source", "ok"), SOURCES)
def test_check_source(source: str, ok: bool) -> None:
    if ok:
        assert check_source(source) == source
    else:
        with pytest.raises(BadInput) as error:
            check_source(source, "pin-git:")
        assert str(error.value) == (
            f"pin-git: {source!r} is not a URL (https://, http://, ssh://, git://, file://),"
            " user@host:path or a local path"
        )


REVS = [
    ("v0.24.0", True),
    ("refs/tags/v0.24.0", True),
    ("a" * 40, True),
    ("HEAD~1", True),
    ("main:vllm", True),  # a fetch refuses `:` itself
    ("", False),
    ("-x", False),
    ("--output=/tmp/x", False),
    ("a b", False),
    ("a\tb", False),
    ("a\x01b", False),
]


@pytest.mark.parametrize(("rev", "ok"), REVS)
def test_check_rev(rev: str, ok: bool) -> None:
    if ok:
        assert check_rev(rev) == rev
    else:
        with pytest.raises(BadInput) as error:
            check_rev(rev, "pin-ref:")
        assert str(error.value) == f"pin-ref: {rev!r} is not a git ref or commit"


def test_the_environment_of_a_git_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_DIR", "/hook/repo")
    monkeypatch.setenv("GIT_SSH_COMMAND", "ssh -i key")
    monkeypatch.setenv("OTHER", "kept")
    env = git_env({"GIT_INDEX_FILE": "/tmp/index"})
    assert "GIT_DIR" not in env
    assert (env["GIT_SSH_COMMAND"], env["OTHER"]) == ("ssh -i key", "kept")
    assert (env["GIT_TERMINAL_PROMPT"], env["LC_ALL"], env["GIT_INDEX_FILE"]) == (
        "0",
        "C",
        "/tmp/index",
    )
    # GitPython cannot drop a variable: env(1) unsets the caller's that `env` lacks
    assert git_argv(["status"], env) == ["env", "-u", "GIT_DIR", "git", "status"]
    monkeypatch.delenv("GIT_DIR")
    assert git_argv(["status"], env) == ["git", "status"]
