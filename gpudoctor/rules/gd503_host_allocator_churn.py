"""GD503 host-allocator-churn: the training process spends its time in the kernel, faulting pages in.

What it detects
---------------
The training process spends a large share of step time in system CPU with
thousands of minor page faults per step: glibc's allocator returns large
blocks to the OS with `munmap`/`madvise` after each step and takes them back
(zero-filled, page by page) on the next one.

Why it matters
--------------
Every freed-and-reallocated large tensor costs one page fault per 4 KiB page.
Measured here: the same CPU training loop at ~5,000 minor faults per step ran
40% slower than at ~1,300. CPU training and CPU-side preprocessing suffer
most.

How to fix
----------
Use an allocator that keeps memory (jemalloc or tcmalloc through
`LD_PRELOAD`), or tell glibc not to give large blocks back
(`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`), as PyTorch's CPU
performance tuning guide recommends.

Before:

```bash
python train.py
```

After:

```bash
LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 python train.py
# or, with glibc only:
MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296 python train.py
```

jemalloc is not part of a base system. Where the run was made on the machine
that judges it, the finding looks for the library (`libjemalloc.so.2` in the
system's and the Python environment's library folders) and names the one it
finds; where there is none, it says how to install it first (`apt-get install
libjemalloc2` on Debian and Ubuntu, `dnf install jemalloc` on Fedora and RHEL,
`conda install -c conda-forge jemalloc` in a conda environment) and puts the
glibc settings, which need nothing installed, first.

Evidence used
-------------
Per-step records (`steps.jsonl`: `sys_cpu_ns`, `user_cpu_ns`,
`minor_faults`, `wall_ns`; a row's CPU figures cover `cpu_steps` steps, itself
and the short steps just before it, so they are judged a reading at a time, over
the wall time of the steps it covers) of the steps outside torch.profiler's windows (its
own event buffers fault pages in: 5,000-12,000 faults per step measured on a
step that has 26 without it; with fewer than 3 such steps the rule cannot
judge), and of those the later half (all of them under 10): glibc raises its
mmap threshold as large blocks are freed, so a short run can fault heavily for its first dozens of steps and then settle at a
few dozen faults per step, the state a long run stays in. Settings:
`LD_PRELOAD`, `MALLOC_*` environment variables. System CPU time is spent
inside the step's other parts (mostly op work), not beside them: the finding
claims no part of the ledger (docs/account.md); its share of step wall time
sets the severity.

Thresholds
----------
- `host_sys_cpu_share_pct` (10): system CPU, % of step wall time.
- `minor_faults_per_step` (1000): median minor faults per step.
- `error_share_pct`, `warning_share_pct`: severity from the system CPU share.

Known limits
------------
Needs per-step resource usage (`gpudoctor profile` on Linux). System time
also comes from I/O and from other syscalls; the page-fault count is what
ties it to the allocator.

References
----------
- PyTorch performance tuning guide, CPU-specific optimizations (allocators):
  https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
- glibc tunables (`mallopt`, `M_MMAP_THRESHOLD`, `M_TRIM_THRESHOLD`):
  https://www.gnu.org/software/libc/manual/html_node/Malloc-Tunable-Parameters.html
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Sequence
from typing import NamedTuple

from gpudoctor.model.findings import Confidence, Finding, Fix, Metric, SettingRef
from gpudoctor.model.run import Injection, StepRecord
from gpudoctor.model.steady import median_int
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_pct
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult

_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
_MIN_STEPS_FOR_HALF = 10  # with fewer readings (see _readings), all of them are judged
_PROFILER_WINDOWS = ("warmup", "active")
_MIN_UNPROFILED_STEPS = 3  # steps outside torch.profiler's windows needed to judge at all
_KEEP_BYTES = "4294967296"  # the fix's value for glibc's thresholds: 4 GiB, larger than any one block
_GLIBC_KNOBS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")
_GLIBC_ONLY = f"MALLOC_MMAP_THRESHOLD_={_KEEP_BYTES} MALLOC_TRIM_THRESHOLD_={_KEEP_BYTES}"
_JEMALLOC = "libjemalloc.so.2"
_INSTALL = ("`apt-get install libjemalloc2` (Debian, Ubuntu), `dnf install jemalloc` (Fedora, RHEL) or "
            "`conda install -c conda-forge jemalloc` (conda: then $CONDA_PREFIX/lib/libjemalloc.so.2)")


def _library_folders() -> list[str]:
    """Where jemalloc's library is looked for: the system's (Debian's multiarch folder first) and the
    Python environment's (conda installs it there)."""
    machine = platform.machine() or "x86_64"
    folders = [f"/usr/lib/{machine}-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/lib64"]
    for prefix in (os.environ.get("CONDA_PREFIX"), sys.prefix, sys.base_prefix):
        if prefix:
            folders.append(os.path.join(prefix, "lib"))
    return list(dict.fromkeys(folders))


def find_jemalloc(folders: list[str] | None = None) -> str | None:
    """The path of jemalloc's library on this machine, or None."""
    for folder in folders if folders is not None else _library_folders():
        path = os.path.join(folder, _JEMALLOC)
        if os.path.isfile(path):
            return path
    return None


def _on_this_machine(ctx: RuleContext) -> bool:
    """Whether the run was made on the machine that judges it (its libraries are this machine's)."""
    mf = ctx.manifest
    return mf is not None and bool(mf.hostname) and mf.hostname == socket.gethostname()


def _jemalloc_advice(ctx: RuleContext) -> tuple[str, str]:
    """The fix's instruction and after when nothing is tuned: jemalloc named where it is installed, how to
    install it where it is not (the glibc settings first: they need nothing), and both where unknown."""
    glibc = f"keep glibc from returning large blocks: {_GLIBC_ONLY}"
    if _on_this_machine(ctx):
        found = find_jemalloc()
        if found is not None:
            return (f"Preload jemalloc (LD_PRELOAD={found}, installed on this machine) or tcmalloc, or {glibc}.",
                    f"LD_PRELOAD={found} python train.py\n# or: {_GLIBC_ONLY} python train.py")
        folders = ", ".join(_library_folders()[:3])
        return (f"Keep glibc from returning large blocks: {_GLIBC_ONLY} (nothing to install). jemalloc, which "
                f"keeps memory too, is not installed on this machine (no {_JEMALLOC} in {folders}, …): install "
                f"it first, with {_INSTALL}, then preload it (LD_PRELOAD=/usr/lib/x86_64-linux-gnu/{_JEMALLOC} "
                "after apt-get).",
                f"{_GLIBC_ONLY} python train.py\n# or, after apt-get install libjemalloc2:\n"
                f"# LD_PRELOAD=/usr/lib/x86_64-linux-gnu/{_JEMALLOC} python train.py")
    return (f"Preload jemalloc or tcmalloc (LD_PRELOAD=<its path>/{_JEMALLOC}; jemalloc is installed with "
            f"{_INSTALL}: apt-get puts it in /usr/lib/x86_64-linux-gnu), or {glibc} (nothing to install).",
            f"LD_PRELOAD=/usr/lib/x86_64-linux-gnu/{_JEMALLOC} python train.py  # after apt-get install libjemalloc2\n"
            f"# or: {_GLIBC_ONLY} python train.py")


class _Reading(NamedTuple):
    """One getrusage reading: the CPU figures of ``steps`` consecutive steps and their wall time."""

    wall_ns: int
    user_ns: int
    sys_ns: int
    faults: int
    steps: int
    window: str

    @property
    def faults_per_step(self) -> int:
        return round(self.faults / self.steps)


def _readings(steps: Sequence[StepRecord]) -> list[_Reading]:
    """The readings among ``steps`` (in order): a row with CPU figures covers ``cpu_steps`` steps
    ending at it; a reading whose steps are not all among ``steps`` is left out."""
    out: list[_Reading] = []
    walls: list[int] = []  # consecutive steps just before, without figures of their own
    prev = None
    for s in steps:
        if prev is not None and s.index != prev + 1:
            walls = []
        prev = s.index
        if s.sys_cpu_ns is None or s.minor_faults is None:
            walls.append(s.wall_ns)
            continue
        k = max(1, s.cpu_steps or 1)
        if len(walls) >= k - 1:
            before = sum(walls[len(walls) - k + 1 :]) if k > 1 else 0
            out.append(_Reading(before + s.wall_ns, s.user_cpu_ns or 0, s.sys_cpu_ns, s.minor_faults, k, s.window))
        walls = []
    return out


def check(ctx: RuleContext) -> RuleResult:
    t = ctx.thresholds
    readings = _readings(ctx.steady_steps())
    if not readings:
        return RuleResult.cannot_judge(
            "no per-step CPU usage (sys_cpu_ns, minor_faults in steps.jsonl: `gpudoctor profile` on Linux)"
        )
    # torch.profiler's own buffers fault pages in (and take system CPU) during its window: not the
    # script's allocator. Readings under it are never judged; too few outside it judge nothing.
    unprofiled = [r for r in readings if r.window not in _PROFILER_WINDOWS]
    if sum(r.steps for r in unprofiled) < _MIN_UNPROFILED_STEPS:
        return RuleResult.cannot_judge(
            f"{sum(r.steps for r in unprofiled)} steady step(s) ran outside torch.profiler's window, whose own "
            f"buffers fault pages in (needs {_MIN_UNPROFILED_STEPS}): profile more steps (--steps)"
        )
    readings = unprofiled
    # glibc raises its mmap threshold as large blocks are freed: a short run can spend its first
    # steps faulting and then settle. Judge the later half, the state a long run stays in.
    warmup = len(readings) // 2 if len(readings) >= _MIN_STEPS_FOR_HALF else 0
    early_faults = median_int(r.faults_per_step for r in readings[:warmup]) if warmup else None
    early_steps = sum(r.steps for r in readings[:warmup])
    readings = readings[warmup:]
    n_steps = sum(r.steps for r in readings)
    wall = sum(r.wall_ns for r in readings)
    sys_ns = sum(r.sys_ns for r in readings)
    user_ns = sum(r.user_ns for r in readings)
    share = 100.0 * sys_ns / wall if wall else 0.0
    faults = median_int(r.faults_per_step for r in readings) or 0
    env = ctx.settings.env if ctx.settings is not None else {}
    preload = env.get("LD_PRELOAD", "")
    allocator = next((a for a in _ALLOCATORS if a in preload), None)
    knobs = {k: v for k, v in env.items() if k in _GLIBC_KNOBS}
    which = f"the last {n_steps} steady steps" if warmup else f"{n_steps} steady steps"
    if share < t.host_sys_cpu_share_pct or faults < t.minor_faults_per_step:
        extra = f"; {allocator} preloaded" if allocator else ""
        if early_faults is not None and early_faults >= t.minor_faults_per_step:
            extra += f"; the {early_steps} steps before had {early_faults} faults per step: the allocator settled"
        return RuleResult.fine(
            f"system CPU {fmt_pct(share)} of step time, {faults} minor faults per step over {which} (thresholds "
            f"{t.host_sys_cpu_share_pct:g}%, {t.minor_faults_per_step:g}){extra}"
        )
    message = (
        f"the training process spends {fmt_pct(share)} of step time in system CPU with {faults} minor page faults "
        f"per step (median of {which}): the allocator returns memory to the OS and faults it back in"
    )
    if allocator:
        instruction = (
            f"{allocator} is preloaded but the faults remain: tune it to keep memory (e.g. jemalloc's "
            "MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1) or look for large per-step allocations in Python."
        )
        after = (f"MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 LD_PRELOAD={preload} python train.py"
                 if allocator == "jemalloc" else f"LD_PRELOAD={preload} python train.py  # tuned to keep memory")
    elif knobs:
        found = find_jemalloc() if _on_this_machine(ctx) else None
        where = (f"LD_PRELOAD={found}, installed on this machine" if found else
                 f"LD_PRELOAD=…/{_JEMALLOC}; jemalloc is installed with {_INSTALL}")
        instruction = (f"glibc knobs {', '.join(knobs)} are set but the faults remain: preload jemalloc or tcmalloc "
                       f"({where}).")
        after = f"LD_PRELOAD={found or '/usr/lib/x86_64-linux-gnu/' + _JEMALLOC} python train.py"
    else:
        instruction, after = _jemalloc_advice(ctx)
    settings = [SettingRef("LD_PRELOAD", preload or None)] + [SettingRef(k, v) for k, v in sorted(knobs.items())]
    finding = ctx.finding(
        message,
        Fix(instruction, "python train.py", after),
        share_pct=None,
        severity_pct=share,
        confidence=Confidence.MEASURED,
        metrics=[
            Metric("sys_cpu_share_pct", round(share, 2), "%", f"{n_steps} steps"),
            Metric("sys_cpu_ns", sys_ns, "ns"),
            Metric("user_cpu_ns", user_ns, "ns"),
            Metric("minor_faults_per_step", faults, "count"),
        ],
        settings=settings,
        gain_note=f"system CPU time of the training process, {fmt_pct(share)} of step wall time (CPU time inside the "
        "step's parts, not a part of its own); an allocator that keeps memory removes most of it",
    )
    return RuleResult.fired(finding)


def inject(finding: Finding, ctx: RuleContext) -> tuple[Injection, ...] | str:
    """--verify: glibc told to keep large blocks (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, as the
    fix gives them) when nothing is tuned yet; jemalloc told to keep memory when it is preloaded."""
    env = ctx.settings.env if ctx.settings is not None else {}
    preload = env.get("LD_PRELOAD", "")
    allocator = next((a for a in _ALLOCATORS if a in preload), None)
    if allocator == "jemalloc":
        conf = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
        return (Injection("env", "MALLOC_CONF", conf, text=f"MALLOC_CONF={conf} (jemalloc keeps freed memory)"),)
    if allocator:
        return f"{allocator} is preloaded: tuning it is left to you"
    if any(k in env for k in _GLIBC_KNOBS):
        return "glibc's knobs are set already: preloading jemalloc or tcmalloc is left to you (gpudoctor picks no library)"
    return tuple(
        Injection("env", k, _KEEP_BYTES, text=f"{k}={_KEEP_BYTES}")
        for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    )


RULE = Rule(
    code="GD503",
    name="host-allocator-churn",
    title="System CPU time and page faults from the host allocator",
    doc=__doc__,
    check=check,
    needs={Need.STEPS},
    needs_reasons={Need.STEPS: "no per-step CPU usage (sys_cpu_ns, minor_faults in steps.jsonl: `gpudoctor profile` on Linux)"},
    inject=inject,
)
