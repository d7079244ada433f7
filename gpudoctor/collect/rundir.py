"""The run directory on disk: names, atomic writes, line files (see docs/run-directory.md).

Writes that cannot lie: every file is written under a temporary name and renamed into
place once complete; a write that fails (a full disk, a file-size limit, a path the
system refuses) raises or records its ``OSError`` with the system's reason
(:func:`os_reason`), leaves no temporary file behind and never removes the previous
version. A trace is deleted only once its gzipped copy has been read back whole
(:func:`verify_gzip`); a leftover that may be the only copy of something is kept under
a name that says so (:func:`settle_leftovers`).
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import re
import shutil
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The run directory's file names, rank tags and schema version are defined once, in
# ``gpudoctor.model.layout`` (collect, parse, the CLI, ``view`` and ``verify`` read them there);
# re-exported here for the callers that name them ``rundir.NAME``.
from gpudoctor.model.layout import (  # noqa: F401 - re-exported
    CHILD_STATE,
    INCOMPLETE_SUFFIX,
    MANIFEST,
    OUTPUT_LOG,
    PSTATS,
    SAMPLES,
    SETTINGS,
    STEPS,
    TMP_SUFFIX,
    TRACE_FILTER_KEY,
    TRACE_STACK_BOUND_KEY,
    TRACE_SUFFIX,
    VERIFY_DIR,
    plain_trace,
    rank_tagged,
    trace_name,
    worker_name,
)

# Space kept for the manifest's last write: the manifest written at the start is padded with
# this much whitespace (valid JSON), so that the final one can overwrite it in place on a
# disk that filled up during the run (docs/run-directory.md, "A full disk").
MANIFEST_RESERVE_BYTES = 32 * 1024


def run_stem(script: str | None, module: str | None) -> str:
    if module:
        base = module
    else:
        base = Path(script or "run").stem
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.") or "run"
    return base


def create_run_dir(out_dir: Path, stem: str, now: float | None = None) -> Path:
    """``out_dir/<stem>-<YYYYmmdd-HHMMSS>`` (``-2``, ``-3`` … when taken), created exclusively."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    base = f"{stem}-{stamp}"
    for i in range(1, 1000):
        path = out_dir / (base if i == 1 else f"{base}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{out_dir}: could not create a run directory named {base}-N")


def os_reason(err: BaseException) -> str:
    """The system's words for a failed write, with the errno's name: "No space left on device (ENOSPC)"."""
    if isinstance(err, OSError):
        name = errno.errorcode.get(err.errno or 0, "")
        text = err.strerror or str(err) or type(err).__name__
        return f"{text} ({name})" if name else text
    return f"{type(err).__name__}: {err}"


def _discard(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def write_bytes_atomic(path: Path, data: bytes, sync: bool = False) -> None:
    """Write ``data`` through a temporary name and a rename: a reader never sees half a file.

    On failure the temporary file is removed, an earlier ``path`` is left as it was, and
    the ``OSError`` is raised (:func:`os_reason` words it).
    """
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _discard(tmp)
        raise


def write_json_atomic(path: Path, obj: Any, reserve_bytes: int = 0) -> None:
    """Write JSON through a temporary file and a rename (see :func:`write_bytes_atomic`).

    ``reserve_bytes``: pad the file with that much trailing whitespace (still valid JSON),
    space that :func:`rewrite_json_in_place` can reuse when the disk is full.
    """
    text = json.dumps(obj, indent=2, sort_keys=False) + "\n"
    if reserve_bytes:
        text += " " * reserve_bytes + "\n"
    write_bytes_atomic(path, text.encode("utf-8"))


def rewrite_json_in_place(path: Path, obj: Any) -> None:
    """Overwrite ``path`` with ``obj`` inside the space it already holds (no new block needed).

    The fallback of a final manifest on a full disk: the padded manifest written at the
    start (``MANIFEST_RESERVE_BYTES``) is overwritten, the rest of it blanked. Raises
    ``OSError`` (ENOSPC) when the new text does not fit: the file is then untouched.
    """
    data = (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode("utf-8")
    size = path.stat().st_size
    if len(data) > size:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: the manifest needs {len(data):,} bytes, "
                      f"{size:,} were reserved")
    with open(path, "r+b") as f:
        f.write(data + b" " * (size - len(data)))
        f.flush()
        os.fsync(f.fileno())


def read_json(path: Path) -> Any | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # one encoder: its C fast path, built once


def above_stdio(fd: int) -> int:
    """``fd`` moved above 0-2 (close-on-exec). With stdout closed (``>&-``), a file or pipe opened
    for the run would take fd 1, and whatever writes to fd 1 (a subprocess of the script, say)
    would write into it."""
    if fd > 2:
        return fd
    import fcntl  # noqa: PLC0415

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return high


class JsonlWriter:
    """Appends one JSON object per line.

    ``flush_every_s`` 0: each line reaches the file at once (a killed writer loses at
    most the line it was writing). Above 0: lines are flushed at most that often, so a
    writer called on every training step costs one system call a second, and a writer
    killed outright loses at most that long of lines; :meth:`close` flushes the rest.

    A write that fails (a full disk: ENOSPC, a file-size limit: EFBIG …) never raises
    into the caller: the writer records it (``error``, ``lines_written``, ``lines_lost``)
    and drops the lines that follow, so the run goes on and its account says what was
    lost. The file then ends at its last complete line or mid-line (``repair_jsonl``).
    """

    def __init__(self, path: Path, flush_every_s: float = 0.0) -> None:
        self.path = path
        self.flush_every_s = flush_every_s
        self._last_flush = time.monotonic()
        self._fd = above_stdio(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644))
        self._pending: list[str] = []
        self._pending_lines = 0
        self.enabled = True
        self.error = ""  # the first write error, in the system's words ("" while none)
        self.lines_written = 0  # lines handed to the file system
        self.lines_lost = 0  # lines dropped after a write error

    def write(self, obj: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._add(_ENCODER.encode(obj) + "\n", 1)

    def write_many(self, objs: list[dict[str, Any]]) -> None:
        if not objs or not self.enabled:
            return
        self._add("".join(_ENCODER.encode(o) + "\n" for o in objs), len(objs))

    def write_text(self, text: str) -> None:
        """Lines already formatted (each ending in a newline)."""
        if not text or not self.enabled:
            return
        self._add(text, text.count("\n"))

    def _add(self, text: str, lines: int) -> None:
        if self.error:
            self.lines_lost += lines
            return
        self._pending.append(text)
        self._pending_lines += lines
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self.flush_every_s <= 0:
            self._write_pending()
            return
        now = time.monotonic()
        if now - self._last_flush >= self.flush_every_s:
            self._write_pending()
            self._last_flush = now

    def _write_pending(self) -> None:
        if not self._pending or self._fd < 0:
            return
        data = "".join(self._pending).encode("utf-8")
        lines = self._pending_lines
        self._pending.clear()
        self._pending_lines = 0
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                if n <= 0:
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
                view = view[n:]
        except OSError as err:
            done = data[: len(data) - len(view)].count(b"\n")
            self.lines_written += done
            self.lines_lost += lines - done
            self.error = os_reason(err)
            return
        self.lines_written += lines

    def flush(self) -> None:
        if self.enabled:
            self._write_pending()

    def close(self) -> None:
        if not self.enabled or self._fd < 0:
            return
        self._write_pending()
        try:
            os.close(self._fd)
        except OSError as err:
            self.error = self.error or os_reason(err)
        self._fd = -1

    def in_child_after_fork(self) -> None:
        """A forked process must not write (or flush at exit) the parent's buffered lines."""
        self.enabled = False
        self._pending.clear()

    def lost_text(self) -> str:
        """What the error cost, in words ("" when nothing was lost)."""
        if not self.error:
            return ""
        return f"{self.path.name}: {self.error}; {self.lines_lost:,} line(s) not written after the first {self.lines_written:,}"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSON-lines file (a torn last line is skipped)."""
    out: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    break
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    out.append(obj)
    except OSError:
        pass
    return out


def count_lines(path: Path) -> int:
    """Complete lines of a file (0 when it is missing)."""
    n = 0
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                n += chunk.count(b"\n")
    except OSError:
        return 0
    return n


def repair_jsonl(path: Path) -> bool:
    """Cut a torn last line (a writer killed mid-line). True when something was cut."""
    try:
        size = path.stat().st_size
    except OSError:
        return False
    if size == 0:
        return False
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return False
        f.seek(0)
        data = f.read()
        keep = data.rfind(b"\n") + 1
        f.truncate(keep)
    return True


GZIP_LEVEL = 1  # a trace is written once and read rarely: speed over size


def gzip_file(src: Path, dst: Path, level: int = GZIP_LEVEL) -> None:
    """Compress ``src`` into ``dst`` through a temporary name (readers never see half a file).

    The data reach the disk (``fsync``) before the rename, so a full disk fails here, not later.
    """
    tmp = dst.with_name(dst.name + TMP_SUFFIX)
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", compresslevel=level, fileobj=raw, mtime=0) as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, dst)
    except BaseException:
        _discard(tmp)
        raise


def verify_gzip(path: Path) -> str:
    """Read a gzip file back to its end (its CRC and length checked): "" when whole, else why not."""
    try:
        with gzip.open(path, "rb") as fh:
            while fh.read(1 << 22):
                pass
    except (OSError, EOFError, zlib.error) as err:
        return f"the gzipped copy does not read back ({type(err).__name__}: {err})"
    return ""


@dataclass(frozen=True)
class TraceWriteFailure:
    """A trace whose gzipped copy could not be written: the plain one is kept (``kept``)."""

    path: str  # the .gz name that could not be written
    error: str  # the system's reason
    kept: str  # the plain trace kept instead


def compress_trace(plain: Path, final: Path, level: int = GZIP_LEVEL) -> Any:
    """Gzip one plain trace into ``final``, its short Python calls left out (``tracefilter``).

    Returns the ``TraceFilterResult`` when the trace was filtered; None when it has no
    Python calls (gzipped as recorded); a string saying why when the filter failed: the
    trace is then gzipped as recorded, never lost. Raises ``OSError`` when no gzipped
    copy could be written; ``final`` then does not exist and ``plain`` is untouched.
    """
    from gpudoctor.collect import tracefilter  # noqa: PLC0415 - msgspec and numpy: not at start-up

    tmp = final.with_name(final.name + TMP_SUFFIX)
    outcome: Any = None
    if tracefilter.has_python_events(plain):
        try:
            outcome = tracefilter.filter_trace(plain, tmp, level=level)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        except Exception as err:  # noqa: BLE001 - whatever went wrong, the trace is kept as recorded
            _discard(tmp)
            outcome = f"{type(err).__name__}: {err}" if not isinstance(err, tracefilter.TraceFilterError) else str(err)
            if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS):
                raise  # no room for any gzip: the plain trace stays
        else:
            os.replace(tmp, final)
            return outcome
    gzip_file(plain, final, level)
    return outcome


def compress_traces(run_dir: Path, names: list[str], outcomes: dict[str, Any] | None = None) -> list[str]:
    """Gzip the traces the training process has finished writing (listed in its state).

    The training process exports plain ``*.pt.trace.json`` and lists the ``.gz`` name;
    the parent compresses it (:func:`compress_trace`), off the training process's time.
    The plain trace is removed only once the gzipped copy reads back whole. Returns the
    names done now; ``outcomes`` receives what :func:`compress_trace` returned for each,
    or a :class:`TraceWriteFailure` (tried once: a later call leaves that trace alone).
    """
    done = []
    if outcomes is None:
        outcomes = {}
    for name in names:
        plain = run_dir / plain_trace(name)
        final = run_dir / name
        if plain == final or not plain.is_file() or final.exists() or isinstance(outcomes.get(name), TraceWriteFailure):
            continue
        try:
            outcome = compress_trace(plain, final)
        except OSError as err:
            outcomes[name] = TraceWriteFailure(name, os_reason(err), plain.name)
            continue
        bad = verify_gzip(final)
        if bad:
            _discard(final)
            outcomes[name] = TraceWriteFailure(name, bad, plain.name)
            continue
        try:
            plain.unlink()
        except OSError:
            pass
        if outcome is not None:
            outcomes[name] = outcome
        done.append(name)
    return done


# How a Kineto trace ends: its event list closed, then (Kineto since 2021) the trace's name.
_TRACE_END = re.compile(rb'(?:\]|"traceName"\s*:\s*"(?:[^"\\]|\\.)*")\s*\}\s*$')


def trace_file_complete(path: Path) -> bool:
    """Whether a plain Kineto trace ends as a whole Kineto document does (a look at its last 64 KiB).

    Kineto writes the event list, then ``"traceName": "…" }``: a writer stopped by a full
    disk, a size limit or a kill leaves a file that ends elsewhere, often on an event's
    closing brace, which a bare ``}`` test would take for the end.
    """
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            if size == 0:
                return False
            fh.seek(max(0, size - (1 << 16)))
            tail = fh.read()
    except OSError:
        return False
    return _TRACE_END.search(tail) is not None


def why_write_stopped(path: Path) -> str:
    """Why a writer that does not say (Kineto) stopped at ``path``'s size: a size limit or a full disk."""
    try:
        size = path.stat().st_size
    except OSError:
        size = -1
    try:
        import resource  # noqa: PLC0415 - Unix only

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and size >= limit:
            return f"{os.strerror(errno.EFBIG)} (EFBIG): the file-size limit (ulimit -f) is {limit:,} bytes"
        if limit != resource.RLIM_INFINITY and size >= 0 and limit - size < (1 << 16):
            return f"{os.strerror(errno.EFBIG)} (EFBIG): the file stopped at {size:,} bytes, near the limit (ulimit -f) of {limit:,}"
    except (ImportError, OSError, ValueError):
        pass
    try:
        st = os.statvfs(path.parent)
        free = st.f_bavail * st.f_frsize
        if free < (1 << 20):
            return f"{os.strerror(errno.ENOSPC)} (ENOSPC): {free:,} bytes free"
    except OSError:
        pass
    return "the writer stopped before the end of the file (a full disk, a quota or a kill; its log may say which)"


def settle_trace_export(plain: Path) -> str:
    """After Kineto exported ``plain``: "" when a complete trace is there, else why not (the system's reason).

    Kineto writes ``<plain>.tmp`` and renames it; it reports a failed write or rename only
    in its log. A complete ``.tmp`` left behind (the rename failed: Kineto drops a newline
    of the path) is renamed here; an incomplete one is kept as ``<plain>.incomplete``.
    """
    tmp = plain.with_name(plain.name + TMP_SUFFIX)
    kept = plain.with_name(plain.name + INCOMPLETE_SUFFIX)
    if tmp.is_file():
        if trace_file_complete(tmp):
            try:
                os.replace(tmp, plain)
            except OSError as err:
                return f"{os_reason(err)}: Kineto wrote the trace but it could not be renamed into place"
            return ""
        why = why_write_stopped(tmp)
        try:
            os.replace(tmp, kept)
        except OSError:
            pass
        return why
    if not plain.is_file():
        return "Kineto wrote no file (its log on stderr says why)"
    if not trace_file_complete(plain):
        why = why_write_stopped(plain)
        try:
            os.replace(plain, kept)
        except OSError:
            pass
        return why
    return ""


def _whole_json(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            json.load(fh)
    except (OSError, ValueError):
        return False
    return True


def settle_leftovers(run_dir: Path, listed: list[str] | tuple[str, ...] = ()) -> tuple[list[str], list[str], list[str]]:
    """What a killed or failed writer left behind, after :func:`compress_traces`.

    Never removes the only copy of something:

    - ``X.tmp`` whose ``X`` exists (or whose source, for a ``.gz``, still exists) is half
      of a newer copy: removed;
    - a Kineto ``*.pt.trace.json.tmp`` that is complete is renamed into place (the rename
      Kineto could not do); an incomplete one becomes ``*.pt.trace.json.incomplete``;
    - a plain ``*.pt.trace.json`` the training process listed (``listed``: its gzip failed)
      is kept; an unlisted one (its writer died before listing it) is kept when complete,
      else it becomes ``.incomplete``;
    - any other ``.tmp`` (the only copy of its data) becomes ``.incomplete``.

    Returns (plain traces kept, files renamed to ``.incomplete``, files removed).
    """
    plain_suffix = TRACE_SUFFIX[: -len(".gz")]
    kept: list[str] = []
    incomplete: list[str] = []
    removed: list[str] = []

    def mark_incomplete(p: Path, name: str) -> None:
        dst = run_dir / (name + INCOMPLETE_SUFFIX)
        try:
            os.replace(p, dst)
            incomplete.append(dst.name)
        except OSError:
            pass

    for p in sorted(run_dir.iterdir()):
        if not p.is_file() or p.is_symlink():
            continue
        name = p.name
        if name.endswith(TMP_SUFFIX):
            final = name[: -len(TMP_SUFFIX)]
            source = plain_trace(final) if final.endswith(TRACE_SUFFIX) else ""
            if (run_dir / final).exists() or (source and (run_dir / source).is_file()):
                _discard(p)
                removed.append(name)
            elif (final.endswith(plain_suffix) and trace_file_complete(p)) or (final.endswith(".json") and _whole_json(p)):
                try:  # the only copy, whole: its writer died between writing and renaming
                    os.replace(p, run_dir / final)
                    if final.endswith(plain_suffix):
                        kept.append(final)
                except OSError:
                    pass
            else:
                mark_incomplete(p, final)
        elif name.endswith(plain_suffix):
            if (run_dir / (name + ".gz")).exists():
                continue  # compress_traces verified the copy before this one could be left: leave both
            if name + ".gz" in listed or trace_file_complete(p):
                kept.append(name)
            else:
                mark_incomplete(p, name)
    return kept, incomplete, removed
