"""Statements a reader can check against their own figures: each sentence's numbers come from one
statistic, so that a share and the two times beside it agree (``share ≈ part / whole`` within the
rounding of what is printed), a model's "X% of the W wait won" is what its own "= after, against now"
gives, a speed-up is its share of step time, and a top action's step after is its share of "now".

``disagreements(texts)`` returns the sentences that do not check out, each with why. Used by
``test_report_figures_agree.py`` on reports of synthetic runs, of real CPU runs and of the recorded
GPU runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpudoctor.model import Report

_NUM = r"(\d+(?:\.\d+)?)"
_DUR = _NUM + r" ?(ns|µs|ms|s)\b"
_SCALE = {"ns": 1.0, "µs": 1e3, "ms": 1e6, "s": 1e9}

# "waits 28.9% of step time for the next batch (52.84 ms of a 193.10 ms step, …)",
# "idle 99.8% of the 1 step windows (223.80 ms of 224.19 ms)"
SHARE_OF = re.compile(_NUM + r"% of [^;()]*?\(" + _DUR + r" of (?:a |an |the )?" + _DUR)
# "… = 137.25 ms, against 191.81 ms now (…): 98.2% of the 55.56 ms wait won"
WON = re.compile(r"= " + _DUR + r",? against " + _DUR + r"(?: now)?(?: \([^)]*\))?: " + _NUM + r"% of the "
                 + _DUR + r" [\w ]+? won")
# "expected −28.4% of step time, about 1.40× faster", "at most 28.9% of step time at stake, up to 1.41× faster"
SPEEDUP = re.compile(r"(?:expected −|at most )" + _NUM + r"% of step time(?: at stake)?, (?:about|up to) "
                     + _NUM + r"× faster")
# Top actions: "now 193.1 ms per step (…)" and "−28.4% expected (up to −28.9%) of step time → about 138.3 ms
# (≥ 137.3 ms) per step"
NOW = re.compile(r"now " + _DUR + r" per step")
ACTION = re.compile(r"(?:−" + _NUM + r"% (?:expected|measured by --verify) \(up to −" + _NUM
                    + r"%\) of step time → about " + _DUR + r" \(≥ " + _DUR + r"\)"
                    + r"|up to −" + _NUM + r"% of step time → ≥ " + _DUR + r") per step")


def _ns(value: str, unit: str) -> float:
    return float(value) * _SCALE[unit]


def _half_unit(value: str) -> float:
    """Half the last printed digit of ``value``, relative to it (the rounding a printed figure carries)."""
    decimals = len(value.split(".", 1)[1]) if "." in value else 0
    v = float(value)
    return 0.5 * 10.0 ** -decimals / v if v else 0.0


def _share_checks(text: str) -> Iterable[str]:
    for m in SHARE_OF.finditer(text):
        pct, a, ua, b, ub = m.groups()
        part, whole = _ns(a, ua), _ns(b, ub)
        if whole <= 0:
            continue
        ratio = 100.0 * part / whole
        tol = 0.05 + ratio * (_half_unit(a) + _half_unit(b)) + 1e-9
        if abs(float(pct) - ratio) > tol:
            yield f"{pct}% beside {a} {ua} of {b} {ub} (= {ratio:.2f}%): {m.group(0)!r}"


def _won_checks(text: str) -> Iterable[str]:
    for m in WON.finditer(text):
        after, ua, now, un, pct, wait, uw = m.groups()
        w = _ns(wait, uw)
        if w <= 0:
            continue
        won = max(0.0, min(100.0, 100.0 * (_ns(now, un) - _ns(after, ua)) / w))
        if text.startswith(" (a win of ", m.end()) and " is under " in text[m.end():m.end() + 200]:
            won = 0.0  # the model's resolution (the hand-over, or the noise of its steps): none promised
        spread = _ns(now, un) * _half_unit(now) + _ns(after, ua) * _half_unit(after)
        tol = 0.05 + 100.0 * spread / w + won * _half_unit(wait)
        if abs(float(pct) - won) > tol:
            yield f"{pct}% won beside after {after} {ua}, now {now} {un}, wait {wait} {uw} (= {won:.2f}%): {m.group(0)!r}"


def _speedup_checks(text: str) -> Iterable[str]:
    for m in SPEEDUP.finditer(text):
        pct, x = float(m.group(1)), float(m.group(2))
        if pct + 0.05 >= 100.0:
            continue
        # the share is printed to 0.1 pp: the speed-up of any share it rounds from, printed to 0.01
        lo, hi = 1.0 / (1.0 - (pct - 0.05) / 100.0), 1.0 / (1.0 - (pct + 0.05) / 100.0)
        half = x * _half_unit(m.group(2))  # the speed-up as printed (3 figures: 1.27×, 10.8×)
        if not lo - half - 1e-9 <= x <= hi + half + 1e-9:
            yield f"{m.group(2)}× beside {m.group(1)}% of step time (= {1.0 / (1.0 - pct / 100.0):.3f}×): {m.group(0)!r}"


def _action_checks(text: str) -> Iterable[str]:
    """The top actions of one rendered account: each step after is "now" less the shares before it."""
    now_m = NOW.search(text)
    if now_m is None:
        return
    now = _ns(*now_m.groups())
    left_exp = left_bound = 100.0
    for k, m in enumerate(ACTION.finditer(text), 1):
        exp, bound, x, ux, y, uy, only, y2, uy2 = m.groups()
        if only is not None:  # no model: the bound alone, which the expected step loses too
            exp = bound = only
            y, uy, x = y2, uy2, None
        left_exp -= float(exp)
        left_bound -= float(bound)
        for printed, unit, left in ((x, ux, left_exp), (y, uy, left_bound)):
            if printed is None:
                continue
            want = now * max(left, 0.0) / 100.0
            # each share so far printed to 0.1 pp, "now" and the figure rounded as printed
            tol = (now * 0.0005 * k + _ns(printed, unit) * _half_unit(printed)
                   + want * _half_unit(now_m.group(1)) + 1e-9)
            if abs(_ns(printed, unit) - want) > tol:
                yield (f"{printed} {unit} per step after, where now {now_m.group(1)} {now_m.group(2)} less "
                       f"{100 - left:.1f}% is {want / 1e6:.3f} ms: {m.group(0)!r}")


def disagreements(texts: Iterable[str]) -> list[str]:
    """The sentences of ``texts`` whose figures do not agree with one another."""
    out: list[str] = []
    for text in texts:
        out += [*_share_checks(text), *_won_checks(text), *_speedup_checks(text)]
    return out


def checked(text: str) -> int:
    """How many sentences of ``text`` the checks read (a check that found nothing to read proves nothing)."""
    return sum(len(p.findall(text)) for p in (SHARE_OF, WON, SPEEDUP, ACTION))


def report_texts(report: Report) -> list[str]:
    """Every sentence of a report that carries figures: each finding's message, fix, gain and notes."""
    out = []
    for f in report.findings:
        out += [f.message, f.fix.instruction, f.gain.note or "", f.gain.expected_note or "", *f.evidence.notes]
    return [t for t in out if t]


def report_disagreements(report: Report, rendered: str = "") -> list[str]:
    """:func:`disagreements` over a report's findings, and the top actions of its rendering (terminal)."""
    from gpudoctor.report import render  # noqa: PLC0415

    out = disagreements(report_texts(report))
    text = rendered or render(report, "terminal")
    head = text.split("\nSummary", 1)[0]  # the account and its top actions
    out += list(_action_checks(head))
    out += disagreements([text])  # the rendered gain lines ("expected −…, about …× faster")
    return sorted(set(out))
