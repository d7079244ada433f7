"""GPU time per step from CUDA events, read back without a synchronization."""

from __future__ import annotations

import time
from collections import deque
from typing import Any


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


class _CudaInitialized:
    """``torch.cuda._initialized`` for a torch without that flag."""

    def __init__(self, cuda_mod: Any) -> None:
        self._cuda = cuda_mod

    @property
    def _initialized(self) -> bool:
        return bool(self._cuda.is_initialized())
