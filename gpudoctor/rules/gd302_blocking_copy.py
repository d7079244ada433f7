"""GD302 blocking-copy: copies between host and device block the host.

What it detects
---------------
Memory copies issued synchronously (`cudaMemcpy`, or `cudaMemcpyAsync`
followed by a stream synchronization), during which the host can do nothing
else. Host-to-device copies of 64 KiB or less are exempt, as in Nsight
Systems' `cuda_memcpy_sync` rule.

Why it matters
--------------
While the host waits for a copy it cannot queue the next kernels; the GPU then
runs dry after the copy. An asynchronous copy from pinned memory lets the host
move on and overlaps the transfer with compute.

How to fix
----------
Copy with `non_blocking=True` from pinned memory, and do not read the result
on the host right after the copy.

Before:

```python
x = batch.to("cuda")                      # pageable: synchronous
```

After:

```python
x = batch.pin_memory().to("cuda", non_blocking=True)   # or pin_memory=True at the DataLoader
```

Expected gain
-------------
As GD102's: once the copies no longer block, the host runs ahead, and a step
takes the longer of the GPU's busy time and the host's own time (today's step
less the blocked time): `step_after = max(GPU busy, step − blocked)`, at most
the time at stake (`gpudoctor/rules/speedups.py`).

Evidence used
-------------
Trace: copies per direction and memory kind, how many were blocking and the
time they took (`TraceMetrics.transfers`). The gain is the `sync_wait` part of
the step's ledger up to the blocked time; GD102 owns that part
(docs/account.md), so when both fire this finding shows "included in GD102".

Thresholds
----------
- `blocking_copy_share_pct` (2): blocking copy time, % of step time.
- `blocking_h2d_exempt_bytes` (65536): synchronous H2D copies up to this size
  are exempt.
- `error_share_pct`, `warning_share_pct`: severity from the GPU idle time that
  follows host synchronizations, at most the blocked time (a copy that blocks
  the host while the GPU is saturated costs little).

Known limits
------------
A device-to-host copy whose result the host needs at once (a loss for
logging) is blocking by nature: make it rarer (GD303). The blocking time of a
copy followed by a stream synchronization includes the wait for earlier
kernels.

References
----------
- PyTorch tutorial on `non_blocking` and `pin_memory()`:
  https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html
- Nsight Systems expert rules (`cuda_memcpy_sync`):
  https://docs.nvidia.com/nsight-systems/UserGuide/index.html
"""

from __future__ import annotations

import ast
import re

from gpudoctor.model.findings import Confidence, Finding, Fix, Metric, Severity
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.model.run import Injection
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.dataloader import dataloader_fix, pinned_copy_injections
from gpudoctor.rules.edits import non_blocking
from gpudoctor.rules.formatting import fmt_ns, fmt_pct, location_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.speedups import runs_ahead_fraction
from gpudoctor.rules.static_api import (
    Function,
    Resolved,
    Scan,
    StaticCheck,
    StaticContext,
    Transfer,
    Watch,
    examples,
)
from gpudoctor.rules.static_api.text import closing_paren

_ARROWS = {"HtoD": "host→device", "DtoH": "device→host", "DtoD": "device→device", "HtoH": "host→host"}


def _judge(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    copies = [x for x in m.transfers if x.direction in _ARROWS]
    if not copies:
        return RuleResult.fine("no host↔device copies in the trace")
    blocking_ns = 0
    blocking_count = 0
    estimated = False
    parts: list[str] = []
    exempt = 0
    for x in copies:
        if x.blocking_count <= 0 or x.count <= 0:
            continue
        if x.direction == "HtoD" and x.max_bytes and x.max_bytes <= t.blocking_h2d_exempt_bytes:
            exempt += x.blocking_count
            continue
        if x.blocking_dur_ns is not None:
            ns = x.blocking_dur_ns
        else:
            ns = int(x.dur_ns * x.blocking_count / x.count)
            estimated = True
        blocking_ns += ns
        blocking_count += x.blocking_count
        parts.append(f"{x.blocking_count} {_ARROWS[x.direction]} ({x.memory_kind}) {fmt_ns(ns)}")
    share = ctx.trace_share(m, blocking_ns)
    if share is None:
        return RuleResult.cannot_judge("no window to put the copy time in")
    if share <= t.blocking_copy_share_pct:
        return RuleResult.fine(
            f"{blocking_count} blocking copies take {fmt_pct(share)} of step time "
            f"(threshold {t.blocking_copy_share_pct:g}%; {exempt} small host→device copies exempt)"
        )
    dl = ctx.main_dataloader()
    loc = location_of(dl.call_site) if dl is not None else None
    wlabel = ctx.window_label(ctx.window(m))
    # While the host waits in a copy it queues no work: what that costs is the GPU idle time that
    # follows (the analysis attributes it to synchronization), at most the blocked time itself.
    # A blocking copy on a saturated GPU costs little.
    ledger = ctx.ledger(m)
    if ledger is not None:
        at_stake = min(share, ledger.pct(Component.SYNC_WAIT))
        gain_note = "GPU idle time after host synchronizations (blocking copies among them), at most the blocked time"
    else:
        at_stake = share
        estimated = True
        gain_note = "host time blocked in copies (no ledger of the step)"
    expected, expected_note = (
        runs_ahead_fraction(sum(sl.pct for sl in ledger.slices if sl.side == "device"), share, at_stake)
        if ledger is not None else (None, ""))
    message = (
        f"{blocking_count} copies block the host for {fmt_ns(blocking_ns)}, {fmt_pct(share)} of step time: "
        + "; ".join(parts)
        + f"; GPU idle after syncs {fmt_pct(at_stake)} of step time"
    )
    instruction = (
        "Copy from pinned memory with `non_blocking=True` (pin_memory=True at the DataLoader"
        + (f" at {loc}" if loc else "")
        + "), and read device results on the host only every N steps (GD303)."
    )
    metrics = [
        Metric("blocking_copy_count", blocking_count, "count"),
        Metric("blocking_copy_ns", blocking_ns, "ns"),
        Metric("blocking_copy_share_pct", round(share, 2), "%", wlabel),
        Metric("exempt_small_h2d_count", exempt, "count", f"≤ {t.blocking_h2d_exempt_bytes} bytes"),
    ]
    notes = ["blocking time estimated from the blocking copies' share of all copies"] if estimated else []
    finding = ctx.finding(
        message,
        dataloader_fix(instruction, dl, {"pin_memory": True}, "x = batch.to(device)",
                       "x = batch.pin_memory().to(device, non_blocking=True)  # or pin_memory=True at the DataLoader")
        if dl is not None and not dl.pin_memory else
        Fix(instruction, "x = batch.to(device)", "x = batch.to(device, non_blocking=True)",
            illustration="a run records where the DataLoader is, not where its batches are copied"),
        share_pct=at_stake,
        confidence=Confidence.INFERRED if estimated else Confidence.MEASURED,
        metrics=metrics,
        notes=notes,
        location=loc,
        gain_note=gain_note,
        rank=m.rank,
        claims=[(Component.SYNC_WAIT, blocking_ns)],
        expected=expected,
        expected_note=expected_note,
        ledger=ledger,
        source=m,
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    return ctx.per_trace(lambda m: _judge(ctx, m))


def inject(finding: Finding, ctx: RuleContext) -> tuple[Injection, ...] | str:
    """--verify: pinned batches from the DataLoader, copied with non_blocking=True (the host→device
    part of the fix; reading device results less often, GD303, is a code change)."""
    return pinned_copy_injections(ctx, finding)


# --------------------------------------------------------------------------- `gpudoctor check`


def _watch_pin_memory(scan: Scan, node: ast.Call, recv: ast.expr) -> None:
    scan.record("pin_memory_call", node)


def _pins(src: StaticContext, fn: Function) -> bool:
    """``fn`` pins memory: ``.pin_memory()``, or a DataLoader with pin_memory set and not False."""
    for f in fn.facts:
        if f.kind == "pin_memory_call" and src.active(fn, f.ctx):
            return True
    for lf in fn.loaders:
        if not src.active(fn, lf.ctx):
            continue
        state, r = src.loader_value(fn, lf, "pin_memory")
        if state == "set" and r is not None and r.truth() is not False:
            return True
    return False


def _pinned(src: StaticContext) -> list[Function]:
    """The functions that pin memory: their programs copy from pinned batches."""
    return src.memo("GD302.pinned", lambda: [fn for fn in src.functions() if _pins(src, fn)])


def _from_pinned(src: StaticContext, fn: Function, lid: int) -> bool:
    """False when the step loop visibly iterates DataLoaders that do not pin memory."""
    loop = src.loop(fn, lid) if lid >= 0 else None
    if loop is None or not loop.iter_names:
        return True
    pins = _loader_pins(src, fn)
    fed = [pinned for name in loop.iter_names for pinned in pins.get(name, ())]
    return not fed or any(fed)


def _loader_pins(src: StaticContext, fn: Function) -> dict[str, list[bool]]:
    """Of ``fn``'s program: for each name a DataLoader is bound to, whether each such DataLoader pins memory
    (made once per program: looking through every DataLoader for every copy was quadratic in its size)."""

    def make() -> dict[str, list[bool]]:
        out: dict[str, list[bool]] = {}
        for other in src.program_functions(fn):
            for lf in other.loaders:
                if not src.active(other, lf.ctx):
                    continue
                state, r = src.loader_value(other, lf, "pin_memory")
                pinned = state == "set" and r is not None and r.truth() is not False
                for name in src.loader_names(other, lf):
                    out.setdefault(name, []).append(pinned)
        return out

    return src.memo(f"GD302.loader_pins.{src.program(fn)}", make)


def _non_blocking_after(statement: str, method: str) -> str:
    if not statement:
        return ""
    if "non_blocking" in statement:
        return re.sub(r"non_blocking\s*=\s*[^,)]+", "non_blocking=True", statement)
    call = ".to(" if method == ".to" else ".cuda("
    out: list[str] = []
    rest = statement
    while call in rest:
        head, _, tail = rest.partition(call)
        close = closing_paren("(" + tail)
        if close is None:
            out.append(head + call)
            rest = tail
            continue
        inner = tail[: close - 1]
        args = inner.strip()
        new_inner = (args + ", " if args else "") + "non_blocking=True"
        out.append(head + call + new_inner + ")")
        rest = tail[close:]
    return "".join(out) + rest


def _blocking_copy(src: StaticContext, fn: Function, tr: Transfer, lid: int, nb: Resolved | None) -> None:
    how = "non_blocking not set" if nb is None else f"non_blocking={nb.value!r}" + (
        f" from {nb.origin_text()}" if nb.origins else ""
    )
    src.report(
        "GD302",
        Severity.WARNING,
        f"`{tr.text}` at {fn.file}:{tr.site.line} copies a pinned batch synchronously ({how}) in every step "
        f"of {src.where_step(fn, lid)}: the host waits for each copy instead of queueing the next work",
        Fix(
            "Pass non_blocking=True: with pinned memory the copy overlaps with the host's next work, and CUDA "
            "stream order keeps it correct",
            tr.statement,
            _non_blocking_after(tr.statement, tr.method),
            (non_blocking(fn.file, tr.site.line, tr.method, col=tr.site.col),),
        ),
        fn,
        tr.site,
    )


def static_check(src: StaticContext) -> None:
    """A batch copy in the step, without non_blocking=True, in a CUDA program that pins its batches."""
    for fn in src.functions():
        for tr in fn.transfers:
            lid = src.step_loop(fn, tr.ctx)
            if lid is None or not src.active(fn, tr.ctx):
                continue
            nb = src.resolve(fn, tr.non_blocking) if tr.non_blocking is not None else None
            if nb is not None and nb.truth() is not False:
                continue
            if src.cuda(fn) and src.in_program(fn, _pinned(src)) and _from_pinned(src, fn, lid):
                _blocking_copy(src, fn, tr, lid, nb)


STATIC = StaticCheck(check=static_check, watch=Watch(methods={"pin_memory": _watch_pin_memory}))


EXAMPLES = examples(
    bad_blocking_copy="""\
# Pinned batches, but each copy blocks the host until it is done.
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")
loader = DataLoader(dataset, batch_size=256, num_workers=4, pin_memory=True)

for x, y in loader:
    x = x.to(device)
    y = y.to(device)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
    good_non_blocking="""\
# The copies are queued on the stream and the host moves on.
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")
loader = DataLoader(dataset, batch_size=256, num_workers=4, pin_memory=True)

for x, y in loader:
    x = x.to(device, non_blocking=True)
    y = y.to(device, non_blocking=True)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
)


RULE = Rule(
    code="GD302",
    name="blocking-copy",
    title="Synchronous copies block the host",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.TRACE},
    inject=inject,
    static=STATIC,
    examples=EXAMPLES,
    autofix=True,
)
