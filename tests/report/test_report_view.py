"""``gpudoctor view``: which traces it serves, and a real TensorBoard with the profiler plugin."""

from __future__ import annotations

import gzip
import json
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpudoctor.errors import UsageError
from gpudoctor.view import (
    PLUGIN_PATTERN,
    TensorBoard,
    ViewTarget,
    check_port_free,
    find_traces,
    prepare_logdir,
)


def write_trace(path: Path, steps: int = 3) -> Path:
    """A tiny valid Kineto trace: ProfilerStep windows with two CPU ops each."""
    events = [{"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "args": {"name": "python"}}]
    t0 = 1_700_000_000_000
    for i in range(steps):
        s = t0 + i * 1000
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i + 1}", "pid": 100, "tid": 100, "ts": s, "dur": 900, "args": {}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 100, "ts": s + 100, "dur": 300, "args": {"External id": 2 * i + 1}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 100, "tid": 100, "ts": s + 500, "dur": 200, "args": {"External id": 2 * i + 2}},
        ]
    doc = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events, "displayTimeUnit": "ms"}
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh)
    return path


def make_run(root: Path, name: str = "train-20261121-101500", traces=("host_1234.pt.trace.json.gz",)) -> Path:
    run = root / name
    run.mkdir(parents=True)
    for t in traces:
        write_trace(run / t)
    manifest = {"schema_version": 1, "run_id": name, "traces": list(traces), "collected": [{"name": "torch.profiler", "ok": True}]}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


# --------------------------------------------------------------------------- finding traces


def test_run_directory_traces_come_from_the_manifest(tmp_path: Path) -> None:
    run = make_run(tmp_path, traces=("host_1.pt.trace.json.gz", "rank1/host_2.pt.trace.json.gz"))
    (run / "report.json").write_text("{}")
    target = find_traces(run)
    assert target.name == run.name
    assert [p.relative_to(run).as_posix() for p in target.traces] == ["host_1.pt.trace.json.gz", "rank1/host_2.pt.trace.json.gz"]


def test_a_folder_of_traces_and_a_single_trace(tmp_path: Path) -> None:
    write_trace(tmp_path / "traces" / "rank0.json.gz")
    write_trace(tmp_path / "traces" / "rank1.json")
    (tmp_path / "traces" / "notes.json").write_text('{"not": "a trace"}')
    target = find_traces(tmp_path / "traces")
    assert sorted(p.name for p in target.traces) == ["rank0.json.gz", "rank1.json"]
    single = find_traces(tmp_path / "traces" / "rank0.json.gz")
    assert single.name == "rank0" and len(single.traces) == 1


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "no such file or directory"),
        ("empty", "holds no Kineto traces"),
        ("no-trace-run", "has no Kineto trace to show (torch.profiler: no GPU and --no-profile)"),
        ("text-file", "is not a Kineto trace"),
        ("bad-manifest", "not readable JSON"),
    ],
)
def test_paths_without_traces_are_usage_errors(tmp_path: Path, setup: str, message: str) -> None:
    path = tmp_path / "x"
    if setup == "empty":
        path.mkdir()
    elif setup == "no-trace-run":
        path.mkdir()
        collected = [{"name": "torch.profiler", "ok": False, "reason": "no GPU and --no-profile"}]
        (path / "manifest.json").write_text(json.dumps({"traces": [], "collected": collected}))
    elif setup == "text-file":
        path = tmp_path / "train.py"
        path.write_text("print('hi')\n")
    elif setup == "bad-manifest":
        path.mkdir()
        (path / "manifest.json").write_text("{truncated")
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        find_traces(path)


def test_logdir_names_traces_as_the_plugin_expects(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "a" / "rank0.json.gz")
    b = write_trace(tmp_path / "b" / "rank0.json.gz")
    c = write_trace(tmp_path / "c" / "host_9.pt.trace.json")
    logdir = prepare_logdir(ViewTarget("my run/1", (a, b, c)), tmp_path / "tmp")
    (run,) = list(logdir.iterdir())
    assert run.name == "my_run_1"
    names = sorted(p.name for p in run.iterdir())
    assert names == ["b_rank0.pt.trace.json.gz", "host_9.pt.trace.json", "rank0.pt.trace.json.gz"]
    assert all(PLUGIN_PATTERN.match(n) for n in names)
    assert (run / "rank0.pt.trace.json.gz").resolve() == a.resolve()
    assert (run / "b_rank0.pt.trace.json.gz").read_bytes() == b.read_bytes()


def test_a_port_in_use_is_a_usage_error() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(UsageError, match=f"port {port} on 127.0.0.1 is in use"):
            check_port_free(port)
    with pytest.raises(UsageError, match="between 1 and 65535"):
        check_port_free(70000)


# --------------------------------------------------------------------------- a real TensorBoard


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _wait_for_run(base: str, name: str, timeout_s: float = 90.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    runs: list[str] = []
    while time.monotonic() < deadline:
        runs = _get_json(f"{base}data/plugin/pytorch_profiler/runs")["runs"]
        if name in runs:
            return runs
        time.sleep(0.5)
    raise AssertionError(f"the plugin did not list {name!r} within {timeout_s} s (runs: {runs})")


def _closed(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
def test_view_serves_the_run_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    run = make_run(tmp_path / "gpudoctor-runs")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpudoctor", "view", str(run)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stderr], daemon=True).start()
    seen: list[str] = []
    url = ""
    try:
        deadline = time.monotonic() + 150
        while not url and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert proc.poll() is None, f"gpudoctor view exited early: {seen}"
                continue
            seen.append(line)
            if "http://127.0.0.1:" in line:
                url = line.split("TensorBoard, PyTorch profiler plugin: ", 1)[1].split("#", 1)[0].strip()
        assert url, f"no URL printed: {seen}"
        assert url.endswith("/") and url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200
        assert _wait_for_run(url, run.name) == [run.name]
        views = _get_json(f"{url}data/plugin/pytorch_profiler/views?run={run.name}")
        assert "Overview" in views and "Trace" in views
        workers = _get_json(f"{url}data/plugin/pytorch_profiler/workers?run={run.name}&view=Overview")
        assert workers == ["host_1234"]
        time.sleep(0.5)
        text = "".join(seen) + "".join(lines.queue)
        assert "ui.perfetto.dev" in text
        assert str((run / "host_1234.pt.trace.json.gz").resolve()) in text
        proc.send_signal(signal.SIGINT)
        # 130 as for every command (tests/faults/test_faults_signals.py); TensorBoard gets 10 s to stop, then SIGKILL:
        # slack for a loaded machine
        assert proc.wait(timeout=60) == 130
        port = int(url.rsplit(":", 1)[1].strip("/"))
        assert _closed(port), "TensorBoard still answers after Ctrl-C"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.slow
def test_tensorboard_lists_a_trace_with_a_foreign_name(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "colleague" / "rank0.json.gz")
    target = find_traces(trace)
    with tempfile.TemporaryDirectory() as tmp:
        tb = TensorBoard(prepare_logdir(target, Path(tmp)), 0, Path(tmp) / "tb.log")
        try:
            url = tb.start()
            assert _wait_for_run(url, "rank0") == ["rank0"]
            assert _get_json(f"{url}data/plugin/pytorch_profiler/workers?run=rank0&view=Overview") == ["rank0"]
        finally:
            tb.stop()
        assert tb.proc is not None and tb.proc.poll() is not None
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)


# --------------------------------------------------------------------------- what view says before the URL


def _with_report(run: Path, summary: list) -> Path:
    (run / "report.json").write_text(json.dumps({"summary": summary}), encoding="utf-8")
    return run


def test_view_says_what_the_plugin_needs_offline_and_why_its_figures_differ(tmp_path: Path) -> None:
    """Issue 41 (8): the plugin's Overview spun forever without internet access (Google Charts) and showed
    the DataLoader at 0 µs where gpudoctor said 29.3%; `view` said neither. Now it says both, with the
    run's own figure from its report."""
    from gpudoctor.view import plugin_notes

    run = _with_report(make_run(tmp_path), [
        {"key": "step_time_median", "label": "step time (median)", "value": 83.0, "unit": "ms", "window": ""},
        {"key": "data_wait_share", "label": "waiting for data", "value": 29.3, "unit": "%",
         "window": "9 unprofiled steady steps"},
    ])
    text = "\n".join(plugin_notes(find_traces(run)))
    assert "https://www.gstatic.com/charts/loader.js" in text and "without internet access" in text
    assert "Trace view" in text and "cdnjs.cloudflare.com" in text
    assert f"gpudoctor report {run} -o report.html" in text and "fetches nothing" in text
    assert "enumerate(DataLoader)#" in text and "inside them" in text and "on every step" in text
    assert "waiting for data 29.3% of step time (9 unprofiled steady steps)." in text


@pytest.mark.parametrize("summary", [
    None,  # no report.json: analyze computes it
    [{"key": "data_wait_share", "value": "NaN", "window": "x"}],
    [{"key": "data_wait_share", "value": 10**400, "window": "x"}],
    [{"key": "data_wait_share", "value": 250.0, "window": "x"}],
    "not a list",
])
def test_a_missing_or_hostile_figure_is_not_shown(summary, tmp_path: Path) -> None:
    from gpudoctor.view import plugin_notes

    run = make_run(tmp_path)
    if summary is not None:
        _with_report(run, summary)
    last = plugin_notes(find_traces(run))[-1]
    assert last == f"gpudoctor's figure for this run: not in its report (run gpudoctor analyze {run} to compute it)."


def test_a_window_with_control_characters_is_escaped(tmp_path: Path) -> None:
    from gpudoctor.view import plugin_notes

    run = _with_report(make_run(tmp_path), [{"key": "data_wait_share", "value": 5, "window": "a\x1b]0;PWN\x07"}])
    last = plugin_notes(find_traces(run))[-1]
    assert "\x1b" not in last and "\x07" not in last and "5.0% of step time (a\\x1b]0;PWN\\x07)" in last


def test_a_trace_file_gets_the_notes_without_a_run_figure(tmp_path: Path) -> None:
    from gpudoctor.view import plugin_notes

    lines = plugin_notes(find_traces(write_trace(tmp_path / "x.pt.trace.json.gz")))
    assert len(lines) == 2 and "gpudoctor report RUN -o report.html" in lines[0]


def test_the_notes_are_printed_before_the_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudoctor import view

    monkeypatch.setattr(view.TensorBoard, "start", lambda self, timeout_s=0, on_started=None: "http://127.0.0.1:1/")

    def stopped(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(view.TensorBoard, "wait", stopped)
    said: list[str] = []
    target = find_traces(make_run(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        view._serve(target, 0, said.append)
    url = next(i for i, x in enumerate(said) if x.startswith("TensorBoard, PyTorch profiler plugin: http"))
    notes = view.plugin_notes(target)
    assert said[url - len(notes):url] == notes


def test_the_notes_hold_for_the_installed_plugin() -> None:
    """What the notes say about torch-tb-profiler, checked against its installed source."""
    plugin = pytest.importorskip("torch_tb_profiler")
    from gpudoctor.view import GOOGLE_CHARTS_URL, POLYFILL_HOST

    root = Path(plugin.__file__).parent
    index = (root / "static" / "index.html").read_text(encoding="utf-8", errors="replace")
    assert GOOGLE_CHARTS_URL in index and "google.charts.load" in index
    assert POLYFILL_HOST in (root / "static" / "trace_embedding.html").read_text(encoding="utf-8")
    parser = (root / "profiler" / "event_parser.py").read_text(encoding="utf-8")
    # the DataLoader role: these ops alone (and DataPipe's), within the trace's ProfilerStep ranges
    assert "event.name.startswith('enumerate(DataLoader)#') and event.name.endswith('.__next__')" in parser
    assert "self.role_ranges[ProfileRole.DataLoader].append" in parser
