"""The checklist of a report: the 13 techniques of the seed checklist, then every rule they leave out.

Each item is applied / recommended / no problem seen / not applicable / not
measurable here, with the reason. "Applied" needs positive evidence: the setting
was read from the run, or the trace shows the technique in use (a
``_MultiProcessingDataLoaderIter`` proves DataLoader workers, copies from pinned
memory prove pinning, Tensor Core kernels prove reduced precision); a rule that
looked and found nothing to fix says "no problem seen", which is not the same.
A technique's status comes from, in order:

1. any of its rules fired → recommended (with the largest gain of those findings);
2. it cannot apply: the run has no DataLoader, or no workers to prefetch with, or
   it is GPU-only and the run had no GPU → not applicable;
3. the settings or the trace show it in use → applied (the setting and its
   `file:line`, or what the trace shows);
4. otherwise its rules' verdicts, the most informative first: looked and saw it
   in use → applied, looked and found nothing → no problem seen, could not judge
   → not measurable, does not apply → not applicable (one rule that could not
   judge outweighs one to which it does not apply). A technique whose rules judge only
   its symptom (torch.compile: GD103's launch overhead) is not measurable when neither
   the settings nor the trace (Inductor's ``triton_``/``cpp_fused_`` kernels) say
   whether it is used: "no problem seen" there would read as a verdict on it.

"Applied" means the *script* chose the technique: a setting it passed or set
(an argument left at the library's default, such as DataLoader's
``prefetch_factor=2``, is not a choice), or what the trace shows the script's
code doing. gpudoctor's own instruments (its torch.profiler window, its NVML
sampler) are not the script's: they make the run measurable, they do not apply
the technique.

A rule outside the 13 techniques gets its own item, from its verdict the same way,
titled with the technique that answers it (``Rule.technique``), not the problem.

A ``check`` report lists the same items, judged from the source: by a rule of the
item (``StaticCheck.judges`` in its module), or, for a technique no rule covers, by
its ``static`` judge here (``gpudoctor.static.checklist``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpudoctor.model.findings import ChecklistItem, ChecklistStatus, Gain
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import location_of
from gpudoctor.rules.registry import Rule
from gpudoctor.rules.results import RuleResult, Verdict
from gpudoctor.rules.static_api import StaticContext, StaticJudge
from gpudoctor.rules.static_api.text import first_of

# (in use?, what the settings say); None when the settings do not tell
InUse = Callable[[RuleContext], tuple[bool | None, str]]

def _status(r: RuleResult) -> ChecklistStatus:
    if r.verdict == Verdict.FIRED:
        return ChecklistStatus.RECOMMENDED
    if r.verdict == Verdict.FINE:
        return ChecklistStatus.APPLIED if r.applied else ChecklistStatus.NO_PROBLEM_SEEN
    if r.verdict == Verdict.NOT_APPLICABLE:
        return ChecklistStatus.NOT_APPLICABLE
    return ChecklistStatus.NOT_MEASURABLE


# merging several rules' verdicts into one item: the most informative first
_PREFERENCE = (
    ChecklistStatus.APPLIED,
    ChecklistStatus.NO_PROBLEM_SEEN,
    ChecklistStatus.NOT_MEASURABLE,
    ChecklistStatus.NOT_APPLICABLE,
)


@dataclass(frozen=True, slots=True)
class Technique:
    number: int
    key: str
    title: str
    codes: tuple[str, ...]
    gpu_only: str = ""  # why it needs a GPU, when it does
    in_use: InUse | None = None
    special: Callable[[RuleContext], tuple[ChecklistStatus, str]] | None = None  # no rule: judged here
    # When ``in_use`` says no, the technique does not apply at all (prefetching without workers):
    # its rules' findings belong to the technique that enables it.
    needs_in_use: bool = False
    # Why the technique cannot apply to this run ("" when it can): no DataLoader, no copies …
    absent: Callable[[RuleContext], str] | None = None
    # When not in use and its rules see nothing to fix, why its gain still cannot be judged
    # (torch.compile fuses kernels: what that wins shows only once compiled).
    gain_unmeasurable: str = ""
    # In use, it stays applied even when one of its rules fired: the finding then advises beyond the
    # technique (GD103 on compiled code: CUDA graphs; GD105: recompilations), never to adopt it again.
    applied_over_findings: bool = False
    # Whether its rules' "applied" verdicts show this technique in use. False when they speak of another
    # technique its rules share (GD201's "applied" is DataLoader workers, not a prefetch_factor the script set).
    rules_show_use: bool = True
    # How `gpudoctor check` judges it from the source, for a technique no rule covers (a rule's own
    # judges are in its module: StaticCheck.judges).
    static: StaticJudge | None = None


def _where(site) -> str:
    loc = location_of(site)
    return f" at {loc}" if loc else ""


def _loader_in_trace(ctx: RuleContext) -> str:
    """"multi-process" / "single-process" when a trace of the run shows the DataLoader's iterator."""
    kinds = {m.dataloader_iter for m in ctx.metrics if m.dataloader_iter}
    return "multi-process" if "multi-process" in kinds else next(iter(kinds), "")


def _no_loader(ctx: RuleContext) -> str:
    """Why the DataLoader techniques do not apply: the run has none."""
    s = ctx.settings
    if s is not None and ctx.manifest is not None and not s.dataloaders:
        return "no DataLoader in this run"
    if s is None and ctx.metrics and not _loader_in_trace(ctx) and not ctx.steps():
        return "no DataLoader iteration in the trace"
    return ""


def _pin(ctx: RuleContext) -> tuple[bool | None, str]:
    dl = ctx.main_dataloader()
    if dl is not None:
        return dl.pin_memory, f"pin_memory={dl.pin_memory}{_where(dl.call_site)}"
    h2d = [x for m in ctx.gpu_traces() for x in m.transfers if x.direction == "HtoD"]
    pinned = sum(x.count for x in h2d if x.memory_kind == "pinned")
    pageable = sum(x.count for x in h2d if x.memory_kind == "pageable")
    if pageable:
        return False, f"the trace shows {pageable} host→device copies from pageable memory"
    if pinned:
        return True, f"the trace shows {pinned} host→device copies from pinned memory and none from pageable memory"
    return None, ""


def _no_copies(ctx: RuleContext) -> str:
    if ctx.main_dataloader() is not None or not ctx.gpu_traces():
        return ""
    if any(x.direction == "HtoD" for m in ctx.gpu_traces() for x in m.transfers):
        return ""
    return "no host→device copies in the trace"


def _workers(ctx: RuleContext) -> tuple[bool | None, str]:
    dl = ctx.main_dataloader()
    if dl is not None:
        return dl.num_workers > 0, f"num_workers={dl.num_workers}{_where(dl.call_site)}"
    kind = _loader_in_trace(ctx)
    if kind == "multi-process":
        return True, "the trace shows _MultiProcessingDataLoaderIter: the DataLoader has worker processes"
    if kind == "single-process":
        return False, "the trace shows _SingleProcessDataLoaderIter: the DataLoader loads in the main process (num_workers=0)"
    return None, ""


def _prefetch(ctx: RuleContext) -> tuple[bool | None, str]:
    dl = ctx.main_dataloader()
    if dl is None:
        kind = _loader_in_trace(ctx)
        if kind == "multi-process":
            return True, (
                "the trace shows DataLoader workers, which prefetch (prefetch_factor is not in a trace; 2 by default)"
            )
        if kind == "single-process":
            return False, "the trace shows _SingleProcessDataLoaderIter: prefetching starts with workers (see num_workers > 0 above)"
        return None, ""
    if dl.num_workers == 0:
        return False, f"num_workers=0{_where(dl.call_site)}: prefetching starts with workers (see num_workers > 0 above)"
    pf = dl.prefetch_factor if dl.prefetch_factor is not None else _PREFETCH_DEFAULT
    chosen = "prefetch_factor" in dl.passed_args if dl.passed_args is not None else pf != _PREFETCH_DEFAULT
    if chosen:
        return True, f"prefetch_factor={pf} with {dl.num_workers} workers{_where(dl.call_site)}"
    # the library's default, which the script did not choose: not "applied"
    how = ("the call does not pass it" if dl.passed_args is not None
           else "its default value; this run does not record whether the call passed it")
    return None, (f"prefetch_factor={pf} with {dl.num_workers} workers{_where(dl.call_site)}: DataLoader's default "
                  f"({how})")


_PREFETCH_DEFAULT = 2  # torch.utils.data.DataLoader's prefetch_factor when it has workers and the call passes none


def _flag(suffix: str) -> InUse:
    def in_use(ctx: RuleContext) -> tuple[bool | None, str]:
        s = ctx.settings
        if s is None:
            return None, ""
        for f in s.flags:
            if f.name.endswith(suffix):
                if f.call_site is None and f.value is True:  # on by default (or by the environment): not the script's choice
                    return None, f"{f.name}={f.value!r} (the default: the script does not set it)"
                where = f" (set{_where(f.call_site)})" if f.call_site is not None else " (default)"
                return f.value is True, f"{f.name}={f.value!r}{where}"
        return None, ""

    return in_use


def _compile(ctx: RuleContext) -> tuple[bool | None, str]:
    s = ctx.settings
    if s is None:
        # a bare trace: Inductor's generated kernels (triton_… on a GPU, cpp_fused_… on a CPU) or compiled
        # regions (analysis.compiled)
        names = [k.name for m in ctx.metrics if m.kernels is not None for k in m.kernels.top]
        names += [k.name for m in ctx.metrics if m.compiled is not None for k in m.compiled.top_triton]
        generated = [n for n in names if n.startswith(("triton_", "cpp_fused_"))]
        if generated:
            return True, f"the trace shows kernels generated by torch.compile (Inductor), e.g. {generated[0][:60]}"
        if any(m.compiled is not None and m.compiled.compiled for m in ctx.metrics):
            return True, "the trace shows torch.compile's compiled regions (Torch-Compiled Region, CompiledFunction)"
        return None, ""
    for w in s.wrappers:
        if w.kind == "torch.compile":
            return True, f"torch.compile{_where(w.call_site)}"
    return False, "torch.compile not used"


def _amp(ctx: RuleContext) -> tuple[bool | None, str]:
    s = ctx.settings
    if s is None:
        return None, ""
    for a in s.autocast:
        if a.enabled:
            old = "; deprecated torch.cuda.amp spelling: use torch.amp" if a.deprecated_api else ""
            return True, f"autocast({a.device_type}, {a.dtype}){_where(a.call_site)}{old}"
    return False, "no autocast"


def _profiler(ctx: RuleContext) -> tuple[ChecklistStatus, str]:
    n = len(ctx.metrics)
    mf = ctx.manifest
    if mf is not None and mf.profiler_owner == "user":
        return ChecklistStatus.APPLIED, (
            f"the script runs torch.profiler itself ({n} Kineto trace(s) of it analysed here; `gpudoctor view` "
            "opens them in TensorBoard)"
        )
    if n and mf is None:  # a trace given to `gpudoctor analyze`: recorded by the script's own profiler
        return ChecklistStatus.APPLIED, (
            f"{n} Kineto trace(s) recorded with torch.profiler analysed here; `gpudoctor view` opens them in TensorBoard"
        )
    if n:
        return ChecklistStatus.NOT_APPLICABLE, (
            f"gpudoctor profiled this run with torch.profiler itself ({n} Kineto trace(s) analysed here; `gpudoctor "
            "view` opens them in TensorBoard): the script needs no profiler of its own"
        )
    reason = mf.not_collected_reason("torch.profiler") if mf is not None else ""
    return ChecklistStatus.NOT_MEASURABLE, f"no torch.profiler trace in this run{': ' + reason if reason else ''}"


def _torchscript(ctx: RuleContext) -> tuple[ChecklistStatus, str]:
    s = ctx.settings
    if s is not None:
        for w in s.wrappers:
            if w.kind.startswith("torch.jit"):
                return ChecklistStatus.APPLIED, f"{w.kind}{_where(w.call_site)}; torch.compile supersedes it for training"
    return ChecklistStatus.NOT_APPLICABLE, (
        "TorchScript is in maintenance: for speed, torch.compile replaces it; "
        "for deployment, torch.export"
    )


def _monitoring(ctx: RuleContext) -> tuple[ChecklistStatus, str]:
    gpu = ctx.samples_gpu()
    if gpu:  # gpudoctor's own sampler, not the script's monitoring
        interval = ctx.run.samples.interval_ms if ctx.run.samples is not None else None
        every = f" every {interval:g} ms" if interval else ""
        return ChecklistStatus.NOT_APPLICABLE, (
            f"the NVML samples of this run are gpudoctor's own{every} ({len(gpu)} samples: utilization, memory, "
            "clocks, power); nvprof is retired, Nsight Systems replaces it"
        )
    if not ctx.has_gpu():
        return ChecklistStatus.NOT_APPLICABLE, ctx.no_gpu_reason()
    reason = ctx.manifest.not_collected_reason("nvml") if ctx.manifest is not None else ""
    return ChecklistStatus.NOT_MEASURABLE, f"no NVML samples{': ' + reason if reason else ' (a bare trace has none)'}"


def _profiler_in_source(src: StaticContext) -> tuple[ChecklistStatus, str]:
    return ChecklistStatus.NOT_MEASURABLE, (
        "a static check does not run the script: `gpudoctor profile SCRIPT` records torch.profiler traces"
    )


def _torchscript_in_source(src: StaticContext) -> tuple[ChecklistStatus, str]:
    jit = [src.location(fn, f.site) for fn, f in src.facts("jit") if src.active(fn, f.ctx)]
    if jit:
        return ChecklistStatus.APPLIED, f"TorchScript at {first_of(jit)}; torch.compile supersedes it for training"
    return ChecklistStatus.NOT_APPLICABLE, "TorchScript is in maintenance: for speed, torch.compile replaces it"


def _monitoring_in_source(src: StaticContext) -> tuple[ChecklistStatus, str]:
    return ChecklistStatus.NOT_MEASURABLE, "a run-time measurement: `gpudoctor profile` samples NVML during the run"


TECHNIQUES: tuple[Technique, ...] = (
    Technique(1, "pinned-memory", "pin_memory=True in the DataLoader (pinned, non-blocking copies)",
              ("GD301", "GD302"), gpu_only="pinned memory speeds host→device copies", in_use=_pin, absent=_no_copies),
    Technique(2, "dataloader-workers", "num_workers > 0 in the DataLoader",
              ("GD201", "GD202", "GD204"), in_use=_workers, absent=_no_loader),
    Technique(3, "batch-size", "A batch size that fills the GPU", ("GD104", "GD103")),
    Technique(4, "cudnn-benchmark", "torch.backends.cudnn.benchmark = True (fixed input shapes)",
              ("GD403",), gpu_only="cuDNN runs on the GPU", in_use=_flag("cudnn.benchmark")),
    Technique(5, "loss-on-device", "Loss and criterion on the GPU", ("GD702",),
              gpu_only="there is no device to move the loss to"),
    Technique(6, "no-grad-eval", "torch.no_grad() / inference_mode() in evaluation", ("GD701",)),
    Technique(7, "profiler", "Profile with torch.profiler", (), special=_profiler, static=_profiler_in_source),
    Technique(8, "prefetch", "Prefetching with prefetch_factor", ("GD201",), in_use=_prefetch, needs_in_use=True,
              absent=_no_loader, rules_show_use=False),
    Technique(9, "torch-compile", "torch.compile(model)", ("GD103", "GD105"), in_use=_compile,
              gain_unmeasurable="what kernel fusion wins shows only once compiled: compare two runs",
              applied_over_findings=True),
    Technique(10, "amp", "Mixed precision (torch.autocast, TF32)", ("GD401", "GD402"),
              gpu_only="Tensor Cores are a GPU feature", in_use=_amp),
    Technique(11, "torchscript", "torch.jit.script / torch.jit.trace", (), special=_torchscript,
              static=_torchscript_in_source),
    Technique(12, "gpu-monitoring", "Monitor the GPU (nvidia-smi / NVML, Nsight Systems)", (), special=_monitoring,
              static=_monitoring_in_source),
    Technique(13, "cpu-bottlenecks", "Reduce CPU bottlenecks (main process, threads, allocator)",
              ("GD203", "GD204", "GD205", "GD503")),
)


def _best_gain(results: list[RuleResult]) -> Gain | None:
    gains = [f.gain for r in results for f in r.findings]
    if not gains:
        return None
    return max(gains, key=lambda g: (g.share_pct is not None, g.share_pct or 0.0))


def _fired_reason(pairs: list[tuple[str, RuleResult]]) -> str:
    parts = [f"{code}: {r.findings[0].message}" for code, r in pairs if r.verdict == Verdict.FIRED and r.findings]
    return "; ".join(parts)


def _from_verdicts(pairs: list[tuple[str, RuleResult]]) -> tuple[ChecklistStatus, str]:
    for status in _PREFERENCE:
        chosen = [(c, r) for c, r in pairs if _status(r) == status]
        if chosen:
            return status, "; ".join(f"{c}: {r.reason}" for c, r in chosen)
    return ChecklistStatus.NOT_MEASURABLE, "no rule judged it"


def build_checklist(
    ctx: RuleContext,
    rules: tuple[Rule, ...],
    results: dict[str, RuleResult],
    skipped: dict[str, str],
) -> tuple[ChecklistItem, ...]:
    """``results``: code → the rule's result; ``skipped``: code → why it did not run (ignored by
    the configuration, crashed, static only)."""
    items: list[ChecklistItem] = []
    covered: set[str] = set()
    for t in TECHNIQUES:
        covered.update(t.codes)
        items.append(_technique_item(ctx, t, results, skipped))
    for rule in rules:
        if rule.code in covered:
            continue
        if rule.code in results:
            r = results[rule.code]
            status = _status(r)
            gain = _best_gain([r]) if r.verdict == Verdict.FIRED else None
            reason = r.findings[0].message if r.verdict == Verdict.FIRED and r.findings else r.reason
        else:
            status, reason, gain = ChecklistStatus.NOT_MEASURABLE, skipped.get(rule.code, "not run"), None
        items.append(ChecklistItem(rule.name, rule.technique or rule.title, status, reason, (rule.code,), gain, None))
    return tuple(items)


def _technique_item(
    ctx: RuleContext, t: Technique, results: dict[str, RuleResult], skipped: dict[str, str]
) -> ChecklistItem:
    missing = "; ".join(f"{c}: {skipped[c]}" for c in t.codes if c not in results and c in skipped)

    def item(status: ChecklistStatus, reason: str, gain: Gain | None = None) -> ChecklistItem:
        if missing and missing not in reason:
            reason = f"{reason}; {missing}" if reason else missing
        return ChecklistItem(t.key, t.title, status, reason, t.codes, gain, t.number)

    if t.special is not None:
        status, reason = t.special(ctx)
        return item(status, reason)
    absent = t.absent(ctx) if t.absent is not None else ""
    if absent:
        return item(ChecklistStatus.NOT_APPLICABLE, absent)
    in_use, text = t.in_use(ctx) if t.in_use is not None else (None, "")
    if t.needs_in_use and in_use is False:
        return item(ChecklistStatus.NOT_APPLICABLE, text)
    pairs = [(c, results[c]) for c in t.codes if c in results]
    fired = [(c, r) for c, r in pairs if r.verdict == Verdict.FIRED]
    if fired and t.applied_over_findings and in_use is True:
        return item(ChecklistStatus.APPLIED, f"{text}; {_fired_reason(fired)}")
    if fired:
        return item(ChecklistStatus.RECOMMENDED, _fired_reason(fired), _best_gain([r for _, r in fired]))
    if t.gpu_only and not ctx.has_gpu():
        return item(ChecklistStatus.NOT_APPLICABLE, f"{ctx.no_gpu_reason()}: {t.gpu_only}")
    if in_use is True:
        return item(ChecklistStatus.APPLIED, text)
    if not pairs:
        why = "; ".join(f"{c}: {skipped.get(c, 'not run')}" for c in t.codes)
        return item(ChecklistStatus.NOT_MEASURABLE, why or "no rule judges it")
    status, reason = _from_verdicts(pairs)
    if status == ChecklistStatus.APPLIED and not t.rules_show_use:  # its rules saw another technique in use
        status = ChecklistStatus.NO_PROBLEM_SEEN
    if in_use is None and text and status != ChecklistStatus.APPLIED:  # what the settings say, though not a choice
        reason = f"{text}; {reason}"
    if in_use is None and t.gain_unmeasurable and status in (ChecklistStatus.APPLIED, ChecklistStatus.NO_PROBLEM_SEEN):
        # its rules judge the symptom, not whether the technique is used: neither applied nor a verdict
        return item(ChecklistStatus.NOT_MEASURABLE, f"whether it is used is not recorded here; {t.gain_unmeasurable} "
                                                    f"({reason})")
    if in_use is False:
        if status in (ChecklistStatus.APPLIED, ChecklistStatus.NO_PROBLEM_SEEN):
            if t.gain_unmeasurable:
                return item(ChecklistStatus.NOT_MEASURABLE, f"{text}; {t.gain_unmeasurable} ({reason})")
            return item(ChecklistStatus.NO_PROBLEM_SEEN, f"{text}; nothing to gain in this run ({reason})")
        return item(status, f"{text}; {reason}")
    return item(status, reason)
