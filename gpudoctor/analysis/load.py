"""How busy the machine was: the training's own processes against everything else on it.

``host_load`` summarises a run's samples (``samples.jsonl``) over a span of it, usually
its steps: the CPU of the training's process tree (the training process, its DataLoader
workers and children), the CPU of the whole machine (``HostSample``, every process), and
the difference, what *other* work took; the steal the hypervisor reports; the time the
training process's threads waited in the run queue for a core (Linux schedstat).

Used by ``--verify`` (is the load the same on both sides of a comparison, and how busy
was the machine?) and by GD205 (other processes competing for the CPU). Each figure is
the mean over the sample instants in the span (the sampler's own tick; a process is
sampled from its second tick on). The sampler runs in gpudoctor's parent process, whose
own CPU (a few % of one core) counts as other work.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from gpudoctor.model import HostLoad, Samples

__all__ = ["TRAINING_ROLES", "host_load"]

TRAINING_ROLES = ("main", "worker", "child", "launcher")  # ProcessSample.role: every process of the run's tree


def host_load(samples: Samples | None, lo_ns: int | None = None, hi_ns: int | None = None) -> HostLoad | None:
    """The machine's load over ``[lo_ns, hi_ns]`` of the run (all of it when None); None when no
    process sample of the training falls in the span."""
    if samples is None:
        return None

    def inside(t_ns: int) -> bool:
        return (lo_ns is None or t_ns >= lo_ns) and (hi_ns is None or t_ns <= hi_ns)

    tree: dict[int, float] = defaultdict(float)  # t_ns -> the training tree's CPU (100 = one core)
    waits: list[float] = []
    for p in samples.process:
        if p.role not in TRAINING_ROLES or not inside(p.t_ns):
            continue
        tree[p.t_ns] += p.cpu_pct
        if p.role == "main" and p.runq_wait_pct is not None:
            waits.append(p.runq_wait_pct)
    if not tree:
        return None
    hosts = [h for h in samples.host if inside(h.t_ns)]
    system = others = steal = running = None
    if hosts:
        system = statistics.fmean(h.cpu_pct for h in hosts)
        # the same tick's process samples: what the training's tree took of the machine's busy time
        others = statistics.fmean(max(0.0, h.cpu_pct - tree.get(h.t_ns, 0.0)) for h in hosts if h.t_ns in tree) \
            if any(h.t_ns in tree for h in hosts) else None
        stolen = [h.steal_pct for h in hosts if h.steal_pct is not None]
        steal = statistics.fmean(stolen) if stolen else None
        runnable = [h.procs_running for h in hosts if h.procs_running is not None]
        running = statistics.fmean(runnable) if runnable else None
    return HostLoad(
        samples=len(tree),
        cores=samples.system_cpu_count,
        training_cpu_pct=round(statistics.fmean(tree.values()), 1),
        runq_wait_pct=round(statistics.fmean(waits), 1) if waits else None,
        system_cpu_pct=round(system, 1) if system is not None else None,
        others_cpu_pct=round(others, 1) if others is not None else None,
        steal_pct=round(steal, 1) if steal is not None else None,
        procs_running=round(running, 2) if running is not None else None,
    )
