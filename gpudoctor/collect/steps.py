"""Finding the training steps of an unmodified script, and timing every one of them.

The markers, most specific first
--------------------------------
A step is one iteration of the script's loop. What marks it is chosen per run from
what the script actually does, most specific first:

1. ``optimizer``: an optimizer's ``step()`` returns (a wrapper around the ``step`` of
   each optimizer class the script instantiates; the first optimizer that steps marks
   the steps, and a step inside another optimizer's step, a wrapper's inner optimizer,
   marks nothing). Gradient accumulation is several micro-batches (``backward()``
   calls) in one step; several optimizers that each step once in an iteration (a
   GAN's discriminator and generator) make one step, whose ``backward()`` calls are
   theirs, not micro-batches (``StepTracker.other_steps``).
2. ``backward``: ``torch.autograd.backward`` / ``Tensor.backward()`` returns, when
   no optimizer steps (parameters updated by hand).
3. ``module``: a call of the root module returns (the outermost ``nn.Module`` with
   parameters, not its submodules), when nothing calls ``backward()`` (evaluation,
   inference).
4. ``dataloader``: the loop asks a ``DataLoader`` for its next batch (a step runs
   from one ``__next__`` call to the next).

When none of these happens, nothing is a step: ``timewindow`` records seconds 5–10 of
the script instead (``step_source: "time"``).

How a marker is established, and gives way
------------------------------------------
A run cannot know at its start whether an optimizer will ever step, so the first
step (step 0) is provisional: it opens at the first sign of a loop (an optimizer
created, a batch asked for, the root module called, ``backward()`` called) and no
instrument runs in it. Then:

- ``optimizer`` is established at its first step: step 0 ends there (nothing is
  more specific).
- ``backward`` and ``module`` are established at their second occurrence with
  nothing more specific in between (a more specific kind seen once becomes the
  candidate instead: a training loop calls the model, then ``backward()``, then
  ``optimizer.step()`` in its first iteration). Step 0 is then split where the
  candidate first occurred, so step 0 is the first iteration and step 1 the
  second: the step count is the iteration count. While an optimizer object exists
  but has not stepped, they wait up to ``DEFER_WHILE_OPTIMIZER_IDLE`` occurrences
  for it (gradient accumulation takes several backward calls before the first
  optimizer step); step 0 then holds them all.
- ``dataloader`` is established at the second batch asked for with no other
  candidate (its steps start where a batch is asked for, so step 0 is one
  iteration).

A more specific marker that appears later (training after an evaluation pass)
takes over: ``optimizer`` at once, ``backward`` / ``module`` at their second
occurrence. The step in progress ends at the new marker's event (a step that
straddles the change), each row of ``steps.jsonl`` says which marker ended it, and
the instruments start over: the torch.profiler window in progress is exported,
the schedule counts ``skip_first`` again from the new marker's first step, and the
cProfile window is scheduled afresh, so the steps that define the run are profiled.

Phases
------
The same hooks time each step's phases on the host, exclusive of each other: time
blocked in ``DataLoader.__next__`` (data wait), in the root module's calls
(forward), in ``backward()`` and in ``optimizer.step()``; the rest of the step is the
loop's own work ("other"). They count only on the loop's thread. Exclusive without a
stack: ``acc[PHASE]`` says which phase is in progress (0: none). A phase that starts
while none is (the usual case, the hooks' inline path) adds its whole time to its own
figure; one that starts inside another (a ``backward()`` inside LBFGS's
``step(closure)``, a batch asked for inside the forward: the hooks' slower path,
:meth:`StepTracker.phase_start` / :meth:`StepTracker.phase_end`) also takes its time
off the enclosing phase's figure, so each phase keeps only its own. No GPU
synchronization is added: on CUDA the GPU time of each step comes from one CUDA
event per boundary (``CudaStepTimer``), read back when complete.

Cost
----
In a training loop every Python operation of a hook costs ~0.04 µs (the loop's work
has left gpudoctor's code and data out of the caches), so the hot path is counted in
operations and in objects touched. Everything the hooks read or write on their usual
path lives in one list, ``acc`` (the step's figures, its start, index and end, the
phase in progress, the fast-path horizon, the threads each hook compares with, the
marking optimizer's id, the root module's calls): no attribute of the tracker is read.
A boundary with no instrument due (the ``_plan_fast`` horizon: the next profiler
window, the cProfile window, ``--steps``, CUDA; a ``getrusage`` read every
``RUSAGE_EVERY_NS``, the lines encoded and written once a second) is
:meth:`StepTracker.fast_close`: ``acc`` is copied onto a list of ints and the next
step opened, with no object made and no method called; the optimizer's and
``backward()``'s hooks do it inline. The hooks handle the common case inline
(``backward()`` and the root module's calls only add their time when another marker
ends the steps; no other phase in progress), each recognising it by one comparison of
the thread with the one ``acc`` keeps for it (``OPT_THREAD``, ``TRAIN_THREAD``,
``BATCH_THREAD``, ``BWD_THREAD``: ``NO_THREAD`` while tracking is off or another marker
ends the steps).
Module hooks sit on the root module instance only (a global module hook would push
every submodule call off ``nn.Module``'s fast path; ``markers.RootModuleWatch``).
``benchmarks/overhead.py --hooks-only`` measures the whole cost per step of each
loop shape. ``optimizer.step()``'s bookkeeping runs once it has returned (a wrapper
around the class's ``step``), so that nothing gpudoctor does lands inside the
``Optimizer.step#…`` range of the trace, and ``--steps N`` stops the script from a
plain call site.

Step ``k`` runs from the end of gpudoctor's bookkeeping after step ``k-1`` to the
return of its marked call (to the next ``__next__`` call with ``dataloader``). In
``dataloader`` mode the time between the end of an epoch (``StopIteration``) and
the next epoch's first batch belongs to no step.

Why this file is long: the per-call hooks above are one hot path, run on every
DataLoader ``__next__``, ``backward()`` and ``optimizer.step()`` of the user's loop. Its layout
(``StepTracker``: the hooks and their bookkeeping in one class, no indirection between a hook
and what it records) was tuned and measured with ``benchmarks/overhead.py --hooks-only``; splitting
it across modules would add lookups to every step, so it stays in one file.
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

import msgspec

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


# How specific each marker is: a higher one takes over from a lower one.
RANK = {"none": 0, "dataloader": 1, "module": 2, "backward": 3, "optimizer": 4}
# While an optimizer object exists but has not stepped yet, backward / module / dataloader wait
# this many occurrences for it before they mark steps: gradient accumulation calls backward()
# several times before the first optimizer step (step 0 then holds those micro-batches).
DEFER_WHILE_OPTIMIZER_IDLE = 64
# how a report names each marker
MARKER_CALLS = {
    "optimizer": "optimizer.step()",
    "backward": "loss.backward()",
    "module": "the root module's forward",
    "dataloader": "DataLoader batches",
    "time": "a time-based window (no step structure)",
    "none": "nothing",
}
# indices of StepTracker.acc, the figures of the step in progress: the phases' times (ns, exclusive
# of each other), backward() calls, DataLoader batches received (the first N_FIGURES, zeroed as a step
# opens), then the step's start, the end a fast boundary fills in before it copies the whole list as
# the step's row (StepTracker.fast_close), the epoch (-1: none known), and the phase in progress on
# the loop's thread (its index + 1; 0: none; see "Phases" above); then what a fast boundary reads: the
# step's index, the first index whose end is not fast (``_plan_fast``) and the time from which a fast
# boundary has a getrusage read or lines due (``_set_due``); then what the hooks compare with (see "Cost"
# above): the loop's thread for each hook's usual case (NO_THREAD when there is none), the id() of
# the optimizer that marks the steps, and the calls of the root module
WAIT, FORWARD, BACKWARD, OPTIMIZER, N_BWD, N_BATCHES, START, END, EPOCH, PHASE, INDEX, FAST_LAST, DUE = range(13)
OPT_THREAD, TRAIN_THREAD, BATCH_THREAD, BWD_THREAD, MARKER, ROOT_CALLS = range(13, 19)
NO_THREAD = -1  # (threading.get_ident() is never negative)
IN_WAIT, IN_FORWARD, IN_BACKWARD, IN_OPTIMIZER = WAIT + 1, FORWARD + 1, BACKWARD + 1, OPTIMIZER + 1  # acc[PHASE]
N_FIGURES = 6
ROW = 19  # ints per step in a fast block (all of acc: one copy of pointers, no slice made)
_ZERO = (0,) * N_FIGURES
_NO_CPU = (None,) * 5  # a fast row's CPU figures when the next getrusage read covers its step

_Snapshot = tuple  # (t_ns, rusage, the step's acc as a tuple, epoch)


class _Block:
    """Consecutive steps closed by fast boundaries: ``ROW`` ints each (``acc`` as it stood at the
    step's end, its index included), under one marker and one ``forward_watched`` (whatever changes
    them seals the block first: :meth:`StepTracker._seal`)."""

    __slots__ = ("data", "marker", "watched")

    def __init__(self, marker: str, watched: bool, data: list[int]) -> None:
        self.marker = marker
        self.watched = watched
        self.data = data


_getrusage = resource.getrusage
_monotonic_ns = time.monotonic_ns
_RUSAGE_SELF = resource.RUSAGE_SELF

# the CPU figures of a step come from getrusage, a system call: 3-5 µs on a busy loop here, and the
# steps after it run slower (read every 2 ms, it cost a loop of 270 µs steps 3.5 µs per step in the
# median, measured in-process against no read; every 20 ms, nothing measurable). A boundary reads it
# when this long has passed since the last read, and that row's figures cover every step since
# (``cpu_steps``); the rows in between carry none
RUSAGE_EVERY_NS = 20_000_000


class _Line(msgspec.Struct, gc=False):
    """One line of steps.jsonl (``StepRecord``), in its field order; encoded by msgspec a second's
    rows at a time (:meth:`StepTracker._drain_rows`)."""

    index: int
    start_ns: int
    wall_ns: int
    data_wait_ns: int
    user_cpu_ns: int | None
    sys_cpu_ns: int | None
    minor_faults: int | None
    major_faults: int | None
    cpu_steps: int | None
    gpu_ns: int | None
    profiled: bool
    window: str
    epoch: int | None
    rank: int | None
    marker: str
    forward_ns: int | None
    backward_ns: int
    optimizer_ns: int
    micro_batches: int
    batches: int


_LINES = msgspec.json.Encoder()


class _CudaInitialized:
    """``torch.cuda._initialized`` for a torch without that flag."""

    def __init__(self, cuda_mod: Any) -> None:
        self._cuda = cuda_mod

    @property
    def _initialized(self) -> bool:
        return bool(self._cuda.is_initialized())


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
        # what the hooks use at every step (indices WAIT … ROOT_CALLS, see "Cost" above): changed in
        # place, the hooks hold the list
        # the loop's thread while the tracker is active and the established marker is ``optimizer``
        # (acc[OPT_THREAD]), ``optimizer`` or ``backward`` (TRAIN_THREAD), any but ``dataloader``
        # (BATCH_THREAD), ``backward`` (BWD_THREAD: its hook ends the step itself), else NO_THREAD: each
        # hook's usual case is one comparison with get_ident() (_sync_hot)
        self.acc = [0] * ROW
        self.acc[EPOCH] = -1
        self.acc[OPT_THREAD:BWD_THREAD + 1] = (NO_THREAD,) * 4
        self.in_step = False
        self.pending_boundary_ns: int | None = None
        self.marks = 0  # the marking optimizer's steps that took the slow path (GradScaler.step's check)
        # the rows of the steps closed by fast boundaries since the last _seal, ROW ints each (a list: its
        # extend is a copy of pointers; an array's converts every int). Always this list (the hooks hold
        # its extend): _seal copies it out
        self._buf: list[int] = []
        self.buf_extend = self._buf.extend

        self.torch = torch
        self.writer = writer
        self.t0 = t0_mono_ns
        self.schedule = schedule
        self.max_steps = max_steps
        self.profiler = profiler
        self.cprofile = cprofile
        self.on_boundary = on_boundary
        self.on_first_step: Callable[[], None] | None = None  # the first step is written (time window: give way)
        self.rank = rank
        self.error = ""
        self.source = "none"  # the established marker (see the module docstring): set by _set_source
        self.loop_thread: int | None = None  # the thread of the loop: set by _set_loop_thread
        self._active = True
        self.markers: list[tuple[str, int, str]] = []  # (marker, first step it ended, what it is), in order
        self.cand: str | None = None  # a more specific marker seen, not established yet
        self.cand_key: int | None = None  # module candidates: which module (id) it is
        self.cand_count = 0
        self._snap: _Snapshot | None = None  # the step's counters at the candidate's last occurrence
        self._rebase_next = False  # instruments start over at the next step (a marker took over)
        self.optimizer_stepped = False
        self.optimizer_name = ""
        self.root_name = ""  # class of the root module (markers.RootModuleWatch)
        self._watched = False  # forward_watched
        self.root_key: int | None = None  # id() of the root module once found (markers.RootModuleWatch)
        self.root_grad_calls = 0  # … whose output carried an autograd graph
        # calls of the root (outside the training loop's inline path) made in eval mode (module.eval()), whatever
        # marks the steps: an evaluation, after or between training epochs too (markers.RootModuleWatch._note_call)
        self.eval_calls = 0
        self.eval_grad_calls = 0  # … whose output carried an autograd graph
        self.eval_grad_site: Any = None  # the user's file:line of the first of those (a CallSite)
        self.first_grad_site: Any = None  # … of the first call whose output carried a graph, in any mode
        self.first_grad_site_seen = False
        self._top_calls: dict[int | None, list[int]] = {}  # while the root is searched for: [calls, with grad] by module
        self.dl_entries = 0  # batches asked for while the DataLoader was not the marker
        self.started = False
        self._ru = None  # getrusage at its last read (RUSAGE_EVERY_NS)
        self._ru_ns = 0  # … and when
        self._ru_index = 0  # the first step that read's figures do not cover (cpu_steps: the steps up to a read)
        self.rusage_every_ns = RUSAGE_EVERY_NS
        self._phases: list[tuple[int, int]] = []  # the tokens of the phases opened by _phase_enter
        self.micro_counts: dict[int, int] = {}  # optimizer steps by their backward() calls
        # steps in which another optimizer than the marking one stepped (a GAN's generator and discriminator):
        # step index -> those optimizer steps. Such a step is one iteration whose backward() calls are the
        # optimizers' own, not micro-batches: its micro_batches is its DataLoader batches (1 when none)
        self.other_steps: dict[int, int] = {}
        self.other_optimizers: dict[str, None] = {}  # their classes, in order of first step
        self.steps_with_others = 0  # written steps in which another optimizer stepped
        self.stop_requested = False
        self.every_boundary = False  # the child's on_boundary must run at every boundary (distributed: DDP polls)
        self._need_walls = True
        # has CUDA come up since the last plan? Read on the fast path as ``._initialized``: torch.cuda's
        # own flag (is_initialized() costs two calls), or a stand-in that asks is_initialized()
        cuda_mod = torch.cuda
        self._cuda_flag: Any = (
            cuda_mod if isinstance(getattr(cuda_mod, "_initialized", None), bool) else _CudaInitialized(cuda_mod)
        )

        self.marker_ref: Callable[[], Any] | None = None
        self.has_optimizer = False
        self._opened_at_entry = False
        self._window = ""

        self.walls_plain: list[int] = []  # wall times of steps outside any instrument window
        self.cuda = CudaStepTimer(torch)
        # rows waiting for their GPU time, in order: (row, expects GPU time)
        self._held: deque[tuple[list[Any], bool]] = deque()
        self._gpu_ns: dict[int, int | None] = {}
        self._rows: list[Any] = []  # finished rows not written yet (lists, _fast_due's raw tuples, _Blocks)
        self._rank_int = None if rank is None else int(rank)  # as steps.jsonl writes it
        self.write_every_ns = 1_000_000_000  # a killed process loses at most this long of steps
        self._last_write_ns = time.monotonic_ns()

    @property
    def root_calls(self) -> int:
        """Calls of the root module."""
        return self.acc[ROOT_CALLS]

    @root_calls.setter
    def root_calls(self, n: int) -> None:
        self.acc[ROOT_CALLS] = n

    @property
    def index(self) -> int:
        """The step in progress (or the next one)."""
        return self.acc[INDEX]

    @index.setter
    def index(self, i: int) -> None:
        self.acc[INDEX] = i

    @property
    def step_start_ns(self) -> int:
        """When the step in progress started (monotonic ns)."""
        return self.acc[START]

    @step_start_ns.setter
    def step_start_ns(self, t: int) -> None:
        self.acc[START] = t

    @property
    def epoch(self) -> int | None:
        """The DataLoader epoch of the batches asked for (None: none known)."""
        e = self.acc[EPOCH]
        return None if e < 0 else e

    @epoch.setter
    def epoch(self, e: int | None) -> None:
        self.acc[EPOCH] = -1 if e is None else e

    @property
    def forward_watched(self) -> bool:
        """A root module is hooked: forward_ns is measured."""
        return self._watched

    @forward_watched.setter
    def forward_watched(self, on: bool) -> None:
        if on != self._watched:
            self._seal()  # the buffered rows were measured the other way
            self._watched = on

    @property
    def active(self) -> bool:
        """False once step tracking stopped (an error in gpudoctor, the end, a forked child)."""
        return self._active

    @active.setter
    def active(self, on: bool) -> None:
        self._active = on
        self._sync_hot()

    def _sync_hot(self) -> None:
        t = self.loop_thread if self._active and self.loop_thread is not None else NO_THREAD
        src = self.source
        acc = self.acc
        acc[OPT_THREAD] = t if src == "optimizer" else NO_THREAD
        acc[TRAIN_THREAD] = t if src in ("optimizer", "backward") else NO_THREAD
        acc[BATCH_THREAD] = t if src in ("optimizer", "backward", "module") else NO_THREAD
        acc[BWD_THREAD] = t if src == "backward" else NO_THREAD

    def _set_loop_thread(self) -> None:
        self.loop_thread = threading.get_ident()
        self._sync_hot()

    # ------------------------------------------------------------------ step boundaries

    def _open(self, now_ns: int, ru: Any = None) -> None:
        self.in_step = True
        acc = self.acc
        acc[:N_FIGURES] = _ZERO
        acc[START] = now_ns
        # the previous step's end (its getrusage) is the next one's start
        if ru is None:  # a fresh start: rows since the last read keep no CPU figures
            self._ru = resource.getrusage(resource.RUSAGE_SELF)
            self._ru_ns = now_ns
            self._ru_index = self.index
        else:
            self._ru = ru
        if self.source == "none":  # provisional (step 0 before any marker): no instrument
            self._window = ""
            return
        prof = self.profiler
        torch_phase = prof.on_step_start(self.index) if prof is not None else ""
        cprofile = self.cprofile
        if cprofile.enabled and not cprofile.done:
            cprofile.on_step_start(self.index, self.walls_plain)
        if cprofile.running:
            self._window = torch_phase or sched.CPROFILE
            cprofile.resume_after_bookkeeping()
        else:
            self._window = torch_phase

    def open_first(self) -> None:
        """Step 0 starts: the first sign of a loop (optimizer created, batch asked for, root
        module or backward() called)."""
        if self.started or not self.active:
            return
        self.started = True
        self._set_loop_thread()
        self.cuda.boundary(None)
        self._open(time.monotonic_ns())

    def _emit(self, row: list[Any]) -> None:
        """A row without GPU time, behind any row still waiting for its own."""
        if self._held:
            self._held.append((row, False))
        else:
            self._rows.append(row)

    def _close(self, end_ns: int) -> None:
        """End the step in progress at ``end_ns``: record it and move the instruments on.

        The hot path of every step: kept to a few attribute reads, one ``getrusage`` and
        a list; the lines are formatted and written once a second (:meth:`_drain_rows`).
        """
        cprofile = self.cprofile
        if cprofile.running:
            cprofile.pause_for_bookkeeping()
        self._seal()
        index = self.index
        ru = resource.getrusage(resource.RUSAGE_SELF)
        prev = self._ru
        self._ru = ru
        self._ru_ns = end_ns
        cpu_steps = index + 1 - self._ru_index
        self._ru_index = index + 1
        wall = end_ns - self.step_start_ns
        window = self._window
        acc = self.acc
        row = [index, self.step_start_ns - self.t0, wall, acc[WAIT],
               ru.ru_utime - prev.ru_utime, ru.ru_stime - prev.ru_stime,
               ru.ru_minflt - prev.ru_minflt, ru.ru_majflt - prev.ru_majflt, None, window, self.epoch,
               self.source, acc[FORWARD] if self.forward_watched else None, acc[BACKWARD], acc[OPTIMIZER],
               acc[N_BWD] or acc[N_BATCHES], acc[N_BATCHES], cpu_steps]
        self.in_step = False
        self.index = index + 1
        if not window and index > 0 and not cprofile.done and len(self.walls_plain) < 10_000:
            self.walls_plain.append(wall)  # the cProfile window's baseline
        cuda = self.cuda
        if (cuda._on or cuda._pending or cuda.torch.cuda.is_initialized()) and cuda.watching():
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
        if index == 0 and self.on_first_step is not None:
            self.on_first_step()
        if self.max_steps is not None and self.index >= self.max_steps:
            self.stop_requested = True

    def _snapshot(self, t_ns: int) -> _Snapshot:
        return (t_ns, resource.getrusage(resource.RUSAGE_SELF), tuple(self.acc), self.epoch)

    def _split_at(self, snap: _Snapshot) -> None:
        """Write the step in progress as it stood at ``snap`` (the marker's first occurrence);
        what came after is the next step, still in progress. Only for the provisional step 0,
        which no instrument watched."""
        t, ru, part, epoch = snap
        self._seal()
        prev = self._ru
        index = self.index
        row = [index, self.step_start_ns - self.t0, t - self.step_start_ns, part[WAIT],
               ru.ru_utime - prev.ru_utime, ru.ru_stime - prev.ru_stime,
               ru.ru_minflt - prev.ru_minflt, ru.ru_majflt - prev.ru_majflt, None, "", epoch,
               self.source, part[FORWARD] if self.forward_watched else None, part[BACKWARD], part[OPTIMIZER],
               part[N_BWD] or part[N_BATCHES], part[N_BATCHES], index + 1 - self._ru_index]
        self._ru_index = index + 1
        self._ru_ns = t
        self._emit(row)
        self.cuda.restart()  # no event marks the split: neither part gets GPU time
        self.index = index + 1
        self.step_start_ns = t
        self._ru = ru
        acc = self.acc
        for i in range(N_FIGURES):
            acc[i] -= part[i]
        if index == 0 and self.on_first_step is not None:
            self.on_first_step()
        if self.max_steps is not None and self.index >= self.max_steps:
            self.stop_requested = True

    def _line(self, row: list[Any]) -> _Line:
        (index, start, wall, wait, ut, st, minflt, majflt, gpu, window, epoch,
         marker, fwd, bwd, opt, micro, batches, cpu_steps) = row
        return _Line(
            index, start, wall, wait, None if ut is None else round(ut * 1e9), None if st is None else round(st * 1e9),
            minflt, majflt, cpu_steps, gpu, window == sched.ACTIVE, window, epoch, self._rank_int, marker, fwd,
            bwd, opt, micro, batches,
        )

    def _expand(self, raw: tuple[Any, ...]) -> list[Any]:
        """A fast boundary's raw figures as a row (see :meth:`_close`)."""
        (wait, fwd, bwd, opt, n_bwd, n_batches, index, start, end, epoch, marker, watched,
         ut, st, minflt, majflt, cpu) = raw
        return [index, start - self.t0, end - start, wait, ut, st, minflt, majflt, None, "", epoch,
                marker, fwd if watched else None, bwd, opt, n_bwd or n_batches, n_batches, cpu]

    def _block_lines(self, block: _Block, out: list[_Line]) -> None:
        """The lines of a fast block's steps (see :meth:`fast_close`), appended to ``out``."""
        t0, rank, marker, watched = self.t0, self._rank_int, block.marker, block.watched
        counts = self.micro_counts if marker == "optimizer" else None
        others = self.other_steps if marker == "optimizer" else None
        it = iter(block.data)
        for wait, fwd, bwd, opt, n_bwd, n_batches, start, end, epoch, _, index, *_ in zip(
                *(it,) * ROW, strict=True):
            micro = n_bwd or n_batches
            if others and others.pop(index, 0):  # several optimizers stepped: one iteration, not accumulation
                micro = n_batches or 1
                self.steps_with_others += 1
            if counts is not None:  # micro-batches of each optimizer step, for describe()
                counts[micro] = counts.get(micro, 0) + 1
            out.append(_Line(index, start - t0, end - start, wait, None, None, None, None, None, None, False, "",
                             None if epoch < 0 else epoch, rank, marker, fwd if watched else None, bwd, opt,
                             micro, n_batches))

    def _drain_rows(self, now_ns: int) -> None:
        """Format and write the finished rows (once a second, and at the end)."""
        self._last_write_ns = now_ns
        self._seal()
        if self._rows:
            rows, self._rows = self._rows, []
            counts = self.micro_counts
            lines: list[_Line] = []
            for r in rows:
                if type(r) is _Block:
                    self._block_lines(r, lines)
                    continue
                if type(r) is tuple:
                    r = self._expand(r)
                if r[11] == "optimizer":  # micro-batches of each optimizer step, for describe()
                    if self.other_steps and self.other_steps.pop(r[0], 0):
                        r[15] = r[16] or 1  # several optimizers stepped: one iteration (see other_steps)
                        self.steps_with_others += 1
                    counts[r[15]] = counts.get(r[15], 0) + 1
                lines.append(self._line(r))
            self.writer.write_text(_LINES.encode_lines(lines).decode())

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

    def _rebase(self) -> None:
        """A more specific marker took over: the instruments start over from the step about to open."""
        origin = self.index
        if self.profiler is not None:
            self.profiler.rebase(origin)
        self.cprofile.rebase(origin)
        self.walls_plain = []

    def _boundary_then_reopen(self, end_ns: int, reopen: bool) -> None:
        """Close the step in progress at ``end_ns`` and (``reopen``) open the next one; an error in
        gpudoctor switches step tracking off, never fails the script.

        Most boundaries take the fast path (:meth:`fast_close`); one at which a ``getrusage`` read
        or the lines are due still calls no instrument (:meth:`_fast_due`)."""
        acc = self.acc
        index = acc[INDEX]
        if reopen and index < acc[FAST_LAST] and not self._cuda_flag._initialized:
            try:
                if self.fast_close(end_ns):
                    return
                self._seal()
                start = acc[START]
                self._fast_due(index, start, end_ns)
                if self._need_walls and len(self.walls_plain) < 10_000:
                    self.walls_plain.append(end_ns - start)  # the cProfile window's baseline
                acc[INDEX] = index + 1
                acc[:N_FIGURES] = _ZERO  # in place: the hooks hold the list
                acc[START] = _monotonic_ns()
                return
            except Exception as err:
                self.error = f"step tracking stopped at step {self.index}: {type(err).__name__}: {err}"
                self.active = False
                return
        try:
            self._close(end_ns)
            if not self.stop_requested:
                if self._rebase_next:
                    self._rebase_next = False
                    self._rebase()
                if reopen:
                    self._open(time.monotonic_ns(), self._ru)  # the rusage _close read
                else:
                    self.cuda.restart()
            self._plan_fast()
        except StopAfterSteps:
            raise
        except Exception as err:
            self.error = f"step tracking stopped at step {self.index}: {type(err).__name__}: {err}"
            self.active = False
        if self.stop_requested:
            self.active = False
            raise StopAfterSteps(self.index)

    def fast_close(self, end_ns: int) -> bool:
        """Close the step in progress at ``end_ns`` and open the next one, when nothing but its row is
        due: no instrument at the next step (``acc[FAST_LAST]``, planned by :meth:`_plan_fast`: 0
        while no step is in progress, a boundary is pending or CUDA is up), no ``getrusage`` read and
        no lines to write (``acc[DUE]``). Else False, and nothing is done.

        The hot path of every step: the row is ``acc`` itself (its end filled in) copied onto a list of
        ints (see "Cost" above). The optimizer's and ``backward()``'s hooks do the same inline
        (tests/collect/test_collect_loops_e2e.py checks the rows they write)."""
        acc = self.acc
        if acc[INDEX] < acc[FAST_LAST] and end_ns < acc[DUE]:
            acc[END] = end_ns
            self.buf_extend(acc)
            acc[:N_FIGURES] = _ZERO  # in place: the hooks hold the list
            acc[INDEX] += 1
            acc[START] = _monotonic_ns()
            return True
        return False

    def _seal(self) -> None:
        """Move the rows fast_close buffered into ``_rows`` as one block, before anything else is
        appended there or what the block's rows share (the marker, forward_watched) changes."""
        if not self._buf:
            return
        buf = self._buf[:]
        self._buf.clear()
        n = len(buf) // ROW
        self._rows.append(_Block(self.source, self._watched, buf))
        walls = self.walls_plain
        if self._need_walls and len(walls) < 10_000:  # the cProfile window's baseline
            walls.extend(buf[k + END] - buf[k + START] for k in range(0, min(n, 10_000 - len(walls)) * ROW, ROW))

    def _fast_due(self, index: int, start: int, end_ns: int) -> None:
        """A fast boundary at or after ``acc[DUE]``: its row, with CPU figures (covering the steps
        since the last read) when a read is due, and the lines written when they are due."""
        cpu: tuple[Any, ...] = _NO_CPU
        if end_ns - self._ru_ns >= self.rusage_every_ns:
            ru = _getrusage(_RUSAGE_SELF)
            prev = self._ru
            cpu = (ru.ru_utime - prev.ru_utime, ru.ru_stime - prev.ru_stime, ru.ru_minflt - prev.ru_minflt,
                   ru.ru_majflt - prev.ru_majflt, index + 1 - self._ru_index)
            self._ru, self._ru_ns, self._ru_index = ru, end_ns, index + 1
        self._rows.append((*self.acc[:N_FIGURES], index, start, end_ns, self.epoch, self.source, self._watched, *cpu))
        if end_ns - self._last_write_ns >= self.write_every_ns:
            self._drain_rows(end_ns)
            if self.on_boundary is not None:
                self.on_boundary(index)
        self._set_due()

    def _set_due(self) -> None:
        """When a fast boundary next reads getrusage or writes the lines."""
        self.acc[DUE] = min(self._ru_ns + self.rusage_every_ns, self._last_write_ns + self.write_every_ns)

    def _plan_fast(self) -> None:
        """Up to which step boundaries may take the fast path: none while an instrument records,
        a row waits for GPU time or CUDA is up (its steps record CUDA events), else until the next
        instrument is due (or ``--steps``). A fast boundary does not ask about CUDA: one that comes up
        between two plans is seen at the next boundary with a read due (``RUSAGE_EVERY_NS``), and
        the steps closed until then have no GPU time."""
        self._set_due()
        c = self.cprofile
        self._need_walls = c.enabled and not c.done
        if (self.source == "none" or self.every_boundary or c.running or self._held or not self.in_step
                or self.pending_boundary_ns is not None or self._cuda_flag._initialized):
            self.acc[FAST_LAST] = 0  # (the hooks rely on it: no step in progress, or a boundary pending, is slow)
            return
        until = self.max_steps if self.max_steps is not None else 1 << 62
        if self.profiler is not None:
            until = min(until, self.profiler.idle_until())
        if self._need_walls:
            until = min(until, c.start_step)
        self.acc[FAST_LAST] = until - 1

    def _stop_if_requested(self) -> None:
        if self.stop_requested:
            self.active = False
            raise StopAfterSteps(self.index)

    def _end_marked(self, end_ns: int) -> None:
        """The marker's call returned at ``end_ns``: the step in progress ends there."""
        if not self.in_step:
            self._guarded(lambda: self._open(end_ns))
            return
        self._boundary_then_reopen(end_ns, reopen=True)

    # ------------------------------------------------------------------ markers

    def _set_source(self, marker: str, first_step: int) -> None:
        """``marker`` marks the steps from ``first_step`` on."""
        self._seal()  # the buffered rows keep the marker they were measured under
        was = self.source
        self.source = marker
        self._sync_hot()
        self.acc[FAST_LAST] = 0  # the next boundary takes the slow path: it starts the instruments over
        detail = {"optimizer": self.optimizer_name, "module": self.root_name}.get(marker, "")
        self.markers.append((marker, first_step, detail))
        self.cand = None
        self._snap = None
        if was != "none":
            self._rebase_next = True

    def _candidate(self, kind: str, t_ns: int, key: int | None = None) -> None:
        """``kind`` (more specific than the established marker) occurred at ``t_ns``; ``key``
        tells module candidates apart (a shape probe in ``__init__`` is not the loop's model)."""
        cand = self.cand
        if cand is None or RANK[kind] > RANK[cand] or (kind == cand and key != self.cand_key):
            self.cand, self.cand_key, self.cand_count = kind, key, 1
            self._snap = self._snapshot(t_ns) if self.source == "none" else None
            return
        if kind != cand:
            return  # less specific than the candidate: a part of its iteration
        self.cand_count += 1
        if self.has_optimizer and not self.optimizer_stepped and self.cand_count < DEFER_WHILE_OPTIMIZER_IDLE:
            if self.source == "none":
                self._snap = self._snapshot(t_ns)
            return
        # established: the second occurrence with nothing more specific in between
        snap = self._snap
        provisional = self.source == "none"

        def work() -> None:
            self._set_source(kind, self.index)
            if provisional and snap is not None and self.in_step and snap[0] >= self.step_start_ns:
                self._split_at(snap)

        self._guarded(work)
        self._stop_if_requested()
        self._end_marked(t_ns)

    # ------------------------------------------------------------------ phases

    def phase_start(self, kind: int) -> tuple[int, int]:
        """A phase of ``kind`` starts now on the loop's thread, inside whatever phase is in progress:
        the token to pass to :meth:`phase_end` (the hooks' inline path does the same without a call
        when no phase is in progress)."""
        acc = self.acc
        outer = acc[PHASE]
        acc[PHASE] = kind + 1
        return outer, _monotonic_ns()

    def phase_end(self, token: tuple[int, int], kind: int) -> int:
        """The phase of ``token`` ends now: its time counts as ``kind`` and no longer as the enclosing
        phase's (whose own end adds its whole time); returns the time."""
        outer, start = token
        t = _monotonic_ns()
        acc = self.acc
        acc[PHASE] = outer
        e = t - start
        acc[kind] += e
        if outer:
            acc[outer - 1] -= e
        return t

    def _phase_enter(self, kind: int) -> None:
        self._phases.append(self.phase_start(kind))

    def _phase_exit(self, kind: int) -> int:
        """Close the innermost phase opened by :meth:`_phase_enter`."""
        if self._phases:
            return self.phase_end(self._phases.pop(), kind)
        return _monotonic_ns()

    def backward_enter(self) -> None:
        if not self.started:
            self.open_first()
        self._phase_enter(BACKWARD)

    def backward_exit(self, ok: bool) -> None:
        """The outermost ``backward()`` of the loop's thread returned (``ok``) or raised."""
        self.backward_done(ok, self._phase_exit(BACKWARD))

    def backward_done(self, ok: bool, t: int) -> None:
        """A ``backward()`` (its time charged) ended at ``t``: it returned (``ok``) or raised."""
        if not ok or not self.active:
            return
        self.acc[N_BWD] += 1
        src = self.source
        if src == "backward":
            self._end_marked(t)
        elif src != "optimizer":
            self._candidate("backward", t)

    def forward_enter(self) -> None:
        if not self.started:
            self.open_first()
        self._phase_enter(FORWARD)

    def forward_exit(self, ok: bool, key: int | None = None, grad: bool = False) -> None:
        """A call of the root module (``key``: its id) on the loop's thread returned (``ok``) or
        raised; ``grad``: its output carries an autograd graph."""
        self.forward_done(ok, key, grad, self._phase_exit(FORWARD))

    def forward_done(self, ok: bool, key: int | None, grad: bool, t: int) -> None:
        """A call of the root module (its time charged) ended at ``t``."""
        if not ok or not self.active:
            return
        if key == self.root_key:
            self.root_calls += 1
            self.root_grad_calls += grad
        elif len(self._top_calls) < 10_000:
            counts = self._top_calls.setdefault(key, [0, 0])
            counts[0] += 1
            counts[1] += grad
        src = self.source
        if src == "module":
            self._end_marked(t)
        elif RANK[src] < 2:
            self._candidate("module", t, key)

    def adopt_root(self, key: int, name: str) -> None:
        """The root module is found (``key``: its id): its calls so far count as its own."""
        self.root_key = key
        self.root_name = name
        self.root_calls, self.root_grad_calls = self._top_calls.pop(key, [0, 0])
        self._top_calls = {}

    # ------------------------------------------------------------------ optimizer steps

    def optimizer_created(self) -> None:
        self.has_optimizer = True
        self.open_first()

    def optimizer_enter(self) -> None:
        self._phase_enter(OPTIMIZER)

    def optimizer_exit(self) -> None:
        self._phase_exit(OPTIMIZER)

    def on_optimizer_step(self, optimizer: Any) -> None:
        """An optimizer's step() returned (patches' wrapper; its usual case, the marking optimizer
        in a step, is inlined there): note the boundary, or establish the marker."""
        if not self.active:
            return
        if id(optimizer) == self.acc[MARKER] and self.in_step and self.pending_boundary_ns is None:
            self.pending_boundary_ns = time.monotonic_ns()  # the usual case: the marking optimizer stepped
            self.marks += 1
            return
        marker = self.marker_ref() if self.marker_ref is not None else None
        if marker is None:
            try:
                self.marker_ref = weakref.ref(optimizer)
            except TypeError:
                self.marker_ref = lambda: optimizer
            marker = optimizer
            self.optimizer_name = type(optimizer).__qualname__
        if optimizer is not marker:
            # another optimizer in the marking one's iteration (a GAN's second): noted for the step in progress
            if self.in_step and len(self.other_steps) < 100_000:
                index = self.acc[INDEX]
                self.other_steps[index] = self.other_steps.get(index, 0) + 1
                if len(self.other_optimizers) < 8:
                    self.other_optimizers.setdefault(type(optimizer).__qualname__, None)
            return
        self.acc[MARKER] = id(optimizer)
        now = time.monotonic_ns()
        self.marks += 1
        self.optimizer_stepped = True
        if self.source != "optimizer":
            self._set_source("optimizer", self.index)
        if not self.started:
            # a step we could not see begin: it opens step 0 instead of closing one
            self.started = True
            self._set_loop_thread()
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

    def _wait_starts(self, now: int) -> tuple[int, int]:
        """The data wait's token (see :meth:`phase_start`), from ``now``; a phase only on the loop's thread."""
        acc = self.acc
        outer = acc[PHASE]
        if threading.get_ident() == self.loop_thread:
            acc[PHASE] = IN_WAIT
        return outer, now

    def dataloader_next_enter(self, epoch_ends: bool = False) -> tuple[int, int]:
        """Called as ``__next__`` is entered; returns the wait's token for :meth:`dataloader_next_exit`.

        ``epoch_ends``: the iterator has yielded every batch (known for map-style
        datasets), so this call will raise ``StopIteration`` and opens no step.
        """
        now = _monotonic_ns()
        if not self.active:
            return self._wait_starts(now)
        if self.pending_boundary_ns is not None:
            self.flush(from_step_return=False)
        if self.source != "dataloader":
            if epoch_ends:
                return self._wait_starts(now)
            self.dl_entries += 1
            if not self.started:
                self.open_first()
                return self._wait_starts(_monotonic_ns())
            if (self.source != "none" or self.cand is not None or self.dl_entries < 2
                    or (self.has_optimizer and self.dl_entries < DEFER_WHILE_OPTIMIZER_IDLE)):
                return self._wait_starts(now)
            self._guarded(lambda: self._set_source("dataloader", self.index))
            if self.source != "dataloader":
                return self._wait_starts(now)
        # DataLoader mode: each batch asked for ends the step before it
        self._opened_at_entry = False
        if self.in_step:
            self._boundary_then_reopen(now, reopen=not epoch_ends)
            self._opened_at_entry = not epoch_ends
        elif not epoch_ends:
            def reopen() -> None:
                self.cuda.boundary(None)
                self._open(time.monotonic_ns())

            self._guarded(reopen)
            self._opened_at_entry = True
        return self._wait_starts(_monotonic_ns())

    def dataloader_next_exit(self, entered: tuple[int, int], stopped: bool, epoch: int | None) -> None:
        """``__next__`` returned a batch or (``stopped``) raised StopIteration; ``entered``: the
        token :meth:`dataloader_next_enter` returned."""
        on_loop = threading.get_ident() == self.loop_thread
        if on_loop:
            self.acc[PHASE] = entered[0]  # whatever happens next, the wait is over
        if not self.active:
            return
        if epoch is not None:
            self.epoch = epoch
        if stopped and self.source == "dataloader" and self.in_step and self._opened_at_entry:
            # an epoch ended where its length could not be known in advance: the step
            # opened at this call holds no batch, so it is dropped (its index is reused)
            self._guarded(self._discard_open_step)
            return
        if on_loop and self.in_step:
            outer, start = entered
            e = _monotonic_ns() - start
            acc = self.acc
            acc[WAIT] += e
            if outer:
                acc[outer - 1] -= e
            if not stopped:
                acc[N_BATCHES] += 1

    def _discard_open_step(self) -> None:
        self.cprofile.pause_for_bookkeeping()
        if self.profiler is not None:
            self.profiler.discard_step()
        self.in_step = False
        self.acc[FAST_LAST] = 0  # (see _plan_fast)
        self.cuda.restart()

    # ------------------------------------------------------------------ the end

    def finish(self, cuda_timeout_s: float = 5.0) -> None:
        """The script is over: flush a noted boundary and the records still waiting for GPU time.

        The step in progress (if the script ended mid-step) is not written: it is not a
        complete step; except in a run that never established a marker, where the
        candidate's one occurrence ends step 0 (a script of one iteration still has a step).
        """
        if self.pending_boundary_ns is not None and self.active:
            try:
                self.flush(from_step_return=False)
            except StopAfterSteps:
                pass
        if self.active and self.source == "none" and self.cand is not None and self._snap is not None and self.in_step:
            snap = self._snap

            def one_step() -> None:
                self._set_source(self.cand or "none", 0)
                self._split_at(snap)

            try:
                self._guarded(one_step)
            except StopAfterSteps:
                pass
        self.active = False
        self._release(self.cuda.drain(cuda_timeout_s), final=True)
        self._drain_rows(time.monotonic_ns())
        try:
            self.writer.flush()
        except OSError:
            pass

    def describe(self) -> tuple[str, str, list[dict[str, Any]]]:
        """(marker, why it marks the steps in words, every marker in force) for the manifest."""
        src = self.source
        detail = self.markers[-1][2] if self.markers else ""
        if src == "optimizer":
            why = f"{detail or 'optimizer'}.step() ends each step"
            counts = self.micro_counts
            if counts:
                typical = max(sorted(counts), key=lambda k: counts[k])
                if typical > 1:
                    why += f"; gradient accumulation: {typical} micro-batches (backward() calls) per step"
            if self.other_optimizers and 2 * self.steps_with_others >= sum(counts.values()):
                names = ", ".join(self.other_optimizers)
                why += (f"; another optimizer ({names}) also steps in each iteration: one step, its backward() "
                        "calls not gradient accumulation")
        elif src == "backward":
            why = "loss.backward() ends each step (parameters updated without an optimizer step); " + (
                "an optimizer object exists but never stepped" if self.has_optimizer else "no optimizer object")
        elif src == "module":
            why = (f"each call of the root module{f' ({detail})' if detail else ''} ends a step; "
                   "nothing calls backward(): evaluation or inference")
        elif src == "dataloader":
            why = "each DataLoader batch is a step; no optimizer step, backward() or root-module call was seen"
        else:
            why = "no optimizer step, backward(), root-module call or DataLoader batch was seen"
        if len(self.markers) > 1:
            before = ", ".join(f"{MARKER_CALLS[m]} from step {s}" for m, s, _ in self.markers[:-1])
            why += f" (from step {self.markers[-1][1]}; before it: {before})"
        return src, why, [{"marker": m, "first_step": s, "detail": d} for m, s, d in self.markers]

    @property
    def steps_seen(self) -> int:
        return self.index

    def in_child_after_fork(self) -> None:
        self.active = False


def record_from_dict(d: dict[str, Any]) -> StepRecord:
    return StepRecord.from_dict(d)
