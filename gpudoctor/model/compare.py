"""Before and after: what ``gpudoctor compare A B`` computes and its renderers show.

``analysis.compare.compare_runs`` builds a ``Comparison`` from two analysed runs (and
their reports); every number in it is computed there once, with its unit and the
window it is of, and the renderers only lay it out. Durations are integer
nanoseconds (``*_ns``), shares percentages (``*_pct``, of the window named beside
them), deltas are B minus A (percentage points for percentages). A speed-up is A's
median step time over B's: above 1, B is faster.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gpudoctor.model._serde import Serde
from gpudoctor.model.findings import Location
from gpudoctor.model.run import CallSite

COMPARISON_SCHEMA_VERSION = 1


class StepTimeVerdict(str, Enum):
    FASTER = "faster"  # B's steps are shorter, beyond step-to-step noise and the run-to-run margin
    SLOWER = "slower"  # B's steps are longer, same tests
    WITHIN_NOISE = "within_noise"  # the difference is not distinguishable from noise (or under the margin)
    TOO_FEW_STEPS = "too_few_steps"  # a side has fewer steps than the test needs: cannot tell
    NOT_MEASURED = "not_measured"  # a side has no step times at all


class FindingStatus(str, Enum):
    FIXED = "fixed"  # in A; B was judged by the same rule and it stayed silent
    REMAINING = "remaining"  # in both
    NEW = "new"  # in B only
    NOT_JUDGED = "not_judged"  # in A only, but B's run could not be judged by that rule (no evidence, not run)


@dataclass(frozen=True, slots=True)
class RunSide(Serde):
    """One side of the comparison: what was run, where, and how it ended."""

    label: str  # "A" (before) or "B" (after)
    source: str  # the path given on the command line
    kind: str  # "run" (a run directory) or "trace" (Kineto traces without a run directory)
    run_id: str = ""
    script: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()  # the script's arguments (sys.argv[1:])
    started_at: str = ""
    status: str = ""  # "stopped after 40 steps", "completed", "failed (…)" (Manifest.status_text)
    devices: tuple[str, ...] = ()  # GPU names, from the manifest or the traces
    device_type: str = ""  # "cuda" / "cpu" from the settings
    host: str = ""
    torch_version: str = ""
    world_size: int | None = None
    steps_recorded: int = 0  # lines of steps.jsonl
    traces: int = 0
    findings: int | None = None  # findings of its report (None: not diagnosed)


@dataclass(frozen=True, slots=True)
class StepTimes(Serde):
    """One side's step times: the sample the step-time comparison is of."""

    count: int
    median_ns: int
    p90_ns: int  # nearest-rank
    mean_ns: int
    min_ns: int
    max_ns: int
    window: str  # which steps: "38 steady steps outside the profiler windows (steps.jsonl)"


@dataclass(frozen=True, slots=True)
class StepTimeChange(Serde):
    """Median step time before and after, the speed-up, and whether it is beyond noise.

    The noise judgement, one decision: a bootstrap confidence interval of the speed-up
    (``ci_low`` .. ``ci_high``, ``confidence_pct``) and the bootstrap test of "no change"
    from the same resamples (``p_value``), which agree by construction: the interval
    excludes 1 exactly when ``p_value`` < 1 − confidence. B is called faster or slower
    when it does and the change is at least ``min_change_pct`` (the run-to-run margin).
    """

    basis: str  # "plain_steps", "steady_steps", "profiler_steps" or "" (not measured)
    basis_text: str  # what the step times are, in words
    verdict: StepTimeVerdict
    verdict_text: str  # one line with the numbers filled in
    a: StepTimes | None = None
    b: StepTimes | None = None
    speedup: float | None = None  # A median / B median (per sample when the batch size changed)
    change_pct: float | None = None  # (B - A) / A of the median, in % (positive: B slower)
    ci_low: float | None = None  # bootstrap confidence interval of ``speedup``
    ci_high: float | None = None
    confidence_pct: float = 95.0
    p_value: float | None = None  # bootstrap test of speed-up 1, two-sided, from the interval's resamples (resolution 1/resamples)
    test: str = ""  # "bootstrap test of the ratio of medians (the interval's resamples)", or the stratified one
    min_steps: int = 0  # steps each side needs before the test is trusted
    min_change_pct: float = 0.0  # smaller changes are within run-to-run variation
    per_sample: bool = False  # the batch size changed: speed-up and test are on step time / batch size
    batch_size_a: int | None = None
    batch_size_b: int | None = None


@dataclass(frozen=True, slots=True)
class MetricChange(Serde):
    """One headline figure before and after (data-wait share, GPU idle, throughput, …)."""

    key: str  # "data_wait_share", "gpu_idle", "host_sync_share", "throughput", "gpu_util_nvml"
    label: str  # "waiting for data"
    unit: str  # unit of ``a`` and ``b``: "%", "samples/s", "ns"
    a: float | None
    b: float | None
    delta: float | None = None  # b - a
    delta_unit: str = ""  # "pp" (percentage points) for percentages, else ``unit``
    window_a: str = ""  # what A's value is of ("38 steady steps", "5 ProfilerStep windows (#10..#14)")
    window_b: str = ""
    improved: bool | None = None  # True: B better, False: B worse, None: no change or unknown
    note: str = ""  # why a side is missing, or how the windows differ


@dataclass(frozen=True, slots=True)
class ComponentChange(Serde):
    """One component of the step breakdown before and after."""

    component: str  # Component.value
    a_pct: float | None  # share of step time (of A's breakdown window)
    b_pct: float | None
    delta_pp: float | None
    a_ns: int | None  # mean time per profiled step
    b_ns: int | None
    delta_ns: int | None


@dataclass(frozen=True, slots=True)
class BreakdownChange(Serde):
    rows: tuple[ComponentChange, ...]
    window_a: str  # "3 ProfilerStep windows (#3..#5)" or "the whole trace (no ProfilerStep markers)"
    window_b: str
    steps_a: int  # breakdown windows (profiled steps) on each side
    steps_b: int
    step_mean_a_ns: int | None = None  # mean duration of those windows
    step_mean_b_ns: int | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FindingChange(Serde):
    """A rule's findings before and after (grouped by code and rank)."""

    code: str
    name: str
    status: FindingStatus
    rank: int | None = None
    severity_a: str | None = None  # the most severe finding of the group on each side
    severity_b: str | None = None
    share_a_pct: float | None = None  # share of step time at stake (the group's largest)
    share_b_pct: float | None = None
    delta_pp: float | None = None
    count_a: int = 0
    count_b: int = 0
    message_a: str = ""  # the top finding's message
    message_b: str = ""
    location: Location | None = None  # B's when it has one, else A's
    note: str = ""  # why a finding gone from B is not called fixed, or that A could not judge a new one


@dataclass(frozen=True, slots=True)
class SettingChange(Serde):
    """A setting whose value differs between the runs, with where each run set it."""

    category: str  # "DataLoader", "optimizer", "AMP", "flags", "torch.compile", "wrapping", "threads", "environment", "device", "profiler"
    name: str  # "DataLoader(EncodedImages).num_workers"
    a: str  # the value as Python spells it, "absent" or "unknown"
    b: str
    site_a: CallSite | None = None
    site_b: CallSite | None = None


@dataclass(frozen=True, slots=True)
class Comparison(Serde):
    schema_version: int
    gpudoctor_version: str
    created_at: str
    a: RunSide
    b: RunSide
    headline: str  # one line: the verdict on step time and what happened to the findings
    step_time: StepTimeChange
    kind: str = "compare"
    metrics: tuple[MetricChange, ...] = ()
    breakdown: BreakdownChange | None = None
    breakdown_note: str = ""  # why there is no breakdown comparison
    findings: tuple[FindingChange, ...] = ()  # fixed, remaining, new, not judged; by code within each
    findings_summary: str = ""  # "1 fixed (GD201), 0 remaining, 1 new (GD203)"
    findings_compared: bool = False  # both sides were diagnosed
    settings: tuple[SettingChange, ...] = ()
    settings_note: str = ""  # "no settings.json on side B (a bare trace): settings not compared"
    warnings: tuple[str, ...] = ()  # different scripts, arguments, devices, batch sizes, schedules …
    notes: tuple[str, ...] = ()
