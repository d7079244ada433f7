"""What torch.compile did, read at run time (``collect.compile_watch``), and the NVML clock and power
figures the sampler records (``collect.nvml``)."""

from __future__ import annotations

import types

import pytest

from gpudoctor.collect import compile_watch as cw
from gpudoctor.collect.compile_watch import CompileWatch, first_line
from gpudoctor.collect.nvml import Nvml


def _args(cid: str, trigger: str = "DYNAMO") -> types.SimpleNamespace:
    return types.SimpleNamespace(compile_id=cid, callback_trigger=types.SimpleNamespace(name=trigger))


def _metric(cid: str, **kw) -> types.SimpleNamespace:
    base = dict(compile_id=cid, is_forward=True, recompile_reason=None, co_name="forward", co_filename="model.py",
                co_firstlineno=40, num_graph_breaks=0, fail_reason=None, duration_us=None, start_time_us=None)
    base.update(kw)
    return types.SimpleNamespace(**base)


class _Clock:
    def __init__(self) -> None:
        self.t = 0

    def __call__(self) -> int:
        return self.t


def _watch(monkeypatch, metrics: list, counters: dict | None = None):
    step = [0]
    clock = _Clock()
    changes = []
    w = CompileWatch(types.SimpleNamespace(), lambda: step[0], clock, lambda: changes.append(1))
    utils = types.SimpleNamespace(get_compilation_metrics=lambda: list(metrics), counters=counters or {})
    monkeypatch.setattr(w, "_dynamo_utils", lambda: utils)
    return w, step, clock, changes


def test_each_compilation_with_its_step_time_and_reason(monkeypatch):
    metrics = [
        _metric("0/0", duration_us=2_000_000),
        _metric("0/0", is_forward=False, co_name=None, co_filename=None),
        _metric("0/1", recompile_reason="0/0: tensor 'x' size mismatch at index 1. expected 8, actual 9\nmore"),
    ]
    w, step, clock, changes = _watch(monkeypatch, metrics, {"graph_break": {"call_function print\n  detail": 3}})
    for i, cid in enumerate(("0/0", "0/1")):
        step[0] = i
        clock.t = i * 1_000_000_000
        w._start(_args(cid))
        clock.t += 300_000_000
        w._end(_args(cid))
        w._start(_args(cid, "LAZY_BACKWARD"))
        clock.t += 50_000_000
        w._end(_args(cid, "LAZY_BACKWARD"))
    assert len(changes) == 4  # each end asks for settings.json to be written again
    assert w.compile_steps() == {0, 1}
    st = w.state()
    assert [(e.compile_id, e.step, e.trigger, e.dur_ns) for e in st.events] == [
        ("0/0", 0, "dynamo", 300_000_000), ("0/0", 0, "lazy_backward", 50_000_000),
        ("0/1", 1, "dynamo", 300_000_000), ("0/1", 1, "lazy_backward", 50_000_000),
    ]
    e = st.events[2]
    assert e.reason == "0/0: tensor 'x' size mismatch at index 1. expected 8, actual 9"  # the first line
    assert (e.frame, e.call_site.file, e.call_site.line) == ("forward", "model.py", 40)
    assert st.graph_breaks == {"call_function print": 3}
    assert st.limit_hits == 0 and not st.errors


def test_a_refusal_at_the_recompile_limit_is_placed_by_its_start_time(monkeypatch):
    now_wall_us = 1_700_000_000_000_000
    monkeypatch.setattr(cw.time, "time_ns", lambda: now_wall_us * 1000)
    w, step, clock, _ = _watch(monkeypatch, [
        _metric("0/8", co_name=None, co_filename=None, fail_reason="Dynamo recompile limit exceeded\n  Explanation: …",
                start_time_us=now_wall_us - 2_000_000),  # two seconds ago on the wall clock
    ])
    w._start(_args("0/0"))
    w._end(_args("0/0"))
    clock.t = 10_000_000_000  # the run's clock now
    st = w.state()
    hit = st.events[-1]
    assert (hit.compile_id, hit.step, hit.failed) == ("0/8", None, "Dynamo recompile limit exceeded")
    assert hit.start_ns == 8_000_000_000
    assert st.limit_hits == 1


def test_torch_internal_frames_are_not_shown(monkeypatch):
    m = _metric("0/0", co_name="inner", co_filename="/venv/lib/python3.11/site-packages/torch/_dynamo/external_utils.py")
    w, *_ = _watch(monkeypatch, [m])
    w._start(_args("0/0"))
    (e,) = w.state().events
    assert e.frame == "" and e.call_site is None


def test_older_callbacks_without_arguments(monkeypatch):
    w, step, clock, _ = _watch(monkeypatch, [])
    step[0] = 3
    w._start()
    clock.t = 5
    w._end()
    (e,) = w.state().events
    assert (e.compile_id, e.step, e.trigger, e.dur_ns) == ("", 3, "dynamo", 5)


def test_a_run_that_compiles_without_end_keeps_the_first_and_the_latest(monkeypatch):
    w, *_ = _watch(monkeypatch, [])
    for i in range(cw.MAX_EVENTS + 10):
        w._start(_args(f"0/{i}"))
    st = w.state()
    assert len(st.events) == cw.MAX_EVENTS and st.events_dropped == 10
    assert st.events[0].compile_id == "0/0" and st.events[-1].compile_id == f"0/{cw.MAX_EVENTS + 9}"


def test_first_line():
    assert first_line("  \nfirst\nsecond") == "first" and first_line(None) == "" and len(first_line("x" * 999)) == 300


def test_nvml_reads_applications_clock_and_power_limit():
    def fn(value):
        return lambda *a: value

    nv = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}", nvmlDeviceGetUtilizationRates=fn(types.SimpleNamespace(gpu=99, memory=40)),
        nvmlDeviceGetMemoryInfo=fn(types.SimpleNamespace(used=1, total=2)), nvmlDeviceGetClockInfo=fn(1155),
        nvmlDeviceGetPowerUsage=fn(399_000), nvmlDeviceGetTemperature=fn(84),
        nvmlDeviceGetCurrentClocksEventReasons=fn(0x4), nvmlDeviceGetPcieThroughput=fn(0),
        nvmlDeviceGetApplicationsClock=fn(1410), nvmlDeviceGetMaxClockInfo=fn(1410),
        nvmlDeviceGetEnforcedPowerLimit=fn(400_000),
    )
    session, _ = Nvml.open(nv)
    (g,) = session.sample(1)
    assert (g.app_sm_clock_mhz, g.max_sm_clock_mhz, g.power_limit_w, g.throttle_read) == (1410, 1410, 400.0, True)
    assert g.throttle_reasons == ("sw_power_cap",)
    # a driver without these queries: left out, the rest still read
    for name in ("nvmlDeviceGetApplicationsClock", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetEnforcedPowerLimit"):
        delattr(nv, name)
    nv.nvmlDeviceGetCurrentClocksEventReasons = None
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = fn(0)
    session, _ = Nvml.open(nv)
    (g,) = session.sample(2)
    assert (g.app_sm_clock_mhz, g.power_limit_w, g.sm_clock_mhz, g.throttle_read) == (None, None, 1155, True)


@pytest.mark.slow
def test_a_real_compile_that_recompiles_each_step():
    """torch.compile(dynamic=False) on a new shape every step: each recompilation with its step and reason."""
    pytest.importorskip("torch")
    import torch._dynamo  # noqa: PLC0415 - only this slow test needs Dynamo

    torch._dynamo.reset()
    step = [0]
    w = CompileWatch(torch, lambda: step[0], cw.monotonic_clock(0), lambda: None)
    w.install()
    try:
        f = torch.compile(lambda x: (x * 2).sum(), backend="eager", dynamic=False)
        for i in range(4):
            step[0] = i
            f(torch.ones(3 + i))
        st = w.state()
    finally:
        handler = torch._dynamo.callback.callback_handler
        handler.remove_start_callback(w._start)
        handler.remove_end_callback(w._end)
        torch._dynamo.reset()
    fwd = [e for e in st.events if e.trigger == "dynamo"]
    assert [(e.compile_id, e.step) for e in fwd] == [("0/0", 0), ("0/1", 1), ("0/2", 2), ("0/3", 3)]
    assert all(e.dur_ns and e.dur_ns > 0 for e in fwd)
    assert "size mismatch" in fwd[1].reason and st.recompile_limit == 8
