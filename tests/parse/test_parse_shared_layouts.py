"""Every trace of ../shared/traces, re-serialized in every layout, reads exactly like a
``json.load`` of it (skipped when the folder is absent; the traces are written to tmp_path
only, never into the repository).

The layouts: the file as it is (Kineto's writer, gzipped), minified, one event per line
(gzipped), pretty-printed, and the same minified file read in two parts by two
processes. The reference hands every event of ``json.load`` to the column builder in one
batch: no cutting, no parts.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import msgspec
import pytest

from gpudoctor.model.trace import Timeline
from gpudoctor.parse import load_trace
from gpudoctor.parse.columns import ColumnBuilder, Header
from gpudoctor.parse.parallel import read_split_at

pytestmark = [pytest.mark.shared_traces, pytest.mark.slow]


def shared(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*.json.gz"))


def same(a: Timeline, b: Timeline) -> bool:
    return dataclasses.replace(a, path="") == dataclasses.replace(b, path="")


def test_every_shared_trace_in_every_layout(shared_traces, tmp_path):
    from gpudoctor.pipeline import _pool

    traces = shared(shared_traces)
    assert len(traces) >= 10
    with _pool(1) as ex:
        for src in traces:
            with gzip.open(src, "rb") as fh:
                obj = json.load(fh)
            events = obj["traceEvents"]
            header = {k: v for k, v in obj.items() if k != "traceEvents"}
            b = ColumnBuilder(str(src), parser="chunked", keep_flows=True)
            b.add_dicts(events)
            ref = b.build(Header.from_json(header))
            assert ref.info.dropped_events == {}, src.name

            assert same(load_trace(src), ref), f"{src.name}: as written"
            minified = tmp_path / "min.json"
            minified.write_bytes(msgspec.json.encode(obj))
            assert same(load_trace(minified), ref), f"{src.name}: minified"
            size = minified.stat().st_size
            assert same(read_split_at(minified, [size // 2], ex), ref), f"{src.name}: two parts"
            lines = tmp_path / "lines.json.gz"
            with gzip.open(lines, "wb", compresslevel=1) as fh:
                head = msgspec.json.encode(header)[:-1] + (b"," if header else b"")
                fh.write(head + b'"traceEvents":[\n')
                fh.write(b",\n".join(msgspec.json.encode(e) for e in events))
                fh.write(b"\n]}")
            assert same(load_trace(lines), ref), f"{src.name}: one event per line"
            pretty = tmp_path / "pretty.json"
            pretty.write_bytes(msgspec.json.format(msgspec.json.encode(obj), indent=2))
            assert same(load_trace(pretty), ref), f"{src.name}: pretty"
