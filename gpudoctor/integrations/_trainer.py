"""What the trainer callbacks share: a ``gpudoctor.session()`` from the start of training to its end, whose
steps are the trainer's optimizer steps (``Session.step()`` from the trainer's hook: exact, one per optimizer
step, its micro-batches counted by the ``backward()`` hook), the trainer's DataLoader read with the user's
collator or dataset as its place, and a short summary for the trainer's logger at the end."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

from gpudoctor.api import Session
from gpudoctor.collect.inprocess import TrainerSettings

#: mixed precision a trainer runs under autocast: its dtype, and whether fp16's loss scaling goes with it
MIXED = {"bf16": ("torch.bfloat16", False), "fp16": ("torch.float16", True)}


def user_code_of(loader: Any) -> Any:
    """What a DataLoader's findings should point at: the collator when it is the user's (not a framework's
    or torch's), else the dataset's class."""
    collate = getattr(loader, "collate_fn", None)
    for _ in range(4):  # a framework's wrapper around the user's collator (transformers' RemoveColumnsCollator)
        inner = getattr(collate, "data_collator", None) or getattr(collate, "func", None)
        if inner is None:
            break
        collate = inner
    for candidate in (collate, type(getattr(loader, "dataset", None))):
        if candidate is None:
            continue
        target = candidate if inspect.isfunction(candidate) or inspect.isclass(candidate) else type(candidate)
        try:
            file = inspect.getsourcefile(target) or ""
        except (TypeError, OSError):
            continue
        if file and not any(part in file for part in ("site-packages", "dist-packages", "/torch/")):
            return candidate
    return None


def device_type(device: Any) -> str | None:
    kind = getattr(device, "type", None)
    return kind if isinstance(kind, str) and kind else None


class TrainerRun:
    """One training run of a trainer under a session."""

    def __init__(self, out: str | Path, steps: int | None, name: str | None, logger: logging.Logger) -> None:
        self.session = Session(out, None, name=name, quiet=True)  # steps: the trainer stops itself (step())
        self.limit = steps
        self.steps = 0
        self.logger = logger
        self.running = False

    def begin(self, loaders: list[Any], declared: TrainerSettings | None = None) -> None:
        if self.running:
            return
        self.session.start()
        self.running = True
        if declared is not None:
            self.session.note_trainer(declared)
        for loader in loaders:
            if loader is not None:
                self.session.note_dataloader(loader, user_code_of(loader))
        self.session.step()  # the trainer's steps mark the run's from here (this opens the first)

    def step(self) -> bool:
        """A step ended; True when the trainer should stop (``steps`` reached)."""
        if not self.running:
            return False
        self.session.step()
        self.steps += 1
        return self.limit is not None and self.steps >= self.limit

    def end(self, exc: BaseException | None = None) -> None:
        if not self.running:
            return
        self.running = False
        report = self.session.stop(exc)
        run_dir = self.session.run_dir
        if report is None:
            if self.session.rank_only:  # a torchrun job: the rank that wrote the job's run directory reports
                return
            self.logger.warning("gpudoctor: the run in %s could not be diagnosed", run_dir)
            return
        top = ", ".join(f"{f.code} {f.severity.value}: {f.message}" for f in report.findings[:3]) or "no finding"
        headline = report.account.headline if report.account is not None else ""
        self.logger.warning("gpudoctor: %s; %s; the report: gpudoctor report %s", headline, top, run_dir)
