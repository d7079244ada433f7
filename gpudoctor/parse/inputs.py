"""Inputs of ``gpudoctor analyze`` / ``report`` → model: ``load_inputs(paths)``.

A path may be

- a run directory (``manifest.json``, ``settings.json``, ``steps.jsonl``,
  ``samples.jsonl``, ``profile.pstats`` and its ``*.pt.trace.json.gz`` traces);
- a Kineto trace file (``.json`` or ``.json.gz``);
- a folder of traces (one per rank);
- several run directories (one per node of one job): merged into one ``RunData``.

Traces are read by ``load_trace``: the chunked msgspec fast path, or the streaming
fallback for layouts it does not assume. Its names are also importable from ``gpudoctor.parse``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from gpudoctor import safe
from gpudoctor.errors import TraceFormatError, UsageError
from gpudoctor.model.findings import RunData
from gpudoctor.model.run import Samples
from gpudoctor.model.trace import Timeline
from gpudoctor.parse.kineto import NeedsFallback, read_trace_chunked
from gpudoctor.parse.rundir import is_run_dir, read_run_dir
from gpudoctor.parse.stream import read_trace_streaming

__all__ = [
    "InputPlan", "LoadedInputs", "TraceJob", "find_traces", "load_inputs", "load_trace", "plan_inputs",
    "read_run_dir", "trace_order",
]

TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass(frozen=True, slots=True)
class LoadedInputs:
    run: RunData  # manifest, settings, steps, samples, pstats, notes; metrics empty
    timelines: tuple[Timeline, ...]  # one per trace (rank), ordered by rank then path


def load_trace(path: Path) -> Timeline:
    """One Kineto trace file → ``Timeline`` (``TraceFormatError`` when unreadable)."""
    try:
        return read_trace_chunked(path)
    except NeedsFallback:
        return read_trace_streaming(path)


def _is_trace_name(p: Path) -> bool:
    name = p.name.lower()
    return any(name.endswith(s) for s in TRACE_SUFFIXES)


def find_traces(folder: Path) -> list[Path]:
    """Trace files in a folder (its own files first; subfolders only when it has none).

    A trace-named entry that is not a regular file (a FIFO would block the reader forever)
    is refused here, before anything reads it.
    """
    direct = sorted(p for p in folder.iterdir() if _is_trace_name(p) and not p.is_dir())
    found = direct or sorted(p for p in folder.rglob("*") if _is_trace_name(p) and not p.is_dir())
    for p in found:
        refuse_special(p)
    return found


def refuse_special(path: Path, dir_ok: bool = False) -> None:
    """``UsageError`` for a FIFO, a device or a socket: reading one would hang or never end."""
    kind = safe.not_regular(path, dir_ok=dir_ok)
    if kind and kind != "a folder":
        raise UsageError(
            f"{safe.terminal_line(path)}: not a regular file ({kind}); pass a run directory, a trace file "
            "(.json/.json.gz) or a folder of traces"
        )


def _merge_runs(runs: list[RunData]) -> RunData:
    """Several run directories of one job (one per node) → one ``RunData``."""
    if len(runs) == 1:
        return runs[0]

    def rank_key(r: RunData) -> tuple[int, str]:
        m = r.manifest
        rank = 1 << 30
        if m is not None:  # one rank's run, or a torchrun node's run (its lowest rank)
            rank = m.rank if m.rank is not None else min((e.rank for e in m.rank_ends), default=rank)
        return rank, r.source

    runs = sorted(runs, key=rank_key)
    first = next((r for r in runs if r.manifest is not None), runs[0])
    notes: list[str] = []
    for r in runs:
        notes.extend(f"{Path(r.source).name}: {n}" for n in r.notes)
    process = tuple(s for r in runs if r.samples for s in r.samples.process)
    gpu = tuple(s for r in runs if r.samples for s in r.samples.gpu)
    samples = None
    if any(r.samples for r in runs):
        base = next(r.samples for r in runs if r.samples)
        samples = Samples(process=process, gpu=gpu, interval_ms=base.interval_ms,
                          system_cpu_count=base.system_cpu_count)
    manifest = first.manifest
    if manifest is not None and any(r.manifest is not None and r.manifest.rank_ends for r in runs):
        # torchrun nodes: every node's ranks, and the failure of the first node that had one
        ends = sorted((e for r in runs if r.manifest is not None for e in r.manifest.rank_ends), key=lambda e: e.rank)
        changes: dict = {"rank_ends": tuple(ends)}
        failed = next((r.manifest for r in runs if r.manifest is not None and r.manifest.failed_rank is not None), None)
        if failed is not None and failed is not manifest:
            changes.update(status=failed.status, status_detail=f"{failed.hostname or failed.run_id}: {failed.status_detail}",
                           exit_code=failed.exit_code, signal=failed.signal, exception=failed.exception,
                           failed_rank=failed.failed_rank)
        manifest = dataclasses.replace(manifest, **changes)
    return RunData(
        source=", ".join(r.source for r in runs),
        manifest=manifest,
        settings=first.settings or next((r.settings for r in runs if r.settings), None),
        steps=tuple(s for r in runs for s in r.steps),
        samples=samples,
        pstats=first.pstats,
        notes=tuple(notes) + (f"{len(runs)} run directories merged into one job",),
    )


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One trace to read: where it comes from decides what its errors do."""

    path: Path
    run_index: int | None = None  # the run directory it belongs to (an error: a note there); None: fatal
    owner_rank: int | None = None  # the rank whose manifest entry lists it (for a trace without distributedInfo)
    owner_world: int | None = None

    def adopt(self, tl: Timeline) -> Timeline:
        """The rank the run directory knows for a trace that does not say its own."""
        if tl.info.rank is None and self.owner_rank is not None:
            return dataclasses.replace(tl, info=dataclasses.replace(
                tl.info, rank=self.owner_rank, world_size=tl.info.world_size or self.owner_world))
        return tl


@dataclass(frozen=True, slots=True)
class InputPlan:
    """What ``analyze`` was given, before any trace is read: the run directories' records
    and the traces, in order. Reading the traces is a map (``TraceJob`` → timeline or
    metrics) that may run anywhere; ``finish`` folds what went wrong back in."""

    runs: tuple[RunData, ...]
    jobs: tuple[TraceJob, ...]
    source: str

    @property
    def run(self) -> RunData:
        """The merged records (what ``analyze_trace`` reads), without per-trace notes."""
        return _merge_runs(list(self.runs)) if self.runs else RunData(source=self.source)

    def finish(self, skipped: dict[int, list[str]]) -> RunData:
        """The merged records with each run directory's unreadable traces noted in it."""
        if not self.runs:
            return RunData(source=self.source)
        runs = [dataclasses.replace(r, notes=r.notes + tuple(f"trace skipped: {e}" for e in skipped.get(i, ())))
                for i, r in enumerate(self.runs)]
        return _merge_runs(runs)


def plan_inputs(paths: list[Path]) -> InputPlan:
    """Read what ``analyze`` was given except the traces (see the module docstring)."""
    if not paths:
        raise UsageError("nothing to analyze: pass a run directory, a trace file or a folder of traces")
    runs: list[RunData] = []
    jobs: list[TraceJob] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise UsageError(
                f"{safe.terminal_line(p)}: no such file or directory; pass a run directory, a trace file (.json/.json.gz) "
                "or a folder of traces"
            )
        refuse_special(p, dir_ok=True)
        if p.is_dir() and is_run_dir(p):
            run, traces = read_run_dir(p)
            mf = run.manifest
            # a torchrun job: each rank listed its traces (for a window recorded before the process group existed)
            owner = {Path(t).name: e.rank for e in (mf.rank_ends if mf else ()) for t in e.traces}
            world = mf.world_size if mf is not None else None
            for t in traces:
                jobs.append(TraceJob(t, len(runs), owner.get(t.name), world if t.name in owner else None))
            runs.append(run)
        elif p.is_dir():
            traces = find_traces(p)
            if not traces:
                raise UsageError(
                    f"{safe.terminal_line(p)}: no run directory files and no Kineto trace (*.json, *.json.gz) in it; pass a run "
                    "directory, a trace file or a folder of traces"
                )
            jobs.extend(TraceJob(t) for t in traces)
        else:
            jobs.append(TraceJob(p))
    return InputPlan(runs=tuple(runs), jobs=tuple(jobs), source=", ".join(str(p) for p in paths))


def trace_order(rank: int | None, path: str) -> tuple[int, str]:
    """Traces (and their metrics) are ordered by rank, then path."""
    return (rank if rank is not None else 1 << 30, path)


def load_inputs(paths: list[Path]) -> LoadedInputs:
    """Read everything ``analyze`` was given, traces included, in this process."""
    plan = plan_inputs(paths)
    timelines: list[Timeline] = []
    skipped: dict[int, list[str]] = {}
    for job in plan.jobs:
        try:
            tl = load_trace(job.path)
        except TraceFormatError as err:
            if job.run_index is None:
                raise
            skipped.setdefault(job.run_index, []).append(str(err))
            continue
        timelines.append(job.adopt(tl))
    run = plan.finish(skipped)
    return LoadedInputs(run=run, timelines=tuple(sorted(timelines, key=lambda t: trace_order(t.info.rank, t.path))))
