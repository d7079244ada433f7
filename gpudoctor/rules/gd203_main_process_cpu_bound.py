"""GD203 main-process-cpu-bound: the training process saturates a core outside the DataLoader.

What it detects
---------------
The training process runs at a full core while the GPU waits, not for the
DataLoader: Python work in the loop (preprocessing, augmentation, metrics,
logging) serializes the step. On a CPU-only run, one Python thread bounds the
step while torch's intra-op threads idle (a trace's gaps of 1 ms or more
between torch ops, or a process near one core).

Why it matters
--------------
One core is Python's ceiling; the loop body's work runs serially with the model.

How to fix
----------
Move per-sample preprocessing into the Dataset (workers run it in parallel),
batch transforms onto the GPU; keep metrics on the device, fetch every N steps.

Before:

```python
for x, y in loader:
    x = torch.stack([augment(img) for img in x])    # Python, in the main process
    loss = step(x.cuda(), y.cuda())
```

After:

```python
class Augmented(Dataset):
    def __getitem__(self, i):
        img, label = self.base[i]
        return augment(img), label                   # runs in the workers

loader = DataLoader(Augmented(base), batch_size=64, num_workers=4)
for x, y in loader:
    loss = step(x.cuda(non_blocking=True), y.cuda(non_blocking=True))
```

Expected gain
-------------
The loop's own work W, moved into `w` workers (the cores less
`dataloader_reserved_cores`) beside the rest of the step R, stays on the
critical path only beyond R: expected `W − max(0, W ÷ w − R)`; the bound is
the whole `other_cpu` part.

Evidence used
-------------
psutil samples (`cpu_pct`; on CPU runs plus `runq_wait_pct`), the DataLoader
wait, GPU idle share; the user functions with the most self time (cProfile);
the steps' phase times (the rest is the loop's own work, told from the model's).

Thresholds
----------
- `main_cpu_busy_pct` (90): the main process's median CPU, % of one core.
- `dataloader_wait_share_pct` (5): above it the wait is GD201's, not this rule's.
- `cpu_run_python_share_pct` (50): CPU runs with a trace: share of a typical
  step in Python between torch ops.
- `cpu_run_thread_use_max_pct` (60): CPU runs without a trace: the process's
  CPU as a share of what its intra-op threads could use.
- `loop_other_share_pct` (25): with phase times, the loop's own work's share of
  step time, over all steady steps or in the median step (docs/account.md, "GD203").
- `gpu_idle_share_pct` (20): the GPU waits.
- `dataloader_reserved_cores` (1): cores left to the training process.
- `error_share_pct`, `warning_share_pct`: the severity scale.

Known limits
------------
Needs psutil samples (`gpudoctor profile`). The share at stake, the ledger's
`other_cpu` part, bounds what moving the work wins; without a trace the
finding puts no share on it. On CPU runs the CPU % alone misleads
(spinning OpenMP threads; one intra-op thread on several cores): a trace or the
phase times decide, else it cannot judge (docs/account.md, "GD203"). A
one-core machine leaves nowhere to move the work.

References
----------
- PyTorch tuning guide: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
- PyTorch data loading: https://pytorch.org/docs/stable/data.html
"""

from __future__ import annotations

import statistics

from gpudoctor.analysis.cprofile import user_functions
from gpudoctor.model.findings import ChecklistStatus, Confidence, Fix, Location, Metric, SettingRef
from gpudoctor.model.metrics import Component, DispatchStats, GapCause, LedgerBasis
from gpudoctor.model.selectors import trace_label
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_pct
from gpudoctor.rules.load_model import loader_of
from gpudoctor.rules.profiles import pstats_total_s, too_few_steps
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.static_api import StaticCheck, StaticContext

_BEFORE = """for x, y in loader:
    x = torch.stack([augment(img) for img in x])   # Python, in the main process
    loss = step(x, y)"""
_AFTER = """class Augmented(Dataset):
    def __getitem__(self, i):
        img, label = self.base[i]
        return augment(img), label                  # runs in the DataLoader workers

loader = DataLoader(Augmented(base), batch_size=64, num_workers=4)
for x, y in loader:
    loss = step(x, y)"""


def main_cpu_pct(ctx: RuleContext) -> tuple[float | None, int]:
    """Median CPU % of the training process over the steps (all samples without steps): the
    context's figure, which the summary prints too."""
    cpu, n, _ = ctx.main_cpu_pct()
    return cpu, n


def _hot_user_code(ctx: RuleContext) -> tuple[Location | None, list[str], float | None]:
    """The user's function with the most self time (cProfile), notes, and the user code's share."""
    entries = ctx.run.pstats
    users = user_functions(entries)
    total = pstats_total_s(entries)
    if not users or total <= 0:
        return None, [], None
    top = users[0]
    notes = [f"{e.file}:{e.line} {e.function}: {e.tottime_s:.3f} s self time, {e.calls} calls" for e in users[:5]]
    share = 100.0 * sum(e.tottime_s for e in users) / total
    return Location(top.file, top.line, function=top.function), notes, min(share, 100.0)


def check(ctx: RuleContext) -> RuleResult:
    t = ctx.thresholds
    cpu, n = main_cpu_pct(ctx)
    if cpu is None:
        return RuleResult.cannot_judge("no CPU samples of the training process (psutil; run `gpudoctor profile`)")
    # a thread that waits for a core (other load on the machine) still wants it: count it busy
    demand = loader_of(ctx).demand
    busy = max(cpu, 100.0 * demand.main) if demand is not None else cpu
    if busy < t.main_cpu_busy_pct:
        return RuleResult.fine(
            f"training process at {fmt_pct(cpu)} of one core (median of {n} samples; threshold {t.main_cpu_busy_pct:g}%)"
        )
    wait = ctx.figures.job.step.data_wait_pct
    if wait is not None and wait > t.dataloader_wait_share_pct:
        return RuleResult.not_applicable(
            f"the training process is busy loading batches ({fmt_pct(wait)} of step time waiting for data): see GD201"
        )
    phases = ctx.phase_shares_pct()
    loop_pct = phases["other"] if phases is not None and phases["forward"] is not None else None
    typical = _typical_loop_pct(ctx) if loop_pct is not None else None
    if loop_pct is not None and loop_pct < t.loop_other_share_pct and (typical or 0.0) < t.loop_other_share_pct:
        assert phases is not None
        inside = ", ".join(f"{k} {fmt_pct(phases[k])}" for k in ("forward", "backward", "optimizer") if phases[k])
        return RuleResult.fine(
            f"training process at {fmt_pct(cpu)} of one core, but its time is inside the model's calls ({inside}), "
            f"not in the loop's own work ({fmt_pct(loop_pct)} of step time; threshold {t.loop_other_share_pct:g}%): "
            "per-op overhead there is GD103's"
        )
    location, notes, user_share = _hot_user_code(ctx)
    metrics = [Metric("main_cpu_pct", round(cpu, 1), "%", f"one core (median of {n} samples)")]
    if wait is not None:
        metrics.append(Metric("data_wait_share_pct", round(wait, 2), "%", "steps"))
    if loop_pct is not None:
        metrics.append(Metric("loop_other_share_pct", round(loop_pct, 1), "%",
                              "host time outside the DataLoader, forward, backward and optimizer.step() (steps)"))
    if typical is not None and loop_pct is not None and loop_pct < t.loop_other_share_pct:
        metrics.append(Metric("loop_other_typical_pct", round(typical, 1), "%", "median step"))
        notes.append(f"the loop's own work is {fmt_pct(typical)} of the median step but {fmt_pct(loop_pct)} of all "
                     "steps' time: a few steps much longer than the rest (threads that waited for a core stall the "
                     "model's multi-threaded ops) weigh on the sum, not on where a step's work is")
    if ctx.has_gpu():
        return _gpu_case(ctx, cpu, metrics, notes, location, loop_pct)
    return _cpu_case(ctx, cpu, demand, metrics, notes, location, user_share, loop_pct)


def _typical_loop_pct(ctx: RuleContext) -> float | None:
    """The loop's own work in a typical step: the median, over the steady steps with phase times, of
    its share of each step. The sum over the steps (``phase_shares_pct``) is the throughput's figure;
    a few steps stretched many times over (a multi-threaded op whose thread waited for a core stalls
    at its barrier for a scheduler slice: seen at 40× the median step beside another busy process)
    can bury there a loop whose every other step is mostly its own work."""
    shares = [100.0 * (s.other_ns() or 0) / s.wall_ns for s in ctx.steady_steps()
              if s.wall_ns > 0 and s.forward_ns is not None and s.other_ns() is not None]
    return statistics.median(shares) if shares else None


def _gpu_case(ctx, cpu, metrics, notes, location, loop_pct) -> RuleResult:
    t = ctx.thresholds
    best = None
    for m in ctx.gpu_traces():
        idle_pct, wname = ctx.accounting.account_idle(m)
        if idle_pct is None:
            continue
        ledger = ctx.ledger(m)
        at_stake = ledger.pct(Component.OTHER_CPU) if ledger is not None else None
        if best is None or idle_pct > best[1]:
            best = (m, idle_pct, wname, at_stake)
    if best is None:
        util = [g.util_pct for g in ctx.samples_gpu() if g.util_pct is not None]
        if not util:
            return RuleResult.cannot_judge("no GPU utilization figures (no trace with GPU activity, no NVML samples)")
        idle_pct, wname, at_stake, m = 100.0 - statistics.median(util), "NVML samples", None, None
    else:
        m, idle_pct, wname, at_stake = best
    if idle_pct < t.gpu_idle_share_pct:
        return RuleResult.fine(
            f"training process at {fmt_pct(cpu)} of one core, but the GPU is busy (idle {fmt_pct(idle_pct)}, {wname})"
        )
    confidence = Confidence.MEASURED
    gain_note = "GPU idle time while the host was busy elsewhere (not DataLoader, sync or launches)"
    ledger = ctx.ledger(m) if m is not None else None
    claim_cap_ns: int | None = None
    if at_stake is None:
        wait = ctx.figures.job.step.data_wait_pct or 0.0
        confidence = Confidence.INFERRED
        gain_note = (
            f"not in the account: no trace splits the GPU idle time (idle {fmt_pct(idle_pct)} less the DataLoader "
            f"wait: {fmt_pct(max(0.0, idle_pct - wait))})"
        )
        steps_ledger = ctx.ledger() if m is None and loop_pct is not None else None
        if steps_ledger is not None and steps_ledger.basis == LedgerBasis.STEPS and steps_ledger.ns(Component.OTHER_CPU) > 0:
            # the loop's own work (the steps' phase times) claims its part of the steps' ledger, at most
            # what the GPU idled beyond the data wait: host work the GPU never waited on wins nothing
            ledger = steps_ledger
            claim_cap_ns = int(ledger.total_ns * max(0.0, idle_pct - wait) / 100.0)
            at_stake = 100.0 * min(ledger.ns(Component.OTHER_CPU), claim_cap_ns) / ledger.total_ns
            confidence = Confidence.MEASURED
            gain_note = ("the loop's own work outside the model's calls (steps' phase times), at most the GPU idle "
                         "share less the DataLoader wait")
    metrics.append(Metric("gpu_idle_pct", round(idle_pct, 2), "%", wname))
    message = (
        f"training process at {fmt_pct(cpu)} of one core while the GPU idles {fmt_pct(idle_pct)} of step time, "
        f"not waiting for data: Python work in the loop holds the GPU back"
        + (f"; hottest user code {location}" if location else "")
    )
    instruction = (
        "Move per-sample preprocessing into the Dataset (it then runs in the DataLoader workers), "
        "batch transforms onto the GPU, and metric computation onto the device"
        + (f"; start with {location.function or 'the function'} at {location}." if location else ".")
    )
    finding = ctx.finding(
        message,
        Fix(instruction, _BEFORE, _AFTER),
        share_pct=at_stake,
        confidence=confidence,
        metrics=metrics,
        time_ranges=ctx.gap_ranges(m, GapCause.OTHER) if m is not None else (),
        notes=notes + ([f"trace: {trace_label(m)}"] if m is not None else []),
        location=location,
        gain_note=gain_note,
        claims=[(Component.OTHER_CPU, claim_cap_ns)] if at_stake is not None else (),
        ledger=ledger,
        **_expected(ctx, at_stake),
    )
    return RuleResult.fired(finding)


def _expected(ctx: RuleContext, at_stake_pct: float | None) -> dict:
    """The "Expected gain" model: the loop's own work W (the share at stake) moved into ``w``
    DataLoader workers (the cores less those left to the training process) runs beside the rest of
    the step R = 100 − W; it stays on the critical path only where W ÷ w exceeds R."""
    cores = ctx.cpu_count()
    if at_stake_pct is None or at_stake_pct <= 0 or not cores:
        return {}
    w = max(1, cores - ctx.thresholds.dataloader_reserved_cores)
    rest = 100.0 - at_stake_pct
    won = at_stake_pct - max(0.0, at_stake_pct / w - rest)
    return {"expected": max(0.0, won / at_stake_pct),
            "expected_note": f"the loop's own work spread over {w} DataLoader worker(s) ({cores} cores) beside the "
                             f"rest of the step: step after ≈ max(rest {rest:.0f}%, work ÷ {w})"}


def _python_share(ctx: RuleContext) -> tuple[float | None, DispatchStats | None]:
    """The largest share, over the CPU traces, of a typical step spent in Python between torch ops."""
    best: tuple[float | None, DispatchStats | None] = (None, None)
    for m in ctx.metrics:
        d = m.dispatch
        if m.has_gpu_activity or d is None or d.typical_step_ns <= 0 or d.steps == 0:
            continue
        pct = 100.0 * d.long_gap_ns / d.typical_step_ns
        if best[0] is None or pct > best[0]:
            best = (pct, d)
    return best


def _cpu_case(ctx, cpu, demand, metrics, notes, location, user_share, loop_pct) -> RuleResult:
    t = ctx.thresholds
    s = ctx.settings
    cores = ctx.cpu_count()
    threads = s.num_threads if s is not None else None
    if threads is None or cores is None:
        return RuleResult.cannot_judge("no GPU in this run, and torch's thread count or the core count is unknown")
    if cores <= 1:
        return RuleResult.not_applicable(
            f"no GPU, and {cores} core: no other core for the loop's work to move to (DataLoader workers share it)"
        )
    # torch's intra-op threads bound what the process can use; with one of them (a machine whose
    # cores are hyperthreads of one physical core: torch counts physical cores) the other cores are
    # still there for DataLoader workers, which is where the fix moves the work
    capacity = 100.0 * min(threads, cores)
    # The trace says it most directly: the share of a typical step spent in Python between torch
    # ops (gaps of 1 ms or more), where OpenMP threads spinning in the ops cannot inflate it.
    python_pct, dm = _python_share(ctx)
    # threads that wanted a core, not only those that got one: on a machine busy with other work
    # the training process can sit at one core while both its threads are runnable
    wants = 100.0 * demand.main if demand is not None else cpu
    use_pct = 100.0 * wants / capacity
    waiting = f", {wants - cpu:.0f}% more waiting for a core" if wants - cpu >= 25.0 else ""
    n_threads = min(threads, cores)
    idle = (f"torch's {n_threads} intra-op threads wait" if n_threads > 1
            else f"the other {cores - 1} core{'s' if cores > 2 else ''} could run it in DataLoader workers")
    if python_pct is not None:
        few = too_few_steps(dm) if dm is not None else None
        if python_pct < t.cpu_run_python_share_pct and few:
            return RuleResult.cannot_judge(f"{few} (it ran Python between torch ops {fmt_pct(python_pct)} of the step)")
        if python_pct < t.cpu_run_python_share_pct:
            return RuleResult.fine(
                f"no GPU; {fmt_pct(python_pct)} of a typical step runs Python between torch ops (threshold "
                f"{t.cpu_run_python_share_pct:g}%; the process at {fmt_pct(cpu)} CPU{waiting})"
            )
    elif capacity <= 100.0 and loop_pct is None:
        return RuleResult.cannot_judge(
            f"no GPU and torch runs {threads} intra-op thread: the process's CPU ({fmt_pct(cpu)}) cannot tell Python "
            "in the loop from op work, and no trace or phase times split the step"
        )
    elif capacity > 100.0 and use_pct >= t.cpu_run_thread_use_max_pct:
        return RuleResult.fine(
            f"no GPU; the training process uses {use_pct:.0f}% of its {n_threads} threads' capacity "
            f"({fmt_pct(cpu)} CPU{waiting})"
        )
    metrics.append(Metric("thread_capacity_use_pct", round(use_pct, 1), "%", f"{n_threads} threads' capacity"))
    if user_share is not None:
        metrics.append(Metric("user_code_self_time_pct", round(user_share, 1), "%", "cProfile time"))
    ledger = None
    if python_pct is not None and dm is not None:
        m = next(mm for mm in ctx.metrics if mm.dispatch is dm)
        ledger = ctx.ledger(m)
        at_stake = ledger.pct(Component.OTHER_CPU) if ledger is not None else python_pct
        confidence = Confidence.MEASURED
        gain_note = "Python work of 1 ms or more between torch ops, in the measured steps"
        metrics.append(Metric("python_between_ops_pct", round(python_pct, 1), "%", "typical step"))
        metrics.append(Metric("python_between_ops_ns", dm.long_gap_ns, "ns", "typical step"))
        metrics.append(Metric("typical_step_ns", dm.typical_step_ns, "ns"))
        message = (
            f"CPU run bound by Python in the loop: {fmt_pct(python_pct)} of a typical step runs Python between "
            f"torch ops, on one thread while {idle}"
            + (f" ({fmt_pct(at_stake)} of the measured step time)" if ledger is not None else "")
        )
    elif loop_pct is not None:
        at_stake = loop_pct
        steps_ledger = ctx.ledger()
        if steps_ledger is not None and steps_ledger.basis == LedgerBasis.STEPS and steps_ledger.ns(Component.OTHER_CPU) > 0:
            ledger = steps_ledger  # the same figure, from the steps' ledger: claimed there, once
            at_stake = ledger.pct(Component.OTHER_CPU)
        confidence = Confidence.MEASURED
        gain_note = "host time outside the DataLoader wait and the model's calls (forward, backward, optimizer), every step"
        message = (
            f"CPU run bound by one Python thread: {fmt_pct(loop_pct)} of step time is the loop's own work outside "
            f"the model's calls, while the training process runs at {fmt_pct(cpu)} CPU{waiting}"
            + (f", {use_pct:.0f}% of what its {n_threads} intra-op threads could use" if n_threads > 1 else f"; {idle}")
        )
    elif user_share is not None:
        at_stake = None
        confidence = Confidence.MEASURED
        gain_note = (
            f"not in the account (no trace): the user's own functions take {fmt_pct(user_share)} of the cProfile "
            "time (self time)"
        )
        message = (
            f"CPU run bound by one Python thread: the training process runs at {fmt_pct(cpu)} CPU{waiting}, "
            f"{use_pct:.0f}% of what its {n_threads} intra-op threads could use"
        )
    else:
        at_stake = None
        confidence = Confidence.INFERRED
        gain_note = "no trace or cProfile of the user's code to put it in time"
        message = (
            f"CPU run bound by one Python thread: the training process runs at {fmt_pct(cpu)} CPU{waiting}, "
            f"{use_pct:.0f}% of what its {n_threads} intra-op threads could use"
        )
    if location:
        message += f"; hottest user code {location}"
    instruction = (
        "Move per-sample Python work (transforms, decoding, metric bookkeeping) out of the loop body into the "
        "Dataset with DataLoader workers, or express it as batched tensor operations"
        + (f"; start with {location.function or 'the function'} at {location}." if location else ".")
    )
    finding = ctx.finding(
        message,
        Fix(instruction, _BEFORE, _AFTER),
        share_pct=at_stake,
        confidence=confidence,
        metrics=metrics,
        settings=[SettingRef("torch.get_num_threads()", threads), SettingRef("cpu_count", cores)],
        notes=notes,
        location=location,
        gain_note=gain_note,
        claims=[(Component.OTHER_CPU, None)] if ledger is not None else (),
        ledger=ledger,
        **_expected(ctx, at_stake),
    )
    return RuleResult.fired(finding)


# --------------------------------------------------------------------------- `gpudoctor check`


def _judge_cpu(src: StaticContext) -> tuple[ChecklistStatus, str]:
    return ChecklistStatus.NOT_MEASURABLE, "needs CPU samples of a run (GD203, GD204, GD503: `gpudoctor profile`)"


STATIC = StaticCheck(judges={"cpu-bottlenecks": _judge_cpu})


RULE = Rule(
    code="GD203",
    name="main-process-cpu-bound",
    title="The training process is CPU-bound outside the DataLoader",
    doc=__doc__,
    check=check,
    needs={Need.SAMPLES},
    needs_reasons={Need.SAMPLES: "no CPU samples of the training process (psutil; run `gpudoctor profile`)"},
    not_injectable="moving work out of the training process (into DataLoader workers or onto the GPU) is a code change",
    static=STATIC,
)
