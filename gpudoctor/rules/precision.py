"""Mixed precision as a script's source asks for it, for `gpudoctor check` (GD401's static check and its
checklist judge read these facts): every spelling of autocast (``torch.autocast``, ``torch.amp`` and the
deprecated ``torch.cuda.amp`` / ``torch.cpu.amp``), ``GradScaler``, a module's ``half()`` / ``bfloat16()`` /
``to(dtype)``, the TF32 switches, and the mixed precision asked of a framework (Accelerate's
``Accelerator``, Lightning's ``Trainer``, Hugging Face's ``TrainingArguments``).

``WATCH`` records them as facts of the kinds:

- ``"autocast"``: an autocast region, its ``enabled`` argument as the value and its device as ``extra``;
  or mixed precision asked of a framework: ``extra`` names it (``ACCELERATE``, ``LIGHTNING_TRAINER``,
  ``HF_ARGS``), the value says whether it is on, ``data`` the argument that decides it (None: not passed,
  the framework's default applies);
- ``"autocast_deprecated"`` / ``"scaler_deprecated"``: a deprecated spelling, ``extra`` "old|current";
- ``"precision_at_launch"``: an ``Accelerator`` whose mixed precision ``accelerate launch`` decides;
- ``"low_precision"``: a module moved to float16 or bfloat16;
- ``"tf32"``: a TF32 switch, ``extra`` its qualified name.
"""

from __future__ import annotations

import ast

from gpudoctor.rules.static_api import (
    UNKNOWN,
    Scan,
    Watch,
    const,
    const_value,
    is_const,
    sym_any,
    sym_in,
)

#: autocast spellings: qualified name -> the current spelling when it is deprecated, else "".
AUTOCAST = {
    "torch.autocast": "",
    "torch.amp.autocast": "",
    "torch.amp.autocast_mode.autocast": "",
    "torch.cuda.amp.autocast": 'torch.autocast("cuda", ...)',
    "torch.cuda.amp.autocast_mode.autocast": 'torch.autocast("cuda", ...)',
    "torch.cpu.amp.autocast": 'torch.autocast("cpu", ...)',
    "torch.cpu.amp.autocast_mode.autocast": 'torch.autocast("cpu", ...)',
}
GRAD_SCALER = {
    "torch.amp.GradScaler": "",
    "torch.amp.grad_scaler.GradScaler": "",
    "torch.GradScaler": "",
    "torch.cuda.amp.GradScaler": 'torch.amp.GradScaler("cuda")',
    "torch.cuda.amp.grad_scaler.GradScaler": 'torch.amp.GradScaler("cuda")',
}
TF32_FLAGS = frozenset({"torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32"})
MATMUL_PRECISION = "torch.set_float32_matmul_precision"
_LOW_PRECISION = frozenset({"float16", "half", "bfloat16"})


def _autocast(scan: Scan, node: ast.Call, q: str) -> None:
    enabled = scan.kwarg(node, "enabled")
    device = node.args[0] if node.args else scan.kwarg(node, "device_type")
    extra = ""
    if device is not None:
        ds = scan.sym(device)
        extra = str(const_value(ds)) if is_const(ds) else ""
    scan.record("autocast", node, scan.sym(enabled) if enabled is not None else const(True), extra)
    if AUTOCAST[q]:
        scan.record("autocast_deprecated", node, extra=f"{q}|{AUTOCAST[q]}")


def _grad_scaler(scan: Scan, node: ast.Call, q: str) -> None:
    if GRAD_SCALER[q]:
        scan.record("scaler_deprecated", node, extra=f"{q}|{GRAD_SCALER[q]}")


# Mixed precision asked of a framework: an "autocast" fact whose ``extra`` names the framework and whose
# ``data`` is the argument that decides it (None: not passed, the framework's default applies).
ACCELERATE, LIGHTNING_TRAINER, HF_ARGS = "accelerate", "lightning", "transformers"


def _passes_kwargs(node: ast.Call) -> bool:
    return any(k.arg is None for k in node.keywords)


def _accelerate(scan: Scan, node: ast.Call, q: str) -> None:
    value = scan.kwarg(node, "mixed_precision")
    if value is not None:
        mp = scan.sym(value)
        scan.record("autocast", node, sym_in(mp, ("no", None, "fp8"), negate=True), ACCELERATE, data="mixed_precision")
        scan.record("precision_at_launch", node, ("cmp", ("is",), (mp, const(None))))  # None: as launched
    elif not _passes_kwargs(node):
        # not passed: `accelerate launch --mixed_precision` / `accelerate config` decide it
        scan.record("precision_at_launch", node)


def _lightning(scan: Scan, node: ast.Call, q: str) -> None:
    value = scan.kwarg(node, "precision")
    mixed = ("16-mixed", "bf16-mixed", "16", "bf16", 16, "bf16-true", "16-true", "transformer-engine")
    if value is not None:
        scan.record("autocast", node, sym_in(scan.sym(value), mixed), LIGHTNING_TRAINER, data="precision")
    elif not _passes_kwargs(node):
        scan.record("autocast", node, const(False), LIGHTNING_TRAINER)  # default "32-true"


def _hf_trainer(scan: Scan, node: ast.Call, q: str) -> None:
    flags = [(k, v) for k in ("fp16", "bf16") if (v := scan.kwarg(node, k)) is not None]
    if flags:
        scan.record("autocast", node, sym_any(tuple(scan.sym(v) for _k, v in flags)), HF_ARGS,
                    data=" and ".join(k for k, _v in flags))
    elif not _passes_kwargs(node):
        scan.record("autocast", node, const(False), HF_ARGS)  # fp16 and bf16 default to False


def _matmul_precision(scan: Scan, node: ast.Call, q: str) -> None:
    scan.record("tf32", node, scan.sym(node.args[0]) if node.args else UNKNOWN, extra=q)


def _tf32_flag(scan: Scan, target: ast.Attribute, value: ast.expr, q: str) -> None:
    scan.record("tf32", target, scan.sym(value), extra=q)


def _half(scan: Scan, node: ast.Call, recv: ast.expr) -> None:
    if scan.is_module_ref(recv):
        scan.record("low_precision", node)


def _to_dtype(scan: Scan, node: ast.Call, recv: ast.expr) -> None:
    if scan.to_target(node) != "dtype" or not scan.is_module_ref(recv):
        return
    for a in (*node.args, *(k.value for k in node.keywords)):
        q = scan.qualify(a) if isinstance(a, (ast.Name, ast.Attribute)) else None
        if q and q.rsplit(".", 1)[-1] in _LOW_PRECISION:
            scan.record("low_precision", node)
            return


WATCH = Watch(
    calls={
        **dict.fromkeys(AUTOCAST, _autocast),
        **dict.fromkeys(GRAD_SCALER, _grad_scaler),
        MATMUL_PRECISION: _matmul_precision,
        # mixed precision asked of a framework
        "accelerate.Accelerator": _accelerate,
        "lightning.Trainer": _lightning,
        "lightning.pytorch.Trainer": _lightning,
        "pytorch_lightning.Trainer": _lightning,
        "transformers.TrainingArguments": _hf_trainer,
        "transformers.Seq2SeqTrainingArguments": _hf_trainer,
    },
    methods={"half": _half, "bfloat16": _half, "to": _to_dtype},
    settings=dict.fromkeys(TF32_FLAGS, _tf32_flag),
)
