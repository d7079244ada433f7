"""GD106 gpu-throttled: the GPU ran below its clock while it worked: too hot, at its power limit, or slowed by the hardware.

What it detects
---------------
In the NVML samples taken while the GPU worked (utilization at least
`throttle_busy_util_pct`), the clock event ("throttle") reasons NVML reports:
thermal slowdown (software or hardware), the software power cap, the
hardware power brake, and other hardware slowdown; and, where the device
reports its applications clock, an SM clock more than
`throttle_clock_deficit_pct` below it. The rule fires when such samples are at
least `throttle_min_share_pct` of the busy samples of a device, and says which
reason dominates, how far the SM clock fell and how often the power draw sat
at the enforced limit. Samples of an idle GPU are left out (it lowers its clocks
by design, at no cost).

Why it matters
--------------
A GPU held 15% below its clock runs compute-bound kernels about 15% slower, and
the script does not show why. Thermal slowdown points at cooling; a power cap at
a limit set below the board's default or a shared power budget; hardware
slowdown at the power supply or a power-brake signal. On a shared or cloud
machine these are the operator's to fix: step times on a throttled GPU mislead.

How to fix
----------
Check what NVML reports (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`).
Thermal slowdown: fix the cooling. A power cap: restore the board's default
limit (administrator rights) or accept it; lower precision (GD401) does more
work per joule. Hardware slowdown: check the power supply. Reset lowered
applications clocks.

Before:

```python
# $ nvidia-smi -q -d PERFORMANCE
#     Clocks Event Reasons
#         SW Power Cap            : Active
#         HW Thermal Slowdown     : Active
#     Power Limit                 : 250.00 W   (default 400.00 W)
```

After:

```python
# $ sudo nvidia-smi -pl 400    # the board's default power limit
# $ sudo nvidia-smi -rac       # reset applications clocks to their default
# and cool the GPU: inlet temperature, fans, airflow through the chassis
```

Evidence used
-------------
`samples.jsonl`'s NVML samples taken while the steps ran (all of them without
steps): utilization, the SM, applications and maximum clocks, power draw and
limit, temperature, the clock event reasons.

Thresholds
----------
- `throttle_busy_util_pct` (50): GPU utilization from which a sample is busy.
- `throttle_min_share_pct` (10): share of busy samples throttled that fires.
- `throttle_clock_deficit_pct` (10): SM clock this far below the applications
  clock counts as slowed.
- `power_cap_ratio_pct` (97): power draw at this share of the limit is at the cap.
- `error_share_pct`, `warning_share_pct`: severity from the estimated loss: the
  mean clock deficit of the busy samples, times the share of samples that were
  busy (`unquantified_severity` where the clocks are not reported).

Known limits
------------
NVML samples every few hundred milliseconds: a short slowdown between samples
is missed, and one caught in a sample counts for the whole interval. The
estimated loss assumes kernels bound by the SM clock; memory-bound kernels
lose less. The software power cap is active on many data-centre GPUs under full
load: it is reported, and costs what the clock deficit says. A device without an
applications clock is judged by its reasons alone. Needs an NVIDIA GPU and NVML.

References
----------
- NVML clock event reasons: https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html
- NVML device queries (applications clocks, power limit): https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html
- nvidia-smi: https://docs.nvidia.com/deploy/nvidia-smi/index.html
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpudoctor.model.findings import Confidence, Fix, Metric
from gpudoctor.model.run import GpuSample
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.device import steps_span
from gpudoctor.rules.formatting import fmt_pct
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult

THERMAL = ("sw_thermal_slowdown", "hw_thermal_slowdown")
POWER = ("sw_power_cap", "hw_power_brake_slowdown")
HARDWARE = ("hw_slowdown",)
_KINDS = (("thermal slowdown", THERMAL), ("power cap", POWER), ("hardware slowdown", HARDWARE))

_BEFORE = """# $ nvidia-smi -q -d PERFORMANCE
#     Clocks Event Reasons
#         SW Power Cap            : Active
#         HW Thermal Slowdown     : Active"""
_AFTER = """# $ sudo nvidia-smi -pl <default W>   # where the power limit was lowered
# $ sudo nvidia-smi -rac              # applications clocks back to their default
# and cool the GPU: inlet temperature, fans, airflow"""


@dataclass(frozen=True, slots=True)
class DeviceThrottle:
    """What one device's busy samples say."""

    index: int
    samples: int  # samples in the span
    busy: int  # of them, the GPU at work
    affected: int  # busy samples throttled (a reason, or the SM clock slowed)
    by_kind: dict[str, int]  # "thermal slowdown" / "power cap" / "hardware slowdown" -> busy samples with it
    slowed: int  # busy samples with the SM clock below the applications clock by the deficit
    at_cap: int  # busy samples drawing at least power_cap_ratio_pct of the limit
    clock_ratio_median: float | None  # SM clock / reference clock, median over busy samples
    deficit_mean: float | None  # mean of max(0, 1 - SM / reference) over busy samples
    reference: str  # "applications clock", "maximum clock" or ""
    ref_mhz: int | None
    sm_median_mhz: int | None
    power_limit_w: float | None
    temp_max_c: float | None

    @property
    def affected_pct(self) -> float:
        return 100.0 * self.affected / self.busy if self.busy else 0.0

    @property
    def loss_pct(self) -> float | None:
        """Estimated share of the run's time lost to low clocks: the mean deficit while busy, times the
        busy share of the samples."""
        if self.deficit_mean is None or not self.samples:
            return None
        return 100.0 * self.deficit_mean * self.busy / self.samples


def _in_steps(ctx: RuleContext, samples: tuple[GpuSample, ...]) -> tuple[tuple[GpuSample, ...], str]:
    """The samples taken while the steps ran: on the device's timeline too (``device.steps_span``: a
    GPU-bound loop's device runs its steps after the host has enqueued them)."""
    span = steps_span(ctx, ctx.steps())
    if span is not None:
        lo, hi = span
        inside = tuple(g for g in samples if lo <= g.t_ns <= hi)
        if inside:
            return inside, "while the steps ran"
    return samples, "over the run"


def _reference(g: GpuSample) -> tuple[int | None, str]:
    if g.app_sm_clock_mhz:
        return g.app_sm_clock_mhz, "applications clock"
    if g.max_sm_clock_mhz:
        return g.max_sm_clock_mhz, "maximum clock"
    return None, ""


def device_throttle(ctx: RuleContext, index: int, samples: tuple[GpuSample, ...]) -> DeviceThrottle:
    t = ctx.thresholds
    mine = [g for g in samples if g.index == index]
    busy = [g for g in mine if g.util_pct is not None and g.util_pct >= t.throttle_busy_util_pct]
    by_kind = {name: 0 for name, _ in _KINDS}
    affected = slowed = at_cap = 0
    ratios: list[float] = []
    refs: list[tuple[int, str]] = []
    for g in busy:
        reasons = set(g.throttle_reasons)
        hit = False
        for name, kinds in _KINDS:
            if reasons.intersection(kinds):
                by_kind[name] += 1
                hit = True
        ref, label = _reference(g)
        if ref and g.sm_clock_mhz:
            r = g.sm_clock_mhz / ref
            ratios.append(r)
            refs.append((ref, label))
            if r < 1.0 - t.throttle_clock_deficit_pct / 100.0:
                slowed += 1
                hit = True
        if g.power_w is not None and g.power_limit_w and g.power_w >= g.power_limit_w * t.power_cap_ratio_pct / 100.0:
            at_cap += 1
        affected += hit
    sm = [g.sm_clock_mhz for g in busy if g.sm_clock_mhz]
    limits = [g.power_limit_w for g in busy if g.power_limit_w]
    temps = [g.temp_c for g in busy if g.temp_c is not None]
    ref_mhz, label = (statistics.mode(refs) if refs else (None, ""))
    return DeviceThrottle(
        index=index,
        samples=len(mine),
        busy=len(busy),
        affected=affected,
        by_kind=by_kind,
        slowed=slowed,
        at_cap=at_cap,
        clock_ratio_median=statistics.median(ratios) if ratios else None,
        deficit_mean=statistics.fmean(max(0.0, 1.0 - r) for r in ratios) if ratios else None,
        reference=label,
        ref_mhz=ref_mhz,
        sm_median_mhz=int(statistics.median(sm)) if sm else None,
        power_limit_w=statistics.median(limits) if limits else None,
        temp_max_c=max(temps) if temps else None,
    )


def _fix(d: DeviceThrottle) -> str:
    kinds = sorted(((n, k) for k, n in d.by_kind.items() if n), reverse=True)
    parts = []
    for _, kind in kinds:
        if kind == "thermal slowdown":
            parts.append("it slows down to stay within its temperature limit"
                         + (f" (up to {d.temp_max_c:.0f} °C)" if d.temp_max_c is not None else "")
                         + ": improve the cooling (inlet temperature, fans, airflow, heat sink), "
                           "`nvidia-smi -q -d TEMPERATURE` shows the limits")
        elif kind == "power cap":
            parts.append("it runs at its power limit"
                         + (f" ({d.power_limit_w:.0f} W)" if d.power_limit_w else "")
                         + ": `nvidia-smi -q -d POWER` shows the default and enforced limits; restore the default "
                           "where it was lowered (`sudo nvidia-smi -pl <W>`), or accept the cap (lower precision, "
                           "GD401, does more work per joule)")
        else:
            parts.append("the hardware slowed it (HW slowdown: the power supply or an external power brake): check "
                         "the power supply and its cables")
    if not parts and d.slowed:
        parts.append(f"its SM clock sat below the {d.reference} with no reason NVML reports: check "
                     "`nvidia-smi -q -d CLOCK,PERFORMANCE` and reset lowered applications clocks (`sudo nvidia-smi -rac`)")
    return ("The GPU is throttled: " + "; ".join(parts) + ". On a shared or cloud machine, this is for its operator: "
            "until then, step times measured here are slower than the GPU can run.")


def check(ctx: RuleContext) -> RuleResult:
    t = ctx.thresholds
    samples = ctx.samples_gpu()
    if not samples:
        if not ctx.has_gpu():
            return RuleResult.not_applicable(ctx.no_gpu_reason())
        reason = ctx.manifest.not_collected_reason("nvml") if ctx.manifest is not None else ""
        return RuleResult.cannot_judge("no NVML samples" + (f": {reason}" if reason else " (a bare trace has none)"))
    span, when = _in_steps(ctx, samples)
    devices = sorted({g.index for g in span})
    found = [device_throttle(ctx, i, span) for i in devices]
    busy = [d for d in found if d.busy]
    if not busy:
        return RuleResult.fine(
            f"no NVML sample {when} had the GPU at work ({t.throttle_busy_util_pct:g}% utilization or more): "
            "its clocks did not limit this run (GD101 says what the GPU waited for)"
        )
    worst = max(busy, key=lambda d: (d.affected_pct, d.busy))
    clock = ""
    if worst.clock_ratio_median is not None and worst.ref_mhz:
        clock = (f"SM clock median {worst.sm_median_mhz:,} MHz, {100.0 * worst.clock_ratio_median:.0f}% of its "
                 f"{worst.reference} ({worst.ref_mhz:,} MHz)")
    if worst.affected_pct < t.throttle_min_share_pct:
        return RuleResult.fine(
            f"GPU {worst.index}: throttled in {fmt_pct(worst.affected_pct)} of {worst.busy} busy samples {when} "
            f"(threshold {t.throttle_min_share_pct:g}%)" + (f"; {clock}" if clock else "")
        )
    kinds = ", ".join(f"{name} {fmt_pct(100.0 * n / worst.busy)}" for name, n in
                      sorted(worst.by_kind.items(), key=lambda kv: -kv[1]) if n)
    message = (
        f"GPU {worst.index} throttled in {fmt_pct(worst.affected_pct)} of its busy samples ({worst.affected} of "
        f"{worst.busy}, {when})" + (f": {kinds}" if kinds else "")
        + (f"; {clock}" if clock else "")
        + (f"; power at the cap ({worst.power_limit_w:.0f} W) in {fmt_pct(100.0 * worst.at_cap / worst.busy)}"
           if worst.at_cap and worst.power_limit_w else "")
        + (f"; about {fmt_pct(worst.loss_pct)} of the run's time lost to the lower clock"
           if worst.loss_pct is not None and worst.loss_pct > 0 else "")
    )
    notes = [f"GPU {d.index}: throttled in {fmt_pct(d.affected_pct)} of {d.busy} busy samples"
             for d in busy if d is not worst]
    metrics = [
        Metric("throttled_pct", round(worst.affected_pct, 1), "%", f"busy samples of GPU {worst.index}"),
        Metric("busy_samples", worst.busy, "count"),
        Metric("samples", worst.samples, "count"),
        *(Metric(f"{name.replace(' ', '_')}_pct", round(100.0 * n / worst.busy, 1), "%", "busy samples")
          for name, n in worst.by_kind.items()),
        Metric("clock_slowed_pct", round(100.0 * worst.slowed / worst.busy, 1), "%", "busy samples"),
        Metric("sm_clock_median_mhz", worst.sm_median_mhz, "MHz"),
        Metric("reference_clock_mhz", worst.ref_mhz, "MHz", worst.reference),
        Metric("power_at_cap_pct", round(100.0 * worst.at_cap / worst.busy, 1), "%", "busy samples"),
        Metric("power_limit_w", worst.power_limit_w, "W"),
        Metric("temperature_max_c", worst.temp_max_c, "°C"),
        Metric("estimated_loss_pct", round(worst.loss_pct, 2) if worst.loss_pct is not None else None, "%", "the run"),
    ]
    finding = ctx.finding(
        message,
        Fix(_fix(worst), _BEFORE, _AFTER),
        share_pct=None,
        severity_pct=worst.loss_pct,
        confidence=Confidence.MEASURED,
        metrics=metrics,
        notes=notes,
        gain_note="the clock deficit while the GPU worked, times the share of the time it worked: kernels bound by "
        "the SM clock run that much slower (not a part of the step's account: every part on the GPU shrinks with it)",
    )
    return RuleResult.fired(finding)


RULE = Rule(
    code="GD106",
    name="gpu-throttled",
    title="The GPU ran below its clock while it worked (thermal, power cap, hardware slowdown)",
    technique="Keep the GPU at its clocks (cooling, power limit)",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.SAMPLES},
    self_checked={Need.GPU, Need.SAMPLES},
    not_injectable="cooling, power limits and clocks are the machine's, not the script's",
)
