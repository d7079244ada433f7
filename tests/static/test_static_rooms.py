"""A rule is one room: its static check, checklist judges and examples live in its module.

- every code `gpudoctor check` reports has its examples in its rule's module, and
  docs/rules/examples holds exactly those (generated from the modules);
- rules/ never imports static/: the static checks are written against rules.static_api;
- a checklist item is judged from the source by a rule of that item;
- the toy rule of docs/adding-a-rule.md, added to the catalogue as one module, reports
  its code, judges its checklist item and gets its docs page.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from functools import cache
from pathlib import Path

import pytest

from gpudoctor.config import Config
from gpudoctor.rules import explain, gendocs, registry
from gpudoctor.rules.checklist import TECHNIQUES
from gpudoctor.rules.registry import all_rules, get, static_codes
from gpudoctor.static import STATIC_CODES, check_paths
from gpudoctor.static import calls as scanner_calls
from gpudoctor.static import checklist as static_checklist
from gpudoctor.static.checklist import checklist_rows

ROOT = Path(__file__).resolve().parents[2]


def test_static_codes_are_the_rules_with_a_static_check():
    assert STATIC_CODES == static_codes()
    assert set(STATIC_CODES) == {r.code for r in all_rules() if r.static is not None and r.static.check is not None}


@pytest.mark.parametrize("code", STATIC_CODES)
def test_every_static_code_has_its_examples_in_its_module(code):
    rule = get(code)
    assert [e for e in rule.examples if e.flagged], f"{code}: no bad_*.py example in its module"
    assert [e for e in rule.examples if not e.flagged], f"{code}: no good_*.py example in its module"


def test_docs_examples_are_generated_from_the_modules():
    assert gendocs.stray_examples() == []
    for rule in all_rules():
        for e in rule.examples:
            path = ROOT / "docs" / "rules" / "examples" / rule.code / e.name
            assert path.read_text(encoding="utf-8") == e.source, f"{path}: run `python -m gpudoctor.rules.gendocs`"


def test_rules_never_import_the_static_package():
    """DESIGN's layers: static/ imports rules/, not the reverse (type-checking imports included)."""
    wrong = []
    for path in sorted((ROOT / "gpudoctor" / "rules").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n == "gpudoctor.static" or n.startswith("gpudoctor.static.") for n in names):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module == "gpudoctor" and any(
                a.name == "static" for a in node.names
            ):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert wrong == []


def test_each_checklist_item_is_judged_by_one_of_its_rules():
    rows = {key: codes for key, _title, _n, codes in checklist_rows()}
    for rule in all_rules():
        for key in rule.static.judges if rule.static is not None else ():
            assert key in rows, f"{rule.code} judges {key!r}, which is no checklist item"
            assert rule.code in rows[key], f"{rule.code} judges {key!r}, an item of {rows[key]}"
    judged = static_checklist.judges()
    for t in TECHNIQUES:
        if t.static is not None:
            assert not t.codes, f"{t.key}: a technique with rules is judged by one of them"
        assert (t.key in judged) or t.codes, t.key


# ---------------------------------------------------------------- the toy rule of docs/adding-a-rule.md


def _toy_source() -> str:
    page = (ROOT / "docs" / "adding-a-rule.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- toy-rule:[^\n]*-->\n````python\n(.*?)\n````", page, re.DOTALL)
    assert m, "docs/adding-a-rule.md lost its toy rule"
    return m.group(1) + "\n"


def _clear_caches() -> None:
    scanner_calls.hooks.cache_clear()
    static_checklist.judges.cache_clear()


@pytest.fixture
def toy_rule(tmp_path, monkeypatch):
    """The toy rule as one more rule module of gpudoctor.rules, in the catalogue that every consumer reads."""
    name = "gpudoctor.rules.gd599_zero_grad_memset"
    path = tmp_path / "gd599_zero_grad_memset.py"
    path.write_text(_toy_source(), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    catalogue = tuple(sorted((*all_rules(), module.RULE), key=lambda r: r.code))
    with_toy = cache(lambda: catalogue)
    monkeypatch.setattr(registry, "all_rules", with_toy)
    monkeypatch.setattr(static_checklist, "all_rules", with_toy)
    _clear_caches()
    try:
        yield module.RULE
    finally:
        monkeypatch.undo()
        _clear_caches()


def test_the_toy_rule_of_the_guide_is_one_module(toy_rule, tmp_path):
    assert toy_rule.name == "zero-grad-memset" and "GD599" in static_codes()
    assert re.findall(r"^([^\n]+)\n-{3,}$", toy_rule.doc, re.MULTILINE) == [
        "What it detects", "Why it matters", "How to fix", "Evidence used", "Thresholds", "Known limits", "References",
    ]
    bad = next(e for e in toy_rule.examples if e.flagged)
    good = next(e for e in toy_rule.examples if not e.flagged)
    for e in (bad, good):
        (tmp_path / e.name).write_text(e.source, encoding="utf-8")

    flagged = check_paths([tmp_path / bad.name], Config())
    mine = [f for f in flagged.findings if f.code == "GD599"]
    assert len(mine) == 1 and mine[0].name == "zero-grad-memset" and mine[0].location.line == 3
    assert mine[0].fix.after == "optimizer.zero_grad(set_to_none=True)"
    assert "GD599" in flagged.rules_run
    item = next(i for i in flagged.checklist if i.key == "zero-grad-memset")
    assert item.status.value == "recommended" and item.title == toy_rule.technique

    clean = check_paths([tmp_path / good.name], Config())
    assert [f for f in clean.findings if f.code == "GD599"] == []
    item = next(i for i in clean.checklist if i.key == "zero-grad-memset")
    assert item.status.value == "no_problem_seen" and "no zero_grad(set_to_none=False)" in item.reason

    ignored = check_paths([tmp_path / bad.name], Config(ignore=("GD599",)))
    assert [f for f in ignored.findings if f.code == "GD599"] == []

    assert "bad_memset.py (flagged)" in explain("GD599")
    page = gendocs.rule_markdown(toy_rule, tmp_path / "no-examples-folder")
    assert page.startswith(gendocs.HEADER) and "### `good_default.py` (not flagged)" in page


def test_the_toy_rule_is_a_static_code_while_added(toy_rule):
    assert "GD599" in static_codes()


def test_after_the_toy_rule_the_catalogue_is_as_before():
    assert "GD599" not in static_codes() and "GD599" not in {r.code for r in all_rules()}
    assert scanner_calls.hooks().methods.get("zero_grad") is None


def test_a_rule_cannot_hook_a_call_the_scanner_handles(monkeypatch):
    from gpudoctor.rules.registry import Rule
    from gpudoctor.rules.static_api import StaticCheck, Watch

    greedy = Rule(
        code="GD598", name="greedy", title="hooks DataLoader", doc="GD598 greedy: x",
        static=StaticCheck(watch=Watch(calls={"torch.utils.data.DataLoader": lambda scan, node, q: None})),
    )
    catalogue = (*all_rules(), greedy)
    monkeypatch.setattr(registry, "all_rules", cache(lambda: catalogue))
    _clear_caches()
    try:
        with pytest.raises(RuntimeError, match="GD598: the scanner handles torch.utils.data.DataLoader itself"):
            scanner_calls.hooks()
    finally:
        monkeypatch.undo()
        _clear_caches()
