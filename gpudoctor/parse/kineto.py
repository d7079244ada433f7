"""Kineto (Chrome trace JSON) → ``Timeline``, in bounded memory, whatever the layout.

The file (plain or gzip) is read in blocks. The header before ``traceEvents``
(``deviceProperties``, ``distributedInfo`` …) is decoded on its own; the array is cut
into ~1 MiB pieces and each piece is decoded by msgspec into typed structs that hold
only the fields gpudoctor uses; the structs go straight into compact columns
(``ColumnBuilder``) and are dropped. The end of the array and what follows it
(``traceName``, ``baseTimeNanoseconds`` …) are decoded by the standard library's scanner.

**Where a piece is cut.** At the last ``}`` in the window that is followed by ``,`` and
``{`` (with any whitespace between): Kineto's ``},\\n  {``, one event per line, pretty
printing and minified ``},{`` alike. Such a ``}`` may sit inside a string (a name with
``"},{"`` in it) or close a nested object; the decoder says so: a piece that starts
at a true event boundary and decodes as a JSON array ends at one too (a prefix of
valid JSON tokenizes the same in the piece as in the file), and a wrong cut always fails
at the piece's end (the bracket it added, or inside a string). Then an earlier candidate
is tried, and after two wrong ones the standard library's scanner walks the piece event
by event to the last true boundary. Nothing is ever cut silently in the wrong place.

**What msgspec refuses.** A piece with values of unexpected types (a string ``ts``, an
event that is not an object) is decoded untyped and converted leniently, the malformed
events counted (``TraceInfo.dropped_events``); a piece that is not strict JSON but that
``json.load`` reads (``NaN``, ``Infinity``) is decoded by the standard library. Both
happen per piece: the rest of the file stays on the fast path.

**Gzip.** A thread decompresses ahead of the decoder (zlib and ISA-L release the GIL), so
decompression and decoding use two cores. ISA-L (the ``isal`` package, a dependency) does it
3-4x faster than zlib: 330 MB of trace in 0.08 s against 0.31 s here; the standard library's
``gzip`` serves where ``isal`` cannot be imported.

**Parts.** ``read_part`` decodes the events that start in a byte range of a trace (a
gzipped one is decompressed up to the range); ``parse.parallel`` runs the parts of one
large trace in several processes and joins them (``ColumnBuilder.extend``). A part must
end exactly at the boundary where the next one starts; it reports whether that boundary
proved true.

**Flows.** Flow events (``ac2g``) only serve to recover the correlation ids of GPU
activity that lacks them; they are counted, and kept only when such activity turns up
(the file is then read again with them).

A truncated or corrupt file raises ``TraceFormatError`` naming the file and where it
broke (byte offset and line in the decompressed text). ``NeedsFallback`` (the streaming
parser of ``parse/stream.py`` takes over) is left only for a ``traceEvents`` array that
does not start within the first 64 MiB or a header no JSON decoder reads.

Why this file is long: a measured hot path, the decoding of every event of a trace. The ~320 MB
one-event-per-line benchmark trace (1.5 M events, ``benchmarks/analyze.py``) is parsed alone in
1.50-1.51 s of CPU, ~210 MB/s on one core of the 2-core CI machine (2026-11-29; docs/performance.md,
"analyze on large traces"). The reader is one pipeline over one buffer (prefetching reader, piece
cutter, typed decode, the part reader of ``--jobs``) whose offsets and boundary checks are shared, kept
in one module so that the offsets each stage hands the next can be read in one place. The events'
structs are ``parse.events``.
"""

from __future__ import annotations

import gzip
import json
import queue
import re
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

try:  # ISA-L's gzip: the same stream 3-4x faster than zlib (a wheel on the usual platforms)
    from isal import igzip as _igzip
    from isal import isal_zlib as _isal_zlib

    _GzipFile: type[gzip.GzipFile] = _igzip.IGzipFile
    GZIP_ERRORS: tuple[type[BaseException], ...] = (EOFError, zlib.error, gzip.BadGzipFile, _isal_zlib.error)
except ImportError:  # pragma: no cover - isal is a dependency; a platform without its wheel
    _GzipFile = gzip.GzipFile
    GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)

from gpudoctor.errors import TraceFormatError
from gpudoctor.model.trace import Timeline
from gpudoctor.parse.columns import ColumnBuilder
from gpudoctor.parse.events import EVENTS_DECODER, KNOWN_EVENTS_DECODER, Header

# decode this much of traceEvents at a time: the events of a piece then stay in the core's cache while their
# columns are taken (1 MiB of JSON: ~5k events). Measured on the 320 MB benchmark traces, 2 shared cores
# (AMD EPYC, 1 MiB L2 a core), parse CPU time, best of 3: 1 MiB 1.35-1.37 s, 4 MiB 1.41-1.78 s, 16 MiB 1.93 s
# one event per line; minified 1.45-1.65 s against 1.92-2.08 s; gzipped 1.30-1.36 s against 1.46-1.55 s.
# 512 KiB: the same as 1 MiB; results do not depend on it (the columns are the same however a file is cut)
CHUNK_BYTES = 1 << 20
HEADER_LIMIT = 64 << 20  # "traceEvents" must start within this many bytes
MAX_EVENT_BYTES = 256 << 20  # one event larger than this is taken as corrupt
_READ_BYTES = 4 << 20
_BUFFER_BYTES = 16 << 20  # the reader's buffer: two pieces and a read ahead
_PREFETCH_BLOCKS = 4  # gzip: blocks decompressed ahead of the decoder
_PUT_WAIT_S = 0.1  # the decompressing thread checks for a stop this often while the queue is full

_ANY_DECODER = msgspec.json.Decoder()
_SEP = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
_BYTE_POS = re.compile(r"\(byte (\d+)\)")
_WS = re.compile(r"[ \t\r\n]*")
_LEAD_WS = re.compile(rb"[ \t\n\r\x0b\x0c]*")  # what bytes.lstrip() strips
DECODED, WRONG_CUT, ARRAY_END = 0, 1, 2  # what decoding a piece found
END, STOPPED, UNPROVEN = 0, 1, 2  # how a part ended

__all__ = [
    "CHUNK_BYTES", "GZIP_ERRORS", "NeedsFallback", "PartResult", "TraceStart", "find_start", "is_gzip", "locate",
    "open_trace", "read_part", "read_trace_chunked", "stream_size",
]


class NeedsFallback(Exception):
    """The fast path cannot read this file; the streaming parser should."""


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def open_trace(path: Path) -> BinaryIO:
    """The decompressed byte stream of a trace (gzip detected by its magic bytes)."""
    fh = open(path, "rb")  # noqa: SIM115 - returned to the caller
    magic = fh.read(2)
    fh.seek(0)
    if magic == b"\x1f\x8b":
        return _GzipFile(fileobj=fh, mode="rb")  # type: ignore[return-value]
    return fh


def locate(path: Path, offset: int) -> str:
    """'byte N, line L' of a decompressed-stream offset (error path only: rereads the file)."""
    line = 1
    seen = 0
    try:
        with open_trace(path) as fh:
            while seen < offset:
                block = fh.read(min(_READ_BYTES, offset - seen))
                if not block:
                    break
                line += block.count(b"\n")
                seen += len(block)
    except (OSError, *GZIP_ERRORS):
        return f"byte {offset}"
    return f"byte {offset}, line {line}"


def _gzip_error(path: Path, err: BaseException, offset: int) -> TraceFormatError:
    what = "the gzip stream is truncated" if isinstance(err, EOFError) else f"the gzip stream is corrupt ({err})"
    return TraceFormatError(str(path), f"{what}, after {offset} decompressed bytes")


class _Prefetch:
    """Reads blocks of a stream in a thread (gzip: decompression beside the decoder)."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.q: queue.Queue[Any] = queue.Queue(_PREFETCH_BLOCKS)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gpudoctor-gunzip", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                block = self.fh.read(_READ_BYTES)
                self._put(block)
                if not block:
                    return
        except BaseException as err:  # handed to the reader, raised there  # noqa: BLE001
            self._put(err)

    def _put(self, item: Any) -> None:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=_PUT_WAIT_S)
                return
            except queue.Full:
                continue

    def read(self) -> bytes:
        item = self.q.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """Stop the thread: a block waiting for room in the queue is dropped at once (joining
        a thread that notices ``stop`` only at its put's timeout cost the first part of a split
        gzipped trace ~0.1 s, on the path to the report)."""
        self.stop.set()
        while self.thread.is_alive():
            try:
                while True:
                    self.q.get_nowait()
            except queue.Empty:
                pass
            self.thread.join(0.005)


class _Reader:
    """A window on the decompressed stream in one reused buffer: ``buf[:end]`` holds the
    stream from offset ``base``. The file is read straight into the buffer (``readinto``)
    and ``drop`` moves the unread tail to the front: about a third of the copying that
    appending blocks to a growing ``bytearray`` costs."""

    def __init__(self, path: Path, fh: BinaryIO, base: int = 0, prefetch: bool = False) -> None:
        self.path = path
        self.fh = fh
        self.buf = bytearray(_BUFFER_BYTES)
        self.end = 0
        self.base = base
        self.eof = False
        self.pre = _Prefetch(fh) if prefetch else None
        self.pending = memoryview(b"")

    def _room(self, need: int) -> None:
        """Make ``len(buf) >= need`` (one event larger than the buffer, a long header)."""
        if need > len(self.buf):
            grown = bytearray(max(need, 2 * len(self.buf)))
            grown[: self.end] = memoryview(self.buf)[: self.end]
            self.buf = grown

    def _read_more(self, want: int) -> int:
        """Read what fits after ``end`` (the buffer grows only when ``want`` exceeds it); 0: the end."""
        self._room(want)
        if self.pre is not None:
            block = self.pending if len(self.pending) else memoryview(self.pre.read())
            k = min(len(block), len(self.buf) - self.end)
            self.buf[self.end : self.end + k] = block[:k]
            self.pending = block[k:]  # what did not fit: the next read's
            return k
        with memoryview(self.buf) as mv:
            return self.fh.readinto(mv[self.end :]) or 0  # type: ignore[attr-defined]

    def fill(self, want: int) -> None:
        """Read until ``end >= want`` or the end of the stream."""
        while not self.eof and self.end < want:
            try:
                n = self._read_more(want)
            except GZIP_ERRORS as err:
                raise _gzip_error(self.path, err, self.base + self.end) from None
            except OSError as err:
                raise TraceFormatError(str(self.path), f"cannot read it ({err})") from None
            if not n:
                self.eof = True
            self.end += n

    def fill_all(self) -> None:
        """Read to the end of the stream (what follows the last piece: small)."""
        while not self.eof:
            self.fill(self.end + _READ_BYTES)

    def consumed(self, cur: int, want: int) -> int:
        """The caller is done with ``buf[:cur - 1]`` and will next want ``buf[:want]``:
        when that would not fit, the unread tail moves to the front. Returns ``cur`` in the
        (possibly moved) buffer."""
        if want <= len(self.buf) or cur <= 1:
            return cur
        n = cur - 1
        keep = self.end - n
        self.buf[:keep] = self.buf[n : self.end]  # a copy first: the ranges overlap
        self.end = keep
        self.base += n
        return 1

    def close(self) -> None:
        if self.pre is not None:
            self.pre.close()


def _find_cut(buf: bytearray, start: int, limit: int, end: int) -> int:
    """Position of the last ``}`` in ``buf[start:limit]`` followed by ``,`` and ``{`` within
    ``buf[:end]`` (-1: none)."""
    pos = buf.rfind(b"}", start, limit)
    while pos >= 0:
        if _SEP.match(buf, pos, end):
            return pos
        pos = buf.rfind(b"}", start, pos)
    return -1


def _next_start(buf: bytearray, cut: int, end: int) -> int:
    """Where the event after the separator at ``cut`` begins (its ``{``)."""
    m = _SEP.match(buf, cut, end)
    assert m is not None
    return m.end() - 1


def _decode_object(text: bytes) -> Any:
    try:
        return _ANY_DECODER.decode(text)
    except msgspec.DecodeError:
        return json.loads(text.decode("utf-8", errors="replace"))  # NaN, Infinity


def _decode_header(raw: bytes) -> dict[str, Any]:
    """Decode the text before ``"traceEvents"`` (``{ "k": v, …,``) as an object."""
    text = raw.rstrip(b" \t\r\n")
    if text.endswith(b","):
        text = text[:-1]
    try:
        obj = _decode_object(bytes(text) + b"}")
    except ValueError as err:
        raise NeedsFallback(f"the header before traceEvents does not decode ({err})") from None
    if not isinstance(obj, dict):
        raise NeedsFallback("the header is not an object")
    return obj


def _error_pos(err: msgspec.DecodeError) -> int | None:
    m = _BYTE_POS.search(str(err))
    return int(m.group(1)) if m is not None else None


class _Pieces:
    """Decodes ``traceEvents`` piece by piece into a builder."""

    def __init__(self, path: Path, r: _Reader, builder: ColumnBuilder, chunk_bytes: int) -> None:
        self.path = path
        self.r = r
        self.builder = builder
        self.chunk_bytes = chunk_bytes
        self.known = True  # every category and phase so far is a known one (``KnownEvent``)

    def corrupt(self, offset: int, what: str) -> TraceFormatError:
        return TraceFormatError(
            str(self.path),
            f"corrupt JSON ({what}) at {locate(self.path, offset)}, after {self.builder.event_count} events",
        )

    def decode(self, cur: int, cut: int) -> int:
        """Decode ``buf[cur:cut + 1]`` (whole events from a true event start) as one array.

        ``DECODED``; ``WRONG_CUT`` when ``cut`` is not the end of an event of the array (a
        ``}`` inside a string or a nested value); ``ARRAY_END`` when the array ends inside
        the piece (the ``}`` is in what follows ``traceEvents``); ``TraceFormatError``
        where the JSON is corrupt."""
        buf = self.r.buf
        saved_open, saved_close = buf[cur - 1], buf[cut + 1]
        buf[cur - 1] = 0x5B  # "["
        buf[cut + 1] = 0x5D  # "]"
        # a copy (one memcpy): the decoded msgspec.Raw values point into it, and a view of
        # the growing buffer could not be released while anything (a sampling profiler's
        # frame, say) still held one
        piece = buf[cur - 1 : cut + 2]
        buf[cur - 1], buf[cut + 1] = saved_open, saved_close
        size = len(piece)
        items: Any = None
        try:
            events = self._typed(piece)
        except msgspec.ValidationError:  # well-formed? then convert leniently
            events = None
            try:
                items = _ANY_DECODER.decode(piece)
            except msgspec.DecodeError as err:
                pos = _error_pos(err)
                if pos is None or pos >= size - 1:
                    return WRONG_CUT
                items = self._python_json(piece, cur)
        except msgspec.DecodeError as err:
            pos = _error_pos(err)
            if pos is None or pos >= size - 1:
                return WRONG_CUT
            events = None
            items = self._python_json(piece, cur)
        if isinstance(items, int):
            return items
        if events is not None:
            self.builder.add_events(events)
        else:
            self.builder.add_dicts(items)
        return DECODED

    def _typed(self, piece: bytearray) -> list[Any]:
        """The piece's events as ``KnownEvent``s; once a piece has a category or phase that is
        not a known one, as ``Event``s (the same fields) for the rest of the part."""
        if self.known:
            try:
                return KNOWN_EVENTS_DECODER.decode(piece)
            except msgspec.ValidationError:
                events = EVENTS_DECODER.decode(piece)  # raises where the types, not the names, are odd
                self.known = False
                return events
        return EVENTS_DECODER.decode(piece)

    def _python_json(self, piece: bytearray, cur: int) -> list[Any] | int:
        """The standard library's reading of a piece msgspec refused in the middle (it also
        reads NaN and Infinity): the events, or ``WRONG_CUT``/``ARRAY_END``; raises where the
        JSON is corrupt."""
        text = piece.decode("utf-8", errors="surrogateescape")
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            if err.pos >= len(text) - 1 or err.msg.startswith("Unterminated string"):
                return WRONG_CUT
            if err.msg.startswith("Extra data"):
                return ARRAY_END
            offset = self.r.base + cur - 1 + len(text[: err.pos].encode("utf-8", errors="surrogateescape"))
            raise self.corrupt(offset, err.msg) from None
        return items if isinstance(items, list) else [items]

    def exact_cut(self, cur: int, limit: int) -> int:
        """The last true event end in ``buf[cur:limit]`` that a ``{`` follows, found by walking
        the events with the standard library's scanner (when candidate cuts were wrong);
        -1 when the first event does not end before ``limit``."""
        text = bytes(self.r.buf[cur:limit]).decode("utf-8", errors="surrogateescape")
        dec = json.JSONDecoder()
        pos = _WS.match(text, 0).end()  # type: ignore[union-attr]
        last = -1  # index in text of the last good "}"
        while True:
            try:
                _, end = dec.raw_decode(text, pos)
            except json.JSONDecodeError as err:
                if err.msg.startswith("Unterminated") or len(text) - err.pos < 64:
                    break  # the window ends inside this event
                offset = self.r.base + cur + len(text[: err.pos].encode("utf-8", errors="surrogateescape"))
                raise self.corrupt(offset, err.msg) from None
            nxt = _WS.match(text, end).end()  # type: ignore[union-attr]
            if nxt >= len(text) or text[nxt] != ",":
                break  # the end of the array (or of the window)
            after = _WS.match(text, nxt + 1).end()  # type: ignore[union-attr]
            if after >= len(text):
                break
            if text[after] == "{" and text[end - 1] == "}":
                last = end - 1
            pos = after
        if last < 0:
            return -1
        return cur + len(text[:last].encode("utf-8", errors="surrogateescape"))

    def run(self, cur: int, stop_target: int | None = None, start_cut: int | None = None) -> tuple[int, int]:
        """Decode from buffer position ``cur`` (a true event start) until no whole event is
        left before the end of the array: returns (the buffer position where the rest
        begins, ``END``). With ``stop_target`` (a stream offset), the part ends instead
        with the event before the first separator whose ``}`` is at or after it:
        returns (-1, ``STOPPED``) when that ``}`` proved an event end, (-1, ``UNPROVEN``)
        when it did not (or the array ended first), and (rest, ``END``) when the file has
        no separator after ``stop_target``. ``start_cut``: the stream offset of the separator
        this part started after (None: the start of the array)."""
        r = self.r
        window = self.chunk_bytes
        stop_cut = -1  # stream offset of the "}" this part ends with, once found
        while True:
            r.fill(cur + window + 64)
            limit = min(r.end, cur + window)
            if stop_target is not None and stop_cut < 0 and r.base + r.end > stop_target:
                if stop_target < r.base:
                    return -1, UNPROVEN
                # the same rule as the next part's start: the first separator at or after the target
                m = _SEP.search(r.buf, stop_target - r.base, r.end)
                if m is not None:
                    stop_cut = r.base + m.start()
                elif r.eof:
                    stop_target = None  # nothing after it: this part reads to the end
            if stop_target is not None:
                if stop_cut >= 0 and stop_cut - r.base < limit:
                    cut = stop_cut - r.base
                    if cut < cur:  # at or before this part's own start
                        return -1, STOPPED if stop_cut == start_cut else UNPROVEN
                    return -1, STOPPED if self.decode(cur, cut) == DECODED else UNPROVEN
                limit = min(limit, stop_target - r.base)  # never cut at or past the target
            cut = _find_cut(r.buf, cur, limit, r.end)
            status = self.decode(cur, cut) if cut >= 0 else WRONG_CUT
            tries = 0
            while status == WRONG_CUT and cut >= 0 and tries < 2:  # a "}" in a string: an earlier one
                cut = _find_cut(r.buf, cur, cut, r.end)
                status = self.decode(cur, cut) if cut >= 0 else WRONG_CUT
                tries += 1
            if status == WRONG_CUT and tries == 2:  # walk the events to the last true boundary
                cut = self.exact_cut(cur, limit)
                status = self.decode(cur, cut) if cut >= 0 else WRONG_CUT
                if cut >= 0 and status == WRONG_CUT:
                    raise self.corrupt(r.base + cut, "an event boundary that does not decode")
            if status == ARRAY_END:
                return (-1, UNPROVEN) if stop_target is not None else (cur, END)
            if status == WRONG_CUT:  # no whole event in the window
                if r.eof and limit >= r.end:
                    return (-1, UNPROVEN) if stop_target is not None else (cur, END)
                if window >= MAX_EVENT_BYTES:
                    raise TraceFormatError(
                        str(self.path),
                        f"an event larger than {MAX_EVENT_BYTES >> 20} MiB at {locate(self.path, r.base + cur)}",
                    )
                window *= 2  # one event bigger than the window, or no separator yet
                continue
            window = self.chunk_bytes
            cur = _next_start(r.buf, cut, r.end)
            cur = r.consumed(cur, cur + window + 64)


def _decode_rest(path: Path, text: bytes, base: int, builder: ColumnBuilder, tail: dict[str, Any]) -> None:
    """The end of the stream: the last events, ``]``, then the rest of the top-level object.

    Uses the standard library's scanner one value at a time, which says exactly where a
    truncated or corrupt file broke.
    """
    s = text.decode("utf-8", errors="surrogateescape")
    dec = json.JSONDecoder()
    pos = _WS.match(s, 0).end()  # type: ignore[union-attr]

    def fail(at: int, what: str) -> TraceFormatError:
        offset = base + len(s[:at].encode("utf-8", errors="surrogateescape"))
        end = at >= len(s.rstrip())
        kind = "truncated: the file ends inside traceEvents" if end else f"corrupt JSON ({what})"
        return TraceFormatError(
            str(path), f"{kind} at {locate(path, offset)}, after {builder.event_count} events"
        )

    events: list[Any] = []
    first = True
    while True:
        if pos >= len(s):
            raise fail(pos, "unexpected end")
        if s[pos] == "]":
            pos += 1
            break
        if not first:
            if s[pos] != ",":
                raise fail(pos, "expected ',' or ']' between events")
            pos = _WS.match(s, pos + 1).end()  # type: ignore[union-attr]
        try:
            obj, pos = dec.raw_decode(s, pos)
        except json.JSONDecodeError as err:
            raise fail(err.pos, err.msg) from None
        first = False
        events.append(obj)
        pos = _WS.match(s, pos).end()  # type: ignore[union-attr]
    builder.add_dicts(events)
    # the rest of the top-level object (absent for a top-level array)
    pos = _WS.match(s, pos).end()  # type: ignore[union-attr]
    rest = s[pos:].strip()
    if not rest:
        return
    if rest.startswith(","):
        try:
            more = json.loads("{" + rest[1:])
        except json.JSONDecodeError as err:
            raise TraceFormatError(
                str(path), f"corrupt JSON after traceEvents ({err.msg}) at {locate(path, base + len(text) - len(rest))}"
            ) from None
        if isinstance(more, dict):
            tail.update(more)
    elif rest != "}":
        raise TraceFormatError(str(path), f"unexpected text after traceEvents at {locate(path, base + len(text) - len(rest))}")


@dataclass(frozen=True, slots=True)
class TraceStart:
    """Where the events of a trace begin: the header and the stream offset after ``[``."""

    header: dict[str, Any]
    offset: int


def _read_start(path: Path, r: _Reader) -> tuple[dict[str, Any], int]:
    """Read up to the ``[`` of ``traceEvents``: the header and the buffer position after ``[``."""
    want = 1 << 20
    while True:
        r.fill(want)
        lead = _LEAD_WS.match(r.buf, 0, r.end).end()  # type: ignore[union-attr] - (no copy of the buffer)
        if lead == r.end:
            raise TraceFormatError(str(path), "the file is empty")
        stripped = r.buf[lead : min(lead + 20, r.end)]
        first = stripped[:1]
        if first == b"[":  # the JSON Array Format: a bare list of events
            return {}, r.buf.index(b"[", 0, r.end) + 1
        if first != b"{":
            raise TraceFormatError(
                str(path), f"it does not start with a JSON object or array (starts with {bytes(stripped[:20])!r})"
            )
        m = _KEY.search(r.buf, 0, r.end)
        if m is not None:
            return _decode_header(bytes(r.buf[: m.start()])), m.end()
        if r.eof:
            raise TraceFormatError(
                str(path), "no traceEvents array", "it is JSON but not a Kineto/Chrome trace; pass a torch.profiler trace"
            )
        if r.end >= HEADER_LIMIT:
            raise NeedsFallback("no traceEvents array near the start of the file")
        want *= 2


def find_start(path: Path) -> TraceStart:
    """The header and where the events begin (``NeedsFallback``/``TraceFormatError`` as above)."""
    try:
        fh = open_trace(path)
    except OSError as err:
        raise TraceFormatError(str(path), f"cannot open it ({err})") from None
    with fh:
        r = _Reader(path, fh)
        header, start = _read_start(path, r)
        return TraceStart(header=header, offset=r.base + start)


def read_trace_chunked(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Timeline:
    """The whole file in one process. Raises ``NeedsFallback`` for what it does not read."""
    part = read_part(path, None, None, chunk_bytes)
    if part.builder.needs_flows:  # GPU activity without correlation ids: read again, flows kept
        part = read_part(path, None, None, chunk_bytes, keep_flows=True)
    return part.builder.build(Header.from_json({**part.header, **part.tail}))


@dataclass(slots=True)
class PartResult:
    """One part of a trace decoded by ``read_part`` (it travels between processes)."""

    builder: ColumnBuilder
    started: bool  # False: no separator after the part's target (the part before read on)
    ended: int  # END (the part read to the end of the file), STOPPED or UNPROVEN
    header: dict[str, Any]  # the first part's
    tail: dict[str, Any]  # what follows traceEvents (the part that read to the end)


def _skip_to(path: Path, fh: BinaryIO, target: int) -> None:
    """Advance a stream to ``target`` (a plain file seeks; gzip decompresses and discards)."""
    if not isinstance(fh, gzip.GzipFile):
        fh.seek(target)
        return
    left = target
    try:
        while left > 0:
            block = fh.read(min(left, _READ_BYTES))
            if not block:
                return
            left -= len(block)
    except GZIP_ERRORS as err:
        raise _gzip_error(path, err, target - left) from None


def read_part(path: Path, target: int | None, stop_target: int | None, chunk_bytes: int = CHUNK_BYTES,
              keep_flows: bool = False) -> PartResult:
    """Decode one part of a trace's events (plain or gzip).

    The first part (``target`` None) starts at the first event and also reads the header.
    Another starts with the event after the first separator (``}`` ``,`` ``{``) whose ``}``
    is at or after stream offset ``target``; it ends with the event before the first such
    separator at or after ``stop_target`` (None: at the end of the file, tail included).
    The neighbouring parts compute the same separator from the same bytes, so the parts
    tile the array exactly once every part but the first proves true by the part before
    it ending ``STOPPED``. A part whose start is not proven may raise a
    ``TraceFormatError`` that is not one: the caller raises it only once proven."""
    try:
        fh = open_trace(path)
    except OSError as err:
        raise TraceFormatError(str(path), f"cannot open it ({err})") from None
    with fh:
        builder = ColumnBuilder(str(path), parser="chunked", keep_flows=keep_flows)
        prefetch = isinstance(fh, gzip.GzipFile)  # decompress in a thread, beside the decoder
        if target is None:
            r = _Reader(path, fh, prefetch=prefetch)
        else:
            _skip_to(path, fh, target)
            r = _Reader(path, fh, base=target, prefetch=prefetch)
        try:
            return _read_part(path, r, builder, target, stop_target, chunk_bytes)
        finally:
            r.close()


def _read_part(path: Path, r: _Reader, builder: ColumnBuilder, target: int | None, stop_target: int | None,
               chunk_bytes: int) -> PartResult:
    header: dict[str, Any] = {}
    start_cut: int | None = None
    if target is None:
        header, cur = _read_start(path, r)
    else:
        want = 1 << 20
        while True:
            r.fill(want)
            m = _SEP.search(r.buf, 0, r.end)
            if m is not None:
                cur = m.end() - 1
                start_cut = target + m.start()
                break
            if r.eof:
                return PartResult(builder, False, END, header, {})
            want *= 2
    cur, ended = _Pieces(path, r, builder, chunk_bytes).run(cur, stop_target, start_cut)
    tail: dict[str, Any] = {}
    if ended == END:
        r.fill_all()
        _decode_rest(path, bytes(r.buf[cur : r.end]), r.base + cur, builder, tail)
    return PartResult(builder, True, ended, header, tail)


def stream_size(path: Path) -> int:
    """Bytes of JSON text: the file's size, or for gzip the size its trailer states (modulo
    4 GiB: a hint for splitting, never trusted for correctness)."""
    size = path.stat().st_size
    if not is_gzip(path):
        return size
    with open(path, "rb") as fh:
        fh.seek(max(size - 4, 0))
        return int.from_bytes(fh.read(4), "little")
