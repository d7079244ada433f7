"""A run directory (``docs/run-directory.md``) → ``RunData`` (``metrics`` left empty).

Every file is read with the model's ``from_dict``; unknown keys are ignored so a run
written by a newer gpudoctor stays readable where the schema allows it. A crashed or
killed run may lack files or end mid-line: what is missing goes into ``RunData.notes``
and the rest is read. Only an unreadable ``manifest.json`` is fatal (``RunDirError``).

A manifest is untrusted input: its fields are type-checked before use (a wrong type is a
``RunDirError`` naming the field), and every path it names must resolve inside the run
directory. A run whose ``gpudoctor`` process died (the manifest still says "running") is
told from the training process's own account, ``.child-state.json``, when it wrote one.
"""

from __future__ import annotations

import dataclasses
import json
import marshal
from pathlib import Path
from typing import Any

from gpudoctor import safe
from gpudoctor.errors import RunDirError
from gpudoctor.model._serde import FieldTypeError, check
from gpudoctor.model.findings import RunData
from gpudoctor.model.run import (
    SCHEMA_VERSION,
    Collected,
    ExceptionInfo,
    GpuSample,
    Manifest,
    ProcessSample,
    PstatsEntry,
    RunStatus,
    Samples,
    Settings,
    StepRecord,
)

MANIFEST = "manifest.json"
SETTINGS = "settings.json"
STEPS = "steps.jsonl"
SAMPLES = "samples.jsonl"
PSTATS = "profile.pstats"
CHILD_STATE = ".child-state.json"  # the training process's account, left when gpudoctor's process died
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
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise RunDirError(
            f"{p}: written by a newer gpudoctor (run-directory schema {version}, this one reads "
            f"{SCHEMA_VERSION}); upgrade gpudoctor (pip install -U gpudoctor)"
        )
    try:
        check(Manifest, data)
        manifest = Manifest.from_dict(data)
    except FieldTypeError as err:
        raise RunDirError(f"{p}: the manifest is incomplete or malformed: {err}; re-run `gpudoctor profile` "
                          "or pass its trace files instead") from None
    except (TypeError, ValueError, KeyError) as err:
        raise RunDirError(f"{p}: the manifest is incomplete or malformed ({err}); re-run `gpudoctor profile`") from None
    check_manifest_paths(run_dir, manifest)
    return manifest


def check_manifest_paths(run_dir: Path, manifest: Manifest) -> None:
    """Every file a manifest names must lie inside its run directory (``RunDirError`` otherwise)."""
    named = [("traces", t) for t in manifest.traces]
    named += [(f"rank_ends[{i}].traces", t) for i, e in enumerate(manifest.rank_ends) for t in e.traces]
    for field, rel in named:
        if safe.inside(run_dir, rel) is None:
            raise RunDirError(
                f"{run_dir / MANIFEST}: field '{field}' names {safe.terminal_line(rel)!s}, outside the run directory; "
                "refusing a damaged or hostile manifest: re-run `gpudoctor profile` or pass the trace files themselves"
            )


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
    """The run's Kineto traces: those the manifest lists, else any ``*.pt.trace.json[.gz]``.

    Only regular files inside the run directory are returned: the manifest's paths are
    checked by :func:`check_manifest_paths`; a file found by name that is a FIFO, a device
    or a symlink out of the run directory is skipped with a note.
    """
    paths: list[Path] = []
    if manifest is not None and manifest.traces:
        for rel in manifest.traces:
            p = run_dir / rel
            kind = safe.not_regular(p)
            if kind:
                notes.append(f"trace {rel} listed in the manifest is {kind}, not a regular file: skipped")
            elif p.is_file():
                paths.append(p)
            else:
                notes.append(f"trace {rel} listed in the manifest is missing")
    if not paths:
        seen: set[Path] = set()
        for pattern in TRACE_GLOBS:
            for p in sorted(run_dir.rglob(pattern)):
                if p in seen:
                    continue
                seen.add(p)
                rel = str(p.relative_to(run_dir))
                kind = safe.not_regular(p)
                if kind:
                    notes.append(f"{rel} is {kind}, not a regular file: skipped")
                elif safe.inside(run_dir, rel) is None:
                    notes.append(f"{rel} leads outside the run directory: skipped")
                elif p.is_file():
                    paths.append(p)
    return paths


def _child_state(run_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """The training process's own account, ``.child-state.json`` (a torchrun job: its lowest rank's)."""
    files = rank_files(run_dir, CHILD_STATE)
    for rank, p in files:
        if safe.not_regular(p):
            continue
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(data, dict):
            return data, ("" if rank is None else f" (rank {rank}'s account; {len(files)} ranks left theirs)")
    return None, ""


def _state_field(state: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    v = state.get(name)
    return v if isinstance(v, kind) and not (kind is int and isinstance(v, bool)) else default


def recover_parent_lost(run_dir: Path, manifest: Manifest, steps_written: int, notes: list[str]) -> Manifest:
    """A manifest still "running": gpudoctor's own process died (killed, or its machine lost it).

    The training process outlives it long enough to write its account (it gets SIGTERM
    when its parent dies, flushes and reports); the run is told from that account as
    "killed (parent lost)". Without one, the manifest is returned unchanged.
    """
    state, whose = _child_state(run_dir)
    if state is None:
        notes.append("the manifest still says 'running': the run ended without finishing it (killed or crashed)")
        return manifest
    child_status = _state_field(state, "status", str, "running")
    child_detail = _state_field(state, "status_detail", str, "")
    steps = max(_state_field(state, "steps_seen", int, 0), steps_written)
    if child_status == RunStatus.RUNNING.value:
        then = "the training process did not report how it ended (it was killed too)"
    else:
        then = f"the training process then ended {child_status}" + (f": {child_detail}" if child_detail else "")
    detail = f"parent lost: gpudoctor's own process died during the run; {then}, after {steps} step(s){whose}"
    collected: list[Collected] = []
    for c in state.get("collected") or []:
        try:
            check(Collected, c)
            collected.append(Collected.from_dict(c))
        except (TypeError, ValueError, KeyError):
            continue
    exception = None
    if isinstance(state.get("exception"), dict):
        try:
            check(ExceptionInfo, state["exception"])
            exception = ExceptionInfo.from_dict(state["exception"])
        except (TypeError, ValueError, KeyError):
            exception = None
    traces: list[str] = []
    for name in state.get("traces") or []:
        if not isinstance(name, str):
            continue
        for candidate in (name, name[: -len(".gz")] if name.endswith(".gz") else name):
            p = safe.inside(run_dir, candidate)
            if p is not None and p.is_file() and not safe.not_regular(p) and candidate not in traces:
                traces.append(candidate)
                break
    code = state.get("exit_code")
    sig = state.get("signal")
    notes.append("gpudoctor's own process died before it finished the manifest: how the run ended is told from "
                 "the training process's account (.child-state.json); traces it exported are not gzipped")
    return dataclasses.replace(
        manifest,
        status=RunStatus.KILLED,
        status_detail=detail,
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else manifest.exit_code,
        signal=sig if isinstance(sig, int) and not isinstance(sig, bool) else manifest.signal,
        exception=exception or manifest.exception,
        collected=tuple(collected) or manifest.collected,
        step_source=_state_field(state, "step_source", str, manifest.step_source),
        steps_seen=steps,
        traces=tuple(traces) or manifest.traces,
        profiler_owner=_state_field(state, "profiler_owner", str, manifest.profiler_owner),
    )


def write_notes(manifest: Manifest) -> list[str]:
    """What could not be written during the run, in words (from ``write_errors`` and partial instruments)."""
    out = []
    for e in manifest.write_errors:
        text = f"{e.path} could not be written ({e.error})"
        if e.what:
            text += f": {e.what}"
        if e.kept:
            text += f"; kept instead: {e.kept}"
        out.append(text)
    for c in manifest.collected:
        if c.partial and c.reason and not any(c.reason in n for n in out):
            out.append(f"{c.name}: partial: {c.reason}")
    return out


def read_run_dir(run_dir: Path) -> tuple[RunData, list[Path]]:
    """The run's records and the paths of its traces (read separately)."""
    notes: list[str] = []
    manifest = read_manifest(run_dir)
    settings = read_settings(run_dir, notes)
    steps = read_steps(run_dir, notes)
    if manifest is None:
        notes.append(f"{MANIFEST} is missing: how the run was started and ended is unknown")
    elif manifest.status == RunStatus.RUNNING:
        manifest = recover_parent_lost(run_dir, manifest, len(steps), notes)
    if manifest is not None:
        notes.extend(write_notes(manifest))
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
