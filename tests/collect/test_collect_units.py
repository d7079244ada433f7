"""Unit tests of the collect layer's pure parts: schedule, step tracking, run directory, NVML, summary."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest

from gpudoctor.collect import rundir
from gpudoctor.collect import schedule as sched
from gpudoctor.collect.callsite import FrameClassifier
from gpudoctor.collect.nvml import Nvml, reason_for, throttle_names
from gpudoctor.collect.steps import CprofileWindow, CudaStepTimer, StepTracker, StopAfterSteps
from gpudoctor.collect.summary import percentile, summarize_steps, summary_lines
from gpudoctor.model import ProfilerSchedule, StepRecord


def _sched(skip=10, wait=294, warmup=1, active=5, repeat=3) -> ProfilerSchedule:
    return ProfilerSchedule(skip, wait, warmup, active, repeat, True, True, False)


# --------------------------------------------------------------------------- schedule


def test_phases_follow_skip_window_wait():
    s = _sched(skip=2, wait=3, warmup=1, active=2, repeat=2)
    got = [sched.phase(i, s) for i in range(16)]
    assert got == [
        "", "",  # skip_first
        "warmup", "active", "active",  # window 1: steps 2..4
        "", "", "",  # wait
        "warmup", "active", "active",  # window 2: steps 8..10
        "", "", "", "", "",  # repeat exhausted
    ]
    assert [i for i in range(16) if sched.is_last_active(i, s)] == [4, 10]
    assert sched.window_start(2, s) == 3 and sched.window_start(10, s) == 9
    assert sched.windows(s, 16) == [(2, 4), (8, 10)]
    nxt = [sched.next_window_start(i, s) for i in range(13)]
    assert nxt == [2, 2, 2, 3, 4, 8, 8, 8, 8, 9, 10, None, None]
    for i in range(16):  # nothing is instrumented before the next window start, and it is one
        n = sched.next_window_start(i, s)
        assert all(sched.phase(j, s) == "" for j in range(i, n if n is not None else 16))
        assert n is None or sched.phase(n, s) != ""
    assert sched.windows(s, 9) == [(2, 4), (8, 8)]


def test_repeat_zero_profiles_until_the_end():
    s = _sched(skip=0, wait=1, warmup=0, active=1, repeat=0)
    assert [sched.phase(i, s) for i in range(6)] == ["active", "", "active", "", "active", ""]


def test_default_schedule_profiles_a_short_run():
    """`--steps 40` must still get a trace and a cProfile window with the defaults."""
    from gpudoctor.collect.options import ProfileOptions

    s = ProfileOptions(script="x.py").schedule()
    first = sched.windows(s, 40)
    assert first and first[0][1] < 40
    start = sched.cprofile_start(s)
    assert start < 40
    assert sched.windows(s, 1000) == [(10, 15), (310, 315), (610, 615)]


def test_a_short_run_fits_a_second_timings_only_window():
    """`--steps 40`: the first window records shapes and stacks (slower ops); a second one,
    timings only, must fit before the run stops, with cProfile between them."""
    import dataclasses

    from gpudoctor.collect.options import DEFAULT_WAIT, ProfileOptions, short_run_wait

    base = ProfileOptions(script="x.py")
    wait = short_run_wait(40, base.skip_first, base.warmup, base.active, base.repeat)
    assert wait == 18
    s = dataclasses.replace(base, wait=wait, max_steps=40).schedule()
    assert sched.windows(s, 40) == [(10, 15), (34, 39)]
    start = sched.cprofile_start(s)
    assert sched.cprofile_stop_before(s, start, base.cprofile_steps) - start == 18
    # a long run, one asked-for window, or a run too short for two windows: the wait as given
    assert short_run_wait(None, 10, 1, 5, 3) == short_run_wait(1000, 10, 1, 5, 3) == DEFAULT_WAIT
    assert short_run_wait(40, 10, 1, 5, 1) == DEFAULT_WAIT
    assert short_run_wait(23, 10, 1, 5, 3) == DEFAULT_WAIT  # 1 step between windows: no room for cProfile
    assert short_run_wait(24, 10, 1, 5, 3) == 2


def test_cprofile_window_stops_before_the_next_torch_window():
    s = _sched(skip=2, wait=3, warmup=1, active=2, repeat=3)
    start = sched.cprofile_start(s)
    assert start == 5
    assert sched.cprofile_stop_before(s, start, 50) == 8  # the second window starts at 8
    assert sched.cprofile_stop_before(s, start, 2) == 7
    last = _sched(skip=2, wait=3, warmup=1, active=2, repeat=1)
    assert sched.cprofile_stop_before(last, 5, 50) == 55


def test_cprofile_budget_stops_an_expensive_window_and_keeps_a_cheap_one():
    cheap = sched.CprofileBudget(budget_steps=2.0, min_steps=3)
    cheap.start([10_000_000] * 20)
    assert not any(cheap.add(10_200_000) for _ in range(50))  # +2%: 50 steps cost 1 step
    dear = sched.CprofileBudget(budget_steps=2.0, min_steps=3)
    dear.start([10_000_000] * 20)
    stops = [dear.add(20_000_000) for _ in range(5)]  # +100%: over budget at the 3rd step
    assert stops[:2] == [False, False] and stops[2] is True
    assert dear.overhead_pct() == pytest.approx(100.0)


# --------------------------------------------------------------------------- step tracking


class _FakeEvent:
    def __init__(self, clock: list[float], done: list[bool]) -> None:
        self.t = None
        self.clock = clock
        self.done = done

    def record(self) -> None:
        self.t = self.clock[0]

    def query(self) -> bool:
        return self.done[0]

    def elapsed_time(self, end: _FakeEvent) -> float:
        return end.t - self.t  # ms


def _fake_torch(cuda: bool = False, clock=None, done=None):  # noqa: ANN001, ANN202
    clock = clock if clock is not None else [0.0]
    done = done if done is not None else [True]
    cuda_ns = types.SimpleNamespace(is_initialized=lambda: cuda, Event=lambda enable_timing: _FakeEvent(clock, done))
    return types.SimpleNamespace(cuda=cuda_ns)


class _Writer:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def write_text(self, text: str) -> None:
        assert text.endswith("\n")
        self.rows.extend(json.loads(line) for line in text.splitlines())

    def flush(self) -> None:
        pass


def _tracker(tmp_path: Path, max_steps=None, torch=None) -> tuple[StepTracker, _Writer]:  # noqa: ANN001
    w = _Writer()
    cprof = CprofileWindow(False, 0, 0, sched.CprofileBudget(), tmp_path / "p.pstats")
    t = StepTracker(torch or _fake_torch(), w, 0, None, max_steps, None, cprof)
    t.write_every_ns = 0  # every step's line at once, to look at it
    return t, w


def _opt_step(t: StepTracker, opt: object) -> None:
    t.on_optimizer_step(opt)
    t.flush(from_step_return=True)


def test_optimizer_steps_are_contiguous_and_every_one_recorded(tmp_path):
    t, w = _tracker(tmp_path)
    opt = object.__new__(type("Opt", (), {}))
    t.optimizer_created()
    for _ in range(4):
        entered = t.dataloader_next_enter()  # an optimizer exists: batches do not mark steps
        t.dataloader_next_exit(entered, False, 0)
        _opt_step(t, opt)
    assert [r["index"] for r in w.rows] == [0, 1, 2, 3]
    assert t.source == "optimizer" and t.steps_seen == 4
    for a, b in zip(w.rows, w.rows[1:], strict=False):
        assert b["start_ns"] >= a["start_ns"] + a["wall_ns"]
    recs = [StepRecord.from_dict(r) for r in w.rows]
    assert all(r.data_wait_ns >= 0 for r in recs)
    # µs-long steps share a CPU reading, which covers the steps without figures before it (step 0
    # ends on the slow path: it reads); those after the last reading keep none
    read = [r for r in recs if r.user_cpu_ns is not None]
    assert read[0].index == 0 and all(r.minor_faults is not None and r.cpu_steps for r in read)
    assert sum(r.cpu_steps or 0 for r in read) == read[-1].index + 1
    assert all(r["epoch"] == 0 for r in w.rows)


def test_second_optimizer_does_not_double_count(tmp_path):
    t, w = _tracker(tmp_path)
    gen, disc = object.__new__(type("G", (), {})), object.__new__(type("D", (), {}))
    t.optimizer_created()
    for _ in range(3):
        _opt_step(t, gen)
        _opt_step(t, disc)  # a GAN: the first optimizer that stepped marks the steps
    assert t.steps_seen == 3


def test_a_second_optimizer_s_backward_calls_are_not_micro_batches(tmp_path):
    """A DCGAN iteration: two backward() calls then the discriminator's step, one backward() then the
    generator's step. Each step after the first holds three backward() calls and one batch: one
    iteration of two optimizers, not gradient accumulation of three micro-batches."""
    t, w = _tracker(tmp_path)
    disc, gen = object.__new__(type("D", (), {})), object.__new__(type("G", (), {}))
    t.optimizer_created()

    def backward() -> None:
        t.backward_enter()
        t.backward_exit(True)

    for _ in range(5):
        entered = t.dataloader_next_enter()
        t.dataloader_next_exit(entered, False, 0)
        backward()
        backward()
        _opt_step(t, disc)
        backward()
        _opt_step(t, gen)
    t.finish()
    assert [(r["micro_batches"], r["batches"]) for r in w.rows[1:]] == [(1, 1)] * 4
    marker, why, _ = t.describe()
    assert marker == "optimizer" and "accumulation:" not in why and "another optimizer (G) also steps" in why


def test_gradient_accumulation_with_one_optimizer_keeps_its_micro_batches(tmp_path):
    t, w = _tracker(tmp_path)
    opt = object.__new__(type("Opt", (), {}))
    t.optimizer_created()
    for _ in range(4):
        for _ in range(3):
            entered = t.dataloader_next_enter()
            t.dataloader_next_exit(entered, False, 0)
            t.backward_enter()
            t.backward_exit(True)
        _opt_step(t, opt)
    t.finish()
    assert [(r["micro_batches"], r["batches"]) for r in w.rows[1:]] == [(3, 3)] * 3
    assert "gradient accumulation: 3 micro-batches" in t.describe()[1]


def test_passed_args_name_what_the_call_chose():
    import inspect

    from gpudoctor.collect.patches import passed_args

    def init(self, dataset, batch_size=1, shuffle=None, num_workers=0, *, prefetch_factor=None, **extra):  # noqa: ANN001, ANN003
        pass

    sig = inspect.signature(init)
    assert passed_args(sig, object(), ("ds", 32), {"num_workers": 4}) == ("dataset", "batch_size", "num_workers")
    assert passed_args(sig, object(), ("ds",), {"prefetch_factor": 2, "in_order": True}) == (
        "dataset", "prefetch_factor", "in_order")
    assert passed_args(sig, object(), (), {"nope": 1, "batch_size": 2, "x": 3}) == ("batch_size", "nope", "x")
    assert passed_args(None, object(), (), {}) is None
    assert passed_args(inspect.signature(lambda self: None), object(), (1, 2), {}) is None  # does not bind


def test_steps_limit_raises_after_the_last_step(tmp_path):
    t, w = _tracker(tmp_path, max_steps=2)
    opt = object.__new__(type("Opt", (), {}))
    t.optimizer_created()
    _opt_step(t, opt)
    with pytest.raises(StopAfterSteps) as err:
        _opt_step(t, opt)
    assert err.value.steps == 2 and err.value.code == 0
    assert len(w.rows) == 2 and not t.active


def test_dataloader_steps_end_with_the_epoch(tmp_path):
    t, w = _tracker(tmp_path)
    for epoch in range(2):
        for _ in range(4):
            entered = t.dataloader_next_enter(epoch_ends=False)
            t.dataloader_next_exit(entered, False, epoch)
        entered = t.dataloader_next_enter(epoch_ends=True)  # map-style: the 5th call stops
        t.dataloader_next_exit(entered, True, epoch)
    assert t.source == "dataloader"
    assert [r["index"] for r in w.rows] == list(range(8))
    assert [r["epoch"] for r in w.rows] == [0] * 4 + [1] * 4


def test_dataloader_epoch_end_unannounced_drops_the_empty_step(tmp_path):
    t, w = _tracker(tmp_path)
    for epoch in range(2):
        for _ in range(3):
            entered = t.dataloader_next_enter()
            t.dataloader_next_exit(entered, False, epoch)
        entered = t.dataloader_next_enter()  # an iterable dataset: nobody knew it would stop
        t.dataloader_next_exit(entered, True, epoch)
    assert [r["index"] for r in w.rows] == list(range(6))


def test_gpu_time_comes_from_events_without_waiting(tmp_path):
    clock, done = [0.0], [False]
    torch = _fake_torch(cuda=True, clock=clock, done=done)
    t, w = _tracker(tmp_path, torch=torch)
    opt = object.__new__(type("Opt", (), {}))
    t.optimizer_created()
    clock[0] = 5.0
    _opt_step(t, opt)  # step 0's end event not complete yet: its record waits
    assert w.rows == []
    done[0] = True
    clock[0] = 12.0
    _opt_step(t, opt)
    assert [(r["index"], r["gpu_ns"]) for r in w.rows] == [(0, 5_000_000), (1, 7_000_000)]
    t.finish()
    assert len(w.rows) == 2


def test_records_stay_in_order_when_cuda_starts_mid_run(tmp_path):
    clock, done = [0.0], [False]
    torch = _fake_torch(cuda=False, clock=clock, done=done)
    t, w = _tracker(tmp_path, torch=torch)
    opt = object.__new__(type("Opt", (), {}))
    t.optimizer_created()
    _opt_step(t, opt)  # step 0: no CUDA yet, written at once
    assert [r["index"] for r in w.rows] == [0]
    torch.cuda.is_initialized = lambda: True  # the script moves the model to the GPU
    for _ in range(3):
        clock[0] += 4.0
        _opt_step(t, opt)  # step 1 has no start event; steps 2, 3 wait for theirs
    assert [r["index"] for r in w.rows] == [0, 1]
    done[0] = True
    clock[0] += 4.0
    _opt_step(t, opt)
    assert [(r["index"], r["gpu_ns"]) for r in w.rows] == [(0, None), (1, None), (2, 4_000_000), (3, 4_000_000), (4, 4_000_000)]
    done[0] = False
    _opt_step(t, opt)
    t.finish(cuda_timeout_s=0.05)  # the last event never completes: written without GPU time
    assert [(r["index"], r["gpu_ns"]) for r in w.rows][-1] == (5, None)


def test_lines_are_written_once_a_second_and_at_the_end(tmp_path):
    t, w = _tracker(tmp_path)
    t.write_every_ns = 10**12  # never within this test
    opt = object.__new__(type("Opt", (), {}))
    t.optimizer_created()
    for _ in range(5):
        _opt_step(t, opt)
    assert w.rows == []
    t.finish()
    assert [r["index"] for r in w.rows] == [0, 1, 2, 3, 4]
    assert set(w.rows[0]) == set(StepRecord.__dataclass_fields__)


def test_cuda_timer_gives_up_on_a_lagging_event():
    clock, done = [0.0], [False]
    timer = CudaStepTimer(_fake_torch(cuda=True, clock=clock, done=done), max_lag=2)
    timer.boundary(None)
    for i in range(4):
        timer.boundary(i)
    assert timer.ready() == [(0, None), (1, None)]
    done[0] = True
    assert [i for i, _ in timer.ready()] == [2, 3]


# --------------------------------------------------------------------------- run directory


def test_trace_names_are_read_by_torch_tb_profiler_as_worker_and_span():
    consts = pytest.importorskip("torch_tb_profiler.consts")
    name = rundir.trace_name(rundir.worker_name(1234, host="gpu-node.example.com"), 42)
    m = consts.WORKER_PATTERN.match(name)
    assert m and m.group(1) == "gpu-node-example-com_1234" and m.group(2) == ".00000042"
    assert consts.NODE_PROCESS_PATTERN.match(m.group(1)).group(2) == "1234"


def test_rank_tagged_names():
    assert rundir.rank_tagged("steps.jsonl", 3) == "steps.rank3.jsonl"
    assert rundir.rank_tagged(".child-state.json", 1) == ".child-state.rank1.json"
    assert rundir.rank_tagged("profile.pstats", None) == "profile.pstats"


def test_run_dirs_never_collide(tmp_path):
    a = rundir.create_run_dir(tmp_path, "train", now=0)
    b = rundir.create_run_dir(tmp_path, "train", now=0)
    assert a != b and a.is_dir() and b.is_dir() and b.name.endswith("-2")
    assert re.fullmatch(r"train-\d{8}-\d{6}", a.name)
    assert rundir.run_stem("dir/my train.py", None) == "my-train"
    assert rundir.run_stem(None, "pkg.train") == "pkg.train"


def test_torn_last_line_is_skipped_and_repaired(tmp_path):
    p = tmp_path / "steps.jsonl"
    p.write_text('{"index": 0}\n{"index": 1}\n{"ind')
    assert [r["index"] for r in rundir.read_jsonl(p)] == [0, 1]
    assert rundir.repair_jsonl(p)
    assert p.read_text() == '{"index": 0}\n{"index": 1}\n'
    assert not rundir.repair_jsonl(p)


def test_leftovers_of_a_killed_writer_are_settled_never_deleted_alone(tmp_path):
    (tmp_path / "settings.json.tmp").write_text("{")  # half of the only copy: kept, named as such
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "manifest.json.tmp").write_text("{")  # half of a newer copy: removed
    (tmp_path / "h_1.00000002.pt.trace.json").write_text("{")  # an export cut short: kept, not listed
    (tmp_path / "h_1.00000009.pt.trace.json.tmp").write_text('{"traceEvents": []}')  # Kineto's rename failed
    kept, incomplete, removed = rundir.settle_leftovers(tmp_path)
    assert kept == ["h_1.00000009.pt.trace.json"]
    assert incomplete == ["h_1.00000002.pt.trace.json.incomplete", "settings.json.incomplete"]
    assert removed == ["manifest.json.tmp"]
    assert (tmp_path / "h_1.00000009.pt.trace.json").read_text() == '{"traceEvents": []}'
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "h_1.00000002.pt.trace.json.incomplete", "h_1.00000009.pt.trace.json", "manifest.json", "settings.json.incomplete"
    ]


def test_listed_plain_traces_are_gzipped_once(tmp_path):
    import gzip

    (tmp_path / "h_1.00000010.pt.trace.json").write_text('{"traceEvents": []}')
    (tmp_path / "h_1.00000310.pt.trace.json").write_text('{"traceEv')  # still being exported: not listed
    names = ["h_1.00000010.pt.trace.json.gz"]
    assert rundir.compress_traces(tmp_path, names) == names
    assert rundir.compress_traces(tmp_path, names) == []
    assert json.loads(gzip.decompress((tmp_path / names[0]).read_bytes())) == {"traceEvents": []}
    assert not (tmp_path / "h_1.00000010.pt.trace.json").exists()
    assert rundir.settle_leftovers(tmp_path) == ([], ["h_1.00000310.pt.trace.json.incomplete"], [])


def test_frames_are_told_apart(tmp_path):
    import json as stdlib_json

    import gpudoctor.collect.runner as ours

    f = FrameClassifier(cwd=str(tmp_path))
    assert f.kind(ours.__file__) == "ours"
    assert f.kind(stdlib_json.__file__) == "library"
    assert f.kind(str(tmp_path / "train.py")) == "user"
    assert f.display_path(str(tmp_path / "sub" / "train.py")) == "sub/train.py"
    assert f.kind("<frozen runpy>") == "library"


# --------------------------------------------------------------------------- NVML


class _NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def _fake_nvml(init_error=None, count=1, unsupported=()):  # noqa: ANN001, ANN202
    def init():
        if init_error is not None:
            raise _NVMLError(init_error)

    def maybe(name, value):  # noqa: ANN001, ANN202
        def fn(*a):  # noqa: ANN002, ANN202
            if name in unsupported:
                raise _NVMLError(3)  # NOT_SUPPORTED
            return value
        return fn

    return types.SimpleNamespace(
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetName=lambda h: b"Fake GPU",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=2 << 30, total=16 << 30),
        nvmlDeviceGetCudaComputeCapability=lambda h: (8, 0),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87, memory=40),
        nvmlDeviceGetClockInfo=lambda h, kind: 1410 if kind == 1 else 1215,
        nvmlDeviceGetPowerUsage=maybe("power", 250_000),
        nvmlDeviceGetTemperature=lambda h, kind: 61,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x4 | 0x40,
        nvmlDeviceGetPcieThroughput=lambda h, kind: 1000 if kind == 0 else 2000,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [],
        nvmlSystemGetDriverVersion=lambda: "550.54",
        nvmlSystemGetNVMLVersion=lambda: "12.550",
        nvmlSystemGetCudaDriverVersion=lambda: 12040,
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_TEMPERATURE_GPU=0,
        NVML_PCIE_UTIL_TX_BYTES=0, NVML_PCIE_UTIL_RX_BYTES=1,
    )


def test_nvml_refusals_become_reasons():
    for code, words in ((12, "not found"), (4, "permission denied"), (9, "driver is not loaded")):
        session, reason = Nvml.open(_fake_nvml(init_error=code))
        assert session is None and words in reason
    session, reason = Nvml.open(_fake_nvml(count=0))
    assert session is None and "no GPU" in reason
    assert "NVML: " in reason_for(_NVMLError(999))


def test_nvml_sample_reads_every_metric_and_tolerates_unsupported():
    session, reason = Nvml.open(_fake_nvml(unsupported=("power",)))
    assert session is not None and reason == ""
    (g,) = session.sample(123)
    assert (g.t_ns, g.index, g.util_pct, g.mem_util_pct) == (123, 0, 87.0, 40.0)
    assert g.mem_used_bytes == 2 << 30 and g.mem_total_bytes == 16 << 30
    assert (g.sm_clock_mhz, g.mem_clock_mhz, g.temp_c) == (1410, 1215, 61.0)
    assert g.power_w is None  # not supported on this device: left out
    assert g.throttle_reasons == ("sw_power_cap", "hw_thermal_slowdown")
    assert (g.pcie_tx_kbps, g.pcie_rx_kbps) == (1000.0, 2000.0)
    assert session.versions() == {"driver": "550.54", "nvml": "12.550", "cuda_driver": "12.4"}
    (d,) = session.devices()
    assert (d.name, d.total_memory_bytes, d.compute_capability) == ("Fake GPU", 16 << 30, "8.0")
    assert throttle_names(0) == ()


# --------------------------------------------------------------------------- summary


def test_summary_figures():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 90) == 5.0
    rows = [{"index": 0, "start_ns": 0, "wall_ns": 900_000_000, "data_wait_ns": 0}] + [
        {"index": i, "start_ns": 0, "wall_ns": 10_000_000 + i * 1_000_000, "data_wait_ns": 2_000_000} for i in range(1, 11)
    ]
    s = summarize_steps(rows)
    assert s.steps == 11
    assert s.step_ms == pytest.approx(15.5)  # the mean, total ÷ count: step 0 (start-up) left out
    assert s.median_ms == pytest.approx(15.5)
    assert s.p90_ms == pytest.approx(19.0)  # nearest rank, as the report's p90
    assert s.data_wait_pct == pytest.approx(100 * 20 / 155, abs=1e-3)  # rounded as the report rounds it
    lines = summary_lines(s, "optimizer", "completed", "", 0, "gpudoctor-runs/x", [])
    assert "11 steps" in lines[0] and "step time 15.5 ms (mean), median 15.5 ms" in lines[0] and "p90 19.0 ms" in lines[0]
    assert "waiting for data 12.9%" in lines[0]
    # the first step of each epoch is left out too, and the steps of an earlier marker
    epochs = [{"index": i, "start_ns": 0, "wall_ns": (900 if i % 5 == 0 else 10) * 1_000_000, "epoch": i // 5,
               "marker": "optimizer"} for i in range(10)]
    early = {"index": -1, "start_ns": 0, "wall_ns": 5 * 10**9, "marker": "module"}
    assert summarize_steps([early, *epochs], "optimizer").p90_ms == 10.0
    assert lines[-1] == "gpudoctor: run directory gpudoctor-runs/x"
    # a p90 just under a rounding edge: the report rounds its figures to 3 decimals of a ms before
    # printing them (3.4496 -> 3.450 -> "3.5 ms"); the stderr line must print the same
    edge = [{"index": 0, "start_ns": 0, "wall_ns": 1}] + [{"index": i, "start_ns": 0, "wall_ns": 3_449_600} for i in range(1, 4)]
    assert summarize_steps(edge).p90_ms == 3.45
    empty = summary_lines(summarize_steps([]), "none", "failed", "boom", 1, "d", ["steps (none)"])
    assert "no training steps" in empty[0] and any("not collected: steps" in x for x in empty)
    # partial step figures (issue 35): a warning right after the steps' line
    warned = summary_lines(s, "optimizer", "stopped", "stopped after 40 steps", 0, "d", [],
                           ["the step figures are partial: step tracking stopped at step 16: ValueError: x"])
    assert warned[1] == "gpudoctor: warning: the step figures are partial: step tracking stopped at step 16: ValueError: x"


# --------------------------------------------------------------------------- settings patches


class _Prop:
    """As torch.backends.ContextProp: a plain Python data descriptor."""

    def __init__(self, getter, setter):
        self.getter = getter
        self.setter = setter

    def __get__(self, obj, objtype):
        return self.getter()

    def __set__(self, obj, val):
        self.setter(val)


def test_a_recorded_flag_reads_through_torchs_own_descriptor_and_notes_every_set():
    from gpudoctor.collect.settings_hooks import _recording_prop, _RecordingProp

    box, notes = {"v": 1}, []
    prop = _recording_prop(_Prop(lambda: box["v"], lambda v: box.update(v=v)), lambda: notes.append(box["v"]))
    holder = type("Flags", (), {"enabled": prop})()
    assert isinstance(prop, _Prop) and type(prop).__get__ is _Prop.__get__  # a read costs what it did
    assert holder.enabled == 1
    holder.enabled = 5
    assert (holder.enabled, notes) == (5, [5])

    class Slotted:  # no __dict__ to copy: the wrapper instead
        __slots__ = ()

        def __get__(self, obj, objtype):
            return 7

        def __set__(self, obj, val):
            notes.append(("slotted", val))

    wrapped = _recording_prop(Slotted(), lambda: notes.append("noted"))
    assert isinstance(wrapped, _RecordingProp)
    holder2 = type("Flags2", (), {"x": wrapped})()
    holder2.x = 3
    assert holder2.x == 7 and notes[-2:] == [("slotted", 3), "noted"]
