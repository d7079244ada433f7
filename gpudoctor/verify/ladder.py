"""The ladder: a sized knob (num_workers, batch_size) not confirmed at its first setting is tried
at the next rungs while each does better."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpudoctor.config import Thresholds
from gpudoctor.model import (
    Injection,
    LadderRung,
    Settings,
    Verification,
    VerifyStatus,
)
from gpudoctor.verify.judging import _n, _x, judge
from gpudoctor.verify.plan import LADDER_MAX_BATCH_RUNGS, SIZED_KNOBS, _Arm, _say

if TYPE_CHECKING:
    from gpudoctor.verify.trials import _Session

def sized_knob(changes: Sequence[Injection], settings: Settings | None) -> tuple[int, Injection] | None:
    """The change the ladder climbs: a DataLoader's num_workers (first) or batch_size that the fix
    *raises* above what the profiled run's DataLoader at that call site used (a fix that lowers one,
    GD204's fewer workers, is not climbed); None when there is none or the current value is unknown."""
    loaders = settings.dataloaders if settings is not None else ()
    for key in SIZED_KNOBS:
        for i, c in enumerate(changes):
            if c.kind != "dataloader" or c.key != key or not isinstance(c.value, int) or isinstance(c.value, bool):
                continue
            now = next((getattr(d, key) for d in loaders if d.call_site == c.call_site), None)
            if isinstance(now, int) and c.value > now:
                return i, c
    return None


def ladder_values(knob: Injection, cores: int | None, thresholds: Thresholds) -> list[int]:
    """The rungs above the knob's first setting: num_workers ×2 up to ``verify_workers_per_core_ratio`` ×
    cores; batch_size ×2, ``LADDER_MAX_BATCH_RUNGS`` times at most (a run that fails stops the climb)."""
    v = int(knob.value)
    out: list[int] = []
    if knob.key == "num_workers":
        cap = max(1, int(thresholds.verify_workers_per_core_ratio * (cores or 1)))
        nxt = max(1, 2 * v)
        while nxt <= cap:
            out.append(nxt)
            nxt *= 2
    elif knob.key == "batch_size" and v > 0:
        out = [v * 2 ** k for k in range(1, LADDER_MAX_BATCH_RUNGS + 1)]
    return out


def _rung_changes(changes: Sequence[Injection], i: int, value: int) -> tuple[Injection, ...]:
    knob = changes[i]
    text = re.sub(rf"\b{re.escape(knob.key)}={knob.value!r}", f"{knob.key}={value!r}", knob.text) if knob.text else ""
    return (*changes[:i], dataclasses.replace(knob, value=value, text=text), *changes[i + 1:])


def _rung(knob: Injection, value: int, v: Verification) -> LadderRung:
    return LadderRung(knob.key, value, v.status, v.speedup, v.ci, v.confidence_pct, v.trials, v.reason)


def _climb(session: _Session, arm: _Arm, first: Verification, baseline: _Arm, t: Thresholds,
           profiled: int | None, settings: Settings | None) -> Verification:
    """Try the rungs above a sized knob's first setting (refuted or inconclusive there): ``trials``
    rounds each against baseline runs of the same rounds, while each rung is faster than the best so
    far by at least the minimum effect (``verify_min_speedup_ratio``: a setting that buys less is not
    worth its processes or memory), no run fails and the budget holds. The rungs share the error rate (Bonferroni over the rungs
    planned). Returns the best confirmed rung's verdict, with the whole ladder; else ``first``, with it."""
    opts = session.opts
    found = sized_knob(arm.changes, settings)
    if found is None:
        return first
    i, knob = found
    values = ladder_values(knob, session.manifest.cpu_count, t)
    if not values:
        return first
    from gpudoctor.analysis.stats import bonferroni_confidence_pct  # noqa: PLC0415 - scipy

    level = bonferroni_confidence_pct(opts.confidence_pct, len(values))
    rungs = [_rung(knob, int(knob.value), first)]
    best: Verification | None = None
    best_speedup = first.speedup or 0.0
    _say(opts, f"gpudoctor: verify: {arm.label} {knob.key}={knob.value} {first.status.value}; trying "
               f"{', '.join(f'{knob.key}={x}' for x in values)} while each does better ({level:g}% intervals: the "
               f"error rate shared over {_n(len(values), 'rung')})")
    for value in values:
        if session.interrupted or not session.fits_round([arm]):  # a rung runs about as long as its arm
            if not session.interrupted:
                session.out_of_budget = True
            break
        rung = _Arm(f"{arm.label}@{knob.key}={value}", _rung_changes(arm.changes, i, value), statistic=arm.statistic)
        for _ in range(opts.trials):
            if not session.round(baseline, [rung], f" ({knob.key}={value})"):
                break
        if not rung.runs:
            break
        one = dataclasses.replace(opts, confidence_pct=level)
        v = judge(rung, baseline, t, one, session.interrupted, profiled_ns=profiled)
        rungs.append(_rung(knob, value, v))
        if v.errors or any(not r.ok for r in rung.runs):
            break  # out of memory, or the script refuses it: the rungs above would fail too
        better = v.speedup is not None and v.speedup >= best_speedup * t.verify_min_speedup_ratio
        if v.status == VerifyStatus.CONFIRMED and (best is None or better):
            best = v
        if not better:
            break  # not better than the best below it by the minimum effect: more of the knob buys nothing
        best_speedup = v.speedup
    ladder = tuple(rungs)
    table = "; ".join(
        f"{r.knob}={r.value} {r.status.value} {_x(r.speedup)}"
        + (f" [{_x(r.ci[0])}–{_x(r.ci[1])}]" if r.ci else "") for r in ladder
    )
    if best is None:
        return dataclasses.replace(first, ladder=ladder,
                                   reason=f"{first.reason}; the ladder confirmed no setting ({table})")
    value = next(c.value for c in best.changes if c.kind == "dataloader" and c.key == knob.key)
    name = f"{knob.key}={value}"
    ci = f"{best.confidence_pct:g}% CI {_x(best.ci[0])}–{_x(best.ci[1])}" if best.ci else "no interval"
    return dataclasses.replace(
        best, ladder=ladder, measured_best=name,
        reason=(f"measured best: {name}, {_x(best.speedup)} faster ({ci}); {knob.key}={knob.value} first was "
                f"{first.status.value} ({_x(first.speedup)}); ladder: {table}. {name}: {best.reason}"),
    )
