"""A run directory (``docs/run-directory.md``) → ``RunData`` (``metrics`` left empty).

Every file is read with the model's ``from_dict``; unknown keys are ignored so a run
written by a newer gpudoctor stays readable where the schema allows it. A crashed or
killed run may lack files or end mid-line: what is missing goes into ``RunData.notes``
and the rest is read. Only an unreadable ``manifest.json`` is fatal (``RunDirError``).
"""

from __future__ import annotations

import dataclasses
import json
import marshal
from pathlib import Path
from typing import Any

from gpudoctor.errors import RunDirError
from gpudoctor.model.findings import RunData
from gpudoctor.model.run import (
    SCHEMA_VERSION,
    GpuSample,
    Manifest,
    ProcessSample,
    PstatsEntry,
    Samples,
    Settings,
    StepRecord,
)

MANIFEST = "manifest.json"
SETTINGS = "settings.json"
STEPS = "steps.jsonl"
SAMPLES = "samples.jsonl"
PSTATS = "profile.pstats"
TRACE_GLOBS = ("*.pt.trace.json.gz", "*.pt.trace.json")
RUN_DIR_FILES = (MANIFEST, SETTINGS, STEPS, SAMPLES, PSTATS)
PSTATS_TOP = 40  # functions kept from profile.pstats, by cumulative time


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / f).is_file() for f in RUN_DIR_FILES)


def rank_files(run_dir: Path, name: str) -> list[tuple[int | None, Path]]:
    """``name`` and its rank-tagged copies of a distributed run (``steps.rank3.jsonl`` for
    ``steps.jsonl``, written by each rank of a torchrun job): the plain file first, then by rank."""
    stem, dot, ext = name.partition(".")
    out: list[tuple[int | None, Path]] = []
    if (run_dir / name).is_file():
        out.append((None, run_dir / name))
    tagged = []
    for p in run_dir.glob(f"{stem}.rank*{dot}{ext}"):
        middle = p.name[len(stem) + len(".rank"): len(p.name) - len(dot + ext)]
        if middle.isdigit() and p.is_file():
            tagged.append((int(middle), p))
    return out + sorted(tagged)


def read_manifest(run_dir: Path) -> Manifest | None:
    p = run_dir / MANIFEST
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunDirError(
            f"{p}: the manifest is not valid JSON ({err}); the run directory is damaged, "
            "re-run `gpudoctor profile` or pass its trace files instead"
        ) from None
    if not isinstance(data, dict):
        raise RunDirError(f"{p}: the manifest is not a JSON object; re-run `gpudoctor profile`")
    version = data.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise RunDirError(
            f"{p}: written by a newer gpudoctor (run-directory schema {version}, this one reads "
            f"{SCHEMA_VERSION}); upgrade gpudoctor (pip install -U gpudoctor)"
        )
    try:
        return Manifest.from_dict(data)
    except (TypeError, ValueError, KeyError) as err:
        raise RunDirError(f"{p}: the manifest is incomplete or malformed ({err}); re-run `gpudoctor profile`") from None


def read_settings(run_dir: Path, notes: list[str]) -> Settings | None:
    """``settings.json``; in a distributed run, the lowest rank's ``settings.rank<R>.json``."""
    files = rank_files(run_dir, SETTINGS)
    if not files:
        notes.append(f"{SETTINGS} is missing: the script's settings (DataLoader, flags, optimizer) are unknown")
        return None
    for rank, p in files:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            settings = Settings.from_dict(data)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError, ValueError, KeyError) as err:
            notes.append(f"{p.name} could not be read ({type(err).__name__}: {err}); settings are unknown")
            continue
        if rank is not None and len(files) > 1:
            notes.append(f"settings of rank {rank} ({p.name}); {len(files)} ranks recorded theirs")
        return settings
    return None


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
        except json.JSONDecodeError:
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


def read_steps(run_dir: Path, notes: list[str]) -> tuple[StepRecord, ...]:
    """``steps.jsonl``, and every rank's ``steps.rank<R>.jsonl`` of a distributed run (rank set)."""
    files = rank_files(run_dir, STEPS)
    if not files:
        notes.append(f"{STEPS} is missing: no per-step records (wall time, data wait)")
        return ()
    steps = []
    for rank, p in files:
        skipped = 0
        for row in _jsonl(p, notes):
            try:
                rec = StepRecord.from_dict(row)
            except (TypeError, ValueError, KeyError):
                skipped += 1
                continue
            if rank is not None and rec.rank is None:
                rec = dataclasses.replace(rec, rank=rank)
            steps.append(rec)
        if skipped:
            notes.append(f"{p.name}: {skipped} record(s) without the required fields skipped")
    return tuple(steps)


def read_samples(run_dir: Path, notes: list[str]) -> Samples | None:
    p = run_dir / SAMPLES
    if not p.is_file():
        notes.append(f"{SAMPLES} is missing: no NVML/psutil samples")
        return None
    process: list[ProcessSample] = []
    gpu: list[GpuSample] = []
    interval_ms = None
    cpu_count = None
    skipped = 0
    for row in _jsonl(p, notes):
        kind = row.get("kind")
        try:
            if kind == "process":
                process.append(ProcessSample.from_dict(row))
            elif kind == "gpu":
                gpu.append(GpuSample.from_dict(row))
            elif kind == "meta":
                v = row.get("interval_ms")
                interval_ms = float(v) if isinstance(v, (int, float)) else interval_ms
                c = row.get("system_cpu_count")
                cpu_count = int(c) if isinstance(c, int) else cpu_count
        except (TypeError, ValueError, KeyError):
            skipped += 1
    if skipped:
        notes.append(f"{SAMPLES}: {skipped} sample(s) without the required fields skipped")
    return Samples(process=tuple(process), gpu=tuple(gpu), interval_ms=interval_ms, system_cpu_count=cpu_count)


def read_pstats(run_dir: Path, notes: list[str], top: int = PSTATS_TOP) -> tuple[PstatsEntry, ...]:
    """The ``top`` functions of ``profile.pstats`` by cumulative time (marshal format of cProfile)."""
    files = rank_files(run_dir, PSTATS)  # a distributed run: the lowest rank's profile.rank<R>.pstats
    if not files:
        notes.append(f"{PSTATS} is missing: no cProfile of the script")
        return ()
    p = files[0][1]
    try:
        with open(p, "rb") as fh:
            stats = marshal.load(fh)
        if not isinstance(stats, dict):
            raise ValueError("not a pstats dictionary")
        rows = []
        for key, value in stats.items():
            file, line, func = key
            _cc, nc, tt, ct = value[:4]
            rows.append(PstatsEntry(file=str(file), line=int(line), function=str(func), calls=int(nc),
                                    tottime_s=float(tt), cumtime_s=float(ct)))
    except (OSError, EOFError, ValueError, TypeError) as err:
        notes.append(f"{PSTATS} could not be read ({type(err).__name__}: {err})")
        return ()
    rows.sort(key=lambda e: (-e.cumtime_s, e.file, e.line, e.function))
    return tuple(rows[:top])


def trace_paths(run_dir: Path, manifest: Manifest | None, notes: list[str]) -> list[Path]:
    """The run's Kineto traces: those the manifest lists, else any ``*.pt.trace.json[.gz]``."""
    paths: list[Path] = []
    if manifest is not None and manifest.traces:
        for rel in manifest.traces:
            p = run_dir / rel
            if p.is_file():
                paths.append(p)
            else:
                notes.append(f"trace {rel} listed in the manifest is missing")
    if not paths:
        seen: set[Path] = set()
        for pattern in TRACE_GLOBS:
            for p in sorted(run_dir.rglob(pattern)):
                if p not in seen:
                    seen.add(p)
                    paths.append(p)
    return paths


def read_run_dir(run_dir: Path) -> tuple[RunData, list[Path]]:
    """The run's records and the paths of its traces (read separately)."""
    notes: list[str] = []
    manifest = read_manifest(run_dir)
    if manifest is None:
        notes.append(f"{MANIFEST} is missing: how the run was started and ended is unknown")
    elif manifest.status.value == "running":
        notes.append("the manifest still says 'running': the run ended without finishing it (killed or crashed)")
    settings = read_settings(run_dir, notes)
    steps = read_steps(run_dir, notes)
    samples = read_samples(run_dir, notes)
    pstats = read_pstats(run_dir, notes)
    traces = trace_paths(run_dir, manifest, notes)
    if not traces:
        reason = manifest.not_collected_reason("torch.profiler") if manifest else ""
        notes.append("no Kineto trace in the run directory" + (f" ({reason})" if reason else ""))
    run = RunData(
        source=str(run_dir),
        manifest=manifest,
        settings=settings,
        steps=steps,
        samples=samples,
        pstats=pstats,
        notes=tuple(notes),
    )
    return run, traces
