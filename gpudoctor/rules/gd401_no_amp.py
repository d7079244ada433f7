"""GD401 no-amp: convolutions and matrix multiplications run in FP32 on a GPU with Tensor Cores.

What it detects
---------------
A GPU of compute capability 7.0 or later where conv/matmul/linear/bmm ops with
float32 inputs take a large share of kernel time and no half-precision Tensor
Core kernels run (torch-tb-profiler's recommendation). TF32 kernels of float32
ops are FP32 work, not mixed precision, and do not count as Tensor Core use.

Why it matters
--------------
Tensor Cores run FP16/BF16 matrix math several times faster than FP32, and
half-precision activations halve memory traffic. AMP keeps FP32 where needed.

How to fix
----------
Wrap the forward pass and the loss in `torch.autocast` (`torch.amp`, not the
deprecated `torch.cuda.amp`): bfloat16 on Ampere and later; on Volta and Turing
float16 with `scaler = torch.amp.GradScaler("cuda")`, `scaler.scale(loss).backward()`,
`scaler.step(opt); scaler.update()`.

Before:

```python
for x, y in loader:
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step(); opt.zero_grad()
```

After (Ampere and later):

```python
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    loss.backward()
    opt.step(); opt.zero_grad()
```

Expected gain
-------------
AMP shortens the claimed kernels: expected `conv_time × (1 − 1/s_conv) +
matmul_time × (1 − 1/s_matmul)`, each `s` the datasheet's FP16/BF16 Tensor Core
peak over today's precision (FP32, or TF32 where already on), at most
`tensor_core_speedup_max_ratio` (partly memory-bound kernels): 3x on a V100's
FP32 kernels, 2x on an A100's TF32 ones (`gpudoctor/rules/speedups.py`). The
bound is the whole claimed time; a step that waits on the host may not shorten.

Evidence used
-------------
Trace: compute capability, Tensor Core kernel share, GPU time of eligible ops
with float32 inputs (`TraceMetrics.kernels`); `autocast` and `GradScaler` call
sites. The gain is the ledger's `gpu_fp32_conv` and `gpu_fp32_matmul` parts,
which GD401 owns before GD402 and GD403.

Thresholds
----------
- `amp_min_compute_capability` (7.0), `bf16_min_compute_capability` (8.0).
- `amp_fp32_share_pct` (30): FP32 eligible kernel time, % of kernel time.
- `amp_tensor_core_max_pct` (1): half-precision Tensor Core kernel time, % of
  kernel time, below which "none run".
- `tensor_core_speedup_max_ratio` (3): the expected speed-up's cap per kernel.
- `error_share_pct`, `warning_share_pct`: severity from the eligible share.

Known limits
------------
Needs input dtypes (`record_shapes`, on by default in `gpudoctor profile`);
without them (a bare trace recorded without shapes) the FP32 share is read from
the heaviest kernels' names (cuBLAS `sgemm`, cuDNN `scudnn` and `<float>`
convolution kernels), a lower bound, and the finding is inferred.
Tensor Core use is read from kernel names, which is a heuristic. Some models
lose accuracy in FP16; BF16 or keeping sensitive layers in FP32 fixes most.

References
----------
- `torch.amp`: https://pytorch.org/docs/stable/amp.html
- NVIDIA, mixed precision: https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html
- PyTorch AMP recipe: https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html
- torch-tb-profiler's AMP recommendation: https://github.com/pytorch/kineto/tree/main/tb_plugin
"""

from __future__ import annotations

import re

from gpudoctor.analysis.kernels import fp32_kernel_name_pct, fp32_named_ns, half_tensor_core_pct
from gpudoctor.model.findings import (
    ChecklistStatus,
    Confidence,
    Finding,
    Fix,
    Location,
    Metric,
    SettingRef,
    Severity,
)
from gpudoctor.model.metrics import Component, TraceMetrics
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_pct, location_of
from gpudoctor.rules.precision import (
    ACCELERATE,
    HF_ARGS,
    LIGHTNING_TRAINER,
    MATMUL_PRECISION,
    WATCH,
)
from gpudoctor.rules.registry import Need, Rule
from gpudoctor.rules.results import RuleResult
from gpudoctor.rules.speedups import (
    conv_tf32,
    is_amd,
    kernel_speedup,
    matmul_tf32_flags,
    won_fraction,
)
from gpudoctor.rules.static_api import Fact, Function, StaticCheck, StaticContext, examples
from gpudoctor.rules.static_api.text import (
    NO_CUDA,
    NO_TRAINING_LOOP,
    arg_fix,
    first_of,
    with_kwargs,
)

_BEFORE = """for x, y in loader:
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step(); opt.zero_grad()"""
_AFTER_BF16 = """for x, y in loader:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    loss.backward()
    opt.step(); opt.zero_grad()"""
_AFTER_FP16 = """scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt); scaler.update(); opt.zero_grad()"""


def _judge(ctx: RuleContext, m: TraceMetrics, name: str, cc: float) -> RuleResult:
    t = ctx.thresholds
    if not m.has_gpu_activity:
        return RuleResult.cannot_judge(ctx.no_gpu_reason())
    k = m.kernels
    if k is None or k.count == 0:
        return RuleResult.cannot_judge("no kernels in the trace")
    half_pct = half_tensor_core_pct(k)
    if half_pct >= t.amp_tensor_core_max_pct:
        return RuleResult.fine(
            f"Tensor Core kernels run {fmt_pct(half_pct)} of kernel time"
            + (" (not counting the TF32 kernels of float32 ops)" if k.fp32_eligible_tensor_core_ns else "")
            + ": reduced precision is in use",
            applied=True,
        )
    inferred = not k.eligible_dtypes_known or k.fp32_eligible_pct_of_gpu is None
    if inferred:
        # no input dtypes: the kernels' own names still tell single-precision GEMM and convolution
        # (cuBLAS *sgemm*, cuDNN *scudnn* and <float> conv kernels) among the heaviest kernels
        fp32 = fp32_kernel_name_pct(k)
        if fp32 is None or fp32 < t.amp_fp32_share_pct:
            seen = f" ({fmt_pct(fp32)} of kernel time in FP32 GEMM/conv kernels by name)" if fp32 else ""
            return RuleResult.cannot_judge(
                "no input dtypes in the trace: record shapes (`gpudoctor profile --shapes`, the default) to see "
                f"FP32 ops{seen}"
            )
    else:
        fp32 = k.fp32_eligible_pct_of_gpu
    if fp32 <= t.amp_fp32_share_pct:
        return RuleResult.fine(
            f"FP32 conv/matmul kernels {fmt_pct(fp32)} of kernel time (threshold {t.amp_fp32_share_pct:g}%)"
        )
    eligible_ns = int(k.total_ns * fp32 / 100.0)
    share = ctx.trace_share(m, eligible_ns)
    bf16 = cc >= t.bf16_min_compute_capability
    ledger = ctx.ledger(m)
    expected, expected_note = _expected(ctx, ledger, name, cc, inferred, fp32_named_ns(k, gemm=True))
    dtype = "torch.bfloat16" if bf16 else "torch.float16 with torch.amp.GradScaler"
    tf32_note = (f"; {fmt_pct(100.0 * k.fp32_eligible_tensor_core_ns / k.total_ns)} of kernel time runs float32 ops "
                 "on TF32 Tensor Cores" if k.fp32_eligible_tensor_core_ns and k.total_ns else "")
    message = (
        f"{fmt_pct(fp32)} of GPU kernel time is FP32 conv/matmul and no half-precision Tensor Core kernels run "
        f"({fmt_pct(half_pct)}{tf32_note}) on {name or 'a GPU'} (compute capability {cc:g}): no mixed precision"
    )
    instruction = (
        f"Wrap the forward pass and the loss in `torch.autocast(\"cuda\", dtype={dtype.split(' ')[0]})`"
        + ("" if bf16 else " and scale the loss with `torch.amp.GradScaler(\"cuda\")`")
        + " (the `torch.amp` API; `torch.cuda.amp` is deprecated)."
    )
    settings = []
    s = ctx.settings
    if s is not None:
        for a in s.autocast:
            settings.append(SettingRef(f"autocast({a.device_type}, {a.dtype})", a.enabled, location_of(a.call_site)))
    metrics = [
        Metric("fp32_eligible_kernel_pct", round(fp32, 1), "%", "kernel time"),
        Metric("fp32_eligible_kernel_ns", eligible_ns, "ns"),
        Metric("tensor_core_kernel_pct", round(half_pct, 2), "%", "kernel time, not counting float32 ops' TF32"),
        Metric("compute_capability", cc, ""),
    ]
    if share is not None:
        metrics.append(Metric("fp32_eligible_share_pct", round(share, 2), "%", ctx.window_label(ctx.window(m))))
    finding = ctx.finding(
        message,
        Fix(instruction, _BEFORE, _AFTER_BF16 if bf16 else _AFTER_FP16),
        share_pct=share,
        confidence=Confidence.INFERRED if inferred else Confidence.MEASURED,
        metrics=metrics,
        settings=settings,
        notes=["Tensor Core use is read from kernel names"]
        + (["no input dtypes in the trace: the FP32 conv/matmul time is read from the heaviest kernels' names "
            "(sgemm, scudnn, <float> convolutions), a lower bound"] if inferred else []),
        gain_note="GPU time of FP32 conv/matmul kernels; Tensor Cores shorten it several-fold (upper bound)",
        rank=m.rank,
        claims=[(Component.GPU_FP32_CONV, None), (Component.GPU_FP32_MATMUL, None)]
        # without dtypes the ledger files these kernels as convolutions of unknown precision and as
        # other kernels: the former (no Tensor Core kernel runs, so they are FP32) and, of the latter,
        # at most the GEMM time read from the names
        + ([(Component.GPU_CONV, None), (Component.GPU_COMPUTE, fp32_named_ns(k, gemm=True))] if inferred else []),
        ledger=ledger,
        expected=expected,
        expected_note=expected_note,
    )
    return RuleResult.fired(finding)


def _expected(ctx: RuleContext, ledger, name: str, cc: float, inferred: bool, named_gemm_ns: int) -> tuple[float | None, str]:
    """The share of the claimed kernel time AMP is expected to win: each kind of kernel (convolutions,
    matmuls) sped up by half-precision Tensor Cores over the precision it ran in (TF32 where cuDNN or
    the matmul flags already used it), ``rules.speedups``; weighted by their time in the ledger."""
    if ledger is None:
        return None, ""
    t = ctx.thresholds
    amd = is_amd(name)
    ampere = amd or cc >= t.tf32_min_compute_capability
    conv_src = "tf32" if ampere and conv_tf32(ctx.settings) else "fp32"
    mm_on, _, _ = matmul_tf32_flags(ctx.settings)
    mm_src = "tf32" if ampere and mm_on else "fp32"
    conv_ns = ledger.ns(Component.GPU_FP32_CONV) + (ledger.ns(Component.GPU_CONV) if inferred else 0)
    mm_ns = ledger.ns(Component.GPU_FP32_MATMUL) + (min(named_gemm_ns, ledger.ns(Component.GPU_COMPUTE)) if inferred else 0)
    cap = t.tensor_core_speedup_max_ratio
    s_conv = kernel_speedup(cc, conv_src, "half", cap, amd=amd)
    s_mm = kernel_speedup(cc, mm_src, "half", cap, amd=amd)
    if s_conv is None or s_mm is None or conv_ns + mm_ns <= 0:
        return None, ""
    won = conv_ns * (won_fraction(s_conv) or 0.0) + mm_ns * (won_fraction(s_mm) or 0.0)
    parts = []
    if conv_ns:
        parts.append(f"convolutions ({conv_src.upper()} today) ~{s_conv:.1f}x")
    if mm_ns:
        parts.append(f"matmuls ({mm_src.upper()} today) ~{s_mm:.1f}x")
    note = (f"half-precision Tensor Cores on {name or 'this GPU'}: " + ", ".join(parts)
            + f" (the datasheet's peak ratio, at most {cap:g}x realized)")
    return won / (conv_ns + mm_ns), note


def check(ctx: RuleContext) -> RuleResult:
    t = ctx.thresholds
    s = ctx.settings
    if s is not None:
        used = [a for a in s.autocast if a.enabled and a.device_type == "cuda"]
        if used:
            a = used[0]
            old = " (deprecated torch.cuda.amp spelling: use torch.amp)" if a.deprecated_api else ""
            return RuleResult.fine(f"autocast({a.dtype}) at {location_of(a.call_site) or '?'}{old}", applied=True)
    if not ctx.gpu_traces():
        return RuleResult.cannot_judge("no trace with GPU kernels in this run")
    name, cc = ctx.device_cc()
    if cc is None:
        return RuleResult.cannot_judge("the trace does not say which GPU ran it (no compute capability)")
    if cc < t.amp_min_compute_capability:
        return RuleResult.not_applicable(f"{name or 'the GPU'} (compute capability {cc:g}) has no Tensor Cores")
    return ctx.per_trace(lambda m: _judge(ctx, m, name, cc), use="shapes")  # the dtypes: the detailed window


# --------------------------------------------------------------------------- `gpudoctor check`

def _amp_after(line: str, old: str, new: str) -> str:
    device = '"cuda"' if ".cuda." in old else '"cpu"'
    short = old.rsplit(".", 1)[-1]
    if "autocast" in short:
        out = re.sub(r"torch\.(cuda|cpu)\.amp\.autocast\(\s*\)", f"torch.autocast({device})", line)
        out = re.sub(r"torch\.(cuda|cpu)\.amp\.autocast\(", f"torch.autocast({device}, ", out)
        if out == line:
            out = re.sub(r"\bautocast\(\s*\)", f"autocast({device})", line)
            out = re.sub(r"\bautocast\((?!\"|')", f"autocast({device}, ", out)
            out = re.sub(r"from torch\.(cuda|cpu)\.amp import", "from torch.amp import", out)
        return out
    out = re.sub(r"torch\.cuda\.amp\.GradScaler\(\s*\)", 'torch.amp.GradScaler("cuda")', line)
    out = re.sub(r"torch\.cuda\.amp\.GradScaler\(", 'torch.amp.GradScaler("cuda", ', out)
    if out == line:
        out = re.sub(r"\bGradScaler\(\s*\)", 'GradScaler("cuda")', line)
    return out


def _deprecated(src: StaticContext, fn: Function, f: Fact) -> None:
    old, new = f.extra.split("|", 1)
    line = src.line(fn, f.site.line)
    src.report(
        "GD401",
        Severity.INFO,
        f"`{f.text}` at {fn.file}:{f.site.line} uses the deprecated `{old}` spelling; current PyTorch "
        f"spells it `{new}`",
        Fix(f"Use {new} from torch.amp", line, _amp_after(line, old, new)),
        fn,
        f.site,
    )


def _precision(src: StaticContext) -> tuple[list[Function], list[Location], list[tuple[Function, str]]]:
    """Reduced precision in the programs: (functions where it is on, where, (function, why it is off))."""

    def compute() -> tuple[list[Function], list[Location], list[tuple[Function, str]]]:
        on: list[Function] = []
        where: list[Location] = []
        off: list[tuple[Function, str]] = []
        for fn, f in src.facts("autocast") + src.facts("low_precision"):
            ok, origins = src.active_why(fn, f.ctx)
            enabled = src.resolve(fn, f.value).truth() if f.value is not None else True
            loc = src.location(fn, f.site)
            if ok and enabled is not False and f.extra != "cpu":
                on.append(fn)
                where.append(loc)
            else:
                r = src.resolve(fn, f.value) if f.value is not None else None
                why = ", ".join(origins or (r.origins if r else []))
                what = _FRAMEWORKS[f.extra][0] if f.extra in _FRAMEWORKS else "autocast"
                off.append((fn, f"{what} at {loc.file}:{loc.line} is off unless {why} is changed" if why
                            else f"{what} at {loc.file}:{loc.line} is disabled"))
        return on, where, off

    return src.memo("GD401.precision", compute)


#: Per framework: (what asks it for mixed precision, its default, the instruction, the arguments to set).
_FRAMEWORKS: dict[str, tuple[str, str, str, dict[str, str | None]]] = {
    LIGHTNING_TRAINER: (
        "mixed precision of the Trainer", 'precision not set: Lightning\'s default is "32-true"',
        'Ask the Trainer for mixed precision: precision="bf16-mixed" (Ampere and later; "16-mixed" on Volta '
        "and Turing, where Lightning scales the loss)",
        {"precision": '"bf16-mixed"'},
    ),
    HF_ARGS: (
        "mixed precision of TrainingArguments", "fp16 and bf16 not set: the Trainer's default is FP32",
        "Ask the Trainer for mixed precision: TrainingArguments(bf16=True) (Ampere and later; fp16=True on "
        "Volta and Turing, where the Trainer scales the loss)",
        {"bf16": "True", "fp16": None},
    ),
    ACCELERATE: (
        "mixed precision of the Accelerator", "",
        'Ask Accelerate for mixed precision: Accelerator(mixed_precision="bf16") ("fp16" on Volta and Turing), '
        "or `accelerate launch --mixed_precision bf16`",
        {"mixed_precision": '"bf16"'},
    ),
}


def _framework_fp32(src: StaticContext, fn: Function, f: Fact) -> None:
    """FP32 asked of a framework (``Trainer(precision=32)``, ``TrainingArguments`` without bf16 …): the
    finding at that call, with the fix in the framework's terms."""
    _what, default, instruction, changes = _FRAMEWORKS[f.extra]
    before = src.source(fn, f.site)
    if f.data:
        r = src.resolve(fn, f.value) if f.value is not None else None
        origins = f", from {r.origin_text()}" if r is not None and r.origins else ""
        flag = arg_fix(r, "")
        if flag:
            instruction += f"; or change the default of {flag[0]}"
        written = src.line(fn, f.site.line)
        m = re.search(rf"\b{re.escape(str(f.data))}\s*=\s*([^,)]+)", written)
        why = (f"{f.data}={m.group(1).strip()}" if m and " and " not in f.data else f"{f.data} off") + origins
    else:
        why = default
    call = f.text.split("(", 1)[0]
    src.report(
        "GD401",
        Severity.INFO,
        f"`{call}(...)` at {fn.file}:{f.site.line} trains in FP32 on CUDA ({why}): on Tensor Core GPUs mixed "
        "precision runs matmuls and convolutions several times faster",
        Fix(instruction, before, with_kwargs(before, changes)),
        fn,
        f.site,
    )


def _fp32_loops(src: StaticContext) -> None:
    """One finding per program: a framework asked for FP32 (at its call), else its first CUDA training
    loop, when no autocast is on in the program (and `accelerate launch` does not decide it)."""
    on, _where, _off = _precision(src)
    at_launch = [fn for fn, f in _at_launch(src)]
    reported: set[int] = set()
    for fn, f in src.facts("autocast"):
        if f.extra not in _FRAMEWORKS or not src.cuda(fn) or src.in_program(fn, on) or not src.active(fn, f.ctx):
            continue
        if src.in_program(fn, at_launch):
            continue
        if src.program(fn) not in reported:
            reported.add(src.program(fn))
            _framework_fp32(src, fn, f)
    _plain_fp32_loops(src, on, at_launch, reported)


def _at_launch(src: StaticContext) -> list[tuple[Function, Fact]]:
    """Accelerators whose mixed precision `accelerate launch` / `accelerate config` decide."""
    return [(fn, f) for fn, f in src.facts("precision_at_launch")
            if src.active(fn, f.ctx) and (f.value is None or src.resolve(fn, f.value).truth() is not False)]


def _plain_fp32_loops(src: StaticContext, on: list[Function], at_launch: list[Function], reported: set[int]) -> None:
    _on, _where, off = _precision(src)
    for fn, loop in src.step_loops():
        if not src.cuda(fn) or src.in_program(fn, on) or src.in_program(fn, at_launch):
            continue
        program = src.program(fn)
        if program in reported:
            continue
        reported.add(program)
        why_off = [text for g, text in off if src.in_program(fn, [g])]
        detail = why_off[0] if why_off else "no torch.autocast in the program"
        header = src.source(fn, loop.site, max_lines=1)
        step = next((m for m in fn.markers if loop.id in m.ctx.loops and m.kind == "backward"), None)
        step_line = src.line(fn, step.site.line) if step is not None else ""
        if step_line:
            before = f"{header}\n    ...  # forward pass and loss\n    {step_line}"
            after = (
                f'{header}\n    with torch.autocast("cuda", dtype=torch.bfloat16):\n'
                f"        ...  # forward pass and loss\n    {step_line}"
            )
        else:
            before = f"{header}\n    loss = criterion(model(inputs), targets)"
            after = (
                f'{header}\n    with torch.autocast("cuda", dtype=torch.bfloat16):\n'
                "        loss = criterion(model(inputs), targets)"
            )
        src.report(
            "GD401",
            Severity.INFO,
            f"The training loop at {fn.file}:{loop.site.line} runs in FP32 on CUDA ({detail}): "
            "on Tensor Core GPUs mixed precision runs matmuls and convolutions several times faster",
            Fix(
                'Run forward and loss under torch.autocast("cuda", dtype=torch.bfloat16) (Ampere and '
                "later); with float16 (Volta, Turing) also scale the loss with torch.amp.GradScaler(\"cuda\")",
                before,
                after,
            ),
            fn,
            loop.site,
        )


def static_check(src: StaticContext) -> None:
    """The deprecated torch.cuda.amp spellings, then a CUDA training loop without autocast."""
    for fn in src.functions():
        for f in fn.facts:
            if f.kind in ("autocast_deprecated", "scaler_deprecated"):
                _deprecated(src, fn, f)
    _fp32_loops(src)


def _judge_amp(src: StaticContext) -> tuple[ChecklistStatus, str]:
    _on, autocast, _off = _precision(src)
    tf32_at = []
    for fn, f in src.facts("tf32"):
        if src.active(fn, f.ctx) and src.resolve(fn, f.value).truth() is not False:
            if f.extra == MATMUL_PRECISION and src.resolve(fn, f.value).value == "highest":
                continue
            tf32_at.append(src.location(fn, f.site))
    tf32 = f"; TF32 enabled at {first_of(tf32_at)}" if tf32_at else ""
    if autocast:
        return ChecklistStatus.APPLIED, f"autocast / reduced precision at {first_of(autocast)}{tf32}"
    if not src.cuda_anywhere:
        return ChecklistStatus.NOT_APPLICABLE, NO_CUDA
    at_launch = [src.location(fn, f.site) for fn, f in _at_launch(src)]
    if at_launch:
        return ChecklistStatus.NOT_MEASURABLE, (
            f"the Accelerator at {first_of(at_launch)} takes its mixed precision from `accelerate launch` / "
            f"`accelerate config`{tf32}"
        )
    if not src.step_loops():
        return ChecklistStatus.NOT_APPLICABLE, NO_TRAINING_LOOP
    return ChecklistStatus.NOT_MEASURABLE, "no autocast found, and no CUDA training loop for GD401 to judge" + tf32


def _recommends(finding: Finding) -> bool:
    """The deprecated-spelling finding does not make mixed precision missing."""
    return "deprecated" not in finding.message


STATIC = StaticCheck(check=static_check, watch=WATCH, judges={"amp": _judge_amp}, recommends=_recommends)


EXAMPLES = examples(
    bad_deprecated_spelling="""\
# Mixed precision through the deprecated torch.cuda.amp namespace.
import torch

scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    with torch.cuda.amp.autocast():
        loss = criterion(model(x), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""",
    bad_fp32_loop="""\
# A CUDA training loop entirely in FP32.
import torch

model = model.to("cuda")
for x, y in loader:
    x, y = x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)
    loss = criterion(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
""",
    good_autocast="""\
# Forward pass and loss in bfloat16 through torch.autocast.
import torch

model = model.to("cuda")
for x, y in loader:
    x, y = x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = criterion(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
""",
)


RULE = Rule(
    code="GD401",
    name="no-amp",
    title="FP32 conv/matmul on a GPU with Tensor Cores, without AMP",
    doc=__doc__,
    check=check,
    needs={Need.GPU, Need.TRACE, Need.SHAPES},
    self_checked={Need.TRACE, Need.SHAPES},
    not_injectable="AMP changes numerics (half-precision matmuls, loss scaling): try it in the script and check the loss",
    static=STATIC,
    examples=EXAMPLES,
    not_autofix='AMP changes numerics (half-precision matmuls, loss scaling): never automatic',
)
