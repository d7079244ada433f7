"""Steady means settled, through the engine: a loop that ran 20 slow steps (a sleep that stops at step
20, half of each step waiting for a batch) and then settled gets its step time, account and findings from
the settled steps, and the summary and the account name the change (model/settle.py). The window's weight
note never calls a ratio under 1/1.10 "within"."""

from __future__ import annotations

from rule_builders import MS, manifest, run, settings

from gpudoctor import engine
from gpudoctor.config import Config
from gpudoctor.model import Ledger, StepRecord, WindowWeight
from gpudoctor.rules.account import weight_note


def _loop(slow_steps: int = 20, steps: int = 40) -> tuple[StepRecord, ...]:
    """Steps of 200 ms while the loop is slow, 150 ms of them waiting for a batch, then 10 ms steps that
    wait for nothing (their batches ready: the sleep stopped); a little noise in each."""
    out, t = [], 0
    for i in range(steps):
        slow = i < slow_steps
        wall = (200 + i % 3) * MS if slow else (10 * MS + (i % 4) * 100_000)
        out.append(StepRecord(index=i, start_ns=t, wall_ns=wall, data_wait_ns=150 * MS if slow else 0,
                              backward_ns=wall // 10, optimizer_ns=wall // 20, marker="optimizer"))
        t += wall
    return tuple(out)


def _summary(rep) -> dict:
    return {s.key: s for s in rep.summary}


def test_a_loop_that_settles_is_diagnosed_from_its_settled_steps():
    data = run(manifest=manifest(step_source="optimizer"), settings=settings(device_type="cpu"), steps=_loop())
    rep = engine.diagnose(data, Config(), "analyze")
    stats = _summary(rep)
    assert stats["step_time_median"].value < 11.0 and stats["step_time_median"].window.startswith("20 ")
    change = stats["step_time_change"].value
    assert change.startswith("steps 1–19 ran 20") and "steps 20–39 ran 10" in change
    assert "the figures are the settled part's" in change
    assert stats["data_wait_share"].value == 0.0  # the settled steps waited for nothing
    assert rep.account is not None and rep.account.step_ns < 11 * MS
    assert any(n.startswith("step time changed: steps 1–19") for n in rep.account.notes)
    assert rep.account.ledger.windows == 20  # the account's steps are the settled ones
    # the waits of the slow part are not the loop's: no finding of a data wait
    assert "GD201" not in {f.code for f in rep.findings}


def test_the_same_loop_without_the_settled_part_keeps_its_waits():
    data = run(manifest=manifest(step_source="optimizer"), settings=settings(device_type="cpu"),
               steps=_loop(slow_steps=40))
    rep = engine.diagnose(data, Config(), "analyze")
    stats = _summary(rep)
    assert "step_time_change" not in stats and stats["step_time_median"].value > 190.0
    assert stats["data_wait_share"].value > 70.0
    assert "GD201" in {f.code for f in rep.findings}  # the wait the settled loop no longer has


def _weighed(ratio: float) -> Ledger:
    w = WindowWeight(ratio=ratio, window_step_ns=int(ratio * 100 * MS), bare_step_ns=100 * MS, window_steps=5,
                     bare_steps=12, source="wall")
    return Ledger("L", "cpu", "L", "5 windows", 5, 500 * MS, weight=w)


def test_a_window_that_ran_faster_than_the_unprofiled_steps_is_not_within():
    for ratio in (0.02, 0.5, 0.9):  # under 1/1.10 = 0.909
        note = weight_note(_weighed(ratio), 1.10)
        assert "within" not in note and "under 1/1.10×" in note and "no instrument causes" in note, note
    assert "within 1.10×, the account is as recorded" in weight_note(_weighed(0.95), 1.10)
    assert "within 1.10×" in weight_note(_weighed(1.05), 1.10)
