"""GD605 find-unused-parameters: DDP searches for unused parameters every step, and there are none.

What it detects
---------------
`DistributedDataParallel(..., find_unused_parameters=True)` on a model whose
forward pass used every parameter. gpudoctor reads the wrapper's arguments when
it is created, and DDP's own account of the parameters it found unused
(`unused_parameter_size` in DDP's logging data, the bytes of parameters that
received no gradient, read on the iterations DDP samples: the first ten, then
every hundredth). The rule fires when the flag is on, `static_graph` is off,
and DDP found zero bytes unused on every iteration read.

Why it matters
--------------
With the flag on, DDP walks the autograd graph from the outputs after every
forward pass to mark the parameters that will get no gradient, and it cannot
launch a bucket's all-reduce before it knows which gradients will never come.
With nothing unused that walk is pure overhead on every step, growing with the
size of the graph. DDP prints the same warning once on each rank
("find_unused_parameters=True was specified … but did not find any unused
parameters").

How to fix
----------
Drop the flag (it defaults to False). If some steps do leave parameters
unused (a branch taken now and then), keep it, or declare the graph static.

Before:

```python
model = DDP(model, device_ids=[local_rank], find_unused_parameters=True)
```

After:

```python
model = DDP(model, device_ids=[local_rank])   # every parameter gets a gradient
# (a graph that never changes but leaves some parameters unused: static_graph=True)
```

Evidence used
-------------
Settings: the DDP wrapper's `find_unused_parameters` and `static_graph` with
their `file:line`, and `unused_parameter_size` / `unused_parameter_checks`
(bytes of unused parameters, iterations DDP reported on) read from
`DistributedDataParallel._get_ddp_logging_data()` while the script ran.

Thresholds
----------
- `unquantified_severity`: the cost of the graph walk is not measured, so the
  finding takes this severity.

Known limits
------------
What the walk costs is not in the trace (it runs inside DDP's C++ forward
hook): the finding says that it is wasted, not how much time it wastes.
DDP reports unused parameters only on its sampled iterations; a model whose
branches leave parameters unused only on other steps (dynamic control flow)
would be flagged wrongly: check the model before removing the flag (DDP then
raises an error naming the parameters that did not receive gradients). Needs
a run directory from `gpudoctor profile` (a bare trace has no settings).

References
----------
- `DistributedDataParallel` (find_unused_parameters, static_graph):
  https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
- PyTorch DDP design, "Find unused parameters": https://pytorch.org/docs/stable/notes/ddp.html
"""

from __future__ import annotations

from gpudoctor.model.findings import Confidence, Fix, Metric
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.distributed import ddp_refs, ddp_wrappers, is_distributed
from gpudoctor.rules.formatting import fmt_bytes, location_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult

_BEFORE = "model = DDP(model, device_ids=[local_rank], find_unused_parameters=True)"
_AFTER = """model = DDP(model, device_ids=[local_rank])   # every parameter gets a gradient
# (a graph that never changes but leaves some parameters unused: static_graph=True)"""


def check(ctx: RuleContext) -> RuleResult:
    if ctx.settings is None:
        if is_distributed(ctx):
            return RuleResult.cannot_judge("DDP's arguments are not recorded in a trace: run `gpudoctor profile`")
        return RuleResult.not_applicable("single process: no DistributedDataParallel")
    ddp = [w for w in ddp_wrappers(ctx) if w.kind == "DistributedDataParallel"]
    if not ddp:
        return RuleResult.not_applicable("no DistributedDataParallel wrapper in this run")
    on = [w for w in ddp if w.options.get("find_unused_parameters") is True]
    if not on:
        w = ddp[0]
        return RuleResult.fine(f"find_unused_parameters={w.options.get('find_unused_parameters')!r} at {location_of(w.call_site) or '?'}")
    w = on[0]
    loc = location_of(w.call_site)
    where = f" at {loc}" if loc else ""
    if w.options.get("static_graph") is True:
        return RuleResult.fine(f"find_unused_parameters=True with static_graph=True{where}: DDP searches the graph once")
    unused = w.options.get("unused_parameter_size")
    checks = w.options.get("unused_parameter_checks")
    if not isinstance(unused, int) or isinstance(unused, bool):
        return RuleResult.cannot_judge(
            f"find_unused_parameters=True{where}, but whether any parameter goes unused was not recorded "
            "(DDP's logging data could not be read in this run)"
        )
    if unused > 0:
        return RuleResult.fine(
            f"find_unused_parameters=True{where} is needed: DDP found {fmt_bytes(unused)} of parameters unused"
        )
    n = f" on {checks} iteration(s) DDP reported on" if isinstance(checks, int) and checks > 0 else ""
    message = (
        f"find_unused_parameters=True{where} but DDP found no unused parameter{n}: "
        f"it walks the autograd graph after every forward pass for nothing"
    )
    metrics = [Metric("unused_parameter_size", 0, "bytes")]
    if isinstance(checks, int):
        metrics.append(Metric("unused_parameter_checks", checks, "count"))
    finding = ctx.finding(
        message,
        Fix(
            f"Remove find_unused_parameters=True from the DistributedDataParallel call{where}; keep it only if "
            "some steps leave parameters without gradients (or pass static_graph=True when the graph never changes).",
            _BEFORE,
            _AFTER,
        ),
        share_pct=None,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        settings=ddp_refs(w, "find_unused_parameters", "static_graph", "unused_parameter_size"),
        notes=("the cost of the graph walk is not in the trace: it grows with the size of the autograd graph",),
        location=loc,
        gain_note="not measured: one autograd-graph traversal per step, and all-reduces that wait for it",
    )
    return RuleResult.fired(finding)


RULE = Rule(
    code="GD605",
    name="find-unused-parameters",
    title="DDP find_unused_parameters=True while every parameter is used",
    technique="find_unused_parameters=False when every parameter is used",
    doc=__doc__,
    check=check,
    needs={Need.SETTINGS},
    self_checked={Need.SETTINGS},
    not_injectable="trials of distributed jobs are not supported",
)
