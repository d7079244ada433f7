"""GD202 worker-restart: DataLoader workers are started again at every epoch.

What it detects
---------------
A DataLoader with workers and `persistent_workers=False`, iterated for several
epochs, whose first step of each epoch waits much longer than the others: the
workers start again and refill the queue before the first batch arrives.

Why it matters
--------------
Without persistent workers, every `iter(loader)` stops the workers and starts
new ones: with a costly Dataset and short epochs the stall repeats every epoch.

How to fix
----------
Keep the workers alive across epochs.

Before:

```python
loader = DataLoader(ds, batch_size=64, num_workers=8)
for epoch in range(epochs):
    for x, y in loader: ...
```

After:

```python
loader = DataLoader(ds, batch_size=64, num_workers=8, persistent_workers=True)
for epoch in range(epochs):
    for x, y in loader: ...
```

DataLoader raises on `persistent_workers=True` with `num_workers=0`: where the
count is computed (`num_workers=int(opt.workers)`), `gpudoctor check --fix`
writes `persistent_workers=int(opt.workers) > 0`; it leaves a count from a call
of the script's own or from `**kwargs` alone.

Expected gain
-------------
The stall is paid once an epoch, so its gain is a share of an epoch's time (the
statistic `--verify` measures). With `L` the steps of a whole epoch, `step` the
mean unprofiled steady step, `stall` the median excess of the first step of
epochs 2, 3, … over the median step, and `floor` the least step less its wait:

    epoch    = L × step + stall
    bound    = (epoch − L × floor) ÷ epoch          (share of an epoch's time)
    expected = (stall − first_batch) ÷ epoch        (share of an epoch's time)
    first_batch = workers' CPU per batch + hand-over

Every step keeps its own work (the bound); persistent workers still load each
epoch's first batch. Without the workers' samples there is only the bound. The
share is outside the steady steps: no part of the ledger, not in the projection.
Model and calibration: docs/account.md, "GD202".

Evidence used
-------------
Per-step records with their epoch (`steps.jsonl`), the DataLoader's settings
with their `file:line`, the workers' CPU (psutil samples).

Thresholds
----------
- `worker_startup_stall_steps` (1): an epoch's first step waits at least this
  many median steps longer than the others.
- `error_share_pct`, `warning_share_pct`: severity from the stalls' share.

Known limits
------------
Needs per-step records with epochs (`gpudoctor profile`). A Dataset that changes
between epochs must do so through shared state or `worker_init_fn`. Work between
epochs (an evaluation, a checkpoint) counts in the stall.
`gpudoctor check --fix` (and a run's finding, from the recorded arguments and
the unchanged source) leaves the fix to the author where the script passes
`persistent_workers` itself, or a loop changes the dataset in place
(`ds.set_epoch(epoch)`, `loader.dataset.…`: persistent workers would keep stale
data); `--verify` does not try it. A change in a function the loop calls is not seen.

References
----------
- `DataLoader` (`persistent_workers`): https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader
"""

from __future__ import annotations

import statistics

from gpudoctor.analysis.load import step_compute
from gpudoctor.model.findings import (
    Confidence,
    Evidence,
    Finding,
    Fix,
    Metric,
    SettingRef,
    Severity,
)
from gpudoctor.model.run import Injection, StepRecord
from gpudoctor.model.steady import median_int
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.dataloader import (
    dataloader_fix,
    dataloader_injections,
    dataloader_of,
    dataloader_settings,
    dataset_changed,
    no_dataloader_reason,
)
from gpudoctor.rules.edits import dataloader_args, left_to_author, manual_note
from gpudoctor.rules.formatting import fmt_ns, fmt_pct, location_of
from gpudoctor.rules.load_model import loader_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.static_api import (
    POSITIVE_VALUE,
    Function,
    LoaderFact,
    StaticCheck,
    StaticContext,
    examples,
)
from gpudoctor.rules.static_api.text import at, how, with_kwargs


def check(ctx: RuleContext) -> RuleResult:
    t = ctx.thresholds
    s = ctx.settings
    assert s is not None  # Rule.needs
    if not s.dataloaders:
        return RuleResult.not_applicable("no DataLoader in this run")
    with_workers = [d for d in s.dataloaders if d.num_workers > 0]
    if not with_workers:
        return RuleResult.not_applicable("num_workers=0: no worker processes to restart (see GD201)")
    restarting = [d for d in with_workers if not d.persistent_workers]
    if not restarting:
        d = with_workers[0]
        return RuleResult.fine(f"persistent_workers=True at {location_of(d.call_site) or 'the DataLoader'}", applied=True)
    dl = max(restarting, key=lambda d: d.iterations_started)
    loc = location_of(dl.call_site)
    if dl.iterations_started < 2:
        return RuleResult.not_applicable(
            f"the DataLoader at {loc or '?'} was iterated {dl.iterations_started} time(s): no restart to pay"
        )
    steps = ctx.steps()
    if not steps:
        return RuleResult.cannot_judge("no per-step records to see the start-up stalls in")
    if all(st.epoch is None for st in steps):
        return RuleResult.cannot_judge("the per-step records carry no epoch numbers")
    epochs: dict[int, list[StepRecord]] = {}
    for st in steps:
        if st.epoch is not None:
            epochs.setdefault(st.epoch, []).append(st)
    order = sorted(epochs)
    if len(order) < 2:
        return RuleResult.not_applicable("the recorded steps cover one epoch: no restart seen")
    firsts = {e: min(epochs[e], key=lambda st: st.index) for e in order}
    # the other steps: the run's figures (analysis.figures), of the account's steps: the steady ones (without
    # the workers' first batches either), the unprofiled ones where there are enough (the steps a trial run
    # resembles); the step time is their mean, the median step their spread
    fig = ctx.figures.job
    others = list(fig.account)
    base_wait = median_int(st.data_wait_ns for st in others) or 0
    step_med = fig.step.median_ns or 0
    later = [firsts[e] for e in order[1:]]  # the first epoch's start-up is paid with or without persistence
    excess = [max(0, st.data_wait_ns - base_wait) for st in later]
    excess_med = median_int(excess) or 0
    # what the restart costs the first step in all: its wait, and the training's own work slowed by the new
    # workers' start-up on the same cores (worker_restart on 2 cores: 347 ms of wait, 175 ms more of compute)
    stall_ns = max(excess_med, median_int(max(0, st.wall_ns - step_med) for st in later) or 0)
    epoch_steps = max(len(epochs[e]) for e in order[:-1])  # the last epoch may be cut short (--steps)
    bare = others
    step_mean = float(fig.step.step_ns or 0)
    # an epoch's time per step now, its start included (what --verify measures this fix on), and the least a
    # step can take with the fix: its own work, without any wait (the median step less its wait)
    epoch_ns = epoch_steps * step_mean + stall_ns
    # the least step's own work any of them showed: a bound takes the least the run showed (issue 42: the
    # compute of a loop that stops waiting runs warm, faster than its median)
    comp = step_compute(bare)
    floor_ns = int(comp.least_ns) if comp is not None else 0
    share = 100.0 * excess_med / epoch_ns if epoch_ns > 0 else 0.0  # the sentence's: the extra wait's share
    bound = 100.0 * max(0.0, epoch_ns - epoch_steps * floor_ns) / epoch_ns if epoch_ns > 0 else 0.0
    if step_med == 0 or excess_med < t.worker_startup_stall_steps * step_med:
        return RuleResult.fine(
            f"the first step of epochs 2..{len(order)} waits {fmt_ns(excess_med)} longer for data than other steps "
            f"(under {t.worker_startup_stall_steps:g} median step of {fmt_ns(step_med)})"
        )
    message = (
        f"DataLoader workers restart every epoch: the first step of epochs 2..{len(order)} waits "
        f"{fmt_ns(excess_med)} longer for data than other steps ({fmt_pct(share)} of an epoch's time); "
        f"persistent_workers=False, num_workers={dl.num_workers} at {loc or 'the DataLoader'}"
    )
    won, expected_note, first_batch = _expected(ctx, bare, step_mean, stall_ns)
    # the model's share of an epoch, as a fraction of the bound
    expected = (max(0.0, min(1.0, won * stall_ns / (epoch_ns * bound / 100.0))) if won is not None and bound > 0
                else None)
    instruction = f"Set persistent_workers=True on the DataLoader{' at ' + str(loc) if loc else ''}."
    metrics = [
        Metric("epochs", len(order), "count"),
        Metric("startup_stall_median_ns", excess_med, "ns"),
        Metric("startup_stall_total_ns", sum(excess), "ns"),
        Metric("startup_stall_share_pct", round(share, 2), "%",
               f"of an epoch: {epoch_steps} steps of {fmt_ns(step_mean)} and the stall"),
        Metric("startup_cost_ns", stall_ns, "ns", "the first step's excess over the median step: wait and work"),
        Metric("step_floor_ns", floor_ns, "ns", "the least step less its wait: what a step keeps with the fix"),
        Metric("epoch_steps", epoch_steps, "count"),
        Metric("step_median_ns", step_med, "ns"),
        Metric("iterations_started", dl.iterations_started, "count"),
    ]
    if first_batch is not None:
        metrics.append(Metric("first_batch_ns", int(first_batch), "ns", "what persistent workers still wait for"))
    fix = dataloader_fix(instruction, dl, {"persistent_workers": True})
    caveat = ctx.workers_caveat(dl)
    if caveat is not None:  # the script's own choice, or a dataset changed in place: the author's to change
        fix = left_to_author(fix, caveat[0])
    finding = ctx.finding(
        message,
        fix,
        share_pct=bound,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        settings=dataloader_settings(dl),
        notes=[manual_note(caveat[0])] if caveat is not None else [],
        location=loc,
        gain_note=("of an epoch's time per step, its start included (what --verify measures): the epoch less its "
                   f"{epoch_steps} steps at their own work ({fmt_ns(floor_ns)} each, no wait); outside the steady "
                   "steps the account covers"),
        expected=expected,
        expected_note=expected_note,
    )
    return RuleResult.fired(finding)


def _expected(ctx: RuleContext, bare: list[StepRecord], step_ns: float,
              stall_ns: int) -> tuple[float | None, str, float | None]:
    """The fraction of the stall (the first step's excess) persistent workers win, its model in words, and
    the wait they keep (the epoch's first batch in a live worker); None without the workers' CPU samples.
    ``step_ns``: the run's step time, of the steps ``bare``."""
    use = loader_of(ctx).workers  # the run's figures (analysis.loader)
    if use is None or not use.workers or stall_ns <= 0 or not bare or step_ns <= 0:
        return None, "", None
    per_batch = step_ns / statistics.fmean(max(1, st.batches or 1) for st in bare)
    first_batch = use.cpu_cores * per_batch + ctx.thresholds.dataloader_handover_ms * 1e6
    fraction = max(0.0, stall_ns - first_batch) / stall_ns
    note = (f"the {fmt_ns(stall_ns)} stall less the epoch's first batch, which live workers still load: "
            f"{fmt_ns(first_batch)} ({use.cpu_cores:.2f} worker cores × {fmt_ns(per_batch)} per batch + hand-over)")
    return fraction, note, first_batch


def inject(finding: Finding, ctx: RuleContext) -> tuple[Injection, ...] | str:
    """--verify: persistent_workers=True at the DataLoader the finding names."""
    dl = dataloader_of(ctx, finding)
    why = no_dataloader_reason(ctx, dl)
    if why:
        return why
    caveat = ctx.workers_caveat(dl)
    if caveat is not None:
        return f"the fix is left to the author: {caveat[0]}"
    return dataloader_injections(dl, {"persistent_workers": True})


# --------------------------------------------------------------------------- `gpudoctor check`


def _epoch_loop_using(src: StaticContext, fn: Function, names: set[str]) -> str | None:
    """``file:line`` of an epoch loop of ``fn``'s program that uses one of these names."""
    if not names:
        return None
    for other in src.program_functions(fn):
        for lid in src.epoch_loop_ids(other):
            loop = src.loop(other, lid)
            if loop is not None and loop.mentions & names:
                return f"{other.file}:{loop.site.line}"
    return None


def _literal_count(lf: LoaderFact) -> bool:
    """Whether the DataLoader passes num_workers as a number in its own text (``num_workers=4``)."""
    sym = lf.kwargs.get("num_workers")
    return sym is not None and sym[0] == "k" and isinstance(sym[1], int) and not isinstance(sym[1], bool)


def static_check(src: StaticContext) -> None:
    """A DataLoader with workers, not persistent, made outside the loops and iterated by an epoch loop."""
    for fn, lf in src.loaders():
        nw_state, nw = src.loader_value(fn, lf, "num_workers")
        pw_state, pw = src.loader_value(fn, lf, "persistent_workers")
        positive = nw_state == "set" and nw is not None and (
            nw.value is POSITIVE_VALUE
            or (nw.known and isinstance(nw.value, int) and not isinstance(nw.value, bool) and nw.value > 0)
        )
        not_persistent = pw_state == "missing" or (pw_state == "set" and pw is not None and pw.truth() is False)
        if not (positive and not_persistent and not lf.ctx.loops):
            continue
        epoch = _epoch_loop_using(src, fn, src.loader_names(fn, lf))
        if epoch is None:
            continue
        loc = src.location(fn, lf.site)
        before = src.source(fn, lf.site)
        workers = nw.value if nw is not None and nw.known else "its"
        manual = ""
        if pw_state == "set":  # the script's own choice (False, or a flag whose default is False): never overridden
            manual = (f"the DataLoader passes persistent_workers itself ({how('persistent_workers', pw_state, pw, 'False')}): "
                      "the script's choice, left to its author")
        else:
            changed = dataset_changed(src, fn, lf)
            if changed is not None:
                manual = (f"{changed[0]}: persistent workers would keep their first copy of the dataset and load "
                          "stale data")
        edits = () if manual else (dataloader_args(fn.file, lf.site.line, {"persistent_workers": True}, col=lf.site.col),)
        evidence = Evidence(settings=(SettingRef("DataLoader.persistent_workers", pw.value if pw is not None else False, loc),),
                            notes=(manual_note(manual),) if manual else ())
        src.report(
            "GD202",
            Severity.INFO,
            f"DataLoader at {at(loc)} starts {workers} worker processes again at every epoch of the loop at "
            f"{epoch} ({how('persistent_workers', pw_state, pw, 'False')}): each epoch begins with a stall while "
            "they start",
            Fix(
                f"Keep the workers alive across epochs: persistent_workers=True on the DataLoader at {at(loc)}"
                + ("" if _literal_count(lf) else
                   "; its count of workers is computed and may be 0, with which DataLoader refuses persistent "
                   "workers: write persistent_workers=<the count> > 0"),
                before,
                with_kwargs(before, {"persistent_workers": "True"}),
                edits,
            ),
            fn,
            lf.site,
            evidence,
        )


STATIC = StaticCheck(
    check=static_check,
    # its loaders have workers already: the finding is about keeping them, not about num_workers > 0
    recommends=lambda finding: False,
)


EXAMPLES = examples(
    bad_epoch_restart="""\
# Four workers are started again at the beginning of every epoch.
import torch
from torch.utils.data import DataLoader

train_loader = DataLoader(dataset, batch_size=128, num_workers=4, pin_memory=True)

for epoch in range(90):
    for x, y in train_loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
""",
    good_persistent="""\
# The workers survive from one epoch to the next.
import torch
from torch.utils.data import DataLoader

train_loader = DataLoader(dataset, batch_size=128, num_workers=4, pin_memory=True,
                          persistent_workers=True)

for epoch in range(90):
    for x, y in train_loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
""",
)


RULE = Rule(
    code="GD202",
    name="worker-restart",
    title="DataLoader workers are re-created every epoch",
    doc=__doc__,
    check=check,
    needs={Need.SETTINGS, Need.STEPS},
    self_checked={Need.STEPS},
    needs_reasons={Need.SETTINGS: "no DataLoader settings: analyse a run directory from `gpudoctor profile`"},
    inject=inject,
    verify_statistic="epoch",  # the restarts cost the first step of each epoch, which the steady steps leave out,
    static=STATIC,
    examples=EXAMPLES,
    autofix=True,
)
