"""One fast path for every layout: the same Timeline as a ``json.load`` of the file.

The reference reads the whole file with the standard library and hands every event to
the column builder in one batch (no cutting at all); the fast path cuts the text into
pieces at ``}`` ``,`` ``{`` candidates, in one process or in parts. They must agree
exactly, whatever the layout (Kineto's blocks, one event per line, pretty, minified,
events first, a bare array, gzip), whatever the piece size, and whatever the strings
hold (``"},{"`` in names and args, nested arrays of objects, escaped quotes).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpudoctor.errors import TraceFormatError
from gpudoctor.model.trace import Timeline
from gpudoctor.parse import load_trace
from gpudoctor.parse.columns import COLUMNS, ColumnBuilder, Header
from gpudoctor.parse.kineto import END, STOPPED, UNPROVEN, read_part, read_trace_chunked
from gpudoctor.parse.parallel import read_split_at, read_trace_split

LAYOUTS = ("kineto", "lines", "pretty", "minified", "events_first", "array")

NASTY = [
    'void f<{lambda()#1}>(int, {lambda(int)#2})',
    'x"},{"ph": "X", "cat": "kernel", "name": "fake", "ts": 1, "dur": 1}, {"',
    '},{',
    '}, {',
    '}\\n,\\n{',
    '"traceEvents": [',
    'ünïcødé },{ ✓',
    '\\"},{\\"',
]


def nasty_events(n: int = 40) -> list[dict]:
    """Events whose strings and args look like event boundaries."""
    ev: list[dict] = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "ts": 0, "args": {"name": "py"}}]
    t = 1_000_000.0
    for i in range(n):
        nasty = NASTY[i % len(NASTY)]
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
                   "ts": t, "dur": 500.5, "args": {"External id": i, "note": nasty}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{nasty}", "pid": 1, "tid": 1, "ts": t + 1.25,
                   "dur": 40.0, "args": {"External id": 1000 + i, "Sequence number": i,
                                         "Input Dims": [[64, i % 3], []], "Input type": ["float", nasty],
                                         "nested": [{"a": nasty}, {"b": [{"c": 1}, {"d": "},{"}]}]}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                   "ts": t + 2, "dur": 5, "args": {"External id": 1000 + i, "correlation": 50 + i}})
        ev.append({"ph": "s", "id": 50 + i, "pid": 1, "tid": 1, "ts": t + 2, "cat": "ac2g", "name": "ac2g"})
        ev.append({"ph": "X", "cat": "kernel", "name": nasty + str(i % 5), "pid": 0, "tid": 7, "ts": t + 10.5,
                   "dur": 20.25, "args": {"device": 0, "stream": 7, "correlation": 50 + i, "External id": 1000 + i,
                                          "grid": [1, 1, 1], "blob": {"k": [{"x": "}, {"}]}}})
        ev.append({"ph": "f", "id": 50 + i, "pid": 0, "tid": 7, "ts": t + 10.5, "cat": "ac2g", "name": "ac2g",
                   "bp": "e"})
        ev.append({"ph": "X", "cat": "python_function", "name": f"train.py({i}): step {nasty}", "pid": 1,
                   "tid": 2, "ts": t, "dur": 400, "args": {"Python id": i}})
        ev.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1,
                   "ts": t + 3, "args": {"Total Reserved": 4096, "Total Allocated": 1024 + i, "Bytes": 8,
                                         "Device Id": 0, "Device Type": 1}})
        t += 600
    return ev


HEADER = {"schemaVersion": 1,
          "deviceProperties": [{"id": 0, "name": "GPU A", "totalGlobalMem": 1 << 34, "computeMajor": 8,
                                "computeMinor": 0}, {"id": 1, "name": "GPU }, {B", "totalGlobalMem": 1 << 34}],
          "distributedInfo": {"backend": "nccl", "rank": 2, "world_size": 4}}
TAIL = {"traceName": "t },{ x", "displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000}


def serialize(events: list[dict], layout: str, header: dict = HEADER, tail: dict = TAIL) -> str:
    if layout == "kineto":  # Kineto's ChromeTraceLogger: header lines, one indented block per event
        head = "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in header.items())
        blocks = ",\n".join("  " + json.dumps(e, indent=4).replace("\n", "\n  ") for e in events)
        rest = "".join(f",\n  {json.dumps(k)}: {json.dumps(v)}" for k, v in tail.items())
        return "{\n" + head + '  "traceEvents": [\n' + blocks + "\n  ]" + rest + "\n}\n"
    if layout == "lines":  # one event per line
        head = "".join(f"{json.dumps(k)}: {json.dumps(v)}, " for k, v in header.items())
        lines = ",\n".join(json.dumps(e) for e in events)
        rest = "".join(f", {json.dumps(k)}: {json.dumps(v)}" for k, v in tail.items())
        return "{" + head + '"traceEvents": [\n' + lines + "\n]" + rest + "}"
    if layout == "pretty":
        return json.dumps({**header, "traceEvents": events, **tail}, indent=2)
    if layout == "minified":
        return json.dumps({**header, "traceEvents": events, **tail}, separators=(",", ":"))
    if layout == "events_first":
        return json.dumps({"traceEvents": events, **header, **tail}, indent=1)
    if layout == "array":
        return json.dumps(events)
    raise AssertionError(layout)


def write(path: Path, text: str, gz: bool) -> Path:
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def reference(path: Path) -> Timeline:
    """``json.load`` of the whole file, every event handed to the builder in one batch."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        obj = json.load(fh)
    events = obj if isinstance(obj, list) else obj["traceEvents"]
    header = {} if isinstance(obj, list) else {k: v for k, v in obj.items() if k != "traceEvents"}
    b = ColumnBuilder(str(path), parser="chunked", keep_flows=True)
    b.add_dicts(events)
    return b.build(Header.from_json(header))


def same(a: Timeline, b: Timeline) -> bool:
    return dataclasses.replace(a, path="") == dataclasses.replace(b, path="")


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_gives_the_reference_timeline(tmp_path, layout, gz):
    ev = nasty_events()
    p = write(tmp_path / f"t.{layout}.json", serialize(ev, layout), gz)
    ref = reference(p)
    assert len(ref.host) == 40 * 4 and len(ref.device) == 40 and len(ref.memory) == 40
    assert ref.info.flow_count == 80 and ref.info.event_count == len(ev)
    for chunk in (64, 333, 1000, 4096, 1 << 22):  # many pieces, cut at candidates inside strings too
        tl = read_trace_chunked(p, chunk_bytes=chunk)
        assert same(tl, ref), (layout, chunk)
    if layout != "array":
        assert ref.info.rank == 2 and ref.info.trace_name == TAIL["traceName"]
        assert [d.name for d in ref.info.devices] == ["GPU A", "GPU }, {B"]
    kernels = {ref.names[i] for i in ref.device.name}
    assert any("},{" in k for k in kernels)


def test_every_layout_gives_the_same_timeline(tmp_path):
    ev = nasty_events(25)
    first = None
    for layout in ("kineto", "lines", "pretty", "minified", "events_first"):
        tl = load_trace(write(tmp_path / f"{layout}.json", serialize(ev, layout), False))
        if first is None:
            first = tl
        assert same(tl, first), layout


def split_targets(p: Path, needle: bytes, count: int) -> list[int]:
    data = gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
    out, pos = [], 0
    while len(out) < count:
        pos = data.find(needle, pos + 1)
        assert pos > 0
        out.append(pos)
    return out


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("layout", ["kineto", "minified", "lines"])
def test_parts_join_into_the_same_timeline(tmp_path, layout, gz):
    p = write(tmp_path / f"t.{layout}.json", serialize(nasty_events(60), layout), gz)
    ref = read_trace_chunked(p)
    size = len(gzip.decompress(p.read_bytes())) if gz else p.stat().st_size
    with ThreadPoolExecutor(2) as ex:
        for parts in (2, 3, 5):
            targets = [size * k // (parts + 1) for k in range(1, parts)]
            tl = read_split_at(p, targets, ex, chunk_bytes=500)
            assert same(tl, ref), (parts, targets)
        # a target right at a "},{" inside a name: the part cannot prove its start, the file is read again
        inside = split_targets(p, b'x\\"},{\\"ph', 1)
        first = read_part(p, None, inside[0] + 2, chunk_bytes=500)
        assert first.ended == UNPROVEN
        assert same(read_split_at(p, [inside[0] + 2], ex, chunk_bytes=500), ref)
        # past the end of the array (in the tail): read again too
        assert same(read_split_at(p, [size - 5], ex, chunk_bytes=500), ref)


def test_parts_of_a_large_file_through_processes(tmp_path):
    from gpudoctor.pipeline import _pool

    p = write(tmp_path / "t.json", serialize(nasty_events(400), "minified"), False)
    ref = read_trace_chunked(p)
    with _pool(2) as ex:
        assert same(read_trace_split(p, 3, ex, chunk_bytes=4096), ref)


def plain_events(n: int) -> list[dict]:
    """Ops, launches and kernels with nothing in their strings that looks like an event boundary
    (every part of a file of them proves its start)."""
    ev: list[dict] = []
    for i in range(n):
        t = 1_000_000.0 + 50 * i
        ev.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 1, "ts": t, "dur": 9.5,
                   "args": {"External id": i, "Input Dims": [[8, i % 3]], "Input type": ["float"]}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 1,
                   "dur": 4, "args": {"External id": i, "correlation": i}})
        ev.append({"ph": "X", "cat": "kernel", "name": f"kernel{i % 5}", "pid": 0, "tid": 7, "ts": t + 8,
                   "dur": 20.25, "args": {"device": 0, "stream": 7, "correlation": i, "External id": i}})
    return ev


def _count_joins(monkeypatch) -> list[str]:
    """Record how each part joined came back: "file" (its columns through its file) or "pickled"."""
    seen: list[str] = []
    real_unspill, real_extend = ColumnBuilder.unspill, ColumnBuilder.extend

    def unspill(self, fd):
        if self.spilled is not None:
            seen.append("file")
        real_unspill(self, fd)

    def extend(self, other):
        if not seen or seen[-1] != "file":
            seen.append("pickled")
        else:
            seen[-1] = "file joined"
        real_extend(self, other)

    monkeypatch.setattr(ColumnBuilder, "unspill", unspill)
    monkeypatch.setattr(ColumnBuilder, "extend", extend)
    return seen


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="in-memory files are Linux's")
def test_parts_come_back_through_a_file_the_readers_inherit(tmp_path, monkeypatch):
    from gpudoctor.pipeline import _pool

    p = write(tmp_path / "t.json", serialize(plain_events(2000), "minified"), False)
    ref = read_trace_chunked(p)
    seen = _count_joins(monkeypatch)
    with _pool(2) as ex:  # its processes are forked at the first part: the files exist by then
        assert same(read_trace_split(p, 3, ex, chunk_bytes=4096), ref)
    assert seen == ["file joined", "file joined"]


def test_parts_come_back_pickled_from_readers_started_before_their_files(tmp_path, monkeypatch):
    # a descriptor number in a process forked earlier is some other file, or none: never written to
    from gpudoctor.pipeline import _pool

    p = write(tmp_path / "t.json", serialize(plain_events(2000), "minified"), False)
    ref = read_trace_chunked(p)
    seen = _count_joins(monkeypatch)
    with _pool(2) as ex:
        assert sorted(ex.map(abs, [-1, -2])) == [1, 2]  # both processes run, before any file exists
        assert same(read_trace_split(p, 3, ex, chunk_bytes=4096), ref)
    assert seen == ["pickled", "pickled"]


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="in-memory files are Linux's")
def test_a_part_whose_file_cannot_be_written_comes_back_pickled(tmp_path, monkeypatch):
    from gpudoctor.pipeline import _pool

    def full(self, fd):
        raise OSError(28, "No space left on device")

    p = write(tmp_path / "t.json", serialize(plain_events(2000), "minified"), False)
    ref = read_trace_chunked(p)
    seen = _count_joins(monkeypatch)
    monkeypatch.setattr(ColumnBuilder, "spill", full)  # the readers are forked with it
    with _pool(2) as ex:
        assert same(read_trace_split(p, 3, ex, chunk_bytes=4096), ref)
    assert seen == ["pickled", "pickled"]


def test_spilled_columns_read_back_whole(tmp_path):
    p = write(tmp_path / "t.json", serialize(nasty_events(60), "lines"), False)
    part = read_part(p, None, None)
    b = part.builder
    before = {name: bytes(getattr(b, name)) for name in COLUMNS}
    fd = os.open(tmp_path / "columns", os.O_RDWR | os.O_CREAT)
    try:
        b.spill(fd)
        assert b.spilled is not None and not any(len(getattr(b, name)) for name in COLUMNS)
        b.unspill(fd)
    finally:
        os.close(fd)
    assert b.spilled is None and {name: bytes(getattr(b, name)) for name in COLUMNS} == before
    assert same(b.build(Header.from_json({**part.header, **part.tail})), read_trace_chunked(p))


def test_a_part_proves_its_end(tmp_path):
    p = write(tmp_path / "t.json", serialize(nasty_events(20), "lines"), False)
    size = p.stat().st_size
    first = read_part(p, None, size // 2)
    second = read_part(p, size // 2, None)
    assert first.ended == STOPPED and second.started and second.ended == END
    assert first.builder.event_count + second.builder.event_count == len(nasty_events(20))
    assert second.tail["traceName"] == TAIL["traceName"] and first.header["distributedInfo"]["rank"] == 2


def malformed_events() -> list:
    ev = nasty_events(6)
    ev += [
        {"ph": "X", "cat": "kernel", "name": "string ts", "pid": 0, "tid": 7, "ts": "12", "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": "no ts", "pid": 1, "tid": 1, "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": "no dur", "pid": 1, "tid": 1, "ts": 5},
        {"ph": "X", "cat": "kernel", "name": "negative", "pid": 0, "tid": 7, "ts": 5, "dur": -1},
        {"ph": "X", "cat": "cuda_runtime", "name": "null ts", "pid": 1, "tid": 1, "ts": None, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "far", "pid": 1, "tid": 1, "ts": 1e300, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "bool", "pid": 1, "tid": 1, "ts": True, "dur": 1},
        17,
        "not an event",
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "no ts is fine here"}},
    ]
    ev += nasty_events(3)[1:]
    return ev


DROPPED = {"dur missing": 1, "dur negative": 1, "not a JSON object": 2, "ts missing": 1,
           "ts not a number": 3, "ts out of range": 1}


@pytest.mark.parametrize("layout", ["kineto", "minified", "pretty"])
def test_malformed_events_are_counted_and_left_out(tmp_path, layout):
    p = write(tmp_path / "t.json", serialize(malformed_events(), layout), False)
    for chunk in (100, 1 << 22):
        tl = read_trace_chunked(p, chunk_bytes=chunk)
        assert tl.info.dropped_events == DROPPED
        names = {tl.names[i] for i in list(tl.host.name) + list(tl.device.name)}
        assert not names & {"string ts", "no ts", "no dur", "negative", "null ts", "far", "bool"}
        assert tl.info.event_count == len(malformed_events())
        assert same(tl, reference(p))


def test_nan_and_infinity_written_by_python(tmp_path):
    ev = nasty_events(10)
    ev[5]["args"]["occupancy"] = float("nan")
    ev[9]["dur"] = float("inf")
    ev[13]["ts"] = float("nan")  # a kernel
    ev[12]["ts"] = float("nan")  # a flow endpoint: not analyzed, so not counted either
    p = write(tmp_path / "t.json", serialize(ev, "lines"), False)
    assert "NaN" in p.read_text() and "Infinity" in p.read_text()
    for chunk in (200, 1 << 22):
        tl = read_trace_chunked(p, chunk_bytes=chunk)
        assert tl.info.dropped_events == {"dur not a number": 1, "ts not a number": 1}
        assert same(tl, reference(p))


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("layout", ["kineto", "lines", "pretty", "minified", "events_first"])
@pytest.mark.parametrize("cut", [0.3, 0.77, 0.999])
def test_truncated_in_every_layout(tmp_path, layout, gz, cut):
    text = serialize(nasty_events(30), layout)
    p = write(tmp_path / "t.json", text[: int(len(text) * cut)], gz)
    with pytest.raises(TraceFormatError) as err:
        load_trace(p)
    msg = str(err.value)
    assert str(p) in msg and ("truncated" in msg or "corrupt JSON" in msg)
    assert "\n" not in msg


@pytest.mark.parametrize("layout", ["kineto", "lines", "pretty", "minified"])
def test_corrupt_middle_in_every_layout(tmp_path, layout):
    text = serialize(nasty_events(60), layout)
    at = text.index('"cudaLaunchKernel"', len(text) // 2)
    bad = text[:at] + '"cudaLaunchKernel" "oops", ' + text[at + len('"cudaLaunchKernel"'):]
    p = write(tmp_path / "t.json", bad, False)
    line = bad[:at].count("\n") + 1
    for chunk in (300, 1 << 22):
        with pytest.raises(TraceFormatError) as err:
            read_trace_chunked(p, chunk_bytes=chunk)
        msg = str(err.value)
        assert "corrupt JSON" in msg and f"line {line}" in msg, msg


def test_truncated_gzip_in_every_layout(tmp_path):
    for layout in ("kineto", "minified"):
        p = write(tmp_path / f"{layout}.json", serialize(nasty_events(200), layout), True)
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 2])
        with pytest.raises(TraceFormatError, match="gzip stream is truncated"):
            load_trace(p)


def test_correlation_ids_from_flows_in_one_piece_and_in_parts(tmp_path):
    """GPU activity without correlation ids (older writers): the flow events are kept (the
    file is read again with them) and give the ids, in one process or in parts."""
    ev = nasty_events(30)
    for e in ev:
        if e.get("cat") in ("kernel", "cuda_runtime"):
            e["args"] = {k: v for k, v in e["args"].items() if k != "correlation"}
    p = write(tmp_path / "t.json", serialize(ev, "minified"), False)
    ref = reference(p)
    assert sorted(set(ref.device.correlation)) == list(range(50, 80))
    assert same(read_trace_chunked(p, chunk_bytes=700), ref)
    with ThreadPoolExecutor(2) as ex:
        assert same(read_split_at(p, [p.stat().st_size // 2], ex, chunk_bytes=700), ref)


@pytest.mark.parametrize("gz", [False, True])
def test_a_small_reader_buffer_moves_and_grows(tmp_path, monkeypatch, gz):
    """The reader's buffer moves its unread tail to the front and grows for large events:
    with a buffer of a few hundred bytes both happen all the time."""
    import gpudoctor.parse.kineto as kineto

    monkeypatch.setattr(kineto, "_BUFFER_BYTES", 300)
    monkeypatch.setattr(kineto, "_READ_BYTES", 128)
    for layout in ("kineto", "minified", "pretty"):
        p = write(tmp_path / f"{layout}.json", serialize(nasty_events(30), layout), gz)
        ref = reference(p)
        for chunk in (64, 500, 2000):
            assert same(read_trace_chunked(p, chunk_bytes=chunk), ref), (layout, chunk)


@pytest.mark.parametrize("gz", [False, True])
def test_the_reader_buffer_stays_bounded(tmp_path, monkeypatch, gz):
    """Past the header (read in up to 1 MiB), the buffer holds a window or one event: a
    3 MB trace read through a 300-byte buffer never makes it hold the file."""
    import gpudoctor.parse.kineto as kineto

    monkeypatch.setattr(kineto, "_BUFFER_BYTES", 300)
    monkeypatch.setattr(kineto, "_READ_BYTES", 4096)
    largest = []
    room = kineto._Reader._room

    def spy(self, need):
        room(self, need)
        largest.append(len(self.buf))

    monkeypatch.setattr(kineto._Reader, "_room", spy)
    text = serialize(nasty_events(2500), "minified")
    assert len(text) > 3 << 20
    p = write(tmp_path / "t.json", text, gz)
    assert read_trace_chunked(p, chunk_bytes=2000).info.event_count == 1 + 8 * 2500
    assert max(largest) <= 1 << 20


class _GatedExecutor(ThreadPoolExecutor):
    """Its parts start only once ``gate`` is set: they are still pending when this process's
    own part is done."""

    def __init__(self) -> None:
        super().__init__(2)
        self.gate = threading.Event()

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        def gated():
            assert self.gate.wait(30)
            return fn(*args, **kwargs)

        return super().submit(gated)


def test_the_callers_work_runs_while_the_other_parts_are_read(tmp_path):
    p = write(tmp_path / "t.json", serialize(nasty_events(60), "lines"), False)
    ref = read_trace_chunked(p)
    size = p.stat().st_size
    calls = []

    def meanwhile():
        calls.append(1)
        ex.gate.set()

    with _GatedExecutor() as ex:
        assert same(read_split_at(p, [size // 2], ex, chunk_bytes=500, meanwhile=meanwhile), ref)
    assert calls == [1]

    def failing():
        ex.gate.set()
        raise ImportError("the caller meets this again where it does the work itself")

    with _GatedExecutor() as ex:  # the read does not depend on it
        assert same(read_split_at(p, [size // 2], ex, chunk_bytes=500, meanwhile=failing), ref)

    calls.clear()
    with _GatedExecutor() as ex:  # a target past the array: the file is read in one piece, nothing to wait for
        ex.gate.set()
        assert same(read_split_at(p, [size - 5], ex, chunk_bytes=500, meanwhile=lambda: calls.append(1)), ref)
    assert calls == []
