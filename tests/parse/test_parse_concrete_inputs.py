"""``Concrete Inputs`` (the values of non-tensor arguments PyTorch 2.x records with shapes) reach the
``Timeline`` through every reader: the chunked fast path, the streaming fallback and a file read in
parts by several workers."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpudoctor.model.trace import NO_VALUE
from gpudoctor.parse.kineto import read_trace_chunked
from gpudoctor.parse.parallel import read_split_at
from gpudoctor.parse.stream import read_trace_streaming

CONV_CONCRETE = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1"]


def _events(n: int = 30) -> list[dict]:
    ev: list[dict] = []
    t = 1_000.0
    for i in range(n):
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "pid": 1, "tid": 1, "ts": t, "dur": 50,
                   "args": {"External id": i + 1, "Input Dims": [[8, 64, 56, 56], [64, 64, 3, 3], [], [], [], [], []],
                            "Input type": ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
                            "Concrete Inputs": CONV_CONCRETE[:6] + [str(1 + i % 2)]}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": t + 60, "dur": 5,
                   "args": {"External id": 1000 + i, "Input Dims": [[8, 64, 28, 28]], "Input type": ["float"]}})
        t += 100
    return ev


def _write(tmp_path: Path) -> Path:
    body = ",\n".join("  " + json.dumps(e) for e in _events())
    p = tmp_path / "t.json"
    p.write_text('{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + body + "\n  ]\n}\n", encoding="utf-8")
    return p


def _concrete(tl) -> list[tuple[str, object]]:
    out = []
    for i in range(len(tl.host)):
        c = tl.host.concrete_inputs[i]
        out.append((tl.names[tl.host.name[i]], json.loads(tl.string_of(c)) if c != NO_VALUE else None))
    return out


def test_every_reader_keeps_concrete_inputs(tmp_path):
    p = _write(tmp_path)
    ref = _concrete(read_trace_chunked(p, chunk_bytes=600))
    assert ref[0] == ("aten::conv2d", CONV_CONCRETE) and ref[2] == ("aten::conv2d", CONV_CONCRETE[:6] + ["2"])
    assert ref[1] == ("aten::relu", None)  # an op without them has none
    assert _concrete(read_trace_streaming(p)) == ref
    size = p.stat().st_size
    with ThreadPoolExecutor(2) as ex:
        assert _concrete(read_split_at(p, [size // 3, 2 * size // 3], ex, chunk_bytes=500)) == ref
