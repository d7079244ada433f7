"""The checklist of a ``check`` report: each technique, as the source code shows it.

The items are the engine's (``gpudoctor.rules.checklist.TECHNIQUES``: the 13
techniques of the seed checklist, then one item per rule they leave out, keyed by
the rule's name), so that a ``check`` report and a ``profile`` report list the same
keys with the same titles. Only the way each status is decided differs: an item is
recommended when one of its codes fired; else the judge of its key decides, from the
source (``StaticCheck.judges`` of one of its rules, or ``Technique.static`` for a
technique no rule covers), with the reason naming the ``file:line`` that shows it;
an item nobody judges from the source is "not measurable here".
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from gpudoctor.model.findings import ChecklistItem, ChecklistStatus, Finding, Gain
from gpudoctor.rules.checklist import TECHNIQUES
from gpudoctor.rules.registry import all_rules, get, static_codes
from gpudoctor.rules.static_api import StaticContext, StaticJudge

_STATIC_NOTE = "not measured: `gpudoctor profile` puts it in step time"

R = ChecklistStatus.RECOMMENDED
NM = ChecklistStatus.NOT_MEASURABLE


def checklist_rows() -> list[tuple[str, str, int | None, tuple[str, ...]]]:
    """(key, title, technique number, codes) of every item, in the engine's order."""
    rows: list[tuple[str, str, int | None, tuple[str, ...]]] = [
        (t.key, t.title, t.number, t.codes) for t in TECHNIQUES
    ]
    covered = {c for t in TECHNIQUES for c in t.codes}
    rows += [(r.name, r.technique or r.title, None, (r.code,)) for r in all_rules() if r.code not in covered]
    return rows


@cache
def judges() -> dict[str, StaticJudge]:
    """Technique key → the judge that decides it from the source: a rule's, or the technique's own."""
    found: dict[str, StaticJudge] = {}
    owners: dict[str, str] = {}
    for rule in all_rules():
        for key, judge in (rule.static.judges.items() if rule.static is not None else ()):
            if key in found:
                raise RuntimeError(f"checklist item {key} is judged by both {owners[key]} and {rule.code}")
            found[key], owners[key] = judge, rule.code
    for t in TECHNIQUES:
        if t.static is not None:
            if t.key in found:
                raise RuntimeError(f"checklist item {t.key} is judged by both {owners[t.key]} and the technique")
            found[t.key] = t.static
    return found


def build_checklist(
    src: StaticContext, findings: tuple[Finding, ...], enabled: Callable[[str], bool]
) -> tuple[ChecklistItem, ...]:
    """One item per checklist row. ``enabled(code)`` says whether a code runs under the configuration."""
    fired: dict[str, list[Finding]] = {}
    for f in findings:
        fired.setdefault(f.code, []).append(f)
    items: list[ChecklistItem] = []
    for key, title, technique, codes in checklist_rows():
        status, reason = _judge(key, src, fired, codes, enabled)
        gain = Gain(None, None, _STATIC_NOTE) if status is R else None
        items.append(ChecklistItem(key, title, status, reason, codes, gain, technique))
    return tuple(items)


def _recommends(code: str, finding: Finding) -> bool:
    static = get(code).static
    return static is None or static.recommends is None or static.recommends(finding)


def _judge(key: str, src: StaticContext, fired, codes, enabled) -> tuple[ChecklistStatus, str]:
    hits = [f for c in codes for f in fired.get(c, []) if _recommends(c, f)]
    if hits:
        first = hits[0]
        more = f" (and {len(hits) - 1} more)" if len(hits) > 1 else ""
        return R, f"{first.code}: {first.message}{more}"
    checked = static_codes()
    mine = [c for c in codes if c in checked]
    if mine and not any(enabled(c) for c in mine):
        return NM, f"{', '.join(mine)} disabled by the rule selection"
    judge = judges().get(key)
    if judge is None:
        runtime = ", ".join(codes) or "it"
        return NM, f"a run-time measurement: {runtime} needs `gpudoctor profile`"
    status, reason = judge(src)
    # findings of its codes that do not recommend the technique (workers kept across epochs, a deprecated
    # spelling of autocast): the item keeps its status and names them
    others = [f for c in codes for f in fired.get(c, [])]
    if others:
        more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
        reason = f"{reason}; see {others[0].code}: {others[0].message}{more}"
    return status, reason
