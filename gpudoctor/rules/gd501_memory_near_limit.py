"""GD501 memory-near-limit: peak GPU memory is close to the device's capacity.

What it detects
---------------
The peak memory the run reserved on a GPU (allocator events of the trace, or
NVML's used memory) above 90% of the device's memory (torch-tb-profiler's
memory recommendation).

Why it matters
--------------
Near the limit, the caching allocator frees and re-allocates blocks
(`cudaFree`/`cudaMalloc` synchronize the device), fragmentation turns into
out-of-memory errors on the next larger batch or sequence, and there is no
room for a larger batch that would use the GPU better.

How to fix
----------
Reduce activation memory: mixed precision (GD401) halves activations;
activation checkpointing trades recomputation for memory; a smaller batch
with gradient accumulation keeps the effective batch.

Before:

```python
loss = loss_fn(model(x), y)
```

After:

```python
with torch.autocast("cuda", dtype=torch.bfloat16):
    h = torch.utils.checkpoint.checkpoint(model.trunk, x, use_reentrant=False)
    loss = loss_fn(model.head(h), y)
```

Evidence used
-------------
Trace: peak allocated and reserved memory per device and the device's total
(`TraceMetrics.memory`); NVML samples (`mem_used_bytes`, `mem_total_bytes`).

Thresholds
----------
- `memory_near_limit_pct` (90): peak memory, % of the device.
- `unquantified_severity`: memory headroom is not step time, so the finding
  takes this severity.

Known limits
------------
NVML's used memory includes other processes on the GPU and the CUDA context.
Reserved memory includes cached free blocks: a high reserved peak with a
lower allocated peak means fragmentation or caching, not live tensors.

References
----------
- PyTorch, CUDA memory management: https://pytorch.org/docs/stable/notes/cuda.html#memory-management
- Activation checkpointing: https://pytorch.org/docs/stable/checkpoint.html
- torch-tb-profiler's memory recommendation: https://github.com/pytorch/kineto/tree/main/tb_plugin
"""

from __future__ import annotations

from gpudoctor.model.findings import Confidence, Fix
from gpudoctor.model.metrics import TraceMetrics
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.device import memory_peak
from gpudoctor.rules.formatting import fmt_bytes, fmt_pct
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult

_BEFORE = """loss = loss_fn(model(x), y)"""
_AFTER = """with torch.autocast("cuda", dtype=torch.bfloat16):
    h = torch.utils.checkpoint.checkpoint(model.trunk, x, use_reentrant=False)
    loss = loss_fn(model.head(h), y)"""


def _judge(ctx: RuleContext, m: TraceMetrics | None) -> RuleResult:
    t = ctx.thresholds
    peak = memory_peak(ctx, m)
    if peak is None:
        return RuleResult.cannot_judge(
            "no GPU memory figures: no allocator events in the trace (profile with --memory) and no NVML samples"
        )
    if peak.pct <= t.memory_near_limit_pct:
        return RuleResult.fine(
            f"peak GPU memory {fmt_bytes(peak.peak_bytes)} = {fmt_pct(peak.pct)} of the device "
            f"(threshold {t.memory_near_limit_pct:g}%)"
        )
    message = (
        f"peak GPU memory {fmt_bytes(peak.peak_bytes)} is {fmt_pct(peak.pct)} of the device's "
        f"{fmt_bytes(peak.total_bytes)} ({peak.source})"
    )
    notes = []
    if peak.source == "NVML used":
        notes.append("NVML's used memory includes the CUDA context and other processes on the GPU")
    finding = ctx.finding(
        message,
        Fix(
            "Make room: mixed precision (GD401) halves activations, activation checkpointing trades "
            "recomputation for memory, a smaller batch with gradient accumulation keeps the effective batch.",
            _BEFORE,
            _AFTER,
        ),
        share_pct=None,
        confidence=Confidence.MEASURED,
        metrics=peak.metrics(),
        notes=notes,
        gain_note="memory headroom, not step time",
        rank=m.rank if m is not None else None,
    )
    return RuleResult.fired(finding)


def check(ctx: RuleContext) -> RuleResult:
    if not ctx.metrics:
        return _judge(ctx, None)
    return ctx.per_trace(lambda m: _judge(ctx, m))


RULE = Rule(
    code="GD501",
    name="memory-near-limit",
    title="Peak GPU memory near the device's capacity",
    technique="Headroom in GPU memory (batch size, activation checkpointing)",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.MEMORY},
    self_checked={Need.MEMORY},
    not_injectable="memory headroom is not a speed fix to time",
)
