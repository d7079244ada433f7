"""A time-based window for a script without step structure (``step_source: "time"``).

When nothing marks a step (no optimizer step, ``backward()``, root-module call or
DataLoader batch: a loop of bare tensor operations, a script outside torch's usual
shapes), torch.profiler and cProfile still record seconds ``start_s``–``end_s`` of the
script (5–10 by default, ``--time-window``), so the run is analysed as "no step
structure" rather than left empty.

cProfile follows only the thread that enables it, and the script's loop runs on the
main thread, so the window is opened and closed *on the main thread*: a timer thread
sends the main thread a real-time signal (``mainsignal``: ``pthread_kill``; a signal no library uses,
installed with ``SA_RESTART`` so that interrupted system calls resume) and the handler,
which Python runs between two bytecodes of the script, starts or stops the profilers.
Nothing the script computes changes; the window opens late when the main thread is
inside a long C call.

The window gives way to steps: when the first step is written (a loop started late,
after the window opened), the window stops and its data are dropped; a run that has
steps is analysed on them. What the window recorded is kept in memory and written
(the trace listed in the manifest, cProfile as ``profile.pstats``) when the run ends
without a step, also when it is interrupted or raises; a process killed outright
loses it.
"""

from __future__ import annotations

import cProfile
import marshal
import threading
import time
from pathlib import Path
from typing import Any

from gpudoctor.collect import profslot
from gpudoctor.collect.mainsignal import MainSignal, free_signal
from gpudoctor.collect.rundir import write_bytes_atomic

DEFAULT_START_S = 5.0
DEFAULT_END_S = 10.0


class TimeWindow:
    def __init__(
        self,
        tracker: Any,  # steps.StepTracker
        driver: Any,  # torchprof.ProfilerDriver, or None without a profiler schedule
        pstats_path: Path,
        start_s: float | None,
        end_s: float | None,
        cprofile: bool,
    ) -> None:
        self.tracker = tracker
        self.driver = driver
        self.pstats_path = pstats_path
        self.start_s = start_s
        self.end_s = end_s
        self.cprofile_on = cprofile
        self.state = "off"  # off, armed, recording, recorded, dropped
        self.reason = "" if start_s is not None else "switched off (--time-window off)"
        self.recorded_s: tuple[float, float] | None = None  # seconds of the script it covered
        self.traced = False
        self.pstats_written = False
        self._signal = MainSignal()  # opens and closes the window on the main thread
        self._t0 = 0
        self._pending = ""
        self._stop = threading.Event()
        self._cprof: cProfile.Profile | None = None
        self._cprof_on = False  # its cProfile is enabled now
        self.cprofile_note = ""  # its cProfile "did not run: …" or "stopped early: …" for another profiler
        self._began_ns = 0

    # ------------------------------------------------------------------ set-up (main thread)

    def arm(self, script_start_ns: int) -> None:
        if self.start_s is None or self.end_s is None:
            return
        why = self._signal.install(free_signal(), self._on_signal, "open it on the main thread")
        if why:
            self.reason = why
            return
        self._t0 = script_start_ns
        self.state = "armed"
        threading.Thread(target=self._run, name="gpudoctor-time-window", daemon=True).start()

    def _run(self) -> None:
        assert self.start_s is not None and self.end_s is not None
        if self._wait_until(self.start_s) or self.tracker.steps_seen or not self.tracker.active:
            return
        self._send("start")
        if self._wait_until(self.end_s):
            return
        self._send("stop")

    def _wait_until(self, seconds: float) -> bool:
        """Sleep until ``seconds`` into the script; True when stopped first."""
        left = self._t0 / 1e9 + seconds - time.monotonic_ns() / 1e9
        return self._stop.wait(max(0.0, left))

    def _send(self, action: str) -> None:
        if self._signal.sig is None or self._stop.is_set():
            return
        self._pending = action
        why = self._signal.send()  # (not sent where the script took the signal over)
        if why:
            self.reason = why

    def _on_signal(self, signum: int, frame: Any) -> None:
        action, self._pending = self._pending, ""
        try:
            if action == "start":
                self._begin()
            elif action == "stop":
                self._end()
            elif action == "cprof":
                self._stop_cprof()
        except Exception as err:  # gpudoctor's error never reaches the script
            self.reason = f"the time window failed: {type(err).__name__}: {err}"

    # ------------------------------------------------------------------ the window (main thread)

    def _begin(self) -> None:
        if self.state != "armed" or self.tracker.steps_seen:
            return
        self.state = "recording"
        self._began_ns = time.monotonic_ns()
        if self.driver is not None:
            self.traced = bool(self.driver.start_time_window())
        if self.cprofile_on:
            prof = profslot.OwnProfile()
            why = profslot.enable_own(prof, "the time window's cProfile")
            if why:  # another profiler holds Python's profiler slot (the script's own): it gives way
                self.cprofile_note = f"did not run: {why}"
            else:
                self._cprof, self._cprof_on = prof, True

    def _end(self) -> None:
        if self.state != "recording":
            return
        self.state = "recorded"
        end_ns = time.monotonic_ns()
        self.recorded_s = (round((self._began_ns - self._t0) / 1e9, 3), round((end_ns - self._t0) / 1e9, 3))
        self._stop_cprof()
        if self.driver is not None and self.traced:
            self.driver.stop_time_window()

    def _stop_cprof(self) -> None:
        if not self._cprof_on or self._cprof is None:
            return
        if not profslot.shares_slot_with(self._signal.main):
            # up to 3.11 only the main thread can disable what it enabled (the loop's first step written on
            # another thread): the main thread is signalled to, and the profile kept for that
            if self._signal.sig is not None:
                self._pending = "cprof"
                self._signal.send()
            return
        self._cprof_on = False
        try:
            if profslot.disable_own(self._cprof):
                self.cprofile_note = "stopped early: another profiler replaced it (sys.setprofile)"
        except Exception:
            self._cprof = None

    def yield_to_script(self, what: str) -> None:
        """The script starts a profiler of its own (``what``): the window's cProfile stops (what it
        recorded is kept) so that the script's can run (``profslot``)."""
        if self._cprof_on and profslot.shares_slot_with(self._signal.main):
            self._stop_cprof()
            self.cprofile_note = f"stopped early: {what}; Python runs one profiler at a time"

    def give_way(self) -> None:
        """The first step was written: the run has steps, the window's data are dropped."""
        self._stop.set()
        if self.state == "recording":
            self._end()
        if self.state == "recorded":
            self.state = "dropped"
            if not self._cprof_on:  # (still enabled: the main thread was signalled to disable it)
                self._cprof = None
            self.recorded_s = None
            if self.driver is not None:
                self.driver.drop_time_window()

    def finish(self, steps_seen: int) -> None:
        """The script is over: write what the window recorded when the run has no steps."""
        self._stop.set()
        if self.state == "recording":
            self._end()  # cut short by the end of the script
        if steps_seen:
            self.give_way()
        elif self.state == "recorded":
            if self.driver is not None and self.traced and not self.driver.export_time_window():
                self.traced = False
            if self._cprof is not None:
                try:
                    self._cprof.snapshot_stats()  # dump_stats() without its disable(), which could clear another profiler
                    write_bytes_atomic(self.pstats_path, marshal.dumps(self._cprof.stats))
                    self.pstats_written = True
                except OSError as err:
                    self.reason = f"its cProfile could not be written: {err.strerror or err}"
        elif self.state == "armed" and not self.reason:
            self.reason = f"the script ended before second {self.start_s:g}, when the window would have opened"
        self._signal.restore()

    def in_child_after_fork(self) -> None:
        self._stop.set()
        if self._cprof_on and self._cprof is not None:
            self._cprof_on = False
            try:
                profslot.disable_own(self._cprof)  # a forked worker inherits the profiler of the thread that forked
            except Exception:
                pass
        self._cprof = None
        self.state = "off"
