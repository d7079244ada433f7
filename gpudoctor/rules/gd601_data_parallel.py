"""GD601 data-parallel: the model is wrapped in `nn.DataParallel`.

What it detects
---------------
`torch.nn.DataParallel` around a module, read from the run's settings.

Why it matters
--------------
DataParallel runs one Python process for all GPUs: every step it scatters
the inputs, replicates the model, gathers the outputs on GPU 0 and reduces
the gradients there, with the GIL serializing the per-GPU threads. GPU 0
carries extra memory and work, and scaling stops at a few GPUs.
DistributedDataParallel runs one process per GPU and overlaps gradient
all-reduce with the backward pass. PyTorch recommends it even on one machine.

How to fix
----------
Use DistributedDataParallel, one process per GPU, launched with `torchrun`.

Before:

```python
model = nn.DataParallel(Net()).cuda()
```

After:

```python
# torchrun --nproc-per-node=4 train.py
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = DDP(Net().cuda(local_rank), device_ids=[local_rank])
sampler = DistributedSampler(ds)
loader = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=4, pin_memory=True)
```

Evidence used
-------------
Settings: the wrapper kind and the `file:line` that created it; the number of
GPUs in the manifest.

Thresholds
----------
- `unquantified_severity`: the cost is not measured in one process's trace,
  so the finding takes this severity (info with a single GPU, where
  DataParallel only adds a wrapper).

Known limits
------------
Needs the run's settings (`gpudoctor profile`); `gpudoctor check` finds the
same call statically.

References
----------
- PyTorch, use DistributedDataParallel instead of DataParallel:
  https://pytorch.org/docs/stable/notes/cuda.html#cuda-nn-ddp-instead
- DDP tutorial: https://pytorch.org/tutorials/intermediate/ddp_tutorial.html
- `torchrun`: https://pytorch.org/docs/stable/elastic/run.html
"""

from __future__ import annotations

import ast
import dataclasses
import re

from gpudoctor.model.findings import ChecklistStatus, Confidence, Fix, Metric, SettingRef, Severity
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import location_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.static_api import (
    Fact,
    Function,
    Scan,
    StaticCheck,
    StaticContext,
    Watch,
    examples,
)
from gpudoctor.rules.static_api.names import DATA_PARALLEL, DDP
from gpudoctor.rules.static_api.text import closing_paren, first_of

_AFTER = """# torchrun --nproc-per-node=NUM_GPUS train.py
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = DDP(Net().cuda(local_rank), device_ids=[local_rank])
loader = DataLoader(dataset, batch_size=64, sampler=DistributedSampler(dataset),
                    num_workers=4, pin_memory=True)"""


def check(ctx: RuleContext) -> RuleResult:
    s = ctx.settings
    assert s is not None  # Rule.needs
    dp = [w for w in s.wrappers if w.kind == "DataParallel"]
    ddp = [w for w in s.wrappers if w.kind in ("DistributedDataParallel", "FullyShardedDataParallel")]
    if not dp:
        if ddp:
            return RuleResult.fine(f"{ddp[0].kind} at {location_of(ddp[0].call_site) or '?'}", applied=True)
        return RuleResult.not_applicable("no data-parallel wrapper: single-process training")
    w = dp[0]
    loc = location_of(w.call_site)
    gpus = len(ctx.manifest.devices) if ctx.manifest is not None else None
    module = w.module or "the model"
    message = (
        f"nn.DataParallel wraps {module}" + (f" at {loc}" if loc else "")
        + (f" on {gpus} GPU(s)" if gpus is not None else "")
        + ": one process scatters, replicates and gathers every step"
    )
    finding = ctx.finding(
        message,
        Fix(
            "Use DistributedDataParallel, one process per GPU, launched with torchrun"
            + (f" (replace the wrapper at {loc})" if loc else "")
            + ".",
            f"model = nn.DataParallel({module}()).cuda()",
            _AFTER.replace("Net", module if w.module else "Net"),
        ),
        share_pct=None,
        confidence=Confidence.MEASURED,
        metrics=[Metric("gpus", gpus, "count")] if gpus is not None else [],
        settings=[SettingRef("nn.DataParallel", module, loc)],
        location=loc,
        gain_note="not measured in one process's trace; DDP scales where DataParallel stops",
    )
    if gpus is not None and gpus <= 1:
        finding = dataclasses.replace(
            finding,
            severity=Severity.INFO,
            evidence=dataclasses.replace(
                finding.evidence, notes=("one GPU: DataParallel only adds a wrapper here; it costs on several",)
            ),
        )
    return RuleResult.fired(finding)


# --------------------------------------------------------------------------- `gpudoctor check`


def _data_parallel(scan: Scan, node: ast.Call, q: str) -> None:
    data = None
    if q.rsplit(".", 1)[-1] == "data_parallel" and len(node.args) >= 2:
        # the functional form, data_parallel(module, inputs, device_ids): replicates the module at each call
        data = (scan.segment(node.args[0]), scan.segment(node.args[1]), scan.segment(node, 400))
    scan.record("data_parallel", node, extra=q, data=data)


def _ddp(scan: Scan, node: ast.Call, q: str) -> None:
    scan.record("ddp", node, extra=q)


def _ddp_after(line: str) -> str:
    m = re.search(r"(?:\w+\.)*(?:DataParallel|data_parallel)\(", line)
    if m is None:
        return line
    rest = line[m.end() - 1 :]
    close = closing_paren(rest)
    if close is None:
        return line[: m.start()] + "DistributedDataParallel(" + line[m.end() :]
    inner = rest[1:close].strip()
    try:  # DataParallel(module, device_ids, output_device, dim): DDP takes its own device_ids
        call = ast.parse(f"f({inner})", mode="eval").body
    except SyntaxError:
        call = None
    if isinstance(call, ast.Call) and call.args and not isinstance(call.args[0], ast.Starred):
        kept = [ast.unparse(call.args[0])]
        if len(call.args) > 3:
            kept.append(f"dim={ast.unparse(call.args[3])}")
        kept += [ast.unparse(k) for k in call.keywords if k.arg not in ("device_ids", "output_device")]
        inner = ", ".join(kept)
    else:
        inner = re.sub(r",?\s*(device_ids|output_device)\s*=\s*(\[[^\]]*\]|[^,)]+)", "", inner).strip()
    args = (inner + ", " if inner else "") + "device_ids=[local_rank]"
    return line[: m.start()] + "DistributedDataParallel(" + args + ")" + rest[close + 1 :]


def static_check(src: StaticContext) -> None:
    """Every nn.DataParallel that runs with the argparse defaults."""
    for fn in src.functions():
        for f in fn.facts:
            if f.kind != "data_parallel" or not src.active(fn, f.ctx):
                continue
            line = src.line(fn, f.site.line)
            if f.data is not None:
                _functional(src, fn, f, line)
                continue
            src.report(
                "GD601",
                Severity.WARNING,
                f"nn.DataParallel at {fn.file}:{f.site.line}: one process drives every GPU, scattering each batch, "
                "replicating the model every step and gathering outputs on GPU 0, under one GIL",
                Fix(
                    "Use DistributedDataParallel, one process per GPU, launched with torchrun "
                    "(`torchrun --nproc-per-node=N train.py`), with a DistributedSampler",
                    line,
                    "# torch.distributed.init_process_group(\"nccl\"); local_rank = int(os.environ[\"LOCAL_RANK\"])\n"
                    + _ddp_after(line),
                ),
                fn,
                f.site,
            )


def _functional(src: StaticContext, fn: Function, f: Fact, line: str) -> None:
    """``nn.parallel.data_parallel(module, inputs, device_ids)`` in a forward pass: DDP wraps the model once,
    where it is built, and the forward pass calls the module itself."""
    module, inputs, call = f.data
    after = line.replace(call, f"{module}({inputs})") if call in line else f"{module}({inputs})"
    src.report(
        "GD601",
        Severity.WARNING,
        f"`{f.text}` at {fn.file}:{f.site.line} replicates `{module}` onto every GPU in each call: one process "
        "drives every GPU, scattering each batch and gathering outputs on GPU 0, under one GIL",
        Fix(
            "Use DistributedDataParallel, one process per GPU, launched with torchrun "
            "(`torchrun --nproc-per-node=N train.py`), with a DistributedSampler: wrap the model once where it "
            "is built, and call the module itself here",
            line,
            "# once, where the model is built (one process per GPU):\n"
            "#   torch.distributed.init_process_group(\"nccl\"); local_rank = int(os.environ[\"LOCAL_RANK\"])\n"
            "#   model = DistributedDataParallel(model.cuda(local_rank), device_ids=[local_rank])\n"
            + after,
        ),
        fn,
        f.site,
    )


def _judge_in_source(src: StaticContext) -> tuple[ChecklistStatus, str]:
    ddp = [src.location(fn, f.site) for fn, f in src.facts("ddp") if src.active(fn, f.ctx)]
    if ddp:
        return ChecklistStatus.APPLIED, f"DistributedDataParallel / FSDP at {first_of(ddp)}"
    off = [(fn, f) for fn, f in src.facts("data_parallel") if not src.active(fn, f.ctx)]
    if off:
        fn, f = off[0]
        flags = src.active_why(fn, f.ctx)[1]
        by = f"; {', '.join(dict.fromkeys(flags))} decides it" if flags else ""
        return ChecklistStatus.NOT_APPLICABLE, (
            f"nn.DataParallel at {first_of([src.location(g, h.site) for g, h in off])} is off with the argparse "
            f"defaults{by}: where it is switched on, DistributedDataParallel replaces it"
        )
    return ChecklistStatus.NOT_APPLICABLE, "no nn.DataParallel in the checked source"


STATIC = StaticCheck(
    check=static_check,
    watch=Watch(calls={**dict.fromkeys(DATA_PARALLEL, _data_parallel), **dict.fromkeys(DDP, _ddp)}),
    judges={"data-parallel": _judge_in_source},
)


EXAMPLES = examples(
    bad_data_parallel="""\
# One process drives every GPU through nn.DataParallel.
import torch
from torch import nn

model = nn.DataParallel(model).cuda()
for x, y in loader:
    loss = criterion(model(x), y.cuda(non_blocking=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
    good_ddp="""\
# One process per GPU (torchrun), gradients all-reduced by DistributedDataParallel.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = DDP(model.cuda(local_rank), device_ids=[local_rank])
for x, y in loader:
    x, y = x.cuda(local_rank, non_blocking=True), y.cuda(local_rank, non_blocking=True)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
)


RULE = Rule(
    code="GD601",
    name="data-parallel",
    title="nn.DataParallel in use",
    technique="DistributedDataParallel rather than nn.DataParallel",
    doc=__doc__,
    check=check,
    needs={Need.SETTINGS},
    needs_reasons={Need.SETTINGS: "module wrappers are not recorded in a trace: run `gpudoctor profile`"},
    not_injectable="moving to DistributedDataParallel needs a launcher and code changes",
    static=STATIC,
    examples=EXAMPLES,
    not_autofix='DistributedDataParallel needs a launcher (torchrun), a process group and a sampler per rank: more than an edit of one line',
)
