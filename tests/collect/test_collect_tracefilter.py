"""The parent's trace filter: short Python calls that enclose no op are left out of a trace.

A hand-written trace in the writer's layout (``json.dump(indent=…)``, like Kineto's):
what is kept, what is dropped, the note; the same bytes whatever the piece size;
a trace that cannot be filtered is gzipped as recorded, never lost.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from collect_testlib import (
    collected,
    copy_script,
    manifest,
    only_run_dir,
    profiler_steps,
    run_profile,
    steps,
)

from gpudoctor.collect import rundir, tracefilter
from gpudoctor.collect.torchprof import PYTHON_CALLS_BUDGET
from gpudoctor.collect.tracefilter import TraceFilterError, filter_trace

PID = 4242


def _py(pid_: int, parent: int | None, name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {
        "ph": "X", "cat": "python_function", "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
        "args": {"Python parent id": parent, "Python id": pid_, "Ev Idx": pid_},
    }


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, pid: int | str = PID, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": dict(args)}


def _events() -> list[dict]:
    """Thread 1 runs step → tokenize (8 µs, calls dict.get) → add_ (an op inside) → …"""
    return [
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": 1, "ts": 0, "args": {"name": "thread 1"}},
        _x("user_annotation", "ProfilerStep#3", 0.0, 1000.0, **{"External id": 1}),
        _py(1, None, "train.py(10): <module>", 0.0, 1000.0),
        _py(2, 1, "train.py(20): step", 5.0, 900.0),
        _py(3, 2, "train.py(30): tokenize", 10.0, 8.0),  # short, no op inside: dropped
        _py(4, 3, "<built-in method get of dict object at 0x1>", 11.0, 0.2),  # inside a dropped call
        _py(5, 2, "<built-in method add_ of Tensor object at 0x2>", 20.0, 5.0),  # short but encloses aten::add_
        _py(6, 2, "train.py(40): tiny", 30.0, 1.0),  # short, no op: dropped
        _py(7, None, "threading.py(1): run", 0.0, 2.0, tid=2),  # outermost frame of thread 2: kept
        _py(8, 999, "worker.py(5): poll", 3.0, 1.0, tid=2),  # its caller is not in the trace: outermost, kept
        _py(9, 2, "<built-in function _launch>", 40.0, 5.0),  # encloses a CUDA runtime call: kept
        _py(10, 2, "train.py(50): other_thread_op", 50.0, 5.0),  # an op overlaps, on another thread: dropped
        _py(11, 2, "train.py(60): during_kernel", 61.0, 2.0),  # a kernel overlaps (device): dropped
        _py(12, 2, "train.py(70): slow_python", 100.0, 250.0),  # 250 µs: kept
        # anchors after the Python calls in the file (GPU traces list runtime calls last)
        _x("cpu_op", "aten::add_", 21.0, 3.0, **{"External id": 2, "Input Dims": [[4], [4]]}),
        _x("cuda_runtime", "cudaLaunchKernel", 41.0, 2.0, correlation=7),
        _x("cpu_op", "aten::mul", 51.0, 1.0, tid=2),
        _x("kernel", "void k()", 60.0, 10.0, tid=7, pid=0, correlation=7),
        {"ph": "s", "id": 7, "pid": PID, "tid": 1, "ts": 41.0, "cat": "ac2g", "name": "ac2g"},
    ]


KEPT_IDS = {1, 2, 5, 7, 8, 9, 12}
DROPPED_IDS = {3, 4, 6, 10, 11}


def _write(path: Path, events: list[dict], **top: object) -> Path:
    obj = {"schemaVersion": 1, "with_stack": 1, **top, "traceEvents": events, "traceName": str(path)}
    path.write_text(json.dumps(obj, indent=2))
    return path


def _read_gz(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def test_short_calls_without_ops_are_dropped_and_noted(tmp_path):
    src = _write(tmp_path / "h_1.00000003.pt.trace.json", _events(), deviceProperties=[])
    r = filter_trace(src, tmp_path / "out.json.gz")
    out = _read_gz(tmp_path / "out.json.gz")
    py_ids = {e["args"]["Python id"] for e in out["traceEvents"] if e.get("cat") == "python_function"}
    assert py_ids == KEPT_IDS
    # every other event kept, unchanged and in order
    others = [e for e in _events() if e.get("cat") != "python_function"]
    assert [e for e in out["traceEvents"] if e.get("cat") != "python_function"] == others
    kept_py = [e for e in _events() if e.get("cat") == "python_function" and e["args"]["Python id"] in KEPT_IDS]
    assert [e for e in out["traceEvents"] if e.get("cat") == "python_function"] == kept_py
    # the kept set is closed upward: a kept call's caller is in the trace (or was never in it)
    present = py_ids | {999}
    assert all(e["args"]["Python parent id"] in present | {None} for e in kept_py)
    # the top level is kept, with the note
    assert out["schemaVersion"] == 1 and out["with_stack"] == 1 and out["traceName"] == str(src)
    assert r.python_events == 12 and r.dropped_events == len(DROPPED_IDS)
    assert r.dropped_us == pytest.approx(8.0 + 1.0 + 5.0 + 2.0)  # outermost dropped calls only (not #4)
    assert out[rundir.TRACE_FILTER_KEY] == {
        "min_us": 10.0, "dropped_events": 5, "dropped_us": 16.0, "kept_python_events": 7,
    }
    assert r.bytes_in == src.stat().st_size and r.bytes_out == (tmp_path / "out.json.gz").stat().st_size


def test_threshold_is_a_parameter(tmp_path):
    src = _write(tmp_path / "t.json", _events())
    r = filter_trace(src, tmp_path / "out.json.gz", min_us=1.0)
    out = _read_gz(tmp_path / "out.json.gz")
    py_ids = {e["args"]["Python id"] for e in out["traceEvents"] if e.get("cat") == "python_function"}
    # 8, 5, 2 and 1 µs calls now stay; only dict.get (0.2 µs, no op) goes
    assert py_ids == KEPT_IDS | {3, 6, 10, 11}
    assert r.dropped_events == 1 and out[rundir.TRACE_FILTER_KEY]["min_us"] == 1.0


def test_same_output_whatever_the_piece_size(tmp_path):
    events = _events() * 40  # many pieces at a small size
    src = _write(tmp_path / "t.json", events)
    filter_trace(src, tmp_path / "big.gz")
    for chunk in (64, 300, 1000, 5000):
        filter_trace(src, tmp_path / "small.gz", chunk_bytes=chunk)
        assert gzip.decompress((tmp_path / "small.gz").read_bytes()) == gzip.decompress((tmp_path / "big.gz").read_bytes())


def test_kineto_layout_and_the_parse_layer(tmp_path):
    """Kineto's own layout (blank lines, ``"dur": …\\n ,``) survives, and the parse layer reads the result."""
    from gpudoctor.parse import load_inputs

    lines = ['{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n  \n  "with_stack": 1,\n  "traceEvents": [\n  ']
    body = []
    for e in _events():
        inner = ",\n    ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in e.items())
        body.append("  {\n    " + inner + "\n  }")
    lines.append(",\n".join(body))
    lines.append('\n  ],"traceName": "x.json"\n}\n')
    src = tmp_path / "w_1.00000003.pt.trace.json"
    src.write_text("".join(lines))
    dst = tmp_path / "w_1.00000003.pt.trace.json.gz"
    filter_trace(src, dst)
    text = gzip.decompress(dst.read_bytes()).decode()
    assert text.startswith('{\n  "schemaVersion": 1,') and text.rstrip().endswith("}")
    out = json.loads(text)
    assert {e["args"]["Python id"] for e in out["traceEvents"] if e.get("cat") == "python_function"} == KEPT_IDS
    tl = load_inputs([dst]).timelines[0]
    assert tl.info.event_count == len(_events()) - len(DROPPED_IDS)
    assert tl.info.with_stack and tl.info.trace_name == "x.json"


def test_empty_and_stackless_traces(tmp_path):
    src = _write(tmp_path / "e.json", [])
    r = filter_trace(src, tmp_path / "e.gz")
    assert r.dropped_events == 0 and _read_gz(tmp_path / "e.gz")["traceEvents"] == []
    plain = [e for e in _events() if e.get("cat") != "python_function"]
    src = _write(tmp_path / "p.json", plain)
    assert not tracefilter.has_python_events(src)
    assert tracefilter.has_python_events(_write(tmp_path / "q.json", _events()))


def test_minified_trace_is_filtered_too(tmp_path):
    """A trace without the writer's newlines (one line): the last piece is cut by the JSON scanner."""
    src = tmp_path / "m.json"
    src.write_text(json.dumps({"traceEvents": _events(), "traceName": "m"}))
    filter_trace(src, tmp_path / "m.gz")
    out = _read_gz(tmp_path / "m.gz")
    assert {e["args"]["Python id"] for e in out["traceEvents"] if e.get("cat") == "python_function"} == KEPT_IDS


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda t: t[: len(t) * 2 // 3], id="truncated"),
        pytest.param(lambda t: t.replace('"traceEvents"', '"events"'), id="no-traceEvents"),
        pytest.param(lambda t: t.replace('"ts": 21.0', '"ts": "21"'), id="bad-type"),
        pytest.param(lambda t: t.rstrip()[:-1] + "]", id="not-an-object"),
    ],
)
def test_a_trace_that_cannot_be_filtered_is_kept_as_recorded(tmp_path, damage):
    src = tmp_path / "h_1.00000003.pt.trace.json"
    text = damage(json.dumps({"traceEvents": _events(), "traceName": "x"}, indent=2))
    src.write_text(text)
    with pytest.raises(TraceFilterError):
        filter_trace(src, tmp_path / "x.gz")
    final = tmp_path / "h_1.00000003.pt.trace.json.gz"
    outcome = rundir.compress_trace(src, final)
    assert isinstance(outcome, str) and outcome
    assert gzip.decompress(final.read_bytes()).decode() == text
    assert not final.with_name(final.name + rundir.TMP_SUFFIX).exists()


def test_a_bug_in_the_filter_never_loses_the_trace(tmp_path, monkeypatch):
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("planted")

    monkeypatch.setattr(tracefilter, "filter_trace", broken)
    src = _write(tmp_path / "h_1.00000003.pt.trace.json", _events())
    text = src.read_text()
    outcomes: dict[str, object] = {}
    name = "h_1.00000003.pt.trace.json.gz"
    assert rundir.compress_traces(tmp_path, [name], outcomes) == [name]
    assert outcomes == {name: "RuntimeError: planted"}
    assert gzip.decompress((tmp_path / name).read_bytes()).decode() == text
    assert not src.exists()


def test_compress_traces_filters_and_reports(tmp_path):
    _write(tmp_path / "h_1.00000003.pt.trace.json", _events())
    _write(tmp_path / "h_1.00000310.pt.trace.json", [e for e in _events() if e.get("cat") != "python_function"])
    names = ["h_1.00000003.pt.trace.json.gz", "h_1.00000310.pt.trace.json.gz"]
    outcomes: dict[str, object] = {}
    assert rundir.compress_traces(tmp_path, names, outcomes) == names
    assert list(outcomes) == [names[0]]  # nothing to filter in a trace without Python calls
    r = outcomes[names[0]]
    assert isinstance(r, tracefilter.TraceFilterResult) and r.dropped_events == len(DROPPED_IDS)
    assert rundir.TRACE_FILTER_KEY not in _read_gz(tmp_path / names[1])


def test_python_id_set_dense_and_sparse():
    ids = tracefilter._IdSet()
    ids.add_many([1000, 1001, 1003])
    ids.add_many([990, 5000])  # an earlier id (the bitmap grows downwards) and a later one
    ids.freeze()
    assert all(i in ids for i in (990, 1000, 1001, 1003, 5000))
    assert not any(i in ids for i in (989, 991, 1002, 4999, 5001, None, "1000"))
    sparse = tracefilter._IdSet()
    sparse.add_many([7, 8])
    sparse.add_many([1 << 40])  # far away: a bitmap would be mostly zeros
    sparse.freeze()
    assert 7 in sparse and 8 in sparse and (1 << 40) in sparse and 9 not in sparse


def test_stack_bound_is_read_from_the_header(tmp_path):
    bound = {"python_calls_per_step": 120000, "budget": 400000, "steps_recorded": 3, "steps_scheduled": 5, "first_step": 3}
    src = _write(tmp_path / "t.json", _events(), **{rundir.TRACE_STACK_BOUND_KEY: bound})
    r = filter_trace(src, tmp_path / "t.gz")
    assert r.stack_bound == bound
    assert _read_gz(tmp_path / "t.gz")[rundir.TRACE_STACK_BOUND_KEY] == bound


def test_manifest_notes_say_what_was_left_out():
    from gpudoctor.collect.runner import _trace_notes, _with_trace_notes
    from gpudoctor.model import Collected

    bound = {"python_calls_per_step": 120214, "budget": 400000, "steps_recorded": 3, "steps_scheduled": 5, "first_step": 3}
    r = tracefilter.TraceFilterResult(360829, 360569, 28636.3, 10, 5, stack_bound=bound)
    notes = _trace_notes({"a.gz": r, "b.gz": "the last events do not decode"})
    assert notes[0] == (
        "the window from step 3 recorded 3 of 5 steps with stacks: its steps make 120,214 Python calls each, "
        "and a window records at most 400,000 with stacks"
    )
    rest = tracefilter.TraceFilterResult(360829, 360569, 28636.3, 10, 5,
                                         stack_bound={**bound, "rest_recorded": 1, "rest_first_step": 7})
    assert _trace_notes({"a.gz": rest})[0].endswith(
        "with stacks; 1 more from step 7 without stacks (a second trace, after one warm-up step)")
    assert "360,569 of 360,829" in notes[1] and "under 10 µs" in notes[1]
    assert notes[2] == "b.gz kept as recorded: the Python-call filter failed (the last events do not decode)"
    out = _with_trace_notes([Collected("torch.profiler", True, detail="1 window(s) recorded (CPU)")], notes)
    assert out[0].detail.startswith("1 window(s) recorded (CPU); the window from step 3")


@pytest.mark.slow
def test_python_heavy_steps_give_a_bounded_trace(tmp_path):
    """~120 000 Python calls a step: the window records 3 of its 5 steps with stacks (the
    budget) and, after one warm-up step, the rest in a plain window; the parent leaves the
    short calls out, and the trace still serves the analysis and torch-tb-profiler."""
    from gpudoctor.analysis import analyze_trace
    from gpudoctor.parse import load_inputs

    copy_script("python_heavy.py", tmp_path)
    schedule = ("--skip-first", "2", "--warmup", "1", "--active", "5", "--wait", "2", "--repeat", "1")
    proc = run_profile("--no-report", "--out", "runs", *schedule, "python_heavy.py", "--", "--steps", "12", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert len(m["traces"]) == 2
    trace, rest_trace = (run_dir / t for t in sorted(m["traces"]))
    assert not list(run_dir.glob("*.pt.trace.json"))  # no plain trace left behind
    with gzip.open(trace, "rt", encoding="utf-8") as f:
        out = json.load(f)
    bound = out[rundir.TRACE_STACK_BOUND_KEY]
    calls = bound["python_calls_per_step"]
    assert 100_000 < calls < 150_000, bound
    recorded = max(1, PYTHON_CALLS_BUDGET // calls)
    assert bound["steps_recorded"] == recorded < bound["steps_scheduled"] == 5 and bound["first_step"] == 3
    assert recorded <= 3, "the rest needs a warm-up step and one to record"
    rest = 5 - recorded - 1
    assert bound["rest_recorded"] == rest and bound["rest_first_step"] == 3 + recorded + 1
    # the recorded steps, the same in the traces and in steps.jsonl
    assert profiler_steps(trace) == list(range(3, 3 + recorded))
    assert profiler_steps(rest_trace) == list(range(4 + recorded, 8))
    assert rest_trace.name.endswith(f".{4 + recorded:08d}.pt.trace.json.gz")
    assert [s["index"] for s in steps(run_dir) if s["profiled"]] == [*range(3, 3 + recorded), *range(4 + recorded, 8)]
    assert [s["window"] for s in steps(run_dir)][2 : 3 + 5] == ["warmup"] + ["active"] * recorded + ["warmup"] + ["active"] * rest
    # the rest has no stacks: no Python frames
    with gzip.open(rest_trace, "rt", encoding="utf-8") as f:
        assert not any(e.get("cat") == "python_function" for e in json.load(f)["traceEvents"])
    # the short calls were left out: a few hundred Python frames stay of ~360 000
    note = out[rundir.TRACE_FILTER_KEY]
    assert note["dropped_events"] > 0.95 * calls * recorded
    assert 0 < note["kept_python_events"] < 5_000
    assert trace.stat().st_size < 200_000, trace.stat().st_size
    detail = collected(m, "torch.profiler")["detail"]
    assert f"recorded {recorded} of 5 steps" in detail and "Python calls under 10 µs" in detail
    # the analysis reads it: stacks, the Python time outside ops
    inputs = load_inputs([run_dir])
    metrics = analyze_trace(inputs.timelines[0], inputs.run)
    assert metrics.cpu.python_pct is not None and metrics.cpu.python_pct > 10
    # torch-tb-profiler parses it (Overview, Operator, Trace, Module views)
    tb = pytest.importorskip("torch_tb_profiler.profiler.run_generator")
    from torch_tb_profiler.profiler.data import RunProfileData

    data = RunProfileData.parse("w", "1", str(trace), str(tmp_path / "tbcache"))
    profile = tb.RunGenerator("w", "1", data).generate_run_profile()
    assert {v.display_name for v in profile.views} >= {"Overview", "Operator", "Trace"}
    assert data.steps_names == [str(i) for i in range(3, 3 + recorded)]
