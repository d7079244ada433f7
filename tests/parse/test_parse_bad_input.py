"""Bad input to ``gpudoctor analyze``: not a trace is one line and exit 2; malformed events
inside a real trace are counted, left out and reported; no numpy warning reaches the terminal."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

NOT_TRACES = {
    "array_of_numbers": ("[1, 2, 3]", "none of its 3 events is usable (3 not JSON objects)"),
    "empty_events": ('{"traceEvents": []}', "traceEvents is empty"),
    "no_events_key": ('{"schemaVersion": 1, "deviceProperties": []}', "no traceEvents array"),
    "string_timestamps": (json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": "12.5", "dur": "3"},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": "10", "dur": 2}]}),
        "none of its 2 events is usable (2 ts not a number)"),
    "no_durations": ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1}]}',
                     "none of its 1 events is usable (1 dur missing)"),
    "metadata_only": ('{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {}}]}',
                      'none of its 1 events is a complete CPU or GPU event (ph "X" with a Kineto "cat")'),
    "no_category": ('{"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": 1}]}',
                    'none of its 1 events is a complete CPU or GPU event (ph "X" with a Kineto "cat")'),
    "empty_file": ("", "the file is empty"),
    "not_json": ("<html>", "does not start with a JSON object or array"),
    "minified_truncated": ('{"traceEvents":[{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":2},{"ph":"X","ca',
                           "truncated"),
}


def gpudoctor(*args: str) -> subprocess.CompletedProcess:
    # -W error: a numpy RuntimeWarning would become an exception (exit 4), not pass unseen
    return subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "gpudoctor", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("case", sorted(NOT_TRACES))
def test_not_a_trace_is_one_line_and_exit_2(tmp_path, case, gz):
    text, expected = NOT_TRACES[case]
    path = tmp_path / (case + ".json" + (".gz" if gz else ""))
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    proc = gpudoctor("analyze", str(path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpudoctor: error: {path}: not a readable Kineto trace")
    assert expected in lines[0]


def trace_with_malformed_events() -> dict:
    ev = []
    t = 1000.0
    for i in range(5):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
                   "ts": t, "dur": 90})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 1,
                   "dur": 4, "args": {"correlation": i + 1}})
        ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": t + 10, "dur": 50,
                   "args": {"device": 0, "stream": 7, "correlation": i + 1}})
        t += 100
    ev += [{"ph": "X", "cat": "kernel", "name": "bad", "pid": 0, "tid": 7, "ts": "1010", "dur": 50},
           {"ph": "X", "cat": "kernel", "name": "bad", "pid": 0, "tid": 7, "ts": 1020, "dur": -50},
           {"ph": "X", "cat": "kernel", "name": "bad", "pid": 0, "tid": 7, "ts": 1030},
           42]
    return {"traceEvents": ev}


@pytest.mark.parametrize("minified", [False, True])
def test_malformed_events_are_left_out_and_reported(tmp_path, minified):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace_with_malformed_events(), separators=(",", ":") if minified else None))
    proc = gpudoctor("analyze", "--format", "json", str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    report = json.loads(proc.stdout)
    note = ("4 malformed event(s) dropped, not analyzed: 1 dur missing, 1 dur negative, "
            "1 not a JSON object, 1 ts not a number")
    assert f"{path}: {note}" in report["run"]["notes"]
    assert note in report["run"]["metrics"][0]["notes"]
    assert report["run"]["metrics"][0]["kernels"]["count"] == 5  # the 3 bad kernels are not in it
    text = gpudoctor("analyze", str(path))
    assert text.returncode == 0 and "4 malformed event(s) dropped" in text.stdout


def test_odd_but_valid_traces_raise_no_numpy_warning(tmp_path):
    cases = {
        "one_kernel": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 5, "dur": 0}],
        "zero_step": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
                       "ts": 5, "dur": 0}],
        "memory_only": [{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 5,
                         "args": {"Total Allocated": 1, "Total Reserved": 2, "Bytes": 1, "Device Id": 0,
                                  "Device Type": 1}}],
        "empty_copy": [{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0,
                        "tid": 7, "ts": 5, "dur": 0, "args": {"bytes": 0}}],
    }
    for name, events in cases.items():
        path = Path(tmp_path / f"{name}.json")
        path.write_text(json.dumps({"traceEvents": events}))
        proc = gpudoctor("analyze", str(path))
        assert proc.returncode == 0, (name, proc.stderr)
        assert proc.stderr == "", (name, proc.stderr)
