"""The patch series: `patches/series`, the `git format-patch` files it names, their hunks and
their provenance trailers (DEP-3 meaning), the archive of patches upstream has merged
(`patches/upstreamed/`), and the patches kept but not applied (`patches/parked/`: each line of
its series gives the reason as a `#` comment, which quilt and `git am` read as a comment)."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from vllm_patchset.errors import MalformedPatch, PatchsetError, SeriesError
from vllm_patchset.infra.fsio import UnsafePath, atomic_write, kind_of, plain_parts, read_regular

REQUIRED_TRAILERS = (
    "Upstream-PR",
    "Introduced-by",
    "Introduced-in",
    "Applied-upstream",
    "Regression-test",
)
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_INDEX_RE = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)")


@dataclass(frozen=True)
class Hunk:
    old_start: int
    new_start: int
    lines: tuple[str, ...]  # each with its ' ', '-' or '+' prefix

    @property
    def pre(self) -> tuple[str, ...]:
        return tuple(line[1:] for line in self.lines if line[0] in " -")

    @property
    def post(self) -> tuple[str, ...]:
        return tuple(line[1:] for line in self.lines if line[0] in " +")

    @property
    def removed(self) -> tuple[str, ...]:
        return tuple(line[1:] for line in self.lines if line[0] == "-")

    @property
    def added(self) -> tuple[str, ...]:
        return tuple(line[1:] for line in self.lines if line[0] == "+")


@dataclass(frozen=True)
class FilePatch:
    path: str
    old_blob: str | None  # None for a new file
    new_blob: str | None  # None for a deleted file
    hunks: tuple[Hunk, ...]  # none for an empty file added or deleted
    change: str = "modified"  # "added" (`new file mode`) or "deleted" (`deleted file mode`)

    @property
    def whole(self) -> bytes | None:
        """The file an added (deleted) file's diff creates (removes), whole; None for a file
        the patch modifies."""
        if self.change == "modified":
            return None
        lines = [h.post if self.change == "added" else h.pre for h in self.hunks]
        text = "".join(line + "\n" for group in lines for line in group)
        return text.encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Trailers:
    upstream_pr: str
    introduced_by: str
    introduced_in: str  # a release, or "nightly"
    applied_upstream: str  # first release with the fix; empty while pending or local
    regression_tests: tuple[str, ...]


@dataclass(frozen=True)
class Patch:
    name: str  # file name, as in the series
    key: str  # path under patches/: the name, or "upstreamed/<name>" for the archive
    path: Path
    subject: str
    trailers: Trailers
    files: tuple[FilePatch, ...]
    raw: bytes

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)


@dataclass(frozen=True)
class Series:
    active: tuple[Patch, ...]  # patches/series, in order
    upstreamed: tuple[Patch, ...]  # patches/upstreamed/series, in order
    parked: tuple[Patch, ...] = ()  # patches/parked/series: kept, not applied

    @property
    def all(self) -> tuple[Patch, ...]:
        """The patches the overlay walk takes (parked ones aside)."""
        return self.upstreamed + self.active


def _check_path(patch: Path, path: str) -> str:
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts or pure.parts[0] != "vllm":
        raise MalformedPatch(patch, f"touches {path!r}, outside the vllm/ package")
    if plain_parts(path, "vllm") is None:
        raise MalformedPatch(patch, f"touches {path!r}, not a plain path inside vllm/")
    return path


def parse_patch(path: Path, key: str | None = None) -> Patch:
    try:
        raw = read_regular(path)  # a FIFO or a symlink is refused, never opened
    except PatchsetError as exc:
        raise MalformedPatch(path, f"unreadable ({exc})") from None
    if raw is None:
        raise MalformedPatch(path, "no such file")
    return parse_patch_bytes(raw, path, key)


def parse_patch_bytes(raw: bytes, path: Path, key: str | None = None) -> Patch:
    """The patch `raw` (the bytes of the file `path`)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedPatch(path, f"unreadable ({exc})") from None
    head, sep, diff = text.partition("\ndiff --git ")
    if "\r\n" in head:
        raise MalformedPatch(
            path, "CRLF line endings (git format-patch writes LF: convert it, e.g. dos2unix)"
        )
    if not sep and "diff --git " not in text:
        raise MalformedPatch(path, "no `diff --git` section")
    if not head.startswith("From ") or "\nSubject: " not in head:
        raise MalformedPatch(path, "not `git format-patch` output (no From/Subject header)")
    subject = _subject(head)
    message = head.split("\n\n", 1)[1] if "\n\n" in head else ""
    message = message.split("\n---\n", 1)[0]
    trailers = _trailers(path, message)
    files = tuple(_parse_file(path, "diff --git " + chunk) for chunk in diff.split("\ndiff --git "))
    return Patch(
        name=path.name,
        key=key or path.name,
        path=path,
        subject=subject,
        trailers=trailers,
        files=files,
        raw=raw,
    )


def _subject(head: str) -> str:
    lines = head.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("Subject: "))
    subject = lines[start][len("Subject: ") :]
    for line in lines[start + 1 :]:
        if not line.startswith(" "):
            break
        subject += line
    return re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)


def _trailers(path: Path, message: str) -> Trailers:
    found: dict[str, list[str]] = {}
    for line in message.strip().split("\n"):
        key, sep, value = line.partition(":")
        if sep and key in REQUIRED_TRAILERS:
            found.setdefault(key, []).append(value.strip())
    missing = [k for k in REQUIRED_TRAILERS if k not in found]
    if missing:
        raise MalformedPatch(path, f"missing trailer(s) {', '.join(missing)}")
    tests = tuple(t for value in found["Regression-test"] for t in value.split() if t)
    if not tests:
        raise MalformedPatch(path, "empty Regression-test trailer")
    return Trailers(
        upstream_pr=found["Upstream-PR"][0],
        introduced_by=found["Introduced-by"][0],
        introduced_in=found["Introduced-in"][0],
        applied_upstream=found["Applied-upstream"][0],
        regression_tests=tests,
    )


def _parse_file(patch: Path, chunk: str) -> FilePatch:
    lines = chunk.split("\n")
    header = lines[0]
    match = re.match(r"^diff --git a/(\S+) b/(\S+)$", header)
    if not match:
        raise MalformedPatch(patch, f"bad diff header {header!r}")
    path = _check_path(patch, match.group(2))
    _check_path(patch, match.group(1))
    i, old_blob, new_blob, change = _extended_header(patch, path, match, lines)
    if change != "modified" and match.group(1) != match.group(2):
        raise MalformedPatch(patch, f"{path}: {change} under another name than {match.group(1)}")
    hunks: list[Hunk] = []
    while i < len(lines):
        hunk, i = _hunk(patch, path, lines, i)
        if hunk is None:
            break
        hunks.append(hunk)
    if not hunks and change == "modified":
        raise MalformedPatch(patch, f"{path}: no hunks")
    if change != "modified":
        _check_whole(patch, path, change, hunks, lines)
    return FilePatch(
        path=path, old_blob=old_blob, new_blob=new_blob, hunks=tuple(hunks), change=change
    )


def _check_whole(patch: Path, path: str, change: str, hunks: list[Hunk], lines: list[str]) -> None:
    """An added (deleted) file's diff: one hunk from (to) nothing, ending with a newline (the
    tool compares whole files: a file with no final newline is refused)."""
    other = "-" if change == "added" else "+"
    if len(hunks) > 1 or any(line[0] in (other, " ") for h in hunks for line in h.lines):
        raise MalformedPatch(patch, f"{path}: a file {change} whole takes one hunk of its lines")
    if any(line.startswith("\\") for line in lines):
        raise MalformedPatch(
            patch, f"{path}: {change} with no newline at its end (end the file with one)"
        )


def _extended_header(
    patch: Path, path: str, names: re.Match[str], lines: list[str]
) -> tuple[int, str | None, str | None, str]:
    """The lines between the `diff --git` line and the first hunk: where the first hunk is,
    the blobs of the `index` line (None: none, or the file is new or deleted), and the change
    ("added", "deleted", "modified")."""
    old_blob: str | None = None
    new_blob: str | None = None
    change = "modified"
    i = 1
    while i < len(lines) and not lines[i].startswith("@@"):
        if lines[i] == "" or lines[i] == "-- ":  # an empty file's diff: no hunk
            break
        if whole := re.fullmatch(r"(new|deleted) file mode 100(644|755)", lines[i]):
            change = "added" if whole.group(1) == "new" else "deleted"
        blobs = _header_line(patch, path, names, lines[i], change)
        if blobs is not None:
            old_blob, new_blob = blobs
        i += 1
    return i, _blob(old_blob), _blob(new_blob), change


def _blob(blob: str | None) -> str | None:
    return None if re.fullmatch(r"0+", blob or "") else blob


def _header_line(
    patch: Path, path: str, names: re.Match[str], line: str, change: str
) -> tuple[str, str] | None:
    """The blobs of an `index` line; a diff this tool refuses, refused; else None."""
    if index := _INDEX_RE.match(line):
        return index.group(1), index.group(2)
    if line.startswith(("GIT binary patch", "Binary files")):
        raise MalformedPatch(patch, f"binary diff of {path}")
    if re.fullmatch(r"(new|deleted) file mode 1[26]0000", line):
        # A symbolic link (a way out of the tree) or a submodule: never written.
        raise MalformedPatch(patch, f"{path}: {line}: a link or a submodule, refused")
    if line.startswith(("--- ", "+++ ")):
        side, named = ("a", names.group(1)) if line[0] == "-" else ("b", names.group(2))
        nothing = {"-": "added", "+": "deleted"}[line[0]]  # the side `/dev/null` stands for
        if line[4:] == "/dev/null" and change == nothing:
            return None
        if line[4:] != f"{side}/{named}":
            raise MalformedPatch(
                patch, f"{path}: {line!r} names another file than its 'diff --git' line"
            )
    return None


def _hunk(patch: Path, path: str, lines: list[str], i: int) -> tuple[Hunk | None, int]:
    """The hunk at `lines[i]` and where the next line is; None at the end of the file's diff
    (blank lines, or the signature)."""
    hunk_match = _HUNK_RE.match(lines[i])
    if not hunk_match:
        if lines[i] == "" and all(rest in ("", "-- ") for rest in lines[i:]):
            return None, i
        if lines[i] == "-- ":  # signature
            return None, i
        raise MalformedPatch(patch, f"{path}: unexpected line {lines[i]!r}")
    old_len = int(hunk_match.group(2) or 1)
    new_len = int(hunk_match.group(4) or 1)
    body, i = _hunk_body(patch, path, lines, i + 1, (old_len, new_len))
    while i < len(lines) and lines[i].startswith("\\"):
        i += 1
    return Hunk(int(hunk_match.group(1)), int(hunk_match.group(3)), tuple(body)), i


def _hunk_body(
    patch: Path, path: str, lines: list[str], i: int, lengths: tuple[int, int]
) -> tuple[list[str], int]:
    """The lines of a hunk from `lines[i]`, as many as its header's `lengths` (old, new) say,
    and where the next line is."""
    body: list[str] = []
    seen_old = seen_new = 0
    while (seen_old < lengths[0] or seen_new < lengths[1]) and i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("\\"):
            continue
        tag = line[:1] or " "
        if tag not in " -+":
            raise MalformedPatch(patch, f"{path}: bad hunk line {line!r}")
        seen_old += tag in " -"
        seen_new += tag in " +"
        body.append(tag + line[1:])
    if (seen_old, seen_new) != lengths:
        raise MalformedPatch(patch, f"{path}: hunk line counts do not match its header")
    return body, i


def read_series_entries(series_file: Path) -> list[tuple[str, str]]:
    """(patch name, the `#` comment on its line) in order; blank lines and comment-only lines
    are ignored (as quilt does)."""
    try:
        data = read_regular(series_file)
        if data is None:
            return []
        text = data.decode("utf-8")
    except UnsafePath as exc:
        raise SeriesError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise SeriesError(
            f"{series_file}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset"
            f" {exc.start})"
        ) from None
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        entry, _, comment = line.partition("#")
        entry = entry.strip()
        if not entry:
            continue
        if "/" in entry or entry.startswith(".") or not entry.endswith(".patch"):
            raise SeriesError(f"{series_file}:{number}: bad series entry {entry!r}")
        entries.append((entry, comment.strip()))
    names = [name for name, _ in entries]
    if len(set(names)) != len(names):
        raise SeriesError(f"{series_file}: a patch is listed twice")
    return entries


def read_series_file(series_file: Path) -> list[str]:
    """Patch names in order."""
    return [name for name, _ in read_series_entries(series_file)]


def _load_dir(series_file: Path, prefix: str) -> tuple[Patch, ...]:
    names = read_series_file(series_file)
    folder = series_file.parent
    for name in names:
        info = os.lstat(folder / name) if os.path.lexists(folder / name) else None
        if info is None:
            raise SeriesError(f"{series_file}: entry {name} has no file {folder / name}")
        if not stat.S_ISREG(info.st_mode):
            raise SeriesError(
                f"{series_file}: entry {name} is {kind_of(info.st_mode)}, not a regular file"
            )
    unlisted = sorted(p.name for p in folder.glob("*.patch") if p.name not in names)
    if unlisted:
        raise SeriesError(f"{folder / unlisted[0]} is not listed in {series_file}")
    return tuple(parse_patch(folder / name, prefix + name) for name in names)


def load_series(
    series_file: Path, upstreamed_file: Path, parked_file: Path | None = None
) -> Series:
    return Series(
        active=_load_dir(series_file, ""),
        upstreamed=_load_dir(upstreamed_file, upstreamed_file.parent.name + "/"),
        parked=_load_dir(parked_file, parked_file.parent.name + "/") if parked_file else (),
    )


def series_bytes(names: list[str], reasons: dict[str, str] | None = None) -> bytes:
    """One name a line; a reason, where given, as a `#` comment after it."""
    reasons = reasons or {}
    return "".join(f"{n}  # {reasons[n]}\n" if reasons.get(n) else f"{n}\n" for n in names).encode(
        "utf-8"
    )


def write_series_file(
    series_file: Path, names: list[str], reasons: dict[str, str] | None = None
) -> None:
    atomic_write(series_file, series_bytes(names, reasons))
