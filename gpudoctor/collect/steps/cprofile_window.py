"""cProfile over a window of steps, written as ``profile.pstats``."""

from __future__ import annotations

import cProfile
import marshal
import threading
from collections.abc import Callable
from pathlib import Path

from gpudoctor.collect import schedule as sched
from gpudoctor.collect.profslot import OwnProfile, disable_own, enable_own, shares_slot_with
from gpudoctor.collect.rundir import os_reason, write_bytes_atomic

WINDOW = "gpudoctor's cProfile window"  # its name where it gave way (profslot)


class CprofileWindow:
    """cProfile over a window of steps (see :mod:`gpudoctor.collect.schedule`).

    Enabled once per step, as the step opens (:meth:`resume_after_bookkeeping`, the last thing a
    boundary does), and disabled as it closes (:meth:`pause_for_bookkeeping`), so that gpudoctor's
    bookkeeping is not in the profile. Python has one profiler slot (:mod:`gpudoctor.collect.profslot`):
    the window never enables its profiler twice, and where the slot is held by another profiler (the
    script's own, a torch.profiler window recording stacks) it gives way: it does not start, or stops
    and writes what it recorded, and :attr:`gave_way` says at which step and why. Nothing it does
    raises into the step tracker.
    """

    def __init__(self, enabled: bool, start_step: int, stop_before: int, budget: sched.CprofileBudget, path: Path) -> None:
        self.enabled = enabled
        self.start_step = start_step
        self.stop_before = stop_before
        self.budget = budget
        self.path = path
        self.profiler: cProfile.Profile | None = None
        self.running = False  # the window is open (enabled during its steps, paused between them)
        self.on = False  # the profiler is enabled now (a step of the window is in progress)
        self.at = 0  # the step in progress (or the last one) while the window is open
        self.first: int | None = None
        self.last: int | None = None
        self.stopped_early = False
        self.done = False
        self.error = ""
        self.gave_way = ""  # the window did not start, or stopped, for another profiler: at which step and why
        self.write_error = ""  # profile.pstats could not be written: the system's reason
        self.thread_id: int | None = None
        # called as the window closes, in the boundary's bookkeeping (no step's time): the DataLoader's
        # cProfile (collect.loaderprof) writes its file there, not in the next batch's wait
        self.on_stop: Callable[[], None] | None = None
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
        self.gave_way = ""

    def on_step_start(self, index: int, earlier_walls: list[int]) -> None:
        """Step ``index`` opens: the window opens at its first step (its profiler is enabled by
        :meth:`resume_after_bookkeeping`, at the end of the boundary)."""
        if not self.enabled or self.done or self.running or index != self.start_step:
            return
        if index >= self.stop_before:
            self.done = True
            return
        self.budget.start(earlier_walls)
        self.profiler = OwnProfile()
        self.running = True
        self.at = index
        self.thread_id = threading.get_ident()

    def resume_after_bookkeeping(self, index: int) -> bool:
        """Step ``index`` of the window begins: enable the profiler (once); False when the window
        gave way instead (the slot is held)."""
        if self.on:
            return True
        if not self.running or self.profiler is None:
            return False
        self.at = index
        why = enable_own(self.profiler, WINDOW)
        if why:
            self._give_way(why)
            return False
        self.on = True
        if self.first is None:
            self.first = index
        return True

    def pause_for_bookkeeping(self) -> None:
        """The step in progress ends: disable the profiler until the next one begins."""
        if not self.on:
            return
        self.on = False
        try:
            displaced = disable_own(self.profiler)
        except Exception as err:
            displaced = False
            self.error = f"cProfile could not be paused: {type(err).__name__}: {err}"
        if displaced:  # up to 3.11: the script set a profiler of its own during the step
            self._give_way("another profiler replaced it during the step (sys.setprofile): its "
                           "disable() would have cleared that one")
        elif self.error:
            self.stop()

    def yield_to_script(self, what: str) -> None:
        """The script starts a profiler of its own (``what``): the window gives way if it records."""
        if self.running and shares_slot_with(self.thread_id):
            self._give_way(f"{what}: Python runs one profiler at a time, gpudoctor's gave way")

    def _give_way(self, why: str) -> None:
        if self.first is None:
            self.gave_way = f"did not start at step {self.at}: {why}"
        else:
            self.gave_way = f"stopped at step {self.at}: {why}"
        self.stop()

    def on_step_end(self, index: int, wall_ns: int) -> None:
        if not self.running:
            return
        self.last = index
        over = self.budget.add(wall_ns)
        if over and index + 1 < self.stop_before:
            self.stopped_early = True
        if over or index + 1 >= self.stop_before:
            self.stop()

    def stop(self) -> None:
        """Close the window and write what it recorded (nothing when it never ran), then :attr:`on_stop`."""
        try:
            self._stop()
        finally:
            if self.on_stop is not None:
                try:
                    self.on_stop()
                except Exception:
                    pass

    def _stop(self) -> None:
        if self.profiler is None or self.done:
            self.done = True
            self.running = False
            return
        self.running = False
        self.done = True
        prof = self.profiler
        try:
            # whatever self.on says: a profiler left enabled would hold the slot for the rest of the run (on
            # 3.12 a disable() of one not enabled does nothing; up to 3.11 disable_own leaves another's alone)
            self.on = False
            disable_own(prof)
            if self.first is None:
                return
            prof.snapshot_stats()  # create_stats() without its disable(), which could clear another profiler
            data = marshal.dumps(prof.stats)  # what dump_stats writes, through a temporary name
        except Exception as err:
            self.error = f"cProfile could not be written: {type(err).__name__}: {err}"
            return
        try:
            write_bytes_atomic(self.path, data)
        except OSError as err:
            self.write_error = os_reason(err)
            self.error = f"cProfile could not be written: {self.write_error}"

    def in_child_after_fork(self) -> None:
        if self.profiler is not None and self.on:
            try:
                disable_own(self.profiler)
            except Exception:
                pass
        self.running = self.on = False
        self.done = True
        self.profiler = None

    def detail(self) -> str:
        if self.first is None or self.last is None:
            return f"cProfile {self.gave_way}" if self.gave_way else ""
        n = self.last - self.first + 1
        text = f"steps {self.first}..{self.last} ({n} step{'s' if n != 1 else ''})"
        pct = self.budget.overhead_pct()
        if pct is not None:
            text += f", measured cost {pct:+.1f}% per step"
        if self.stopped_early:
            text += f"; stopped early: its cost passed {self.budget.budget_steps:g} bare steps"
        if self.gave_way:
            text += f"; {self.gave_way}"
        return text
