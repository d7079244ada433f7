"""GD106 gpu-throttled on synthetic ``samples.jsonl`` files (no GPU here): it fires on a throttled GPU,
names the reason, and stays silent on a healthy one and on an idle one."""

from __future__ import annotations

import json
from pathlib import Path

from rule_builders import MS, judge, manifest, run, settings, steps

from gpudoctor.model import Severity
from gpudoctor.parse.rundir import read_samples
from gpudoctor.rules.results import Verdict

APP_MHZ, LIMIT_W = 1410, 400.0


def _gpu_line(i: int, *, util: float, sm: int, power: float, reasons: tuple[str, ...], temp: float = 60.0,
              app: int | None = APP_MHZ, limit: float | None = LIMIT_W, read: bool | None = True) -> dict:
    line = {"kind": "gpu", "t_ns": i * 200 * MS, "index": 0, "util_pct": util, "mem_util_pct": 30.0,
            "mem_used_bytes": 20 << 30, "mem_total_bytes": 80 << 30, "sm_clock_mhz": sm, "mem_clock_mhz": 1593,
            "power_w": power, "temp_c": temp, "throttle_reasons": list(reasons), "pcie_tx_kbps": 0.0,
            "pcie_rx_kbps": 0.0}
    if read is not None:  # runs recorded before these fields have none of them
        line.update({"app_sm_clock_mhz": app, "max_sm_clock_mhz": 1410, "power_limit_w": limit, "throttle_read": read})
    return line


def _samples_file(tmp_path: Path, lines: list[dict]) -> Path:
    d = tmp_path / "run"
    d.mkdir(parents=True)
    rows = [{"kind": "meta", "interval_ms": 200.0, "system_cpu_count": 16}, *lines]
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return d


def _judge(tmp_path: Path, lines: list[dict], **overrides):
    notes: list[str] = []
    samples = read_samples(_samples_file(tmp_path, lines), notes)
    assert samples is not None and not notes
    # 20 steps of 100 ms: 2 s, the span of the 10 samples 200 ms apart
    return judge("GD106", run(manifest=manifest(), settings=settings(), steps=steps(20, 100.0), samples=samples),
                 **overrides)


def throttled() -> list[dict]:
    """A GPU at work that hits its power cap and, later, gets hot: 7 of 10 busy samples throttled."""
    out = []
    for i in range(10):
        if i < 3:
            out.append(_gpu_line(i, util=98.0, sm=1410, power=310.0, reasons=()))
        elif i < 7:
            out.append(_gpu_line(i, util=99.0, sm=1155, power=399.0, reasons=("sw_power_cap",)))
        else:
            out.append(_gpu_line(i, util=97.0, sm=1020, power=370.0, reasons=("sw_power_cap", "hw_thermal_slowdown"),
                                 temp=88.0))
    return out


def healthy() -> list[dict]:
    """At work at its applications clock, under its power limit; idle samples report gpu_idle (harmless)."""
    out = [_gpu_line(i, util=96.0, sm=1410, power=330.0, reasons=()) for i in range(8)]
    out += [_gpu_line(i, util=0.0, sm=210, power=60.0, reasons=("gpu_idle",)) for i in range(8, 10)]
    return out


def test_fires_on_a_throttled_gpu_and_names_the_reasons(tmp_path):
    res = _judge(tmp_path, throttled())
    assert res.verdict == Verdict.FIRED
    (f,) = res.findings
    assert f.message.startswith("GPU 0 throttled in 70.0% of its busy samples (7 of 10, while the steps ran): "
                                "power cap 70.0%, thermal slowdown 30.0%")
    assert "SM clock median 1,155 MHz, 82% of its applications clock (1,410 MHz)" in f.message
    assert "power at the cap (400 W) in 40.0%" in f.message
    metrics = {m.name: m.value for m in f.evidence.metrics}
    assert metrics["clock_slowed_pct"] == 70.0 and metrics["power_at_cap_pct"] == 40.0
    assert metrics["temperature_max_c"] == 88.0
    # mean deficit over busy samples: (4 × (1 - 1155/1410) + 3 × (1 - 1020/1410)) / 10 = 15.5% of the run
    # (every sample busy)
    assert abs(metrics["estimated_loss_pct"] - 15.53) < 0.01
    assert f.severity == Severity.WARNING  # 15.6% of the run: above 5%, under 20%
    assert f.gain.share_pct is None and not f.gain.claims  # not a part of the step's account
    assert "power limit (400 W)" in f.fix.instruction and "temperature limit (up to 88 °C)" in f.fix.instruction
    assert "nvidia-smi" in f.fix.after


def test_silent_on_a_healthy_gpu(tmp_path):
    res = _judge(tmp_path, healthy())
    assert res.verdict == Verdict.FINE
    assert res.reason.startswith("GPU 0: throttled in 0.0% of 8 busy samples while the steps ran")
    assert "100% of its applications clock" in res.reason


def test_silent_when_the_gpu_never_worked(tmp_path):
    lines = [_gpu_line(i, util=5.0, sm=300, power=70.0, reasons=("gpu_idle",)) for i in range(10)]
    res = _judge(tmp_path, lines)
    assert res.verdict == Verdict.FINE and "no NVML sample while the steps ran had the GPU at work" in res.reason


def test_clock_below_the_applications_clock_alone_counts(tmp_path):
    lines = [_gpu_line(i, util=99.0, sm=1200, power=300.0, reasons=()) for i in range(10)]
    res = _judge(tmp_path, lines)
    assert res.verdict == Verdict.FIRED and "with no reason NVML reports" in res.findings[0].fix.instruction
    # a deficit under the threshold is boost jitter, not a slowdown
    lines = [_gpu_line(i, util=99.0, sm=1350, power=300.0, reasons=()) for i in range(10)]
    assert _judge(tmp_path / "b", lines).verdict == Verdict.FINE


def test_older_samples_without_clocks_are_judged_by_their_reasons(tmp_path):
    lines = [_gpu_line(i, util=99.0, sm=1100, power=390.0, reasons=("sw_thermal_slowdown",), read=None)
             for i in range(10)]
    res = _judge(tmp_path, lines)
    assert res.verdict == Verdict.FIRED
    (f,) = res.findings
    assert "thermal slowdown 100.0%" in f.message and "SM clock" not in f.message
    assert f.severity == Severity.WARNING  # no clock figure: unquantified


def test_thresholds_are_thresholds(tmp_path):
    assert _judge(tmp_path, throttled(), throttle_min_share_pct=80.0).verdict == Verdict.FINE
    assert _judge(tmp_path / "b", throttled(), throttle_busy_util_pct=99.5).verdict == Verdict.FINE


def test_needs_gpu_samples():
    assert judge("GD106", run(settings=settings(device_type="cpu"))).verdict == Verdict.NOT_APPLICABLE
    assert judge("GD106", run(settings=settings(), manifest=manifest())).verdict == Verdict.CANNOT_JUDGE


def test_the_steps_span_of_a_job_is_its_ranks_side_by_side() -> None:
    # device.steps_span once summed the loop times of every rank's steps: 2 ranks of 10 steps of 10 ms (CUDA
    # events, the host enqueuing each in 2 ms) ran "200 ms", and NVML samples of the next 100 ms counted
    import dataclasses as _dc

    from gpudoctor.rules.context import RuleContext
    from gpudoctor.rules.device import steps_span

    def rank_steps(rank: int):
        return tuple(_dc.replace(s, wall_ns=2 * MS, gpu_ns=10 * MS, rank=rank, start_ns=s.index * 2 * MS)
                     for s in steps(10, wall_ms=2.0))

    both = rank_steps(0) + rank_steps(1)
    ctx = RuleContext(run(steps=both))
    assert steps_span(ctx, both) == (0, 100 * MS)
    assert steps_span(ctx, rank_steps(0)) == (0, 100 * MS)
