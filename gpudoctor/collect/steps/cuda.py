"""GPU time per step from CUDA events, read back without a synchronization."""

from __future__ import annotations

import time
from collections import deque
from typing import Any


class _Slot:
    """One CUDA event and who still needs it: the step in progress (its start) and the steps
    waiting to be read (their start and end). ``read``: its timing was read, so it has completed."""

    __slots__ = ("event", "refs", "read")

    def __init__(self, event: Any) -> None:
        self.event = event
        self.refs = 0
        self.read = False


class CudaStepTimer:
    """GPU time per step from one CUDA event per step boundary, read back without syncs.

    An event is recorded on the current stream at each boundary; the time between two
    consecutive events is the device-side duration of the step (idle gaps included).
    Events are read with ``query()`` when they have completed; a step's record waits
    for its event (at most ``max_lag`` steps, then it is written without GPU time).

    Events come from a small pool instead of one ``torch.cuda.Event`` per step (an event's
    creation is a driver call and a Python object each step): an event goes back to the pool
    once nothing needs it and its timing was read (it completed); one given up on (over-lagged,
    a step without GPU time) is left to the garbage collector. The pool holds at most
    ``pool_size`` events (``max_lag + 2``: what a run whose GPU lags by up to ``max_lag`` steps
    has in flight), so a loop that keeps up creates three events in all.
    """

    def __init__(self, torch: Any, max_lag: int = 64, pool_size: int | None = None) -> None:
        self.torch = torch
        self.max_lag = max_lag
        self.pool_size = max_lag + 2 if pool_size is None else max(0, pool_size)
        self._prev: _Slot | None = None  # event at the start of the step in progress
        self._pending: deque[tuple[int, _Slot, _Slot]] = deque()
        self._free: list[_Slot] = []  # events read and not needed any more: recorded again at a boundary
        self.created = 0  # events created in the run (the pool's measure)
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
            self.restart()
            return False
        try:
            if self.torch.cuda.is_current_stream_capturing():
                # inside a CUDA graph capture an event would become part of the graph
                self.restart()
                return False
        except Exception:
            pass
        try:
            slot = self._take()
            slot.event.record()
        except Exception as err:  # a broken CUDA context: stop timing, never fail the script
            self.error = f"CUDA events failed: {type(err).__name__}: {err}"
            self.restart()
            return False
        prev = self._prev
        queued = ended_index is not None and prev is not None
        if queued:
            prev.refs += 1
            slot.refs += 1
            self._pending.append((ended_index, prev, slot))
        slot.refs += 1  # the start of the next step
        self._prev = slot
        if prev is not None:
            self._drop(prev)
        return queued

    def restart(self) -> None:
        """No step in progress (DataLoader mode between epochs): the next boundary opens one."""
        if self._prev is not None:
            self._drop(self._prev)
            self._prev = None

    def _take(self) -> _Slot:
        if self._free:
            return self._free.pop()
        slot = _Slot(self.torch.cuda.Event(enable_timing=True))
        self.created += 1
        return slot

    def _drop(self, slot: _Slot) -> None:
        slot.refs -= 1
        if slot.refs == 0 and slot.read and len(self._free) < self.pool_size:
            slot.read = False
            self._free.append(slot)

    def ready(self) -> list[tuple[int, int | None]]:
        """(index, gpu_ns) of steps whose events completed, in order; over-lagged ones with None."""
        out: list[tuple[int, int | None]] = []
        while self._pending:
            idx, start, end = self._pending[0]
            try:
                done = end.event.query()
            except Exception as err:
                self.error = f"CUDA events failed: {type(err).__name__}: {err}"
                done = False
            if done:
                self._pending.popleft()
                out.append((idx, int(start.event.elapsed_time(end.event) * 1e6)))
                start.read = end.read = True  # elapsed_time needs both completed
                self.timed += 1
            elif self.error or len(self._pending) > self.max_lag:
                self._pending.popleft()
                out.append((idx, None))
            else:
                break
            self._drop(start)
            self._drop(end)
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


class _CudaInitialized:
    """``torch.cuda._initialized`` for a torch without that flag."""

    def __init__(self, cuda_mod: Any) -> None:
        self._cuda = cuda_mod

    @property
    def _initialized(self) -> bool:
        return bool(self._cuda.is_initialized())
