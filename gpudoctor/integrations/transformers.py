"""``GpuDoctorCallback`` for the Hugging Face ``Trainer``: the training diagnosed in the trainer's process.

    from gpudoctor.integrations.transformers import GpuDoctorCallback
    Trainer(model=model, args=args, train_dataset=data, callbacks=[GpuDoctorCallback(out="gpudoctor-runs")])

From ``on_train_begin`` to ``on_train_end`` a ``gpudoctor.session()`` runs; each ``on_step_end`` (one optimizer
step, after all its gradient-accumulation micro-batches) ends a step; the trainer's train DataLoader is read with
the user's collator (or dataset) as the place its findings name. At the end the run directory and its report are
written and a summary goes to the transformers logger. ``transformers`` is imported only with this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.utils import logging

from gpudoctor.collect.inprocess import TrainerSettings
from gpudoctor.integrations._trainer import MIXED, TrainerRun, device_type


class GpuDoctorCallback(TrainerCallback):
    def __init__(self, out: str | Path = "gpudoctor-runs", steps: int | None = None, name: str | None = None) -> None:
        self.run = TrainerRun(out, steps, name or "hf-trainer", logging.get_logger("gpudoctor"))

    @property
    def session(self) -> Any:
        """The ``gpudoctor.Session`` (its ``report`` and ``run_dir`` once training ended)."""
        return self.run.session

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.begin([kwargs.get("train_dataloader")], declared(args, kwargs.get("model")))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run.step():
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.end()


def declared(args: Any, model: Any) -> TrainerSettings:
    """What ``TrainingArguments`` say: mixed precision (``bf16`` / ``fp16``: the Trainer runs the forward under
    autocast, fp16 with a GradScaler), ``gradient_accumulation_steps``, ``torch_compile`` (the Trainer compiles
    the model itself, before training starts) and the device."""
    names = ("bf16", "fp16", "gradient_accumulation_steps", "torch_compile", "torch_compile_backend",
             "torch_compile_mode")
    arguments = {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
    device = device_type(getattr(args, "device", None))
    mixed = next((MIXED[k] for k in ("bf16", "fp16") if getattr(args, k, False) is True), None)
    compile_options = None
    if getattr(args, "torch_compile", False):
        compile_options = {"mode": getattr(args, "torch_compile_mode", None),
                           "backend": getattr(args, "torch_compile_backend", None) or "inductor"}
    return TrainerSettings(
        trainer="transformers.TrainingArguments", arguments=arguments, device_type=device,
        autocast_dtype=mixed[0] if mixed else None, grad_scaler=bool(mixed and mixed[1] and device == "cuda"),
        compile_options=compile_options, module=type(model).__qualname__ if model is not None else "",
    )
