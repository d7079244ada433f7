"""Run directories (complete, crashed, damaged), folders of traces, and load_inputs dispatch."""

from __future__ import annotations

import cProfile
import gzip
import json
from pathlib import Path

import pytest

from gpudoctor.errors import RunDirError, TraceFormatError, UsageError
from gpudoctor.model.run import (
    SCHEMA_VERSION,
    Device,
    GpuSample,
    Manifest,
    ProcessSample,
    RunStatus,
    Settings,
    StepRecord,
)
from gpudoctor.parse import load_inputs
from gpudoctor.parse.rundir import read_run_dir


def trace_text(rank: int | None = None, kernels: int = 2) -> str:
    ev = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 100 + 10 * i, "dur": 5,
           "args": {"device": 0, "stream": 7, "correlation": i}} for i in range(kernels)]
    obj: dict = {"schemaVersion": 1}
    if rank is not None:
        obj["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    obj["traceEvents"] = ev
    return json.dumps(obj, indent=1)


def manifest(**kw) -> Manifest:
    base = dict(
        schema_version=SCHEMA_VERSION, gpudoctor_version="0.1.0", run_id="train-1", command=("train.py",),
        script="/w/train.py", module=None, argv=("train.py",), cwd="/w", started_at="2026-01-01T00:00:00+00:00",
        started_at_unix_ns=1, status=RunStatus.COMPLETED, traces=("traces/host.pt.trace.json.gz",),
        devices=(Device(index=0, name="NVIDIA A100", total_memory_bytes=80, compute_capability="8.0"),),
    )
    base.update(kw)
    return Manifest(**base)


def make_run(d: Path, *, m: Manifest | None = None, rank: int | None = None, trace: bool = True) -> Path:
    d.mkdir(parents=True)
    m = m or manifest()
    (d / "manifest.json").write_text(json.dumps({**m.to_dict(), "field_from_the_future": 1}))
    (d / "settings.json").write_text(json.dumps({**Settings(device_type="cuda", num_threads=4).to_dict(), "new": 2}))
    steps = [StepRecord(index=i, start_ns=i * 100, wall_ns=100, data_wait_ns=10).to_dict() for i in range(3)]
    (d / "steps.jsonl").write_text("\n".join(json.dumps(s) for s in steps) + "\n")
    samples = [
        {"kind": "meta", "interval_ms": 200, "system_cpu_count": 8},
        {"kind": "process", **ProcessSample(t_ns=1, pid=5, role="main", cpu_pct=99.0, rss_bytes=10, threads=3).to_dict()},
        {"kind": "gpu", **GpuSample(t_ns=1, index=0, util_pct=50.0).to_dict()},
    ]
    (d / "samples.jsonl").write_text("\n".join(json.dumps(s) for s in samples) + "\n")
    prof = cProfile.Profile()
    prof.enable()
    sum(i * i for i in range(1000))
    prof.disable()
    prof.dump_stats(str(d / "profile.pstats"))
    if trace:
        (d / "traces").mkdir()
        with gzip.open(d / "traces" / "host.pt.trace.json.gz", "wt") as fh:
            fh.write(trace_text(rank))
    return d


def test_complete_run_directory(tmp_path):
    d = make_run(tmp_path / "run")
    loaded = load_inputs([d])
    run = loaded.run
    assert run.source == str(d) and run.notes == ()
    assert run.manifest.run_id == "train-1" and run.manifest.devices[0].compute_capability == "8.0"
    assert run.settings.device_type == "cuda" and run.settings.num_threads == 4
    assert [s.index for s in run.steps] == [0, 1, 2] and run.steps[0].data_wait_ns == 10
    assert run.samples.interval_ms == 200 and run.samples.system_cpu_count == 8
    assert run.samples.process[0].role == "main" and run.samples.gpu[0].util_pct == 50.0
    assert run.pstats and run.pstats == tuple(sorted(run.pstats, key=lambda e: -e.cumtime_s))
    assert run.metrics == ()
    (tl,) = loaded.timelines
    assert len(tl.device) == 2 and tl.path.endswith("host.pt.trace.json.gz")


def test_crashed_run_keeps_what_is_there_and_says_what_is_missing(tmp_path):
    d = make_run(tmp_path / "run", m=manifest(status=RunStatus.RUNNING, traces=()), trace=False)
    (d / "samples.jsonl").unlink()
    (d / "profile.pstats").unlink()
    with open(d / "steps.jsonl", "a") as fh:
        fh.write('{"index": 3, "start_ns": 3')  # the last line cut mid-write
    loaded = load_inputs([d])
    notes = " | ".join(loaded.run.notes)
    assert "running" in notes and "samples.jsonl is missing" in notes and "profile.pstats is missing" in notes
    assert "last line is incomplete" in notes and "no Kineto trace" in notes
    assert len(loaded.run.steps) == 3 and loaded.timelines == ()


def test_listed_trace_missing_and_corrupt_trace_are_notes(tmp_path):
    d = make_run(tmp_path / "run", m=manifest(traces=("traces/host.pt.trace.json.gz", "traces/gone.pt.trace.json.gz")))
    loaded = load_inputs([d])
    assert any("gone.pt.trace.json.gz" in n and "missing" in n for n in loaded.run.notes)
    (d / "traces" / "host.pt.trace.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    loaded = load_inputs([d])
    assert loaded.timelines == () and any("trace skipped" in n for n in loaded.run.notes)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps({"schema_version": SCHEMA_VERSION + 1}), "newer gpudoctor"),
        (json.dumps({"schema_version": SCHEMA_VERSION}), "incomplete or malformed"),
    ],
)
def test_damaged_manifest_raises(tmp_path, content, match):
    d = make_run(tmp_path / "run")
    (d / "manifest.json").write_text(content)
    with pytest.raises(RunDirError, match=match):
        read_run_dir(d)


def test_missing_manifest_is_a_note(tmp_path):
    d = make_run(tmp_path / "run")
    (d / "manifest.json").unlink()
    run, traces = read_run_dir(d)
    assert run.manifest is None and "manifest.json is missing" in run.notes[0]
    assert traces == [d / "traces" / "host.pt.trace.json.gz"]  # found by name


def test_folder_of_traces_one_per_rank_ordered_by_rank(tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    (folder / "b.json").write_text(trace_text(rank=0))
    with gzip.open(folder / "a.json.gz", "wt") as fh:
        fh.write(trace_text(rank=1))
    (folder / "notes.txt").write_text("not a trace")
    loaded = load_inputs([folder])
    assert [t.info.rank for t in loaded.timelines] == [0, 1]
    assert loaded.run.manifest is None and loaded.run.source == str(folder)


def test_several_run_directories_merge_into_one_job(tmp_path):
    a = make_run(tmp_path / "node0", m=manifest(rank=0, world_size=2), rank=0)
    b = make_run(tmp_path / "node1", m=manifest(rank=1, world_size=2, run_id="train-2"), rank=1)
    loaded = load_inputs([b, a])
    assert loaded.run.manifest.rank == 0
    assert len(loaded.run.steps) == 6 and len(loaded.run.samples.process) == 2
    assert [t.info.rank for t in loaded.timelines] == [0, 1]
    assert "2 run directories merged" in loaded.run.notes[-1]


def test_single_trace_file_and_usage_errors(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(trace_text())
    loaded = load_inputs([p])
    assert len(loaded.timelines) == 1 and loaded.run.manifest is None
    with pytest.raises(UsageError, match="no such file or directory") as err:
        load_inputs([tmp_path / "nope.json"])
    assert "\n" not in str(err.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="no Kineto trace"):
        load_inputs([empty])
    with pytest.raises(UsageError):
        load_inputs([])
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X"}, ')
    with pytest.raises(TraceFormatError, match="bad.json"):
        load_inputs([bad])


# --------------------------------------------------------------------------- untrusted run directories


def test_absurd_step_and_sample_values_are_dropped_with_a_note(tmp_path):
    """"p90 16666666666666665984.0 min", "waits inf% of step time": values no step can have were reported
    as facts. Dropped with a note, as the trace reader drops impossible events."""
    d = make_run(tmp_path / "run", m=manifest(duration_s=10.0))
    good = [StepRecord(index=i, start_ns=i * 100, wall_ns=100, data_wait_ns=10).to_dict() for i in range(3)]
    bad = [
        {**good[0], "index": 3, "wall_ns": 10**21},  # longer than the 10 s run
        {**good[0], "index": 4, "wall_ns": -5},
        {**good[0], "index": 5, "wall_ns": 0},
        {**good[0], "index": 6, "data_wait_ns": 500},  # waits longer than the step
    ]
    lines = [json.dumps(s) for s in good + bad] + ['{"index": 7, "start_ns": 0, "wall_ns": 100, "data_wait_ns": Infinity}']
    (d / "steps.jsonl").write_text("\n".join(lines) + "\n")
    samples = [
        {"kind": "meta", "interval_ms": 200, "system_cpu_count": 8},
        {"kind": "process", **ProcessSample(t_ns=1, pid=5, role="main", cpu_pct=99.0, rss_bytes=10, threads=3).to_dict()},
        {"kind": "process", **ProcessSample(t_ns=2, pid=5, role="main", cpu_pct=-3.0, rss_bytes=10, threads=3).to_dict()},
        {"kind": "gpu", **GpuSample(t_ns=1, index=0, util_pct=50.0).to_dict()},
        {"kind": "gpu", **GpuSample(t_ns=2, index=0, util_pct=250.0).to_dict()},
    ]
    (d / "samples.jsonl").write_text("\n".join(json.dumps(s) for s in samples) + "\n")
    run, _ = read_run_dir(d)
    assert [s.index for s in run.steps] == [0, 1, 2]
    assert len(run.samples.process) == 1 and len(run.samples.gpu) == 1
    notes = " ".join(run.notes)
    assert "5 record(s) with values no step can have" in notes
    assert "2 sample(s) with values no sample can have" in notes


@pytest.mark.parametrize("name", ["steps.jsonl", "settings.json", "samples.jsonl", "profile.pstats"])
def test_a_fixed_name_file_that_leads_out_of_the_run_is_not_read(name, tmp_path):
    d = make_run(tmp_path / "run")
    outside = tmp_path / f"elsewhere-{name}"
    (d / name).rename(outside)
    (d / name).symlink_to(outside)
    run, _ = read_run_dir(d)
    assert any(name in n and "leads out of the run directory" in n for n in run.notes), run.notes
    if name == "steps.jsonl":
        assert run.steps == ()
    if name == "settings.json":
        assert run.settings is None
    if name == "samples.jsonl":
        assert run.samples is None
    if name == "profile.pstats":
        assert run.pstats == ()


def test_a_manifest_that_leads_out_of_the_run_is_refused(tmp_path):
    d = make_run(tmp_path / "run")
    outside = tmp_path / "elsewhere.json"
    (d / "manifest.json").rename(outside)
    (d / "manifest.json").symlink_to(outside)
    with pytest.raises(RunDirError, match="not a regular file inside the run directory"):
        read_run_dir(d)
