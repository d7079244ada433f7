"""A run directory (``docs/run-directory.md``) → ``RunData`` (``metrics`` left empty).

Every file is read with the model's ``from_dict``; unknown keys are ignored so a run
written by a newer gpudoctor stays readable where the schema allows it. A crashed or
killed run may lack files or end mid-line: what is missing goes into ``RunData.notes``
and the rest is read. Only an unreadable ``manifest.json`` is fatal (``RunDirError``).

A manifest is untrusted input: its fields are type-checked before use (a wrong type is a
``RunDirError`` naming the field), and every path it names must resolve inside the run
directory. A run whose ``gpudoctor`` process died (the manifest still says "running") is
told from the training process's own account, ``.child-state.json``, when it wrote one.
The line files (``steps.jsonl``, ``samples.jsonl``) are read by ``parse.records``.
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
from gpudoctor.model.layout import (  # noqa: F401 - RUN_DIR_FILES and is_run_dir: re-exported
    CHILD_STATE,
    LOADER_PSTATS,
    MANIFEST,
    PSTATS,
    RUN_DIR_FILES,
    SAMPLES,
    SCHEMA_VERSION,
    SETTINGS,
    STEPS,
    TRACE_GLOBS,
    is_run_dir,
    rank_glob,
    rank_of,
)
from gpudoctor.model.run import (
    Collected,
    ExceptionInfo,
    Manifest,
    PstatsEntry,
    RunStatus,
    Settings,
)
from gpudoctor.parse.records import (  # noqa: F401 - read_samples, read_steps: re-exported
    confined,
    rank_files,
    read_samples,
    read_steps,
)

PSTATS_TOP = 40  # functions kept from profile.pstats, by cumulative time
PSTATS_LOADER_TOP = 30  # and those with the most self time inside the DataLoader's fetch (GD201)


def read_manifest(run_dir: Path) -> Manifest | None:
    p = run_dir / MANIFEST
    if not p.is_file():
        return None
    if safe.inside(run_dir, MANIFEST) is None or safe.not_regular(p):
        raise RunDirError(f"{p}: the manifest is not a regular file inside the run directory (a symlink out of it?); "
                          "refusing a damaged or hostile run directory: re-run `gpudoctor profile`")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:  # ValueError: not JSON, or an integer of 4300+ digits
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
        check(Manifest, data, finite=True)
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
    files = rank_files(run_dir, SETTINGS, notes)
    if not files:
        notes.append(f"{SETTINGS} is missing: the script's settings (DataLoader, flags, optimizer) are unknown")
        return None
    for rank, p in files:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            check(Settings, data, finite=True)  # every field of its type and range, or no settings
            settings = Settings.from_dict(data)
        except FieldTypeError as err:
            notes.append(f"{p.name} is malformed ({err}); settings are unknown")
            continue
        except (OSError, TypeError, ValueError, KeyError, RecursionError) as err:
            notes.append(f"{p.name} could not be read ({type(err).__name__}: {err}); settings are unknown")
            continue
        if rank is not None and len(files) > 1:
            notes.append(f"settings of rank {rank} ({p.name}); {len(files)} ranks recorded theirs")
        return settings
    return None


def _is_loader_fetch(key: tuple[Any, ...]) -> bool:
    """The DataLoader's fetch (``torch/utils/data/_utils/fetch.py``: ``_MapDatasetFetcher.fetch``,
    ``_IterableDatasetFetcher.fetch``): the dataset's ``__getitem__`` and the ``collate_fn`` of one batch."""
    file, _line, func = key
    return func == "fetch" and str(file).replace("\\", "/").endswith("utils/data/_utils/fetch.py")


def loader_times(stats: dict[Any, Any], strict: bool = False) -> dict[Any, tuple[float, float]]:
    """Each function's (self, cumulative) seconds spent inside the DataLoader's fetch, from a
    cProfile statistics dictionary (``{(file, line, func): (cc, nc, tt, ct, callers)}``).

    A fetch call counts whole. Any other function gets, along each caller edge, the edge's time
    (cProfile records a callee's tt and ct per caller) times the share of that caller's own time
    that lies inside the fetch; its share is its time inside over its cumulative time, capped at
    1. Self-recursive edges are skipped (the outer call's times cover them). Empty when no fetch
    ran in this process (workers).

    Exact on a profile of the loading alone (``loader.pstats``: nothing in it but the DataLoader's
    calls). On a whole process's profile the shares are a guess where a function is called from
    inside the fetch and from outside it, and a wrong one where such a function leads into the
    model: ``nn.Module.__call__`` runs a transform and the model's layers alike, so the model's
    forward (and through its own calls, a cycle of caller edges) got a share of the fetch. With
    ``strict`` (a run without ``loader.pstats``), a function counts only when every caller of it is
    wholly inside: never the model's code, and the loading's code under a shared caller is missed."""
    roots = [k for k in stats if _is_loader_fetch(k)]
    if not roots:
        return {}
    callees: dict[Any, list[Any]] = {}
    for key, value in stats.items():
        callers = value[4] if len(value) > 4 and isinstance(value[4], dict) else {}
        for caller in callers:
            if caller != key:
                callees.setdefault(caller, []).append(key)
    share: dict[Any, float] = {k: 1.0 for k in roots}
    out: dict[Any, tuple[float, float]] = {k: (float(stats[k][2]), float(stats[k][3])) for k in roots}
    if strict:
        todo = list(roots)
        while todo:
            for key in callees.get(todo.pop(), ()):
                if key in share:
                    continue
                callers = [c for c in stats[key][4] if c != key]
                if callers and all(share.get(c) == 1.0 for c in callers):
                    share[key] = 1.0
                    out[key] = (float(stats[key][2]), float(stats[key][3]))
                    todo.append(key)
        return out
    todo = list(roots)
    budget = 50 * len(stats) + 1000  # a bound on updates: cycles converge slowly, never loop forever
    while todo and budget > 0:
        caller = todo.pop()
        for key in callees.get(caller, ()):
            if key in share and share[key] >= 1.0:
                continue
            budget -= 1
            value = stats[key]
            tt_in = ct_in = 0.0
            for c, edge in value[4].items():
                f = share.get(c, 0.0)
                if f > 0.0 and c != key:
                    tt_in += f * float(edge[2])
                    ct_in += f * float(edge[3])
            ct = float(value[3])
            new = min(1.0, ct_in / ct) if ct > 0 else 0.0
            if new - share.get(key, 0.0) > 1e-6:
                share[key] = new
                out[key] = (min(float(value[2]), tt_in), min(ct, ct_in))
                todo.append(key)
    return out


def _load_pstats(p: Path) -> dict[Any, Any]:
    stats = marshal.loads(p.read_bytes())
    if not isinstance(stats, dict):
        raise ValueError("not a pstats dictionary")
    return stats


def _added(a: dict[Any, Any], b: dict[Any, Any]) -> dict[Any, Any]:
    """Two cProfile statistics dictionaries as one (``pstats.Stats.add``): summed by function and caller."""
    out = dict(a)
    for key, value in b.items():
        if key not in out:
            out[key] = value
            continue
        cc, nc, tt, ct, callers = out[key][:5]
        callers = dict(callers) if isinstance(callers, dict) else {}
        for c, edge in (value[4] if isinstance(value[4], dict) else {}).items():
            old = callers.get(c)
            callers[c] = edge if old is None else tuple(x + y for x, y in zip(old, edge, strict=False))
        out[key] = (cc + value[0], nc + value[1], tt + value[2], ct + value[3], callers)
    return out


def read_pstats(run_dir: Path, notes: list[str], top: int = PSTATS_TOP) -> tuple[PstatsEntry, ...]:
    """The ``top`` functions of ``profile.pstats`` by cumulative time (marshal format of cProfile),
    and, when the training process ran the DataLoader's fetch itself (``num_workers=0``), the
    ``PSTATS_LOADER_TOP`` functions with the most self time inside it and the fetch itself, each
    with its time inside the fetch (:func:`loader_times`).

    The DataLoader's own calls were profiled apart (``loader.pstats``, ``collect.loaderprof``): the
    two files add up to the process's profile, and the time inside the fetch comes from the
    loader's alone. A run without it (recorded before it existed, or whose loader profile could
    not be written) is read with :func:`loader_times`' ``strict`` rule."""
    files = rank_files(run_dir, PSTATS, notes)  # a distributed run: the lowest rank's profile.rank<R>.pstats
    if not files:
        notes.append(f"{PSTATS} is missing: no cProfile of the script")
        return ()
    rank, p = files[0]
    loader_stats: dict[Any, Any] | None = None
    for r, lp in rank_files(run_dir, LOADER_PSTATS, notes):
        if r == rank:
            try:
                loader_stats = _load_pstats(lp)
            except (OSError, EOFError, ValueError, TypeError) as err:
                notes.append(f"{lp.name} could not be read ({type(err).__name__}: {err}): the DataLoader's time "
                             "is estimated from the whole profile")
    try:
        stats = _load_pstats(p)
        if loader_stats is not None:
            loader = loader_times(loader_stats)
            stats = _added(stats, loader_stats)
        else:
            loader = loader_times(stats, strict=True)
        rows = []
        for key, value in stats.items():
            file, line, func = key
            _cc, nc, tt, ct = value[:4]
            in_tt, in_ct = loader.get(key, (0.0, 0.0))
            rows.append(PstatsEntry(file=str(file), line=int(line), function=str(func), calls=int(nc),
                                    tottime_s=float(tt), cumtime_s=float(ct),
                                    loader_tottime_s=round(in_tt, 6), loader_cumtime_s=round(in_ct, 6)))
    except (OSError, EOFError, ValueError, TypeError, IndexError, AttributeError) as err:
        notes.append(f"{PSTATS} could not be read ({type(err).__name__}: {err})")
        return ()
    rows.sort(key=lambda e: (-e.cumtime_s, e.file, e.line, e.function))
    inside = sorted((i for i, e in enumerate(rows) if e.loader_tottime_s > 0.0),
                    key=lambda i: -rows[i].loader_tottime_s)[:PSTATS_LOADER_TOP]
    fetch = (i for i, e in enumerate(rows) if _is_loader_fetch((e.file, e.line, e.function)))
    keep = set(range(min(top, len(rows)))) | set(inside) | set(fetch)
    return tuple(rows[i] for i in sorted(keep))


def trace_paths(run_dir: Path, manifest: Manifest | None, notes: list[str]) -> list[Path]:
    """The run's Kineto traces: those the manifest lists, else any ``*.pt.trace.json[.gz]``. Only regular
    files inside the run directory are returned: the manifest's paths are checked by
    :func:`check_manifest_paths`; a file found by name that is a FIFO, a device or a symlink out of the
    run directory is skipped with a note."""
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
        except (OSError, ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            continue
        if isinstance(data, dict):
            return data, ("" if rank is None else f" (rank {rank}'s account; {len(files)} ranks left theirs)")
    return None, ""


def _state_field(state: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    v = state.get(name)
    if kind is int and isinstance(v, int) and not 0 <= v < 2**63:  # a count: not negative, 64 bits
        return default
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
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) and -256 < code < 256 else manifest.exit_code,
        signal=sig if isinstance(sig, int) and not isinstance(sig, bool) and 0 < sig < 256 else manifest.signal,
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
        if c.name == "steps":  # partial steps are the report's warning (Manifest.warnings), not a note
            continue
        if c.partial and c.reason and not any(c.reason in n for n in out):
            out.append(f"{c.name}: partial: {c.reason}")
    return out


def read_run_dir(run_dir: Path) -> tuple[RunData, list[Path]]:
    """The run's records and the paths of its traces (read separately)."""
    notes: list[str] = []
    manifest = read_manifest(run_dir)
    settings = read_settings(run_dir, notes)
    run_ns = None
    if manifest is not None and isinstance(manifest.duration_s, (int, float)) and manifest.duration_s > 0:
        run_ns = int(manifest.duration_s * 1e9 * 1.01) + 1_000_000_000  # clocks differ by a little; a second's slack
    steps = read_steps(run_dir, notes, run_ns)
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
