"""The bad/good example pairs of docs/rules/examples: every bad_* gives its code, no good_* does.

The same files are embedded in docs/rules/<CODE>.md and printed by `gpudoctor explain`,
so the documentation shows exactly what these tests run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.config import Config
from gpudoctor.model.findings import Confidence
from gpudoctor.rules.registry import get
from gpudoctor.static import STATIC_CODES, check_paths

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "rules" / "examples"


def _examples(prefix: str) -> list[Path]:
    return sorted(EXAMPLES.glob(f"GD*/{prefix}_*.py"))


def test_every_static_code_has_a_bad_and_a_good_example():
    for code in STATIC_CODES:
        folder = EXAMPLES / code
        assert sorted(folder.glob("bad_*.py")), f"no bad example for {code}"
        assert sorted(folder.glob("good_*.py")), f"no good example for {code}"
    # and no example folder for a code `check` does not report
    assert {d.name for d in EXAMPLES.iterdir() if d.is_dir()} <= set(STATIC_CODES)


@pytest.mark.parametrize("path", _examples("bad"), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_bad_example_gives_its_code(path: Path):
    code = path.parent.name
    report = check_paths([path], Config())
    assert report.errors == ()
    mine = [f for f in report.findings if f.code == code]
    assert mine, f"{path.name}: expected {code}, got {[f.code for f in report.findings]}"
    for f in mine:
        assert f.confidence is Confidence.STATIC
        assert f.name == get(code).name
        assert f.location is not None and f.location.file.endswith(path.name)
        assert f.location.line >= 1 and f.location.col and f.location.col >= 1
        assert f.fix.instruction and f.fix.before and f.fix.after and f.fix.before != f.fix.after
        assert f.gain.share_pct is None and f.gain.speedup_bound is None and f.gain.note
        # the location points at the source the fix quotes
        line = path.read_text(encoding="utf-8").splitlines()[f.location.line - 1]
        assert line.strip(), f"{path.name}:{f.location.line} is blank"


@pytest.mark.parametrize("path", _examples("good"), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_good_example_does_not_give_its_code(path: Path):
    code = path.parent.name
    report = check_paths([path], Config())
    assert report.errors == ()
    assert [f for f in report.findings if f.code == code] == []


@pytest.mark.parametrize("path", _examples("good"), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_good_example_marks_its_technique_not_recommended(path: Path):
    code = path.parent.name
    report = check_paths([path], Config())
    for item in report.checklist:
        if code in item.codes:
            assert item.status.value != "recommended", (item.key, item.reason)
