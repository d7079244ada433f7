"""Which timeline limits a step, on a public trace of ../shared/traces (skipped when that folder is absent):
a GPU that waits on another stream, an event or a collective is not the bottleneck (docs/account.md, "Two
timelines")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpudoctor.analysis import analyze_trace
from gpudoctor.config import Config
from gpudoctor.engine import diagnose
from gpudoctor.model.metrics import Component
from gpudoctor.parse import load_inputs

pytestmark = pytest.mark.shared_traces

A100_OF_16 = "hta/a100_rank0_of16_negative_queue.json.gz"


def test_a_gpu_waiting_on_collectives_is_not_called_the_bottleneck(shared_traces: Path) -> None:
    # rank 0 of 16 on A100s: its steps are 31-37% busy and wait on collectives and other streams half their
    # time; it waits for its host ~1% of 4 of its 5 steps. It once read "the GPU limits 4 of 5 steps", and
    # a GPU that limits every step would silence GD103 and GD104
    path = shared_traces / A100_OF_16
    if not path.is_file():
        pytest.skip(f"{A100_OF_16} is not in {shared_traces}")
    loaded = load_inputs([path])
    metrics = tuple(analyze_trace(t, loaded.run) for t in loaded.timelines)
    (m,) = metrics
    t = m.timelines
    assert t is not None and len(t.steps) == 5 and t.device_bound_steps == 0
    assert all(s.dependency_wait_ns > 0.3 * (s.window_end_ns - s.window_start_ns) for s in t.steps)
    report = diagnose(dataclasses.replace(loaded.run, metrics=metrics), Config(), "analyze")
    led = report.account.ledger
    assert not led.device_windows and led.pct(Component.DEPENDENCY_WAIT) > 40.0
    assert "limits" not in report.account.headline and "bottleneck" not in report.account.headline
    rows = [c.reason for c in report.checklist if {"GD103", "GD104"} & set(c.codes)]
    assert rows and not any("the GPU limits" in r for r in rows)
