"""What a rule returns: ``RuleResult``, its findings and a verdict for the checklist.

The verdict is one of

- ``FIRED``: it found something; the findings say what;
- ``FINE``: it looked at the evidence and found nothing to fix (the reason says
  what it looked at, with the numbers); ``applied=True`` when what it looked at is
  positive evidence that the technique is in use (the setting was read, the trace
  shows it), so the checklist may say "applied" rather than "no problem seen";
- ``NOT_APPLICABLE``: the technique does not apply to this run (a CPU run for a
  GPU-only setting, one epoch for a per-epoch cost, …);
- ``CANNOT_JUDGE``: the evidence it needs is missing ("no GPU in this run",
  "no stacks recorded", "no per-step records: analyse a run directory"); a rule
  never guesses silently.

``merge_results`` makes one result of the per-trace results of a multi-trace run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

from gpudoctor.model.findings import Finding
from gpudoctor.model.metrics import TraceMetrics
from gpudoctor.model.selectors import trace_label


class Verdict(str, Enum):
    FIRED = "fired"
    FINE = "fine"
    NOT_APPLICABLE = "not_applicable"
    CANNOT_JUDGE = "cannot_judge"


# When several traces (ranks) give different verdicts, the combined verdict is the
# most informative one: something fired > looked and fine > does not apply > cannot judge.
_VERDICT_ORDER = {Verdict.FIRED: 0, Verdict.FINE: 1, Verdict.NOT_APPLICABLE: 2, Verdict.CANNOT_JUDGE: 3}


@dataclass(frozen=True, slots=True)
class RuleResult:
    verdict: Verdict
    reason: str  # one line: what was looked at and what it showed, or what is missing
    findings: tuple[Finding, ...] = ()
    applied: bool = False  # FINE, and the evidence shows the technique in use (checklist: "applied")

    @staticmethod
    def fired(findings: Finding | Sequence[Finding], reason: str = "") -> RuleResult:
        fs = (findings,) if isinstance(findings, Finding) else tuple(findings)
        if not fs:
            raise ValueError("a fired result needs at least one finding")
        return RuleResult(Verdict.FIRED, reason or fs[0].message, fs)

    @staticmethod
    def fine(reason: str, *, applied: bool = False) -> RuleResult:
        """Looked and found nothing to fix; ``applied``: the evidence shows the technique in use."""
        return RuleResult(Verdict.FINE, reason, applied=applied)

    @staticmethod
    def not_applicable(reason: str) -> RuleResult:
        return RuleResult(Verdict.NOT_APPLICABLE, reason)

    @staticmethod
    def cannot_judge(reason: str) -> RuleResult:
        return RuleResult(Verdict.CANNOT_JUDGE, reason)


def merge_results(results: Sequence[tuple[TraceMetrics, RuleResult]]) -> RuleResult:
    """One result of the per-trace results of a rule: the worst finding's trace, naming the other traces where
    it also fired; else the most informative verdict (``_VERDICT_ORDER``), with its first trace's reason."""
    if len(results) == 1:
        return results[0][1]
    fired = [(m, r) for m, r in results if r.verdict == Verdict.FIRED]
    if fired:
        fired.sort(key=lambda mr: -max(_figure(f) for f in mr[1].findings))
        best_m, best = fired[0]
        others = [trace_label(m) for m, _ in fired[1:]]
        if others:
            note = f"also on {len(others)} other trace(s): {', '.join(others[:12])}" + (
                " …" if len(others) > 12 else ""
            )
            findings = tuple(
                replace(f, evidence=replace(f.evidence, notes=(*f.evidence.notes, note)))
                for f in best.findings
            )
            return RuleResult(Verdict.FIRED, best.reason, findings)
        return best
    best_verdict = min((r.verdict for _, r in results), key=lambda v: _VERDICT_ORDER[v])
    chosen = [(m, r) for m, r in results if r.verdict == best_verdict]
    reasons = [f"{trace_label(m)}: {r.reason}" for m, r in chosen]
    reason = reasons[0] if len(reasons) == 1 else f"{reasons[0]} (and {len(reasons) - 1} more trace(s))"
    return RuleResult(best_verdict, reason, applied=any(r.applied for _, r in chosen))


def _figure(f: Finding) -> float:
    """How bad a finding is, to keep the worst trace's: its share of step time, else (a headline or a
    figure that is not step time) its first percentage."""
    if f.gain.share_pct is not None:
        return f.gain.share_pct
    pct = next((m.value for m in f.evidence.metrics if m.unit == "%" and isinstance(m.value, (int, float))), 0.0)
    return float(pct)
