"""The short summary printed to stderr at the end of ``gpudoctor profile``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


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


def summarize_steps(steps: list[dict[str, Any]]) -> StepSummary:
    """Median and p90 step time and the share of step time spent waiting for data.

    Step 0 (the loop's start: worker start-up, first allocations, autotuning) is left
    out of the figures when there are other steps.
    """
    rows = [s for s in steps if isinstance(s.get("wall_ns"), int)]
    if len(rows) > 1:
        rows = [s for s in rows if s.get("index") != 0]
    if not rows:
        return StepSummary(len(steps), None, None, None)
    walls = [s["wall_ns"] / 1e6 for s in rows]
    total = sum(s["wall_ns"] for s in rows)
    wait = sum(min(s.get("data_wait_ns") or 0, s["wall_ns"]) for s in rows)
    return StepSummary(
        steps=len(steps),
        median_ms=percentile(walls, 50),
        p90_ms=percentile(walls, 90),
        data_wait_pct=100.0 * wait / total if total > 0 else None,
    )


_BY = {
    "optimizer": "optimizer steps",
    "backward": "marked by loss.backward()",
    "module": "marked by the root module's forward",
    "dataloader": "DataLoader batches",
}


def _ms(v: float) -> str:
    return f"{v:.1f} ms" if v >= 1 else f"{v * 1000:.0f} µs"


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
