"""The catalogue: every rule documents itself, its thresholds exist, docs/rules is in step."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudoctor import rules as rules_pkg
from gpudoctor.cli import cli
from gpudoctor.config import Thresholds
from gpudoctor.errors import UsageError
from gpudoctor.rules import catalogue_table, explain, gendocs
from gpudoctor.rules.registry import all_rules, get

SECTIONS = ("What it detects", "Why it matters", "How to fix", "Evidence used", "Thresholds", "Known limits", "References")
EXPECTED = "Expected gain"
ISSUE_CODES = {
    "GD101", "GD102", "GD103", "GD104", "GD201", "GD202", "GD203", "GD204", "GD301", "GD302", "GD303",
    "GD401", "GD402", "GD403", "GD404", "GD501", "GD502", "GD503", "GD601", "GD701", "GD702",
}


def test_every_rule_of_the_issue_is_registered():
    assert ISSUE_CODES <= {r.code for r in all_rules()}
    assert get("gd201").name == "dataloader-stall" and get("dataloader-stall").code == "GD201"
    with pytest.raises(KeyError):
        get("GD999")


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_docstring_has_every_section_in_order(rule):
    doc = rule.doc
    assert doc.startswith(f"{rule.code} {rule.name}: ")
    found = re.findall(r"^([^\n]+)\n-{3,}$", doc, re.MULTILINE)
    # "Expected gain" (the model of what the fix wins, with its sources) follows "How to fix"
    # in the rules that have one
    assert tuple(s for s in found if s != EXPECTED) == SECTIONS
    if EXPECTED in found:
        assert found.index(EXPECTED) == found.index("How to fix") + 1
    fix = doc.split("How to fix", 1)[1].split("Evidence used", 1)[0]
    assert "Before" in fix and "After" in fix and fix.count("```") >= 4
    assert rule.check is not None and rule.needs
    assert "https://" in doc.split("References", 1)[1]


DOC_MAX_LINES = 80  # issue 42: a rule's documentation; its models in full and calibration runs go to docs/account.md


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_docstring_is_at_most_80_lines(rule):
    lines = rule.doc.splitlines()
    assert len(lines) <= DOC_MAX_LINES, (
        f"{rule.code}'s docstring has {len(lines)} lines (at most {DOC_MAX_LINES}): move its calibration runs "
        "and the model in full to docs/account.md, under a section for the rule")

@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_thresholds_named_in_docs_exist(rule):
    body = rule.doc.split("\nThresholds\n", 1)[1].split("\nKnown limits\n", 1)[0]
    heads = [line.partition(":")[0] for line in body.splitlines() if line.startswith("- ")]
    named = {n for h in heads for n in re.findall(r"`([a-z][a-z0-9_]+)`", h)}
    fields = {f.name for f in dataclasses.fields(Thresholds)}
    assert named and named <= fields, named - fields


def test_rule_modules_read_thresholds_that_exist():
    fields = {f.name for f in dataclasses.fields(Thresholds)}
    for path in Path(rules_pkg.__file__).parent.glob("gd*.py"):
        used = set(re.findall(r"\bt\.([a-z_]+)\b(?!\()", path.read_text()))
        assert used <= fields, (path.name, used - fields)


def test_every_threshold_has_a_unit_and_a_source_comment():
    src = Path(__import__("gpudoctor.config", fromlist=["x"]).__file__).read_text().splitlines()
    for f in dataclasses.fields(Thresholds):
        assert re.search(r"_(pct|ns|ms|bytes|steps|ratio|cores|count|per_step|per_tensor|compute_capability|severity)$",
                         f.name), f"{f.name}: a threshold's name ends with its unit"
        i = next(i for i, line in enumerate(src) if line.strip().startswith(f"{f.name}:"))
        comment = src[i].partition("#")[2] or src[i - 1].strip()
        assert comment.strip(), f"{f.name} needs a comment saying where its value comes from"


def test_catalogue_table_lists_every_rule():
    table = catalogue_table()
    for r in all_rules():
        assert re.search(rf"^{r.code}\s+{r.name}\s", table, re.MULTILINE)
    assert f"{len(all_rules())} rules" in table


def test_explain_prints_the_docstring():
    text = explain("GD201")
    assert text.startswith("GD201 dataloader-stall:") and "How to fix" in text
    assert explain("dataloader-stall") == text
    assert "internal-error" in explain("GD000")


def test_explain_unknown_code_says_how_to_list():
    with pytest.raises(UsageError, match="gpudoctor rules"):
        explain("GD999")


def test_explain_shows_static_examples(tmp_path, monkeypatch):
    d = tmp_path / "GD201"
    d.mkdir()
    (d / "bad_no_workers.py").write_text("loader = DataLoader(ds)\n")
    (d / "good_workers.py").write_text("loader = DataLoader(ds, num_workers=4)\n")
    monkeypatch.setattr(rules_pkg, "examples_dir", lambda: tmp_path)
    text = explain("GD201")
    assert "Examples (`gpudoctor check`)" in text
    assert "bad_no_workers.py (flagged)" in text and "num_workers=4" in text


def test_cli_rules_and_explain():
    runner = CliRunner()
    res = runner.invoke(cli, ["rules"])
    assert res.exit_code == 0 and "GD301" in res.output
    res = runner.invoke(cli, ["explain", "GD301"])
    assert res.exit_code == 0 and "pin_memory=True" in res.output


# ---------------------------------------------------------------- docs/rules


def test_docs_rules_is_up_to_date():
    stale = gendocs.stale()
    assert not stale, f"docs/rules is stale ({', '.join(stale)}): run `python -m gpudoctor.rules.gendocs`"


def test_gendocs_includes_examples_and_defaults(tmp_path):
    ex = tmp_path / "examples" / "GD301"
    ex.mkdir(parents=True)
    (ex / "bad_unpinned.py").write_text("loader = DataLoader(ds)\n")
    (ex / "good_pinned.py").write_text("loader = DataLoader(ds, pin_memory=True)\n")
    gendocs.write(tmp_path)
    page = (tmp_path / "GD301.md").read_text()
    assert page.startswith(gendocs.HEADER)
    assert "## What it detects" in page and "## References" in page
    assert "## Examples (`gpudoctor check`)" in page
    assert "### `bad_unpinned.py` (flagged)" in page and "### `good_pinned.py` (not flagged)" in page
    assert "| `pageable_h2d_share_pct` | 2.0 |" in page
    assert gendocs.stale(tmp_path) == []
    (tmp_path / "GD301.md").write_text("edited by hand\n")
    assert gendocs.stale(tmp_path) == ["GD301.md"]
    assert gendocs.main(["--check", "--root", str(tmp_path)]) == 1
    index = (tmp_path / "README.md").read_text()
    assert "[GD201](GD201.md)" in index and "GD000" in index
