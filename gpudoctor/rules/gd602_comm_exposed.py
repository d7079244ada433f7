"""GD602 comm-exposed: collective communication that compute does not hide takes a large share of the step.

What it detects
---------------
Time in collectives during which nothing else runs: on a GPU, NCCL/RCCL kernels
with no other kernel, memcpy or memset beside them on that device; on a CPU
(gloo), the collective ranges while no operator runs on another thread and no
kernel on any device. With several ranks it judges the rank with the **least**
exposed communication: the others' extra is waiting for a straggler (GD603).

Why it matters
--------------
DDP all-reduces gradients in buckets during backward; what is left when
backward ends waits in the open.
Exposed communication is step time in which nothing computes: the step cannot
get shorter than compute plus that tail.

How to fix
----------
Send fewer bytes, less often, or start sooner: accumulate under `no_sync()`, a
larger per-GPU batch, a bf16/fp16 DDP communication hook, NCCL for CUDA tensors
(GD604), `gradient_as_bucket_view=True`, a `bucket_cap_mb` that readies buckets early.

Before:

```python
model = DDP(model, device_ids=[local_rank])
for x, y in loader:
    loss_fn(model(x), y).backward()   # all-reduce every step
    opt.step(); opt.zero_grad()
```

After:

```python
hooks = torch.distributed.algorithms.ddp_comm_hooks.default_hooks
model = DDP(model, device_ids=[local_rank], gradient_as_bucket_view=True)
model.register_comm_hook(None, hooks.bf16_compress_hook)  # half the bytes
for i, (x, y) in enumerate(loader):
    last = (i + 1) % accum == 0
    with contextlib.nullcontext() if last else model.no_sync():  # all-reduce every `accum` steps
        (loss_fn(model(x), y) / accum).backward()
    if last:
        opt.step(); opt.zero_grad()
```

Expected gain
-------------
A bf16/fp16 communication hook halves the bytes, and a bandwidth-bound
all-reduce's time: half the exposed communication. Accumulating over N
micro-batches would win more (all but 1/N), but changes the training.

Evidence used
-------------
Trace: collective time and its exposed part per ProfilerStep window
(`TraceMetrics.comm[].per_step`) over every trace of a rank; the DDP wrapper's
`bucket_cap_mb`, `gradient_as_bucket_view`, `static_graph` and backend, with
their `file:line`. The share at stake is the judged rank's `comm_exposed` part.

Thresholds
----------
- `comm_exposed_share_pct` (10): fires above this exposed share of step time
  (torch-tb-profiler's threshold).
- `error_share_pct`, `warning_share_pct`: severity from that share.

Known limits
------------
Needs a trace with collectives in it (NCCL kernels, or the `gloo:`/`nccl:`
ranges PyTorch's process groups record); without ProfilerStep markers the
whole trace is the window. The exposed share bounds what overlap can win: the
last bucket's all-reduce never overlaps an ended backward. A gloo range closes
on gloo's thread, a little after the training thread resumed; a saturated CPU
(more ranks than cores) makes every wait longer.

References
----------
- PyTorch DDP design (bucketing, overlap): https://pytorch.org/docs/stable/notes/ddp.html
- DDP communication hooks: https://pytorch.org/docs/stable/ddp_comm_hooks.html
- `DistributedDataParallel.no_sync`: https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
- torch-tb-profiler's distributed view: https://github.com/pytorch/kineto/tree/main/tb_plugin
"""

from __future__ import annotations

import re
from collections import defaultdict

from gpudoctor.model.findings import Confidence, Fix, Metric
from gpudoctor.model.metrics import Component
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.distributed import (
    RankComm,
    comm_by_rank,
    ddp_refs,
    ddp_wrappers,
    is_distributed,
)
from gpudoctor.rules.formatting import fmt_ns, fmt_pct, location_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.speedups import COMM_COMPRESSION_FRACTION

_BEFORE = """model = DDP(model, device_ids=[local_rank])
for x, y in loader:
    loss_fn(model(x), y).backward()   # all-reduce every step
    opt.step(); opt.zero_grad()"""
_AFTER = """hooks = torch.distributed.algorithms.ddp_comm_hooks.default_hooks
model = DDP(model, device_ids=[local_rank], gradient_as_bucket_view=True)
model.register_comm_hook(None, hooks.bf16_compress_hook)  # half the bytes
for i, (x, y) in enumerate(loader):
    last = (i + 1) % accum == 0
    with contextlib.nullcontext() if last else model.no_sync():  # all-reduce every `accum` steps
        (loss_fn(model(x), y) / accum).backward()
    if last:
        opt.step(); opt.zero_grad()"""


# point-to-point collectives (pipeline parallelism): NCCL SendRecv kernels, nccl:send / nccl:recv ranges
_P2P = re.compile(r"SendRecv|_Send|_Recv|:send|:recv|:batch_isend_irecv", re.IGNORECASE)


def _jobs(ranks: list[RankComm]) -> list[list[RankComm]]:
    """Ranks of one job together (same world size); a trace without a rank is a job of its own."""
    jobs: dict[tuple, list[RankComm]] = defaultdict(list)
    for r in ranks:
        jobs[("job", r.world_size) if r.rank is not None else ("trace", r.label)].append(r)
    return list(jobs.values())


def check(ctx: RuleContext) -> RuleResult:
    t = ctx.thresholds
    if not ctx.metrics:
        if is_distributed(ctx):
            return RuleResult.cannot_judge("no trace in this run: exposed communication is measured in the trace")
        return RuleResult.not_applicable("single process: no collective communication")
    ranks = comm_by_rank(ctx)
    if not ranks:
        if is_distributed(ctx):
            return RuleResult.fine("no collective communication in the profiled steps")
        return RuleResult.not_applicable("no collective communication in the trace(s): single-process training")
    judged: list[tuple[RankComm, list[RankComm]]] = []
    for job in _jobs(ranks):
        measured = [r for r in job if r.exposed_pct is not None]
        if measured:
            judged.append((min(measured, key=lambda r: (r.exposed_pct, r.rank or 0)), job))
    if not judged:
        return RuleResult.cannot_judge("no step window to put the communication time in")
    fired = []
    fine = []
    for best, job in judged:
        share = best.exposed_pct or 0.0
        if share > t.comm_exposed_share_pct:
            fired.append(_finding(ctx, best, job, share))
        else:
            fine.append(
                f"{best.label}: exposed communication {fmt_pct(share)} of step time "
                f"(threshold {t.comm_exposed_share_pct:g}%)"
                + (f"; the least of {len(job)} ranks" if len(job) > 1 else "")
            )
    if fired:
        fired.sort(key=lambda f: -(f.gain.share_pct or 0.0))
        return RuleResult.fired(fired)
    return RuleResult.fine("; ".join(fine))


def _finding(ctx: RuleContext, best: RankComm, job: list[RankComm], share: float):
    t = ctx.thresholds
    steps = max(best.steps, 1)
    per_step_exposed = best.exposed_ns / steps if best.steps else best.exposed_ns
    per_step_window = best.window_ns / steps if best.steps else best.window_ns
    where = "on the GPU" if best.device >= 0 else "on the host (gloo)"
    short = [n.split("(", 1)[0] for n in best.names]
    names = ", ".join(dict.fromkeys(short[:3])) or "collectives"
    p2p = bool(short) and all(_P2P.search(n) for n in short[:1])
    overlap = best.overlap_pct
    message = (
        f"{best.label}: communication not overlapped with compute takes {fmt_pct(share)} of step time "
        f"({fmt_ns(per_step_exposed)} of {fmt_ns(per_step_window)}"
        + (" per step" if best.steps else "")
        + f"; {names} {where}"
        + (f", {overlap:.0f}% of it overlapped" if overlap is not None else "")
        + ")"
    )
    if len(job) > 1:
        worst = max(job, key=lambda r: r.exposed_pct or 0.0)
        message += f"; the least of {len(job)} ranks ({worst.label}: {fmt_pct(worst.exposed_pct)})"
    metrics = [
        Metric("comm_exposed_share_pct", round(share, 2), "%", best.window),
        Metric("comm_exposed_ns", best.exposed_ns, "ns", best.window),
        Metric("comm_ns", best.comm_ns, "ns", best.window),
        Metric("window_ns", best.window_ns, "ns"),
        Metric("profiled_steps", best.steps, "count"),
    ]
    if overlap is not None:
        metrics.append(Metric("comm_overlapped_pct", round(overlap, 2), "%", "communication"))
    notes = [f"{r.label}: exposed {fmt_pct(r.exposed_pct)} of step time, in collectives {fmt_ns(r.comm_ns)}"
             for r in job[:16] if r is not best]
    if len(job) > 1:
        notes.append("judged on the rank with the least exposed communication: the others' extra exposed time "
                     "is waiting for a slower rank (GD603)")
    refs = []
    loc = None
    ddp = ddp_wrappers(ctx)
    if ddp:
        w = ddp[0]
        refs = list(ddp_refs(w, "bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "backend"))
        loc = location_of(w.call_site)
    if p2p:
        sends = ", ".join(dict.fromkeys(n for n in short if _P2P.search(n)))
        instruction = (
            f"The largest part is point-to-point traffic ({sends}): pipeline-parallel sends and receives that "
            "wait for the neighbouring stage. Overlap them with compute (more micro-batches per step, an "
            "interleaved schedule, balanced stages); for the gradient all-reduce, accumulate under "
            "model.no_sync() or compress with a DDP communication hook."
        )
    else:
        instruction = (
            "Hide or shrink the gradient all-reduce: accumulate gradients over several micro-batches under "
            "model.no_sync(), compress them with a bf16/fp16 DDP communication hook, or raise the per-GPU batch"
            + (f" (DDP at {loc})" if loc else "")
            + "."
        )
    if best.device < 0 and ctx.has_gpu():
        instruction += " On CUDA tensors use the NCCL backend (GD604)."
    return ctx.finding(
        message,
        Fix(instruction, _BEFORE, _AFTER),
        share_pct=share,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        settings=refs,
        notes=notes,
        location=loc,
        gain_note=f"exposed communication (threshold {t.comm_exposed_share_pct:g}%); an upper bound: "
        "the last bucket cannot overlap a finished backward",
        rank=best.rank,
        claims=[(Component.COMM_EXPOSED, None)] if len(best.traces) == 1 else (),
        ledger=ctx.ledger(best.traces[0]) if len(best.traces) == 1 else None,
        expected=COMM_COMPRESSION_FRACTION,
        expected_note="a bf16/fp16 communication hook halves the bytes all-reduced, and a bandwidth-bound "
        "all-reduce's time with them",
    )


RULE = Rule(
    code="GD602",
    name="comm-exposed",
    title="Communication not overlapped with compute takes a large share of the step",
    technique="Overlap communication with compute (DDP buckets, no_sync during accumulation)",
    doc=__doc__,
    check=check,
    needs={Need.TRACE},
    self_checked={Need.TRACE},
    not_injectable="trials of distributed jobs are not supported",
)
