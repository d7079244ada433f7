"""Finding the training steps of an unmodified script, and timing every one of them.

A step ends when the script's optimizer steps (a global optimizer step post-hook);
where nothing steps an optimizer, each ``DataLoader`` batch is a step. At every step
boundary the tracker writes the step's record (wall time, time blocked in the
DataLoader, CPU time, page faults, GPU time from CUDA events) and moves the
instruments on: torch.profiler windows and the cProfile window.

The hook itself only notes the time: the bookkeeping runs once ``optimizer.step()``
has returned (a wrapper around the class's ``step``), so that nothing gpudoctor does
lands inside the ``Optimizer.step#…`` range of the trace, and ``--steps N`` stops the
script from a plain call site.

Step ``k`` runs from the end of gpudoctor's bookkeeping after step ``k-1`` to the end
of its optimizer step. Step 0 starts when the first optimizer is created or the first
batch is asked for, whichever comes first. In DataLoader mode a step runs from one
``__next__`` call to the next; the time between the end of an epoch (``StopIteration``)
and the next epoch's first batch belongs to no step.
"""

from __future__ import annotations

import cProfile
import marshal
import resource
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudoctor.collect import schedule as sched
from gpudoctor.collect.rundir import JsonlWriter, os_reason, write_bytes_atomic
from gpudoctor.model import ProfilerSchedule, StepRecord


class StopAfterSteps(SystemExit):
    """Raised at the step boundary after ``--steps N``; the script unwinds and exits 0."""

    def __init__(self, steps: int) -> None:
        super().__init__(0)
        self.steps = steps


class CudaStepTimer:
    """GPU time per step from one CUDA event per step boundary, read back without syncs.

    An event is recorded on the current stream at each boundary; the time between two
    consecutive events is the device-side duration of the step (idle gaps included).
    Events are read with ``query()`` when they have completed; a step's record waits
    for its event (at most ``max_lag`` steps, then it is written without GPU time).
    """

    def __init__(self, torch: Any, max_lag: int = 64) -> None:
        self.torch = torch
        self.max_lag = max_lag
        self._prev = None  # event at the start of the step in progress
        self._pending: deque[tuple[int, Any, Any]] = deque()
        self.timed = 0
        self.error = ""
        self._on = False

    def usable(self) -> bool:
        if self._on:
            return True
        try:
            self._on = bool(self.torch.cuda.is_initialized())  # once on, CUDA stays initialized
        except Exception:
            return False
        return self._on

    def watching(self) -> bool:
        """Is there anything to do at a boundary (CUDA in use, or events in flight)?"""
        return not self.error and (self.usable() or bool(self._pending))

    def boundary(self, ended_index: int | None) -> bool:
        """Record the event that ends step ``ended_index`` and starts the next one.

        True when the step's GPU time will come (its start and end events are queued).
        """
        if self.error or not self.usable():
            self._prev = None
            return False
        try:
            if self.torch.cuda.is_current_stream_capturing():
                # inside a CUDA graph capture an event would become part of the graph
                self._prev = None
                return False
        except Exception:
            pass
        try:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
        except Exception as err:  # a broken CUDA context: stop timing, never fail the script
            self.error = f"CUDA events failed: {type(err).__name__}: {err}"
            self._prev = None
            return False
        queued = ended_index is not None and self._prev is not None
        if queued:
            self._pending.append((ended_index, self._prev, ev))
        self._prev = ev
        return queued

    def restart(self) -> None:
        """No step in progress (DataLoader mode between epochs): the next boundary opens one."""
        self._prev = None

    def ready(self) -> list[tuple[int, int | None]]:
        """(index, gpu_ns) of steps whose events completed, in order; over-lagged ones with None."""
        out: list[tuple[int, int | None]] = []
        while self._pending:
            idx, start, end = self._pending[0]
            try:
                done = end.query()
            except Exception as err:
                self.error = f"CUDA events failed: {type(err).__name__}: {err}"
                done = False
            if done:
                self._pending.popleft()
                out.append((idx, int(start.elapsed_time(end) * 1e6)))
                self.timed += 1
            elif self.error or len(self._pending) > self.max_lag:
                self._pending.popleft()
                out.append((idx, None))
            else:
                break
        return out

    def drain(self, timeout_s: float = 5.0) -> list[tuple[int, int | None]]:
        """At the end of the run: wait (polling, no sync) for the last events, then give up."""
        deadline = time.monotonic() + timeout_s
        out: list[tuple[int, int | None]] = []
        while self._pending and time.monotonic() < deadline and not self.error:
            out.extend(self.ready())
            if self._pending:
                time.sleep(0.005)
        out.extend((idx, None) for idx, _, _ in self._pending)
        self._pending.clear()
        return out

    @property
    def pending(self) -> int:
        return len(self._pending)


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


class StepTracker:
    def __init__(
        self,
        torch: Any,
        writer: JsonlWriter,
        t0_mono_ns: int,
        schedule: ProfilerSchedule | None,
        max_steps: int | None,
        profiler: Any,  # torchprof.ProfilerDriver (or None)
        cprofile: CprofileWindow,
        on_boundary: Callable[[int], None] | None = None,
        rank: int | None = None,
    ) -> None:
        self.torch = torch
        self.writer = writer
        self.t0 = t0_mono_ns
        self.schedule = schedule
        self.max_steps = max_steps
        self.profiler = profiler
        self.cprofile = cprofile
        self.on_boundary = on_boundary
        self.rank = rank
        self.active = True
        self.error = ""

        self.source = "none"
        self.index = 0  # the step in progress (or the next one)
        self.started = False
        self.in_step = False
        self.step_start_ns = 0
        self._ru = None
        self.data_wait_ns = 0
        self.loop_thread: int | None = None
        self.epoch: int | None = None
        self.stop_requested = False

        self.marker_ref: Callable[[], Any] | None = None
        self.has_optimizer = False
        self._opened_at_entry = False
        self._window = ""
        self._last_ru: Any = None
        self.pending_boundary_ns: int | None = None
        self.marks = 0

        self.walls_plain: list[int] = []  # wall times of steps outside any instrument window
        self.cuda = CudaStepTimer(torch)
        # rows waiting for their GPU time, in order: (row, expects GPU time)
        self._held: deque[tuple[list[Any], bool]] = deque()
        self._gpu_ns: dict[int, int | None] = {}
        self._rows: list[list[Any]] = []  # finished rows not written yet
        self._rank_json = "null" if rank is None else str(int(rank))
        self.write_every_ns = 1_000_000_000  # a killed process loses at most this long of steps
        self._last_write_ns = time.monotonic_ns()

    # ------------------------------------------------------------------ step boundaries

    def _open(self, now_ns: int, ru: Any = None) -> None:
        self.in_step = True
        self.step_start_ns = now_ns
        self.data_wait_ns = 0
        # one getrusage per boundary: the previous step's end is the next one's start
        self._ru = ru if ru is not None else resource.getrusage(resource.RUSAGE_SELF)
        torch_phase = self.profiler.on_step_start(self.index) if self.profiler is not None else ""
        self.cprofile.on_step_start(self.index, self.walls_plain)
        self._window = torch_phase or (sched.CPROFILE if self.cprofile.running else "")
        self.cprofile.resume_after_bookkeeping()

    def open_first(self) -> None:
        """Step 0 starts (first optimizer created or first batch asked for)."""
        if self.started or not self.active:
            return
        self.started = True
        self.loop_thread = threading.get_ident()
        self.cuda.boundary(None)
        self._open(time.monotonic_ns())

    def _close(self, end_ns: int) -> None:
        """End the step in progress at ``end_ns``: record it and move the instruments on.

        The hot path of every step: kept to a few attribute reads, one ``getrusage`` and
        a list; the lines are formatted and written once a second (:meth:`_drain_rows`).
        """
        cprofile = self.cprofile
        if cprofile.running:
            cprofile.pause_for_bookkeeping()
        index = self.index
        ru = resource.getrusage(resource.RUSAGE_SELF)
        prev = self._ru
        self._last_ru = ru
        wall = end_ns - self.step_start_ns
        window = self._window
        # [index, start, wall, wait, user s, sys s, minflt, majflt, gpu_ns, window, epoch]
        row = [index, self.step_start_ns - self.t0, wall, self.data_wait_ns,
               ru.ru_utime - prev.ru_utime, ru.ru_stime - prev.ru_stime,
               ru.ru_minflt - prev.ru_minflt, ru.ru_majflt - prev.ru_majflt, None, window, self.epoch]
        self.in_step = False
        self.index = index + 1
        if not window and index > 0 and not cprofile.done and len(self.walls_plain) < 10_000:
            self.walls_plain.append(wall)  # the cProfile window's baseline
        cuda = self.cuda
        if cuda.watching():
            expects_gpu = cuda.boundary(index)
            if expects_gpu or self._held:
                self._held.append((row, expects_gpu))
                self._release(cuda.ready())
            else:
                self._rows.append(row)
        else:
            self._rows.append(row)
        if end_ns - self._last_write_ns >= self.write_every_ns:
            self._drain_rows(end_ns)
        if self.profiler is not None:
            self.profiler.on_step_end(index)
        if cprofile.running:
            cprofile.on_step_end(index, wall)
        if self.on_boundary is not None:
            self.on_boundary(index)
        if self.max_steps is not None and self.index >= self.max_steps:
            self.stop_requested = True

    def _line(self, row: list[Any]) -> str:
        index, start, wall, wait, ut, st, minflt, majflt, gpu, window, epoch = row
        return (
            f'{{"index":{index},"start_ns":{start},"wall_ns":{wall},"data_wait_ns":{wait},'
            f'"user_cpu_ns":{round(ut * 1e9)},"sys_cpu_ns":{round(st * 1e9)},'
            f'"minor_faults":{minflt},"major_faults":{majflt},'
            f'"gpu_ns":{"null" if gpu is None else gpu},"profiled":{"true" if window == sched.ACTIVE else "false"},'
            f'"window":"{window}","epoch":{"null" if epoch is None else epoch},"rank":{self._rank_json}}}\n'
        )

    def _drain_rows(self, now_ns: int) -> None:
        """Format and write the finished rows (once a second, and at the end)."""
        self._last_write_ns = now_ns
        if self._rows:
            rows, self._rows = self._rows, []
            self.writer.write_text("".join(self._line(r) for r in rows))

    def _release(self, resolved: list[tuple[int, int | None]], final: bool = False) -> None:
        """Pass held rows on, in order, as their GPU times arrive (all of them when ``final``)."""
        for idx, gpu_ns in resolved:
            self._gpu_ns[idx] = gpu_ns
        while self._held:
            row, expects = self._held[0]
            if expects:
                if row[0] not in self._gpu_ns and not final:
                    break
                row[8] = self._gpu_ns.pop(row[0], None)
            self._held.popleft()
            self._rows.append(row)

    def _guarded(self, fn: Callable[[], None]) -> None:
        """Run bookkeeping; an error in gpudoctor switches step tracking off, never fails the script."""
        try:
            fn()
        except StopAfterSteps:
            raise
        except Exception as err:
            self.error = f"step tracking stopped at step {self.index}: {type(err).__name__}: {err}"
            self.active = False

    def _boundary_then_reopen(self, end_ns: int, reopen: bool) -> None:
        def work() -> None:
            self._close(end_ns)
            if self.stop_requested:
                return
            if reopen:
                self._open(time.monotonic_ns(), self._last_ru)
            else:
                self.cuda.restart()

        self._guarded(work)
        if self.stop_requested:
            self.active = False
            raise StopAfterSteps(self.index)

    # ------------------------------------------------------------------ optimizer steps

    def optimizer_created(self) -> None:
        self.has_optimizer = True
        self.open_first()

    def on_optimizer_step(self, optimizer: Any) -> None:
        """Global post-hook: note the boundary; the bookkeeping waits for step() to return."""
        if not self.active:
            return
        marker = self.marker_ref() if self.marker_ref is not None else None
        if marker is None:
            try:
                self.marker_ref = weakref.ref(optimizer)
            except TypeError:
                self.marker_ref = lambda: optimizer
            marker = optimizer
            self.source = "optimizer"
        if optimizer is not marker:
            return
        now = time.monotonic_ns()
        self.marks += 1
        if not self.started:
            # a step we could not see begin: it opens step 0 instead of closing one
            self.started = True
            self.loop_thread = threading.get_ident()
            self.cuda.boundary(None)
            self._guarded(lambda: self._open(now))
            return
        if self.pending_boundary_ns is not None:  # the previous one was never flushed
            self.flush(from_step_return=False)
        if not self.in_step:
            self._guarded(lambda: self._open(now))
            return
        self.pending_boundary_ns = now

    def flush(self, from_step_return: bool) -> None:
        """Do the bookkeeping of a noted boundary (after optimizer.step() returned, or later)."""
        t = self.pending_boundary_ns
        if t is None or not self.active:
            return
        self.pending_boundary_ns = None
        end = time.monotonic_ns() if from_step_return else t
        self._boundary_then_reopen(end, reopen=True)

    def scaler_skipped(self, optimizer: Any) -> None:
        """GradScaler.step skipped optimizer.step (inf/NaN gradients): still a step."""
        if not self.active:
            return
        marker = self.marker_ref() if self.marker_ref is not None else None
        if marker is None or optimizer is not marker:
            return
        self.on_optimizer_step(optimizer)
        self.flush(from_step_return=True)

    # ------------------------------------------------------------------ DataLoader

    def dataloader_next_enter(self, epoch_ends: bool = False) -> int:
        """Called as ``__next__`` is entered; returns the entry time.

        ``epoch_ends``: the iterator has yielded every batch (known for map-style
        datasets), so this call will raise ``StopIteration`` and opens no step.
        """
        now = time.monotonic_ns()
        if not self.active:
            return now
        if self.pending_boundary_ns is not None:
            self.flush(from_step_return=False)
        if self.source == "optimizer" or self.has_optimizer:
            if not self.started:
                self.open_first()
            return now
        # DataLoader mode: each batch asked for ends the step before it
        if self.source == "none":
            self.source = "dataloader"
        self._opened_at_entry = False
        if not self.started:
            if epoch_ends:
                return now
            self.open_first()
            self._opened_at_entry = True
            return time.monotonic_ns()
        if self.in_step:
            self._boundary_then_reopen(now, reopen=not epoch_ends)
            self._opened_at_entry = not epoch_ends
        elif not epoch_ends:
            def reopen() -> None:
                self.cuda.boundary(None)
                self._open(time.monotonic_ns())

            self._guarded(reopen)
            self._opened_at_entry = True
        return time.monotonic_ns()

    def dataloader_next_exit(self, entered_ns: int, stopped: bool, epoch: int | None) -> None:
        if not self.active:
            return
        if epoch is not None:
            self.epoch = epoch
        if stopped and self.source == "dataloader" and self.in_step and self._opened_at_entry:
            # an epoch ended where its length could not be known in advance: the step
            # opened at this call holds no batch, so it is dropped (its index is reused)
            self._guarded(self._discard_open_step)
            return
        if threading.get_ident() == self.loop_thread and self.in_step:
            self.data_wait_ns += time.monotonic_ns() - entered_ns

    def _discard_open_step(self) -> None:
        self.cprofile.pause_for_bookkeeping()
        if self.profiler is not None:
            self.profiler.discard_step()
        self.in_step = False
        self.cuda.restart()

    # ------------------------------------------------------------------ the end

    def finish(self, cuda_timeout_s: float = 5.0) -> None:
        """The script is over: flush a noted boundary and the records still waiting for GPU time.

        The step in progress (if the script ended mid-step) is not written: it is not a
        complete step.
        """
        if self.pending_boundary_ns is not None and self.active:
            try:
                self.flush(from_step_return=False)
            except StopAfterSteps:
                pass
        self.active = False
        self._release(self.cuda.drain(cuda_timeout_s), final=True)
        self._drain_rows(time.monotonic_ns())
        try:
            self.writer.flush()
        except OSError:
            pass

    @property
    def steps_seen(self) -> int:
        return self.index

    def in_child_after_fork(self) -> None:
        self.active = False


def record_from_dict(d: dict[str, Any]) -> StepRecord:
    return StepRecord.from_dict(d)
