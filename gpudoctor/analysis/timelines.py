"""Two timelines per step: the host's, where the step's work is enqueued, and the device's, where it runs.

A ``ProfilerStep#N`` range is the host's: the time the host took to *enqueue* step N. The kernels
it launched run on the device whenever the device gets to them. Where the device keeps up, they
run a few microseconds after their launch and the two timelines nearly coincide. Where it does
not (a GPU-bound loop), the host races ahead until the launch queue fills, and the kernels of a
step run long after its host range has ended: measured on the host's windows, such a step looks
idle (docs/account.md).

**Tying device work to its step.** Each kernel, copy and memset belongs to the step whose host
window contains the runtime call that launched it (the call with the same correlation id, on any
thread: the autograd engine launches the backward's kernels from its own thread, inside the
step's time). Activity whose launch call is not in the trace is tied, second, by the GPU-side
``ProfilerStep#N`` annotation (``gpu_user_annotation``) that contains it on its device. Activity
tied by neither (launched before the profiled steps, or outside them) is *untied*: it makes the
device busy where it runs, but belongs to no step.

**The device's step.** As CUDA events recorded at the step boundaries time it: step N begins on
the device once the host has begun it and the device is done with the work of the steps before
(the end of their last activity), and ends where step N+1 begins; the last one at the later of
its host end and the end of its work. Where the device keeps up, that is the host's step; where
it runs behind, it runs from the end of one step's work to the end of the next's. The first
step's window starts no later than its first activity, after the device's earlier (untied) work.
The windows tile the device's timeline; one that is empty (a step without work while the device
still ran earlier ones) is no device window.

**Which timeline limits a step.** The device waited for the host in an idle gap whose ending
work was launched after the gap began (``analysis.utilization``: the data loader, a sync, the
launches, other host work; not launch latency or a dependency). A step whose device waited for
the host less than ``DEVICE_BOUND_WAIT_PCT`` of its device window, and on another stream, an event
or a collective (a ``dependency`` gap) less than that too, is *device-bound*: the device limits it,
and its window on the device's timeline is the step (its busy time is compute, its idle instants
are charged to what the device waited for). A device that waits on its dependencies (the other
ranks' collectives, another stream) is no bottleneck of its own, however little it waits for the
host. Any other step is not device-bound: its host window stands, as before. The *account windows* are those chosen windows, in step order, each
clipped to start where the one before ended (a mixed run's two kinds of window may overlap where
one kind gives way to the other).

**The lead.** How far the host runs ahead of a device-bound step: from the host's start of the
step to the device's start of it (median over the device-bound steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudoctor.analysis import intervals as iv
from gpudoctor.analysis.names import profiler_step_number
from gpudoctor.analysis.utilization import CAUSES, HostState, idle_gaps
from gpudoctor.analysis.view import TraceView, Windows
from gpudoctor.model.metrics import GapCause
from gpudoctor.model.timelines import StepSpan, Timelines
from gpudoctor.model.trace import DeviceKind
from gpudoctor.model.units import duration_text

#: A step whose device waited for the host less than this share of its device window is limited by
#: the device: the host's own work (launches, Python, data loading, syncs) kept the device from
#: its next work for under a twentieth of the step, so making the host faster could win at most that;
#: making the device faster wins the rest. Above it the host has measurably held the device up and
#: today's host-window account stands.
DEVICE_BOUND_WAIT_PCT = 5.0

#: Idle gaps in which the device waited for the host (the work that ended them was launched after
#: they began); ``short`` and ``dependency`` gaps were queued work (launch latency, a stream or event).
HOST_WAIT_CAUSES: tuple[GapCause, ...] = (GapCause.DATALOADER, GapCause.SYNC, GapCause.LAUNCH_BOUND, GapCause.OTHER)


@dataclass(frozen=True)
class StepTimelinesResult:
    """The timelines of one trace's steps on one device, and the windows the account is charged on."""

    summary: Timelines
    account: Windows  # per step: its device window (device-bound) or its host window (host-bound)
    device: Windows  # the device windows of the steps that have one
    step_of: np.ndarray  # per device event: the index (into the host windows) of its step, -1 untied


def tie_to_steps(view: TraceView, windows: Windows, device: int | None = None) -> tuple[np.ndarray, int, int]:
    """The step (index into ``windows``) of each device event, -1 where untied; and how many kernels,
    copies and memsets (of ``device``, or of every device) were tied by their launch call and by the
    GPU-side ProfilerStep annotations."""
    n = len(view.d_ts)
    out = np.full(n, -1, np.int64)
    if not n or not windows.from_steps:
        return out, 0, 0
    act = view.is_activity if device is None else view.is_activity & (view.d_device == device)
    launch = view.dev_launch
    known = launch >= 0
    k = np.full(n, -1, np.int64)
    if known.any():
        k[known] = windows.index_of(view.h_ts[launch[known]])
    out[:] = k
    by_launch = int((act & (out >= 0)).sum())
    # second source: the GPU-side ProfilerStep#N ranges, for activity without a launch call in the trace
    ann = np.flatnonzero((view.d_kind == DeviceKind.ANNOTATION) & view.dev_is(view.names.profiler_step))
    by_annotation = 0
    if len(ann):
        number_to_window = {int(num): w for w, num in enumerate(windows.numbers.tolist())}
        missing = np.flatnonzero(view.is_activity & ~known)
        for a in ann.tolist():
            num = profiler_step_number(view.tl.names[int(view.d_name[a])])
            w = number_to_window.get(num) if num is not None else None
            if w is None or not len(missing):
                continue
            inside = (
                (view.d_device[missing] == view.d_device[a])
                & (view.d_ts[missing] >= view.d_ts[a])
                & (view.d_end[missing] <= view.d_end[a])
            )
            out[missing[inside]] = w
        by_annotation = int((act & ~known & (out >= 0)).sum())
    return out, by_launch, by_annotation


def _windows(starts: list[int], ends: list[int], numbers: list[int], like: Windows,
             what: tuple[str, str]) -> Windows:
    return Windows(
        steps=like.steps,
        starts=np.array(starts, np.int64),
        ends=np.array(ends, np.int64),
        numbers=np.array(numbers, np.int64),
        from_steps=True,
        trace_start=like.trace_start,
        trace_end=like.trace_end,
        what=what[0],
        what_plural=what[1],
    )


ON_DEVICE = ("step on the device's timeline", "steps on the device's timeline")


def account_what(device_bound: int, steps: int) -> tuple[str, str]:
    """What one account window is (singular, plural): a step on the device's timeline, on the host's
    (a ProfilerStep window), or either."""
    if device_bound == 0:
        return "ProfilerStep window", "ProfilerStep windows"
    if device_bound == steps:
        return ON_DEVICE
    mixed = f"({device_bound} of {steps} on the device's timeline, the others ProfilerStep windows)"
    return f"step window {mixed}", f"step windows {mixed}"


def step_timelines(view: TraceView, windows: Windows, device: int | None,
                   host: HostState | None = None) -> StepTimelinesResult | None:
    """The host and device spans of every step of ``windows`` (the ProfilerStep windows) on
    ``device``, which timeline limits each, and the account windows; None without steps, without
    a device or without device work tied to a step."""
    if device is None or not windows.from_steps or not len(windows.starts):
        return None
    step_of, by_launch, by_annotation = tie_to_steps(view, windows, device)
    on = view.is_activity & (view.d_device == device)
    tied = on & (step_of >= 0)
    if not tied.any():
        return None
    nw = len(windows.starts)
    idx = np.flatnonzero(tied)
    first = np.full(nw, np.iinfo(np.int64).max, np.int64)
    last = np.full(nw, -1, np.int64)
    np.minimum.at(first, step_of[idx], view.d_ts[idx])
    np.maximum.at(last, step_of[idx], view.d_end[idx])
    count = np.bincount(step_of[idx], minlength=nw)
    # the device windows, as CUDA events recorded at the step boundaries time them: step N begins on the
    # device once the host has begun it and the device is done with the steps before, and ends where
    # step N+1 begins (the last one: at the later of its host end and the end of its work)
    with_work = np.flatnonzero(count)
    ends_all = np.sort(view.d_end[np.flatnonzero(on)])
    j = int(np.searchsorted(ends_all, first[with_work[0]], side="right"))  # what ended by its first start
    done = int(ends_all[j - 1]) if j > 0 else int(windows.starts[0])  # the device's work before the steps
    d_start = np.full(nw, -1, np.int64)
    d_end = np.full(nw, -1, np.int64)
    begin = [0] * nw
    for w in range(nw):
        begin[w] = max(int(windows.starts[w]), done)
        if count[w]:
            if w == with_work[0]:
                begin[w] = min(begin[w], int(first[w]))
            done = max(done, int(last[w]))
        d_end[w] = done  # for now: the end of the work so far
    for w in range(nw):
        nxt = begin[w + 1] if w + 1 < nw else max(int(windows.ends[w]), int(d_end[w]))
        if count[w] or w > with_work[0]:
            d_start[w], d_end[w] = begin[w], max(nxt, begin[w])
        else:
            d_end[w] = -1  # before the first step with device work: no device step
    has = d_end > d_start
    dw = np.flatnonzero(has)
    device_windows = _windows(d_start[dw].tolist(), d_end[dw].tolist(), windows.numbers[dw].tolist(), windows,
                              ON_DEVICE)
    # busy and host-wait idle in each device window
    bs, be = view.busy_set(device)[:2]
    busy = iv.Coverage(bs, be).covered(device_windows.starts, device_windows.ends) if len(dw) else np.zeros(0, np.int64)
    gaps = idle_gaps(view, device, device_windows, host) if len(dw) else None
    wait = np.zeros(len(dw), np.int64)
    dep = np.zeros(len(dw), np.int64)
    if gaps is not None and len(gaps.start):
        waits = np.isin(gaps.cause, [CAUSES.index(c) for c in HOST_WAIT_CAUSES])
        wait = np.bincount(gaps.window[waits], weights=gaps.lengths[waits], minlength=len(dw)).astype(np.int64)
        deps = gaps.cause == CAUSES.index(GapCause.DEPENDENCY)
        dep = np.bincount(gaps.window[deps], weights=gaps.lengths[deps], minlength=len(dw)).astype(np.int64)
    dur = device_windows.ends - device_windows.starts
    # the device limits a step only where it is busy: it waited neither for the host nor on another stream,
    # an event or a collective (a device that waits on the other ranks is no bottleneck of its own)
    device_bound_dw = (100.0 * wait < DEVICE_BOUND_WAIT_PCT * dur) & (100.0 * dep < DEVICE_BOUND_WAIT_PCT * dur)
    # per step, and the account windows (in step order, each starting where the one before ended)
    spans: list[StepSpan] = []
    a_s: list[int] = []
    a_e: list[int] = []
    a_n: list[int] = []
    pos = {int(w): i for i, w in enumerate(dw.tolist())}
    leads: list[int] = []
    prev_end = None
    for w in range(nw):
        hs, he = int(windows.starts[w]), int(windows.ends[w])
        i = pos.get(w)
        limit = "device" if i is not None and bool(device_bound_dw[i]) else "host"
        if limit == "device":
            s, e = int(device_windows.starts[i]), int(device_windows.ends[i])
            if count[w]:
                leads.append(int(first[w]) - hs)
        else:
            s, e = hs, he
        if prev_end is not None and s < prev_end:
            s = prev_end
            if e <= s and i is not None:  # a host window the device's earlier work covers: its device window
                s, e = max(int(device_windows.starts[i]), prev_end), int(device_windows.ends[i])
        if e > s:
            a_s.append(s)
            a_e.append(e)
            a_n.append(int(windows.numbers[w]))
            prev_end = e
        spans.append(StepSpan(
            step=int(windows.numbers[w]),
            host_start_ns=hs,
            host_end_ns=he,
            device_start_ns=int(first[w]) if count[w] else None,
            device_end_ns=int(last[w]) if count[w] else None,
            window_start_ns=int(device_windows.starts[i]) if i is not None else None,
            window_end_ns=int(device_windows.ends[i]) if i is not None else None,
            activities=int(count[w]),
            busy_ns=int(busy[i]) if i is not None else 0,
            host_wait_ns=int(wait[i]) if i is not None else 0,
            limit=limit,
            dependency_wait_ns=int(dep[i]) if i is not None else 0,
        ))
    n_device = sum(1 for s in spans if s.limit == "device")
    account = windows if n_device == 0 else _windows(a_s, a_e, a_n, windows, account_what(n_device, len(spans)))
    untied = int((on & (step_of < 0)).sum())
    source = " and ".join(x for x, n in (("launch calls (correlation ids)", by_launch),
                                          ("GPU-side ProfilerStep annotations", by_annotation)) if n)
    dev_total = int(dur.sum())
    summary = Timelines(
        device=device,
        steps=tuple(spans),
        device_bound_steps=n_device,
        host_bound_steps=len(spans) - n_device,
        tied_by=source,
        tied=int(tied.sum()),
        untied=untied,
        host_step_ns=int(round(float(np.mean(windows.ends - windows.starts)))),
        device_step_ns=int(round(dev_total / len(dw))) if len(dw) else None,
        device_busy_pct=round(100.0 * float(busy.sum()) / dev_total, 4) if dev_total else None,
        device_wait_pct=round(100.0 * float(wait.sum()) / dev_total, 4) if dev_total else None,
        lead_ns=int(np.median(leads)) if leads else None,
        device_bound_wait_pct=DEVICE_BOUND_WAIT_PCT,
    )
    return StepTimelinesResult(summary=summary, account=account, device=device_windows, step_of=step_of)


def timelines_note(t: Timelines) -> str:
    """What a report says about the steps whose windows are on the device's timeline."""
    n = len(t.steps)
    text = (f"the device limits {t.device_bound_steps} of {n} profiled steps (in each it waited for the host, and on "
            f"another stream, an event or a collective, under {t.device_bound_wait_pct:g}% of its time): their windows are the device's steps (from where it was "
            f"done with the steps before to where the next begins, as CUDA events time a step), their work tied "
            f"to the host's steps by {t.tied_by or 'nothing'}")
    if t.lead_ns is not None:
        text += f"; the host runs {duration_text(t.lead_ns, '?')} ahead of the device (median over those steps)"
    if t.untied:
        text += f"; {t.untied} kernels, copies and memsets belong to no profiled step (launched before them)"
    return text
