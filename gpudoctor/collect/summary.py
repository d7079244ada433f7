"""The short summary printed to stderr at the end of ``gpudoctor profile``."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from gpudoctor.model.units import duration_text


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty list."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class StepSummary:
    steps: int
    median_ms: float | None
    p90_ms: float | None
    data_wait_pct: float | None


def steady_rows(steps: list[dict[str, Any]], step_source: str | None = None) -> list[dict[str, Any]]:
    """The steps the report's figures are of (``RuleContext.steady_steps``, the same rule on the
    raw records): those of the marker that defines the run, without the first step (and the first
    of each epoch when epochs are known)."""
    rows = [s for s in steps if isinstance(s.get("wall_ns"), int)]
    if step_source and rows and rows[-1].get("marker"):
        final = [s for s in rows if s.get("marker") == step_source]
        if final and len(final) < len(rows):
            rows = final
    if len(rows) < 2:
        return rows
    if all(s.get("epoch") is None for s in rows):
        firsts = {id(rows[0])}
    else:
        seen: set[Any] = set()
        firsts = set()
        for s in rows:
            if s.get("epoch") not in seen:
                seen.add(s.get("epoch"))
                firsts.add(id(s))
    rest = [s for s in rows if id(s) not in firsts]
    return rest or rows


def nearest_rank(values: list[int], q: float) -> int:
    """Nearest-rank percentile (q in 0..100) of a non-empty list: the report's p90."""
    xs = sorted(values)
    k = max(0, min(len(xs) - 1, int(-(-q * len(xs) // 100)) - 1))
    return xs[k]


def summarize_steps(steps: list[dict[str, Any]], step_source: str | None = None) -> StepSummary:
    """Median and p90 step time and the share of step time spent waiting for data, of the steady
    steps, computed as the report computes them (the stderr line and the report print one value)."""
    rows = steady_rows(steps, step_source)
    if not rows:
        return StepSummary(len(steps), None, None, None)
    walls = [s["wall_ns"] for s in rows]
    total = sum(walls)
    wait = sum(s.get("data_wait_ns") or 0 for s in rows)
    # rounded as the report's summary rounds its figures (engine._stat: 3 decimals), so that a value
    # just under a rounding edge (3.4496 ms) prints the same here as there (3.4 ms, not 3.5)
    return StepSummary(
        steps=len(steps),
        median_ms=round(int(statistics.median(walls)) / 1e6, 3),
        p90_ms=round(nearest_rank(walls, 90) / 1e6, 3),
        data_wait_pct=round(100.0 * wait / total, 3) if total > 0 else None,
    )


_BY = {
    "optimizer": "optimizer steps",
    "backward": "marked by loss.backward()",
    "module": "marked by the root module's forward",
    "dataloader": "DataLoader batches",
}


def _ms(v: float) -> str:
    return duration_text(v * 1e6)  # as the report prints it


def summary_lines(
    s: StepSummary, source: str, status: str, detail: str, exit_code: int | None, run_dir: str, not_collected: list[str]
) -> list[str]:
    lines = []
    if s.steps and s.median_ms is not None:
        by = _BY.get(source, source)
        line = f"gpudoctor: {s.steps} steps ({by}); step time median {_ms(s.median_ms)}, p90 {_ms(s.p90_ms or 0)}"
        if s.data_wait_pct is not None:
            line += f"; waiting for data {s.data_wait_pct:.1f}% of step time"
        lines.append(line)
    elif source == "time":
        lines.append("gpudoctor: no training steps seen (no optimizer step, backward(), model call or DataLoader batch); "
                     "a time-based window of the script was recorded instead")
    else:
        lines.append("gpudoctor: no training steps seen (no optimizer step, backward(), model call or DataLoader batch)")
    how = status + (f": {detail}" if detail else "")
    if exit_code is not None:
        how += f", exit code {exit_code}"
    lines.append(f"gpudoctor: run {how}")
    for reason in not_collected:
        lines.append(f"gpudoctor: not collected: {reason}")
    lines.append(f"gpudoctor: run directory {run_dir}")
    return lines
