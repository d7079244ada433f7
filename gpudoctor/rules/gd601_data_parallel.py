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

import dataclasses

from gpudoctor.model.findings import Confidence, Fix, Metric, SettingRef, Severity
from gpudoctor.rules.context import RuleContext, RuleResult, location_of
from gpudoctor.rules.registry import Rule

_AFTER = """# torchrun --nproc-per-node=NUM_GPUS train.py
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = DDP(Net().cuda(local_rank), device_ids=[local_rank])
loader = DataLoader(dataset, batch_size=64, sampler=DistributedSampler(dataset),
                    num_workers=4, pin_memory=True)"""


def check(ctx: RuleContext) -> RuleResult:
    s = ctx.settings
    if s is None:
        return RuleResult.cannot_judge("module wrappers are not recorded in a trace: run `gpudoctor profile`")
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


RULE = Rule(
    code="GD601",
    name="data-parallel",
    title="nn.DataParallel in use",
    technique="DistributedDataParallel rather than nn.DataParallel",
    doc=__doc__,
    check=check,
    needs=("settings",),
    not_injectable="moving to DistributedDataParallel needs a launcher and code changes",
)
