"""How busy the machine was: the training's own processes against everything else on it.

``host_load`` summarises a run's samples (``samples.jsonl``) over a span of it, usually
its steps: the CPU of the training's process tree (the training process, its DataLoader
workers and children), the CPU of the whole machine (``HostSample``, every process), and
the difference, what *other* work took; the steal the hypervisor reports; the time the
training process's threads waited in the run queue for a core (Linux schedstat).

Used by ``--verify`` (is the load the same on both sides of a comparison, and how busy
was the machine?), by GD205 (other processes competing for the CPU) and by GD201 (the cores
free for a loading that computes). Each figure is
the mean over the sample instants in the span (the sampler's own tick; a process is
sampled from its second tick on). The sampler runs in gpudoctor's parent process, whose
own CPU (a few % of one core) counts as other work.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpudoctor.model import HostLoad, Samples, StepRecord

__all__ = ["TRAINING_ROLES", "StepCompute", "free_cores", "host_load", "step_compute"]

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


def free_cores(load: HostLoad | None, cores: int | None) -> float | None:
    """The cores other processes left to the training over the span of ``load``: the machine's cores
    less what everything else used (``others_cpu_pct``, 100 = one core); None where either is unknown."""
    if load is None or load.others_cpu_pct is None or not cores:
        return None
    return max(0.0, cores - load.others_cpu_pct / 100.0)


@dataclass(frozen=True, slots=True)
class StepCompute:
    """The step's own work per batch, over a set of steps: each step's time outside its data wait
    (``wall_ns - min(data_wait_ns, wall_ns)``) divided by its batches.

    While a loop waits for data, the CPU goes cold (clocks step down, caches and the intra-op
    thread pool's workers go to sleep), and the work that follows a wait runs slower than the same
    work back to back (issue 42: a 2-layer MLP step took 0.39 ms back to back and 2.67 ms after each
    30 ms sleep). Once workers hide the wait, the loop's compute runs warm: a model of the loop
    without the wait takes ``warm_ns``, the bound takes ``least_ns``."""

    warm_ns: float  # the ``quantile_pct`` quantile of the per-step compute: what the work takes when its data is ready
    cold_ns: float  # the median: what it takes as the run ran (after a wait, where the loop waits)
    mean_ns: float  # the mean (total ÷ batches): the step time's own share of compute
    least_ns: float  # the least any step took: the floor of a bound
    steps: int
    quantile_pct: float

    @property
    def cold_ratio(self) -> float:
        """How much slower the median step's work ran than the warm figure (1: no difference)."""
        return self.cold_ns / self.warm_ns if self.warm_ns > 0 else 1.0


def step_compute(steps: Sequence[StepRecord], micro: int = 1, quantile_pct: float = 10.0) -> StepCompute | None:
    """The compute per batch of ``steps`` (:class:`StepCompute`; ``micro`` batches per step): the warm
    figure is the ``quantile_pct`` quantile (numpy's linear interpolation between the order statistics)
    of the steps' time outside the data wait. None without steps."""
    if not steps:
        return None
    per = np.array([(s.wall_ns - min(s.data_wait_ns, s.wall_ns)) / max(1, micro) for s in steps], dtype=np.float64)
    q = min(100.0, max(0.0, quantile_pct))
    return StepCompute(
        warm_ns=float(np.percentile(per, q)),
        cold_ns=float(np.median(per)),
        mean_ns=float(per.mean()),
        least_ns=float(per.min()),
        steps=len(per),
        quantile_pct=q,
    )
