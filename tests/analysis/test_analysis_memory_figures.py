"""The run's memory figures (``analysis.memory.memory_figures``, ``RunFigures.memory``): the GPU's size, the
machine's memory and each trace's peak, computed once per diagnosis; what GD104, GD501, the summary, the
MEMORY need and GD201's worker cap read. Hand-built runs, exact figures."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

_RULES = str(Path(__file__).resolve().parents[1] / "rules")
if _RULES not in sys.path:
    sys.path.insert(0, _RULES)

from rule_builders import GB, MemoryStats, Samples, gpu_samples, manifest, run, trace  # noqa: E402

from gpudoctor.analysis.figures import run_figures  # noqa: E402
from gpudoctor.analysis.memory import MemoryFigures, memory_figures  # noqa: E402
from gpudoctor.config import Thresholds  # noqa: E402
from gpudoctor.rules.context import RuleContext  # noqa: E402
from gpudoctor.rules.device import memory_peak  # noqa: E402
from gpudoctor.rules.needs import Need  # noqa: E402


def test_the_device_s_size_comes_from_the_trace_before_the_manifest() -> None:
    t = trace(memory=(MemoryStats(0, peak_reserved_bytes=60 * GB, total_bytes=40 * GB),))
    figs = memory_figures(run(manifest=manifest(), metrics=(t,)))
    assert figs.device_total_bytes == 40 * GB  # the manifest's A100 says 80 GB: the trace's allocator figure wins
    assert memory_figures(run(manifest=manifest(), metrics=(trace(),))).device_total_bytes == 80 * GB
    assert memory_figures(run()).device_total_bytes is None


def test_a_trace_s_peak_is_its_rank_s_highest_allocator_figure() -> None:
    # the detailed window (another trace of the rank) recorded the allocator; reserved before allocated
    plain = dataclasses.replace(trace(), path="plain.pt.trace.json")
    detail = dataclasses.replace(trace(memory=(MemoryStats(0, peak_allocated_bytes=30 * GB,
                                                           peak_reserved_bytes=50 * GB),)), path="detail.pt.trace.json")
    figs = memory_figures(run(manifest=manifest(), metrics=(plain, detail)))
    assert figs.peak(plain) == figs.peak(detail)
    p = figs.peak(plain)
    assert p is not None and p.peak_bytes == 50 * GB and p.source == "reserved (trace)" and p.pct == 62.5


def test_without_allocator_figures_nvml_s_highest_use_is_the_peak() -> None:
    data = run(manifest=manifest(), metrics=(trace(),),
               samples=Samples(gpu=gpu_samples(90.0, 72 * GB), system_memory_bytes=64 * GB))
    figs = memory_figures(data)
    assert figs.sampled_peak is not None and figs.sampled_peak.source == "NVML used"
    assert figs.peak(data.metrics[0]) == figs.sampled_peak and figs.peak(None) == figs.sampled_peak
    assert figs.sampled_peak.pct == 90.0 and figs.host_total_bytes == 64 * GB


def test_the_rules_read_the_figures_made_once() -> None:
    data = run(manifest=manifest(), metrics=(trace(),), samples=Samples(gpu=gpu_samples(90.0, 72 * GB)))
    ctx = RuleContext(data, Thresholds())
    assert ctx.figures.memory == memory_figures(data) and run_figures(data).memory == ctx.figures.memory
    assert memory_peak(ctx, data.metrics[0]) is ctx.figures.memory.sampled_peak
    # a trace that is not the run's own gets its own peak
    other = dataclasses.replace(trace(memory=(MemoryStats(0, peak_allocated_bytes=8 * GB),)), path="other", rank=3)
    assert memory_peak(ctx, other).peak_bytes == 8 * GB
    assert Need.MEMORY.missing(ctx) is None
    bare = RuleContext(run(metrics=(trace(devices=()),)), Thresholds())  # a trace without its device
    assert Need.MEMORY.missing(bare) == "the GPU's memory is not recorded"
    assert MemoryFigures().peak(None) is None
