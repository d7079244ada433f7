"""One large trace read by several processes: its events split in byte ranges, joined in order.

``read_trace_split(path, parts, executor)`` cuts the events of a trace into ``parts``
byte ranges of about equal size. This process reads the first (and the header); the
executor's processes read the others (``kineto.read_part``): each starts after the
first event separator at or after its target offset and stops at the next part's, so
neighbouring parts agree on the boundary without talking to each other (a gzipped trace
is decompressed up to its part's target by the process reading that part). The parts'
column builders come back (their columns through an in-memory file each process inherits,
``read_part_into``; the rest pickled) and are appended in file order
(``ColumnBuilder.extend``): the ``Timeline`` is the one a single process builds.

A boundary is used only once the part before it ended by decoding an event that closes
exactly there (``STOPPED``): until then, the later part may have started inside a string
and its results, errors included, are not trusted. If a boundary cannot be proved (a
separator inside a string, a split point past the end of the array) or a process dies,
the file is read again in one process. Nothing here is a scheduler of its own: the
caller passes a ``concurrent.futures`` executor.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Executor, Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from gpudoctor.errors import TraceFormatError
from gpudoctor.model.trace import Timeline
from gpudoctor.parse.events import Header
from gpudoctor.parse.kineto import (
    CHUNK_BYTES,
    END,
    STOPPED,
    PartResult,
    find_start,
    is_gzip,
    read_part,
    read_trace_chunked,
    stream_size,
)

SPLIT_MIN_BYTES = 96 << 20  # a trace smaller than this (JSON text) is read by one process
PART_MIN_BYTES = 48 << 20  # each part at least this much


FIRST_PART_SHARE = 0.9  # the first part (read here, then joined here) is this fraction of an even share
# a gzipped trace: every part but the first decompresses the stream up to its start first,
# which ISA-L does at ~4 GB/s here (330 MB in 0.08 s; zlib 0.31 s): an even share. Measured on 2
# idle cores, 330 MB gzipped, best of 3: share 0.9 2.07 s, 1.0 2.08 s, 1.2 2.09 s
GZIP_FIRST_PART_SHARE = 1.0


def split_count(path: Path, parts: int) -> int:
    """How many parts are worth it for this trace (1: read it in one process)."""
    if parts < 2:
        return 1
    size = stream_size(path)
    if size < SPLIT_MIN_BYTES:
        return 1
    return max(1, min(parts, size // PART_MIN_BYTES))


def read_trace_split(path: Path, parts: int, executor: Executor, chunk_bytes: int = CHUNK_BYTES,
                     meanwhile: Callable[[], object] | None = None) -> Timeline:
    """Read ``path`` in ``parts`` parts, all but the first in ``executor``'s processes;
    ``meanwhile`` (see :func:`read_split_at`)."""
    if parts < 2:
        return read_trace_chunked(path, chunk_bytes)
    start = find_start(path)  # the header is read (and checked) before any work is handed out
    size = stream_size(path)
    if size <= start.offset:
        return read_trace_chunked(path, chunk_bytes)
    # this process also joins the parts and builds the Timeline: its part is a little smaller;
    # for gzip, even: the other processes first decompress the stream up to their part
    span = size - start.offset
    share = GZIP_FIRST_PART_SHARE if is_gzip(path) else FIRST_PART_SHARE
    first = int(span * share) // parts
    targets = [start.offset + first + (span - first) * (k - 1) // (parts - 1) for k in range(1, parts)]
    return read_split_at(path, targets, executor, chunk_bytes, meanwhile)


def read_split_at(path: Path, targets: list[int], executor: Executor, chunk_bytes: int = CHUNK_BYTES,
                  meanwhile: Callable[[], object] | None = None) -> Timeline:
    """Read ``path`` in parts that start at the separators after ``targets`` (increasing
    stream offsets), all but the first in ``executor``.

    ``meanwhile``: work of the caller's that this process does once its own part is read,
    while the other parts are still being read or sent back (the caller's imports: the
    processes reading the others start that much earlier). It runs once, if the other
    parts are not all back by then; an exception in it is left for the caller to meet
    again (it is work the caller would do anyway)."""
    stops: list[int | None] = [*targets[1:], None]
    files = [_part_file() for _ in targets]
    try:
        return _read_split(path, targets, stops, files, executor, chunk_bytes, meanwhile)
    finally:
        for f in files:
            if f is not None:
                os.close(f[0])


def _part_file() -> tuple[int, tuple[int, int]] | None:
    """An anonymous in-memory file for one part's columns (Linux's memfd), and its identity;
    None where there is none (the columns come back pickled through the pool's pipe)."""
    create = getattr(os, "memfd_create", None)
    if create is None:
        return None
    try:
        fd = create("gpudoctor-part")
    except OSError:
        return None
    st = os.fstat(fd)
    return fd, (st.st_dev, st.st_ino)


def read_part_into(file: tuple[int, tuple[int, int]] | None, path: Path, target: int | None,
                   stop_target: int | None, chunk_bytes: int = CHUNK_BYTES) -> PartResult:
    """``read_part`` in a process of the pool, its columns written to ``file``: a descriptor the
    process inherited when it was forked, checked to be that very file (a process started
    otherwise, or earlier, has no such descriptor: then the columns are pickled back).

    Through the pool's pipe, a part's 24 MB of columns took 0.1-0.25 s to reach the joining
    process here (the pipe moves 64 KiB at a time, each read by a thread of the process that is
    busy reading its own part); through the file, 0.02 s."""
    part = read_part(path, target, stop_target, chunk_bytes)
    if file is not None:
        fd, ident = file
        try:
            st = os.fstat(fd)
        except OSError:
            return part
        if (st.st_dev, st.st_ino) == ident:
            try:
                part.builder.spill(fd)
            except OSError:  # no memory left for the file: the columns (whole until spilled) go pickled
                pass
    return part


def _read_split(path: Path, targets: list[int], stops: list[int | None],
                files: list[tuple[int, tuple[int, int]] | None], executor: Executor, chunk_bytes: int,
                meanwhile: Callable[[], object] | None) -> Timeline:
    futures: list[Future] = []
    try:
        futures = [executor.submit(read_part_into, f, path, t, s, chunk_bytes)
                   for f, t, s in zip(files, targets, stops, strict=True)]
    except (BrokenProcessPool, RuntimeError):
        futures = []
    if not futures:
        return read_trace_chunked(path, chunk_bytes)
    try:
        first = read_part(path, None, targets[0], chunk_bytes)
    except BaseException:
        for f in futures:
            f.cancel()
        raise
    builder, header, tail = first.builder, first.header, first.tail
    ended = first.ended
    if meanwhile is not None and ended == STOPPED and not all(f.done() for f in futures):
        try:
            meanwhile()
        except Exception:  # noqa: BLE001, S110 - the caller does the same work again and meets it there
            pass
    for i, fut in enumerate(futures):
        if ended == END:  # the part before read to the end: the rest found no separator
            for f in futures[i:]:
                f.cancel()
            break
        if ended != STOPPED:  # the boundary is not proven: read the file in one piece
            for f in futures[i:]:
                f.cancel()
            return read_trace_chunked(path, chunk_bytes)
        try:
            part = fut.result()
        except BrokenProcessPool:
            return read_trace_chunked(path, chunk_bytes)
        except TraceFormatError:  # its start is proven: the error is the file's
            for f in futures[i + 1 :]:
                f.cancel()
            raise
        if not part.started:  # cannot be: the part before found a separator after this one's target
            return read_trace_chunked(path, chunk_bytes)
        f = files[i]
        if part.builder.spilled is not None:
            try:
                part.builder.unspill(f[0] if f is not None else -1)
            except (OSError, EOFError):  # the file lost what was written to it: read the trace in one piece
                return read_trace_chunked(path, chunk_bytes)
        builder.extend(part.builder)
        del part.builder
        tail = part.tail
        ended = part.ended
    if ended != END or builder.needs_flows:  # (GPU activity without correlation ids: flows needed)
        return read_trace_chunked(path, chunk_bytes)
    return builder.build(Header.from_json({**header, **tail}))
