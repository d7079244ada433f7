"""What the training process collected and what it did not, and why: its account of the run.

Read from the :class:`~gpudoctor.collect.child.Child`'s instruments once the script has ended
(``Child.write_state(final=True)``): one :class:`~gpudoctor.model.Collected` per instrument (steps,
torch.profiler, CUDA, ``TEARDOWN_CUPTI``, cProfile, Python's profiler slot, settings), and every file
the process could not write (``manifest.write_errors``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpudoctor.model import Collected

if TYPE_CHECKING:
    from gpudoctor.collect.child import Child


def collected(child: Child) -> list[Collected]:
    """One entry per instrument: whether it collected, what, and why not (``manifest.collected``)."""
    out: list[Collected] = []
    torch = child.torch
    tracker = child.tracker
    steps = tracker.steps_seen if tracker is not None else 0
    s = child.schedule
    # steps
    tw = child.timewindow
    timed = tw is not None and tw.recorded_s is not None and not steps
    if tracker is None:
        out.append(Collected("steps", False, "the instruments were not installed (see notes)"))
    elif steps:
        _, why, _ = tracker.describe()
        w = child.writer
        lost = [tracking_stopped(child)] if tracker.error else []
        if child.swallowed and not tracker.error:
            lost.append(f"{child.swallowed}; steps {steps} and later were not recorded")
        if w is not None and w.error:
            lost.append(f"{w.path.name}: {w.error}; {w.lines_written:,} of {steps:,} step records written")
        kept = not (w is not None and w.error) or w.lines_written > 0
        out.append(Collected("steps", kept, "; ".join(lost), detail=f"{steps} steps: {why}", partial=bool(lost) and kept))
    else:
        reason = "no step structure: no optimizer step, backward(), root-module call or DataLoader batch was seen"
        if timed:
            reason += f"; seconds {tw.recorded_s[0]:g}-{tw.recorded_s[1]:g} of the script were recorded instead"
        elif tw is not None and tw.reason:
            reason += f"; no time-based window either: {tw.reason}"
        out.append(Collected("steps", False, reason))
    if tracker is not None and tracker.error and not steps:
        out.append(Collected("steps", False, tracking_stopped(child)))
    # torch.profiler
    d = child.driver
    if d is None:
        out.append(Collected("torch.profiler", False, "no profiler schedule was given"))
    elif d.owner == "user":
        two = "two profilers cannot record at once: gpudoctor's gave way and analyses the script's traces"
        if d.traces:
            ours = d.user_exports_by_gpudoctor
            copied = d.user_copies
            before = len(d.traces) - ours - copied  # gpudoctor's own windows, before the script's profiler
            parts = []
            if copied:
                parts.append(f"{copied} trace(s) it exported were copied here (its own files stay where it wrote them)")
            if ours:
                parts.append(f"{ours} trace(s) it recorded but did not export were exported here by gpudoctor")
            if before:
                parts.append(f"{before} window(s) of gpudoctor's were recorded before it")
            out.append(Collected("torch.profiler", True, detail=f"the script ran torch.profiler itself; {two}; {'; '.join(parts)}"))
        else:
            why = "; ".join(d.user_trace_errors[:1]) or "it exported no trace"
            out.append(Collected("torch.profiler", False, f"the script ran torch.profiler itself ({two}), and {why}"))
    elif timed and d.time_trace:
        out.append(Collected("torch.profiler", True, detail=f"a time-based window, seconds {tw.recorded_s[0]:g}-{tw.recorded_s[1]:g} of the script (no step structure; CPU{' + CUDA' if d.cuda_traced else ''})"))
    elif d.error and not d.traces:
        out.append(Collected("torch.profiler", False, d.error))
    elif d.write_errors and not d.traces:
        lost = d.write_errors
        out.append(Collected("torch.profiler", False, f"no trace could be written ({lost[0]['error']}); "
                             f"{len(lost)} window(s) recorded and lost"))
    elif d.traces:
        parts = ["CPU" + (" + CUDA" if d.cuda_traced else "")]
        if s is not None:
            extras = [n for n, on in (("shapes", s.record_shapes), ("stacks", s.with_stack), ("memory", s.profile_memory)) if on]
            if extras:
                n = d.detail_windows_recorded
                which = "every window" if not s.detail_windows or n == len(d.traces) else f"the first {n} window(s)"
                parts.append(f"{', '.join(extras)} in {which}")
        detail = f"{len(d.traces)} window(s) recorded ({'; '.join(parts)})"
        if d.slot_notes:  # where its stacks or its probe gave way to another profiler (profslot)
            detail += "; " + "; ".join(d.slot_notes)
        if d.error:
            detail += f"; then: {d.error}"
        lost = d.write_errors
        reason = f"{len(lost)} window(s) could not be written ({lost[0]['error']})" if lost else ""
        out.append(Collected("torch.profiler", True, reason, detail=detail, partial=bool(lost)))
    elif steps == 0:
        why = f"; no time-based window either: {tw.reason}" if tw is not None and tw.reason else ""
        out.append(Collected("torch.profiler", False, f"no training steps were found, so no profiling window opened{why}"))
    elif s is not None and steps <= s.skip_first:
        out.append(Collected("torch.profiler", False, f"the run ended after {steps} steps, before the first profiled window (step {s.skip_first}); lower --skip-first"))
    else:
        why = f": {'; '.join(d.slot_notes)}" if d.slot_notes else ""
        out.append(Collected("torch.profiler", False, f"no trace was written{why}"))
    # CUDA
    out.append(collected_cuda(child))
    out.append(collected_cupti(child))
    # cProfile
    c = child.cprof
    if c is None:
        out.append(Collected("cprofile", False, "the instruments were not installed (see notes)"))
    elif not child.cfg.get("cprofile"):
        out.append(Collected("cprofile", False, "switched off (--no-cprofile)"))
    elif c.write_error:
        out.append(Collected("cprofile", False, f"{c.path.name} could not be written: {c.write_error}", detail=c.detail()))
    elif timed and tw.pstats_written:
        note = f"; its cProfile {tw.cprofile_note}" if tw.cprofile_note else ""
        out.append(Collected("cprofile", True, detail=f"a time-based window, seconds {tw.recorded_s[0]:g}-{tw.recorded_s[1]:g} of the script's main thread (no step structure){note}"))
    elif timed and tw.cprofile_note:
        out.append(Collected("cprofile", False, f"the time-based window's cProfile {tw.cprofile_note}"))
    elif c.error and c.first is None:
        out.append(Collected("cprofile", False, c.error))
    elif c.first is not None:
        detail = c.detail()
        if c.error:
            detail += f"; {c.error}"
        lp = child.loader_prof
        if lp is not None and lp.written:
            detail += f"; the DataLoader's own calls apart in {lp.path.name}"
        elif lp is not None and lp.error:
            detail += f"; {lp.error}"
        if lp is not None and lp.gave_way:
            detail += f"; the DataLoader's cProfile {lp.gave_way}"
        out.append(Collected("cprofile", True, detail=detail))
    elif c.gave_way:
        out.append(Collected("cprofile", False, f"gpudoctor's cProfile window {c.gave_way}"))
    elif steps == 0:
        out.append(Collected("cprofile", False, "no training steps were found, so no cProfile window opened"))
    else:
        out.append(Collected("cprofile", False, f"the run ended after {steps} steps, before the cProfile window (step {c.start_step})"))
    from gpudoctor.collect import profslot  # noqa: PLC0415

    if profslot.events:  # the script took Python's profiler slot from gpudoctor's instruments
        out.append(Collected("profiler slot", True, detail=profslot.told()))
    # settings
    if child.capture is None:
        out.append(Collected("settings", False, "the instruments were not installed (see notes)"))
    elif child.settings_write_error:
        earlier = child.settings_path().is_file()
        out.append(Collected("settings", earlier, f"{child.settings_path().name} could not be written: "
                             f"{child.settings_write_error}" + ("; the version written earlier in the run is kept" if earlier else ""),
                             partial=earlier))
    else:
        errs = "; ".join(child.capture.errors)
        out.append(Collected("settings", True, detail=f"errors: {errs}" if errs else ""))
    if torch is None:
        out = [Collected(c.name, False, "torch could not be imported") for c in out]
    return out


def tracking_stopped(child: Child) -> str:
    """Why step tracking stopped, from which step the figures are missing, and whether ``--steps`` held."""
    tr = child.tracker
    text = tr.error
    if tr.failed_at is not None:
        text += f"; steps {tr.failed_at} and later were not recorded"
    lim = tr.limit
    if child.swallowed:
        text += f"; {child.swallowed}"
    elif lim is not None and lim.done >= lim.max_steps:
        text += f"; --steps {lim.max_steps} still stopped the script after {lim.done} steps"
    elif lim is not None:
        text += f"; the script ran {lim.done} steps"
    return text


def write_errors(child: Child) -> list[dict[str, str]]:
    """Every file the training process could not write (``manifest.write_errors``)."""
    out: list[dict[str, str]] = []
    w = child.writer
    if w is not None and w.error:
        out.append({"path": w.path.name, "error": w.error,
                    "what": f"{w.lines_lost:,} step record(s) not written after the first {w.lines_written:,}",
                    "kept": w.path.name if w.lines_written else ""})
    c = child.cprof
    if c is not None and c.write_error:
        out.append({"path": c.path.name, "error": c.write_error, "what": "the cProfile statistics", "kept": ""})
    if child.settings_write_error:
        p = child.settings_path()
        out.append({"path": p.name, "error": child.settings_write_error, "what": "the settings as read at the end",
                    "kept": p.name if p.is_file() else ""})
    if child.driver is not None:
        out.extend(child.driver.write_errors)
    return out


def collected_cuda(child: Child) -> Collected:
    torch = child.torch
    if torch is None:
        return Collected("cuda", False, "torch could not be imported")
    if not torch.version.cuda:
        return Collected("cuda", False, f"torch {torch.__version__} is a CPU-only build: no CUDA events or CUDA trace")
    try:
        initialized = torch.cuda.is_initialized()
    except Exception:
        initialized = False
    if not initialized:
        try:
            available = torch.cuda.is_available()
        except Exception:
            available = False
        if not available:
            return Collected("cuda", False, "no CUDA device visible to torch (torch.cuda.is_available() is False)")
        return Collected("cuda", False, "the script did not use CUDA")
    timer = child.tracker.cuda if child.tracker is not None else None
    if timer is not None and timer.error:
        return Collected("cuda", False, timer.error)
    timed = timer.timed if timer is not None else 0
    return Collected("cuda", True, detail=f"GPU time of {timed} steps from CUDA events")


def collected_cupti(child: Child) -> Collected:
    """``cupti_teardown``: ok when gpudoctor set ``TEARDOWN_CUPTI=1``; why, either way."""
    d = child.cupti
    if d is None:
        return Collected("cupti_teardown", False, "not decided (see notes)")
    if d.value is None:
        return Collected("cupti_teardown", False, d.why)
    detail = f"TEARDOWN_CUPTI={d.value} set by gpudoctor: {d.why}"
    note = child.cupti_guard.note() if child.cupti_guard is not None else ""
    return Collected("cupti_teardown", True, detail=f"{detail}; {note}" if note else detail)


def cuda_facts(child: Child) -> None:
    """The CUDA facts of the run once the script has ended (cuDNN's version, the devices), where the script
    used CUDA."""
    torch = child.torch
    if torch is None:
        return
    try:
        if not torch.cuda.is_initialized():
            return
        try:
            v = torch.backends.cudnn.version()
            if v:
                child.versions["cudnn"] = str(v)
        except Exception:
            pass
        devices = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append(
                {
                    "index": i,
                    "name": str(p.name),
                    "total_memory_bytes": int(p.total_memory),
                    "compute_capability": f"{p.major}.{p.minor}",
                    "multiprocessor_count": int(p.multi_processor_count),
                }
            )
        child.state["cuda_devices"] = devices
    except Exception as err:
        child.notes.append(f"CUDA device query failed: {type(err).__name__}: {err}")
