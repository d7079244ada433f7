"""cProfile over a window of steps, written as ``profile.pstats``."""

from __future__ import annotations

import cProfile
import marshal
import threading
from pathlib import Path

from gpudoctor.collect import schedule as sched
from gpudoctor.collect.rundir import os_reason, write_bytes_atomic


class CprofileWindow:
    """cProfile over a window of steps (see :mod:`gpudoctor.collect.schedule`)."""

    def __init__(self, enabled: bool, start_step: int, stop_before: int, budget: sched.CprofileBudget, path: Path) -> None:
        self.enabled = enabled
        self.start_step = start_step
        self.stop_before = stop_before
        self.budget = budget
        self.path = path
        self.profiler: cProfile.Profile | None = None
        self.running = False
        self.first: int | None = None
        self.last: int | None = None
        self.stopped_early = False
        self.done = False
        self.error = ""
        self.write_error = ""  # profile.pstats could not be written: the system's reason
        self.thread_id: int | None = None
        self._offsets = (start_step, stop_before)

    def rebase(self, origin: int) -> None:
        """A more specific marker took over at step ``origin``: the window is scheduled afresh
        from there (a window in progress is written first; a later one replaces its file)."""
        if not self.enabled or self.error:
            return
        if self.running:
            self.stop()
        self.start_step = origin + self._offsets[0]
        self.stop_before = origin + self._offsets[1]
        self.budget = sched.CprofileBudget(self.budget.budget_steps, self.budget.min_steps)
        self.profiler = None
        self.running = self.done = self.stopped_early = False
        self.first = self.last = None

    def on_step_start(self, index: int, earlier_walls: list[int]) -> None:
        if not self.enabled or self.done or self.running or index != self.start_step:
            return
        if index >= self.stop_before:
            self.done = True
            return
        self.budget.start(earlier_walls)
        try:
            self.profiler = cProfile.Profile()
            self.profiler.enable()
        except Exception as err:  # another profiler owns sys.setprofile (a debugger, say)
            self.error = f"cProfile could not start: {type(err).__name__}: {err}"
            self.done = True
            return
        self.running = True
        self.first = index
        self.thread_id = threading.get_ident()

    def on_step_end(self, index: int, wall_ns: int) -> None:
        if not self.running:
            return
        self.last = index
        over = self.budget.add(wall_ns)
        if over and index + 1 < self.stop_before:
            self.stopped_early = True
        if over or index + 1 >= self.stop_before:
            self.stop()

    def pause_for_bookkeeping(self) -> None:
        if self.running and self.profiler is not None:
            self.profiler.disable()

    def resume_after_bookkeeping(self) -> None:
        if self.running and self.profiler is not None:
            self.profiler.enable()

    def stop(self) -> None:
        if self.profiler is None or self.done:
            self.done = True
            return
        self.running = False
        self.done = True
        try:
            self.profiler.disable()
            self.profiler.create_stats()
            data = marshal.dumps(self.profiler.stats)  # what dump_stats writes, through a temporary name
        except Exception as err:
            self.error = f"cProfile could not be written: {type(err).__name__}: {err}"
            return
        try:
            write_bytes_atomic(self.path, data)
        except OSError as err:
            self.write_error = os_reason(err)
            self.error = f"cProfile could not be written: {self.write_error}"

    def in_child_after_fork(self) -> None:
        if self.profiler is not None and self.running:
            try:
                self.profiler.disable()
            except Exception:
                pass
        self.running = False
        self.done = True
        self.profiler = None

    def detail(self) -> str:
        if self.first is None or self.last is None:
            return ""
        n = self.last - self.first + 1
        text = f"steps {self.first}..{self.last} ({n} step{'s' if n != 1 else ''})"
        pct = self.budget.overhead_pct()
        if pct is not None:
            text += f", measured cost {pct:+.1f}% per step"
        if self.stopped_early:
            text += f"; stopped early: its cost passed {self.budget.budget_steps:g} bare steps"
        return text
