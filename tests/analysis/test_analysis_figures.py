"""The run's figures (``analysis.figures``): the step populations, the step time (the mean of the unprofiled
steady steps, total ÷ count), its spread, per rank and for the job; what the rules, the account and
``--verify``'s judging read. Hand-built step records, exact figures."""

from __future__ import annotations

import sys
from pathlib import Path

_RULES = str(Path(__file__).resolve().parents[1] / "rules")
if _RULES not in sys.path:
    sys.path.insert(0, _RULES)

from rule_builders import cpu_manifest, run, settings  # noqa: E402

from gpudoctor.analysis.figures import run_figures  # noqa: E402
from gpudoctor.config import Config  # noqa: E402
from gpudoctor.engine import diagnose  # noqa: E402
from gpudoctor.model import Ledger, LedgerBasis, StepRecord  # noqa: E402
from gpudoctor.model.steady import StepSource  # noqa: E402
from gpudoctor.rules.context import RuleContext  # noqa: E402
from gpudoctor.verify.judging import profiled_step_ns  # noqa: E402

MS = 1_000_000


def _steps(walls_ms: list[float], *, windows: dict[int, str] | None = None, rank: int | None = None,
           gpu_ms: list[float] | None = None, wait_ms: float = 0.0) -> tuple[StepRecord, ...]:
    out, t = [], 0
    for i, w in enumerate(walls_ms):
        wall = int(w * MS)
        out.append(StepRecord(index=i, start_ns=t, wall_ns=wall, data_wait_ns=int(wait_ms * MS), rank=rank,
                              marker="optimizer", window=(windows or {}).get(i, ""),
                              gpu_ns=int(gpu_ms[i] * MS) if gpu_ms else None))
        t += wall
    return tuple(out)


def _run(steps: tuple[StepRecord, ...]):
    return run(manifest=cpu_manifest(step_source="optimizer"), settings=settings(device_type="cpu"), steps=steps)


def test_the_step_time_is_the_mean_of_the_unprofiled_steady_steps_and_the_median_its_spread() -> None:
    # step 0 (start-up) 900 ms; steps 3-4 profiled (300 ms) and step 5 pays for the window's end (200 ms);
    # of the rest, one slow step in ten: the mean is the throughput, the median is not
    walls = [900.0, 10, 10, 300, 300, 200] + [10.0] * 9 + [100.0]
    fig = run_figures(_run(_steps(walls, windows={3: "active", 4: "active"}))).job
    assert len(fig.marked) == 16 and len(fig.steady) == 15
    assert [s.index for s in fig.unprofiled] == [1, 2, *range(6, 16)] and fig.account == fig.unprofiled
    assert fig.account_label == "12 unprofiled steady steps"
    assert fig.step.step_ns == 17_500_000  # (11 × 10 + 100) / 12 = 17.5 ms: total ÷ count
    assert fig.step.median_ns == 10 * MS and fig.step.p90_ns == 10 * MS  # the spread, never "the step"
    assert fig.step.source == StepSource.WALL and fig.step.unprofiled
    assert fig.marked_wall_ns == int(sum(walls) * MS)


def test_too_few_unprofiled_steps_leave_every_steady_step_in_the_account() -> None:
    walls = [900.0, 10, 10, 30, 30, 30, 30, 30, 30]
    fig = run_figures(_run(_steps(walls, windows={i: "active" for i in range(3, 9)}))).job
    assert len(fig.unprofiled) == 2 < 5 and fig.account == fig.steady and not fig.account_is_unprofiled
    assert fig.step.step_ns == 25 * MS  # (2 × 10 + 6 × 30) / 8


def test_cuda_events_time_the_step_where_the_steps_carry_them() -> None:
    walls = [50.0] + [2.0] * 10  # the host enqueues a step in 2 ms; the device runs it in 40 (one in 60)
    gpu = [50.0] + [40.0] * 9 + [60.0]
    fig = run_figures(_run(_steps(walls, gpu_ms=gpu))).job
    assert fig.step.source == StepSource.CUDA_EVENTS and fig.step.step_ns == 42 * MS


def test_each_rank_has_its_own_figures_and_the_job_pools_them() -> None:
    steps = _steps([100.0] + [10.0] * 10, rank=0) + _steps([100.0] + [20.0] * 10, rank=1)
    figs = run_figures(_run(steps))
    assert figs.of(0).step.step_ns == 10 * MS and figs.of(1).step.step_ns == 20 * MS
    assert figs.of(None) is figs.of(0) and figs.job.step.step_ns == 15 * MS and len(figs.job.steady) == 20


def test_the_account_the_summary_and_verify_read_one_step_time() -> None:
    walls = [900.0, 10, 10, 300, 300, 200] + [10.0] * 9 + [100.0]
    data = _run(_steps(walls, windows={3: "active", 4: "active"}, wait_ms=2.0))
    report = diagnose(data, Config(), "profile")
    summary = {s.key: s for s in report.summary}
    assert summary["step_time"].value == 17.5 and summary["step_time_median"].value == 10.0
    assert report.account is not None and report.account.step_ns == 17_500_000
    assert report.account.step_source == "mean of 12 unprofiled steady steps"
    assert profiled_step_ns(data) == 17_500_000  # --verify's comparison with the profiled run
    ctx = RuleContext(data)
    rule = ctx.for_rule("GD201", "dataloader-stall")  # computed once per diagnosis: every rule's copy shares them
    assert rule.figures is ctx.figures and rule.accounting is ctx.accounting
    assert ctx.figures.job.account == ctx.figures.job.unprofiled and len(ctx.figures.job.account) == 12


def test_a_bare_trace_s_step_is_the_mean_of_its_windows() -> None:
    ledger = Ledger(key="trace:t", basis=LedgerBasis.GPU, label="t", window="5 windows", windows=5, total_ns=50 * MS)
    figs = run_figures(_run(()))
    assert figs.account_step(ledger) == (10 * MS, "mean of 5 windows", False)


def test_a_job_of_two_ranks_prints_one_step_time() -> None:
    """The summary and the account's projection print the job's step time (every rank's steps: in synchronous
    training the slowest rank sets every rank's pace), not one rank's beside the job's."""
    data = _run(_steps([100.0] + [10.0] * 10, rank=0, wait_ms=4.0) + _steps([100.0] + [12.0] * 10, rank=1, wait_ms=4.0))
    report = diagnose(data, Config(), "profile")
    summary = {s.key: s for s in report.summary}
    assert summary["step_time"].value == 11.0 and summary["step_time"].window == "20 steady steps of 2 ranks"
    assert report.account is not None and report.account.step_ns == 11 * MS
    assert report.account.step_source == "mean of 20 steady steps of 2 ranks"
