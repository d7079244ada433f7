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

from gpudoctor.integrations._trainer import TrainerRun


class GpuDoctorCallback(TrainerCallback):
    def __init__(self, out: str | Path = "gpudoctor-runs", steps: int | None = None, name: str | None = None) -> None:
        self.run = TrainerRun(out, steps, name or "hf-trainer", logging.get_logger("gpudoctor"))

    @property
    def session(self) -> Any:
        """The ``gpudoctor.Session`` (its ``report`` and ``run_dir`` once training ended)."""
        return self.run.session

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.begin([kwargs.get("train_dataloader")])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run.step():
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.end()
