"""cProfile of the DataLoader's own work in the training process (``loader.pstats``), for GD201.

GD201 names the loading code's hot functions when the loading computes more than the cores
can hide. cProfile's statistics keep one total per function and per caller, not per call
stack: code shared by the loading and the model (``nn.Module.__call__`` runs a transform such as
torchvision's ``Normalize`` and the model's layers alike) cannot be told apart afterwards, and
shares spread along caller edges from the fetch reached the model's forward (on pytorch/examples'
mnist, GD201 named ``torch.conv2d``, ``torch.dropout`` and ``main.py:20(forward)``).

So the loading is profiled apart as it runs. While the cProfile window (``steps.CprofileWindow``)
runs on the loop's thread, each call of a DataLoader iterator's ``__next__`` (``patches``) runs
with the window's profiler disabled and this one enabled, and the other way round after it:
everything this profile holds ran inside ``__next__`` (the sampler, the dataset's ``__getitem__``,
the ``collate_fn``, with ``num_workers > 0`` the wait for a worker's batch), and nothing of the
model. The two files together are the process's profile (``parse.rundir.read_pstats`` adds them
up). A window that starts over (a more specific marker took over) starts this one over too.

Written atomically as the window closes (``CprofileWindow.on_stop``: in the boundary's bookkeeping,
which no step's time includes; on Python 3.12 the write took 67 ms, which as part of the next batch's
wait read as a DataLoader stall), else when the next batch is asked for (the window closed during a
batch), and when the run ends; a process killed outright loses it, and the run is read without it.
"""

from __future__ import annotations

import cProfile
import marshal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudoctor.collect import profslot
from gpudoctor.collect.rundir import os_reason, write_bytes_atomic
from gpudoctor.collect.steps.cprofile_window import WINDOW


class LoaderProfile:
    def __init__(self, window: Any, path: Path) -> None:
        self.window = window  # steps.CprofileWindow: its profiler, whether it runs, on which thread
        self.path = path
        self.profiler: cProfile.Profile | None = None
        self._main: Any = None  # the window's profiler this one goes with (a new one: the window started over)
        self._inside = False  # a __next__ in progress under this profiler (a DataLoader inside a dataset)
        self.dirty = False  # recorded since last written
        self.written = False
        self.error = ""  # why it stopped (its profiler could not start, or its file could not be written)
        self.gave_way = ""  # it stopped for the script's own profiler: at which step and why (profslot)
        window.on_stop = self.write

    def call(self, fn: Callable[[Any], Any], it: Any) -> Any:
        """``fn(it)``: an iterator's ``__next__``, under this profile while the window runs on this thread."""
        w = self.window
        main = w.profiler
        # w.on: a step of the window is in progress, its profiler enabled (a batch asked for between two of
        # its steps, as at an epoch's end, runs unprofiled: re-enabling the window's profiler after it would
        # leave it enabled while the window thinks it paused)
        if (self._inside or self.error or self.gave_way or not w.running or not w.on or main is None
                or w.thread_id != threading.get_ident()):
            if self.dirty and not w.running:
                self.write()
            return fn(it)
        if main is not self._main:  # the first batch of a window, or of one started over: record afresh
            self._main = main
            self.profiler = profslot.OwnProfile()  # gpudoctor's own: the watch of the script's profilers lets it be
            self.dirty = self.written = False
        prof = self.profiler
        assert prof is not None
        if profslot.disable_own(main):  # the script's profiler replaced the window's (up to 3.11): leave both
            return fn(it)
        why = profslot.enable_own(prof, "the DataLoader's cProfile")
        if why:  # another profiler holds the slot (Python's one profiler at a time)
            self.error = f"the DataLoader's cProfile could not start: {why}"
            profslot.enable_own(main, WINDOW)
            return fn(it)
        self._inside = True
        try:
            return fn(it)
        finally:
            profslot.disable_own(prof)
            self._inside = False
            self.dirty = True
            if w.running and w.on and w.profiler is main:  # (a StopAfterSteps, an error or a give-way ended the window)
                profslot.enable_own(main, WINDOW)

    def yield_to_script(self, what: str) -> None:
        """The script starts a profiler of its own (``what``) inside a batch this profile records (a
        ``collate_fn``'s or a ``Dataset``'s cProfile): it stops, what it recorded is kept (``profslot``)."""
        prof = self.profiler
        if not self._inside or prof is None or self.gave_way or not profslot.shares_slot_with(self.window.thread_id):
            return
        profslot.disable_own(prof)
        self.gave_way = f"stopped at step {self.window.at}: {what}"

    def write(self) -> None:
        """Write what was recorded (``marshal``, as ``pstats`` reads it); a no-op when nothing new was."""
        prof = self.profiler
        if prof is None or not self.dirty or self._inside:
            return
        self.dirty = False
        try:
            prof.create_stats()
            data = marshal.dumps(prof.stats)  # type: ignore[attr-defined]
            write_bytes_atomic(self.path, data)
            self.written = True
        except OSError as err:
            self.error = f"the DataLoader's cProfile could not be written: {os_reason(err)}"
        except Exception as err:
            self.error = f"the DataLoader's cProfile could not be written: {type(err).__name__}: {err}"

    def in_child_after_fork(self) -> None:
        self.profiler = None
        self._main = None
        self.dirty = False
        self.error = "a forked process"
