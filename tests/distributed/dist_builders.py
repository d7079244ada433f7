"""Hand-built per-rank traces for the distributed tests: ProfilerStep windows with collectives."""

from __future__ import annotations

from rule_builders import MS, cpu_trace, trace

from gpudoctor.model import CommStats, NameStat, StepComm, StepWindow


def rank_trace(rank: int, world: int, steps_ms: list[float], exposed_ms: list[float], *,
               comm_ms: list[float] | None = None, gpu: bool = False, first_step: int = 10,
               backend: str = "gloo", name: str = "gloo:all_reduce", device: int | None = None):
    """A trace of ``rank`` whose ProfilerStep windows last ``steps_ms`` with ``exposed_ms`` of them
    exposed communication (``comm_ms`` in collectives, default: twice the exposed time). The
    collectives are kernels on GPU 0 with ``gpu``, else host ranges (``device`` overrides)."""
    comm_ms = comm_ms if comm_ms is not None else [2 * x for x in exposed_ms]
    windows, per_step = [], []
    t = 0
    for i, (d, x, c) in enumerate(zip(steps_ms, exposed_ms, comm_ms, strict=True)):
        windows.append(StepWindow(first_step + i, t, t + int(d * MS)))
        per_step.append(StepComm(first_step + i, int(d * MS), int(c * MS), int(x * MS)))
        t += int(d * MS)
    comm_ns = sum(p.comm_ns for p in per_step)
    exposed_ns = sum(p.exposed_ns for p in per_step)
    comm = CommStats(
        device=device if device is not None else (0 if gpu else -1),
        kernel_count=len(windows) if gpu and device != -1 else 0,
        comm_ns=comm_ns,
        exposed_ns=exposed_ns,
        exposed_pct=100.0 * exposed_ns / comm_ns if comm_ns else None,
        host_ops=len(windows),
        host_ns=comm_ns,
        top=(NameStat(name, len(windows), comm_ns),),
        per_step=tuple(per_step),
    )
    build = trace if gpu else cpu_trace
    return build(path=f"host_{1000 + rank}.00000010.pt.trace.json.gz", rank=rank, world_size=world,
                 steps=tuple(windows), comm=(comm,), backend=backend, step_source="ProfilerStep")


def synchronized(slow_rank: int | None, world: int = 3, extra_ms: float = 20.0, n: int = 5):
    """DDP-like: every rank's step lasts as long as the slowest; the others wait in the all-reduce."""
    work = {r: [10.0 + 0.1 * i + 0.05 * r for i in range(n)] for r in range(world)}
    if slow_rank is not None:
        work[slow_rank] = [w + extra_ms for w in work[slow_rank]]
    step = [max(work[r][i] for r in range(world)) + 2.0 for i in range(n)]  # 2 ms of real all-reduce
    return tuple(
        rank_trace(r, world, step, [s - w for s, w in zip(step, work[r], strict=True)]) for r in range(world)
    )
