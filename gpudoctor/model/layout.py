"""The run directory's layout: its file names, rank tags and schema version (docs/run-directory.md).

One definition for every layer that reads or writes a run directory: ``collect`` (which
writes it), ``parse`` (which reads it), the CLI, ``view`` and ``verify``. Standard library
only and nothing of ours, like the rest of ``gpudoctor.model``; names only, no I/O but
:func:`is_run_dir`'s look at which files exist.

A distributed (torchrun) job writes one copy of the per-process files per rank, tagged
before the extension: ``steps.jsonl`` → ``steps.rank3.jsonl``, ``.child-state.json`` →
``.child-state.rank3.json`` (:func:`rank_tagged`, :func:`rank_glob`, :func:`rank_of`).
"""

from __future__ import annotations

import re
from pathlib import Path

# Version of the run directory's files (``manifest.json``'s ``schema_version``); a reader
# refuses a higher one and ignores fields it does not know.
SCHEMA_VERSION = 1

MANIFEST = "manifest.json"  # how the run went: command, versions, status, what was collected
SETTINGS = "settings.json"  # the configuration the script actually used, with file:line
STEPS = "steps.jsonl"  # one line per training step
SAMPLES = "samples.jsonl"  # psutil and NVML samples
PSTATS = "profile.pstats"  # cProfile of a window of steps
LOADER_PSTATS = "loader.pstats"  # … the DataLoader's own calls in it, profiled apart (collect.loaderprof)
REPORT = "report.json"  # the diagnosis, written by `profile`, `analyze` and `verify` (not by collect)
REPORT_TMP = ".report.json.tmp"  # report.json while it is written
OUTPUT_LOG = "output.log"  # a --verify trial: the script's stdout and stderr
VERIFY_DIR = "verify"  # a run's --verify trials, one run directory each (gpudoctor.verify)
VERIFY_MARKER = ".gpudoctor-verify"  # in RUN/verify: a folder gpudoctor made (and may replace)
# The training process's account of the run (status, exception, traces …), merged into the
# manifest by the parent and then removed. Hidden so that nothing else lists it; left in place
# when gpudoctor's own process died, and read then.
CHILD_STATE = ".child-state.json"
# The Python stack of every thread at a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL), written
# by ``faulthandler`` in the training process; removed when empty (no crash), kept beside the manifest else.
CRASH = "crash.txt"
TRACE_SUFFIX = ".pt.trace.json.gz"  # a Kineto trace as the run keeps it
PLAIN_TRACE_SUFFIX = ".pt.trace.json"  # as the training process exports it (kept when its gzip failed)
TRACE_GLOBS = ("*" + TRACE_SUFFIX, "*" + PLAIN_TRACE_SUFFIX)
TMP_SUFFIX = ".tmp"  # a file being written, renamed into place once complete
INCOMPLETE_SUFFIX = ".incomplete"  # a trace whose writer stopped before its end: kept, never listed
# the files whose presence makes a folder a run directory
RUN_DIR_FILES = (MANIFEST, SETTINGS, STEPS, SAMPLES, PSTATS)
# top-level keys gpudoctor adds to a Kineto trace (docs/run-directory.md, Traces)
TRACE_FILTER_KEY = "gpudoctorTraceFilter"  # what the parent's filter left out (collect.tracefilter)
TRACE_STACK_BOUND_KEY = "gpudoctorStackBound"  # a window cut short by the Python-call budget (collect.torchprof)

_RANK_TAG = ".rank"


def _split(name: str) -> tuple[str, str]:
    """``steps.jsonl`` → (``steps``, ``.jsonl``); a hidden name keeps its dot in the stem
    (``.child-state.json`` → (``.child-state``, ``.json``))."""
    lead = "." if name.startswith(".") else ""
    stem, dot, ext = name[len(lead):].partition(".")
    return lead + stem, dot + ext


def rank_tagged(name: str, rank: int | None) -> str:
    """``steps.jsonl`` → ``steps.rank3.jsonl`` in a distributed run (rank None: unchanged)."""
    if rank is None:
        return name
    stem, ext = _split(name)
    return f"{stem}{_RANK_TAG}{rank}{ext}"


def rank_glob(name: str) -> str:
    """The glob pattern of ``name``'s rank-tagged copies: ``steps.jsonl`` → ``steps.rank*.jsonl``."""
    stem, ext = _split(name)
    return f"{stem}{_RANK_TAG}*{ext}"


def rank_of(file_name: str, name: str) -> int | None:
    """The rank of a rank-tagged copy of ``name`` (``steps.rank3.jsonl`` of ``steps.jsonl``: 3);
    None when ``file_name`` is not one."""
    stem, ext = _split(name)
    head = stem + _RANK_TAG
    if not (file_name.startswith(head) and file_name.endswith(ext)):
        return None
    middle = file_name[len(head): len(file_name) - len(ext)]
    return int(middle) if middle.isdigit() else None


def worker_name(pid: int, host: str | None = None) -> str:
    """``host_pid``, as torch's ``tensorboard_trace_handler`` names a worker (dots kept out)."""
    import socket  # noqa: PLC0415 - only the training process names its traces

    host = host if host is not None else socket.gethostname()
    host = re.sub(r"[^A-Za-z0-9_-]+", "-", host).strip("-") or "host"
    return f"{host}_{pid}"


def trace_name(worker: str, first_step: int) -> str:
    """``<worker>.<first active step, 8 digits>.pt.trace.json.gz``.

    torch-tb-profiler reads ``<worker>.<digits>.pt.trace.json.gz`` as worker + span and
    sorts spans as strings, hence the fixed width.
    """
    return f"{worker}.{first_step:08d}{TRACE_SUFFIX}"


def plain_trace(name: str) -> str:
    """``x.pt.trace.json.gz`` → ``x.pt.trace.json``: the training process writes this one."""
    return name[: -len(".gz")] if name.endswith(".gz") else name


def lock_name(folder: str) -> str:
    """The lock file beside a folder that one process at a time may use: ``verify`` → ``.verify.lock``."""
    return f".{folder}.lock"


def is_run_dir(path: Path) -> bool:
    """A folder holding one of a run directory's own files (``RUN_DIR_FILES``)."""
    return path.is_dir() and any((path / f).is_file() for f in RUN_DIR_FILES)
