"""What the profilers recorded of the user's code: Kineto's Python frames, cProfile's entries, and
whether a trace holds enough profiled steps."""

from __future__ import annotations

import re

from gpudoctor.model.findings import Location
from gpudoctor.model.metrics import DispatchStats, WindowKind
from gpudoctor.model.run import PstatsEntry

_FRAME_RE = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\):\s*(?P<func>.*)$")


def parse_frame(frame: str) -> Location | None:
    """``"train.py(42): train_step"`` (Kineto's python_function name) as a ``Location``."""
    m = _FRAME_RE.match(frame.strip())
    if not m:
        return None
    return Location(file=m.group("file"), line=int(m.group("line")), function=m.group("func"))


def pstats_total_s(entries: tuple[PstatsEntry, ...]) -> float:
    """The profiled time: the largest cumulative time of any entry (the outermost call)."""
    return max((e.cumtime_s for e in entries), default=0.0)


MIN_MEASURED_STEPS = 2  # a typical step from fewer is one step's accident, not the run's habit


def too_few_steps(d: DispatchStats) -> str | None:
    """Why a trace's steps are too few to clear the loop of a problem (None when enough): a run
    stopped inside its only window, or a window cut short, leaves one profiled step."""
    if d.window == WindowKind.STEPS and d.steps < MIN_MEASURED_STEPS:
        return (f"not measurable: the trace holds {d.steps} profiled step (at least {MIN_MEASURED_STEPS} make a "
                "typical one); profile more steps (`gpudoctor profile --steps N`, N of 30 or more)")
    return None
