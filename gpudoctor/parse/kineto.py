"""Kineto (Chrome trace JSON) → ``Timeline``, in bounded memory.

Fast path (``parser="chunked"``): the file (plain or gzip) is read in blocks; the
``traceEvents`` array is cut into ~4 MiB pieces at event boundaries and each piece
is decoded by msgspec into typed structs that hold only the fields gpudoctor uses;
the structs go straight into compact columns (``ColumnBuilder``) and are dropped.
The header (``deviceProperties``, ``distributedInfo`` …) and the tail after the array
(``traceName``, ``baseTimeNanoseconds`` …) are decoded separately.

Cutting at ``},`` + newline + ``{`` assumes the writer's layout (Kineto and
``json.dump(indent=…)`` both write it; a JSON string cannot hold a raw newline). When
that assumption fails (minified JSON, values of unexpected types, an array that is not
where it should be), the file is read again by the streaming fallback
(``parse/stream.py``), which reads any valid JSON one event at a time.

A truncated or corrupt file raises ``TraceFormatError`` naming the file and where it
broke (byte offset and line in the decompressed text).
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from gpudoctor.errors import TraceFormatError
from gpudoctor.model.trace import Timeline
from gpudoctor.parse.columns import ColumnBuilder, Event, Header

CHUNK_BYTES = 4 << 20  # decode this much of traceEvents at a time (smaller: less memory, same speed)
HEADER_LIMIT = 64 << 20  # "traceEvents" must start within this many bytes
_READ_BYTES = 4 << 20

_EVENTS_DECODER = msgspec.json.Decoder(list[Event])
_ANY_DECODER = msgspec.json.Decoder()
_BRACE_AFTER_WS = re.compile(rb"[ \t\r\n]*\{")
_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
_BYTE_POS = re.compile(r"\(byte (\d+)\)")

__all__ = ["CHUNK_BYTES", "NeedsFallback", "open_trace", "read_trace_chunked", "locate"]


class NeedsFallback(Exception):
    """The fast path cannot read this layout; the streaming parser should."""


def open_trace(path: Path) -> BinaryIO:
    """The decompressed byte stream of a trace (gzip detected by its magic bytes)."""
    fh = open(path, "rb")  # noqa: SIM115 - returned to the caller
    magic = fh.read(2)
    fh.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=fh, mode="rb")  # type: ignore[return-value]
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
    except (OSError, EOFError, zlib.error):
        return f"byte {offset}"
    return f"byte {offset}, line {line}"


def _gzip_error(path: Path, err: BaseException, offset: int) -> TraceFormatError:
    what = "the gzip stream is truncated" if isinstance(err, EOFError) else f"the gzip stream is corrupt ({err})"
    return TraceFormatError(str(path), f"{what}, after {offset} decompressed bytes")


class _Reader:
    """A growing window on the decompressed stream: ``buf[0]`` is at stream offset ``base``."""

    def __init__(self, path: Path, fh: BinaryIO) -> None:
        self.path = path
        self.fh = fh
        self.buf = bytearray()
        self.base = 0
        self.eof = False

    def fill(self, want: int) -> None:
        """Read until ``len(buf) >= want`` or the end of the stream."""
        while not self.eof and len(self.buf) < want:
            try:
                block = self.fh.read(max(_READ_BYTES, want - len(self.buf)))
            except (EOFError, zlib.error, gzip.BadGzipFile) as err:
                raise _gzip_error(self.path, err, self.base + len(self.buf)) from None
            except OSError as err:
                raise TraceFormatError(str(self.path), f"cannot read it ({err})") from None
            if not block:
                self.eof = True
            else:
                self.buf += block

    def drop(self, n: int) -> None:
        del self.buf[:n]
        self.base += n


def _find_cut(buf: bytearray, start: int, limit: int) -> int:
    """Position of the ``}`` that ends the last whole event in ``buf[start:limit]`` (-1: none)."""
    pos = buf.rfind(b"},\n", start, limit)
    while pos >= 0:
        if _BRACE_AFTER_WS.match(buf, pos + 2):
            return pos
        pos = buf.rfind(b"},\n", start, pos)
    return -1


def _decode_header(raw: bytes) -> dict[str, Any]:
    """Decode the text before ``"traceEvents"`` (``{ "k": v, …,``) as an object."""
    text = raw.rstrip(b" \t\r\n")
    if text.endswith(b","):
        text = text[:-1]
    obj = _ANY_DECODER.decode(bytes(text) + b"}")
    if not isinstance(obj, dict):
        raise NeedsFallback("the header is not an object")
    return obj


def _decode_rest(path: Path, text: bytes, base: int, builder: ColumnBuilder, tail: dict[str, Any]) -> None:
    """The end of the stream: the last events, ``]``, then the rest of the top-level object.

    Uses the standard library's scanner one value at a time, which says exactly where a
    truncated or corrupt file broke.
    """
    s = text.decode("utf-8", errors="surrogateescape")
    dec = json.JSONDecoder()
    ws = re.compile(r"[ \t\r\n]*")
    pos = ws.match(s, 0).end()  # type: ignore[union-attr]

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
            pos = ws.match(s, pos + 1).end()  # type: ignore[union-attr]
        try:
            obj, pos = dec.raw_decode(s, pos)
        except json.JSONDecodeError as err:
            raise fail(err.pos, err.msg) from None
        first = False
        events.append(obj)
        pos = ws.match(s, pos).end()  # type: ignore[union-attr]
    builder.add_dicts(events)
    # the rest of the top-level object (absent for a top-level array)
    pos = ws.match(s, pos).end()  # type: ignore[union-attr]
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


def read_trace_chunked(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Timeline:
    """The fast path. Raises ``NeedsFallback`` for layouts it does not handle."""
    try:
        fh = open_trace(path)
    except OSError as err:
        raise TraceFormatError(str(path), f"cannot open it ({err})") from None
    with fh:
        r = _Reader(path, fh)
        # --- header: up to the "traceEvents": [ key
        header: dict[str, Any] = {}
        start = -1
        want = 1 << 20
        while True:
            r.fill(want)
            stripped = r.buf.lstrip()
            if not stripped:
                raise TraceFormatError(str(path), "the file is empty")
            first = stripped[:1]
            if first == b"[":  # the JSON Array Format: a bare list of events
                start = r.buf.index(b"[") + 1
                break
            if first != b"{":
                raise TraceFormatError(
                    str(path), f"it does not start with a JSON object or array (starts with {bytes(stripped[:20])!r})"
                )
            m = _KEY.search(r.buf)
            if m is not None:
                try:
                    header = _decode_header(bytes(r.buf[: m.start()]))
                except msgspec.DecodeError as err:
                    raise NeedsFallback(f"the header before traceEvents does not decode ({err})") from None
                start = m.end()
                break
            if r.eof or len(r.buf) >= HEADER_LIMIT:
                raise NeedsFallback("no traceEvents array near the start of the file")
            want *= 2

        builder = ColumnBuilder(str(path), parser="chunked")
        cur = start
        window = chunk_bytes
        while True:
            r.fill(cur + window + 1)
            limit = min(len(r.buf), cur + window)
            cut = _find_cut(r.buf, cur, limit)
            if cut < 0:
                if r.eof and limit >= len(r.buf):
                    break
                if window >= 8 * chunk_bytes and r.buf.find(b"\n", cur, limit) < 0:
                    raise NeedsFallback("no newline between events (minified JSON)")
                if window >= 64 * chunk_bytes:
                    raise NeedsFallback("no event boundary in the writer's layout")
                window *= 2  # one event bigger than the window, or no layout newline yet
                continue
            window = chunk_bytes
            buf = r.buf
            saved_open, saved_close = buf[cur - 1], buf[cut + 1]
            buf[cur - 1] = 0x5B  # "["
            buf[cut + 1] = 0x5D  # "]"
            view = memoryview(buf)[cur - 1 : cut + 2]
            try:
                events = _EVENTS_DECODER.decode(view)
            except msgspec.ValidationError as err:
                view.release()
                raise NeedsFallback(f"values of unexpected types ({err})") from None
            except msgspec.DecodeError as err:
                view.release()
                m = _BYTE_POS.search(str(err))
                if m is not None and int(m.group(1)) < len(buf[cur - 1 : cut + 2]) - 2:
                    offset = r.base + cur - 1 + int(m.group(1))
                    raise TraceFormatError(
                        str(path),
                        f"corrupt JSON ({str(err).split(' (byte')[0]}) at {locate(path, offset)}, "
                        f"after {builder.event_count} events",
                    ) from None
                raise NeedsFallback(f"a piece cut at an event boundary does not decode ({err})") from None
            try:
                builder.add_events(events)
            finally:
                del events
                view.release()
            buf[cur - 1], buf[cut + 1] = saved_open, saved_close
            cur = cut + 2
            if cur > chunk_bytes:
                r.drop(cur - 1)
                cur = 1
        # --- the rest: last events, "]", the tail of the top-level object
        tail: dict[str, Any] = {}
        _decode_rest(path, bytes(r.buf[cur:]), r.base + cur, builder, tail)
    header.update(tail)
    return builder.build(Header.from_json(header))

