"""``--steps N``: the exception that stops the script cleanly after N steps, and its path of its own.

While step tracking runs, the tracker stops the script at the boundary that ends step N-1
(``StepTracker._close``; the fast path is planned to end before it). Should step tracking stop
(an error in gpudoctor's bookkeeping, whatever it is), ``--steps`` must still hold: the tracker
hands the count to a :class:`StepLimit`, and the hooks, which then pass every call straight to
torch, tell it of each call of the marker that was in force (an optimizer step of the optimizer
that marked the steps, a ``backward()``, a call of the root module, a batch asked for). It keeps
one count and one comparison, nothing of the tracker's state, so that nothing that broke the
tracker can break it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class StopAfterSteps(SystemExit):
    """Raised at the step boundary after ``--steps N``; the script unwinds and exits 0."""

    def __init__(self, steps: int) -> None:
        super().__init__(0)
        self.steps = steps


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
            raise StopAfterSteps(self.done)

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
