"""When the instruments run: torch.profiler windows and the cProfile window, by step index.

Pure functions of the step index (no torch), shared by the child (which drives the
profilers) and by tests and ``benchmarks/overhead.py`` (which must know which steps
were instrumented).

torch.profiler windows: ``skip_first`` steps run untouched, then a window of
``warmup`` steps (profiler on, events discarded) and ``active`` steps (recorded and
exported as one trace), then ``wait`` steps untouched before the next window, for
``repeat`` windows (0: until the script ends). The first window therefore begins
right after ``skip_first``, so that ``--steps 40`` is still profiled.

cProfile: one window that begins when the first torch.profiler window has ended (at
``skip_first`` when torch.profiler does not run) and lasts ``cprofile_steps`` steps,
cut short when the next torch.profiler window begins, or when its measured cost
exceeds its budget (see :class:`CprofileBudget`).

Shapes, stacks and memory are recorded in the first ``detail_windows`` windows only
(0: all); later windows record timings (a detailed window costs 3-4x a plain one).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpudoctor.model import ProfilerSchedule

NONE = ""
WARMUP = "warmup"
ACTIVE = "active"
CPROFILE = "cprofile"


def phase(step: int, s: ProfilerSchedule) -> str:
    """torch.profiler phase of step ``step`` (0-based): "", "warmup" or "active"."""
    if step < s.skip_first or s.active <= 0:
        return NONE
    cycle = s.warmup + s.active + s.wait
    n, r = divmod(step - s.skip_first, cycle)
    if s.repeat and n >= s.repeat:
        return NONE
    if r < s.warmup:
        return WARMUP
    if r < s.warmup + s.active:
        return ACTIVE
    return NONE


def is_last_active(step: int, s: ProfilerSchedule) -> bool:
    """True for the last recorded step of a window (its trace is exported after it)."""
    if phase(step, s) != ACTIVE:
        return False
    r = (step - s.skip_first) % (s.warmup + s.active + s.wait)
    return r == s.warmup + s.active - 1


def window_start(step: int, s: ProfilerSchedule) -> int:
    """First active step of the window that ``step`` belongs to (names the trace file)."""
    cycle = s.warmup + s.active + s.wait
    n = (step - s.skip_first) // cycle
    return s.skip_first + n * cycle + s.warmup


def next_window_start(step: int, s: ProfilerSchedule) -> int | None:
    """First instrumented step (warm-up included) at or after ``step``; None when none is left."""
    if s.active <= 0:
        return None
    if step <= s.skip_first:
        return s.skip_first
    cycle = s.warmup + s.active + s.wait
    n, r = divmod(step - s.skip_first, cycle)
    if r < s.warmup + s.active:
        candidate = step
    else:
        n += 1
        candidate = s.skip_first + n * cycle
    if s.repeat and n >= s.repeat:
        return None
    return candidate


def windows(s: ProfilerSchedule, total_steps: int) -> list[tuple[int, int]]:
    """[(first, last)] instrumented steps (warm-up included) of every window within ``total_steps``."""
    out = []
    if s.active <= 0:
        return out
    cycle = s.warmup + s.active + s.wait
    n = 0
    while True:
        if s.repeat and n >= s.repeat:
            break
        first = s.skip_first + n * cycle
        if first >= total_steps:
            break
        out.append((first, min(first + s.warmup + s.active, total_steps) - 1))
        n += 1
    return out


def cprofile_start(s: ProfilerSchedule | None) -> int:
    """First step of the cProfile window: right after the first torch.profiler window."""
    if s is None or s.active <= 0:
        return s.skip_first if s is not None else 0
    return s.skip_first + s.warmup + s.active


def cprofile_stop_before(s: ProfilerSchedule | None, start: int, steps: int) -> int:
    """One past the last step cProfile may cover: ``start + steps``, or the next torch window."""
    end = start + steps
    if s is None or s.active <= 0:
        return end
    cycle = s.warmup + s.active + s.wait
    n = (start - s.skip_first) // cycle + 1
    if not s.repeat or n < s.repeat:
        end = min(end, s.skip_first + n * cycle)
    return end


@dataclass(slots=True)
class CprofileBudget:
    """Stops the cProfile window early when it costs more than ``budget_steps`` bare steps.

    The cost is estimated robustly: (median step time under cProfile − lower quartile
    of the uninstrumented steps before it) × steps covered so far. cProfile
    adds a cost per Python call, so a Python-heavy loop pays much more than a loop
    that spends its time in torch kernels; this keeps the whole run within the
    overhead target either way while a kernel-bound loop is covered for the full
    window.
    """

    budget_steps: float = 2.0
    min_steps: int = 3
    baseline_ns: float | None = None
    walls: list[int] | None = None

    def start(self, earlier_walls_ns: list[int]) -> None:
        """Baseline: the lower quartile of the plain steps so far (early steps run slow: warm-up)."""
        usable = sorted(earlier_walls_ns)
        self.baseline_ns = float(usable[len(usable) // 4]) if usable else None
        self.walls = []

    def add(self, wall_ns: int) -> bool:
        """Record one cProfile step; True when the window should stop now."""
        assert self.walls is not None
        self.walls.append(wall_ns)
        if self.baseline_ns is None or len(self.walls) < self.min_steps:
            return False
        extra = (statistics.median(self.walls) - self.baseline_ns) * len(self.walls)
        return extra > self.budget_steps * self.baseline_ns

    def overhead_pct(self) -> float | None:
        if not self.walls or not self.baseline_ns:
            return None
        return 100.0 * (statistics.median(self.walls) / self.baseline_ns - 1.0)
