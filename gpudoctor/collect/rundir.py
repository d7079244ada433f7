"""The run directory on disk: names, atomic writes, line files (see docs/run-directory.md)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
SETTINGS = "settings.json"
STEPS = "steps.jsonl"
SAMPLES = "samples.jsonl"
PSTATS = "profile.pstats"
TRACE_SUFFIX = ".pt.trace.json.gz"
# The child's account of the run (status, exception, traces …), merged into the
# manifest by the parent and then removed. Hidden so that nothing else lists it.
CHILD_STATE = ".child-state.json"
TMP_SUFFIX = ".tmp"
# top-level keys gpudoctor adds to a Kineto trace (docs/run-directory.md, Traces)
TRACE_FILTER_KEY = "gpudoctorTraceFilter"  # what the parent's filter left out (tracefilter)
TRACE_STACK_BOUND_KEY = "gpudoctorStackBound"  # a window cut short by the Python-call budget (torchprof)


def rank_tagged(name: str, rank: int | None) -> str:
    """``steps.jsonl`` → ``steps.rank3.jsonl`` in a distributed run (rank None: unchanged)."""
    if rank is None:
        return name
    lead = "." if name.startswith(".") else ""
    stem, dot, ext = name[len(lead):].partition(".")
    return f"{lead}{stem}.rank{rank}{dot}{ext}"


def worker_name(pid: int, host: str | None = None) -> str:
    """``host_pid``, as torch's ``tensorboard_trace_handler`` names a worker (dots kept out)."""
    host = host if host is not None else socket.gethostname()
    host = re.sub(r"[^A-Za-z0-9_-]+", "-", host).strip("-") or "host"
    return f"{host}_{pid}"


def trace_name(worker: str, first_step: int) -> str:
    """``<worker>.<first active step, 8 digits>.pt.trace.json.gz``.

    torch-tb-profiler reads ``<worker>.<digits>.pt.trace.json.gz`` as worker + span and
    sorts spans as strings, hence the fixed width.
    """
    return f"{worker}.{first_step:08d}{TRACE_SUFFIX}"


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


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON through a temporary file and a rename: a reader never sees half a file."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # one encoder: its C fast path, built once


class JsonlWriter:
    """Appends one JSON object per line.

    ``flush_every_s`` 0: each line reaches the file at once (a killed writer loses at
    most the line it was writing). Above 0: lines are flushed at most that often, so a
    writer called on every training step costs one system call a second, and a writer
    killed outright loses at most that long of lines; :meth:`close` flushes the rest.
    """

    def __init__(self, path: Path, flush_every_s: float = 0.0) -> None:
        self.path = path
        self.flush_every_s = flush_every_s
        self._last_flush = time.monotonic()
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run
        self.enabled = True

    def write(self, obj: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._f.write(_ENCODER.encode(obj) + "\n")
        self._maybe_flush()

    def write_many(self, objs: list[dict[str, Any]]) -> None:
        if not objs or not self.enabled:
            return
        self._f.write("".join(_ENCODER.encode(o) + "\n" for o in objs))
        self._maybe_flush()

    def write_text(self, text: str) -> None:
        """Lines already formatted (each ending in a newline)."""
        if not text or not self.enabled:
            return
        self._f.write(text)
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self.flush_every_s <= 0:
            self._f.flush()
            return
        now = time.monotonic()
        if now - self._last_flush >= self.flush_every_s:
            self._f.flush()
            self._last_flush = now

    def flush(self) -> None:
        if self.enabled:
            self._f.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        try:
            self._f.close()
        except OSError:
            pass

    def in_child_after_fork(self) -> None:
        """A forked process must not write (or flush at exit) the parent's buffered lines."""
        self.enabled = False


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


def plain_trace(name: str) -> str:
    """``x.pt.trace.json.gz`` → ``x.pt.trace.json``: the training process writes this one."""
    return name[: -len(".gz")] if name.endswith(".gz") else name


def gzip_file(src: Path, dst: Path, level: int = GZIP_LEVEL) -> None:
    """Compress ``src`` into ``dst`` through a temporary name (readers never see half a file)."""
    tmp = dst.with_name(dst.name + TMP_SUFFIX)
    with open(src, "rb") as fin, gzip.open(tmp, "wb", compresslevel=level) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
    os.replace(tmp, dst)


def compress_trace(plain: Path, final: Path, level: int = GZIP_LEVEL) -> Any:
    """Gzip one plain trace into ``final``, its short Python calls left out (``tracefilter``).

    Returns the ``TraceFilterResult`` when the trace was filtered; None when it has no
    Python calls (gzipped as recorded); a string saying why when the filter failed: the
    trace is then gzipped as recorded, never lost.
    """
    from gpudoctor.collect import tracefilter  # noqa: PLC0415 - msgspec and numpy: not at start-up

    tmp = final.with_name(final.name + TMP_SUFFIX)
    outcome: Any = None
    if tracefilter.has_python_events(plain):
        try:
            outcome = tracefilter.filter_trace(plain, tmp, level=level)
        except Exception as err:  # noqa: BLE001 - whatever went wrong, the trace is kept as recorded
            outcome = f"{type(err).__name__}: {err}" if not isinstance(err, tracefilter.TraceFilterError) else str(err)
        else:
            os.replace(tmp, final)
            return outcome
    gzip_file(plain, final, level)
    return outcome


def compress_traces(run_dir: Path, names: list[str], outcomes: dict[str, Any] | None = None) -> list[str]:
    """Gzip the traces the training process has finished writing (listed in its state).

    The training process exports plain ``*.pt.trace.json`` and lists the ``.gz`` name;
    the parent compresses it (:func:`compress_trace`), off the training process's time.
    Returns names done now; ``outcomes`` receives what :func:`compress_trace` returned for
    each (when not None).
    """
    done = []
    for name in names:
        plain = run_dir / plain_trace(name)
        final = run_dir / name
        if plain == final or not plain.is_file() or final.exists():
            continue
        try:
            outcome = compress_trace(plain, final)
            plain.unlink()
        except OSError:
            continue
        if outcomes is not None and outcome is not None:
            outcomes[name] = outcome
        done.append(name)
    return done


def remove_leftovers(run_dir: Path) -> list[str]:
    """Remove what a killed writer left behind: ``*.tmp`` files, a trace it was exporting.

    Call after :func:`compress_traces`: a plain trace still here was never finished.
    """
    removed = []
    plain_trace = TRACE_SUFFIX[: -len(".gz")]
    for p in run_dir.iterdir():
        if (p.name.endswith(TMP_SUFFIX) or p.name.endswith(plain_trace)) and p.is_file():
            try:
                p.unlink()
                removed.append(p.name)
            except OSError:
                pass
    return removed
