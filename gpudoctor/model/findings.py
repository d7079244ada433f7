"""Findings, the checklist and the report: what rules produce and renderers show."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from gpudoctor.model._serde import Serde
from gpudoctor.model.metrics import Ledger, TraceMetrics
from gpudoctor.model.run import Manifest, PstatsEntry, Samples, Settings, StepRecord
from gpudoctor.model.verify import Verification

REPORT_SCHEMA_VERSION = 8  # 8: Ledger.weight (WindowWeight: the accounting window against the unprofiled steps), KernelStats.fp32_conv_op_ns; 7: Report.warnings; 6: Fix.edits / source / illustration / automatic (Edit); 5: Verification by runs (per_run, load_*, looks, median_*, ladder, measured_best; statistic "throughput"), Samples.host / HostSample, Samples.system_memory_bytes, PstatsEntry.loader_tottime_s/loader_cumtime_s, TraceMetrics.compiled, Settings.compile, GpuSample app/max clocks, power limit, throttle_read; 4: Gain.expected_* (the expected gain beside the bound), Action.expected_pct, step_ns_expected; 2: the account (Report.account, TraceMetrics.ledger), claims, no_problem_seen; breakdown is the ledger; 3: StepRecord.cpu_steps


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """0 for the most severe."""
        return {"error": 0, "warning": 1, "info": 2}[self.value]


class Confidence(str, Enum):
    MEASURED = "measured"  # read from the trace / samples of this run
    INFERRED = "inferred"  # derived from measurements plus an assumption
    STATIC = "static"  # read from the source code (`gpudoctor check`)


@dataclass(frozen=True, slots=True)
class Location(Serde):
    """A place in the user's source code."""

    file: str
    line: int
    col: int | None = None  # 1-based, when known (static checks)
    function: str = ""

    def __str__(self) -> str:
        s = f"{self.file}:{self.line}"
        return f"{s}:{self.col}" if self.col else s


@dataclass(frozen=True, slots=True)
class Metric(Serde):
    name: str  # "data_wait_share"
    value: float | int | str | bool | None
    unit: str = ""  # "%", "ms", "bytes", "GB/s", "count" …
    window: str = ""  # which window a percentage is of ("steps", "span", …)


@dataclass(frozen=True, slots=True)
class TimeRange(Serde):
    start_ns: int
    end_ns: int
    label: str = ""  # "ProfilerStep#12", "idle gap (sync)" …


@dataclass(frozen=True, slots=True)
class SettingRef(Serde):
    name: str  # "DataLoader.num_workers"
    value: Any
    location: Location | None = None


@dataclass(frozen=True, slots=True)
class Evidence(Serde):
    metrics: tuple[Metric, ...] = ()
    time_ranges: tuple[TimeRange, ...] = ()
    settings: tuple[SettingRef, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Claim(Serde):
    """A part of a ledger (docs/account.md) that a finding's fix would win back."""

    component: str  # Component.value: "data_loading", "sync_wait", …
    ledger: str  # Ledger.key of the ledger the part is of
    requested_ns: int  # what the finding measured of the part (at most the whole part)
    granted_ns: int  # what it was granted: no more than the part less what its owners took first
    part_ns: int  # the whole part, in that ledger
    total_ns: int  # the ledger's time (all its windows)


@dataclass(frozen=True, slots=True)
class Gain(Serde):
    """What fixing it is worth: the share of step time at stake (an upper bound), and what the
    fix is expected to win.

    A finding that claims parts of a ledger gains its granted, exclusive share of them: the
    gains of the findings of one ledger add up to at most its time (docs/account.md). That
    share is an **upper bound**: the step after the fix is at least ``1 - share`` of it. The
    *expected* share comes from the model stated in the rule's documentation (Tensor Core
    speed-ups, the workers recommended, pinned bandwidth …): ``expected_fraction`` of the
    granted share, so that it never exceeds the bound and shrinks with it when another
    finding wins the time first."""

    share_pct: float | None  # of step time; None when it cannot be put in time (static)
    speedup_bound: float | None  # 1 / (1 - share): the most the fix can give
    note: str = ""  # how it was estimated
    claims: tuple[Claim, ...] = ()  # the ledger parts it claims; share_pct is what they were granted
    included_in: tuple[str, ...] = ()  # codes of findings that own part of what it claims ("included in GD102")
    expected_share_pct: float | None = None  # of step time, by the rule's model (<= share_pct); None: no model
    expected_speedup: float | None = None  # 1 / (1 - expected share)
    expected_fraction: float | None = None  # the share of its time at stake the rule's model expects the fix to win
    expected_note: str = ""  # the model, with its factors filled in
    heads: tuple[str, ...] = ()  # ledger parts this finding heads without claiming them: the findings granted them are its fixes

    @property
    def rank_pct(self) -> float | None:
        """What ranks it: the expected share where the rule has a model, else the bound."""
        return self.expected_share_pct if self.expected_share_pct is not None else self.share_pct


@dataclass(frozen=True, slots=True)
class Edit(Serde):
    """One mechanical change of the user's source: what ``gpudoctor check --fix`` writes, and what a
    finding's before/after shows. ``gpudoctor.rewrite`` makes both from it with LibCST, keeping the
    rest of the file byte for byte (docs/check.md)."""

    kind: str  # "call_args" (set keyword arguments of a call), "wrap" (a `with` around a statement), "insert" (a statement at start-up), "assign" (the value of an assignment)
    file: str  # the file, as the finding's location names it
    line: int  # a line of the node it changes (1-based); "insert": the line of the finding it answers
    col: int | None = None  # the node's 1-based column (static checks): picks one of several nodes on the line
    target: str = ""  # call_args: the callee ("DataLoader", "to", "zero_grad"); wrap: "loop" or "statement"; assign: the attribute ("cudnn.benchmark")
    args: tuple[tuple[str, str | None], ...] = ()  # call_args: keyword and its value as source text ("num_workers", "4"); None removes the keyword
    positions: tuple[tuple[str, int], ...] = ()  # call_args: a keyword's index when the call passes it by position ("num_workers", 5)
    unless: tuple[str, ...] = ()  # call_args: keywords that, passed with a true value, make the edit unsafe ("foreach" for fused=True)
    requires: tuple[str, ...] = ()  # conditions the rewrite checks first: "main-guard" (a call at module level needs `if __name__ == "__main__":` around it), "workers" (persistent_workers=True only where the call's num_workers is > 0: `<count> > 0` for a count computed)
    code: str = ""  # wrap: the context manager ("torch.no_grad()"); insert: the statement; assign: the new value ("True")
    text: str = ""  # the change in words: "num_workers=1, persistent_workers=True on the DataLoader at train.py:31"


@dataclass(frozen=True, slots=True)
class Fix(Serde):
    instruction: str  # "Set num_workers=4 on the DataLoader at train.py:31"
    before: str = ""  # code snippet
    after: str = ""
    edits: tuple[Edit, ...] = ()  # the change as gpudoctor can make it in the source; before/after are made from the first
    # where ``before`` quotes the user's source (``after`` is the same statement rewritten); None: before/after
    # are an illustration (``illustration`` says why), or a report written before this field
    source: Location | None = None
    illustration: str = ""  # why before/after is an illustration: "no call site was recorded", "train.py is not at hand" …
    automatic: bool = False  # `gpudoctor check --fix` makes this change (its rule declares it mechanical and safe)


@dataclass(frozen=True, slots=True)
class Finding(Serde):
    code: str  # "GD201"
    name: str  # "dataloader-stall"
    severity: Severity
    confidence: Confidence
    message: str  # one line, numbers filled in
    fix: Fix
    evidence: Evidence = field(default_factory=Evidence)
    gain: Gain = field(default_factory=lambda: Gain(None, None))
    location: Location | None = None
    rank: int | None = None  # distributed: which rank it concerns
    verification: Verification | None = None  # --verify: the fix measured in trial runs; None: not verified


class ChecklistStatus(str, Enum):
    APPLIED = "applied"  # positive evidence: the setting was read, or the trace shows it in use
    RECOMMENDED = "recommended"  # a rule found something to fix
    NO_PROBLEM_SEEN = "no_problem_seen"  # its rules looked and found nothing to fix (not proof that it is applied)
    NOT_APPLICABLE = "not_applicable"
    NOT_MEASURABLE = "not_measurable"


@dataclass(frozen=True, slots=True)
class ChecklistItem(Serde):
    key: str  # stable id: "dataloader-workers", "pinned-memory", …
    title: str  # "DataLoader workers (num_workers > 0)"
    status: ChecklistStatus
    reason: str  # why this status ("num_workers=4 at train.py:31", "no GPU in this run", …)
    codes: tuple[str, ...] = ()  # rule codes that judge it
    gain: Gain | None = None  # for RECOMMENDED
    technique: int | None = None  # number in the 13-technique checklist of seeds/004, when it is one


@dataclass(frozen=True, slots=True)
class SummaryStat(Serde):
    """A headline number, computed once, shown by every renderer."""

    key: str  # "steps", "step_time_median", "data_wait_share", "gpu_idle" …
    label: str  # "step time", "step time, median (spread)"
    value: float | int | str | None
    unit: str = ""
    window: str = ""


@dataclass(frozen=True, slots=True)
class RankRow(Serde):
    """Distributed: one rank's headline figures (computed by ``analysis.ranks``)."""

    rank: int
    steps: int  # steps its step times are of (steps.jsonl, else the profiled ProfilerStep windows)
    step_median_ns: int | None
    step_p90_ns: int | None
    comm_ns: int | None = None  # time in collectives per profiled step (mean; None: no trace of this rank)
    comm_exposed_pct: float | None = None  # exposed communication (nothing else running), % of profiled step time
    straggler: bool = False  # the rank the others wait for (RankSummary.straggler_rank)
    world_size: int | None = None
    step_source: str = ""  # where step_median_ns comes from: "steps" (steps.jsonl) or "trace" (ProfilerStep windows)
    profiled_steps: int = 0  # ProfilerStep windows of this rank in its traces
    comm_exposed_ns: int | None = None  # exposed communication per profiled step (mean)
    work_median_ns: int | None = None  # profiled step time minus exposed communication (median): the rank's own work
    traces: tuple[str, ...] = ()  # its trace files (names)


@dataclass(frozen=True, slots=True)
class RankSummary(Serde):
    """Distributed: the ranks compared with each other (computed by ``analysis.ranks``).

    In synchronized training (DDP) every rank's step lasts as long as the slowest rank's,
    so step times alone hide a straggler: the others spend the difference waiting in
    collectives. The comparison is therefore of each rank's *work* per step (step time
    minus exposed communication) when the traces have collectives, else of step times.
    """

    ranks: int  # ranks compared
    world_size: int | None
    basis: str  # "work" (profiled step time minus exposed communication) or "step" (step wall time)
    compared_steps: int  # steps present for every compared rank (per-step comparison)
    step_median_ns: int | None  # median over the ranks of their median step time
    step_imbalance: float | None  # max / median over the ranks of their median step time
    work_imbalance: float | None  # max / median over the ranks of their median work per step
    slowest_rank: int | None  # the rank with the most work (basis "work") or the longest steps (basis "step")
    slowest_excess_ns: int | None  # its median minus the median of the other ranks: how long the others wait per step
    slowest_excess_pct: float | None  # that, % of the median step time: what balancing the ranks would save
    slowest_in_steps: int = 0  # compared steps in which it was above the others' median by GD603's delay share
    straggler_rank: int | None = None  # slowest_rank when it passes the GD603 thresholds
    jitter_ns: int | None = None  # the other ranks' step-to-step variation (median absolute deviation of their per-step figure)
    notes: tuple[str, ...] = ()  # ranks or traces that could not be compared, and why


@dataclass(frozen=True, slots=True)
class Action(Serde):
    """One step of the projection: a finding's fix and what the step would take after it and
    every action before it: expected (the rules' models) and at least (each part removed entirely)."""

    code: str
    name: str
    gain_pct: float  # the finding's exclusive share of step time: an upper bound of what it wins
    step_ns_after: int  # the step time after this fix and the ones before it, if each won its whole share: a lower bound
    rank: int | None = None
    components: tuple[str, ...] = ()  # the parts it wins back
    expected_pct: float | None = None  # the share the fix is expected to win: measured (--verify) or its rule's model
    step_ns_expected: int | None = None  # the step time expected after this fix and the ones before it
    measured_pct: float | None = None  # --verify confirmed it: 1 - 1/speed-up, as a share of step time


@dataclass(frozen=True, slots=True)
class Account(Serde):
    """Where the step goes, computed once: the ledger the report leads with, its headline, and
    the top actions with their exclusive gains (docs/account.md)."""

    headline: str  # "GPU idle 67.4% of step time: waiting for the DataLoader 50.5%, …"
    ledger: Ledger  # the primary ledger (rank 0's, or the run's steady steps)
    step_ns: int | None  # the step time the projection starts from
    step_source: str  # "mean of 120 unprofiled steady steps, CUDA events", "mean of 5 ProfilerStep windows" …
    actions: tuple[Action, ...] = ()  # ranked by exclusive gain, cumulative
    claimed_pct: float = 0.0  # the findings' gains on this ledger together (at most 100)
    notes: tuple[str, ...] = ()  # the model's caveats (upper bound, other ranks …)
    tried: tuple[Action, ...] = ()  # fixes --verify refuted: tried, did not help (out of the actions)
    ranks: int = 1  # ranks of the job: with several, ledger is the slowest rank's and actions come from every rank


@dataclass(frozen=True, slots=True)
class RuleInfo(Serde):
    """A rule of the catalogue as reports show it (SARIF ``tool.driver.rules``, HTML, …).

    The engine copies it from ``rules.registry`` so that renderers, which import only
    the model, need not import the rules.
    """

    code: str  # "GD201"
    name: str  # "dataloader-stall"
    title: str  # one line: what it detects
    doc: str = ""  # the rule's documentation (What it detects / Why it matters / How to fix / …)


@dataclass(frozen=True, slots=True)
class RunData(Serde):
    """Everything known about one run or trace: the input of the engine."""

    source: str  # run directory or trace path
    manifest: Manifest | None = None
    settings: Settings | None = None
    steps: tuple[StepRecord, ...] = ()
    samples: Samples | None = None
    metrics: tuple[TraceMetrics, ...] = ()  # one per trace (rank)
    pstats: tuple[PstatsEntry, ...] = ()
    notes: tuple[str, ...] = ()  # what could not be read and why


#: How a ``Report`` shows itself in Jupyter and IPython: ``"html"`` and ``"text"`` renderers, registered by the
#: report layer (``gpudoctor.report.notebook``) when it is imported; this layer renders nothing itself.
DISPLAY: dict[str, Any] = {}


@dataclass(frozen=True, slots=True)
class Report(Serde):
    schema_version: int
    gpudoctor_version: str
    kind: str  # "profile", "analyze" or "check"
    source: str
    created_at: str
    findings: tuple[Finding, ...] = ()
    checklist: tuple[ChecklistItem, ...] = ()
    summary: tuple[SummaryStat, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)
    run: RunData | None = None  # the measurements (None for `check`)
    ranks: tuple[RankRow, ...] = ()
    errors: tuple[str, ...] = ()  # per-file problems (`check`), rules that crashed, …
    warnings: tuple[str, ...] = ()  # what every figure is to be read with (the step figures are partial: from which step, why)
    rules_run: tuple[str, ...] = ()
    rules: tuple[RuleInfo, ...] = ()  # the catalogue of the rules that could run (SARIF, HTML)
    rank_summary: RankSummary | None = None  # distributed: imbalance across ranks and the straggler
    account: Account | None = None  # where the step goes and the top actions (None for `check`, or no measurement)

    def _repr_html_(self) -> str | None:
        """Jupyter's rich display: the HTML report's account bar, Top actions and findings (offline)."""
        render = DISPLAY.get("html")
        return render(self) if render is not None else None

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """IPython's text display: the terminal report, without colour."""
        render = DISPLAY.get("text")
        p.text(render(self) if render is not None and not cycle else f"<gpudoctor Report {self.kind} {self.source}>")
