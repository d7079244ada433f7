"""The cores the training process and its workers wanted (on a core or waiting for one), from the
samples' CPU and run-queue wait (GD201, GD203, GD204, GD205): the run's figures' (``analysis.loader``)."""

from __future__ import annotations

from gpudoctor.analysis.loader import Demand
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.load_model import loader_of

__all__ = ["Demand", "runnable_demand"]


def runnable_demand(ctx: RuleContext) -> Demand | None:
    """CPU + run-queue wait of the training process and its workers, in threads, over the steps' span
    (every sample without steps); None without run-queue figures (``RunFigures.loader.demand``)."""
    return loader_of(ctx).demand
