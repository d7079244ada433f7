"""The rule engine: runs the selected rules over one analysed run and builds the report.

``diagnose(run, config, kind)``:

- runs every rule of the registry that the configuration enables (``select`` /
  ``ignore``), each on a ``RuleContext`` holding the run, its trace metrics and the
  thresholds, once what it needs (``Rule.needs``: a GPU, a trace, steps, settings …) is
  there; a rule whose need is missing "cannot judge", with the reason (``rules.needs``);
- a rule that raises does not crash the report: it becomes a finding with the
  reserved code ``GD000`` (``internal-error``, severity warning, confidence inferred)
  that names the rule and the exception, a line in ``Report.errors``, and a
  "not measurable here" checklist entry for that rule. ``GD000`` is never a rule
  module's code. With ``GPUDOCTOR_DEBUG`` set the exception propagates instead;
- grants the ledger parts the findings claim, each part once (``rules.account``,
  docs/account.md), so that a finding's gain is its exclusive share of the step and its
  severity follows from it; GD101 (the GPU-idle headline) names the findings granted its
  causes;
- sorts findings by what fixing them wins: the headline (GD101) after every cause, then
  severity, then gain (the larger expected share of step time first, the bound where a rule has
  no model; findings whose gain cannot be put in time after those that can), then code, rank
  and message: the same input always gives
  the same order;
- builds the account (where the step goes and the top actions, ``Report.account``), the
  checklist (``rules.checklist``), the headline numbers (``SummaryStat``),
  the environment, the per-rank rows of a multi-trace run, and the catalogue of the
  rules that ran (``RuleInfo``), so renderers compute nothing.

``write_report_json(report, run_dir)`` writes ``report.json`` into the run directory.
"""

from __future__ import annotations

import json
import os
import stat
import statistics
import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from gpudoctor import __version__
from gpudoctor.config import Config
from gpudoctor.errors import ConfigError, RunDirError
from gpudoctor.model import layout
from gpudoctor.model.findings import (
    REPORT_SCHEMA_VERSION,
    Confidence,
    Evidence,
    Finding,
    Fix,
    Gain,
    Location,
    RankRow,
    RankSummary,
    Report,
    RuleInfo,
    RunData,
    Severity,
    SummaryStat,
)
from gpudoctor.model.metrics import LedgerBasis
from gpudoctor.model.run import CallSite
from gpudoctor.model.selectors import primary_trace, trace_label
from gpudoctor.model.steady import StepFigures, StepSource
from gpudoctor.rules import INTERNAL_ERROR_CODE, INTERNAL_ERROR_NAME
from gpudoctor.rules.account import assign_gains, build_account, is_headline, point_headline
from gpudoctor.rules.checklist import build_checklist
from gpudoctor.rules.compilation import compiled_summary
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.device import gpu_samples_in_steps, memory_peak
from gpudoctor.rules.distributed import figures as rank_figures_of
from gpudoctor.rules.gd405_below_roofline import roofline_summary
from gpudoctor.rules.registry import Rule, all_rules
from gpudoctor.rules.results import RuleResult

KINDS = ("profile", "analyze")


# --------------------------------------------------------------------------- running rules


def _check_selection(config: Config, rules: tuple[Rule, ...]) -> None:
    """Every select/ignore entry must match at least one rule (a typo would silently run nothing)."""
    codes = [r.code for r in rules]
    for what, entries in (("select", config.select), ("ignore", config.ignore)):
        for entry in entries:
            if not any(c.startswith(entry.upper()) for c in codes):
                src = f" in {config.source}" if config.source else ""
                raise ConfigError(
                    f"{what}{src}: {entry!r} matches no rule; run `gpudoctor rules` to list the codes"
                )


def internal_error_finding(rule: Rule, err: BaseException) -> Finding:
    where = ""
    tb = traceback.extract_tb(err.__traceback__)
    if tb:
        last = tb[-1]
        where = f" at {Path(last.filename).name}:{last.lineno}"
    return Finding(
        code=INTERNAL_ERROR_CODE,
        name=INTERNAL_ERROR_NAME,
        severity=Severity.WARNING,
        confidence=Confidence.INFERRED,
        message=f"rule {rule.code} {rule.name} crashed: {type(err).__name__}: {err}{where}; its checks are missing from this report",
        fix=Fix(
            "This is a bug in gpudoctor, not in your script: please report it with this message "
            "(GPUDOCTOR_DEBUG=1 shows the traceback); `--ignore "
            f"{rule.code}` silences it meanwhile."
        ),
        evidence=Evidence(notes=(f"rule {rule.code}", f"{type(err).__name__}: {err}")),
        gain=Gain(None, None, "a rule that did not run"),
    )


def run_rules(
    ctx: RuleContext, config: Config, rules: tuple[Rule, ...]
) -> tuple[dict[str, RuleResult], dict[str, str], list[Finding], list[str], list[str]]:
    """(results by code, why others did not run, findings, errors, codes run)."""
    results: dict[str, RuleResult] = {}
    skipped: dict[str, str] = {}
    findings: list[Finding] = []
    errors: list[str] = []
    ran: list[str] = []
    for rule in rules:
        if not config.rule_enabled(rule.code):
            src = config.source or "the command line"
            skipped[rule.code] = f"not run: excluded by select/ignore ({src})"
            continue
        if rule.check is None:
            skipped[rule.code] = "judged by `gpudoctor check` only"
            continue
        ran.append(rule.code)
        rctx = ctx.for_rule(rule.code, rule.name)
        try:
            # what it cannot judge without (Rule.needs), checked here for every rule: a missing need is
            # "cannot judge" with its reason, and the rule's own function does not run
            missing = rule.unmet(rctx)
            result = RuleResult.cannot_judge(missing) if missing is not None else rule.body(rctx)
            if not isinstance(result, RuleResult):
                raise TypeError(f"check returned {type(result).__name__}, not RuleResult")
        except Exception as err:  # a bug in a rule must not take the report down
            if os.environ.get("GPUDOCTOR_DEBUG"):
                raise
            findings.append(internal_error_finding(rule, err))
            errors.append(f"rule {rule.code} {rule.name} crashed: {type(err).__name__}: {err}")
            skipped[rule.code] = f"not measurable: rule crashed ({type(err).__name__}: {err})"
            continue
        results[rule.code] = result
        for f in result.findings:
            if f.code != rule.code or f.name != rule.name:
                raise TypeError(f"rule {rule.code} returned a finding with code {f.code}")
        findings.extend(result.findings)
    return results, skipped, findings, errors, ran


def sort_key(f: Finding) -> tuple:
    # what the fix wins: measured by --verify where it confirmed it (nothing where it refuted it), else
    # its rule's model, else the bound
    share = f.gain.rank_pct
    v = f.verification
    if v is not None and v.status.value == "confirmed" and v.speedup and v.speedup > 1.0:
        share = 100.0 * (1.0 - 1.0 / v.speedup)
    elif v is not None and v.status.value == "refuted":
        share = 0.0
    return (
        is_headline(f),
        f.severity.rank,
        share is None,
        -(share or 0.0),
        f.code,
        -1 if f.rank is None else f.rank,
        f.message,
    )


# --------------------------------------------------------------------------- summary


def _stat(key: str, label: str, value, unit: str = "", window: str = "") -> SummaryStat:
    if isinstance(value, float):
        # a share to 2 decimals, as the rules' metrics keep theirs: one value in every place it
        # is shown (37.748% would print 37.7 here and 37.8 from a metric's 37.75)
        value = round(value, 2 if unit == "%" else 3)
    return SummaryStat(key, label, value, unit, window)


_PHASE_LABELS = {
    "data_wait": "waiting for data",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer.step()",
    "other": "other (the loop's own work)",
}
_MARKERS = {
    "optimizer": "optimizer.step()",
    "backward": "loss.backward()",
    "module": "the root module's forward",
    "dataloader": "DataLoader batches",
}


def _step_marker(mf) -> str:  # noqa: ANN001 - Manifest | None
    """What marked the steps, and why, as every report says it."""
    if mf is None:
        return ""
    if mf.step_source_reason:
        return mf.step_source_reason
    return _MARKERS.get(mf.step_source, "")  # a run recorded before the reason was written


def _step_stats(out: list[SummaryStat], figs: StepFigures, window: str) -> None:
    """The step time of the steps of ``window`` (the run's figure: their mean, total ÷ count) and its spread,
    each named as what it is."""
    out.append(_stat("step_time", "step time", figs.step_ms or 0.0, "ms", window))
    out.append(_stat("step_time_median", "step time, median (spread)", figs.median_ms or 0.0, "ms", window))
    out.append(_stat("step_time_p90", "step time, p90 (spread)", figs.p90_ms or 0.0, "ms", window))


def build_summary(ctx: RuleContext, findings: list[Finding]) -> tuple[SummaryStat, ...]:
    run = ctx.run
    out: list[SummaryStat] = []
    mf = run.manifest
    if mf is not None:
        out.append(_stat("run_status", "run", mf.status_text))
        if mf.duration_s is not None:
            out.append(_stat("duration", "duration", mf.duration_s, "s"))
    if run.steps:
        step_ranks = {s.rank for s in run.steps if s.rank is not None}
        if len(step_ranks) > 1:
            per_rank = max(sum(1 for s in run.steps if s.rank == r) for r in step_ranks)
            out.append(_stat("steps", f"steps recorded (per rank, {len(step_ranks)} ranks)", per_rank, "count"))
        else:
            out.append(_stat("steps", "steps recorded", len(run.steps), "count"))
        marker = _step_marker(mf)
        if marker:
            out.append(_stat("step_marker", "steps marked by", marker))
        settled = ctx.settling()  # the step time changed midway: which part the figures are of
        if settled is not None:
            out.append(_stat("step_time_change", "step time changed", settled.text()))
        # the run's figures (analysis.figures), which the stderr line of `gpudoctor profile` prints too
        figs = ctx.figures.job.step  # of the unprofiled steps where there are enough (model.steady.figure_steps)
        window = (f"{figs.steps} {'unprofiled ' if figs.unprofiled else ''}steady steps"
                  + (f" of {len(step_ranks)} ranks" if len(step_ranks) > 1 else ""))
        # the rate the loop sustains: CUDA events where the steps carry them (a GPU-bound loop's host
        # wall time is the time to enqueue a step, not to run it)
        timed = f"{window}, {figs.source.value}" if figs.source != StepSource.WALL else window
        _step_stats(out, figs, timed)
        if figs.data_wait_pct is not None:
            out.append(_stat("data_wait_share", "waiting for data", figs.data_wait_pct, "%", window))
    elif mf is not None and mf.steps_seen:
        out.append(_stat("steps", "steps seen", mf.steps_seen, "count"))
        marker = _step_marker(mf)
        if marker:
            out.append(_stat("step_marker", "steps marked by", marker))
    elif mf is not None and mf.step_source in ("time", "none"):
        out.append(_stat("step_marker", "steps", _step_marker(mf) or "none found"))
    if mf is not None and mf.profiler_owner == "user":
        out.append(_stat("trace_source", "traces from",
                         "the script's own torch.profiler (two profilers cannot record at once: gpudoctor's gave way)"))
    # the trace the headline numbers come from: the account's (its timings-only window where there is one)
    m = ctx.primary_trace() or primary_trace(run.metrics)
    if m is None or not m.breakdown_mean_pct:  # no trace breakdown: the hooks' phase times stand in
        phases = ctx.phase_shares_pct()
        if phases is not None:
            for key, value in phases.items():
                if value is not None:
                    out.append(_stat(f"phase_{key}", f"step (host): {_PHASE_LABELS[key]}", value, "%", "steps"))
    if m is not None:
        label = f" ({trace_label(m)})" if len(run.metrics) > 1 else ""
        if len(run.metrics) > 1:
            out.append(_stat("traces", "traces", len(run.metrics), "count"))
        if m.steps:
            # every window of the process counts (a run writes one trace per window): no file name
            same = [x for x in run.metrics if x.rank == m.rank]
            ranks = {x.rank for x in run.metrics}
            who = f" (rank {m.rank})" if m.rank is not None and len(ranks) > 1 else ""
            out.append(_stat("profiled_steps", f"profiled steps{who}", sum(len(x.steps) for x in same), "count",
                             f"{len(same)} trace{'s' if len(same) != 1 else ''}" if len(same) > 1 else ""))
            tr = ctx.figures.trace_step(m)
            if not run.steps and tr is not None:
                _step_stats(out, tr, f"{tr.steps} ProfilerStep windows")
        u = ctx.util(m)
        if u is not None:
            if u.idle_pct_steps is not None:
                # the process's traces together: the figure the account splits into causes
                led = ctx.ledger(m)
                idle = led.idle_pct if led is not None and led.basis == LedgerBasis.GPU else u.idle_pct_steps
                out.append(_stat("gpu_idle", f"GPU idle{label}", idle, "%", "steps"))
            # another window than the headline's, so another name: one name, one value
            out.append(_stat("gpu_idle_span", f"GPU idle over the trace span{label}", u.idle_pct_span, "%", "span"))
            if u.idle_pct_hta is not None:
                out.append(_stat("gpu_idle_hta", f"GPU idle, HTA window{label}", u.idle_pct_hta, "%", "hta"))
        elif not m.has_gpu_activity:
            out.append(_stat("gpu_idle", "GPU idle", f"n/a: {ctx.no_gpu_reason()}"))
        sync_share = ctx.trace_share(m, m.syncs.total_ns) if m.syncs is not None and m.syncs.count else None
        if sync_share is not None:  # the figure GD102 and GD302 print, of the same window
            w = ctx.window(m)
            out.append(_stat("host_sync_share", "host blocked in syncs", sync_share, "%",
                             w.kind.value if w is not None else "trace"))
        h2d = [x for x in m.transfers if x.direction == "HtoD"]
        if h2d:
            out.append(_stat("h2d_bytes", "host→device copied", sum(x.bytes for x in h2d), "bytes", "trace"))
            out.append(_stat("h2d_time", "host→device copy time", sum(x.dur_ns for x in h2d) / 1e6, "ms", "trace"))
        if m.kernels is not None and m.kernels.count:
            out.append(_stat("kernels", "kernels", m.kernels.count, "count", "trace"))
            out.append(_stat("kernels_under_10us", "kernels under 10 µs", m.kernels.under_10us_pct, "%", "kernels"))
        # achieved TFLOP/s against the device's peak (GD405's figures): the ops' shapes, from the window that recorded them
        out.extend(roofline_summary(ctx.detail_of(m, "shapes") or m))
    compiled = compiled_summary(ctx, m)  # torch.compile and CUDA graphs: what runs compiled, warm-up, recompilations
    if compiled:
        out.append(_stat("compiled", "compiled", compiled, "", "trace" if m is not None else "run"))
    peak = memory_peak(ctx, m)
    if peak is not None:
        out.append(_stat("peak_gpu_memory", "peak GPU memory", peak.pct, "%", f"the device ({peak.source})"))
    cpu, n_cpu, when = ctx.main_cpu_pct()  # the figure GD203 judges and prints
    if cpu is not None:
        out.append(_stat("main_cpu", "training process CPU (median)", cpu, "%",
                         f"one core; {n_cpu} sample{'s' if n_cpu != 1 else ''} {when}"))
    out.extend(_nvml_stats(ctx, m))
    cores = ctx.cpu_count()
    if cores is not None:
        out.append(_stat("cpu_count", "CPU cores", cores, "count"))
    counts = {s: sum(1 for f in findings if f.severity == s) for s in Severity}
    out.append(_stat("findings", "findings",
                     f"{counts[Severity.ERROR]} error, {counts[Severity.WARNING]} warning, {counts[Severity.INFO]} info"))
    return tuple(out)


def _nvml_stats(ctx: RuleContext, m) -> list[SummaryStat]:  # noqa: ANN001 - TraceMetrics | None
    """NVML's utilization, memory used and power of the GPU the account is of, median of the samples
    taken while the steady steps ran (on the device's timeline: to the end of their CUDA-event time),
    the window named; every sample where none was taken then."""
    device = None
    if m is not None:
        u = ctx.util(m)
        device = m.timelines.device if m.timelines is not None else u.device if u is not None else None
    if device is not None and not any(g.index == device for g in ctx.samples_gpu()):
        device = None
    samples, when = gpu_samples_in_steps(ctx, device)
    window = f"{len(samples)} sample{'s' if len(samples) != 1 else ''} {when}"
    out = []
    for key, label, unit, values in (
        ("gpu_util_nvml", "GPU utilization, NVML (median)", "%", [g.util_pct for g in samples]),
        ("gpu_memory_nvml", "GPU memory used, NVML (median)", "bytes", [g.mem_used_bytes for g in samples]),
        ("gpu_power_nvml", "GPU power, NVML (median)", "W", [g.power_w for g in samples]),
    ):
        vals = [v for v in values if v is not None]
        if vals:
            value = statistics.median(vals)
            out.append(_stat(key, label, int(value) if unit == "bytes" else float(value), unit, window))
    return out


def build_environment(run: RunData) -> dict[str, str]:
    env: dict[str, str] = {"gpudoctor": __version__}
    mf = run.manifest
    if mf is not None:
        for k, v in sorted(mf.versions.items()):
            if v:
                env[k] = str(v)
        if mf.hostname:
            env["host"] = mf.hostname
        if mf.cpu_count:
            env["cpu_count"] = str(mf.cpu_count)
        devices = [
            d.name
            + (f" (cc {d.compute_capability}" if d.compute_capability else " (")
            + (f", {d.total_memory_bytes / 2**30:.0f} GiB)" if d.total_memory_bytes else ")")
            for d in mf.devices
        ]
        env["devices"] = "; ".join(devices) if devices else "none (no GPU)"
        if mf.world_size:
            env["world_size"] = str(mf.world_size)
    elif run.metrics:
        names = []
        for m in run.metrics:
            for d in m.devices:
                text = d.name + (f" (cc {d.compute_capability})" if d.compute_capability else "")
                if text and text not in names:
                    names.append(text)
        env["devices"] = "; ".join(names) if names else "unknown (not in the trace)"
        platforms = sorted({m.platform for m in run.metrics})
        env["platform"] = ", ".join(platforms)
        ws = [m.world_size for m in run.metrics if m.world_size]
        if ws:
            env["world_size"] = str(ws[0])
    if run.settings is not None:
        env["device_type"] = run.settings.device_type
    return env


def build_ranks(ctx: RuleContext) -> tuple[tuple[RankRow, ...], RankSummary | None]:
    """Per-rank rows and the cross-rank summary (``analysis.ranks``, with GD603's thresholds, so
    the table's straggler is the rule's)."""
    fig = rank_figures_of(ctx)
    return fig.rows, fig.summary


# --------------------------------------------------------------------------- entry points


def diagnose(run: RunData, config: Config, kind: str = "analyze") -> Report:
    """Run the enabled rules over ``run`` and build the ``Report``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    rules = all_rules()
    _check_selection(config, rules)
    ctx = RuleContext(run, config.thresholds, loader_source=loader_source_of(run))
    results, skipped, findings, errors, ran = run_rules(ctx, config, rules)
    findings = point_headline(ctx, assign_gains(ctx, findings))
    findings.sort(key=sort_key)
    findings = from_source(findings, run)
    results = {code: _granted(r, findings) for code, r in results.items()}
    checklist = build_checklist(ctx, rules, results, skipped)
    rank_rows, rank_summary = build_ranks(ctx)
    return Report(
        schema_version=REPORT_SCHEMA_VERSION,
        gpudoctor_version=__version__,
        kind=kind,
        source=run.source,
        created_at=datetime.now().astimezone().isoformat(timespec="seconds"),
        findings=tuple(findings),
        checklist=checklist,
        summary=build_summary(ctx, findings),
        environment=build_environment(run),
        run=run,
        ranks=rank_rows,
        rank_summary=rank_summary,
        account=build_account(ctx, findings, rank_summary.slowest_rank if rank_summary else None,
                              rank_summary.slowest_excess_ns if rank_summary else None),
        errors=tuple(errors),
        warnings=tuple(run.manifest.warnings()) if run.manifest is not None else (),
        rules_run=tuple(ran),
        rules=tuple(RuleInfo(r.code, r.name, r.title, r.doc) for r in rules if r.code in ran),
    )


# --------------------------------------------------------------------------- before/after from the source

MAX_SOURCE_BYTES = 4 * 1024 * 1024  # a file larger than this is no training script: not read for a snippet


def _source_reader(run: RunData):  # noqa: ANN202 - (file) -> (text or None, why not)
    """Reads the files a run's call sites name, once each: relative to the run's working directory, regular
    files only (a FIFO would block), and the script only while its SHA-256 is the one it ran with."""
    import hashlib

    from gpudoctor.rewrite import RewriteError, decode_source

    mf = run.manifest
    cache: dict[str, tuple[str | None, str]] = {}

    def read(file: str) -> tuple[str | None, str]:
        path = os.path.abspath(file if os.path.isabs(file) or mf is None else os.path.join(mf.cwd, file))
        if path not in cache:
            cache[path] = _read_one(path, file)
        return cache[path]

    def _read_one(path: str, file: str) -> tuple[str | None, str]:
        try:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                return None, f"{file} is not a regular file"
            if st.st_size > MAX_SOURCE_BYTES:
                return None, f"{file} is too large to quote"
            with open(path, "rb") as fh:
                data = fh.read(MAX_SOURCE_BYTES + 1)
        except FileNotFoundError:
            return None, f"{file} is not at hand here"
        except OSError as err:
            return None, f"{file} cannot be read ({err.strerror or err})"
        script = mf.script if mf is not None else None
        if (script and mf.script_sha256 and os.path.abspath(script) == path
                and hashlib.sha256(data).hexdigest() != mf.script_sha256):
            return None, f"{file} changed since the run"
        try:
            return decode_source(data).text, ""
        except RewriteError as err:
            return None, f"{file} cannot be read ({err})"

    return read


def loader_source_of(run: RunData) -> Callable[[CallSite], tuple[str, bool] | None] | None:
    """What the script's source says of the DataLoader at a call site (``RuleContext.loader_source``): the
    loop that changes its dataset in place (``gpudoctor.static.loader_sources``, as ``check`` reads it), read
    once per file where the file is at hand and unchanged since the run; None for a run without settings."""
    if run.settings is None or not run.settings.dataloaders:
        return None
    read = _source_reader(run)
    mf = run.manifest
    files: dict[str, dict[int, tuple[str, bool]]] = {}

    def source(site: CallSite) -> tuple[str, bool] | None:
        if site.file not in files:
            files[site.file] = {}
            text, _why = read(site.file)
            if text is not None:
                path = os.path.abspath(site.file if os.path.isabs(site.file) or mf is None
                                       else os.path.join(mf.cwd, site.file))
                texts, names = {path: text}, {path: site.file}
                if mf is not None and mf.script and os.path.abspath(mf.script) != path:
                    # a DataLoader built in a module of the project: the script's loop may be the one iterating it
                    script = os.path.abspath(mf.script)
                    script_text, _ = read(script)
                    if script_text is not None:
                        texts[script] = script_text
                        names[script] = os.path.relpath(script, mf.cwd) if script.startswith(mf.cwd + os.sep) else script
                from gpudoctor.static import loader_sources

                try:
                    files[site.file] = loader_sources(Path(path), texts, names)
                except Exception:  # noqa: BLE001 - an aid to the fix: a review that fails says nothing against it
                    if os.environ.get("GPUDOCTOR_DEBUG"):
                        raise
        return files[site.file].get(site.line)

    return source


def from_source(findings: list[Finding], run: RunData) -> list[Finding]:
    """Each fix's before/after made from the user's own source where the fix is an edit at a call site the
    run recorded and the file is at hand (``gpudoctor.rewrite``: the statement as the script has it, and
    rewritten); every other before/after is marked as an illustration, with why."""
    read = None
    out: list[Finding] = []
    for f in findings:
        fix = f.fix
        if fix.source is not None or not (fix.before or fix.after):
            out.append(f)
            continue
        if not fix.edits:
            why = fix.illustration or ("no call site was recorded" if f.location is None
                                       else "the fix is more than an edit of the line it names")
            out.append(replace(f, fix=replace(fix, illustration=why)))
            continue
        read = read or _source_reader(run)
        edit = fix.edits[0]
        text, why = read(edit.file)
        if text is None:
            out.append(replace(f, fix=replace(fix, illustration=why)))
            continue
        from gpudoctor.rewrite import RewriteError, snippet

        try:
            cut = snippet(text, fix.edits)
        except RewriteError as err:
            out.append(replace(f, fix=replace(fix, illustration=f"{edit.file}:{edit.line} does not take the change: {err}")))
            continue
        where = Location(edit.file, cut.line)
        out.append(replace(f, fix=replace(fix, before=cut.before, after=cut.after, source=where, illustration="")))
    return out


def _granted(result: RuleResult, findings: list[Finding]) -> RuleResult:
    """A rule's result with its findings as granted (the checklist shows their gains)."""
    if not result.findings:
        return result
    mine = [f for f in findings if f.code == result.findings[0].code]
    return RuleResult(result.verdict, result.reason, tuple(mine) or result.findings, result.applied)


def write_report_json(report: Report, run_dir: Path) -> None:
    """Write ``report.json`` (``Report.to_dict()``) into ``run_dir``, atomically."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory; pass the run directory to write {layout.REPORT} into")
    target = run_dir / layout.REPORT
    tmp = run_dir / layout.REPORT_TMP
    try:
        tmp.write_text(json.dumps(report.to_dict(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(target)
    except OSError as err:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # a read-only file system refuses this too
            pass
        raise RunDirError(f"{target}: cannot write the report ({err.strerror}); check the folder's permissions") from None
