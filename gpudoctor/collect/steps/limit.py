"""``--steps N``: the exception that stops the script cleanly after N steps, and its path of its own.

While step tracking runs, the tracker stops the script at the boundary that ends step N-1
(``StepTracker._close``; the fast path is planned to end before it). Should step tracking stop
(an error in gpudoctor's bookkeeping, whatever it is), ``--steps`` must still hold: the tracker
hands the count to a :class:`StepLimit`, and the hooks, which then pass every call straight to
torch, tell it of each call of the marker that was in force (an optimizer step of the optimizer
that marked the steps, a ``backward()``, a call of the root module, a batch asked for). It keeps
one count and one comparison, nothing of the tracker's state, so that nothing that broke the
tracker can break it.

The same count goes on once the stop was raised (``StepTracker._stop``): a loop that swallows it (a bare
``except:``, ``contextlib.suppress(BaseException)``, a ``finally:`` that continues) is stopped again at each
later boundary, and the run says how many steps the script ran after all (``child``). The stop is raised
only on the main thread, where the script runs (:class:`MainStop`): a boundary reached on another thread (each
step on a short-lived thread) signals the main thread, whose handler raises it there, so that no thread of
the script's prints gpudoctor's traceback and the script's loop, not one of its threads, stops.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gpudoctor.collect.mainsignal import MainSignal


class StopAfterSteps(SystemExit):
    """Raised at the step boundary after ``--steps N``; the script unwinds and exits 0."""

    def __init__(self, steps: int) -> None:
        super().__init__(0)
        self.steps = steps


class MainStop:
    """Raises :class:`StopAfterSteps` on the main thread, from whichever thread the boundary was reached on."""

    def __init__(self) -> None:
        self.raised = 0  # stops raised into the script (or sent to its main thread)
        self.unsent = ""  # why a stop reached on another thread could not be sent to the main thread
        self._signal = MainSignal()
        self._pending = 0

    def arm(self, sig: int | None) -> None:
        """On the main thread, before the script runs: ``sig`` (a real-time signal no one handles) carries a
        stop reached on another thread to the main thread (:class:`~gpudoctor.collect.mainsignal.MainSignal`)."""
        why = self._signal.install(sig, self._on_signal, "stop the main thread with")
        if why:
            self.unsent = why

    def disarm(self) -> None:
        self._signal.restore()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._pending:
            steps, self._pending = self._pending, 0
            raise StopAfterSteps(steps)

    def stop(self, steps: int) -> None:
        """Stop the script after ``steps`` steps: raise here on the main thread, else send it there (and return)."""
        self.raised += 1
        if threading.get_ident() == self._signal.main:
            raise StopAfterSteps(steps) from None  # (not chained to an error of gpudoctor's being handled)
        if self._signal.sig is None:
            self.unsent = self.unsent or "the main thread could not be signalled"
            return
        self._pending = steps
        why = self._signal.send()
        if why:
            self.unsent = why

    def account(self, max_steps: int, ran: int, stop_steps: int | None) -> tuple[str, str]:
        """What ``--steps max_steps`` did, once the script ended after ``ran`` steps (``stop_steps``: the count of
        the stop that ended it, None when none did): the status's words, and, where the script caught the stop
        and stepped on, that in words ("" where it stopped at ``max_steps``)."""
        n = max_steps
        if ran <= n:
            return f"stopped after {ran} steps", ""
        caught = max(self.raised - (stop_steps is not None), 1)
        why = (f"it caught gpudoctor's stop {caught} time{'s' if caught != 1 else ''} (a SystemExit, raised at each "
               f"step boundary from step {n} on: a bare except:, except BaseException, contextlib.suppress(BaseException) "
               "or a finally: that continues catches it)")
        unsent = f"; {self.unsent}" if self.unsent else ""
        if stop_steps is not None:
            return f"stopped after {ran} steps (--steps {n}: {why})", f"--steps {n} stopped the script only after {ran} steps: {why}{unsent}"
        swallowed = f"--steps {n} could not stop the script, which ran {ran} steps: {why}{unsent}"
        return swallowed, swallowed


stopper = MainStop()  # the run's (one script, one main thread)


class StepLimit:
    """Counts the steps after step tracking stopped, and stops the script after ``max_steps``.

    ``marker``: the marker in force (``optimizer``, ``backward``, ``module``, ``dataloader``);
    ``key``: which optimizer or root module marks the steps (its ``id()``, None: any); ``done``:
    the steps completed when tracking stopped; ``thread``: the loop's thread (calls on others mark
    nothing, as for the tracker); ``step_open``: a step was in progress when tracking stopped.
    """

    __slots__ = ("max_steps", "marker", "key", "done", "thread", "batch_out")

    def __init__(self, max_steps: int, marker: str, key: int | None, done: int, thread: int | None,
                 step_open: bool = False) -> None:
        self.max_steps = max_steps
        self.marker = marker
        self.key = key
        self.done = done
        self.thread = thread
        # dataloader: a step is in progress (a batch was asked for and not at an epoch's end), so the next
        # request ends it
        self.batch_out = step_open

    def mark(self, marker: str, key: int | None = None) -> None:
        """A call of ``marker`` (of ``key``) returned: a step ended if it is the marker in force."""
        if marker != self.marker or (self.key is not None and key != self.key):
            return
        if self.thread is not None and threading.get_ident() != self.thread:
            return
        self.done += 1
        if self.done >= self.max_steps:
            stopper.stop(self.done)

    def batch_asked(self) -> None:
        """``dataloader``: a batch is asked for; it ends the step of the batch before it."""
        if self.marker != "dataloader" or (self.thread is not None and threading.get_ident() != self.thread):
            return
        if self.batch_out:
            self.batch_out = False
            self.mark("dataloader")

    def batch_returned(self) -> None:
        if self.marker == "dataloader" and (self.thread is None or threading.get_ident() == self.thread):
            self.batch_out = True


def limited_call(limit: StepLimit | None, depth: list[int], call: Callable[[], Any], marker: str,
                 key: int | None = None) -> Any:
    """A hook's path once step tracking stopped: ``call()`` (the original function) runs as it is,
    and when it returns, the limit counts it as a call of ``marker`` (of ``key``); a call inside one
    of the same hook's (``depth``: a backward() inside a backward(), an optimizer's inner optimizer)
    marks nothing."""
    if limit is None or depth[0]:
        return call()
    depth[0] = 1
    try:
        out = call()
    finally:
        depth[0] = 0
    limit.mark(marker, key)
    return out
