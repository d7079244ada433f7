"""``StepTracker``: the step boundaries, the marker cascade and the phases, driven by the hooks.

The package's docstring (:mod:`gpudoctor.collect.steps`) says what a step is, how its marker is
chosen, how its phases are timed and what the hot path costs. This module is the tracker itself;
its helpers live beside it: the indices of ``acc`` (``fields``), the CUDA step timer (``cuda``),
the cProfile window (``cprofile_window``), the rows and their encoding (``rows``), ``--steps``
(``limit``).

Why this file is long: a measured hot path. ``StepTracker``'s per-call hooks and their bookkeeping run
on every DataLoader ``__next__``, ``backward()`` and ``optimizer.step()`` of the user's loop: 12-14 µs
per step in all in a DataLoader + forward + ``backward()`` + ``optimizer.step()`` loop of ~240 µs steps
(``benchmarks/overhead.py --hooks-only``, median of 5 runs of 12,000 steps on the 2-core CI machine,
2026-11-26; docs/performance.md), where each Python operation of a hook costs ~0.04 µs and that loop
runs ~360 of them per step. Its layout (the hooks and their bookkeeping in one class, no indirection
between a hook and what it records) was tuned against that figure; its helpers were moved out (above),
and the class's own methods stay together, as splitting them across classes or modules would add
lookups to every step.
"""

from __future__ import annotations

import resource
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from gpudoctor.collect import schedule as sched
from gpudoctor.collect.rundir import JsonlWriter
from gpudoctor.collect.steps.cprofile_window import CprofileWindow
from gpudoctor.collect.steps.cuda import CudaStepTimer, _CudaInitialized
from gpudoctor.collect.steps.fields import (
    _NO_CPU,
    _ZERO,
    BACKWARD,
    BATCH_THREAD,
    BWD_THREAD,
    DEFER_WHILE_OPTIMIZER_IDLE,
    DUE,
    END,
    EPOCH,
    FAST_LAST,
    FORWARD,
    IN_WAIT,
    INDEX,
    MARKER,
    MARKER_CALLS,
    N_BATCHES,
    N_BWD,
    N_FIGURES,
    NO_THREAD,
    OPT_THREAD,
    OPTIMIZER,
    PHASE,
    RANK,
    ROOT_CALLS,
    ROW,
    RUSAGE_EVERY_NS,
    START,
    TRAIN_THREAD,
    WAIT,
    _Snapshot,
)
from gpudoctor.collect.steps.limit import StepLimit, StopAfterSteps, stopper
from gpudoctor.collect.steps.rows import _Block, encode_rows
from gpudoctor.model import ProfilerSchedule

_getrusage = resource.getrusage
_monotonic_ns = time.monotonic_ns
_RUSAGE_SELF = resource.RUSAGE_SELF


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
        # what the hooks use at every step (indices WAIT … ROOT_CALLS, see "Cost" in the package's docstring): changed in
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
        self.error = ""  # why step tracking stopped (an error of gpudoctor's), in words
        self.failed_at: int | None = None  # … and at which step: the figures of the steps from there on are missing
        self.limit: StepLimit | None = None  # --steps once step tracking stopped (see limit)
        self.source = "none"  # the established marker (see the package's docstring): set by _set_source
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
            if not cprofile.resume_after_bookkeeping(self.index):  # enabled once; it gave way (the slot is held)
                self._window = torch_phase
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

    def _drain_rows(self, now_ns: int) -> None:
        """Format and write the finished rows (once a second, and at the end)."""
        self._last_write_ns = now_ns
        self._seal()
        if self._rows:
            rows, self._rows = self._rows, []
            text, with_others = encode_rows(rows, self.t0, self._rank_int, self.micro_counts, self.other_steps)
            self.steps_with_others += with_others
            self.writer.write_text(text)

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
            self._fail(err, self.index, self.in_step)

    def _fail(self, err: BaseException, done: int, step_open: bool) -> None:
        """Step tracking stops on an error of gpudoctor's (``done`` steps completed; ``step_open``: a
        step was in progress, or opening): the steps recorded are kept, the run says from which step
        its figures are partial and why (``error``, ``failed_at``), and ``--steps`` goes on counting
        on a path of its own (:class:`StepLimit`)."""
        if self.error:  # the first error is the cause
            self.active = False
            return
        self.failed_at = self.index
        self.error = f"step tracking stopped at step {self.index}: {type(err).__name__}: {err}"
        self.active = False
        # no boundary will drive the instruments any more: a window in progress ends here (what it recorded is kept)
        for stop in (self.cprofile.stop, self.profiler.finish if self.profiler is not None else None):
            if stop is not None:
                try:
                    stop()
                except Exception:
                    pass
        if self.max_steps is None:
            return
        self.limit = self._limit(done, step_open)
        if self.limit is None:
            self.error += f"; --steps {self.max_steps} could not be kept: no marker of the steps was established yet"
            return
        if done >= self.max_steps:
            self.stop_requested = True

    def _limit(self, done: int, step_open: bool, any_thread: bool = False) -> StepLimit | None:
        """--steps on a path of its own (:class:`StepLimit`), ``done`` steps completed; None without a marker.
        ``any_thread``: a marker with a key (an optimizer, a root module) counts on every thread."""
        marker = self.source if self.source != "none" else self.cand
        if marker is None or self.max_steps is None:
            return None
        key = None
        if marker == "optimizer":
            key = self.acc[MARKER] or None
        elif marker == "module":
            key = self.root_key if self.source == "module" else self.cand_key
        thread = None if any_thread and key is not None else self.loop_thread
        return StepLimit(self.max_steps, marker, key, done, thread, step_open)

    def _stop(self, steps: int) -> None:
        """``--steps``: stop the script after ``steps`` steps (on the main thread: see :class:`MainStop`). Step
        tracking ends here; the limit counts on, so that a script that swallows the stop meets it again at
        each later boundary, and the run says how many steps it ran."""
        self.active = False
        if self.limit is None:
            self.limit = self._limit(steps, False, any_thread=True)
        stopper.stop(steps)

    def _stop_count(self) -> int:
        """The steps run when ``--steps`` stops the script (the limit's count once tracking stopped)."""
        return self.limit.done if self.limit is not None else self.index

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
                self._fail(err, index + 1, True)
                if self.stop_requested:
                    self._stop(self._stop_count())
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
            self._fail(err, index + 1, reopen)
        if self.stop_requested:
            self._stop(self._stop_count())

    def fast_close(self, end_ns: int) -> bool:
        """Close the step in progress at ``end_ns`` and open the next one, when nothing but its row is
        due: no instrument at the next step (``acc[FAST_LAST]``, planned by :meth:`_plan_fast`: 0
        while no step is in progress, a boundary is pending or CUDA is up), no ``getrusage`` read and
        no lines to write (``acc[DUE]``). Else False, and nothing is done.

        The hot path of every step: the row is ``acc`` itself (its end filled in) copied onto a list of
        ints (see "Cost" in the package's docstring). The optimizer's and ``backward()``'s hooks do the same inline
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
            self._stop(self.index)

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
        if self._active:
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
