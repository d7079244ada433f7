"""The accounting window and its ledgers (``analysis.accounting``): made once per diagnosis, keyed by (rank,
``LedgerBasis``), read-only; a CPU-only trace's findings claim from the ledger of the account's steps; a run
without a trace from its steps' own. Hand-built runs, exact figures."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

_RULES = str(Path(__file__).resolve().parents[1] / "rules")
if _RULES not in sys.path:
    sys.path.insert(0, _RULES)

from rule_builders import MS, cpu_manifest, cpu_trace, manifest, run, steps, trace  # noqa: E402

from gpudoctor.analysis.accounting import (  # noqa: E402
    accounting_traces,
    detail_traces,
    ns_on_ledger,
    run_accounting,
)
from gpudoctor.analysis.figures import run_figures  # noqa: E402
from gpudoctor.model import LedgerBasis  # noqa: E402
from gpudoctor.rules.context import RuleContext  # noqa: E402


def _accounting(data):
    return run_accounting(data, run_figures(data), 1.10)


def test_each_rank_has_its_own_account_keyed_by_rank_and_basis() -> None:
    r0 = trace(path="r0.pt.trace.json.gz", rank=0)
    r1 = trace(path="r1.pt.trace.json.gz", rank=1, breakdown_mean_pct={"data_loading": 40.0})
    acc = _accounting(run(manifest=manifest(), metrics=(r0, r1)))
    assert set(acc.accounts) == {(0, LedgerBasis.GPU), (1, LedgerBasis.GPU)}
    assert acc.ledger(r0) is acc.accounts[(0, LedgerBasis.GPU)] and acc.ledger(r0).rank == 0
    assert acc.ledger(r1).rank == 1 and acc.ledger(r1).pct("data_loading") == pytest.approx(40.0)  # its own
    assert acc.ledger(r0).pct("data_loading") == 0.0
    assert acc.ledger() is acc.ledger(r0) and acc.primary_trace(1) is r1
    # a figure of a trace that is its own account is a figure of its window (five 10 ms steps), unscaled
    assert acc.account_of(r1) is None and acc.trace_share(r1, 10 * MS) == pytest.approx(20.0)
    # values, not a cache: nothing is added or replaced later
    with pytest.raises(TypeError):
        acc.accounts[(2, LedgerBasis.GPU)] = acc.ledger(r0)  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        acc.steps_only = None  # type: ignore[misc]


def test_a_cpu_trace_s_findings_claim_from_the_account_s_steps() -> None:
    cpu = cpu_trace()
    data = run(manifest=cpu_manifest(), metrics=(cpu,), steps=steps(20, wall_ms=100.0, wait_ms=30.0))
    acc = _accounting(data)
    assert acc.trace_ledger(cpu).basis == LedgerBasis.CPU and acc.trace_ledger(cpu).total_ns == 50 * MS
    led = acc.ledger(cpu)
    assert led is acc.ledger(cpu) and led.basis == LedgerBasis.STEPS  # made once, shared by every finding
    # the data wait of every steady step; the rest split as the trace splits it
    assert led.pct("data_loading") == pytest.approx(30.0) and led.total_ns == led.windows * 100 * MS
    assert led.key == "steps+trace:cpu.pt.trace.json.gz"
    # a rule's view reads the same object
    ctx = RuleContext(data)
    assert ctx.ledger(cpu) == led and ctx.for_rule("GD201", "dataloader-stall").accounting is ctx.accounting


def test_a_run_without_a_trace_is_accounted_on_its_steps() -> None:
    data = run(manifest=cpu_manifest(), steps=steps(20, wall_ms=50.0, wait_ms=10.0))
    acc = _accounting(data)
    assert acc.accounts == {} and acc.primary_trace() is None
    assert acc.ledger() is acc.steps_only and acc.steps_only.basis == LedgerBasis.STEPS
    assert acc.steps_only.pct("data_loading") == pytest.approx(20.0)
    assert _accounting(run(manifest=cpu_manifest())).ledger() is None  # nothing to account


def test_the_detailed_window_is_left_to_the_rules_that_need_it() -> None:
    detailed = trace(path="p.1.pt.trace.json.gz", has_stacks=True, has_shapes=True)
    plain = trace(path="p.2.pt.trace.json.gz", has_stacks=False, has_shapes=False)
    metrics = (detailed, plain)
    assert accounting_traces(metrics) == (plain,) and detail_traces(metrics, "shapes") == (detailed,)
    acc = _accounting(run(manifest=manifest(), metrics=metrics))
    # whichever trace a rule judges, the account is the plain window's, named with the detailed one
    assert acc.ledger(detailed) is acc.ledger(plain) and "timings only" in acc.ledger(plain).window
    # a figure of the detailed window is as much per window on the account (both have five windows)
    assert ns_on_ledger(detailed, 7 * MS, acc.ledger(plain)) == 7 * MS
