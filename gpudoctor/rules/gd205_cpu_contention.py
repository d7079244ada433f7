"""GD205 cpu-contention: other processes on the machine take the cores the training needs.

What it detects
---------------
The training process keeps waiting in the run queue for a core while its own
threads (it and its DataLoader workers) want no more cores than the machine
has: other processes hold them (another job, a build, a neighbour on a shared
VM). It measures the waiting (Linux schedstat) and, where recorded, what every
other process on the machine used.

Why it matters
--------------
A thread that waits for a core does nothing: each step takes longer by the
time its critical thread waited, the GPU idles meanwhile, and the run's
figures (and `--verify`'s trial runs) measure the other jobs as much as the
script. The waits come in whole scheduler time slices on a few steps: the mean
step grows while the median hardly moves (docs/account.md, "GD205").

How to fix
----------
Give the training cores nobody else uses: stop or move the other jobs (`top`),
pin the training and the other work to separate cores (`taskset`, cpusets,
`docker run --cpuset-cpus`, Slurm's `--cpus-per-task`), or `nice` the other
work. Profile again once the machine is quiet.

Before:

```bash
python train.py &            # both on the same cores
python preprocess_next_shard.py
```

After:

```bash
taskset -c 0-5 python train.py &                     # the training's own cores
taskset -c 6-7 nice -n 10 python preprocess_next_shard.py
```

Evidence used
-------------
psutil samples of the training process and its workers (`samples.jsonl`):
`cpu_pct` and `runq_wait_pct` (time runnable but waiting for a core, from
schedstat); the training process's mean wait is the share of the time it lost,
the median of the process tree's CPU + wait the cores its own threads want.
Where the run recorded the machine's load (`"host"` samples), the CPU other
processes used and the steal are shown, and the waiting is put on them only
when they used at least `cpu_contention_others_pct`. The waiting is spread over
every part of the step, so the finding claims no part of the ledger.

Thresholds
----------
- `cpu_contention_wait_pct` (10): the training process waited for a core at
  least this share of the time (100 = one thread waiting all the time).
- `cpu_contention_others_pct` (50): other processes used at least this much
  CPU (100 = one core), where the machine's load was recorded.
- `error_share_pct`, `warning_share_pct`: severity from the share of the time
  the training process waited.

Known limits
------------
The run-queue wait is read from Linux's schedstat: elsewhere (macOS,
Windows) or on a run directory without it, the rule says it cannot judge.
When the training's own threads want more cores than there are, the waiting
is theirs (GD204's case) and this rule stands aside. Runs recorded before the
machine's load was sampled show the waiting without the other processes'
CPU. A container limited by a CPU quota (cgroup `cpu.max`) is throttled
rather than queued: that shows as less CPU, not as run-queue wait.
The machine's load adds this finding and removes none of the script's: a loop
that waits for data is still GD201's, sized to the free cores where the loading
computes; only where those workers already run does GD201 leave the case here.

References
----------
- Linux scheduler statistics (`/proc/<pid>/schedstat`: time on the CPU, time waiting on a run queue):
  https://docs.kernel.org/scheduler/sched-stats.html
- psutil, system-wide CPU times (steal, iowait):
  https://psutil.readthedocs.io/en/latest/#psutil.cpu_times
- taskset(1), pinning a process to cores:
  https://man7.org/linux/man-pages/man1/taskset.1.html
"""

from __future__ import annotations

from gpudoctor.model.findings import Confidence, Fix, Metric
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.load_model import loader_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult

_BEFORE = "python train.py &            # both on the same cores\npython preprocess_next_shard.py\n"
_AFTER = (
    "taskset -c 0-5 python train.py &                     # the training's own cores\n"
    "taskset -c 6-7 nice -n 10 python preprocess_next_shard.py\n"
)


def check(ctx: RuleContext) -> RuleResult:
    t = ctx.thresholds
    cores = ctx.cpu_count()
    d = loader_of(ctx).demand
    load = ctx.figures.host.load  # over the steps (the run's figures)
    if d is None or load is None or load.runq_wait_pct is None or cores is None:
        return RuleResult.cannot_judge(
            "no run-queue wait of the training process was recorded (Linux schedstat) or no core count: "
            "the time it waited for a core cannot be told"
        )
    wait = load.runq_wait_pct
    others = load.others_cpu_pct
    # summed over the process's threads: 100 = one thread waiting all the time
    waited = (f"waited for a core {wait:.1f}% of the time" if wait <= 100.0
              else f"kept {wait / 100:.1f} threads waiting for a core on average")
    seen = f"the training process {waited} (mean of {load.samples} samples)"
    if d.tree > cores:
        return RuleResult.not_applicable(
            f"{seen}, but its own threads want {d.tree:.1f} cores of {cores}: the waiting is theirs (GD204)"
        )
    if wait < t.cpu_contention_wait_pct:
        return RuleResult.fine(f"{seen}; threshold {t.cpu_contention_wait_pct:g}%")
    if others is not None and others < t.cpu_contention_others_pct:
        return RuleResult.fine(
            f"{seen}, but other processes used only {others / 100:.2f} cores (under "
            f"{t.cpu_contention_others_pct / 100:.2f}): the waiting is not theirs to answer for"
        )
    busy = (
        f"; other processes used {others / 100:.2f} of the {cores} cores"
        + (f" (steal {load.steal_pct / 100:.2f})" if load.steal_pct else "")
        if others is not None else " (the other processes' CPU was not recorded in this run)"
    )
    message = (
        f"Other processes compete for the CPU: {seen}{busy}, while the training's own threads want "
        f"{d.tree:.1f} of the {cores} cores"
    )
    instruction = (
        "Give the training cores nobody else uses: stop or move the other jobs (top shows them), pin the "
        "training and the other work to separate cores (taskset, cgroup cpusets, docker --cpuset-cpus), or "
        "lower the other work's priority (nice); then profile again: this run's figures describe the busy "
        "machine as much as the script."
    )
    metrics = [
        Metric("runq_wait_pct", round(wait, 1), "%", "training process, mean over the steps"),
        Metric("training_cpu_pct", round(load.training_cpu_pct, 1), "%", "training process tree, 100 = one core"),
        Metric("runnable_threads", round(d.tree, 2), "count", "training process and workers, on a core or waiting"),
        Metric("cpu_count", cores, "count"),
    ]
    if others is not None:
        metrics.append(Metric("others_cpu_pct", round(others, 1), "%", "other processes, 100 = one core"))
    if load.system_cpu_pct is not None:
        metrics.append(Metric("system_cpu_pct", round(load.system_cpu_pct, 1), "%", "every process, 100 = one core"))
    if load.steal_pct is not None:
        metrics.append(Metric("steal_pct", round(load.steal_pct, 1), "%", "taken by the hypervisor, 100 = one core"))
    finding = ctx.finding(
        message,
        Fix(instruction, _BEFORE, _AFTER),
        share_pct=None,
        severity_pct=min(100.0, wait),
        confidence=Confidence.MEASURED,
        metrics=metrics,
        gain_note=(
            f"the training process {waited}; not a share of step time (the waiting falls inside every part "
            "of the step)"
        ),
    )
    return RuleResult.fired(finding)


RULE = Rule(
    code="GD205",
    name="cpu-contention",
    title="Other processes take the cores the training needs",
    doc=__doc__,
    check=check,
    needs={Need.SAMPLES},
    not_injectable="the other processes are outside the script: free the cores, then profile (and verify) again",
)
