"""Text edits of a patch: its `Applied-upstream:` trailer and its paths. Pure functions: bytes
in, bytes out.
"""

from __future__ import annotations


# -- patches -------------------------------------------------------------------------------------
def with_trailer(raw: bytes, release: str) -> bytes:
    """The patch with its `Applied-upstream:` trailer set to `release` (nothing else changes)."""
    message, sep, rest = raw.partition(b"\n---\n")
    lines = [
        (f"Applied-upstream: {release}".rstrip() if release else "Applied-upstream:").encode()
        if line.startswith(b"Applied-upstream:")
        else line
        for line in message.split(b"\n")
    ]
    return b"\n".join(lines) + sep + rest


def rewrite_paths(raw: bytes, moves: dict[str, str]) -> bytes:
    """The patch with the files in `moves` (old path -> new path) renamed in its diff headers
    (`diff --git`, `---`, `+++`); the hunks, the message and the index lines are kept."""
    head, sep, diff = raw.partition(b"\ndiff --git ")
    if not sep:
        return raw
    out = []
    for line in (b"diff --git " + diff).split(b"\n"):
        for old, new in moves.items():
            a, b = f"a/{old}".encode(), f"b/{old}".encode()
            if line == b"diff --git " + a + b" " + b:
                line = f"diff --git a/{new} b/{new}".encode()
            elif line == b"--- " + a:
                line = f"--- a/{new}".encode()
            elif line == b"+++ " + b:
                line = f"+++ b/{new}".encode()
        out.append(line)
    return head + b"\n" + b"\n".join(out)
