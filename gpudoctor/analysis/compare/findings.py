"""``gpudoctor compare``: the findings fixed, remaining and new between the reports (``analysis.compare``).

A finding gone from B is "fixed" only when B's run was judged by that rule; a multi-rank job's
findings are matched per rank when both runs have the same ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.model.compare import (
    FindingChange,
    FindingStatus,
)
from gpudoctor.model.findings import ChecklistStatus, Finding, Report, RunData, Severity

GD000 = "GD000"  # the engine's "rule crashed" finding: not a finding about the script


@dataclass(frozen=True, slots=True)
class _Group:
    code: str
    name: str
    rank: int | None
    findings: tuple[Finding, ...]

    @property
    def top(self) -> Finding:
        return self.findings[0]  # the report's order: most severe, largest gain first

    @property
    def share(self) -> float | None:
        shares = [f.gain.share_pct for f in self.findings if f.gain.share_pct is not None]
        return max(shares) if shares else None

    @property
    def severity(self) -> Severity:
        return min((f.severity for f in self.findings), key=lambda s: s.rank)


def run_ranks(run: RunData) -> set[int]:
    return {m.rank for m in run.metrics if m.rank is not None} | {s.rank for s in run.steps if s.rank is not None}


def _groups(report: Report, per_rank: bool) -> dict[tuple[str, int | None], _Group]:
    out: dict[tuple[str, int | None], list[Finding]] = {}
    for f in report.findings:
        if f.code == GD000:
            continue
        out.setdefault((f.code, f.rank if per_rank else None), []).append(f)
    return {k: _Group(k[0], v[0].name, k[1], tuple(v)) for k, v in out.items()}


def _not_judged(report: Report, code: str) -> str:
    """Why ``report`` could not judge rule ``code`` ("" when it could)."""
    if code not in report.rules_run:
        return "the rule did not run (excluded by select/ignore, or a `gpudoctor check` rule)"
    items = [i for i in report.checklist if code in i.codes]
    if items and all(i.status == ChecklistStatus.NOT_MEASURABLE for i in items):
        return items[0].reason
    if any(f"rule {code} " in e for e in report.errors):
        return "the rule crashed"
    return ""


def finding_changes(report_a: Report, report_b: Report, per_rank: bool) -> tuple[tuple[FindingChange, ...], str]:
    """Findings matched by rule code (and by rank when both runs have the same several ranks)."""
    ga, gb = _groups(report_a, per_rank), _groups(report_b, per_rank)
    out: list[FindingChange] = []
    for key in sorted(set(ga) | set(gb), key=lambda k: (k[0], -1 if k[1] is None else k[1])):
        a, b = ga.get(key), gb.get(key)
        ref = b or a
        assert ref is not None
        note = ""
        if a is not None and b is not None:
            status = FindingStatus.REMAINING
        elif a is not None:
            why = _not_judged(report_b, key[0])
            status = FindingStatus.NOT_JUDGED if why else FindingStatus.FIXED
            if why:
                note = f"gone from B, but B could not be judged by this rule: {why}"
        else:
            status = FindingStatus.NEW
            why = _not_judged(report_a, key[0])
            if why:
                note = f"A could not be judged by this rule ({why}): it may have been there before"
        sa = a.share if a is not None else None
        sb = b.share if b is not None else None
        out.append(FindingChange(
            code=key[0],
            name=ref.name,
            status=status,
            rank=key[1],
            severity_a=a.severity.value if a is not None else None,
            severity_b=b.severity.value if b is not None else None,
            share_a_pct=sa,
            share_b_pct=sb,
            delta_pp=round(sb - sa, 3) if sa is not None and sb is not None else None,
            count_a=len(a.findings) if a is not None else 0,
            count_b=len(b.findings) if b is not None else 0,
            message_a=a.top.message if a is not None else "",
            message_b=b.top.message if b is not None else "",
            location=(b.top.location if b is not None and b.top.location is not None
                      else (a.top.location if a is not None else None)),
            note=note,
        ))
    order = {FindingStatus.FIXED: 0, FindingStatus.REMAINING: 1, FindingStatus.NEW: 2, FindingStatus.NOT_JUDGED: 3}
    out.sort(key=lambda c: (order[c.status], c.code, -1 if c.rank is None else c.rank))
    parts = []
    for status, word in ((FindingStatus.FIXED, "fixed"), (FindingStatus.REMAINING, "remaining"),
                         (FindingStatus.NEW, "new"), (FindingStatus.NOT_JUDGED, "not judged in B")):
        codes = [c.code + (f" (rank {c.rank})" if c.rank is not None else "") for c in out if c.status == status]
        if codes or status != FindingStatus.NOT_JUDGED:
            parts.append(f"{len(codes)} {word}" + (f" ({', '.join(codes)})" if codes else ""))
    return tuple(out), ", ".join(parts)


def rank_list(ranks: set[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks)) or "none"
