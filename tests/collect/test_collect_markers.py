"""The step-marker cascade of ``StepTracker`` driven by hand (no torch): which marker wins,
how step 0 is split, gradient accumulation, phases, a marker that takes over mid-run, and
the time-based window's life cycle."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from gpudoctor.collect import profslot
from gpudoctor.collect import schedule as sched
from gpudoctor.collect.steps import (
    DEFER_WHILE_OPTIMIZER_IDLE,
    N_BWD,
    CprofileWindow,
    StepTracker,
    StopAfterSteps,
)
from gpudoctor.collect.timewindow import TimeWindow
from gpudoctor.model import StepRecord

MODEL, PROBE = 1001, 1002  # module identities (id() of the root module, of a submodule probed alone)


class _Cuda:
    @staticmethod
    def is_initialized() -> bool:
        return False


class _Torch:
    cuda = _Cuda()


class _Writer:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def write_text(self, text: str) -> None:
        self.rows.extend(json.loads(line) for line in text.splitlines())

    def flush(self) -> None:
        pass


class _Profiler:
    """Records what the tracker asks of torch.profiler."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.rebased: list[int] = []

    def on_step_start(self, step: int) -> str:
        self.started.append(step)
        return ""

    def on_step_end(self, step: int) -> None:
        pass

    def rebase(self, origin: int) -> None:
        self.rebased.append(origin)

    def discard_step(self) -> None:
        pass

    def idle_until(self) -> int:
        return 0  # called at every step: the tracker's slow path


def test_fast_boundaries_write_what_the_slow_path_writes(tmp_path):
    """Without an instrument due, boundaries skip the instruments: the rows are the same."""
    runs = []
    for profiler in (_Profiler(), None):
        t, w, _ = _tracker(tmp_path)
        t.profiler = profiler
        opt = object.__new__(type("SGD", (), {}))
        t.optimizer_created()
        for _ in range(6):
            _batch(t)
            _forward(t)
            _backward(t)
            _optimizer_step(t, opt)
        runs.append([{k: v for k, v in r.items() if not k.endswith("_ns") or k in ("forward_ns", "optimizer_ns")}
                     | {"phases": all(r[k] > 0 for k in ("forward_ns", "backward_ns", "optimizer_ns"))}
                     for r in (json.loads(json.dumps(x)) for x in _finish_rows(t, w))])
    slow, fast = runs
    for rows in runs:
        for r in rows:
            r.pop("forward_ns"), r.pop("optimizer_ns"), r.pop("user_cpu_ns", None), r.pop("sys_cpu_ns", None)
            r.pop("minor_faults", None), r.pop("major_faults", None), r.pop("cpu_steps")
    assert slow == fast and len(fast) == 6 and all(r["phases"] for r in fast)


def test_short_steps_share_a_cpu_reading_that_covers_them_all(tmp_path):
    """getrusage is read at most every ``rusage_every_ns`` on the fast path; the row that reads it
    covers the steps before it that carry no figures; a slow boundary always reads."""
    for every, expect in ((0, [1, 1, 1, 1, 1, 1, 1]), (1 << 60, [1, None, None, None, None, None, 6])):
        t, w, _ = _tracker(tmp_path)
        t.profiler = None
        t.rusage_every_ns = every
        opt = object.__new__(type("SGD", (), {}))
        t.optimizer_created()
        for i in range(7):
            if i == 6:
                t.max_steps = 7  # the last boundary takes the slow path (--steps is due)
                t._plan_fast()
            _batch(t)
            _forward(t)
            _backward(t)
            try:
                _optimizer_step(t, opt)
            except SystemExit:
                pass
        rows = _finish(t, w)
        assert [r.cpu_steps for r in rows] == expect
        assert all((r.cpu_steps is None) == (r.user_cpu_ns is None) == (r.minor_faults is None) for r in rows)


def _finish_rows(t: StepTracker, w: _Writer) -> list[dict]:
    t.finish()
    return w.rows


def _tracker(tmp_path: Path, max_steps: int | None = None) -> tuple[StepTracker, _Writer, _Profiler]:
    w, prof = _Writer(), _Profiler()
    cprof = CprofileWindow(False, 0, 0, sched.CprofileBudget(), tmp_path / "p.pstats")
    t = StepTracker(_Torch(), w, 0, None, max_steps, prof, cprof)
    t.write_every_ns = 0
    t.forward_watched = True
    return t, w, prof


def _forward(t: StepTracker, key: int = MODEL, grad: bool = True, ok: bool = True) -> None:
    t.forward_enter()
    t.forward_exit(ok, key, grad)


def _backward(t: StepTracker, ok: bool = True) -> None:
    t.backward_enter()
    t.backward_exit(ok)


def _optimizer_step(t: StepTracker, opt: object) -> None:
    t.optimizer_enter()
    t.on_optimizer_step(opt)
    t.optimizer_exit()
    t.flush(from_step_return=True)


def _batch(t: StepTracker, epoch: int = 0) -> None:
    entered = t.dataloader_next_enter()
    t.dataloader_next_exit(entered, False, epoch)


def _finish(t: StepTracker, w: _Writer) -> list[StepRecord]:
    t.finish()
    return [StepRecord.from_dict(r) for r in w.rows]


def test_optimizer_marks_from_its_first_step(tmp_path):
    t, w, _ = _tracker(tmp_path)
    opt = object.__new__(type("AdamW", (), {}))
    t.optimizer_created()
    for _ in range(5):
        _batch(t)
        _forward(t)
        _backward(t)
        _optimizer_step(t, opt)
    rows = _finish(t, w)
    assert [r.index for r in rows] == [0, 1, 2, 3, 4] and {r.marker for r in rows} == {"optimizer"}
    assert all(r.micro_batches == 1 and r.batches == 1 for r in rows)
    source, why, markers = t.describe()
    assert source == "optimizer" and why == "AdamW.step() ends each step"
    assert markers == [{"marker": "optimizer", "first_step": 0, "detail": "AdamW"}]


def test_manual_updates_are_marked_by_backward_one_step_per_iteration(tmp_path):
    """No optimizer: backward() is established at its second call and step 0 split at the
    first, so the steps are the iterations."""
    t, w, prof = _tracker(tmp_path)
    for _ in range(6):
        _forward(t)
        _backward(t)
        time.sleep(0.001)  # the hand-written update: the loop's own work
    rows = _finish(t, w)
    assert [r.index for r in rows] == list(range(6)) and {r.marker for r in rows} == {"backward"}
    assert all(r.micro_batches == 1 and r.forward_ns > 0 and r.backward_ns > 0 for r in rows)
    assert all(r.other_ns() >= 900_000 for r in rows[1:])  # the update falls in the next step
    for a, b in zip(rows, rows[1:], strict=False):  # contiguous, the split included
        assert b.start_ns >= a.start_ns + a.wall_ns
    assert prof.started[0] == 2 and 0 not in prof.started  # provisional steps run without instruments
    source, why, _ = t.describe()
    assert source == "backward" and why.endswith("no optimizer object")


def test_evaluation_is_marked_by_the_root_module_not_a_shape_probe(tmp_path):
    t, w, _ = _tracker(tmp_path)
    _forward(t, PROBE, grad=False)  # a submodule called alone in __init__, once
    for _ in range(5):
        _batch(t)
        _forward(t, MODEL)
    rows = _finish(t, w)
    assert len(rows) == 5 and {r.marker for r in rows} == {"module"}
    assert [r.batches for r in rows] == [1] * 5
    t.adopt_root(MODEL, "Net")  # what RootModuleWatch does at the model's second call
    assert (t.root_calls, t.root_grad_calls) == (5, 5)  # the probe is not the root
    assert t.describe()[0] == "module"


def test_dataloader_marks_only_when_nothing_more_specific_runs(tmp_path):
    t, w, _ = _tracker(tmp_path)
    for _ in range(4):
        _batch(t)
    rows = _finish(t, w)
    assert [r.marker for r in rows] == ["dataloader"] * 3  # from one batch asked for to the next
    t2, w2, _ = _tracker(tmp_path)
    for _ in range(4):
        _batch(t2)
        _forward(t2)
    assert t2.source == "module" and len(_finish(t2, w2)) == 4


def test_gradient_accumulation_counts_micro_batches_per_optimizer_step(tmp_path):
    """An optimizer exists but steps only every 4 backward() calls: backward waits for it."""
    t, w, _ = _tracker(tmp_path)
    opt = object.__new__(type("SGD", (), {}))
    t.optimizer_created()
    for i in range(12):
        _batch(t)
        _forward(t)
        _backward(t)
        if i % 4 == 3:
            _optimizer_step(t, opt)
    rows = _finish(t, w)
    assert [(r.marker, r.micro_batches, r.batches) for r in rows] == [("optimizer", 4, 4)] * 3
    assert "gradient accumulation: 4 micro-batches" in t.describe()[1]


def test_an_optimizer_that_never_steps_gives_way_after_a_while(tmp_path):
    t, w, _ = _tracker(tmp_path)
    t.optimizer_created()
    for _ in range(DEFER_WHILE_OPTIMIZER_IDLE + 5):
        _forward(t)
        _backward(t)
    rows = _finish(t, w)
    # step 0 holds the iterations it waited for the optimizer, then one step per backward()
    assert t.source == "backward" and [r.micro_batches for r in rows] == [DEFER_WHILE_OPTIMIZER_IDLE - 1] + [1] * 6
    assert "an optimizer object exists but never stepped" in t.describe()[1]


class _IdleProfiler(_Profiler):
    def idle_until(self) -> int:
        return 10**6  # nothing due for a long while: the tracker's fast path


@pytest.mark.parametrize("profiler", [_Profiler, _IdleProfiler])
def test_a_more_specific_marker_takes_over_and_the_instruments_start_over(tmp_path, profiler):
    t, w, _ = _tracker(tmp_path)
    t.profiler = prof = profiler()
    for _ in range(8):  # an evaluation pass first
        _forward(t, grad=False)
    opt = object.__new__(type("SGD", (), {}))
    t.optimizer_created()
    for _ in range(5):
        _forward(t)
        _backward(t)
        _optimizer_step(t, opt)
    rows = _finish(t, w)
    markers = [r.marker for r in rows]
    first_opt = markers.index("optimizer")
    assert markers[:first_opt] == ["module"] * first_opt and markers[first_opt:] == ["optimizer"] * (len(rows) - first_opt)
    assert prof.rebased == [first_opt + 1]  # the schedule counts from the first whole optimizer step
    assert [m["marker"] for m in t.describe()[2]] == ["module", "optimizer"]
    assert "before it: the root module's forward from step 0" in t.describe()[1]


def test_phases_are_exclusive(tmp_path):
    """A backward() inside optimizer.step() (LBFGS' closure) is backward's, not the optimizer's."""
    t, w, _ = _tracker(tmp_path)
    opt = object.__new__(type("LBFGS", (), {}))
    t.optimizer_created()
    for _ in range(3):
        t.optimizer_enter()
        time.sleep(0.002)
        _forward(t)
        t.backward_enter()
        time.sleep(0.03)
        t.backward_exit(True)
        t.on_optimizer_step(opt)
        t.optimizer_exit()
        t.flush(from_step_return=True)
    rows = _finish(t, w)
    r = rows[-1]
    # had the optimizer's time included the backward inside it, it would be over 32 ms
    assert r.backward_ns >= 30_000_000 and 2_000_000 <= r.optimizer_ns < 30_000_000
    assert r.forward_ns + r.backward_ns + r.optimizer_ns <= r.wall_ns


def test_a_batch_asked_for_inside_the_forward_is_data_wait_not_forward(tmp_path):
    """Every phase is exclusive of the others, data wait included (a model that pulls its own batch)."""
    t, w, _ = _tracker(tmp_path)
    opt = object.__new__(type("SGD", (), {}))
    t.optimizer_created()
    for _ in range(3):
        t.forward_enter()
        time.sleep(0.002)
        entered = t.dataloader_next_enter()
        time.sleep(0.03)
        t.dataloader_next_exit(entered, False, 0)
        t.forward_exit(True, MODEL, True)
        _optimizer_step(t, opt)
    r = _finish(t, w)[-1]
    assert r.data_wait_ns >= 30_000_000 and 2_000_000 <= r.forward_ns < 30_000_000
    assert r.data_wait_ns + r.forward_ns + r.optimizer_ns <= r.wall_ns


def test_a_call_that_raises_inside_a_marked_region_ends_no_step(tmp_path):
    t, w, _ = _tracker(tmp_path)
    for _ in range(3):
        _forward(t)
        _backward(t)
    _forward(t)
    _backward(t, ok=False)  # the script's backward raised: no boundary
    rows = _finish(t, w)
    assert len(rows) == 3 and t.acc[N_BWD] == 0  # the step in progress is not written


def test_a_one_iteration_script_still_has_its_step(tmp_path):
    t, w, _ = _tracker(tmp_path)
    _forward(t)
    _backward(t)
    rows = _finish(t, w)
    assert [(r.index, r.marker) for r in rows] == [(0, "backward")]


def test_steps_limit_counts_the_split_steps(tmp_path):
    t, w, _ = _tracker(tmp_path, max_steps=1)
    _forward(t)
    _backward(t)
    _forward(t)
    with pytest.raises(StopAfterSteps):
        _backward(t)
    assert len(_finish(t, w)) == 1


# --------------------------------------------------------------------------- the time window


class _Driver:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def start_time_window(self) -> bool:
        self.calls.append("start")
        return True

    def stop_time_window(self) -> None:
        self.calls.append("stop")

    def drop_time_window(self) -> None:
        self.calls.append("drop")

    def export_time_window(self) -> str:
        self.calls.append("export")
        return "trace"


def _busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))  # Python on the main thread: the signal's handler runs between bytecodes


def test_time_window_records_a_run_without_steps(tmp_path):
    t, _, _ = _tracker(tmp_path)
    driver = _Driver()
    tw = TimeWindow(t, driver, tmp_path / "profile.pstats", 0.05, 0.25, cprofile=True)
    tw.arm(time.monotonic_ns())
    _busy(0.6)
    tw.finish(steps_seen=0)
    assert driver.calls == ["start", "stop", "export"], tw.reason
    assert tw.recorded_s is not None and 0.05 <= tw.recorded_s[0] < tw.recorded_s[1]
    assert tw.pstats_written and (tmp_path / "profile.pstats").stat().st_size > 0


def test_time_window_gives_way_to_steps(tmp_path):
    t, _, _ = _tracker(tmp_path)
    driver = _Driver()
    tw = TimeWindow(t, driver, tmp_path / "profile.pstats", 0.05, 5.0, cprofile=True)
    t.on_first_step = tw.give_way
    tw.arm(time.monotonic_ns())
    _busy(0.3)  # the window opens …
    for _ in range(3):  # … then a loop starts: its first step ends the window, which is dropped
        _forward(t)
        _backward(t)
    tw.finish(steps_seen=t.steps_seen)
    assert driver.calls == ["start", "stop", "drop"]
    assert tw.recorded_s is None and not (tmp_path / "profile.pstats").exists()


def test_time_window_off_and_too_short(tmp_path):
    t, _, _ = _tracker(tmp_path)
    off = TimeWindow(t, _Driver(), tmp_path / "p", None, None, cprofile=True)
    off.arm(time.monotonic_ns())
    off.finish(0)
    assert off.state == "off" and "switched off" in off.reason
    short = TimeWindow(t, _Driver(), tmp_path / "p", 30.0, 35.0, cprofile=True)
    short.arm(time.monotonic_ns())
    short.finish(0)
    assert short.reason == "the script ended before second 30, when the window would have opened"


def test_time_window_gives_way_to_steps_on_another_thread(tmp_path):
    """The loop's first step on a thread of its own ends the window: its cProfile, enabled on the main thread,
    is disabled there (up to 3.11 a profiler is per thread, and a disable() from the loop's thread left it set
    on the main thread for the rest of the run)."""
    t, _, _ = _tracker(tmp_path)
    driver = _Driver()
    tw = TimeWindow(t, driver, tmp_path / "profile.pstats", 0.05, 5.0, cprofile=True)
    t.on_first_step = tw.give_way
    tw.arm(time.monotonic_ns())
    _busy(0.3)  # the window opens on the main thread
    assert tw.state == "recording" and profslot.holder() == "cProfile"

    def loop() -> None:
        for _ in range(3):
            _forward(t)
            _backward(t)

    th = threading.Thread(target=loop)
    th.start()
    th.join()
    _busy(0.05)  # the main thread runs Python: the signal's handler disables its cProfile
    tw.finish(steps_seen=t.steps_seen)
    assert driver.calls == ["start", "stop", "drop"]
    assert profslot.holder() == "" and sys.getprofile() is None
