"""The short summary printed to stderr at the end of ``gpudoctor profile``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpudoctor.model.run import DataLoaderSetting, Settings, StepRecord, status_text
from gpudoctor.model.steady import compile_steps, main_dataloader, steady_steps, step_figures
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
    step_ms: float | None  # the step time: the mean over the unprofiled steady steps (the report's)
    median_ms: float | None
    p90_ms: float | None
    data_wait_pct: float | None


def step_records(rows: list[dict[str, Any]]) -> list[StepRecord]:
    """The rows of steps.jsonl as the report reads them (a row without the required fields is
    left out, as ``parse`` leaves it out)."""
    out = []
    for row in rows:
        try:
            out.append(StepRecord.from_dict(row))
        except (TypeError, ValueError, KeyError):
            continue
    return out


def _settings(settings: Any) -> Settings | None:
    if not isinstance(settings, dict):
        return None
    try:
        return Settings.from_dict(settings)
    except (TypeError, ValueError, KeyError):
        return None


def main_loader(settings: Any) -> DataLoaderSetting | None:
    """The DataLoader the loop iterates (``model.steady.main_dataloader``), from settings.json as
    read (None when it is missing or unreadable)."""
    if not isinstance(settings, dict):
        return None
    try:
        return main_dataloader(Settings.from_dict(settings))
    except (TypeError, ValueError, KeyError):
        return None


def summarize_steps(
    steps: list[dict[str, Any]], step_source: str | None = None, loader: DataLoaderSetting | None = None,
    settings: Any = None,
) -> StepSummary:
    """The step time (the mean), its median and p90, and the share of step time spent waiting for data, of the steady
    steps (``loader``: the DataLoader the loop iterates, whose workers' first batches are left out;
    ``settings``: settings.json as read, whose torch.compile compilations leave their steps out),
    computed by the function the report's summary uses (``model.steady``): the stderr line and
    the report print one value."""
    records = step_records(steps)
    compiled = compile_steps(_settings(settings), records)
    figs = step_figures(steady_steps(records, step_source, loader, compiled))
    per_rank: dict[int | None, int] = {}
    for r in records:
        per_rank[r.rank] = per_rank.get(r.rank, 0) + 1
    # several ranks: the steps of one rank (the most any rank recorded), as the report counts them
    count = max(per_rank.values()) if len(per_rank) > 1 else len(steps)
    return StepSummary(steps=count, step_ms=figs.step_ms, median_ms=figs.median_ms, p90_ms=figs.p90_ms,
                       data_wait_pct=figs.data_wait_pct)


_BY = {
    "optimizer": "optimizer steps",
    "backward": "marked by loss.backward()",
    "module": "marked by the root module's forward",
    "dataloader": "DataLoader batches",
}


def _ms(v: float) -> str:
    return duration_text(v * 1e6)  # as the report prints it


def summary_lines(
    s: StepSummary, source: str, status: str, detail: str, exit_code: int | None, run_dir: str, not_collected: list[str],
    warnings: list[str] | None = None,
) -> list[str]:
    """The summary's lines; ``warnings`` (``Manifest.warnings``: the step figures are partial …) follow
    the steps' line, as the report puts them before its figures."""
    lines = []
    if s.steps and s.step_ms is not None:
        by = _BY.get(source, source)
        line = (f"gpudoctor: {s.steps} steps ({by}); step time {_ms(s.step_ms)} (mean), median {_ms(s.median_ms or 0)}, "
                f"p90 {_ms(s.p90_ms or 0)}")
        if s.data_wait_pct is not None:
            # a share is kept to 2 decimals everywhere (the report's summary and metrics): the same value, shown
            # to 1 decimal, reads the same here (37.748 -> 37.75 -> 37.8 in both, not 37.7 here)
            line += f"; waiting for data {round(s.data_wait_pct, 2):.1f}% of step time"
        lines.append(line)
    elif source == "time":
        lines.append("gpudoctor: no training steps seen (no optimizer step, backward(), model call or DataLoader batch); "
                     "a time-based window of the script was recorded instead")
    else:
        lines.append("gpudoctor: no training steps seen (no optimizer step, backward(), model call or DataLoader batch)")
    lines.extend(f"gpudoctor: warning: {w}" for w in warnings or ())
    how = status_text(status, detail, ": {}")
    if exit_code is not None:
        how += f", exit code {exit_code}"
    lines.append(f"gpudoctor: run {how}")
    for reason in not_collected:
        lines.append(f"gpudoctor: not collected: {reason}")
    lines.append(f"gpudoctor: run directory {run_dir}")
    return lines
