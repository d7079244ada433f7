"""One step time in every format, over every recorded run (tests/fixtures/gpu and gpu2: one H200).

Each run is analysed as ``gpudoctor analyze`` does and rendered in all five formats (terminal, Markdown,
HTML, JSON, SARIF). Wherever a text says what the step takes now (the summary, Top actions, a finding's
sentence, gain and evidence) it prints one value, the run's step time: the mean (total ÷ count) of the
unprofiled steady steps at the rate the loop sustains (their CUDA events where they carry them), to the
whole µs; the data wait has one value too. The CPU side: ``test_a_profiled_run_prints_one_value_per_quantity``
(a real run of ``gpudoctor profile``) in test_report_one_value.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from one_value import _value, conflicts, texts, values_by_quantity

from gpudoctor.config import Config
from gpudoctor.engine import diagnose
from gpudoctor.model.steady import (
    MIN_BARE_STEPS,
    compile_steps,
    main_dataloader,
    steady_steps,
    unprofiled_steps,
)
from gpudoctor.pipeline import analyze_paths

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _runs() -> list[tuple[str, str]]:
    out = []
    for where in ("gpu", "gpu2"):
        d = FIXTURES / where
        if d.is_dir():
            out += [(where, p.name) for p in sorted(d.iterdir())
                    if (p / "manifest.json").is_file() or (p / "manifest.json.gz").is_file()]
    return out


RUNS = _runs()


def _expected_step_ns(run) -> int:
    """The run's step time, by hand: the mean of the unprofiled steady steps (every steady step where fewer
    than MIN_BARE_STEPS ran bare), their CUDA events where at least half carry one, to the whole µs."""
    steady = steady_steps(run.steps, run.manifest.step_source, main_dataloader(run.settings),
                          compile_steps(run.settings, run.steps))
    bare = unprofiled_steps(steady)
    steps = bare if len(bare) >= MIN_BARE_STEPS else steady
    events = [s.gpu_ns for s in steps if s.gpu_ns]
    times = events if len(events) >= 0.5 * len(steps) else [s.wall_ns for s in steps]
    return round(sum(times) / len(times) / 1000) * 1000


def test_the_fixtures_are_there() -> None:
    """The parametrized test below looks at every recorded run: at least the H200 runs of both sets."""
    assert len([r for r in RUNS if r[0] == "gpu"]) >= 15 and len([r for r in RUNS if r[0] == "gpu2"]) >= 8


@pytest.mark.parametrize(("where", "name"), RUNS, ids=[f"{w}/{n}" for w, n in RUNS])
def test_every_recorded_run_prints_one_step_time_in_every_format(where: str, name: str, gpu_report) -> None:
    if where == "gpu":  # the session's analysis of the run (conftest.gpu_report), shared with the engine's tests
        run, report = gpu_report(name)
    else:
        run = analyze_paths([str(FIXTURES / where / name)], jobs=1)
        report = diagnose(run, Config(), kind="analyze")
    named = texts(report)
    assert conflicts(named) == []
    found = values_by_quantity(named)
    now = found.get("step time (now)", [])
    if not run.steps and not any(m.steps for m in run.metrics):  # a crash before the first step: no step time
        assert now == [] and "step_time" not in {s.key for s in report.summary}
        return
    assert {w for w, _, _ in now} >= {"terminal", "md", "html", "json"}, now
    if not run.steps:  # a bare trace (none here so far): the windows' mean, the same in every format
        return
    expected = _expected_step_ns(run)
    summary = {s.key: s for s in report.summary}
    assert summary["step_time"].value * 1e6 == pytest.approx(expected, abs=0.5)
    if report.account is not None:
        assert report.account.step_ns == expected and report.account.step_source.startswith("mean of ")
    for w, printed, around in now:  # every place that says what the step takes now says the run's figure
        number, _, unit = printed.partition(" ")
        value, half = _value(number, unit)
        assert abs(value - expected) <= half + 1e-6 * expected, (w, printed, around)
    # the median and the p90 are printed only under their names: never as the step
    assert not any("median" in around and "now" in around for _, _, around in now)
    gd201 = [f for f in report.findings if f.code == "GD201" and "step, means over" in f.message]
    for f in gd201:  # its sentence's step is the run's step time
        assert any(w == "terminal" and "means over" in around for w, _, around in now), f.message
    wait = found.get("waiting for data (every steady step)", [])
    if summary.get("data_wait_share") is not None:
        assert {w for w, _, _ in wait} >= {"terminal", "md", "html", "json"}
