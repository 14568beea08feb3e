"""Text edits of the project's files a rebase rewrites for a new pin: `pyproject.toml` (through
tomlkit, which keeps the file's formatting and comments), the vLLM image tags of the GPU CI
files, the README's pin and patch table, and CHANGELOG.md. Pure functions: text in, text out.
"""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING

from vllm_patchset.errors import BadInput

if TYPE_CHECKING:  # imported where used: only a rebase edits pyproject.toml (`maintain` extra)
    import tomlkit

CHANGELOG_HEADER = (
    "# Changelog\n\n"
    "All notable changes to this patch set are documented in this file.\n"
    "The format is based on [Keep a Changelog](https://keepachangelog.com/en/1.1.0/).\n\n"
    "## [Unreleased]\n"
)
_PIN_KEYS = ("pin-git", "pin-ref", "pin-commit")
# vLLM's images (vllm/vllm-openai, vllm/vllm-openai-rocm) and "vLLM <version>" in job names.
_IMAGE = re.compile(r"(vllm/vllm-openai(?:-rocm)?):v[0-9][\w.+-]*")
_NAMED_VERSION = re.compile(r"\bvLLM \d+(?:\.\d+)+(?:(?:a|b|rc|\.post|\.dev)\d+)*")


# -- pyproject.toml ------------------------------------------------------------------------------
def set_pin(
    text: str,
    pin: str,
    *,
    ref: str | None = None,
    commit: str | None = None,
    git_url: str | None = None,
    requirement: bool = True,
) -> str:
    """pyproject.toml with the new pin in `[tool.vllm-patchset]`: a release (and, with
    `requirement`, every `vllm==` requirement follows it), or a git ref with the repository's
    commit (`pin-ref`, `pin-commit`) and, when others can fetch it, its URL (`pin-git`)."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError
    from tomlkit.items import Table

    try:
        doc = tomlkit.parse(text)
        tool = doc.get("tool")
        table = tool.get("vllm-patchset") if isinstance(tool, Table) else None
        if not isinstance(table, Table) or "pin" not in table:
            raise BadInput("pyproject.toml: no `pin` in [tool.vllm-patchset]")
        table["pin"] = pin
        for key in _PIN_KEYS:
            if key in table:
                del table[key]
        if requirement:
            _set_requirement(doc, pin)
        if ref is None or commit is None:
            return tomlkit.dumps(doc)
        values = (git_url, ref, commit)
        return _with_git_keys(
            doc, table, [(k, v) for k, v in zip(_PIN_KEYS, values, strict=True) if v is not None]
        )
    except TOMLKitError as exc:
        raise BadInput(f"pyproject.toml: not valid TOML ({exc})") from None


def _with_git_keys(
    doc: tomlkit.TOMLDocument, table: tomlkit.items.Table, keys: list[tuple[str, str]]
) -> str:
    """doc's text with `keys` set in `table`: under its pin line where that gives the same
    document, else where tomlkit's public API adds keys (at the table's end)."""
    import tomlkit

    released = tomlkit.dumps(doc)
    for key, value in keys:
        table[key] = value
    lines = "".join(f"{key} = {tomlkit.item(value).as_string()}\n" for key, value in keys)
    placed = _after_pin_line(released, lines)
    if placed is not None and tomlkit.parse(placed).unwrap() == doc.unwrap():
        return placed
    return tomlkit.dumps(doc)


_HEADER = re.compile(r"\s*\[\[?\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?")
_PIN_LINE = re.compile(r"\s*pin\s*=")


def _after_pin_line(text: str, lines: str) -> str | None:
    """text with `lines` after the `pin = ...` line of [tool.vllm-patchset] (tomlkit's public
    API would append them at the table's end, past its trailing blank line and comments; its
    private insertion changed between releases); None where no such line is found. The caller
    checks that the result parses to the document it means."""
    out = text.splitlines(keepends=True)
    table = None
    for i, line in enumerate(out):
        header = _HEADER.fullmatch(line.rstrip("\n"))
        if header:
            table = header.group(1).replace('"', "").replace(" ", "")
        elif table == "tool.vllm-patchset" and _PIN_LINE.match(line):
            return "".join(out[: i + 1]) + lines + "".join(out[i + 1 :])
    return None


def _set_requirement(doc: tomlkit.TOMLDocument, pin: str) -> None:
    from tomlkit.items import Array, Table

    project = doc.get("project")
    if not isinstance(project, Table):
        return
    arrays = [project.get("dependencies")]
    extras = project.get("optional-dependencies")
    if isinstance(extras, Table):
        arrays += [extras[name] for name in extras]
    for array in arrays:
        if not isinstance(array, Array):
            continue
        for i, requirement in enumerate(list(array)):
            if str(requirement).replace(" ", "").startswith("vllm=="):
                array[i] = f"vllm=={pin}"


# -- CI files ------------------------------------------------------------------------------------
def set_ci_images(text: str, version: str) -> str:
    """A GPU CI file with vLLM's images (`vllm/vllm-openai[-rocm]:v<version>`) and the
    "vLLM <version>" of its job names set to `version`: a round-trip YAML edit (ruamel.yaml
    keeps the comments, the quotes and the layout), of the values only."""
    # Imported here: only a rebase edits CI files (the deploy path never imports ruamel).
    from ruamel.yaml import YAML, YAMLError
    from ruamel.yaml.scalarstring import ScalarString

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold a long line
    yaml.indent(mapping=2, sequence=4, offset=2)  # GitHub's and Buildkite's usual layout
    try:
        doc = yaml.load(text)
    except YAMLError as exc:
        raise BadInput(f"a GPU CI file is not YAML ({exc})") from None

    def edit(value: str) -> str:
        value = _IMAGE.sub(lambda m: f"{m.group(1)}:v{version}", value)
        return _NAMED_VERSION.sub(f"vLLM {version}", value)

    def walk(node: object) -> object:
        if isinstance(node, dict):
            for key in list(node):
                node[key] = walk(node[key])
        elif isinstance(node, list):
            for i, item in enumerate(node):
                node[i] = walk(item)
        elif isinstance(node, str):
            new = edit(str(node))
            if new != node:
                return type(node)(new) if isinstance(node, ScalarString) else new
        return node

    walk(doc)
    out = io.StringIO()
    yaml.dump(doc, out)
    return _comment_gaps(text, out.getvalue())


def _comment_gaps(old: str, new: str) -> str:
    """`new` with the space before each line's end comment as in `old` (ruamel.yaml puts one
    space where a value it rewrote grew)."""
    a_lines, b_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    if len(a_lines) != len(b_lines):
        return new
    out = []
    for a, b in zip(a_lines, b_lines, strict=True):
        comment = re.search(r"(\s+)(#.*)$", a.rstrip("\n"))
        body = b.rstrip("\n")
        if a != b and comment and body.endswith(comment.group(2)):
            code = body[: -len(comment.group(2))].rstrip()
            b = code + comment.group(1) + comment.group(2) + b[len(body) :]
        out.append(b)
    return "".join(out)


# -- the pin's other mentions ----------------------------------------------------------------------
def set_readme(text: str, old: str, new: str, rows: dict[str, tuple[str, str, str] | None]) -> str:
    """README.md for the new pin: "The pin is **vllm <pin>**", the quick start's image tag and
    wheel name, and the patch table (its "on <pin>" column; each row's patch, by its old key:
    its new key, release with the fix and state, or None when it was dropped)."""
    text = text.replace(f"The pin is **vllm {old}**", f"The pin is **vllm {new}**")
    text = text.replace(f"+vllm{old}.", f"+vllm{new}.")
    text = re.sub(
        r"^(FROM )" + _IMAGE.pattern, lambda m: f"{m.group(1)}{m.group(2)}:v{new}", text, flags=re.M
    )
    out = []
    for line in text.splitlines(keepends=True):
        if line.startswith("| patch |") and line.rstrip().endswith(f"| on {old} |"):
            line = line.replace(f"| on {old} |", f"| on {new} |")
        match = re.match(r"^\| `patches/([^`]+)` \|(.*)\| ([^|]*) \| ([^|]*) \|\n?$", line)
        if match and match.group(1) in rows:
            row = rows[match.group(1)]
            if row is None:
                continue
            key, release, state = row
            cell = match.group(4) if match.group(4).split(" ", 1)[0] == state else state
            line = f"| `patches/{key}` |{match.group(2)}| {release or '—'} | {cell} |\n"
        out.append(line)
    return "".join(out)


_TORCH_COMMENT = re.compile(r"\((\d[\w.+-]*): torch (\d[\w.+-]*)\)")
_TORCH_PIN = re.compile(r"^torch\s*==\s*([\w.+-]+)\s*(?:#.*)?$", re.M)


def torch_of(requirements: str) -> str | None:
    """The torch a vLLM release pins in its `requirements/cuda.txt` (None: none there)."""
    match = _TORCH_PIN.search(requirements)
    return match.group(1) if match else None


def set_torch_comment(text: str, pin: str, torch: str | None) -> str:
    """pyproject.toml's comment "(<pin>: torch <version>)" for the new pin: the torch its
    release requires (read from its sdist), else the comment says it is not known."""
    said = f"torch {torch}" if torch else "torch: see its requirements"
    return _TORCH_COMMENT.sub(f"({pin}: {said})", text)


def set_unreleased_pin(changelog: str, pin: str, sha256: str | None) -> str:
    """The `[Unreleased]` section's Pin line ("- vllm **<pin>** (sdist sha256 `...`).")."""
    where = f" (sdist sha256 `{sha256}`)" if sha256 else ""
    lines = changelog.splitlines(keepends=True)
    heads = [i for i, line in enumerate(lines) if line.startswith("## ")]
    start = next((i for i in heads if _is_unreleased(lines[i])), None)
    if start is None:
        return changelog
    end = next((i for i in heads if i > start), len(lines))
    for i in range(start, end):
        if re.match(r"^- vllm \*\*[^*]+\*\*", lines[i]):
            lines[i] = f"- vllm **{pin}**{where}.\n"
            break
    return "".join(lines)


# -- CHANGELOG.md --------------------------------------------------------------------------------
def insert_entry(changelog: str, entry: str) -> str:
    """Newest first: after the `[Unreleased]` section (which stays on top), else before the
    first release."""
    if not changelog.strip():
        return CHANGELOG_HEADER + "\n" + entry
    lines = changelog.splitlines(keepends=True)
    sections = [i for i, line in enumerate(lines) if line.startswith("## ")]
    unreleased = [i for i in sections if _is_unreleased(lines[i])]
    after = [i for i in sections if unreleased and i > unreleased[0]]
    at = after[0] if after else (len(lines) if unreleased or not sections else sections[0])
    head = "".join(lines[:at]).rstrip("\n") + "\n\n"
    tail = "".join(lines[at:])
    return head + entry + ("\n" + tail if tail else "")


def _is_unreleased(line: str) -> bool:
    return line.strip().lower() in ("## [unreleased]", "## unreleased")
