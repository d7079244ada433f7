"""Kineto JSON → Timeline: both parsers, every layout, broken files."""

from __future__ import annotations

import gzip
import io
import json
import random
import time
from pathlib import Path

import pytest

from gpudoctor.errors import TraceFormatError
from gpudoctor.model.trace import HOST_FLAG_SEQUENCE, NO_VALUE, DeviceKind, HostKind
from gpudoctor.parse import kineto, load_trace
from gpudoctor.parse.kineto import NeedsFallback, read_trace_chunked
from gpudoctor.parse.stream import read_trace_streaming

HEADER = {
    "schemaVersion": 1,
    "deviceProperties": [
        {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_000_000_000, "computeMajor": 8, "computeMinor": 0}
    ],
    "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},
}
# a kernel name with "}, {" and "},\n"-free braces, as real C++ template names have
NASTY = "void at::native::f<{lambda(float)#1}, {lambda()#2}>(int, {lambda(int)#1}, at::detail::Array<char*, 2>)"


def events(n_steps: int = 3) -> list[dict]:
    ev: list[dict] = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "python"}}]
    t = 1_000_000.0
    corr = 100
    for step in range(n_steps):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                   "ts": t, "dur": 900.5, "args": {"External id": 1}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": t + 10.25,
                   "dur": 50.125, "args": {"External id": 7 + step, "Sequence number": 3,
                                           "Input Dims": [[64], [64, 32], [32, 64]],
                                           "Input type": ["float", "float", "float"]}})
        corr += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 20,
                   "dur": 5, "args": {"External id": 7 + step, "cbid": 211, "correlation": corr}})
        ev.append({"ph": "s", "id": corr, "pid": 1, "tid": 1, "ts": t + 20, "cat": "ac2g", "name": "ac2g"})
        ev.append({"ph": "X", "cat": "kernel", "name": NASTY, "pid": 0, "tid": 7, "ts": t + 30.5, "dur": 100.25,
                   "args": {"External id": 7 + step, "device": 0, "stream": 7, "correlation": corr,
                            "grid": [1, 1, 1], "block": [128, 1, 1]}})
        ev.append({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": t + 30.5, "cat": "ac2g", "name": "ac2g", "bp": "e"})
        corr += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1, "ts": t + 200,
                   "dur": 8, "args": {"correlation": corr}})
        ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
                   "ts": t + 210, "dur": 40, "args": {"device": 0, "stream": 7, "correlation": corr, "bytes": 4096}})
        ev.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1,
                   "ts": t + 300, "args": {"Total Reserved": 2048, "Total Allocated": 1024 * (step + 1),
                                           "Bytes": 1024, "Device Id": 0, "Device Type": 1}})
        ev.append({"ph": "X", "cat": "python_function", "name": "train.py(12): step", "pid": 1, "tid": 1,
                   "ts": t, "dur": 800, "args": {"Python parent id": None, "Python id": step}})
        ev.append({"ph": "X", "cat": "brand_new_category", "name": "x", "pid": 1, "tid": 1, "ts": t, "dur": 1})
        t += 1000
    ev.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
               "ts": 999_000.0, "dur": 10_000})
    return ev


def kineto_text(ev: list[dict], header: dict = HEADER, tail: dict | None = None) -> str:
    """The layout Kineto's ChromeTraceLogger writes (one event per block, ``},\\n  {``)."""
    parts = ["{"]
    for k, v in header.items():
        parts.append(f'  "{k}": {json.dumps(v)},')
    parts.append('  "traceEvents": [')
    parts.append(",\n".join("  " + json.dumps(e) for e in ev))
    parts.append("  ]" + ("," if tail else ""))
    if tail:
        parts.append(",\n".join(f'  "{k}": {json.dumps(v)}' for k, v in tail.items()))
    parts.append("}")
    return "\n".join(parts)


def write(tmp_path: Path, text: str, name: str = "t.json", gz: bool = False) -> Path:
    p = tmp_path / (name + (".gz" if gz else ""))
    if gz:
        with gzip.open(p, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


def columns(tl) -> dict:
    """Everything the parsers produce, with name ids resolved (ids differ between parsers)."""
    h, d = tl.host, tl.device
    return {
        "host": sorted(
            (tl.names[h.name[i]], h.kind[i], h.ts_ns[i], h.dur_ns[i], tl.threads[h.thread[i]], h.correlation[i],
             h.external_id[i], tl.string_of(h.input_dims[i]), tl.string_of(h.input_types[i]), h.flags[i])
            for i in range(len(h))
        ),
        "device": sorted(
            (tl.names[d.name[i]], d.kind[i], d.ts_ns[i], d.dur_ns[i], d.device[i], d.stream[i], d.correlation[i],
             d.external_id[i], d.bytes[i])
            for i in range(len(d))
        ),
        "memory": sorted(zip(tl.memory.ts_ns, tl.memory.device, tl.memory.allocated_bytes, strict=True)),
    }


@pytest.mark.parametrize("gz", [False, True])
def test_both_parsers_agree_and_keep_what_is_needed(tmp_path, gz):
    p = write(tmp_path, kineto_text(events(), tail={"traceName": "x", "baseTimeNanoseconds": 17}), gz=gz)
    fast = read_trace_chunked(p, chunk_bytes=700)  # many small pieces, cut between events
    slow = read_trace_streaming(p)
    assert fast.info.parser == "chunked" and slow.info.parser == "streaming"
    assert columns(fast) == columns(slow)
    tl = fast
    assert len(tl.host) == 3 * 5 and len(tl.device) == 3 * 2 and len(tl.memory) == 3
    i = tl.names.index("aten::addmm")
    row = next(r for r in range(len(tl.host)) if tl.host.name[r] == i)
    assert tl.host.kind[row] == HostKind.CPU_OP
    assert tl.host.ts_ns[row] == 1_000_010_250 and tl.host.dur_ns[row] == 50_125
    assert tl.host.flags[row] & HOST_FLAG_SEQUENCE
    assert tl.string_of(tl.host.input_dims[row]) == "[[64], [64, 32], [32, 64]]"
    assert json.loads(tl.string_of(tl.host.input_types[row])) == ["float", "float", "float"]
    k = tl.names.index(NASTY)
    krow = list(tl.device.name).index(k)
    assert tl.device.kind[krow] == DeviceKind.KERNEL and tl.device.correlation[krow] == 101
    assert tl.device.external_id[krow] == 7
    info = tl.info
    assert (info.rank, info.world_size, info.backend) == (3, 8, "nccl")
    assert info.devices[0].compute_capability == "8.0" and info.devices[0].total_memory_bytes == 85_000_000_000
    assert info.unknown_categories == {"brand_new_category": 3}
    assert info.ts_unit == "ns" and info.platform == "cuda" and info.schema == "kineto"
    assert info.with_stack and info.record_shapes and info.profile_memory
    assert info.flow_count == 6 and info.base_time_ns == 17 and info.trace_name == "x"
    assert info.event_count == len(events())


def test_epoch_microseconds_stay_exact_in_nanoseconds(tmp_path):
    ev = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1689179605647673, "dur": 3,
           "args": {"device": 0, "stream": 7, "correlation": 1}},
          {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1712195495519689.047, "dur": 63.813,
           "args": {"device": 0, "stream": 7, "correlation": 2}}]
    tl = load_trace(write(tmp_path, kineto_text(ev)))
    assert tl.device.ts_ns[0] == 1689179605647673000  # integer µs: exact
    assert abs(tl.device.ts_ns[1] - 1712195495519689047) <= 125  # float64 resolution at 1.7e15 µs
    assert tl.device.dur_ns[1] == 63_813
    assert tl.info.ts_unit == "ns"


def test_legacy_2021_categories(tmp_path):
    ev = [
        {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 5, "tid": 5, "ts": 100, "dur": 50,
         "args": {"external id": 9}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 5, "tid": 5, "ts": 110, "dur": 10,
         "args": {"cbid": 211, "correlation": 42, "external id": 9}},
        {"ph": "s", "id": 42, "pid": 5, "tid": 5, "ts": 110, "cat": "async_gpu", "name": "cudaLaunchKernel"},
        {"ph": "X", "cat": "Kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 130, "dur": 20,
         "args": {"device": 0, "stream": 7, "correlation": 42, "external id": 9}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 7, "ts": 160,
         "dur": 5, "args": {"device": 0, "stream": 7, "correlation": 43, "bytes": 10}},
        {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 170, "dur": 5,
         "args": {"device": 0, "stream": 7, "correlation": 44, "bytes": 10}},
    ]
    tl = load_trace(write(tmp_path, kineto_text(ev, header={"distributedInfo": {"rank": 1}})))
    assert tl.info.schema == "kineto-legacy" and tl.info.ts_unit == "us"
    assert list(tl.host.kind) == [HostKind.CPU_OP, HostKind.RUNTIME]
    assert list(tl.device.kind) == [DeviceKind.KERNEL, DeviceKind.MEMCPY, DeviceKind.MEMSET]
    assert tl.host.external_id[0] == 9 and tl.device.external_id[0] == 9
    assert tl.info.rank == 1 and tl.info.world_size is None and tl.info.devices == ()


def test_rocm_string_arguments(tmp_path):
    ev = [
        {"ph": "X", "cat": "cuda_runtime", "name": "hipMemcpyWithStream", "pid": 9, "tid": 9, "ts": 1.5, "dur": 60.2,
         "args": {"External id": 8, "stream": "0x0", "correlation": 117, "size": "2560", "bytes": "2560"}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Host -> Device)", "pid": 2, "tid": 0, "ts": 30.0,
         "dur": 2.0, "args": {"device": 2, "stream": "0x0", "correlation": 117, "bytes": "2560"}},
    ]
    tl = load_trace(write(tmp_path, kineto_text(ev, header={"roctracer_version": 4.1})))
    assert tl.info.platform == "rocm" and tl.info.parser == "chunked"
    assert tl.device.device[0] == 2 and tl.device.stream[0] == 0 and tl.device.bytes[0] == 2560


def test_missing_correlation_is_recovered_from_flow_events(tmp_path):
    ev = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
        {"ph": "s", "id": 77, "pid": 1, "tid": 1, "ts": 10, "cat": "ac2g", "name": "ac2g"},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 20, "dur": 5},
        {"ph": "f", "id": 77, "pid": 0, "tid": 7, "ts": 20, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    ]
    tl = load_trace(write(tmp_path, kineto_text(ev, header={})))
    assert tl.host.correlation[0] == 77 and tl.device.correlation[0] == 77
    assert tl.device.device[0] == 0 and tl.device.stream[0] == NO_VALUE


@pytest.mark.parametrize(
    "layout",
    ["minified", "array", "events_first", "indent4"],
)
def test_any_valid_json_layout_reads_the_same(tmp_path, layout):
    ev = events(2)
    if layout == "minified":
        text = json.dumps({**HEADER, "traceEvents": ev}, separators=(",", ":"))
    elif layout == "array":
        text = json.dumps(ev)
    elif layout == "events_first":
        text = json.dumps({"traceEvents": ev, **HEADER}, indent=1)
    else:
        text = json.dumps({**HEADER, "traceEvents": ev, "traceName": "t"}, indent=4)
    tl = load_trace(write(tmp_path, text))
    ref = read_trace_streaming(write(tmp_path, kineto_text(ev), name="ref.json"))
    assert columns(tl) == columns(ref)
    if layout in ("events_first", "indent4"):
        assert tl.info.rank == 3


def test_minified_json_is_read_by_the_fast_path(tmp_path):
    p = write(tmp_path, json.dumps({"traceEvents": events(30)}, separators=(",", ":")))
    fast = read_trace_chunked(p, chunk_bytes=256)  # no newline anywhere: cut at "},{"
    assert fast.info.parser == "chunked"
    assert columns(fast) == columns(read_trace_streaming(p))


def test_a_header_no_json_decoder_reads_needs_the_fallback(tmp_path):
    p = write(tmp_path, '{"schemaVersion": 1, "x": [1, 2,], "traceEvents": []}')
    with pytest.raises(NeedsFallback):
        read_trace_chunked(p)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_truncated_files_name_the_file_and_where(tmp_path, gz, cut):
    text = kineto_text(events(5))
    p = write(tmp_path, text[: int(len(text) * cut)], gz=gz)
    for reader in (load_trace, read_trace_streaming):
        with pytest.raises(TraceFormatError) as err:
            reader(p)
        msg = str(err.value)
        assert str(p) in msg and "truncated" in msg
        assert "line" in msg or "byte" in msg or "after" in msg


def test_truncated_gzip_stream(tmp_path):
    p = write(tmp_path, kineto_text(events(50)), gz=True)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="gzip stream is truncated"):
        load_trace(p)


def test_corrupt_deflate_data_is_a_one_line_error(tmp_path):
    # bytes flipped inside the compressed stream: the decompressor's own error (zlib's or
    # ISA-L's) becomes a TraceFormatError in every reader
    p = write(tmp_path, kineto_text(events(2000)), gz=True)
    data = bytearray(p.read_bytes())
    for i in range(200, 260):
        data[i] ^= 0xFF
    p.write_bytes(bytes(data))
    for reader in (load_trace, read_trace_streaming):
        with pytest.raises(TraceFormatError, match="gzip stream is corrupt"):
            reader(p)


def test_corrupt_middle_reports_the_line(tmp_path):
    text = kineto_text(events(5))
    lines = text.split("\n")
    lines[20] = lines[20].replace('"ph": "X"', '"ph" "X"', 1) if '"ph": "X"' in lines[20] else lines[20] + "}}}"
    p = write(tmp_path, "\n".join(lines))
    with pytest.raises(TraceFormatError) as err:
        read_trace_chunked(p, chunk_bytes=200)
    assert "corrupt JSON" in str(err.value) and "line 21" in str(err.value)
    with pytest.raises(TraceFormatError) as err:
        read_trace_streaming(p)
    assert "corrupt JSON" in str(err.value) and "line 21" in str(err.value)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty"),
        ("hello", "does not start with a JSON object"),
        ('{"schemaVersion": 1}', "no traceEvents"),
    ],
)
def test_not_a_trace(tmp_path, text, match):
    with pytest.raises(TraceFormatError, match=match):
        load_trace(write(tmp_path, text))


def test_empty_trace_events_is_not_a_trace_to_analyze(tmp_path):
    with pytest.raises(TraceFormatError, match="traceEvents is empty"):
        load_trace(write(tmp_path, kineto_text([])))


def test_host_and_device_categories_in_other_phases_are_skipped(tmp_path):
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
        {"ph": "i", "cat": "cpu_op", "name": "marker", "pid": 1, "tid": 1, "ts": 11, "s": "t"},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 20, "dur": 5},
        {"ph": "B", "cat": "kernel", "name": "odd", "pid": 0, "tid": 7, "ts": 30},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 40, "dur": 5,
         "args": {"device": 0, "stream": 7, "correlation": 1}},
    ]
    p = write(tmp_path, kineto_text(ev))
    for tl in (read_trace_chunked(p, chunk_bytes=64), read_trace_streaming(p)):
        assert [tl.names[i] for i in tl.host.name] == ["aten::mm", "aten::add"]
        assert list(tl.host.kind) == [HostKind.CPU_OP, HostKind.CPU_OP]
        assert [tl.names[i] for i in tl.device.name] == ["k"] and list(tl.device.kind) == [DeviceKind.KERNEL]


def test_timeline_helpers():
    from gpudoctor.model.trace import TimelineBuilder

    b = TimelineBuilder("x")
    b.add_device(DeviceKind.ANNOTATION, "## forward ##", 0, 10)
    assert not b.build().has_gpu_activity
    b.add_device(DeviceKind.KERNEL, "k", 0, 10)
    b.add_host(HostKind.CPU_OP, "aten::mm", 0, 5, input_dims="[[1]]", input_types='["float"]')
    tl = b.build()
    assert tl.has_gpu_activity and tl.info.record_shapes and tl.info.platform == "cuda"
    assert tl.name_of(tl.host.name[0]) == "aten::mm" and tl.name_of(99) == ""
    assert tl.string_of(tl.host.input_types[0]) == '["float"]' and tl.string_of(-1) == ""
    assert tl.nbytes == 1 * (1 + 4 + 8 + 8 + 4 + 8 + 8 + 4 + 4 + 1 + 4) + 2 * (1 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8)


def test_the_decompressing_thread_stops_at_once_with_its_queue_full(monkeypatch):
    """Closing a reader whose thread waits for room in the queue takes no wait of the thread's
    own: with a 30 s wait per put, a close that let the thread notice the stop by itself would
    take 30 s."""
    monkeypatch.setattr(kineto, "_PUT_WAIT_S", 30.0)
    monkeypatch.setattr(kineto, "_READ_BYTES", 1024)
    pre = kineto._Prefetch(io.BytesIO(b"x" * (1024 * (kineto._PREFETCH_BLOCKS + 4))))
    deadline = time.monotonic() + 10
    while not pre.q.full() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pre.q.full()
    t = time.monotonic()
    pre.close()
    assert not pre.thread.is_alive() and time.monotonic() - t < 10


def test_microseconds_become_nanoseconds_exactly():
    # whole µs (older Kineto), fractions (newer), epoch-based starts, negatives; blocks of both kinds
    import math
    from array import array

    from gpudoctor.parse.columns import _BLOCK, _ns

    rng = random.Random(3)
    values = [float(rng.randrange(0, 10**7)) for _ in range(_BLOCK + 5)]
    values += [1.7e15 + rng.randrange(0, 10**9) + rng.randrange(0, 1000) / 1000 for _ in range(2000)]
    values += [-rng.random() * 1e6 for _ in range(100)] + [0.0, 0.5, 1.5, 2.0005, -0.0005, 9.0e15, -9.0e15]
    expected = [math.floor(v) * 1000 + round((v - math.floor(v)) * 1000.0) for v in values]
    assert list(_ns(array("d", values))) == expected
    assert list(_ns(array("d"))) == []


def test_a_category_or_phase_first_met_late_switches_to_the_general_decoder(tmp_path, monkeypatch):
    """Pieces of known categories and phases decode as ``KnownEvent``s; from the first piece with
    another (a new category, an odd phase), the part goes on with ``Event``s: the columns are the
    streaming parser's, and the unknown category is counted."""
    ev = [e for e in events(12) if e.get("cat") != "brand_new_category"]
    ev.append({"ph": "Q", "cat": "cpu_op", "name": "odd phase", "pid": 1, "tid": 1, "ts": 2e6, "dur": 1})
    ev += [{**e, "ts": e["ts"] + 1e6} for e in events(2) if "ts" in e]
    p = write(tmp_path, kineto_text(ev))
    calls = {"known": 0, "general": 0}

    class Spy:
        def __init__(self, dec, key):
            self.dec, self.key = dec, key

        def decode(self, b):
            calls[self.key] += 1
            return self.dec.decode(b)

    monkeypatch.setattr(kineto, "KNOWN_EVENTS_DECODER", Spy(kineto.KNOWN_EVENTS_DECODER, "known"))
    monkeypatch.setattr(kineto, "EVENTS_DECODER", Spy(kineto.EVENTS_DECODER, "general"))
    fast = read_trace_chunked(p, chunk_bytes=900)
    assert calls["known"] >= 5 and calls["general"] >= 2  # known pieces first, then the general decoder
    slow = read_trace_streaming(p)
    assert columns(fast) == columns(slow)
    assert fast.info.unknown_categories == {"brand_new_category": 2} == slow.info.unknown_categories
    assert fast.info.event_count == len(ev)
