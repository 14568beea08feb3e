"""series/classify.py: the one-line fix of tests/tiny_series.py classified on each tree, the
state, the reason and the warnings exactly (the rule chain end to end, on tiny trees); then
through the commands on the synthetic story (tests/synthetic.py): each of the four states and
the finer verdicts, text and trailers disagreeing, releases and git refs, `status` and `check`
on the pin. Today's real states are pinned in test_real_series.py."""

from __future__ import annotations

import json

import pytest
from synthetic import STORY_ARCHIVED, STORY_FIX, STORY_LOCAL, Story
from tiny_series import MOE, Trees
from vllm_patchset.cli import main
from vllm_patchset.infra.config import Project
from vllm_patchset.series.classify import classify
from vllm_patchset.series.patches import Patch

GONE = (
    "text says absent, trailers say applies: the code it changes is gone (rewritten or removed"
    " upstream)"
)
LIVE_AT = "the bug (`or self.a1_gscale`) is live at "
NOWHERE = "its fix is nowhere in vllm/moe.py"
CLASSIFIED = [
    # (the tree, the release's version) -> (state, reason, warnings)
    ("pin", "1.1", ("applies", "applies", ())),
    ("fixed", "1.1", ("upstream", "upstream", ())),
    # The fix live, the bug only in a comment: upstream.
    ("commented", "1.1", ("upstream", "upstream", ())),
    (
        "joined",
        "1.1",
        (
            "applies",
            "refreshed",
            (f"hunk 1 ({MOE}): placed by token match at {MOE}:1 (Experts.apply)",),
        ),
    ),
    ("changed", "1.1", ("conflict", "conflict", (f"{LIVE_AT}{MOE}:3 (Experts.apply); {NOWHERE}",))),
    ("moved", "1.1", ("applies", "moved", ("moved: vllm/moe.py -> vllm/layers/moe.py",))),
    ("gone", "1.1", ("conflict", "rewritten", (GONE,))),
    ("gone", "0.9", ("absent", "never-there", ())),  # before Introduced-in: 1.0
    (
        "copied",
        "1.1",
        (
            "conflict",
            "ambiguous",
            (
                f"{LIVE_AT}{MOE}:3 (Experts.apply), vllm/other.py:6 (Emulated.apply) (the patch"
                f" does not reach every place); {NOWHERE}",
            ),
        ),
    ),
    (
        "helper",
        "1.1",
        (
            "conflict",
            "ambiguous",
            (
                "the code it fixes is not where the patch says; it is at vllm/other.py:6"
                " (Emulated.apply): carry the fix there by hand (queue import) or decide",
                f"{LIVE_AT}vllm/other.py:6 (Emulated.apply); {NOWHERE}",
            ),
        ),
    ),
]


@pytest.mark.parametrize(("on", "version", "expected"), CLASSIFIED)
def test_classify(
    trees: Trees, fix: Patch, on: str, version: str, expected: tuple[str, str, tuple[str, ...]]
) -> None:
    verdict = classify(trees.repo, trees.on(on), fix, base=on, version=version)
    assert (verdict.state.value, verdict.reason.value, verdict.warnings) == expected


def test_a_move_is_followed_only_when_asked(trees: Trees, fix: Patch) -> None:
    """Not followed: the code found at its new path is a stop that names it."""
    tree = trees.on("moved")
    verdict = classify(trees.repo, tree, fix, base="moved", version="1.1", follow_moves=False)
    assert (verdict.state.value, verdict.reason.value, verdict.candidates) == (
        "conflict",
        "ambiguous",
        ("vllm/layers/moe.py:3 (Experts.apply)",),
    )


# -- through the commands, on the synthetic story ---------------------------------------------
ARCHIVED = f"upstreamed/{STORY_ARCHIVED.name}"
FIX = STORY_FIX.name
LOCAL = STORY_LOCAL.name
# 0.9 predates the MoE code (the fix: never there) and has the clamp bug (the archived fix
# applies); 1.0 is the pin; 1.1 has the MoE fix and changed the label line the local patch
# changes; 1.2 rewrote the MoE function both patches change. (state, verdict) per patch:
STORY_STATES = [
    ("0.9", ("applies", "applies"), ("absent", "never-there"), ("conflict", "conflict")),
    ("1.0", ("upstream", "upstream"), ("applies", "applies"), ("applies", "applies")),
    ("1.1", ("upstream", "upstream"), ("upstream", "upstream"), ("conflict", "conflict")),
    ("1.2", ("upstream", "upstream"), ("conflict", "rewritten"), ("conflict", "rewritten")),
]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(list(argv)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


def test_matrix_states_on_releases(tiny: Project, capsys: pytest.CaptureFixture[str]) -> None:
    versions = [v for v, *_ in STORY_STATES]
    # Given in any order, the columns come in PEP 440 order.
    doc = run_json(capsys, "--project", str(tiny.root), "matrix", *versions[::-1], "--json")
    assert list(doc["versions"]) == versions  # type: ignore[call-overload]
    assert doc["versions"] == {
        v: {ARCHIVED: s1[0], FIX: s2[0], LOCAL: s3[0]} for v, s1, s2, s3 in STORY_STATES
    }
    details = doc["details"]
    assert isinstance(details, dict)
    assert {
        v: tuple(details[v][p]["verdict"] for p in (ARCHIVED, FIX, LOCAL)) for v in versions
    } == {v: (s1[1], s2[1], s3[1]) for v, s1, s2, s3 in STORY_STATES}
    # Where the text and the trailers disagree in a way that changes a decision: a warning.
    assert {
        (v, p): details[v][p]["warnings"]
        for v in versions
        for p in (ARCHIVED, FIX, LOCAL)
        if details[v][p]["warnings"]
    } == {
        # 0.9: the label line the local patch changes is there (its surroundings are not).
        ("0.9", LOCAL): [
            'the bug (`label = "experts"`) is live at vllm/layers/moe.py:23 (Experts.name);'
            " its fix is nowhere in vllm/layers/moe.py"
        ],
        ("1.2", FIX): [GONE],
        ("1.2", LOCAL): [GONE],
    }
    # A cosmetic one (the patch's comment is its own; upstream's code is the same) is noted.
    on_11 = details["1.1"][FIX]
    assert (on_11["text_state"], on_11["trailer_state"]) == ("upstream", "applies")
    assert on_11["disagreements"] == [
        "hunk 1 (vllm/layers/moe.py): code matches upstream, comment lines differ"
    ]
    on_09 = details["0.9"][FIX]
    assert (on_09["text_state"], on_09["trailer_state"], on_09["disagreements"]) == (
        "absent",
        "absent",
        [],
    )
    assert [h["offset"] for h in details["1.0"][FIX]["hunks"]] == [0]


def test_matrix_on_git_refs(
    tiny: Project, story: Story, capsys: pytest.CaptureFixture[str]
) -> None:
    """Columns of git refs, in the order given; a ref named like a release has its version
    (the trailers count), one that is not (`nightly`) has none and is classified against the
    pin, as the rebase does (before: `absent (not-found)` for code that was there)."""
    doc = run_json(
        capsys,
        *("--project", str(tiny.root), "matrix", "--json", "--git", str(story.upstream.path)),
        *("--ref", "v1.2", "--ref", "v0.9", "--ref", "nightly"),
    )
    assert doc["versions"] == {
        "git:v1.2": {ARCHIVED: "upstream", FIX: "conflict", LOCAL: "conflict"},
        "git:v0.9": {ARCHIVED: "applies", FIX: "absent", LOCAL: "conflict"},
        "git:nightly": {ARCHIVED: "upstream", FIX: "conflict", LOCAL: "conflict"},
    }
    details = doc["details"]
    assert isinstance(details, dict)
    verdicts = {ref: tuple(details[ref][p]["verdict"] for p in (FIX, LOCAL)) for ref in details}
    assert verdicts == {
        "git:v1.2": ("rewritten", "rewritten"),
        "git:v0.9": ("never-there", "conflict"),
        # The same tree as v1.2, no version: both applied on the pin, their code is gone.
        "git:nightly": ("rewritten", "rewritten"),
    }


def test_status_and_check_on_the_pin(tiny: Project, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--project", str(tiny.root), "status", "--json")
    assert doc == {
        "ok": True,
        "command": "status",
        "exit_code": 0,
        "pin": "1.0",
        "patches": {ARCHIVED: "upstream", FIX: "applies", LOCAL: "applies"},
        "warnings": {ARCHIVED: [], FIX: [], LOCAL: []},
        "disagreements": {ARCHIVED: [], FIX: [], LOCAL: []},
        "parked": {},
        "lock": "fresh",
    }
    assert main(["--project", str(tiny.root), "check"]) == 0
    assert capsys.readouterr().out == "check: 3 patches, 0 problem(s)\n"
