"""The run directory's line files (``steps.jsonl``, ``samples.jsonl``) and the rule every file of it is
found by (``confined``, ``rank_files``): part of ``parse.rundir``, which re-exports what is read here.

Each line is untrusted: a record whose fields do not have their types, or hold an integer past 64 bits,
is skipped; one whose values no step or sample can have (negative, not finite, a step longer than the
run, a utilization over 100%) is dropped; both with a note.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from gpudoctor import safe
from gpudoctor.model._serde import FieldRangeError, check
from gpudoctor.model.layout import SAMPLES, STEPS, rank_glob, rank_of
from gpudoctor.model.run import GpuSample, HostSample, ProcessSample, Samples, StepRecord


def confined(run_dir: Path, name: str, notes: list[str] | None = None) -> Path | None:
    """``run_dir / name`` when it is a regular file that resolves inside the run directory; None
    otherwise, with a note when it exists but is not read (a symlink out of the run, a FIFO, a
    device). A run directory is untrusted input: its fixed-name files are confined as the manifest's
    paths are."""
    p = run_dir / name
    if not (p.exists() or p.is_symlink()):
        return None
    if safe.inside(run_dir, name) is None:
        if notes is not None:
            notes.append(f"{safe.terminal_line(name)} not read: it leads out of the run directory (a symlink?)")
        return None
    kind = safe.not_regular(p)
    if kind:
        if notes is not None:
            notes.append(f"{safe.terminal_line(name)} not read: it is {kind}, not a file")
        return None
    return p


def rank_files(run_dir: Path, name: str, notes: list[str] | None = None) -> list[tuple[int | None, Path]]:
    """``name`` and its rank-tagged copies of a distributed run (``steps.rank3.jsonl`` for
    ``steps.jsonl``, written by each rank of a torchrun job): the plain file first, then by rank.
    Only regular files inside the run directory (``confined``)."""
    out: list[tuple[int | None, Path]] = []
    plain = confined(run_dir, name, notes)
    if plain is not None:
        out.append((None, plain))
    tagged = []
    for p in run_dir.glob(rank_glob(name)):
        rank = rank_of(p.name, name)
        if rank is not None:
            q = confined(run_dir, p.name, notes)
            if q is not None:
                tagged.append((rank, q))
    return out + sorted(tagged)


def _jsonl(p: Path, notes: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    bad = 0
    last_bad = False
    with open(p, encoding="utf-8", errors="replace") as fh:
        lines = fh.read().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, an integer of 4300+ digits, nested past the decoder
            bad += 1
            last_bad = i == len(lines) - 1
            continue
        if isinstance(obj, dict):
            rows.append(obj)
        else:
            bad += 1
    if bad:
        if bad == 1 and last_bad:
            notes.append(f"{p.name}: the last line is incomplete (the run ended while writing it); skipped")
        else:
            notes.append(f"{p.name}: {bad} unreadable line(s) skipped")
    return rows


def read_steps(run_dir: Path, notes: list[str], max_step_ns: int | None = None) -> tuple[StepRecord, ...]:
    """``steps.jsonl``, and every rank's ``steps.rank<R>.jsonl`` of a distributed run (rank set).
    Records outside physical bounds (``_physical_step``; ``max_step_ns``: the run's length) are
    dropped with a note, as the trace reader drops impossible events."""
    files = rank_files(run_dir, STEPS, notes)
    if not files:
        notes.append(f"{STEPS} is missing: no per-step records (wall time, data wait)")
        return ()
    steps = []
    for rank, p in files:
        skipped = absurd = 0
        for row in _jsonl(p, notes):
            try:
                check(StepRecord, row)  # types and 64-bit integers; NaN and the like are _physical_step's
                rec = StepRecord.from_dict(row)
            except FieldRangeError:  # a number past 64 bits: a value no step can have
                absurd += 1
                continue
            except (TypeError, ValueError, KeyError):  # FieldTypeError is a ValueError
                skipped += 1
                continue
            if not _physical_step(rec, max_step_ns):
                absurd += 1
                continue
            if rank is not None and rec.rank is None:
                rec = dataclasses.replace(rec, rank=rank)
            steps.append(rec)
        if skipped:
            notes.append(f"{p.name}: {skipped} record(s) without the required fields, or with a field of the wrong "
                         "type or out of range, skipped")
        if absurd:
            notes.append(f"{p.name}: {absurd} record(s) with values no step can have (negative, not finite, more "
                         "than 64 bits, or a step longer than the run) dropped")
    return tuple(steps)


def _finite_non_negative(v: object) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0)


def _physical_step(rec: StepRecord, max_step_ns: int | None) -> bool:
    """A step record whose figures a step can have: times finite, not negative, a wall time above 0 and,
    when the run's length is known, no longer than the run; the data wait within the step."""
    for f in dataclasses.fields(rec):
        if f.name.endswith("_ns") or f.name in ("cpu_steps", "micro_batches"):
            if not _finite_non_negative(getattr(rec, f.name)):
                return False
    if not isinstance(rec.wall_ns, int) or rec.wall_ns <= 0:
        return False
    if max_step_ns is not None and rec.wall_ns > max_step_ns:
        return False
    return rec.data_wait_ns is None or rec.data_wait_ns <= rec.wall_ns


def read_samples(run_dir: Path, notes: list[str]) -> Samples | None:
    p = confined(run_dir, SAMPLES, notes)
    if p is None:
        notes.append(f"{SAMPLES} is missing: no NVML/psutil samples")
        return None
    process: list[ProcessSample] = []
    gpu: list[GpuSample] = []
    host: list[HostSample] = []
    interval_ms = None
    cpu_count = None
    memory_bytes = None
    skipped = 0
    absurd = 0
    for row in _jsonl(p, notes):
        kind = row.get("kind")
        if kind in ("process", "gpu", "host") and not _physical_sample(row):
            absurd += 1
            continue
        try:
            if kind in _SAMPLE_KINDS:
                check(_SAMPLE_KINDS[kind], row)  # types and 64-bit integers (_physical_sample: the values)
                (process if kind == "process" else gpu if kind == "gpu" else host).append(
                    _SAMPLE_KINDS[kind].from_dict(row))
            elif kind == "meta":
                interval_ms = _meta(row, "interval_ms", (int, float), interval_ms, 1e-3, 86_400_000.0)
                cpu_count = _meta(row, "system_cpu_count", int, cpu_count, 1, 2**20)
                memory_bytes = _meta(row, "system_memory_bytes", int, memory_bytes, 1, 2**62)
        except FieldRangeError:  # a number past 64 bits
            absurd += 1
        except (TypeError, ValueError, KeyError):  # FieldTypeError is a ValueError
            skipped += 1
    if skipped:
        notes.append(f"{SAMPLES}: {skipped} sample(s) without the required fields, or with a field of the wrong "
                     "type or out of range, skipped")
    if absurd:
        notes.append(f"{SAMPLES}: {absurd} sample(s) with values no sample can have (negative, not finite, more than 64 "
                     "bits, a utilization over 100%) dropped")
    return Samples(process=tuple(process), gpu=tuple(gpu), interval_ms=interval_ms, system_cpu_count=cpu_count,
                   host=tuple(host), system_memory_bytes=memory_bytes)


_SAMPLE_KINDS: dict[str, type] = {"process": ProcessSample, "gpu": GpuSample, "host": HostSample}


def _meta(row: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any, low: float, high: float) -> Any:
    """A field of the sampler's ``meta`` line when it has its type and lies in [low, high]; else ``default``."""
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, kind) or not low <= v <= high:  # NaN fails the comparison
        return default
    return v if kind is int else float(v)


def _physical_sample(row: dict[str, Any]) -> bool:
    """A sample's numbers finite and not negative; utilizations (GPU, memory) at most 100%."""
    for key, v in row.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if abs(v) >= 2**63 or not math.isfinite(v) or (v < 0 and key not in ("rank",)):  # NaN: not >= 2**63
            return False
        if key in ("util_pct", "mem_util_pct") and v > 100.0:
            return False
    return True
