"""The end of a ``gpudoctor profile`` run: the child's account merged into the manifest (``collect.runner``).

How the run ended (status, signal, exit code, exception), what was collected and what was not
(and why), the files that could not be written, the traces gzipped while the run went
(``TraceCompressor``) and after it, and the summary printed on stderr.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.collect import rundir
from gpudoctor.collect.options import ProfileOptions
from gpudoctor.collect.relay import Signals, say, signal_name
from gpudoctor.model import layout
from gpudoctor.signals import startup_detail, stopped_during_startup

if TYPE_CHECKING:
    from gpudoctor.model import Collected, Manifest

_SIGNAL_NOTES = {
    signal.SIGKILL: "SIGKILL: kill -9, or the out-of-memory killer",
    signal.SIGSEGV: "SIGSEGV: a crash in native code",
    signal.SIGABRT: "SIGABRT: an abort in native code",
    signal.SIGBUS: "SIGBUS: a bad memory access in native code (often shared memory too small for DataLoader workers)",
}


def crash_note(run_dir: Path) -> str:
    """What ``crash.txt`` (faulthandler in the training process, one per rank) holds: "" when no fatal
    signal came (the empty files are removed), else where the crashing thread was in Python, e.g.
    "the Python stack at the crash is in crash.txt (innermost: torch/_dynamo/eval_frame.py:632 in
    _fn)". A native crash under the profilers is the place to look first (docs/run-directory.md)."""
    notes: list[str] = []
    for path in [run_dir / layout.CRASH, *sorted(run_dir.glob(layout.rank_glob(layout.CRASH)))]:
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if not text.strip():
            try:
                path.unlink()
            except OSError:
                pass
            continue
        where = innermost_frame(text)
        notes.append(f"the Python stack at the crash is in {path.name}" + (f" (innermost: {where})" if where else ""))
    return "; ".join(notes)


def _frames(text: str) -> list[tuple[str, str, str]]:
    """(file, line, function) of the crashing thread in faulthandler's dump ("Current thread …", most recent
    call first; the first thread listed when none is marked current)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(("Current thread", "Stack (most recent"))),
                 next((i for i, line in enumerate(lines) if line.startswith("Thread ")), None))
    if start is None:
        return []
    out = []
    for line in lines[start + 1:]:
        line = line.strip()
        if not line.startswith("File "):
            break
        head, _, name = line.partition(" in ")  # File "/x/y.py", line 12 in fn
        path, _, lineno = head[len("File "):].partition(", line ")
        out.append((path.strip('"'), lineno.strip(), name.strip()))
    return out


def _library(path: str) -> bool:
    p = path.replace("\\", "/")
    return "/site-packages/" in p or "/dist-packages/" in p or "/lib/python3" in p or "/gpudoctor/" in p


def innermost_frame(text: str) -> str:
    """Where the crashing thread was: its innermost frame (``FILE:LINE in NAME``, the path's last three
    parts), and the innermost frame of the user's own code beneath it when that is another one."""
    frames = _frames(text)
    if not frames:
        return ""

    def show(f: tuple[str, str, str]) -> str:
        return f"{'/'.join(Path(f[0]).parts[-3:])}:{f[1]} in {f[2]}"

    text_ = show(frames[0])
    own = next((f for f in frames if not _library(f[0])), None)
    if own is not None and own is not frames[0]:
        text_ += f"; in your code: {show(own)}"
    return text_


def iso_time(unix_ns: int) -> str:
    return datetime.fromtimestamp(unix_ns / 1e9).astimezone().isoformat(timespec="milliseconds")


def replace_manifest(m: Manifest, **kw: Any) -> Manifest:
    import dataclasses

    return dataclasses.replace(m, **kw)


#: nice of the thread that thins and gzips traces while the script runs (the lowest priority)
COMPRESS_NICE = 19


def _lower_this_threads_priority() -> None:
    """Give the calling thread the lowest CPU priority, where the OS allows it per thread (Linux:
    ``setpriority`` on a thread id changes that thread only). Thinning and gzipping a trace takes a
    core for a second or more; on a machine with few cores, at the training's priority, it took
    one from the training's intra-op threads, whose ops then stalled at their barriers (steps of
    10-15 ms took 95-250 ms right after a window on 2 cores). At nice 19 it runs in the cores'
    idle time and still finishes (the run's end compresses whatever is left, at normal priority)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPRESS_NICE)
    except OSError:
        pass


class TraceCompressor:
    """Gzips the traces the training process lists as written, while it runs (see rundir).

    In a thread of its own (not the sampler's: thinning a trace of a Python-heavy window
    takes seconds, and samples must go on meanwhile), polling the child's state file.
    :meth:`stop` waits for a trace in progress, so that the end of the run never
    compresses the same file at the same time. ``outcomes``: what
    ``rundir.compress_trace`` returned for each trace.
    """

    def __init__(self, run_dir: Path, interval_s: float = 0.2) -> None:
        self.run_dir = run_dir
        self.state_path = run_dir / layout.CHILD_STATE
        self.interval_s = interval_s
        self.outcomes: dict[str, Any] = {}
        self._mtimes: dict[Path, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpudoctor-traces", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        _lower_this_threads_priority()
        while not self._stop.wait(self.interval_s):
            try:
                self()
            except Exception:  # done again, for good, at the end of the run
                pass

    def __call__(self) -> None:
        # one training process, or every rank of a torchrun job (rank-tagged state files)
        for path in (self.state_path, *self.run_dir.glob(layout.rank_glob(layout.CHILD_STATE))):
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            if mtime == self._mtimes.get(path):
                continue
            self._mtimes[path] = mtime
            state = rundir.read_json(path) or {}
            rundir.compress_traces(self.run_dir, list(state.get("traces") or []), self.outcomes)
            if self._stop.is_set():
                return


def trace_notes(outcomes: dict[str, Any]) -> list[str]:
    """In words, for the torch.profiler entry: windows cut short by the Python-call budget,
    the Python calls the filter left out, and traces it could not filter."""
    if not outcomes:
        return []
    from gpudoctor.collect.tracefilter import TraceFilterResult  # noqa: PLC0415

    notes: list[str] = []
    results = [o for o in outcomes.values() if isinstance(o, TraceFilterResult)]
    for r in results:
        b = r.stack_bound
        if isinstance(b, dict) and {"first_step", "steps_recorded", "steps_scheduled", "python_calls_per_step", "budget"} <= b.keys():
            text = (
                f"the window from step {b['first_step']} recorded {b['steps_recorded']} of {b['steps_scheduled']} steps "
                f"with stacks: its steps make {b['python_calls_per_step']:,} Python calls each, and a window records "
                f"at most {b['budget']:,} with stacks"
            )
            if b.get("rest_recorded"):
                text += (f"; {b['rest_recorded']} more from step {b['rest_first_step']} without stacks "
                         "(a second trace, after one warm-up step)")
            notes.append(text)
    dropped = [r for r in results if r.dropped_events]
    if dropped:
        n = sum(r.dropped_events for r in dropped)
        total = sum(r.python_events for r in dropped)
        ms = sum(r.dropped_us for r in dropped) / 1000.0
        notes.append(
            f"Python calls under {dropped[0].min_us:g} µs that enclose no op left out of {len(dropped)} trace(s): "
            f"{n:,} of {total:,} ({ms:,.1f} ms of calls, now their callers' self time)"
        )
    for name, o in sorted(outcomes.items()):
        if isinstance(o, str):
            notes.append(f"{name} kept as recorded: the Python-call filter failed ({o})")
    return notes


def with_trace_notes(collected: list[Collected], notes: list[str]) -> list[Collected]:
    import dataclasses  # noqa: PLC0415

    if not notes:
        return collected
    text = "; ".join(notes)
    for i, c in enumerate(collected):
        if c.name == "torch.profiler" and c.ok:
            collected[i] = dataclasses.replace(c, detail=f"{c.detail}; {text}" if c.detail else text)
            return collected
    from gpudoctor.model import Collected  # noqa: PLC0415

    collected.append(Collected("torch.profiler", True, detail=text))
    return collected


def finish_manifest(
    m: Manifest,
    run_dir: Path,
    rc: int,
    signals: Signals,
    sampler: Any,
    nvml: Any,
    nvml_reason: str,
    end_unix_ns: int,
    duration_s: float,
    state: dict[str, Any] | None = None,
    compressor: TraceCompressor | None = None,
) -> Manifest:
    from gpudoctor.model import Collected, Device, ExceptionInfo, RunStatus

    # ``state``: the child's account, read from its file; a torchrun job passes its ranks' accounts
    # merged by ``distributed.combined_state``.
    state_path = run_dir / layout.CHILD_STATE
    if state is None:
        state = rundir.read_json(state_path) or {}
    steps_path = run_dir / layout.STEPS
    if steps_path.exists():
        rundir.repair_jsonl(steps_path)
    outcomes = compressor.outcomes if compressor is not None else {}
    rundir.compress_traces(run_dir, list(state.get("traces") or []), outcomes)
    kept_plain, incomplete, _removed = rundir.settle_leftovers(run_dir, list(state.get("traces") or []))
    steps_lines = rundir.count_lines(steps_path)

    child_status = state.get("status")
    detail = state.get("status_detail", "") or ""
    exception = ExceptionInfo.from_dict(state["exception"]) if isinstance(state.get("exception"), dict) else None
    sig: int | None = state.get("signal")
    if rc < 0:
        sig = -rc
        name = signal_name(sig)
        if sig == signal.SIGINT:
            status = RunStatus.INTERRUPTED
            detail = detail or "interrupted (SIGINT / Ctrl-C)"
        else:
            status = RunStatus.KILLED
            note = _SIGNAL_NOTES.get(sig)
            detail = f"killed by signal {sig} ({note or name})"
        exit_code = 128 + sig
    elif child_status in (None, RunStatus.RUNNING.value) and rc - 128 in signals.delivered:
        # a training process that could not report (torchrun's ranks): it ended as the signal says
        exit_code, status, sig = rc, RunStatus.INTERRUPTED, rc - 128
        detail = startup_detail(sig)
    elif child_status in (None, RunStatus.RUNNING.value):
        exit_code = rc
        status = RunStatus.COMPLETED if rc == 0 else RunStatus.FAILED
        detail = (
            f"the script ended with exit code {rc} before gpudoctor could record how "
            "(os._exit(), or a crash in gpudoctor's instruments)"
        )
        full = _disk_full(run_dir)
        if full:
            detail += f"; {full}"
    else:
        status = RunStatus(child_status)
        exit_code = rc
    if signals.delivered and status == RunStatus.COMPLETED:
        sig = signals.delivered[0]
        status = RunStatus.INTERRUPTED
        who = "Ctrl-C" if sig == signal.SIGINT else signal_name(sig)
        detail = f"{who} received; the script handled it and ended with exit code {rc}"
    crash = crash_note(run_dir)
    if crash:
        detail = "; ".join(d for d in (detail, crash) if d)
    if signals.late and sig is None:
        late = signals.late[0]
        detail = "; ".join(d for d in (detail, f"{signal_name(late)} reached gpudoctor after the script had ended "
                                       f"(not passed on): gpudoctor stopped, exit code {128 + late}") if d)

    collected: list[Collected] = []
    for c in state.get("collected", []) or []:
        try:
            collected.append(Collected.from_dict(c))
        except (TypeError, ValueError, KeyError):
            continue
    if not state.get("collected"):
        collected.extend(_collected_from_files(run_dir, steps_lines))
    collected = with_trace_notes(collected, trace_notes(outcomes))
    for note in state.get("notes", []) or []:
        collected.append(Collected("instruments", False, str(note)))
    # psutil
    if sampler.psutil_reason and not sampler.process_samples:
        collected.append(Collected("psutil", False, sampler.psutil_reason))
    else:
        detail_ps = f"{sampler.process_samples} process samples every {sampler.interval_ms} ms"
        if sampler.worker_pids:
            detail_ps += f"; {len(sampler.worker_pids)} worker process(es) seen"
        if sampler.psutil_reason:
            detail_ps += f"; {sampler.psutil_reason}"
        collected.append(Collected("psutil", sampler.process_samples > 0, "" if sampler.process_samples else "the script ended before the first sample", detail=detail_ps))
    # NVML
    versions = dict(m.versions)
    versions.update({k: str(v) for k, v in (state.get("versions") or {}).items()})
    devices: tuple[Device, ...] = ()
    if nvml is None:
        collected.append(Collected("nvml", False, nvml_reason))
    else:
        versions.update(nvml.versions())
        devices = nvml.devices()
        if sampler.nvml_error:
            collected.append(Collected("nvml", sampler.gpu_samples > 0, sampler.nvml_error, detail=f"{sampler.gpu_samples} GPU samples"))
        else:
            collected.append(Collected("nvml", True, detail=f"{sampler.gpu_samples} GPU samples from {len(devices)} device(s)"))
    cuda_devices = state.get("cuda_devices") or []
    if cuda_devices:
        by_index = {int(d["index"]): d for d in cuda_devices if isinstance(d, dict) and "index" in d}
        if devices:
            devices = tuple(
                Device(
                    index=d.index,
                    name=d.name,
                    total_memory_bytes=d.total_memory_bytes,
                    compute_capability=d.compute_capability,
                    multiprocessor_count=(by_index.get(d.index) or {}).get("multiprocessor_count")
                    if (by_index.get(d.index) or {}).get("name") == d.name
                    else None,
                )
                for d in devices
            )
        else:
            devices = tuple(Device.from_dict(d) for d in by_index.values())

    traces: list[str] = []
    for t in state.get("traces", []) or []:
        if (run_dir / t).is_file():
            traces.append(t)
        elif (run_dir / layout.plain_trace(t)).is_file():  # its gzip failed: kept as recorded
            traces.append(layout.plain_trace(t))
    on_disk = sorted(p.name for p in run_dir.glob("*" + layout.TRACE_SUFFIX))
    traces += [t for t in [*on_disk, *kept_plain] if t not in traces]

    write_errors = _write_errors(state, outcomes, sampler, incomplete)
    collected = _with_write_errors(collected, write_errors, [t for t in traces if not t.endswith(".gz")])
    return replace_manifest(
        m,
        ended_at=iso_time(end_unix_ns),
        duration_s=round(duration_s, 3),
        status=status,
        status_detail=detail,
        exit_code=exit_code,
        signal=sig,
        exception=exception,
        versions=versions,
        devices=devices,
        collected=tuple(collected),
        write_errors=tuple(write_errors),
        profiler_owner=state.get("profiler_owner", m.profiler_owner),
        step_source=str(state.get("step_source") or "none"),  # written by the child at the end of step 0
        step_source_reason=str(state.get("step_source_reason") or ""),
        step_markers=_step_markers(state),
        time_window_s=_time_window(state),
        root_module=_root_module(state),
        steps_seen=max(int(state.get("steps_seen") or 0), steps_lines),
        traces=tuple(traces),
        argv=tuple(state.get("argv") or m.argv),
        rank=state.get("rank"),
        world_size=state.get("world_size"),
    )


def _disk_full(run_dir: Path) -> str:
    """"the run directory's disk is full (N bytes free)" when it nearly is, else ""."""
    try:
        st = os.statvfs(run_dir)
    except (OSError, AttributeError):
        return ""
    free = st.f_bavail * st.f_frsize
    return f"the disk of the run directory is full ({free:,} bytes free)" if free < (1 << 20) else ""


def _write_errors(state: dict[str, Any], outcomes: dict[str, Any], sampler: Any, incomplete: list[str]) -> list[Any]:
    """Every file of the run that could not be written, from the training process's account, the
    parent's gzip and sampler, and the leftovers that had to be kept as ``.incomplete``."""
    from gpudoctor.model import WriteError  # noqa: PLC0415
    from gpudoctor.model._serde import check  # noqa: PLC0415

    out: list[WriteError] = []
    for e in state.get("write_errors") or []:
        try:
            check(WriteError, e)
            out.append(WriteError.from_dict(e))
        except (TypeError, ValueError, KeyError):
            continue
    for _name, o in sorted(outcomes.items()):
        if isinstance(o, rundir.TraceWriteFailure):
            out.append(WriteError(o.path, o.error, what="the gzipped copy of the trace", kept=o.kept))
    err = getattr(sampler, "write_error", "")
    if err:
        out.append(WriteError(layout.SAMPLES, err, what=sampler.write_lost, kept=layout.SAMPLES if sampler.lines_written else ""))
    explained = {e.kept for e in out}
    for name in incomplete:
        if name not in explained:
            out.append(WriteError(name[: -len(layout.INCOMPLETE_SUFFIX)], "its writer stopped before the end of the file",
                                  what="an unfinished file", kept=name))
    return out


def _with_write_errors(collected: list[Collected], errors: list[Any], plain_traces: list[str]) -> list[Collected]:
    """Instruments whose files could not all be written: ``partial`` (some data kept) or failed."""
    import dataclasses  # noqa: PLC0415

    out = list(collected)
    by_name = {layout.SAMPLES: ("psutil", "nvml")}
    for e in errors:
        for inst in by_name.get(e.path, ()):
            for i, c in enumerate(out):
                if c.name == inst and c.ok:
                    out[i] = dataclasses.replace(c, partial=True, reason=f"{e.path}: {e.error}; {e.what}".rstrip("; "))
    gz_failed = [e for e in errors if e.path.endswith(layout.TRACE_SUFFIX) and e.kept in plain_traces]
    if gz_failed:
        note = (f"{len(gz_failed)} trace(s) kept uncompressed (.pt.trace.json): the gzipped copy could not be "
                f"written ({gz_failed[0].error})")
        for i, c in enumerate(out):
            if c.name == "torch.profiler" and c.ok:
                out[i] = dataclasses.replace(c, detail=f"{c.detail}; {note}" if c.detail else note)
                break
    return out


def _step_markers(state: dict[str, Any]) -> tuple[Any, ...]:
    from gpudoctor.model import StepMarker

    out = []
    for d in state.get("step_markers") or []:
        try:
            out.append(StepMarker.from_dict(d))
        except (TypeError, ValueError, KeyError):
            continue
    return tuple(out)


def _root_module(state: dict[str, Any]) -> Any:
    from gpudoctor.model import RootModuleUse

    try:
        return RootModuleUse.from_dict(state["root_module"]) if state.get("root_module") else None
    except (TypeError, ValueError, KeyError):
        return None


def _time_window(state: dict[str, Any]) -> tuple[float, float] | None:
    w = state.get("time_window_s")
    try:
        return (float(w[0]), float(w[1])) if w else None
    except (TypeError, ValueError, IndexError):
        return None


def _collected_from_files(run_dir: Path, steps_lines: int) -> list[Collected]:
    """What a training process that died without reporting left behind, judged from its files."""
    from gpudoctor.model import Collected

    died = "the training process died before it could report"
    out = []
    if steps_lines:
        out.append(Collected("steps", True, detail=f"{steps_lines} steps written before the training process died"))
    else:
        out.append(Collected("steps", False, f"no step was written: {died}"))
    traces = list(run_dir.glob("*" + layout.TRACE_SUFFIX)) + list(run_dir.glob("*" + layout.plain_trace(layout.TRACE_SUFFIX)))
    if traces:
        out.append(Collected("torch.profiler", True, detail=f"{len(traces)} trace(s) exported before the training process died; a window in progress was lost"))
    else:
        out.append(Collected("torch.profiler", False, f"no trace was exported: {died} (a window in progress is lost)"))
    out.append(Collected("cuda", False, died))
    if (run_dir / layout.PSTATS).is_file():
        out.append(Collected("cprofile", True, detail="the cProfile window ended before the training process died"))
    else:
        out.append(Collected("cprofile", False, f"{died} before the end of the cProfile window (it is written when the window ends)"))
    if (run_dir / layout.SETTINGS).is_file():
        out.append(Collected("settings", True, detail="as last written during the run (at a step boundary)"))
    else:
        out.append(Collected("settings", False, f"{died} before the first step"))
    return out


def print_summary(m: Manifest, run_dir: Path, opts: ProfileOptions) -> None:
    from gpudoctor.collect.summary import main_loader, summarize_steps, summary_lines

    steps_path = run_dir / layout.STEPS
    settings_path = run_dir / layout.SETTINGS
    if m.launcher and not steps_path.exists():  # a torchrun job: every rank's steps, as the report reads them
        from gpudoctor.collect import distributed  # noqa: PLC0415

        files = distributed.rank_steps_files(run_dir)
        steps = [{**row, "rank": rank if row.get("rank") is None else row["rank"]} for rank in sorted(files) for row in rundir.read_jsonl(files[rank])]
        if files:  # and the lowest rank's settings, as the report reads them
            settings_path = run_dir / layout.rank_tagged(layout.SETTINGS, min(files))
    else:
        steps = rundir.read_jsonl(steps_path)
    # the steady steps the report's summary is of: without the first batches of the workers the settings name
    raw_settings = rundir.read_json(settings_path)
    s = summarize_steps(steps, m.step_source, main_loader(raw_settings), raw_settings)
    important = ("steps", "torch.profiler")
    missing = [f"{c.name} ({c.reason})" for c in m.collected if not c.ok and c.name in important and c.reason]
    try:
        shown = os.path.relpath(run_dir)
        if shown.startswith(".."):
            shown = str(run_dir)
    except ValueError:
        shown = str(run_dir)
    lines = summary_lines(s, m.step_source, m.status.value, m.status_detail, m.exit_code, shown, missing, m.warnings())
    if stopped_during_startup(m.status_detail):  # the script never ran: how the run ended and where, not its steps
        lines = [ln for ln in lines if ln.startswith("gpudoctor: run ")]
    for line in lines:
        say(line)
    if m.write_errors:
        say(write_errors_line(m))


def write_errors_line(m: Manifest) -> str:
    """One line for every file that could not be written (the manifest names each, with what was kept)."""
    reasons = sorted({e.error.split(":")[0] for e in m.write_errors})
    files = ", ".join(e.path + (f" (kept as {e.kept})" if e.kept and e.kept != e.path else "") for e in m.write_errors[:4])
    more = f" and {len(m.write_errors) - 4} more" if len(m.write_errors) > 4 else ""
    return (f"gpudoctor: {len(m.write_errors)} file(s) could not be written completely ({'; '.join(reasons)}): "
            f"{files}{more}; manifest.json lists what was kept")
