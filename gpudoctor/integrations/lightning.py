"""``GpuDoctorCallback`` for Lightning's ``Trainer``: the training diagnosed in the trainer's process.

    from gpudoctor.integrations.lightning import GpuDoctorCallback
    L.Trainer(callbacks=[GpuDoctorCallback(out="gpudoctor-runs")]).fit(model, loader)

From ``on_train_start`` to ``on_train_end`` (or ``on_exception``) a ``gpudoctor.session()`` runs; a step ends
where ``trainer.global_step`` moves (one optimizer step, after its ``accumulate_grad_batches`` micro-batches);
the trainer's train DataLoader is read with the user's collator (or dataset) as the place its findings name. At
the end the run directory and its report are written and a summary goes to Lightning's logger. ``lightning`` is
imported only with this module.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from gpudoctor.collect.inprocess import TrainerSettings
from gpudoctor.integrations._trainer import MIXED, TrainerRun, device_type


class GpuDoctorCallback(Callback):
    def __init__(self, out: str | Path = "gpudoctor-runs", steps: int | None = None, name: str | None = None) -> None:
        self.run = TrainerRun(out, steps, name or "lightning", logging.getLogger("lightning.pytorch"))
        self._global_step = 0

    @property
    def session(self) -> Any:
        """The ``gpudoctor.Session`` (its ``report`` and ``run_dir`` once training ended)."""
        return self.run.session

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        loaders = trainer.train_dataloader
        loaders = list(loaders.values()) if isinstance(loaders, dict) else \
            list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]
        self._global_step = trainer.global_step
        self.run.begin(loaders, declared(trainer, pl_module))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step != self._global_step:  # an optimizer step ran in this batch
            self._global_step = trainer.global_step
            if self.run.step():
                trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.run.end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.run.end(exception)


def declared(trainer: Any, pl_module: Any) -> TrainerSettings:
    """What the ``Trainer`` says: ``precision`` ("bf16-mixed", "16-mixed": the step under autocast, 16 with a
    GradScaler on a GPU; "bf16-true": the weights themselves in bf16, not autocast), ``accumulate_grad_batches``,
    a module given to ``fit`` compiled (``torch.compile(model)``: Lightning unwraps it and keeps the compiled
    forward) and the device."""
    precision = str(getattr(trainer, "precision", "") or "")
    arguments: dict[str, Any] = {"precision": precision,
                                 "accumulate_grad_batches": getattr(trainer, "accumulate_grad_batches", None)}
    device = device_type(getattr(getattr(trainer, "strategy", None), "root_device", None))
    mixed = {"bf16-mixed": MIXED["bf16"], "16-mixed": MIXED["fp16"]}.get(precision)
    compile_options = None
    ctx = getattr(pl_module, "_compiler_ctx", None)
    if isinstance(ctx, dict):
        compile_options = {"mode": None, "backend": _backend(ctx.get("dynamo_ctx"))}
        arguments["compiled"] = ctx.get("compiler", "dynamo")
    return TrainerSettings(
        trainer="lightning.Trainer", arguments={k: v for k, v in arguments.items() if v is not None},
        device_type=device, autocast_dtype=mixed[0] if mixed else None,
        grad_scaler=bool(mixed and mixed[1] and device == "cuda"), compile_options=compile_options,
        module=type(pl_module).__qualname__,
    )


def _backend(dynamo_ctx: Any) -> str | None:
    """The backend's name of a compiled module's Dynamo context (torch's wrappers of it, each keeping the one
    it wraps as ``_torchdynamo_orig_backend``, down to one with a ``compiler_name``); None when not found."""
    obj = getattr(dynamo_ctx, "callback", None)
    for _ in range(6):
        name = getattr(obj, "compiler_name", None)
        if isinstance(name, str):
            return name
        obj = getattr(obj, "_torchdynamo_orig_backend", None)
        if obj is None:
            return None
    return None
