"""GD301 pageable-h2d: host-to-device copies read from pageable (not pinned) memory.

What it detects
---------------
`Memcpy HtoD (Pageable -> Device)` copies in the trace: a tensor in ordinary
(pageable) host memory copied to the GPU. Fires when they take more than a
small share of step time, or when single copies exceed 64 KiB (Nsight Systems'
`cuda_memcpy_async` rule).

Why it matters
--------------
The GPU's DMA engines can only read page-locked memory, so the driver first
copies a pageable buffer into a pinned staging buffer, synchronously with the
host: the copy runs at a fraction of the bus bandwidth, `non_blocking=True`
has no effect, and the host waits for it.

How to fix
----------
Pin the batches at the DataLoader and copy them asynchronously.

Before:

```python
loader = DataLoader(ds, batch_size=64, num_workers=4)
for x, y in loader:
    x, y = x.cuda(), y.cuda()
```

After:

```python
loader = DataLoader(ds, batch_size=64, num_workers=4, pin_memory=True)
for x, y in loader:
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
```

Expected gain
-------------
Pinned copies run at the link's bandwidth: the copies would take
`count × 1.5 µs + bytes ÷ pinned bandwidth` instead of their measured time, and
the expected gain is the difference, at most the time at stake. The pinned
bandwidth is this trace's own when it has large pinned copies (≥ 1 MiB on
average), else ~75% of the GPU's PCIe link per direction (PCIe 3.0: 12 GB/s,
4.0: 24 GB/s, 5.0: 48 GB/s: the rate CUDA's bandwidthTest reaches pinned); the
1.5 µs per copy is a small copy's device time in the public traces. Pageable
copies that already run near the link's rate (as some do) win little, and
the rule says so. Factors and sources: `gpudoctor/rules/speedups.py`.

Evidence used
-------------
Trace: host-to-device copies per memory kind with count, bytes, time and
bandwidth (`TraceMetrics.transfers`); the DataLoader's `pin_memory` and its
`file:line`. The gain is the `h2d` part of the step's ledger (copies while the
GPU runs nothing else; docs/account.md), up to the pageable copies' time.

Thresholds
----------
- `pageable_h2d_share_pct` (2): pageable copy time, % of step time.
- `pageable_h2d_max_bytes` (65536): a single pageable copy larger than this.
- `error_share_pct`, `warning_share_pct`: severity from the copy time's share.

Known limits
------------
Copies of tensors created outside the DataLoader (a dataset held in host
memory, `torch.tensor(numpy_array).cuda()`) need `.pin_memory()` on the
tensor itself. Pinned memory is a scarce resource: pin batches, not whole
datasets.

References
----------
- PyTorch, pinned memory buffers: https://pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers
- PyTorch tutorial, a guide on good usage of `non_blocking` and `pin_memory()`:
  https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html
- Nsight Systems expert rules (`cuda_memcpy_async`):
  https://docs.nvidia.com/nsight-systems/UserGuide/index.html
"""

from __future__ import annotations

from gpudoctor.model.findings import (
    ChecklistStatus,
    Confidence,
    Evidence,
    Finding,
    Fix,
    Metric,
    SettingRef,
    Severity,
)
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.model.run import Injection
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.dataloader import (
    dataloader_call,
    dataloader_fix,
    dataloader_of,
    pinned_copy_injections,
)
from gpudoctor.rules.edits import dataloader_args
from gpudoctor.rules.formatting import fmt_bytes, fmt_ns, fmt_pct, location_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.speedups import (
    COPY_LATENCY_NS,
    MIN_MEASURED_COPY_BYTES,
    PCIE_PINNED_GBPS,
    is_amd,
    pcie_generation,
    pinned_copy_fraction,
)
from gpudoctor.rules.static_api import (
    Function,
    LoaderFact,
    Site,
    StaticCheck,
    StaticContext,
    Transfer,
    examples,
)
from gpudoctor.rules.static_api.text import (
    NO_CUDA,
    NO_LOADER,
    at,
    first_of,
    how,
    origin_note,
    with_kwargs,
)


def _judge(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    h2d = [x for x in m.transfers if x.direction == "HtoD"]
    pageable = [x for x in h2d if x.memory_kind == "pageable"]
    if not pageable:
        pinned = sum(x.count for x in h2d if x.memory_kind == "pinned")
        return RuleResult.fine(
            f"no host→device copies from pageable memory ({pinned} from pinned memory)"
            if h2d
            else "no host→device copies in the trace",
            applied=pinned > 0,
        )
    count = sum(x.count for x in pageable)
    nbytes = sum(x.bytes for x in pageable)
    dur = sum(x.dur_ns for x in pageable)
    biggest = max(x.max_bytes for x in pageable)
    blocking = sum(x.blocking_count for x in pageable)
    share = ctx.trace_share(m, dur)
    window = ctx.window(m)
    wlabel = ctx.window_label(window)
    if share is None:
        return RuleResult.cannot_judge("no window to put the copy time in")
    if share <= t.pageable_h2d_share_pct and biggest <= t.pageable_h2d_max_bytes:
        return RuleResult.fine(
            f"{count} pageable host→device copies, {fmt_pct(share)} of step time, largest {fmt_bytes(biggest)} "
            f"(thresholds {t.pageable_h2d_share_pct:g}%, {fmt_bytes(t.pageable_h2d_max_bytes)})"
        )
    gbps = nbytes / dur if dur else None  # bytes per ns == GB/s
    dl = ctx.main_dataloader()
    loc = location_of(dl.call_site) if dl is not None else None
    settings = []
    notes = [f"window: {window.description or wlabel}" if window is not None else ""]
    if dl is not None:
        settings.append(SettingRef("DataLoader.pin_memory", dl.pin_memory, loc))
        if dl.pin_memory:
            notes.append(
                "the DataLoader already pins its batches: these copies come from tensors made elsewhere "
                "(a dataset held in memory, torch.tensor(...) in the loop); call .pin_memory() on them"
            )
    message = (
        f"{count} host→device copies from pageable memory move {fmt_bytes(nbytes)} in {fmt_ns(dur)}, "
        f"{fmt_pct(share)} of step time"
        + (f" at {gbps:.2f} GB/s" if gbps is not None else "")
        + f"; largest {fmt_bytes(biggest)}"
        + (f"; pin_memory=False at {loc}" if dl is not None and not dl.pin_memory and loc else "")
    )
    where = f" at {loc}" if loc else ""
    instruction = (
        f"Set pin_memory=True on the DataLoader{where} and copy with `.to(device, non_blocking=True)`."
        if dl is None or not dl.pin_memory
        else "Pin the tensors that are copied (`t.pin_memory()` once, outside the loop) and copy with "
        "`.to(device, non_blocking=True)`."
    )
    before = dataloader_call(dl) + "\nfor x, y in loader:\n    x, y = x.to(device), y.to(device)"
    after = (
        dataloader_call(dl, pin_memory=True)
        + "\nfor x, y in loader:\n    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)"
    )
    metrics = [
        Metric("pageable_h2d_count", count, "count"),
        Metric("pageable_h2d_bytes", nbytes, "bytes"),
        Metric("pageable_h2d_ns", dur, "ns"),
        Metric("pageable_h2d_share_pct", round(share, 2), "%", wlabel),
        Metric("pageable_h2d_max_bytes", biggest, "bytes"),
        Metric("pageable_h2d_blocking_count", blocking, "count"),
    ]
    if gbps is not None:
        metrics.append(Metric("pageable_h2d_bandwidth", round(gbps, 2), "GB/s"))
    pinned = [x for x in h2d if x.memory_kind == "pinned" and x.bandwidth_gbps]
    if pinned:
        metrics.append(Metric("pinned_h2d_bandwidth", round(pinned[0].bandwidth_gbps or 0.0, 2), "GB/s"))
    expected, expected_note = _expected(ctx, pinned, count, nbytes, dur)
    finding = ctx.finding(
        message,
        dataloader_fix(instruction, dl, {"pin_memory": True}, before, after) if dl is None or not dl.pin_memory
        else Fix(instruction, before, after, illustration="the pageable tensors are made in the script, not by a DataLoader"),
        share_pct=share,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        settings=settings,
        notes=[n for n in notes if n],
        location=loc,
        gain_note="time of the pageable copies while the GPU did nothing else; pinned asynchronous copies overlap "
        "with compute",
        rank=m.rank,
        claims=[(Component.H2D, dur)],
        ledger=ctx.ledger(m),
        source=m,
        expected=expected,
        expected_note=expected_note,
    )
    return RuleResult.fired(finding)


def _expected(ctx: RuleContext, pinned, count: int, nbytes: int, dur: int) -> tuple[float | None, str]:
    """Pinned copies run at the link's pinned bandwidth: measured on this trace's own large pinned
    copies when it has them, else the PCIe generation of the GPU (``rules.speedups``)."""
    big = [x for x in pinned if x.count and x.bytes / x.count >= MIN_MEASURED_COPY_BYTES]
    if big:
        gbps = max(x.bandwidth_gbps or 0.0 for x in big)
        where = f"{gbps:.1f} GB/s, the pinned copies of this trace"
    else:
        name, cc = ctx.device_cc()
        gen = pcie_generation(cc, amd=is_amd(name))
        if gen is None:
            return None, ""
        gbps = PCIE_PINNED_GBPS[gen]
        where = f"{gbps:g} GB/s, a PCIe {gen}.0 x16 link's pinned rate"
    frac = pinned_copy_fraction(count, nbytes, dur, gbps)
    if frac is None:
        return None, ""
    return frac, f"pinned copies at {where}, {COPY_LATENCY_NS / 1000:g} µs each at least"


def check(ctx: RuleContext) -> RuleResult:
    return ctx.per_trace(lambda m: _judge(ctx, m))


def inject(finding: Finding, ctx: RuleContext) -> tuple[Injection, ...] | str:
    """--verify: pinned batches from the DataLoader, copied with non_blocking=True."""
    dl = dataloader_of(ctx, finding)
    if dl is not None and dl.pin_memory:
        return (
            "the DataLoader already pins its batches: the pageable copies come from tensors made elsewhere "
            "(a dataset held in memory, torch.tensor(...) in the loop); pinning those is a code change"
        )
    return pinned_copy_injections(ctx, finding)


# --------------------------------------------------------------------------- `gpudoctor check`


def _copies(src: StaticContext, fn: Function) -> list[tuple[Function, Transfer, frozenset[str], bool]]:
    """The batch copies to the GPU of ``fn``'s program, in source order: (function, copy, the names its
    loops iterate, whether it runs in every training step)."""

    def find() -> list[tuple[Function, Transfer, frozenset[str], bool]]:
        out = []
        for other in src.program_functions(fn):
            for tr in other.transfers:
                if not (tr.ctx.loops or other.fid != "<module>"):
                    continue
                loops = [lp for lid in tr.ctx.loops if (lp := src.loop(other, lid)) is not None]
                iterated = frozenset().union(*(lp.iter_names for lp in loops))
                out.append((other, tr, iterated, src.step_loop(other, tr.ctx) is not None))
        return out

    return src.memo(f"GD301.copies:{src.program(fn)}", find)


def _copy_of(src: StaticContext, fn: Function, lf: LoaderFact) -> tuple[str, tuple[Function, Site] | None]:
    """Where this loader's batches are copied to the GPU: a copy in a loop over the loader, else one in a
    training step, else any; a framework's step method when the framework copies them ("" for none). With
    the copy's function and site when it is in a loop over this loader by name, where the finding then
    points; None when the copy is only a likely one (a loader passed to a function), or the framework's."""
    copies = _copies(src, fn)
    names = src.loader_names(fn, lf)
    for i, wanted in enumerate((lambda it, step: bool(names & it), lambda it, step: step, lambda it, step: True)):
        found = next(((other, tr) for other, tr, it, step in copies if wanted(it, step)), None)
        if found is not None:
            other, tr = found
            return f"{other.file}:{tr.site.line}", (other, tr.site) if i == 0 else None
    framework = next(((other, lp) for other, lp in src.step_loops() if lp.framework and src.in_program(fn, [other])),
                     None)
    if framework is not None:
        other, lp = framework
        return f"{other.file}:{lp.site.line} by {lp.framework}, before `{other.name}()`", None
    return "", None


def static_check(src: StaticContext) -> None:
    """A DataLoader without pin_memory=True in a CUDA program that copies batches to the GPU: the finding
    at the copy (where the time goes), its fix on the DataLoader."""
    for fn, lf in src.loaders():
        pin_state, pin = src.loader_value(fn, lf, "pin_memory")
        if not (src.cuda(fn) and (
            pin_state == "missing" or (pin_state == "set" and pin is not None and pin.truth() is False)
        )):
            continue
        copy, copy_at = _copy_of(src, fn, lf)
        if not copy:
            continue
        loc = src.location(fn, lf.site)
        before = src.source(fn, lf.site)
        ev = Evidence(
            settings=(SettingRef("DataLoader.pin_memory", pin.value if pin is not None else False, loc),),
            notes=tuple(filter(None, [
                origin_note("pin_memory", pin), f"batches are copied to the GPU at {copy}" if copy else "",
            ])),
        )
        fix = Fix(
            f"Set pin_memory=True on the DataLoader at {at(loc)} and copy with .to(device, non_blocking=True)",
            before,
            with_kwargs(before, {"pin_memory": "True"}),
            (dataloader_args(fn.file, lf.site.line, {"pin_memory": True}, col=lf.site.col),),
        )
        if copy_at is not None:
            cfn, csite = copy_at
            src.report(
                "GD301",
                Severity.WARNING,
                f"Batches of the DataLoader at {at(loc)} are copied to the GPU from pageable memory "
                f"({how('pin_memory', pin_state, pin, 'False')}): each copy is staged through a pinned buffer "
                "and cannot overlap compute",
                fix, cfn, csite, ev, fix_at=(fn, lf.site),
            )
            continue
        src.report(
            "GD301",
            Severity.WARNING,
            f"DataLoader at {at(loc)} returns pageable batches ({how('pin_memory', pin_state, pin, 'False')}) "
            f"that are copied to the GPU at {copy}: each copy is staged through a pinned buffer and cannot "
            "overlap compute",
            fix, fn, lf.site, ev,
        )


def _judge_pinned(src: StaticContext) -> tuple[ChecklistStatus, str]:
    loaders = src.loaders()
    if not loaders:
        return ChecklistStatus.NOT_APPLICABLE, NO_LOADER
    if not src.cuda_anywhere:
        return ChecklistStatus.NOT_APPLICABLE, NO_CUDA
    pinned = []
    for fn, lf in loaders:
        state, pin = src.loader_value(fn, lf, "pin_memory")
        if state == "set" and pin is not None and pin.truth():
            pinned.append(src.location(fn, lf.site))
    if pinned:
        copies = non_blocking = 0
        for fn in src.functions():  # the batch copies of the training steps
            for tr in fn.transfers:
                if src.step_loop(fn, tr.ctx) is None or not src.active(fn, tr.ctx):
                    continue
                copies += 1
                nb = src.resolve(fn, tr.non_blocking) if tr.non_blocking is not None else None
                if nb is not None and nb.truth() is not False:
                    non_blocking += 1
        all_async = (
            f"; all {copies} batch copies in training steps pass non_blocking=True"
            if copies and non_blocking == copies
            else ""
        )
        return ChecklistStatus.APPLIED, f"pin_memory=True at {first_of(pinned)}{all_async}"
    return ChecklistStatus.NOT_MEASURABLE, "pin_memory is decided at run time, or no batch goes to the GPU in the checked code"


STATIC = StaticCheck(check=static_check, judges={"pinned-memory": _judge_pinned})


EXAMPLES = examples(
    bad_pageable="""\
# Batches come from pageable memory and are copied to the GPU every step.
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")
loader = DataLoader(dataset, batch_size=256, num_workers=4, pin_memory=False)

for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
    good_pinned="""\
# Workers hand over batches in page-locked memory; the copies run asynchronously.
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")
loader = DataLoader(dataset, batch_size=256, num_workers=4, pin_memory=True)

for x, y in loader:
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
)


RULE = Rule(
    code="GD301",
    name="pageable-h2d",
    title="Host-to-device copies from pageable memory",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.TRACE},
    inject=inject,
    static=STATIC,
    examples=EXAMPLES,
    autofix=True,
)
