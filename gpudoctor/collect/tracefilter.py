"""Thin a Kineto trace's Python calls before it is gzipped, in bounded memory.

With ``with_stack=True`` torch's Python tracer records every Python call, C calls
included (``<built-in method get of dict object …>``), as a ``python_function`` event.
A step that tokenizes text in the loop makes 330 000 of them, most under a
microsecond: the trace of a 5-step window grows to ~480 MB of JSON (25 MB gzipped),
slow to gzip, to analyse and too big for TensorBoard or Perfetto.

:func:`filter_trace` copies a plain trace into a gzip file without the
``python_function`` events that are

- shorter than ``min_us`` (10 µs),
- not an outermost frame (their ``Python parent id`` is an event of the trace),
- and enclose no other host event of their thread (no ``cpu_op``, ``user_annotation``,
  CUDA runtime call …).

What stays: every event that is not a Python call, unchanged and in order; every
Python frame of 10 µs or more; every frame that encloses an op (so an op's whole
stack, and its ``file:line``, is kept). The kept set is closed upward: a kept frame's
callers are kept (they last longer and enclose what it encloses), so every
``Python parent id`` still points at an event of the trace, and the union of the
Python frames (the outermost ones are kept) is unchanged. A dropped call's time is
then part of its caller's self time. The trace records what was dropped under the
top-level key ``gpudoctorTraceFilter``: ``min_us``, ``dropped_events``,
``dropped_us`` (the time of the outermost dropped calls), ``kept_python_events``.

Two passes over the plain file, which is on disk: the first collects the start times
of the host events per thread (8 bytes each) and the Python ids present (a bitmap:
about a bit per call),
the second decides and writes. The
events are cut at the writer's layout (``}`` ``,`` newline ``{``: Kineto's and
``json.dump(indent=…)``'s; a JSON string holds no raw newline) and decoded by msgspec a
few MiB at a time; the last piece is cut by the JSON scanner (any layout). What it
does not recognise raises :class:`TraceFilterError`, and the caller
(``rundir.compress_trace``) keeps the trace as recorded.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from gpudoctor.model.layout import TRACE_FILTER_KEY, TRACE_STACK_BOUND_KEY

MIN_US = 10.0  # python_function events shorter than this (and enclosing no op) are dropped
CHUNK_BYTES = 4 << 20
_HEADER_LIMIT = 64 << 20
_READ_BYTES = 4 << 20
_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
_SEP = re.compile(rb"\}[ \t\r]*,[ \t\r]*\n[ \t\r\n]*\{")  # between two events in the writer's layout
_WS = re.compile(r"[ \t\r\n]*")
_SEP_AT_NEWLINE = re.compile(rb"\n[ \t\r\n]*\{")
_PYTHON = "python_function"
# events that never share a host thread with Python frames
_NOT_ANCHORS = frozenset({_PYTHON, "Trace", "kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})


class TraceFilterError(Exception):
    """The trace could not be filtered (layout, JSON, I/O): keep it as it is."""


class _Args(msgspec.Struct, gc=False):
    python_id: int | None = msgspec.field(name="Python id", default=None)
    parent_id: int | None = msgspec.field(name="Python parent id", default=None)


class _Ev(msgspec.Struct, gc=False):  # gc=False: no cycles; decoding is 2x faster
    ph: str = ""
    cat: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float = 0.0
    dur: float = 0.0
    args: _Args | None = None


_DECODER = msgspec.json.Decoder(list[_Ev])


@dataclass(frozen=True, slots=True)
class TraceFilterResult:
    """What :func:`filter_trace` did to one trace."""

    python_events: int  # python_function events in the trace as recorded
    dropped_events: int
    dropped_us: float  # time of the outermost dropped calls (now their callers' self time)
    bytes_in: int  # the plain trace
    bytes_out: int  # the gzip file written
    min_us: float = MIN_US
    stack_bound: dict[str, Any] | None = None  # the window's Python-call bound (torchprof), from the header

    def note(self) -> dict[str, float | int]:
        return {
            "min_us": self.min_us,
            "dropped_events": self.dropped_events,
            "dropped_us": round(self.dropped_us, 3),
            "kept_python_events": self.python_events - self.dropped_events,
        }


@dataclass(slots=True)
class _Piece:
    """Whole events. Event i ends at ``cuts[i] + 1`` (its ``}``; the last one at the end of
    ``text``); the separator before it starts where event i-1 ends (at 0 for i = 0: the
    ``,`` left of the piece before, or the whitespace after ``[``). ``cuts`` is empty when
    positions were not asked for."""

    text: bytes
    cuts: list[int]
    events: list[_Ev]

    def gap(self, i: int) -> int:
        return self.cuts[i - 1] + 1 if i else 0

    def end(self, i: int) -> int:
        return self.cuts[i] + 1 if i < len(self.cuts) else len(self.text)


class _Scanner:
    """The plain trace cut into its head (up to the ``[`` of traceEvents), pieces of whole
    events a few MiB each, and its tail (from the ``]``); :meth:`pieces` fills ``head``,
    ``lead`` (the whitespace before the first event) and ``tail``."""

    def __init__(self, path: Path, chunk_bytes: int, positions: bool) -> None:
        self.path = path
        self.chunk_bytes = chunk_bytes
        self.positions = positions
        self.head = b""
        self.lead = b""
        self.tail = b""

    def pieces(self) -> Iterator[_Piece]:
        with open(self.path, "rb") as fh:
            buf = bytearray()
            eof = False

            def fill(want: int) -> None:
                nonlocal eof
                while not eof and len(buf) < want:
                    block = fh.read(max(_READ_BYTES, want - len(buf)))
                    if not block:
                        eof = True
                    else:
                        buf.extend(block)

            want = 1 << 20
            while True:
                fill(want)
                m = _KEY.search(buf)
                if m is not None:
                    break
                if eof or len(buf) >= _HEADER_LIMIT:
                    raise TraceFilterError("no traceEvents array near the start of the file")
                want *= 2
            self.head = bytes(buf[: m.end()])
            del buf[: m.end()]
            first = True
            window = self.chunk_bytes
            while True:
                fill(window + 1)
                if first and buf.lstrip()[:1] == b"]":  # an empty array
                    self.tail = bytes(buf)
                    return
                if eof:
                    piece, close = self._last_piece(bytes(buf), first)
                    yield piece
                    self.tail = bytes(buf[close:])
                    return
                cut = _last_cut(buf, window)
                if cut < 0:
                    if window >= 16 * self.chunk_bytes:
                        raise TraceFilterError(f"no event boundary of the writer's layout within {window >> 20} MiB")
                    window *= 2  # one event larger than the window
                    continue
                yield self._piece(bytes(buf[: cut + 1]), first)
                first = False
                window = self.chunk_bytes
                del buf[: cut + 1]

    def _first_brace(self, text: bytes, first: bool) -> int:
        i = text.find(b"{")
        before = text[:i].strip() if i >= 0 else b"?"
        if before != (b"" if first else b","):
            raise TraceFilterError("unexpected text between events")
        if first:
            self.lead = text[:i]
        return i

    def _piece(self, text: bytes, first: bool) -> _Piece:
        i = self._first_brace(text, first)
        cuts = [m.start() for m in _SEP.finditer(text, i)] if self.positions else []
        expect = len(cuts) + 1 if self.positions else -1
        return _Piece(text, cuts, _decode(text, i, len(text), expect))

    def _last_piece(self, text: bytes, first: bool) -> tuple[_Piece, int]:
        """The events up to the ``]`` that closes the array, cut by the JSON scanner (any layout)."""
        i = self._first_brace(text, first)
        s = text.decode("latin-1")  # one char per byte: offsets are byte offsets
        dec = json.JSONDecoder()
        cuts: list[int] = []
        pos = i
        while True:
            try:
                _, end = dec.raw_decode(s, pos)
            except json.JSONDecodeError as err:
                raise TraceFilterError(f"the last events do not decode ({err.msg}): a truncated file?") from None
            j = _WS.match(s, end).end()  # type: ignore[union-attr]
            if s[j : j + 1] == "]":
                break
            k = _WS.match(s, j + 1).end() if s[j : j + 1] == "," else -1  # type: ignore[union-attr]
            if k < 0 or s[k : k + 1] != "{":
                raise TraceFilterError("unexpected text between the last events (a truncated file?)")
            cuts.append(end - 1)
            pos = k
        return _Piece(text[:end], cuts, _decode(text, i, end, len(cuts) + 1)), end


def _last_cut(buf: bytearray, limit: int) -> int:
    """Position of the ``}`` of the last event in ``buf[:limit]`` that a separator follows (-1: none)."""
    pos = buf.rfind(b"\n", 0, limit)
    while pos > 0:
        m = _SEP_AT_NEWLINE.match(buf, pos)
        if m is not None:
            back = buf.rfind(b"}", 0, pos)
            if back >= 0 and _SEP.match(buf, back) is not None:
                return back
        pos = buf.rfind(b"\n", 0, pos)
    return -1


def _decode(text: bytes, a: int, b: int, expect: int) -> list[_Ev]:
    try:
        events = _DECODER.decode(b"[" + text[a:b] + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise TraceFilterError(f"events that do not decode as cut ({err})") from None
    if expect >= 0 and len(events) != expect:
        raise TraceFilterError("objects nested in events in a way the writer's layout does not show")
    return events


class _IdSet:
    """The ``Python id`` values of a trace, gathered a piece at a time: a bitmap over their
    range (torch hands them out in sequence: about one bit per call), or a set when they
    turn out sparse."""

    def __init__(self) -> None:
        self.base = 0  # the id of bit 0 (a multiple of 8)
        self.count = 0
        self._bits = np.zeros(0, dtype=np.uint8)
        self._frozen = b""
        self._sparse: set[int] | None = None

    def add_many(self, ids: list[int]) -> None:
        if not ids:
            return
        self.count += len(ids)
        if self._sparse is not None:
            self._sparse.update(ids)
            return
        v = np.asarray(ids, dtype=np.int64)
        lo, hi = int(v.min()), int(v.max())
        if not len(self._bits):
            self.base = lo - lo % 8
        base = min(self.base, lo - lo % 8)
        nbytes = (hi - base) // 8 + 1
        if nbytes > 8 * self.count + (1 << 16):  # sparse ids: a bitmap would be mostly zeros
            self._sparse = set(self._members()) | set(ids)
            self._bits = np.zeros(0, dtype=np.uint8)
            return
        if base < self.base:
            self._bits = np.concatenate([np.zeros((self.base - base) // 8, dtype=np.uint8), self._bits])
            self.base = base
        if nbytes > len(self._bits):
            grown = np.zeros(max(nbytes, 2 * len(self._bits)), dtype=np.uint8)
            grown[: len(self._bits)] = self._bits
            self._bits = grown
        off = v - self.base
        np.bitwise_or.at(self._bits, off >> 3, (1 << (off & 7)).astype(np.uint8))

    def _members(self) -> list[int]:
        return (np.flatnonzero(np.unpackbits(self._bits, bitorder="little")) + self.base).tolist()

    def freeze(self) -> _IdSet:
        self._frozen = self._bits.tobytes()
        return self

    def __contains__(self, i: object) -> bool:
        if not isinstance(i, int):
            return False
        if self._sparse is not None:
            return i in self._sparse
        k = i - self.base
        return 0 <= k < 8 * len(self._frozen) and bool(self._frozen[k >> 3] >> (k & 7) & 1)


@dataclass(slots=True)
class _Pass1:
    anchors: dict[tuple[object, object], array]  # sorted start times of host events per (pid, tid)
    n_python: int
    ids: _IdSet  # Python ids present: a call whose parent is absent is an outermost frame


def _first_pass(path: Path, chunk_bytes: int) -> _Pass1:
    starts: dict[tuple[object, object], array] = {}
    ids = _IdSet()
    n_python = 0
    for piece in _Scanner(path, chunk_bytes, positions=False).pieces():
        piece_ids: list[int] = []
        for e in piece.events:
            if e.ph != "X":
                continue
            if e.cat == _PYTHON:
                n_python += 1
                if e.args is not None and e.args.python_id is not None:
                    piece_ids.append(e.args.python_id)
            elif e.cat not in _NOT_ANCHORS:
                key = (e.pid, e.tid)
                times = starts.get(key)
                if times is None:
                    times = starts[key] = array("d")
                times.append(e.ts)
        ids.add_many(piece_ids)
    for key, a in starts.items():
        v = np.frombuffer(a, dtype=np.float64)
        if len(v) > 1 and not bool(np.all(v[1:] >= v[:-1])):
            starts[key] = array("d", np.sort(v).tobytes())
    return _Pass1(starts, n_python, ids.freeze())


def has_python_events(path: Path) -> bool:
    """Whether the plain trace mentions python_function at all (a fast byte scan)."""
    needle = _PYTHON.encode()
    carry = b""
    with open(path, "rb") as fh:
        while True:
            block = fh.read(_READ_BYTES)
            if not block:
                return False
            if needle in carry + block[: len(needle)] or needle in block:
                return True
            carry = block[-len(needle) :]


class _Writer:
    """Writes runs of kept events, each with the separator that preceded it."""

    def __init__(self, out: gzip.GzipFile, scanner: _Scanner) -> None:
        self.out = out
        self.scanner = scanner
        self.started = False  # an event was written

    def run(self, piece: _Piece, text: memoryview, a: int, b: int) -> None:
        """Events ``a..b-1`` of ``piece``, consecutive and all kept."""
        if self.started:
            self.out.write(text[piece.gap(a) : piece.end(b - 1)])
        else:  # the first event written takes the array's leading whitespace, not a comma
            self.out.write(self.scanner.lead)
            self.out.write(text[piece.text.index(b"{", piece.gap(a)) : piece.end(b - 1)])
            self.started = True


def filter_trace(src: Path, dst: Path, *, min_us: float = MIN_US, level: int = 1,
                 chunk_bytes: int = CHUNK_BYTES) -> TraceFilterResult:
    """Write ``src`` (plain Kineto JSON) to ``dst`` (gzip), short Python calls dropped.

    ``dst`` is written in place (the caller writes a temporary name and renames it).
    Raises :class:`TraceFilterError` or ``OSError`` when the trace cannot be filtered;
    ``dst`` may then hold part of the output.
    """
    first = _first_pass(src, chunk_bytes)
    anchors, ids = first.anchors, first.ids
    empty = array("d")
    scanner = _Scanner(src, chunk_bytes, positions=True)
    kept_ids: set[int] = set()
    dropped = 0
    dropped_us = 0.0
    with gzip.open(dst, "wb", compresslevel=level) as out:
        writer = _Writer(out, scanner)  # type: ignore[arg-type]
        head_written = False
        for piece in scanner.pieces():
            if not head_written:
                out.write(scanner.head)
                head_written = True
            text = memoryview(piece.text)
            run_start = -1  # first event of the run of kept events being gathered
            for i, e in enumerate(piece.events):
                if e.cat == _PYTHON and e.ph == "X":
                    a = e.args
                    parent = a.parent_id if a is not None else None
                    keep = True
                    if e.dur < min_us and parent is not None and parent in ids:
                        times = anchors.get((e.pid, e.tid), empty)
                        j = bisect_left(times, e.ts)
                        keep = j < len(times) and times[j] <= e.ts + e.dur
                    if keep:
                        if a is not None and a.python_id is not None:
                            kept_ids.add(a.python_id)
                    else:
                        dropped += 1
                        if parent in kept_ids:  # outermost dropped call: its time becomes its caller's
                            dropped_us += e.dur
                        if run_start >= 0:
                            writer.run(piece, text, run_start, i)
                            run_start = -1
                        continue
                if run_start < 0:
                    run_start = i
            if run_start >= 0:
                writer.run(piece, text, run_start, len(piece.events))
            text.release()
        if not head_written:
            out.write(scanner.head)
        result = TraceFilterResult(
            python_events=first.n_python, dropped_events=dropped, dropped_us=dropped_us,
            bytes_in=os.path.getsize(src), bytes_out=0, min_us=min_us,
            stack_bound=_header_value(scanner.head, TRACE_STACK_BOUND_KEY),
        )
        out.write(_tail_with_note(scanner.tail, result))
    return dataclasses.replace(result, bytes_out=os.path.getsize(dst))


def _header_value(head: bytes, key: str) -> Any:
    """A top-level value written before traceEvents (None when absent or unreadable)."""
    if key.encode() not in head:
        return None
    m = _KEY.search(head)
    text = head[: m.start() if m else len(head)].rstrip()
    if text.endswith(b","):
        text = text[:-1]
    try:
        obj = json.loads(text + b"}")
    except ValueError:
        return None
    return obj.get(key) if isinstance(obj, dict) else None


def _tail_with_note(tail: bytes, result: TraceFilterResult) -> bytes:
    """The text after the array, with ``"gpudoctorTraceFilter": {…}`` before the object's ``}``."""
    body = tail.rstrip()
    if not body.endswith(b"}"):
        raise TraceFilterError("the trace is not a JSON object after traceEvents")
    note = json.dumps(result.note(), separators=(", ", ": ")).encode()
    return body[:-1].rstrip() + b',\n  "' + TRACE_FILTER_KEY.encode() + b'": ' + note + b"\n}" + tail[len(body) :]
