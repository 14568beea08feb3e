"""The sha256 helpers: of bytes, of a file streamed in chunks, and a wheel RECORD's
`sha256=<urlsafe base64>` form. Every caller uses these (`kitparts.py` and `guard.py`, which
run without the rest of the package, keep their own few standard-library lines).
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from vllm_patchset.infra.fsio import read_chunks


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path, *, follow: bool = False) -> str:
    """Streamed in chunks (a large file is never held whole; lstat-checked: a FIFO is never
    opened; `follow`: a link to a regular file is read through)."""
    digest = hashlib.sha256()
    for chunk in read_chunks(path, follow=follow):
        digest.update(chunk)
    return digest.hexdigest()


def record_hash(data: bytes) -> str:
    """The hash column of a wheel's RECORD (PEP 376/427): `sha256=` and the urlsafe base64 of
    the digest without padding."""
    raw = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
