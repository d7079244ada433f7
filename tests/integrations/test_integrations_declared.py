"""What the trainer callbacks read from a trainer's arguments (issue 43): the mapping from each trainer's own
spelling of precision, accumulation, compile and device to the settings' fields, for the cases a CPU-only test
run cannot train (fp16 and its GradScaler on a GPU, Lightning's "-true" precisions). The real trainers record
them in tests/integrations/test_integrations_trainers.py."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest


def _need(package: str) -> None:
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (`pip install -e .[test]` installs it)")


class Tiny:
    pass


def test_hf_fp16_on_a_gpu_is_autocast_with_a_grad_scaler():
    _need("transformers")
    from gpudoctor.integrations.transformers import declared

    args = SimpleNamespace(bf16=False, fp16=True, gradient_accumulation_steps=8, torch_compile=True,
                           torch_compile_backend=None, torch_compile_mode="max-autotune",
                           device=SimpleNamespace(type="cuda"))
    d = declared(args, Tiny())
    assert (d.trainer, d.device_type, d.autocast_dtype, d.grad_scaler) == (
        "transformers.TrainingArguments", "cuda", "torch.float16", True)
    assert d.compile_options == {"mode": "max-autotune", "backend": "inductor"} and d.module == "Tiny"
    assert d.arguments == {"bf16": False, "fp16": True, "gradient_accumulation_steps": 8, "torch_compile": True,
                           "torch_compile_mode": "max-autotune"}
    plain = declared(SimpleNamespace(bf16=False, fp16=False, gradient_accumulation_steps=1, torch_compile=False,
                                     device=SimpleNamespace(type="cpu")), None)
    assert (plain.autocast_dtype, plain.grad_scaler, plain.compile_options, plain.module) == (None, False, None, "")


@pytest.mark.parametrize(("precision", "dtype", "scaler"), [
    ("16-mixed", "torch.float16", True), ("bf16-mixed", "torch.bfloat16", False),
    ("bf16-true", None, False), ("16-true", None, False), ("32-true", None, False),
])
def test_lightning_precision_is_autocast_only_when_mixed(precision, dtype, scaler):
    _need("lightning")
    from gpudoctor.integrations.lightning import declared

    trainer = SimpleNamespace(precision=precision, accumulate_grad_batches=4,
                              strategy=SimpleNamespace(root_device=SimpleNamespace(type="cuda")))
    module = Tiny()
    d = declared(trainer, module)
    assert (d.autocast_dtype, d.grad_scaler, d.device_type) == (dtype, scaler, "cuda")
    assert d.arguments == {"precision": precision, "accumulate_grad_batches": 4} and d.compile_options is None
    module._compiler_ctx = {"compiler": "dynamo", "dynamo_ctx": None}  # a compiled module given to fit
    d = declared(trainer, module)
    assert d.compile_options == {"mode": None, "backend": None} and d.arguments["compiled"] == "dynamo"
