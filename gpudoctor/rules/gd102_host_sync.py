"""GD102 host-sync: the host blocks in synchronizations with the GPU inside the step.

What it detects
---------------
Time the training process spends blocked waiting for the GPU (stream and device
synchronizations, synchronous copies, `aten::item`, `aten::nonzero`, boolean-mask
indexing), with the lines of your code that caused them where the trace has
Python stacks (`.item()`, `.cpu()`, `.tolist()`, `print(tensor)`, `if tensor:` …).

Why it matters
--------------
A sync drains the GPU's queue: the host waits for every queued kernel, then
launches the next ones while the GPU has nothing to run. The idle time that
follows is its cost (little while the GPU is saturated).

How to fix
----------
Keep values on the device and bring them to the host every N steps, or
accumulate metrics as tensors.

Before:

```python
for x, y in loader:
    loss = step(x, y)
    total += loss.item()                  # blocks every step
```

After:

```python
total = torch.zeros((), device="cuda")
for i, (x, y) in enumerate(loader):
    loss = step(x, y)
    total += loss.detach()                # stays on the GPU
    if i % 100 == 0:
        print(f"mean loss {total.item() / (i + 1):.4f}")
```

A value that is summed or given to a meter (`losses.update(loss.item(), n)`)
stays on the device instead (`losses.update(loss.detach(), n)`), so the average
still counts every batch; `gpudoctor check`'s fix says when its after records a
value every N steps only, or prints less often.

Expected gain
-------------
Without the syncs the host runs ahead and launches the next work while the GPU
still runs the last: `step_after = max(GPU busy, step − blocked)`, the gain at
most the share at stake. When the host's own time exceeds the GPU's, the loop is
launch- or Python-bound (GD103, GD203), whose fixes come first. Source: CUDA's
asynchronous execution (PyTorch CUDA semantics, below).

Evidence used
-------------
Trace: host synchronization events and the Python frame of each
(`TraceMetrics.syncs`), and the step's ledger (docs/account.md). The share at
stake is the GPU idle time in and after syncs: the `sync_wait` part and, of the
`launch_overhead` and `other_cpu` parts, the idle gaps a sync began
(`after_sync_ns`), which GD103 and GD203 own first where they fire. GD102 owns
`sync_wait`: GD302, GD303 and GD702 show "included in GD102" for it.

Thresholds
----------
- `sync_share_pct` (5): fires above this share of step time blocked in syncs.
- `error_share_pct`, `warning_share_pct`: severity from the idle time they cause.

Known limits
------------
Names Python lines only when the trace was recorded with stacks
(`gpudoctor profile` records them by default; `--no-stack` turns them off).
Some syncs are needed (gradient clipping with `error_if_nonfinite`, dynamic
shapes); the fix is to make them rarer, not always to remove them.

References
----------
- PyTorch CUDA semantics, asynchronous execution:
  https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution
- `torch.cuda.set_sync_debug_mode`: https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html
- PyTorch performance tuning guide:
  https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
"""

from __future__ import annotations

import ast

from gpudoctor.model.findings import (
    Confidence,
    Evidence,
    Fix,
    Metric,
    Severity,
    TimeRange,
)
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.model.selectors import trace_label
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_ns, fmt_pct
from gpudoctor.rules.profiles import parse_frame
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.speedups import runs_ahead_fraction
from gpudoctor.rules.static_api import (
    Fact,
    Function,
    Scan,
    StaticCheck,
    StaticContext,
    Watch,
    absent_from_step_loops,
    examples,
    root_name,
)
from gpudoctor.rules.static_api.names import LIGHTNING
from gpudoctor.rules.static_api.text import sync_after, sync_change

_BEFORE = """for x, y in loader:
    loss = step(x, y)
    total += loss.item()          # waits for the GPU every step"""
_AFTER = """total = torch.zeros((), device="cuda")
for i, (x, y) in enumerate(loader):
    loss = step(x, y)
    total += loss.detach()        # stays on the GPU
    if i % 100 == 0:
        print(total.item() / (i + 1))"""


def _judge(ctx: RuleContext, m: TraceMetrics) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    s = m.syncs
    if s is None:
        return RuleResult.cannot_judge("the trace has no host-side runtime events to find synchronizations in")
    # of the window every step-time share of this trace is of (GD302 prints the same figure)
    share = ctx.trace_share(m, s.total_ns)
    if share is None:
        return RuleResult.cannot_judge("no step window to put the synchronization time in")
    if share <= t.sync_share_pct:
        return RuleResult.fine(
            f"host blocked {fmt_pct(share)} of step time in {s.count} synchronizations "
            f"(threshold {t.sync_share_pct:g}%)"
        )
    ledger = ctx.ledger(m)
    claims: list[tuple[Component, int | None]] = []
    expected = expected_note = None
    if ledger is not None:
        # the GPU idle inside the syncs, and the drain after them: the host's launches and Python
        # until the GPU had work again (the parts' after_sync_ns, GD103 and GD203 own the rest)
        drained = {c: (ledger.get(c).after_sync_ns if ledger.get(c) is not None else 0) for c in _DRAIN}
        lost_ns = ledger.ns(Component.SYNC_WAIT) + sum(drained.values())
        at_stake = 100.0 * lost_ns / ledger.total_ns if ledger.total_ns else 0.0
        confidence = Confidence.MEASURED
        gain_note = "GPU idle time in and after synchronizations (the queue drained)"
        claims = [(Component.SYNC_WAIT, None), *((c, ns) for c, ns in drained.items() if ns > 0)]
        expected, expected_note = _expected(ledger, share, at_stake)
    else:
        lost_ns = 0
        at_stake = share
        confidence = Confidence.INFERRED
        gain_note = "host time blocked in synchronizations (no ledger of the step)"
    # the lines come from the window that recorded stacks (the account's records timings only)
    framed = ctx.detail_of(m, "stacks")
    by_frame = s.by_frame or (framed.syncs.by_frame if framed is not None and framed.syncs is not None else ())
    top_frame = by_frame[0] if by_frame else None
    location = parse_frame(top_frame.name) if top_frame is not None else None
    what = ", ".join(f"{n.name} ×{n.count}" for n in s.by_name[:3])
    where = f"; most from {top_frame.name} (×{top_frame.count})" if top_frame is not None else ""
    message = (
        f"host blocked {fmt_ns(s.total_ns)} in {s.count} synchronizations, {fmt_pct(share)} of step time "
        f"({what}){where}; GPU idle after them: {fmt_pct(at_stake)} of step time"
    )
    metrics = [
        Metric("sync_share_pct", round(share, 2), "%", "steps" if m.steps else "span"),
        Metric("sync_count", s.count, "count"),
        Metric("sync_total_ns", s.total_ns, "ns"),
        Metric("gpu_idle_after_sync_ns", lost_ns, "ns"),
        Metric("gpu_idle_after_sync_pct", round(at_stake, 2), "%", "steps" if m.steps else "span"),
    ]
    notes = [f"{n.name}: {n.count} calls, {fmt_ns(n.total_ns)}" for n in s.by_name[:5]]
    notes += [f"caused at {n.name}: {n.count} syncs, {fmt_ns(n.total_ns)}" for n in by_frame[:5]]
    if by_frame is not s.by_frame and framed is not None:
        notes.append(f"the lines from {trace_label(framed)}, the window that recorded stacks")
    if not m.has_stacks and framed is None:
        notes.append("no Python stacks in the trace: record with stacks (gpudoctor profile --stack) to name the lines")
    ranges = tuple(
        TimeRange(h.ts_ns, h.ts_ns + h.dur_ns, f"{h.name}{' at ' + h.frame if h.frame else ''}") for h in s.top[:5]
    )
    lines = ", ".join(n.name for n in by_frame[:3])
    instruction = (
        f"Remove the per-step synchronizations at {lines}: keep values on the GPU and read them every N steps."
        if lines
        else "Find the synchronizations (`.item()`, `.cpu()`, `print(tensor)`, `nonzero`, boolean masks) in the "
        "step and keep those values on the GPU; `torch.cuda.set_sync_debug_mode(\"warn\")` names them."
    )
    finding = ctx.finding(
        message,
        Fix(instruction, _BEFORE, _AFTER),
        share_pct=at_stake,
        confidence=confidence,
        metrics=metrics,
        time_ranges=ranges,
        notes=notes,
        location=location,
        gain_note=gain_note,
        rank=m.rank,
        claims=claims,
        ledger=ledger,
        expected=expected,
        expected_note=expected_note or "",
    )
    return RuleResult.fired(finding)


_DRAIN = (Component.LAUNCH_OVERHEAD, Component.OTHER_CPU)


def _expected(ledger, blocked_pct: float, at_stake_pct: float) -> tuple[float | None, str]:
    """The "Expected gain" model: the host runs ahead once it no longer blocks (``rules.speedups``)."""
    busy = sum(sl.pct for sl in ledger.slices if sl.side == "device")
    return runs_ahead_fraction(busy, blocked_pct, at_stake_pct)


def check(ctx: RuleContext) -> RuleResult:
    return ctx.per_trace(lambda m: _judge(ctx, m))


# --------------------------------------------------------------------------- `gpudoctor check`

#: Logging calls whose tensor arguments are read on the host (``logger.info(loss)``, ``writer.add_scalar``).
_LOG_METHODS = ("info", "debug", "warning", "log", "add_scalar", "add_scalars", "set_postfix", "write")
#: Libraries whose values are host values: ``np.float32(x).item()`` reads no device.
_HOST_LIBRARIES = ("numpy", "math", "random", "pandas")


def _read(scan: Scan, pattern: str, shown: ast.AST) -> None:
    scan.record("host_read", shown, text=scan.segment(shown, 80), extra=pattern)


def _item(scan: Scan, node: ast.Call, recv: ast.expr) -> None:
    if node.args or scan.place(recv) in ("host", "val"):
        return
    root = root_name(recv)
    if root is not None and (scan.imported(root) or "").split(".")[0] in _HOST_LIBRARIES:
        return
    _read(scan, ".item()", node)


def _format(scan: Scan, node: ast.Call, recv: ast.expr) -> None:
    if isinstance(recv, ast.Constant):
        for a in (*node.args, *(k.value for k in node.keywords)):
            if scan.place(a) == "dev":
                _read(scan, "str.format(<tensor>)", node)
                return


def _log(scan: Scan, node: ast.Call, recv: ast.expr) -> None:
    if scan.framework == LIGHTNING and isinstance(recv, ast.Name) and recv.id == "self":
        return  # self.log(name, tensor): Lightning keeps it on the device until it writes the logs
    values: list[ast.AST] = [*node.args, *(k.value for k in node.keywords)]
    for a in list(values):
        if isinstance(a, ast.Dict):
            values.extend(v for v in a.values if v is not None)
    for a in values:
        if scan.place(a) == "dev":
            _read(scan, f"{node.func.attr}(<tensor>)", node)  # type: ignore[attr-defined]
            return


def _print(scan: Scan, node: ast.Call) -> None:
    if scan.is_local("print"):
        return
    for a in node.args:
        if scan.place(a) == "dev":
            _read(scan, "print(<tensor>)", node)
            break


def _convert(scan: Scan, node: ast.Call) -> None:
    if len(node.args) == 1 and scan.place(node.args[0]) == "dev":
        _read(scan, f"{node.func.id}(<tensor>)", node)  # type: ignore[attr-defined]


def _formatted(scan: Scan, value: ast.expr) -> None:
    if scan.place(value) == "dev":
        _read(scan, "f-string of a tensor", value)


#: Comparisons that read a tensor's value (``is`` / ``in`` compare identity or containers).
_VALUE_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _tested_tensor(scan: Scan, test: ast.expr) -> ast.expr | None:
    """The part of an ``if`` / ``while`` / ``assert`` test that is a device tensor taken as a Python bool:
    ``torch.isnan(loss)``, ``(x > 0).any()``, ``loss > 10``, ``mask``."""
    if isinstance(test, ast.BoolOp):
        for v in test.values:
            found = _tested_tensor(scan, v)
            if found is not None:
                return found
            if isinstance(test.op, ast.And) and _every_n(v):
                return None  # `step % 100 == 0 and torch.isnan(loss)`: the rest runs every N steps
        return None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _tested_tensor(scan, test.operand)
    if isinstance(test, ast.Compare):
        if not all(isinstance(op, _VALUE_COMPARISONS) for op in test.ops):
            return None
        return test if any(scan.place(x) == "dev" for x in (test.left, *test.comparators)) else None
    if isinstance(test, (ast.Call, ast.Name, ast.Attribute, ast.Subscript)):
        if not isinstance(test, ast.Call) and scan.is_module_ref(test):
            return None
        return test if scan.place(test) == "dev" else None
    return None


def _every_n(test: ast.expr) -> bool:
    """``step % 100 == 0`` (every N steps), as the scanner reads an ``if`` that runs only sometimes."""
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(test))


def _test(scan: Scan, test: ast.expr) -> None:
    tensor = _tested_tensor(scan, test)
    if tensor is not None:
        _read(scan, TESTED, tensor)


#: The pattern of a tensor used as a Python bool.
TESTED = "a tensor as a Python bool"

WATCH = Watch(
    methods={"item": _item, "format": _format, **dict.fromkeys(_LOG_METHODS, _log)},
    builtins={"print": _print, "float": _convert, "int": _convert, "bool": _convert},
    formatted=_formatted,
    tests=_test,
)


def _fix(src: StaticContext, fn: Function, lid: int, f: Fact) -> Fix:
    """The fix in the loop's own terms: its step counter, Lightning's ``self.log`` of a tensor."""
    line = src.line(fn, f.site.line)
    loop = src.loop(fn, lid)
    counter = src.step_counter(fn, lid)
    if f.extra == TESTED:
        every = f"`{counter} % 100 == 0 and …`" if counter else "a step counter (`step % 100 == 0 and …`)"
        return Fix(
            f"Test the tensor every N steps ({every}), or keep the decision on the device: "
            "`torch.where(torch.isfinite(loss), loss, 0)`, `torch.nan_to_num`; GradScaler already skips the "
            "optimizer step on inf/NaN gradients without a sync",
            line,
            _test_after(line, f.text, counter),
        )
    if loop is not None and loop.framework == LIGHTNING and f.extra == ".item()" and "self.log" in line:
        receiver = f.text[: -len(".item()")]
        return Fix(
            "Log the tensor itself (`self.log(name, loss)`): Lightning keeps it on the device and reads it when "
            "it writes the logs (every `log_every_n_steps`; `prog_bar=True` reads it at each bar refresh)",
            line,
            line.replace(f.text, receiver),
        )
    every = f"`if {counter} % 100 == 0:`" if counter else "with a step counter"
    change = sync_change(line, f.extra, f.text)
    return Fix(
        f"Keep the value on the device (accumulate with `total += loss.detach()`) and read it every N steps "
        f"({every}) or once per epoch" + (f"; {change}" if change else ""),
        line,
        sync_after(line, f.extra, f.text, counter),
    )


def _test_after(line: str, text: str, counter: str | None) -> str:
    """``if torch.isnan(loss):`` → ``if i % 100 == 0 and torch.isnan(loss):`` (an ``if`` only: a ``while``
    or ``assert`` keeps its line, with a comment)."""
    stripped = line.strip()
    if stripped.startswith(("if ", "elif ")) and counter and text in stripped:
        keyword, _, rest = stripped.partition(" ")
        cond = rest.rstrip().removesuffix(":").strip()
        cond = f"({cond})" if any(w in f" {cond} " for w in (" or ", " if ", " lambda ")) else cond
        return f"{keyword} {counter} % 100 == 0 and {cond}:  # not every step"
    return f"{stripped}  # reads the GPU: test it every N steps, or keep the decision on the device"


def static_check(src: StaticContext) -> None:
    """A host read of a device value (``.item()``, ``print(loss)`` …) that runs in every training step."""
    for fn in src.functions():
        for f in fn.facts:
            if f.kind != "host_read":
                continue
            lid = src.step_loop(fn, f.ctx)
            if lid is None or not src.cuda(fn) or not src.active(fn, f.ctx):
                continue
            what = "tests a GPU tensor as a Python bool" if f.extra == TESTED else "reads a GPU value on the host"
            src.report(
                "GD102",
                Severity.WARNING,
                f"`{f.text}` at {fn.file}:{f.site.line} {what} in every step of "
                f"{src.where_step(fn, lid)}: the CPU stops until the GPU has finished all queued work",
                _fix(src, fn, lid, f),
                fn,
                f.site,
                Evidence(notes=(f"pattern: {f.extra}",)),
            )


STATIC = StaticCheck(
    check=static_check, watch=WATCH, judges={"host-sync": absent_from_step_loops("per-step .item() / print(tensor) / float(tensor)")}
)


EXAMPLES = examples(
    bad_item_every_step="""\
# loss.item() waits for the GPU in every step.
import torch

model = model.cuda()
running_loss = 0.0
for step, (x, y) in enumerate(loader):
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    running_loss += loss.item()
""",
    bad_print_tensor="""\
# Printing a CUDA tensor copies it to the host and waits for the GPU.
import torch

device = torch.device("cuda")
for x, y in loader:
    logits = model(x.to(device))
    loss = criterion(logits, y.to(device))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"loss {loss:.4f}")
""",
    good_log_every_n="""\
# The loss is summed on the device and read every 100 steps and once per epoch.
import torch

model = model.cuda()
running_loss = torch.zeros((), device="cuda")
for step, (x, y) in enumerate(loader):
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    running_loss += loss.detach()
    if step % 100 == 0:
        print(f"step {step}: loss {loss.item():.4f}")
print(f"epoch loss {running_loss.item() / len(loader):.4f}")
""",
)


RULE = Rule(
    code="GD102",
    name="host-sync",
    title="The host blocks in synchronizations during the step",
    technique="No host-device synchronization inside the step (.item(), .cpu(), printing tensors)",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.TRACE},
    not_injectable="removing a host synchronization (.item(), .cpu(), printing a tensor) is a code change",
    static=STATIC,
    examples=EXAMPLES,
    not_autofix='reading a device value less often needs a step counter and changes what the script logs when: a change to make by hand',
)
