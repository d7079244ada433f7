"""GD604 non-nccl-backend: collectives on CUDA tensors go through gloo (or another non-NCCL backend).

What it detects
---------------
A process group whose backend for CUDA tensors is not NCCL (`gloo`, `mpi`,
`ucc`) while the training runs on GPUs: `init_process_group("gloo")` left
over from CPU testing, or a backend string without a `cuda:nccl` entry. Read
from the DDP wrapper's settings (the backend of its process group), from the
trace's `distributedInfo.backend`, and from the collectives in the trace
(`gloo:all_reduce` ranges and no NCCL kernels next to GPU work).

Why it matters
--------------
gloo reduces CUDA tensors by copying them to host memory, reducing on the
CPU and copying back: two PCIe transfers and CPU arithmetic per bucket, where
NCCL reduces on the GPUs over NVLink or PCIe peer-to-peer, overlapped with the
backward kernels. PyTorch's documentation recommends NCCL for distributed GPU
training and gloo for CPU; torch-tb-profiler flags DDP without NCCL.

How to fix
----------
Initialize the process group with NCCL for CUDA tensors (and keep gloo for CPU
tensors when the script also reduces those).

Before:

```python
dist.init_process_group("gloo")
model = DDP(model.cuda(local_rank), device_ids=[local_rank])
```

After:

```python
dist.init_process_group("cpu:gloo,cuda:nccl")   # or simply "nccl"
torch.cuda.set_device(local_rank)
model = DDP(model.cuda(local_rank), device_ids=[local_rank])
```

Evidence used
-------------
Settings: `device_type` (the script put tensors on a GPU) and the DDP
wrapper's `backend` with its `file:line`. Trace: `distributedInfo.backend`,
GPU activity, and the collectives (`TraceMetrics.comm`): gloo ranges on the
host and no NCCL kernels. The exposed communication of the least-exposed rank, when a trace
measures it, sets the severity; GD602 claims that time (docs/account.md).

Thresholds
----------
- `error_share_pct`, `warning_share_pct`: severity from the exposed
  communication share when a trace measures it;
- `unquantified_severity`: without a trace.

Known limits
------------
The gain is an upper bound: NCCL shortens the communication, it does not
remove it. A job that reduces only CPU tensors (metrics, say) over gloo while
the model trains on GPUs without DDP is flagged only when a GPU trace shows
gloo collectives. On AMD GPUs PyTorch's `nccl` backend is RCCL and counts as
NCCL; Intel GPUs (`xccl`) are not judged.

References
----------
- PyTorch distributed backends, which to use:
  https://pytorch.org/docs/stable/distributed.html#which-backend-to-use
- `init_process_group` (device:backend strings):
  https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group
- torch-tb-profiler's DDP recommendation: https://github.com/pytorch/kineto/tree/main/tb_plugin
"""

from __future__ import annotations

from gpudoctor.model.findings import Confidence, Fix, Metric, SettingRef
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.distributed import comm_by_rank, cuda_backend, ddp_wrappers, is_distributed
from gpudoctor.rules.formatting import fmt_pct, location_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult

_NCCL = ("nccl", "rccl")
_BEFORE = """dist.init_process_group("gloo")
model = DDP(model.cuda(local_rank), device_ids=[local_rank])"""
_AFTER = """dist.init_process_group("cpu:gloo,cuda:nccl")   # or simply "nccl"
torch.cuda.set_device(local_rank)
model = DDP(model.cuda(local_rank), device_ids=[local_rank])"""


def check(ctx: RuleContext) -> RuleResult:
    on_gpu = ctx.has_gpu()
    ddp = ddp_wrappers(ctx)
    sources: list[tuple[str, str, object]] = []  # (backend for CUDA tensors, where it was read, location)
    for w in ddp:
        b = str(w.options.get("backend") or "")
        if b:
            sources.append((cuda_backend(b) or b.lower(), f"{w.kind} process group backend {b!r}", location_of(w.call_site)))
    gpu_traces = [m for m in ctx.metrics if m.has_gpu_activity]
    for m in gpu_traces:
        if m.backend:
            sources.append((cuda_backend(m.backend) or m.backend.lower(), f"trace distributedInfo.backend {m.backend!r}", None))
    ranks = comm_by_rank(ctx)
    gpu_ranks = [r for r in ranks if any(m.has_gpu_activity for m in r.traces)]
    kernel_comm = [r for r in gpu_ranks if r.device >= 0]
    host_comm = [r for r in gpu_ranks if r.device < 0]
    if host_comm and not kernel_comm:
        first = host_comm[0].names[0] if host_comm[0].names else "host collectives"
        backend = first.split(":", 1)[0] if ":" in first else ""
        if backend and backend not in _NCCL:
            sources.append((backend, f"{first} ranges next to GPU work and no NCCL kernel in the trace", None))
    if not on_gpu:
        if sources or is_distributed(ctx):
            return RuleResult.not_applicable(f"collectives on CPU tensors: gloo is the backend for them ({ctx.no_gpu_reason()})")
        return RuleResult.not_applicable(ctx.no_gpu_reason())
    if not sources:
        if kernel_comm:
            return RuleResult.fine("NCCL kernels carry the collectives")
        if is_distributed(ctx):
            return RuleResult.cannot_judge("the process group's backend is not recorded (no DDP wrapper seen, no distributedInfo in the traces)")
        return RuleResult.not_applicable("single process: no process group")
    bad = [s for s in sources if s[0] and s[0] not in _NCCL]
    if not bad:
        return RuleResult.fine(f"NCCL for CUDA tensors ({sources[0][1]})")
    backend, where, loc = next((s for s in bad if s[2] is not None), bad[0])
    measured = [r for r in (host_comm or gpu_ranks) if r.exposed_pct is not None]
    share = min((r.exposed_pct for r in measured), default=None) if measured else None
    message = (
        f"collectives on CUDA tensors use the {backend} backend ({where}"
        + (f" at {loc}" if loc else "")
        + "): every all-reduce copies the gradients to host memory and reduces them on the CPU"
        + (f"; exposed communication {fmt_pct(share)} of step time" if share is not None else "")
    )
    metrics = [Metric("backend", backend)]
    if share is not None:
        metrics.append(Metric("comm_exposed_share_pct", round(share, 2), "%", "steps"))
    refs = [SettingRef("process_group.backend", backend, loc)]
    device = ctx.settings.device_type if ctx.settings is not None else ("cuda" if gpu_traces else "")
    if device:
        refs.append(SettingRef("device_type", device))
    notes = [w for _, w, _ in sources[1:4]]
    finding = ctx.finding(
        message,
        Fix(
            'Initialize the process group with NCCL for CUDA tensors: dist.init_process_group("nccl"), or '
            '"cpu:gloo,cuda:nccl" when CPU tensors are reduced too'
            + (f" (the DDP wrapper at {loc} uses {backend})" if loc else "")
            + ".",
            _BEFORE.replace('"gloo"', f'"{backend}"'),
            _AFTER,
        ),
        share_pct=None,
        severity_pct=share,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        settings=refs,
        notes=notes,
        location=loc,
        gain_note=f"exposed communication of the least-exposed rank, {fmt_pct(share)} of its step time (GD602 "
        "claims it); NCCL shortens it, it does not remove it"
        if share is not None
        else "not measured without a trace: NCCL reduces on the GPUs, gloo through host memory",
    )
    return RuleResult.fired(finding)


RULE = Rule(
    code="GD604",
    name="non-nccl-backend",
    title="Collectives on CUDA tensors use a non-NCCL backend (gloo)",
    technique="The NCCL backend for collectives on CUDA tensors",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.SETTINGS},
    self_checked={Need.GPU, Need.SETTINGS},
    not_injectable="trials of distributed jobs are not supported",
)
