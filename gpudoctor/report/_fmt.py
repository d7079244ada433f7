"""Display helpers shared by the renderers: units, labels, ordering. No computation.

Every number a renderer shows comes from the ``Report``; these functions only turn
a value into text (``12.3 ms``, ``1.5 GiB``, ``38.0%``) and give the fixed labels,
colours and order of the components of a step, severities and checklist statuses.
"""

from __future__ import annotations

import html
import math
import os
import re
from collections.abc import Iterable
from typing import Any

from gpudoctor import safe
from gpudoctor.model import (
    COMPONENT_LABELS,
    Account,
    Action,
    ChecklistItem,
    ChecklistStatus,
    Component,
    Finding,
    Fix,
    Gain,
    Manifest,
    Metric,
    RankRow,
    RankSummary,
    Report,
    Severity,
    TraceMetrics,
    Verification,
    VerifyStatus,
)
from gpudoctor.model.units import duration_text, pct_text, size_text

# --------------------------------------------------------------------------- numbers


def number(value: float | int) -> str:
    """A plain number: integers with thousands separators, floats with 3 significant figures."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return "n/a"
    a = abs(value)
    if a == 0:
        return "0"
    if a >= 100:
        return f"{value:,.0f}"
    if a >= 10:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    if a >= 0.01:
        return f"{value:.3f}"
    return f"{value:.2g}"


def duration(ns: float | int | None) -> str:
    """Nanoseconds as ``850 ns``, ``12.3 µs``, ``45.6 ms`` or ``1.23 s`` (the stderr summary too)."""
    return duration_text(ns)


def size(n: float | int | None) -> str:
    """Bytes in binary units: ``512 B``, ``3.20 MiB``, ``1.50 GiB`` (the rules' messages use the same)."""
    return size_text(n)


def pct(value: float | int | None, digits: int = 1) -> str:
    """A share: ``38.0%`` (``gpudoctor.model.units``)."""
    return pct_text(value, digits=digits)


def with_unit(value: Any, unit: str = "") -> str:
    """A value with its unit as the model names it ("%", "ns", "ms", "bytes", "GB/s", "x", "count" …)."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return f"{value} {unit}".strip() if unit and unit not in ("str", "text") else value
    if isinstance(value, (int, float)):
        u = unit.strip()
        if u in ("%", "pct", "percent"):
            return pct(value)
        if u == "ns":
            return duration(value)
        if u in ("us", "µs"):
            return duration(value * 1e3)
        if u == "ms":
            return duration(value * 1e6)
        if u == "s":
            return duration(value * 1e9)
        if u in ("bytes", "B", "byte"):
            return size(value)
        if u in ("x", "×"):
            return f"{number(value)}×"
        if u in ("", "count"):
            return number(value)
        return f"{number(value)} {u}"
    if isinstance(value, (list, tuple)):
        return ", ".join(with_unit(v) for v in value)
    return f"{value} {unit}".strip()


_WORDS = {"h2d": "host→device", "d2h": "device→host", "gpu": "GPU", "cpu": "CPU", "nvml": "NVML", "ns": "time",
          "pct": "share", "hta": "(HTA window)", "1ms": "1 ms", "10us": "10 µs", "dtoh": "device→host",
          "htod": "host→device", "ddp": "DDP", "api": "API"}


def metric_label(name: str) -> str:
    """A metric's field name in words: ``data_wait_share_pct`` → ``data wait share``,
    ``pageable_h2d_ns`` → ``pageable host→device time``."""
    out: list[str] = []
    for w in name.split("_"):
        word = _WORDS.get(w, w)
        if not word or (word == "share" and out and out[-1] == "share"):
            continue
        out.append(word)
    return " ".join(out)


def metric_text(m: Metric) -> str:
    """``data wait share: 38.0% (of steps)``."""
    s = f"{metric_label(m.name)}: {with_unit(m.value, m.unit)}"
    return f"{s} (of {m.window})" if m.window else s


def snippet_label(fix: Fix) -> str:
    """Where a fix's before/after come from: ``your code at train.py:31``, or ``an illustration (why)``;
    with ``gpudoctor check --fix`` when it makes the change. Empty for reports written before these fields."""
    if fix.source is not None:
        text = f"your code at {fix.source.file}:{fix.source.line}"
    elif fix.illustration:
        text = f"an illustration ({fix.illustration})"
    else:
        return ""
    return text + ("; `gpudoctor check --fix` makes this change" if fix.automatic else "")


def gain_text(g: Gain | None) -> str:
    """``38.0% of step time at stake, up to 1.61× faster``; empty when nothing is known. A finding
    whose claimed time another finding wins first says so instead of "0.0%"."""
    if g is None:
        return ""
    if g.share_pct is not None and g.share_pct <= 0 and g.included_in:
        return f"none of its own: its time is included in {', '.join(g.included_in)}"
    parts = []
    if g.expected_share_pct is not None:
        parts.append(f"expected −{pct(g.expected_share_pct)} of step time"
                     + (f", about {number(g.expected_speedup)}× faster" if g.expected_speedup is not None else "")
                     + (f" ({g.expected_note})" if g.expected_note else ""))
    if g.share_pct is not None:
        parts.append(f"{'at most ' if g.expected_share_pct is not None else ''}{pct(g.share_pct)} of step time at stake")
    if g.speedup_bound is not None:
        parts.append(f"up to {number(g.speedup_bound)}× faster")
    text = ", ".join(parts)
    if g.note:
        text = f"{text} ({g.note})" if text else g.note
    return text


# --------------------------------------------------------------------------- the account


def account_title(a: Account) -> str:
    """``rank 0: 5 ProfilerStep windows``: which ledger the account is of."""
    return f"{a.ledger.label}: {a.ledger.window}"


def account_now(a: Account) -> str:
    """``now 160.0 ms per step (mean of 120 unprofiled steady steps)``."""
    if not a.step_ns:
        return ""
    return f"now {duration(a.step_ns)} per step ({a.step_source})"


def action_text(a: Action) -> str:
    """``GD401 no-amp: −22.0% expected (up to −37.0%) of step time → about 136 ms (≥ 109 ms) per step``.

    The bound is the whole share at stake: the step after the fix is at least its figure (≥). An
    action whose rule has no model shows the bound alone: ``−50.5% at most → ≥ 7.19 s``."""
    rank = f" (rank {a.rank})" if a.rank is not None else ""
    if a.expected_pct is not None:
        how = "measured by --verify" if a.measured_pct is not None else "expected"
        # a confirmed fix that holds no part of the account: no bound to show
        bound = f"(up to −{pct(a.gain_pct)})" if a.components or a.measured_pct is None else "(outside the account's parts)"
        gain = f"−{pct(a.expected_pct)} {how} {bound} of step time"
        after = ""
        if a.step_ns_expected and a.step_ns_after:
            after = f" → about {duration(a.step_ns_expected)} (≥ {duration(a.step_ns_after)}) per step"
        elif a.step_ns_after:
            after = f" → ≥ {duration(a.step_ns_after)} per step"
        elif a.step_ns_expected:
            after = f" → about {duration(a.step_ns_expected)} per step"
        return f"{a.code} {a.name}{rank}: {gain}{after}"
    after = f" → ≥ {duration(a.step_ns_after)} per step" if a.step_ns_after else ""
    return f"{a.code} {a.name}{rank}: up to −{pct(a.gain_pct)} of step time{after}"


def tried_text(a: Action) -> str:
    """``GD201 dataloader-stall: --verify refuted it (up to −38.6% of step time was at stake)``."""
    rank = f" (rank {a.rank})" if a.rank is not None else ""
    if a.gain_pct <= 0:  # it held no part of the account
        return f"{a.code} {a.name}{rank}: tried by --verify, did not help"
    return f"{a.code} {a.name}{rank}: tried by --verify, did not help (up to −{pct(a.gain_pct)} of step time was at stake)"


def account_parts(a: Account) -> list[tuple[str, float, int, str]]:
    """The ledger's parts as (component, % of step time, ns per window, side), largest first."""
    n = max(a.ledger.windows, 1)
    rows = [(s.component, s.pct, int(round(s.ns / n)), s.side) for s in a.ledger.slices]
    return sorted(rows, key=lambda r: (-r[1], r[0]))

# --------------------------------------------------------------------------- --verify

VERIFY_LABELS: dict[VerifyStatus, str] = {
    VerifyStatus.CONFIRMED: "confirmed",
    VerifyStatus.REFUTED: "refuted",
    VerifyStatus.INCONCLUSIVE: "inconclusive",
    VerifyStatus.NOT_TRIED: "not tried",
}


def verification_text(v: Verification | None) -> str:
    """``confirmed: 1.72× faster with the fix: …``; empty when the finding was not verified."""
    if v is None:
        return ""
    return f"{VERIFY_LABELS[v.status]}: {v.reason}"


def verification_changes(v: Verification | None) -> str:
    """What the trial runs changed, in words; empty when nothing was tried."""
    if v is None or not v.changes:
        return ""
    return "; ".join(c.text or f"{c.key}={c.value!r}" for c in v.changes)


# --------------------------------------------------------------------------- components of a step

C = Component

# Device-side parts (the GPU busy) in greens and blues, host-side parts in warm colours (after the
# Okabe–Ito palette, readable with colour-vision deficiencies); unexplained is light grey.
COMPONENT_COLORS: dict[str, str] = {
    C.GPU_FP32_CONV.value: "#2CA02C",
    C.GPU_FP32_MATMUL.value: "#005F46",
    C.GPU_CONV.value: "#8FD175",
    C.GPU_MATMUL.value: "#4C9A2A",
    C.GPU_OPTIMIZER.value: "#44AA99",
    C.GPU_COMPUTE.value: "#009E73",
    C.H2D.value: "#56B4E9",
    C.D2H.value: "#0072B2",
    C.COMM_EXPOSED.value: "#332288",
    C.DATA_LOADING.value: "#E69F00",
    C.SYNC_WAIT.value: "#D55E00",
    C.LAUNCH_OVERHEAD.value: "#CC6677",
    C.OPTIMIZER.value: "#CC79A7",
    C.CPU_COMPUTE.value: "#009E73",
    C.FORWARD.value: "#88CCEE",
    C.BACKWARD.value: "#117733",
    C.OTHER_CPU.value: "#F0E442",
    C.DEPENDENCY_WAIT.value: "#882255",
    C.UNEXPLAINED.value: "#BBBBBB",
}
EXTRA_COLORS = ("#8C564B", "#7F7F7F", "#17BECF", "#BCBD22")

# One letter per part for the terminal bar without colour.
COMPONENT_LETTERS: dict[str, str] = {
    C.GPU_FP32_CONV.value: "V",
    C.GPU_FP32_MATMUL.value: "M",
    C.GPU_CONV.value: "c",
    C.GPU_MATMUL.value: "m",
    C.GPU_OPTIMIZER.value: "o",
    C.GPU_COMPUTE.value: "G",
    C.H2D.value: "H",
    C.D2H.value: "h",
    C.COMM_EXPOSED.value: "N",
    C.DATA_LOADING.value: "D",
    C.SYNC_WAIT.value: "S",
    C.LAUNCH_OVERHEAD.value: "L",
    C.OPTIMIZER.value: "O",
    C.CPU_COMPUTE.value: "W",
    C.FORWARD.value: "f",
    C.BACKWARD.value: "b",
    C.OTHER_CPU.value: "C",
    C.DEPENDENCY_WAIT.value: "w",
    C.UNEXPLAINED.value: ".",
}


def component_order(keys: Iterable[str]) -> list[str]:
    """Known components in ``Component`` order, then unknown keys sorted."""
    keys = list(keys)
    known = [c.value for c in Component if c.value in keys]
    return known + sorted(k for k in keys if k not in COMPONENT_LABELS)


def component_label(key: str) -> str:
    return COMPONENT_LABELS.get(key, key.replace("_", " "))


def component_color(key: str) -> str:
    if key in COMPONENT_COLORS:
        return COMPONENT_COLORS[key]
    return EXTRA_COLORS[sum(map(ord, key)) % len(EXTRA_COLORS)]


# --------------------------------------------------------------------------- findings and checklist

SEVERITY_LABELS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "info"}

STATUS_ORDER = (
    ChecklistStatus.APPLIED,
    ChecklistStatus.RECOMMENDED,
    ChecklistStatus.NO_PROBLEM_SEEN,
    ChecklistStatus.NOT_APPLICABLE,
    ChecklistStatus.NOT_MEASURABLE,
)
STATUS_LABELS = {
    ChecklistStatus.APPLIED: "applied",
    ChecklistStatus.RECOMMENDED: "recommended",
    ChecklistStatus.NO_PROBLEM_SEEN: "no problem seen",
    ChecklistStatus.NOT_APPLICABLE: "not applicable",
    ChecklistStatus.NOT_MEASURABLE: "not measurable here",
}


def rel_path(path: str, base: str | None = None) -> str:
    """``path`` relative to the working directory (``base``) when it lies under it; as given
    otherwise. Reports name the user's files the way their repository does."""
    if not path or not os.path.isabs(path):
        return path
    base = base or os.getcwd()
    try:
        rel = os.path.relpath(path, base)
    except ValueError:  # another drive (Windows)
        return path
    return path if rel.startswith("..") else rel


def group_by_reason(items: Iterable[ChecklistItem]) -> list[tuple[str, list[ChecklistItem]]]:
    """Checklist items that give the same reason, together, in first-seen order: one sentence
    per distinct reason, not one per item."""
    groups: dict[str, list[ChecklistItem]] = {}
    for it in items:
        groups.setdefault(it.reason, []).append(it)
    return list(groups.items())


def checklist_by_status(items: Iterable[ChecklistItem]) -> list[tuple[ChecklistStatus, list[ChecklistItem]]]:
    """The checklist grouped by status (applied, recommended, n/a, not measurable), order kept within."""
    items = list(items)
    return [(s, [i for i in items if i.status == s]) for s in STATUS_ORDER if any(i.status == s for i in items)]


def severity_counts(findings: Iterable[Finding]) -> str:
    """``1 error, 2 warnings`` (empty when there are none)."""
    findings = list(findings)
    parts = []
    for sev, word in ((Severity.ERROR, "error"), (Severity.WARNING, "warning"), (Severity.INFO, "info")):
        n = sum(1 for f in findings if f.severity == sev)
        if n:
            parts.append(f"{n} {word}" + ("s" if n > 1 and word != "info" else ""))
    return ", ".join(parts)


def findings_headline(report: Report) -> str:
    n = len(report.findings)
    if n == 0:
        return "no findings"
    return f"{n} finding{'s' if n != 1 else ''} ({severity_counts(report.findings)})"


# --------------------------------------------------------------------------- run and traces


def trace_label(m: TraceMetrics, index: int) -> str:
    """``rank 3 (trace.pt.trace.json.gz)`` or the file name."""
    name = re.split(r"[\\/]", m.path)[-1] if m.path else f"trace {index + 1}"
    return f"rank {m.rank} ({name})" if m.rank is not None else name


# --------------------------------------------------------------------------- ranks

RANK_HEADER = ("rank", "steps", "step median", "step p90", "collectives", "exposed", "work / step", "")


def rank_cells(row: RankRow, mixed_jobs: bool = False) -> list[str]:
    """One row of the per-rank table, as text: rank (``3 of 8`` when jobs are mixed), steps,
    step median and p90, time in collectives per profiled step, exposed communication (% of
    the profiled step time), work per profiled step, and the straggler flag."""
    label = f"{row.rank} of {row.world_size}" if mixed_jobs and row.world_size else str(row.rank)
    return [
        label,
        f"{row.steps:,}",
        duration(row.step_median_ns),
        duration(row.step_p90_ns),
        duration(row.comm_ns),
        pct(row.comm_exposed_pct),
        duration(row.work_median_ns),
        "straggler" if row.straggler else "",
    ]


def mixed_jobs(rows: Iterable[RankRow]) -> bool:
    return len({r.world_size for r in rows}) > 1


def rank_summary_lines(s: RankSummary | None) -> list[str]:
    """The cross-rank comparison in sentences (straggler, imbalance, what was compared, notes)."""
    if s is None:
        return []
    out: list[str] = []
    basis = (
        "work per profiled step (step time minus exposed communication)"
        if s.basis == "work"
        else "step wall time"
    )
    of = f" of world size {s.world_size}" if s.world_size else ""
    if s.ranks >= 2:
        out.append(f"compared: {s.ranks} ranks{of} on {basis}, {s.compared_steps} step(s) side by side")
    if s.straggler_rank is not None:
        out.append(
            f"straggler: rank {s.straggler_rank}, {duration(s.slowest_excess_ns)} per step above the median of the "
            f"other ranks, who wait for it {pct(s.slowest_excess_pct)} of every step "
            f"(that far behind in {s.slowest_in_steps} of {s.compared_steps} compared steps)"
        )
    elif s.slowest_rank is not None:
        out.append(
            f"no straggler: the slowest, rank {s.slowest_rank}, is {duration(s.slowest_excess_ns)} "
            f"({pct(s.slowest_excess_pct)} of the step) above the others, "
            f"{s.slowest_in_steps} of {s.compared_steps} compared steps that far behind"
            + (f"; the others vary by {duration(s.jitter_ns)} from step to step" if s.jitter_ns is not None else "")
        )
    parts = []
    if s.step_imbalance is not None:
        parts.append(f"step time {number(s.step_imbalance)}×")
    if s.work_imbalance is not None:
        parts.append(f"work {number(s.work_imbalance)}×")
    if parts:
        out.append("imbalance (max / median over ranks): " + ", ".join(parts))
    out.extend(f"note: {n}" for n in s.notes)
    return out


def run_line(manifest: Manifest | None) -> str:
    """``python train.py --epochs 1 · completed (stopped after 40 steps) · 42.10 s``."""
    if manifest is None:
        return ""
    parts = []
    if manifest.command:
        parts.append("gpudoctor profile " + " ".join(manifest.command))
    parts.append(manifest.status_text)
    if manifest.duration_s is not None:
        parts.append(duration(manifest.duration_s * 1e9))
    return " · ".join(parts)


# untrusted text: one implementation for the reports and gpudoctor's own terminal lines
clean = safe.clean
one_line = safe.one_line


def markup(text: object) -> str:
    """Untrusted text in HTML or SVG (element text, titles, attribute values): control characters and
    bidirectional overrides shown as visible escapes (``safe.clean``), then ``& < > " '`` escaped.
    The one escaping function of the HTML report and its SVG charts; Markdown (``markdown.esc``)
    and SARIF start from the same ``clean``."""
    return html.escape(clean(text), quote=True)


_CODE = re.compile(r"`([^`\n]+)`")


def code_parts(text: object) -> list[tuple[bool, str]]:
    """One-line text split at `backtick` pairs: [(is_code, part)], so renderers can show code as code."""
    line = one_line(text)
    out: list[tuple[bool, str]] = []
    pos = 0
    for m in _CODE.finditer(line):
        if m.start() > pos:
            out.append((False, line[pos : m.start()]))
        out.append((True, m.group(1)))
        pos = m.end()
    if pos < len(line):
        out.append((False, line[pos:]))
    return out
