"""torch.profiler, driven by the step boundaries; and a script that runs torch.profiler itself.

One ``torch.profiler.profile`` object per window, created when the window's first
step begins and driven with ``step()`` at every boundary through a schedule that
maps its steps onto the run's step indices. The profiler's own ``ProfilerStep#N``
markers are replaced by gpudoctor's, entered and left at the step boundaries, so
that ``ProfilerStep#N`` in a trace is step ``N`` of ``steps.jsonl``.

A window with stacks records every Python call of its steps. Its last warm-up step
runs under a cProfile probe that counts them; a window whose steps would record more
than ``PYTHON_CALLS_BUDGET`` calls in all records fewer steps (at least one), exports
its trace after them and lets the rest of its steps run unprofiled. The trace says so
(``gpudoctorStackBound``); the parent then thins the short calls out of it
(``tracefilter``).

When a more specific step marker takes over (``steps``: training after an evaluation
pass), :meth:`ProfilerDriver.rebase` exports the window in progress and the schedule
starts over from the new marker's first step: ``skip_first`` is counted from there, and
the first window after it records shapes and stacks again.

A run without step structure gets one *time window* instead (``timewindow``): the
profiler records from second 5 to 10 of the script (CPU, CUDA when in use, shapes; no
stacks: a window of unknown Python need not be bounded), kept in memory and exported
under step 0's name only when the run ends without a step.

Kineto allows one profiler per process: when the script runs torch.profiler itself, gpudoctor's
gives way and copies or exports the script's traces (``scriptprof``, the part of
:class:`ProfilerDriver` that meets the script's own profilers).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpudoctor.collect import profslot
from gpudoctor.collect import schedule as sched
from gpudoctor.collect.rundir import settle_trace_export
from gpudoctor.collect.scriptprof import ScriptProfilers
from gpudoctor.model import ProfilerSchedule
from gpudoctor.model.layout import (
    INCOMPLETE_SUFFIX,
    TRACE_STACK_BOUND_KEY,
    plain_trace,
    trace_name,
)

# Python calls a window may record with stacks. torch's Python tracer records every call,
# C calls included; a step that runs a tokenizer in the loop makes ~330 000 of them, and
# stopping and exporting a 5-step window of those took 8-17 s here (a 470 MB trace). A window
# whose last warm-up step makes more than BUDGET / active calls records fewer steps
# (docs/run-directory.md, "Python calls in a trace").
PYTHON_CALLS_BUDGET = 400_000


@contextmanager
def no_lazy_inductor(torch: Any) -> Iterator[None]:
    """Keep ``prepare_trace`` from importing torch._inductor (and dynamo, sympy …) for nothing.

    torch.profiler's ``prepare_trace`` asks ``hasattr(torch, "_inductor")`` to read an
    inductor setting; on a script that never compiles, that lazy import costs ~1.8 s
    (measured here), once per process. While gpudoctor starts a window, the lazy import
    of ``torch._inductor`` alone is refused; a script that compiled has it imported
    already and is not affected.
    """
    if "torch._inductor" in sys.modules or "__getattr__" not in torch.__dict__:
        yield
        return
    orig = torch.__dict__["__getattr__"]

    def getattr_(name: str) -> Any:
        if name == "_inductor" and "torch._inductor" not in sys.modules:
            raise AttributeError(name)
        return orig(name)

    torch.__getattr__ = getattr_
    try:
        yield
    finally:
        torch.__getattr__ = orig


def _tracer_holds() -> bool:
    return profslot.holder() == "PyTorch Profiler"


class ProfilerDriver(ScriptProfilers):
    """The one owner of the process's only profiler: the schedule of windows, the Python-call budget's
    probe and the time-based window start, stop and export it, driven from the step hooks; the script's
    own profilers are met by its base, :class:`~gpudoctor.collect.scriptprof.ScriptProfilers`."""

    def __init__(
        self,
        torch: Any,
        schedule: ProfilerSchedule,
        run_dir: Path,
        worker: str,
        on_change: Callable[[], None],
        current_step: Callable[[], int],
    ) -> None:
        self.torch = torch
        self.schedule = schedule
        self.run_dir = run_dir
        self.worker = worker
        self.on_change = on_change
        self.current_step = current_step
        self.owner = "gpudoctor"
        self.enabled = True
        self.active = True  # False in a forked child
        self.error = ""
        self.traces: list[str] = []
        self.user_traces: list[str] = []  # where the script exported its own traces
        self.user_trace_errors: list[str] = []
        self.write_errors: list[dict[str, str]] = []  # traces that could not be written (manifest.write_errors)
        self.windows_started = 0
        self.detail_windows_recorded = 0
        self.cuda_traced = False
        self._stacks_on = False  # the window being recorded has stacks
        self._window_prof: Any = None  # (the property _prof)
        self._window_first_active = 0
        self._annotation: Any = None
        self._own_n = 0  # (the property _own_depth)
        self._in_user_export = False
        self._quiet_until = 0  # no window before this step: on_step_start returns at once
        self._probe: Any = None  # cProfile counting the Python calls of the last warm-up step
        self._probe_step = -1
        self._cut_at: int | None = None  # last recorded step of a window cut short by the Python-call budget
        # the warm-up step of the plain window (no stacks) that records the rest of a window cut short
        self._rest_warm: int | None = None
        self._trace_first = 0  # first recorded step of the window being recorded (names its trace)
        self._bound: dict[str, int] | None = None  # the bound applied to the window being recorded
        self.stack_bounds: list[dict[str, int]] = []  # every window cut short, in order
        self.origin = 0  # step the schedule counts from (a marker that took over starts it again)
        self.rebased_at: list[int] = []
        self.user_profilers = 0  # profilers the script created
        self.user_exports_by_gpudoctor = 0  # traces of the script's profilers that it never exported
        self.user_copies = 0  # traces the script exported, copied into the run directory
        self._time_prof: Any = None  # the time window's profiler while it records
        self._time_done: Any = None  # … and once it stopped, until the run ends
        self.time_trace = ""  # the time window's trace, exported and listed only if the run has no steps
        # the script's profilers that stopped without exporting: (profiler, its export, the step at its stop)
        self._unexported: list[tuple[Any, Callable[[str], Any], int]] = []
        # where the stacks or the Python-call probe gave way to another profiler (profslot), in words
        self.slot_notes: list[str] = []

    # ------------------------------------------------------------------ the schedule

    @property
    def _prof(self) -> Any:
        """The window in progress (torch.profiler's ``profile``). From 3.12 its Python tracer takes
        ``sys.monitoring``'s tool 2 while it records stacks: the slot's watch is on meanwhile (``profslot.hold``)."""
        return self._window_prof

    @_prof.setter
    def _prof(self, prof: Any) -> None:
        self._window_prof = prof
        if prof is not None and self._stacks_on and profslot.NEW_SLOT:
            profslot.hold(self, "torch.profiler's Python stacks", _tracer_holds)
        else:
            profslot.release(self)

    @property
    def _own_depth(self) -> int:
        """Calls of gpudoctor's into torch.profiler in progress: the hooks let them be, and so does the watch
        of Python's profiler slot (``profslot.own_calls_add``: the tracer's calls to ``sys.monitoring``)."""
        return self._own_n

    @_own_depth.setter
    def _own_depth(self, n: int) -> None:
        profslot.own_calls_add(n - self._own_n)
        self._own_n = n

    def _phase(self, step: int) -> str:
        return sched.phase(step - self.origin, self.schedule) if step >= self.origin else sched.NONE

    def _window_start(self, step: int) -> int:
        return self.origin + sched.window_start(step - self.origin, self.schedule)

    def _action(self, step: int) -> Any:
        PA = self.torch.profiler.ProfilerAction
        ph = self._phase(step)
        if ph == sched.WARMUP:
            return PA.WARMUP
        if ph == sched.ACTIVE:
            if step == self._rest_warm:
                return PA.WARMUP
            cut = self._cut_at
            if cut is not None and self._window_start(step) == self._window_start(cut):
                return PA.RECORD_AND_SAVE if step == cut else PA.RECORD if step < cut else PA.NONE
            last = sched.is_last_active(step - self.origin, self.schedule)
            return PA.RECORD_AND_SAVE if last else PA.RECORD
        return PA.NONE

    def _window_over_after(self, step: int) -> bool:
        return not self._phase(step + 1) or step == self._cut_at

    def rebase(self, origin: int) -> None:
        """A more specific step marker took over: export the window in progress and count the
        schedule from step ``origin`` (the first step under the new marker)."""
        if not self.active or self.owner != "gpudoctor":
            return
        self.finish()
        self.origin = origin
        self.rebased_at.append(origin)
        self._quiet_until = 0
        self._cut_at = None
        self._rest_warm = None
        self._bound = None
        self.windows_started = 0  # the first window of the new marker records shapes and stacks

    def running_schedule(self) -> bool:
        return self.enabled and self.active and self.owner == "gpudoctor"

    def idle_until(self) -> int:
        """The first step whose start or end needs this driver: before it, no window records and
        none starts, so the tracker may skip the calls (its fast path)."""
        if not self.active or not self.running_schedule():
            return 1 << 62
        if self._prof is not None or self._annotation is not None or self._probe is not None:
            return 0
        return self._quiet_until

    def on_step_start(self, step: int) -> str:
        """Step ``step`` begins: open a window if one starts here; return the step's phase."""
        if step < self._quiet_until or not self.running_schedule():
            return ""
        ph = self._phase(step)
        if not ph:
            nxt = sched.next_window_start(step - self.origin, self.schedule) if step >= self.origin else 0
            self._quiet_until = self.origin + nxt if nxt is not None else 1 << 62
            return ""
        if self._time_prof is not None:  # the time window still records: the steps wait for it
            return ""
        self._window_first_active = self._window_start(step)
        if step == self._rest_warm:
            ph = sched.WARMUP  # the plain window's warm-up: not recorded
        try:
            if self._prof is None:
                self._start_window(step, plain=step == self._rest_warm)
            if step == self._window_first_active and self._bound is not None:
                self._note_bound()
            name = f"ProfilerStep#{step}"
            self._own_depth += 1
            try:
                self._annotation = self.torch.profiler.record_function(name)
                self._annotation.__enter__()
            finally:
                self._own_depth -= 1
        except Exception as err:
            self._fail(err)
            return ""
        if ph == sched.WARMUP and self._stacks_on and step == self._window_first_active - 1:
            self._start_probe(step)
        return ph

    # ------------------------------------------------------------------ the Python-call budget

    def _start_probe(self, step: int) -> None:
        """Count the Python calls of the last warm-up step (cProfile, this thread), so that a
        window of Python-heavy steps records fewer of them with stacks. Skipped, and said, when
        another profiler (the script's own) holds Python's profiler slot (``profslot``)."""
        probe = profslot.OwnProfile()
        why = profslot.enable_own(probe, "the Python-call probe of torch.profiler's window", subcalls=False, builtins=True)
        if why:
            self.slot_notes.append(f"the Python-call budget was not applied to the window from step {step + 1}: {why}")
            return
        self._probe, self._probe_step = probe, step

    def _drop_probe(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            try:
                profslot.disable_own(probe)
            except Exception:
                pass

    def _finish_probe(self, step: int) -> None:
        probe, self._probe = self._probe, None
        if profslot.disable_own(probe):  # up to 3.11: another profiler replaced it during the step
            self.slot_notes.append(f"the Python-call budget was not applied to the window from step {step + 1}: "
                                   "another profiler replaced its probe during the step (sys.setprofile)")
            return
        if step != self._probe_step:
            return
        calls = sum(int(entry.callcount) for entry in probe.getstats())
        active = self.schedule.active
        steps = max(1, min(active, PYTHON_CALLS_BUDGET // max(calls, 1)))
        if steps >= active:
            return
        first = step + 1
        self._cut_at = first + steps - 1
        self._bound = {
            "python_calls_per_step": calls,
            "budget": PYTHON_CALLS_BUDGET,
            "steps_recorded": steps,
            "steps_scheduled": active,
            "first_step": first,
        }
        # The budget bounds the stacks, not the timings: the rest of the window, after one warm-up
        # step, is recorded by a plain window (no stacks), so that a short run (--steps 40, one
        # window) still measures several steps.
        rest = first + active - 1 - (self._cut_at + 1)
        if rest >= 1:
            self._rest_warm = self._cut_at + 1
            self._bound["rest_recorded"] = rest
            self._bound["rest_first_step"] = self._rest_warm + 1
        self.stack_bounds.append(self._bound)

    def _note_bound(self) -> None:
        """Recording now: the bound goes into the trace's metadata (a failure only loses the note)."""
        self._own_depth += 1
        try:
            self._prof.add_metadata_json(TRACE_STACK_BOUND_KEY, json.dumps(self._bound))
        except Exception:
            pass
        finally:
            self._own_depth -= 1

    def _start_window(self, step: int, plain: bool = False) -> None:
        """Open a window at ``step``. ``plain``: the rest of a window cut short by the Python-call
        budget, without stacks (its shapes and memory as the window it continues)."""
        torch = self.torch
        activities = [torch.profiler.ProfilerActivity.CPU]
        try:
            if torch.cuda.is_initialized() and torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                self.cuda_traced = True
        except Exception:
            pass
        base = step
        s = self.schedule
        # shapes, stacks and memory cost 3-4x a plain window (stop + export): the first
        # detail_windows windows record them, later ones record timings only
        detail = plain or not s.detail_windows or self.windows_started < s.detail_windows
        if detail and not plain:
            self.detail_windows_recorded += 1
        self._stacks_on = bool(s.with_stack and detail and not plain)
        if self._stacks_on and not profslot.NEW_SLOT:
            # up to 3.11 the Python tracer would displace a profiler set on this thread, and clear it when it
            # stops (from 3.12 it records beside one, through sys.setprofile)
            who = profslot.holder()
            if who:
                self._stacks_on = False
                self.slot_notes.append(f"the window from step {self._window_start(step)} recorded no Python stacks: "
                                       f"{profslot.held_by(who)}")
        self._trace_first = step + 1 if plain else self._window_start(step)
        self._cut_at = None
        self._bound = None
        self._own_depth += 1
        try:
            prof = torch.profiler.profile(
                activities=activities,
                schedule=lambda n: self._action(base + n),
                on_trace_ready=self._trace_ready,
                record_shapes=s.record_shapes and detail,
                with_stack=self._stacks_on,
                profile_memory=s.profile_memory and detail,
            )
            prof.record_steps = False  # gpudoctor writes ProfilerStep#N itself (run step indices)
            with no_lazy_inductor(torch):
                prof.start()
        finally:
            self._own_depth -= 1
        self._prof = prof
        self._base = base
        if not plain:
            self.windows_started += 1

    def on_step_end(self, step: int) -> None:
        if self._annotation is not None:
            ann, self._annotation = self._annotation, None
            try:
                ann.__exit__(None, None, None)
            except Exception as err:
                self._fail(err)
                return
        if self._probe is not None:
            try:
                self._finish_probe(step)
            except Exception:  # the budget is an optimisation: the window goes on unbounded
                self._drop_probe()
        if self._prof is None:
            return
        self._own_depth += 1
        try:
            with no_lazy_inductor(self.torch):
                self._prof.step()
            if self._window_over_after(step):
                if step == self._cut_at and self._rest_warm is None:  # the rest of the window runs unprofiled
                    self._quiet_until = self._window_first_active + self.schedule.active
                elif self._rest_warm is not None and step > self._rest_warm:
                    self._rest_warm = None  # the plain window that recorded the rest is over
                # the window is over (its trace was exported by step()): let it go
                self._prof.stop()
                self._prof = None
                self._cut_at = None
        except Exception as err:
            self._fail(err)
        finally:
            self._own_depth -= 1

    def discard_step(self) -> None:
        """The step just begun holds nothing (an epoch ended unannounced): close its marker."""
        if self._annotation is not None:
            ann, self._annotation = self._annotation, None
            try:
                ann.__exit__(None, None, None)
            except Exception as err:
                self._fail(err)

    def _trace_ready(self, prof: Any) -> None:
        """Export the window: plain JSON under its final name less ".gz" (the name Kineto
        writes into the trace as ``traceName``). The parent gzips it once it is listed,
        so the compression costs the training process nothing."""
        name = trace_name(self.worker, self._trace_first)
        plain = self.run_dir / plain_trace(name)
        prof.export_chrome_trace(str(plain))
        # Kineto reports a failed write or rename only in its log: look at what it left
        problem = settle_trace_export(plain)
        if problem:
            kept = self.run_dir / (plain.name + INCOMPLETE_SUFFIX)
            what = f"the trace of the window from step {self._trace_first}"
            if kept.is_file():
                what += f" ({kept.stat().st_size:,} bytes written, kept incomplete)"
            self.write_errors.append(
                {"path": plain.name, "error": problem, "what": what, "kept": kept.name if kept.is_file() else ""}
            )
        else:
            self.traces.append(name)
        self.on_change()

    def _fail(self, err: BaseException) -> None:
        self.error = f"torch.profiler failed: {type(err).__name__}: {err}"
        self.enabled = False
        self._time_prof = None
        self._drop_probe()
        self._annotation = None
        prof, self._prof = self._prof, None
        if prof is not None:
            self._own_depth += 1
            try:
                prof.stop()
            except Exception:
                pass
            finally:
                self._own_depth -= 1
        self.on_change()

    def finish(self) -> None:
        """The script is over: close the step marker and export a window cut short."""
        self.stop_time_window()
        self._drop_probe()
        if self._annotation is not None:
            ann, self._annotation = self._annotation, None
            try:
                ann.__exit__(None, None, None)
            except Exception:
                pass
        prof, self._prof = self._prof, None
        if prof is not None:
            self._own_depth += 1
            try:
                prof.stop()  # a recording window exports what it has (torch calls on_trace_ready)
            except Exception as err:
                self.error = f"torch.profiler failed at the end: {type(err).__name__}: {err}"
            finally:
                self._own_depth -= 1

    # ------------------------------------------------------------------ trace names

    def _free_name(self, span: int) -> str:
        base = trace_name(self.worker, span)
        while (self.run_dir / base).exists() or (self.run_dir / plain_trace(base)).exists() or base in self.traces:
            span += 1  # the span is only a number to torch-tb-profiler: keep names unique
            base = trace_name(self.worker, span)
        return base

    # ------------------------------------------------------------------ the time window

    def start_time_window(self) -> bool:
        """No step structure: record from now until :meth:`stop_time_window`."""
        if not self.running_schedule() or self._prof is not None or self._time_prof is not None:
            return False
        torch = self.torch
        activities = [torch.profiler.ProfilerActivity.CPU]
        try:
            if torch.cuda.is_initialized() and torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                self.cuda_traced = True
        except Exception:
            pass
        self._own_depth += 1
        try:
            prof = torch.profiler.profile(activities=activities, record_shapes=self.schedule.record_shapes)
            with no_lazy_inductor(torch):
                prof.start()
        except Exception as err:
            self._fail(err)
            return False
        finally:
            self._own_depth -= 1
        self._time_prof = prof
        return True

    def stop_time_window(self) -> None:
        """Stop the time window; what it recorded stays in memory until :meth:`export_time_window`."""
        prof, self._time_prof = self._time_prof, None
        if prof is None:
            return
        self._own_depth += 1
        try:
            prof.stop()
            self._time_done = prof
        except Exception as err:
            self.error = f"torch.profiler failed in the time window: {type(err).__name__}: {err}"
        finally:
            self._own_depth -= 1

    def drop_time_window(self) -> None:
        """Steps were found after all: the time window is not part of the run."""
        self._time_done = None

    def export_time_window(self) -> str:
        """At the end of a run without steps: export the time window (named for step 0) and list it."""
        prof, self._time_done = self._time_done, None
        if prof is None:
            return ""
        name = self._free_name(0)
        self._own_depth += 1
        try:
            prof.export_chrome_trace(str(self.run_dir / plain_trace(name)))
        except Exception as err:
            self.error = f"the time window's trace could not be exported: {type(err).__name__}: {err}"
            return ""
        finally:
            self._own_depth -= 1
        self.time_trace = name
        self.traces.append(name)
        return name

    def in_child_after_fork(self) -> None:
        self._unexported = []
        self._drop_probe()  # a forked worker inherits the probe's sys.setprofile hook
        self.active = False
        self._annotation = None
        self._prof = None
        self._time_prof = self._time_done = None
