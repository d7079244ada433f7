"""parse → analysis for everything ``analyze`` takes, on one core, several, or a cluster.

Per-trace analysis is a pure map, ``analyze_job(TraceJob, RunData) -> TraceOutcome``
(read one trace, compute its ``TraceMetrics``), reduced here: outcomes in the order of
the input, errors folded into the run's notes (a trace of a run directory) or raised (a
trace given by itself), metrics sorted by rank then path. The reduction across ranks
(stragglers, exposed communication) is the engine's, on the result. So the report is the
same whichever way the map ran:

- ``jobs == 1``: in this process, one trace after another;
- ``jobs > 1``, several traces: a ``concurrent.futures`` process pool, one trace per task
  (each process holds one trace at a time);
- ``jobs > 1``, one large trace: its events are read in ``jobs`` parts by as many
  processes (``parse.parallel``), then analyzed here, half its passes (the host side's, the
  transfer and kernel tables) in a process forked beside this one (``_fork_beside``: it inherits the columns, only the results are
  pickled back);
- ``cluster``: on a Dask cluster (``dask.distributed``), one trace per task; the workers
  read the traces by path, so the files must be where the workers can read them (a shared
  file system). Optional: ``pip install 'gpudoctor[cluster]'``.

Orchestration lives here, above the layers it drives (DESIGN.md): it imports parse and
analysis; neither imports it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import multiprocessing
import os
import re
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.errors import TraceFormatError, UsageError
from gpudoctor.model.trace import Timeline
from gpudoctor.parse.kineto import NeedsFallback
from gpudoctor.parse.parallel import read_trace_split, split_count

# Imported where first used (``_import_analysis``): one large trace's parts are being read by
# then (``analyze_paths``), and the readers start ~50 ms sooner without them.
if TYPE_CHECKING:
    from gpudoctor.analysis import Beside
    from gpudoctor.model.findings import RunData
    from gpudoctor.model.metrics import TraceMetrics
    from gpudoctor.parse import InputPlan, TraceJob

__all__ = ["TraceOutcome", "analyze_job", "analyze_paths", "available_cores"]

POOL_MIN_BYTES = 2 << 20  # several traces smaller than this in all (on disk) are read in this process
# a trace with fewer events is analysed in this process alone: forking a process beside it costs
# ~30 ms, the passes it would run take ~0.3 s at 1.5 M events (measured on the 327 MB benchmark trace)
BESIDE_MIN_EVENTS = 400_000
CLUSTER_EXTRA = "pip install 'gpudoctor[cluster]'"
CONNECT_TIMEOUT_S = 10  # how long --cluster waits for a TCP connection to the scheduler
HANDSHAKE_TIMEOUT_S = 15  # and for the scheduler to answer Dask's handshake (and to take the run's data)
GATHER_TIMEOUT_S = 3600.0  # and for the workers to analyze every trace


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class TraceOutcome:
    """What one trace gave: its metrics, or the error that made it unreadable."""

    order: tuple[int, str]  # (rank, path): where its metrics go
    metrics: TraceMetrics | None = None
    error: TraceFormatError | None = None
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)  # malformed events left out, by reason


def _import_analysis() -> None:
    """What analysing a trace needs besides its reader (the inputs, the analysis, the model)."""
    import gpudoctor.analysis  # noqa: F401, PLC0415
    import gpudoctor.parse.inputs  # noqa: F401, PLC0415


def _read(path: Path, parts: int = 1, executor: Executor | None = None,
          meanwhile: Callable[[], object] | None = None) -> Timeline | TraceFormatError:
    from gpudoctor.parse.stream import read_trace_streaming  # noqa: PLC0415 - see _import_analysis

    try:
        if parts > 1 and executor is not None:
            try:
                return read_trace_split(path, parts, executor, meanwhile=meanwhile)
            except NeedsFallback:
                return read_trace_streaming(path)
        from gpudoctor.parse import load_trace  # noqa: PLC0415

        return load_trace(path)
    except TraceFormatError as err:
        return err
    except RecursionError:  # JSON nested deeper than a decoder recurses: no Kineto trace nests so
        return TraceFormatError(str(path), "its JSON nests deeper than any Kineto trace",
                                "the file is malformed or not a trace; re-record it or pass another trace file")


def _read_in_parts(path: Path, parts: int, meanwhile: Callable[[], object] | None) -> Timeline | TraceFormatError:
    """One large trace read by ``parts`` processes: this one and ``parts - 1`` forked ones. Once
    its own part is read, this process imports what the analysis needs, then does ``meanwhile``,
    while the others are still reading."""

    def imports() -> None:
        _import_analysis()
        if meanwhile is not None:
            meanwhile()

    _bound_heap()
    with _pool(parts - 1) as ex:  # this process reads the first part
        return _read(path, parts, ex, imports)  # the readers are gone after this: their memory too


def _outcome(job: TraceJob, tl: Timeline | TraceFormatError, run: RunData, beside: Beside | None = None) -> TraceOutcome:
    from gpudoctor.analysis import analyze_trace  # noqa: PLC0415 - see _import_analysis
    from gpudoctor.parse import trace_order  # noqa: PLC0415

    if isinstance(tl, TraceFormatError):
        return TraceOutcome(trace_order(None, str(job.path)), error=tl)
    tl = job.adopt(tl)
    if tl.info.event_count < BESIDE_MIN_EVENTS:
        beside = None
    return TraceOutcome(trace_order(tl.info.rank, tl.path), metrics=analyze_trace(tl, run, beside),
                        dropped=dict(tl.info.dropped_events))


_BESIDE_PASSES: Sequence[Callable[[], Any]] = ()  # what the forked process runs: inherited, never pickled


def _run_beside() -> list[Any]:
    return [f() for f in _BESIDE_PASSES]


def _fork_beside(passes: Sequence[Callable[[], Any]]) -> Callable[[], list[Any]]:
    """``analyze_trace``'s ``beside``: the passes run in one process forked now, which inherits
    the trace's columns and the passes' closures (copy-on-write: nothing is pickled but the
    results). Where no process can be forked, or one fails, they run here instead: the
    metrics are the same either way, an error in a pass is raised here as it would be."""
    global _BESIDE_PASSES
    if not sys.platform.startswith("linux"):  # fork is the way only there (see _pool)
        return lambda: [f() for f in passes]
    _BESIDE_PASSES = passes
    try:
        ex = _pool(1)
        fut = ex.submit(_run_beside)  # the fork happens here, with the passes in place
    except (OSError, RuntimeError):
        return lambda: [f() for f in passes]
    finally:
        _BESIDE_PASSES = ()

    def results() -> list[Any]:
        try:
            return fut.result()
        except Exception:  # a broken process, an unpicklable result, a pass that raised: again here
            return [f() for f in passes]
        finally:
            ex.shutdown(wait=True)

    return results


def analyze_job(job: TraceJob, run: RunData) -> TraceOutcome:
    """Read one trace and compute its metrics. A trace the user can fix comes back as an
    error, never raised, so that every way of mapping reports it the same way."""
    return _outcome(job, _read(job.path), run)


def _analyze_remote(job: TraceJob, run: RunData, display: str) -> TraceOutcome:
    """``analyze_job`` on a cluster worker: the trace is read by its absolute path, and
    named in the result as the user named it (the report matches a local one)."""
    out = analyze_job(job, run)
    if out.error is not None:
        err = out.error
        return TraceOutcome((out.order[0], display), error=TraceFormatError(display, err.where, err.hint))
    assert out.metrics is not None
    return TraceOutcome((out.order[0], display), metrics=_renamed(out.metrics, display), dropped=out.dropped)


def _renamed(metrics: TraceMetrics, display: str) -> TraceMetrics:
    """The metrics of a trace read by another name: the path, and the ledger's key that names it."""
    ledger = metrics.ledger
    if ledger is not None and ledger.key == f"trace:{metrics.path}":
        ledger = dataclasses.replace(ledger, key=f"trace:{display}")
    return dataclasses.replace(metrics, path=display, ledger=ledger)


def _worker_version() -> str:
    from gpudoctor import __version__

    return __version__


def _bound_heap() -> None:
    """Pin glibc's mmap and trim thresholds at 8 MiB for the rest of the process (and the
    workers it forks). glibc raises its mmap threshold each time a large block is freed (up
    to 32 MiB); after that, big arrays come from the heap and what they free stays in RSS.
    Measured on a 327 MB trace read in two parts: the peak of both processes together fell
    from 273-315 MB to 207-237 MB (4 MiB: about the same memory, 0.1-0.2 s slower).
    Results are unaffected."""
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    mallopt(m_mmap_threshold, 8 << 20)
    mallopt(m_trim_threshold, 8 << 20)


def _pool(workers: int) -> ProcessPoolExecutor:
    # fork where it is the platform's way (Linux): workers start in milliseconds with the
    # parent's modules loaded; the standard library launches them before any thread
    method = "fork" if sys.platform.startswith("linux") else None
    ctx = multiprocessing.get_context(method)
    return ProcessPoolExecutor(max_workers=workers, mp_context=ctx)


def _map_local(plan: InputPlan, run: RunData, jobs: int, pool_min_bytes: int,
               meanwhile: Callable[[], object] | None = None) -> list[TraceOutcome]:
    items = plan.jobs
    if jobs <= 1 or not items:
        return [analyze_job(j, run) for j in items]
    if len(items) == 1:
        parts = split_count(items[0].path, jobs)
        if parts < 2:
            return [analyze_job(items[0], run)]
        return [_outcome(items[0], _read_in_parts(items[0].path, parts, meanwhile), run, _fork_beside)]
    total = sum(j.path.stat().st_size for j in items)
    if total < pool_min_bytes:
        return [analyze_job(j, run) for j in items]
    _import_analysis()  # once here, not in each forked worker
    with _pool(min(jobs, len(items))) as ex:
        return list(ex.map(analyze_job, items, [run] * len(items)))


def _map_cluster(plan: InputPlan, run: RunData, address: str) -> list[TraceOutcome]:
    try:
        from distributed import Client
    except ImportError:
        raise UsageError(f"--cluster needs Dask's distributed scheduler, which is not installed: {CLUSTER_EXTRA}") from None
    client = _connect(Client, address)
    with client:
        try:
            versions = client.run(_worker_version)
        except Exception as err:  # the workers cannot import gpudoctor
            raise UsageError(
                f"--cluster {address}: the Dask workers cannot run gpudoctor ({type(err).__name__}: {err}); "
                "install the same gpudoctor on every worker"
            ) from None
        from gpudoctor import __version__

        if not versions:
            raise UsageError(f"--cluster {address}: the Dask scheduler has no workers; start some with `dask worker {address}`")
        odd = sorted(w for w, v in versions.items() if v != __version__)
        if odd:
            raise UsageError(
                f"--cluster {address}: worker(s) {', '.join(odd)} run gpudoctor {versions[odd[0]]}, this is "
                f"{__version__}; install the same version everywhere"
            )
        remote = [dataclasses.replace(j, path=j.path.resolve()) for j in plan.jobs]
        shared = client.scatter(run, broadcast=True, timeout=HANDSHAKE_TIMEOUT_S)
        futures = client.map(_analyze_remote, remote, [shared] * len(remote),
                             [str(j.path) for j in plan.jobs], pure=False)
        import time

        deadline = time.monotonic() + GATHER_TIMEOUT_S
        out = []
        for k, fut in enumerate(futures):
            try:
                out.append(fut.result(timeout=max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                raise UsageError(f"--cluster {address}: {len(futures) - k} of {len(futures)} traces were not analyzed "
                                 f"within {GATHER_TIMEOUT_S:g} s; check the workers (`dask worker` logs) or analyze "
                                 "without --cluster") from None
        return out


_ADDRESS = re.compile(r"^(tcp|tls)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def check_cluster_address(address: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` (or ``tls://``) → (host, port); anything else is a one-line usage error,
    before any connection is tried."""
    m = _ADDRESS.match(address.strip()) if isinstance(address, str) else None
    port = int(m.group(3)) if m else 0
    if m is None or not 0 < port < 65536:
        raise UsageError(f"--cluster {address!r}: not a Dask scheduler address; pass tcp://HOST:PORT "
                         "(the address `dask scheduler` prints, e.g. tcp://10.0.0.5:8786)")
    return m.group(2).strip("[]"), port


def _connect(client_cls, address: str):
    """A Dask client of the scheduler at ``address``, or a one-line ``UsageError``, within bounded time.

    The address is checked first, then a plain TCP connection is tried (``CONNECT_TIMEOUT_S``), then
    the Dask handshake runs in a daemon thread for at most ``HANDSHAKE_TIMEOUT_S``: a port that
    accepts and never answers, or answers bytes that are not Dask's, gives "did not answer as a Dask
    scheduler" instead of a hang, a MemoryError or a traceback. distributed's own log lines and the
    tracebacks of a half-made client are kept off stderr (``logging.getLogger("distributed")``)."""
    import logging
    import socket
    import threading

    host, port = check_cluster_address(address)
    hint = ("start one with `dask scheduler` and workers with `dask worker ADDRESS`, then pass the "
            "scheduler's address (tcp://HOST:8786)")
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        raise UsageError(f"--cluster {address}: no Dask scheduler answered there ({err.strerror or err}); {hint}") from None
    logging.getLogger("distributed").setLevel(logging.CRITICAL + 1)
    box: dict[str, object] = {}

    class _Client(client_cls):  # type: ignore[misc, valid-type]
        def __del__(self) -> None:
            # a client whose handshake failed would wait 2 × the timeout to close a connection to a
            # peer that never answers, then print a traceback: drop it instead
            if getattr(self, "status", "closed") not in ("closed", "newly-created"):
                self.status = "closed"
                try:
                    self._loop_runner.stop()
                except Exception:  # noqa: BLE001 - a half-made client may lack it
                    pass

    def start() -> None:
        try:
            box["client"] = _Client(address, timeout=f"{HANDSHAKE_TIMEOUT_S}s", set_as_default=False)
        except BaseException as err:  # noqa: BLE001 - anything the handshake raises is the peer's answer
            box["error"] = f"{type(err).__name__}: {str(err)[:120]}"

    t = threading.Thread(target=start, name="gpudoctor-cluster-connect", daemon=True)
    t.start()
    t.join(HANDSHAKE_TIMEOUT_S + 2)
    if "client" in box:
        return box["client"]
    why = str(box.get("error", "no answer"))
    raise UsageError(f"--cluster {address}: a server accepts connections there but did not answer as a Dask "
                     f"scheduler within {HANDSHAKE_TIMEOUT_S} s ({why}); {hint}")


def _one_large_trace(paths: Sequence[str | Path], jobs: int | None) -> tuple[Path, int] | None:
    """(the trace, its parts) when ``paths`` is one regular file worth reading in parts on
    ``jobs`` processes; None otherwise, and for anything ``plan_inputs`` would refuse (it
    says why, as usual)."""
    n = available_cores() if jobs is None else jobs
    if len(paths) != 1 or n < 2:
        return None
    path = Path(paths[0])
    try:
        if not path.is_file():  # missing, a folder (a run directory), a FIFO …
            return None
        parts = split_count(path, n)
    except OSError:  # unreadable: plan_inputs or the reader says so
        return None
    return (path, parts) if parts >= 2 else None


def analyze_paths(paths: Sequence[str | Path], jobs: int | None = None, cluster: str | None = None,
                  pool_min_bytes: int = POOL_MIN_BYTES, meanwhile: Callable[[], object] | None = None) -> RunData:
    """Everything ``analyze`` was given → a ``RunData`` with one ``TraceMetrics`` per trace.

    ``jobs``: processes on this machine (default: the cores available); ``cluster``: the
    address of a Dask scheduler (``jobs`` is then ignored); ``meanwhile``: the caller's own
    work (its imports), done while this process waits for the other parts of one trace read
    in parts (``parse.parallel.read_split_at``); not called otherwise.

    One large trace file (the case where start-up counts) has its parts read before the
    rest of gpudoctor is imported: those imports, then ``meanwhile``, are this process's work
    while the other parts are read."""
    early = None if cluster else _one_large_trace(paths, jobs)
    read_early = _read_in_parts(*early, meanwhile) if early is not None else None
    from gpudoctor.analysis import dropped_events_note  # noqa: PLC0415 - see _import_analysis
    from gpudoctor.parse import plan_inputs  # noqa: PLC0415

    plan = plan_inputs([Path(p) for p in paths])
    run = plan.run
    if cluster:
        outcomes = _map_cluster(plan, run, cluster)
    elif read_early is not None:  # a regular file: the plan is that one trace
        outcomes = [_outcome(plan.jobs[0], read_early, run, _fork_beside)]
    else:
        n = available_cores() if jobs is None else jobs
        if n < 1:
            raise UsageError(f"--jobs {n}: give at least 1")
        outcomes = _map_local(plan, run, n, pool_min_bytes, meanwhile)
    skipped: dict[int, list[str]] = {}
    metrics: list[TraceOutcome] = []
    for job, out in zip(plan.jobs, outcomes, strict=True):
        if out.error is not None:
            if job.run_index is None:
                raise out.error
            skipped.setdefault(job.run_index, []).append(str(out.error))
        else:
            metrics.append(out)
    result = plan.finish(skipped)
    ordered = sorted(metrics, key=lambda o: o.order)
    # malformed events also in the run's notes, which every report format shows
    dropped = tuple(f"{o.order[1]}: {dropped_events_note(o.dropped)}" for o in ordered if o.dropped)
    return dataclasses.replace(result, metrics=tuple(o.metrics for o in ordered if o.metrics is not None),
                               notes=result.notes + dropped)
