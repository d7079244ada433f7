"""GD403 cudnn-benchmark-off: convolutions with fixed input shapes run with `cudnn.benchmark` off.

What it detects
---------------
A run whose GPU time includes convolution kernels, whose convolution input
shapes do not change from step to step, and where
`torch.backends.cudnn.benchmark` was left False.

Why it matters
--------------
With `benchmark=True`, cuDNN times the available convolution algorithms for
each new input shape once and keeps the fastest; with it off, a heuristic
picks one, often slower. For fixed shapes the autotuning cost is paid once.

How to fix
----------
Turn it on at start-up, unless input shapes vary (every new shape is
re-benchmarked) or bit-wise determinism is required.

Before:

```python
model = ResNet50().cuda()
```

After:

```python
torch.backends.cudnn.benchmark = True
model = ResNet50().cuda()
```

Expected gain
-------------
cuDNN's heuristics usually pick an algorithm near the fastest; autotuning
wins the rest. Where the run shows how fast this GPU runs its convolutions
(the roofline's convolution rows, by precision, each with its achieved
TFLOP/s), a row below the fastest row's rate is expected to reach it (not
beyond its own memory roof, and in TF32 only where cuDNN's `allow_tf32` is on,
its default): the expected gain is the time that saves, `time × (1 −
achieved ÷ reachable)`, over the convolution time. A heuristic that served
some shapes badly (grouped, dilated or large-filter convolutions on FP32 SIMT
kernels) then shows as a large gain; one that served them all well as a small
one. Without such a reference (no recorded shapes, or one row) the expected
gain is gpudoctor's conservative estimate, 10% of the convolution time
(`gpudoctor/rules/speedups.py`). `--verify` measures it (the flag is
injectable). The bound is the whole convolution time.

Evidence used
-------------
Settings: `torch.backends.cudnn.benchmark` and
`torch.backends.cudnn.deterministic` with the `file:line` that set them;
trace: convolution kernel time and the number of distinct convolution input
shapes (needs recorded shapes). The gain is the `gpu_conv` and `gpu_fp32_conv`
parts of the step's ledger, the latter after GD401 (docs/account.md).

Thresholds
----------
- `cudnn_conv_share_pct` (5): convolution kernel time, % of kernel time.
- `error_share_pct`, `warning_share_pct`: severity from the convolution
  time's share of step time (an upper bound: autotuning speeds convolutions
  up, it does not remove them).

Known limits
------------
Needs the run's settings (a trace does not record the flag). Without
recorded shapes, fixed shapes are inferred from the DataLoader (`drop_last`).
Not when `cudnn.deterministic` is required.

References
----------
- PyTorch performance tuning guide, `cudnn.benchmark`:
  https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
- PyTorch reproducibility notes: https://pytorch.org/docs/stable/notes/randomness.html
"""

from __future__ import annotations

import ast
import re

from gpudoctor.model.findings import (
    ChecklistStatus,
    Confidence,
    Evidence,
    Finding,
    Fix,
    Location,
    Metric,
    Severity,
)
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.model.run import Injection
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.edits import assign, at_startup, edit_fix
from gpudoctor.rules.flags import find_flag, flag_ref, flag_text
from gpudoctor.rules.formatting import fmt_ns, fmt_pct, location_of
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.speedups import CUDNN_BENCHMARK_FRACTION, autotune_fraction, conv_tf32
from gpudoctor.rules.static_api import (
    Fact,
    Function,
    Scan,
    StaticCheck,
    StaticContext,
    Watch,
    const,
    examples,
)
from gpudoctor.rules.static_api.text import NO_CUDA, first_of


def _judge(ctx: RuleContext, m: TraceMetrics, bench) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    k = m.kernels
    if k is None or k.count == 0 or k.conv_kernel_ns is None:
        return RuleResult.cannot_judge("convolution kernel time is not measured in this trace")
    conv_pct = 100.0 * k.conv_kernel_ns / k.total_ns if k.total_ns else 0.0
    if conv_pct < t.cudnn_conv_share_pct:
        return RuleResult.not_applicable(
            f"convolutions take {fmt_pct(conv_pct)} of kernel time (threshold {t.cudnn_conv_share_pct:g}%)"
        )
    notes: list[str] = []
    confidence = Confidence.MEASURED
    if m.conv_shapes_total is not None and m.conv_shapes_max_per_step:
        variety = m.conv_shapes_total / m.conv_shapes_max_per_step
        if variety > t.cudnn_shape_variety_ratio:
            return RuleResult.not_applicable(
                f"convolution input shapes vary ({m.conv_shapes_total} distinct, {m.conv_shapes_max_per_step} in "
                "one step): benchmark mode would re-tune for each new shape"
            )
        notes.append(
            f"fixed shapes: {m.conv_shapes_total} distinct convolution input shapes, {m.conv_shapes_max_per_step} per step"
        )
    else:
        dl = ctx.main_dataloader()
        confidence = Confidence.INFERRED
        notes.append("input shapes not recorded: fixed shapes assumed (batches of one size"
                     + (", drop_last=True" if dl is not None and dl.drop_last else "") + ")")
    share = ctx.trace_share(m, k.conv_kernel_ns)
    expected, expected_note = _expected(ctx, m)
    message = (
        f"convolutions take {fmt_pct(conv_pct)} of kernel time with fixed input shapes and "
        f"{flag_text(bench)}: cuDNN picks algorithms by heuristic instead of timing them"
    )
    loc = location_of(bench.call_site)
    script = ctx.manifest.script if ctx.manifest is not None else None
    site = bench.call_site
    edits = ((assign(site.file, site.line, "benchmark", True),) if site is not None
             else (at_startup(script, 1, "torch.backends.cudnn.benchmark = True"),) if script else ())
    finding = ctx.finding(
        message,
        edit_fix(
            "Set `torch.backends.cudnn.benchmark = True` at start-up"
            + (f" (now False at {loc})" if loc else "")
            + "; not when input shapes vary or bit-wise determinism is required.",
            "model = ResNet50().cuda()",
            "torch.backends.cudnn.benchmark = True\nmodel = ResNet50().cuda()",
            *edits,
            illustration="the script's source is not at hand" if edits else "the run names no script (python -m)",
        ),
        share_pct=share,
        confidence=confidence,
        metrics=[
            Metric("conv_kernel_ns", k.conv_kernel_ns, "ns"),
            Metric("conv_kernel_pct", round(conv_pct, 1), "%", "kernel time"),
        ],
        settings=[flag_ref(bench)],
        notes=notes,
        location=loc,
        gain_note="GPU time of convolution kernels; autotuning shortens it (upper bound)",
        rank=m.rank,
        claims=[(Component.GPU_CONV, None), (Component.GPU_FP32_CONV, None)],
        ledger=ctx.ledger(m),
        expected=expected,
        expected_note=expected_note,
    )
    return RuleResult.fired(finding)


def _expected(ctx: RuleContext, m: TraceMetrics) -> tuple[float, str]:
    """The share of the convolution time autotuning is expected to win: measured on the run's own
    convolutions where the roofline has a reference (``speedups.autotune_fraction``), else gpudoctor's
    conservative estimate."""
    r = m.roofline
    measured = (autotune_fraction(r.rows, conv_tf32(ctx.settings), r.peak.memory_gbps if r.peak else None)
                if r is not None else None)
    if measured is None:
        return CUDNN_BENCHMARK_FRACTION, (
            f"autotuning wins ~{CUDNN_BENCHMARK_FRACTION:.0%} of convolution time over cuDNN's heuristic choice "
            "(gpudoctor's conservative estimate; --verify measures it)")
    fraction, slow_ns, best = measured
    return fraction, (
        f"the convolutions run at different rates on this GPU: {fmt_ns(slow_ns)} of their kernels run below the "
        f"{best:.1f} TFLOP/s its fastest convolutions reached, which autotuning is expected to reach for them "
        "(within each one's memory roof; --verify measures it)")


def check(ctx: RuleContext) -> RuleResult:
    bench = find_flag(ctx, "cudnn.benchmark")
    if bench is None:
        return RuleResult.cannot_judge("the run's settings do not record cudnn.benchmark")
    if bench.value is True:  # applied when the script set it; on by default (a build, the environment) it is no choice
        return RuleResult.fine(flag_text(bench), applied=bench.call_site is not None)
    det = find_flag(ctx, "cudnn.deterministic")
    if det is not None and det.value is True:
        return RuleResult.not_applicable(f"determinism required: {flag_text(det)}")
    if not ctx.gpu_traces():
        return RuleResult.cannot_judge("no trace with GPU kernels to measure convolution time")
    return ctx.per_trace(lambda m: _judge(ctx, m, bench), use="shapes")  # the input shapes: the detailed window


def inject(finding: Finding, ctx: RuleContext) -> tuple[Injection, ...] | str:
    """--verify: torch.backends.cudnn.benchmark = True before the script, kept when it writes the flag."""
    return (Injection("flag", "torch.backends.cudnn.benchmark", True,
                      text="torch.backends.cudnn.benchmark = True, kept when the script sets it"),)


# --------------------------------------------------------------------------- `gpudoctor check`

CONV_LAYERS = frozenset(
    f"torch.nn.{kind}{d}d"
    for kind in ("Conv", "ConvTranspose", "LazyConv", "LazyConvTranspose")
    for d in (1, 2, 3)
) | frozenset(
    f"torch.nn.modules.conv.{kind}{d}d" for kind in ("Conv", "ConvTranspose") for d in (1, 2, 3)
)  # functional convolutions are left out: they also serve CPU augmentation in Datasets

#: torchvision / timm model families that are convolutional networks.
CNN_FAMILIES = re.compile(
    r"^(resnet|resnext|wide_resnet|vgg|densenet|mobilenet|efficientnet|convnext|regnet|alexnet|googlenet|"
    r"inception|shufflenet|squeezenet|mnasnet|fcn_|deeplabv3|lraspp|fasterrcnn|maskrcnn|keypointrcnn|"
    r"retinanet|ssd|ssdlite|fcos|r3d|r2plus1d|mc3|s3d|unet|csp|darknet|dla|dpn|ghostnet|hrnet|nfnet|"
    r"rexnet|selecsls|res2net|resnest|seresnet|senet|tresnet|xception|cspresnet)",
    re.IGNORECASE,
)
CUDNN_BENCHMARK = "torch.backends.cudnn.benchmark"
CUDNN_DETERMINISTIC = "torch.backends.cudnn.deterministic"
DETERMINISTIC_ALGORITHMS = "torch.use_deterministic_algorithms"


def _conv_layer(scan: Scan, node: ast.Call, q: str) -> None:
    scan.record("conv", node, extra=q)


def _cnn_model(scan: Scan, node: ast.Call, q: str) -> bool:
    """A torchvision / timm / hub model of a convolutional family."""
    if q.startswith("torchvision.models."):
        cnn = bool(CNN_FAMILIES.match(q.rsplit(".", 1)[-1]))
    elif q in ("timm.create_model", "torch.hub.load"):
        cnn = any(
            isinstance(a, ast.Constant) and isinstance(a.value, str) and CNN_FAMILIES.match(a.value) for a in node.args
        )
    else:
        cnn = False
    if cnn:
        scan.record("conv", node, extra=q)
    return cnn


def _deterministic_algorithms(scan: Scan, node: ast.Call, q: str) -> None:
    scan.record("deterministic_algorithms", node, scan.sym(node.args[0]) if node.args else const(True))


def _benchmark_flag(scan: Scan, target: ast.Attribute, value: ast.expr, q: str) -> None:
    scan.record("cudnn_benchmark", target, scan.sym(value))


def _deterministic_flag(scan: Scan, target: ast.Attribute, value: ast.expr, q: str) -> None:
    scan.record("cudnn_deterministic", target, scan.sym(value))


WATCH = Watch(
    calls={**dict.fromkeys(CONV_LAYERS, _conv_layer), DETERMINISTIC_ALGORITHMS: _deterministic_algorithms},
    call_patterns=(_cnn_model,),
    settings={CUDNN_BENCHMARK: _benchmark_flag, CUDNN_DETERMINISTIC: _deterministic_flag},
)


class _Cudnn:
    """What the programs say about cuDNN: benchmark set on / off, determinism asked for, convolutions."""

    def __init__(self, src: StaticContext) -> None:
        self.on: list[Function] = []
        self.on_at: list[Location] = []
        self.off: list[tuple[Function, Fact]] = []
        for fn, f in src.facts("cudnn_benchmark"):
            if not src.active(fn, f.ctx):
                continue
            if src.resolve(fn, f.value).truth() is False:
                self.off.append((fn, f))
            else:
                self.on.append(fn)
                self.on_at.append(src.location(fn, f.site))
        self.deterministic: list[Function] = []
        self.deterministic_at: list[Location] = []
        for kind in ("cudnn_deterministic", "deterministic_algorithms"):
            for fn, f in src.facts(kind):
                if src.active(fn, f.ctx) and src.resolve(fn, f.value).truth() is not False:
                    self.deterministic.append(fn)
                    self.deterministic_at.append(src.location(fn, f.site))
        self.convs = [(fn, f) for fn, f in src.facts("conv") if src.active(fn, f.ctx)]


def _cudnn(src: StaticContext) -> _Cudnn:
    return src.memo("GD403.cudnn", lambda: _Cudnn(src))


def static_check(src: StaticContext) -> None:
    """One finding per training CUDA program with convolutions where cudnn.benchmark is never set on."""
    cudnn = _cudnn(src)
    reported: set[int] = set()
    for fn, f in cudnn.convs:
        if not src.cuda(fn) or src.in_program(fn, cudnn.on) or src.in_program(fn, cudnn.deterministic):
            continue
        if not src.program_trains(fn):
            continue
        program = src.program(fn)
        if program in reported:
            continue
        reported.add(program)
        off = [(g, x) for g, x in cudnn.off if src.in_program(fn, [g])]
        if off:
            where, x = off[0]
            site = x.site
            detail = f"cudnn.benchmark is set to False at {where.file}:{x.site.line}"
            before = src.line(where, x.site.line)
            after = re.sub(r"=\s*.+$", "= True", before)
            edit = assign(where.file, x.site.line, "benchmark", True)
        else:
            site, where = f.site, fn
            detail = "cudnn.benchmark is never set"
            before = "# torch.backends.cudnn.benchmark is not set (default False)"
            after = "torch.backends.cudnn.benchmark = True  # once, at start-up: input shapes are fixed"
            edit = at_startup(where.file, site.line, "torch.backends.cudnn.benchmark = True")
        refused = src.sized("torch.backends.cudnn.benchmark", where, site).refused
        src.report(
            "GD403",
            Severity.INFO,
            f"Convolutions ({f.extra.rsplit('.', 1)[-1]} at {fn.file}:{f.site.line}) run with cuDNN's "
            f"heuristic algorithm choice ({detail}): with fixed input shapes, autotuning picks faster kernels",
            Fix(
                "Set torch.backends.cudnn.benchmark = True once at start-up when input shapes do not change "
                "from step to step (not when determinism is required)",
                before,
                after,
                () if refused else (edit,),
            ),
            where,
            site,
            Evidence(notes=(refused,)) if refused else None,
        )


def _judge_in_source(src: StaticContext) -> tuple[ChecklistStatus, str]:
    cudnn = _cudnn(src)
    if cudnn.on_at:
        return ChecklistStatus.APPLIED, f"cudnn.benchmark set at {first_of(cudnn.on_at)}"
    if cudnn.deterministic_at:
        return ChecklistStatus.NOT_APPLICABLE, f"deterministic algorithms requested at {first_of(cudnn.deterministic_at)}"
    if not cudnn.convs:
        return ChecklistStatus.NOT_APPLICABLE, "no convolution layers in the checked source"
    if not src.cuda_anywhere:
        return ChecklistStatus.NOT_APPLICABLE, NO_CUDA
    return ChecklistStatus.NOT_MEASURABLE, "convolutions found but no CUDA training loop in the checked code"


STATIC = StaticCheck(check=static_check, watch=WATCH, judges={"cudnn-benchmark": _judge_in_source})


EXAMPLES = examples(
    bad_conv_no_benchmark="""\
# A convolutional network on fixed-size images, cudnn.benchmark never set.
import torch
from torch import nn

model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10)).cuda()
for images, labels in loader:
    images, labels = images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
    loss = criterion(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
    good_benchmark="""\
# cuDNN times the candidate algorithms once and keeps the fastest.
import torch
from torch import nn

torch.backends.cudnn.benchmark = True

model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10)).cuda()
for images, labels in loader:
    images, labels = images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
    loss = criterion(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
""",
)


RULE = Rule(
    code="GD403",
    name="cudnn-benchmark-off",
    title="Convolutions with fixed shapes and cudnn.benchmark off",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.SETTINGS},
    needs_reasons={Need.SETTINGS: "cudnn.benchmark is not recorded in a trace: run `gpudoctor profile`"},
    inject=inject,
    static=STATIC,
    examples=EXAMPLES,
    autofix=True,
)
