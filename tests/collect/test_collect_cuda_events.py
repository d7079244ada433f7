"""The CUDA event pool of the step timer (collect.steps.cuda), against a fake CUDA module that counts
every event created and every call made on one."""

from __future__ import annotations

import types

import pytest

from gpudoctor.collect.steps import CudaStepTimer


class _FakeGpu:
    """A device that runs a queue of steps: ``record`` stamps an event with the device time its
    work so far ends at; an event completes once the device has run that far (``now_ms``)."""

    def __init__(self) -> None:
        self.queued_ms = 0.0  # device time at which the work enqueued so far ends
        self.now_ms = 0.0  # how far the device has run
        self.created = self.records = self.queries = self.elapsed = 0
        self.capturing = False

    def event(self, enable_timing: bool = False) -> _FakeEvent:
        assert enable_timing
        self.created += 1
        return _FakeEvent(self)

    def torch(self) -> types.SimpleNamespace:
        cuda = types.SimpleNamespace(is_initialized=lambda: True, Event=self.event,
                                     is_current_stream_capturing=lambda: self.capturing)
        return types.SimpleNamespace(cuda=cuda)


class _FakeEvent:
    def __init__(self, gpu: _FakeGpu) -> None:
        self.gpu = gpu
        self.t_ms: float | None = None

    def record(self) -> None:
        self.gpu.records += 1
        self.t_ms = self.gpu.queued_ms

    def query(self) -> bool:
        self.gpu.queries += 1
        assert self.t_ms is not None
        return self.gpu.now_ms >= self.t_ms

    def elapsed_time(self, end: _FakeEvent) -> float:
        self.gpu.elapsed += 1
        assert self.t_ms is not None and end.t_ms is not None
        assert self.gpu.now_ms >= max(self.t_ms, end.t_ms), "elapsed_time on an event that has not completed"
        return end.t_ms - self.t_ms


def _run(steps: int, lag_steps: int, max_lag: int = 64) -> tuple[_FakeGpu, CudaStepTimer, dict[int, int | None], list[float]]:
    """``steps`` steps of varied length; the device runs ``lag_steps`` steps behind the host."""
    gpu = _FakeGpu()
    timer = CudaStepTimer(gpu.torch(), max_lag=max_lag)
    durations_ms = [1.0 + (i % 7) * 0.25 for i in range(steps)]
    ends_ms: list[float] = []
    got: dict[int, int | None] = {}
    timer.boundary(None)
    for i, d in enumerate(durations_ms):
        gpu.queued_ms += d
        ends_ms.append(gpu.queued_ms)
        if i >= lag_steps:
            gpu.now_ms = ends_ms[i - lag_steps]
        timer.boundary(i)
        got.update(timer.ready())
    gpu.now_ms = gpu.queued_ms  # the device catches up at the end
    got.update(timer.drain(timeout_s=1.0))
    return gpu, timer, got, durations_ms


@pytest.mark.parametrize("lag_steps", [0, 1, 10, 40])
def test_events_are_reused_and_every_step_keeps_its_gpu_time(lag_steps):
    gpu, timer, got, durations_ms = _run(1000, lag_steps)
    assert sorted(got) == list(range(1000))
    assert [got[i] for i in range(1000)] == [int(d * 1e6) for d in durations_ms]
    assert timer.timed == 1000
    # bounded: what is in flight at once (the lag, its two ends), never one event per step
    assert gpu.created == timer.created <= lag_steps + 3
    assert gpu.records == 1001 and gpu.elapsed == 1000
    assert gpu.queries >= 1000


def test_a_gpu_far_behind_gives_up_on_steps_and_the_pool_stays_bounded():
    gpu, timer, got, _ = _run(1000, lag_steps=20, max_lag=8)
    assert sorted(got) == list(range(1000))
    given_up = [i for i, ns in got.items() if ns is None]
    assert given_up  # the device lags 20 steps, the timer waits for 8
    # an event given up on is not recorded again (it may not have completed): a new one is made;
    # yet far from one per step, and the free pool never holds more than max_lag + 2
    assert gpu.created <= len(given_up) + 8 + 3
    assert len(timer._free) <= timer.pool_size == 10


def test_a_restart_or_a_graph_capture_recycles_nothing_still_needed():
    gpu = _FakeGpu()
    timer = CudaStepTimer(gpu.torch(), max_lag=4)
    timer.boundary(None)
    gpu.queued_ms += 2.0
    assert timer.boundary(0)
    timer.restart()  # between epochs: no step in progress, step 0 still waits for its events
    gpu.capturing = True
    assert not timer.boundary(1)  # inside a capture: no event
    gpu.capturing = False
    timer.boundary(None)
    gpu.queued_ms += 3.0
    assert timer.boundary(2)
    gpu.now_ms = gpu.queued_ms
    assert timer.ready() == [(0, 2_000_000), (2, 3_000_000)]
    assert gpu.created == 4 and len(timer._free) == 3  # the fourth starts the step in progress
    for i in range(3, 50):
        gpu.queued_ms += 1.0
        timer.boundary(i)
        gpu.now_ms = gpu.queued_ms
        assert timer.ready() == [(i, 1_000_000)]
    assert gpu.created == 4  # every event since came from the pool
