"""What a rule needs to judge a run (``Rule.needs``), checked once, before the rule runs.

A rule declares the evidence it judges from (``Rule.needs``; ``gpudoctor rules`` lists it).
Before a rule's function runs, the engine (``engine.run_rules``; ``Rule.check`` for a direct
call) takes its needs in the order of :class:`Need` and answers "cannot judge" with the first
missing one's reason: the rule's own words for it when it gives them (``Rule.needs_reasons``),
else the need's (:meth:`Need.missing`). A rule's function never checks a need itself, except
one it lists in ``Rule.self_checked``: evidence whose absence it answers otherwise (a fallback
to other evidence, as GD201 falls back from steps to the trace, or "not applicable", as GD106
says of a run without a GPU).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from gpudoctor.rules.context import RuleContext


class Need(str, Enum):
    """Evidence a rule reads. The order is the catalogue's and the order the engine checks in."""

    GPU = "gpu"  # GPU work in a trace, a CUDA device in the settings, or NVML utilization
    TRACE = "trace"  # a Kineto trace
    SHAPES = "shapes"  # a trace recorded with record_shapes
    STACKS = "stacks"  # a trace recorded with with_stack (Python functions)
    MEMORY = "memory"  # memory figures (the trace's allocator events, NVML, the device's capacity)
    STEPS = "steps"  # per-step records (steps.jsonl)
    SETTINGS = "settings"  # the settings the script used (settings.json)
    SAMPLES = "samples"  # psutil samples of the training processes (samples.jsonl)

    def missing(self, ctx: RuleContext) -> str | None:
        """Why ``ctx``'s run lacks this evidence, in the user's terms; None when it has it."""
        if self is Need.GPU:
            return None if ctx.has_gpu() else ctx.no_gpu_reason()
        if self is Need.TRACE:
            return None if ctx.metrics else "no trace in this run"
        if self is Need.SHAPES:
            return None if any(m.has_shapes for m in ctx.metrics) else "no trace recorded with shapes (record_shapes)"
        if self is Need.STACKS:
            return None if any(m.has_stacks for m in ctx.metrics) else "no trace recorded with stacks (with_stack)"
        if self is Need.MEMORY:
            return None if ctx.figures.memory.device_total_bytes is not None else "the GPU's memory is not recorded"
        if self is Need.STEPS:
            return None if ctx.steps() else "no per-step records: analyse a run directory from `gpudoctor profile`"
        if self is Need.SETTINGS:
            return None if ctx.settings is not None else (
                "the script's settings are read at run time: analyse a run directory from `gpudoctor profile`")
        if self is Need.SAMPLES:
            return None if ctx.samples_process() else (
                "no process samples (psutil): analyse a run directory from `gpudoctor profile`")
        raise AssertionError(self)


_ORDER = {n: i for i, n in enumerate(Need)}


def ordered(needs: Iterable[Need]) -> tuple[Need, ...]:
    """``needs`` in the catalogue's order (the order they are checked in)."""
    return tuple(sorted(set(needs), key=_ORDER.__getitem__))


def as_needs(values: Iterable[Need | str]) -> frozenset[Need]:
    """A rule's declaration as a set of :class:`Need` (``"gpu"`` is ``Need.GPU``; an unknown name raises)."""
    if isinstance(values, (str, Need)):
        raise TypeError("needs: a set of Need, not a single value")
    return frozenset(Need(v) for v in values)


def unmet(needs: Iterable[Need], ctx: RuleContext, reasons: dict[Need, str] | None = None) -> str | None:
    """The reason of the first need (in :class:`Need`'s order) that ``ctx``'s run lacks: the rule's own
    words for it (``reasons``) or the need's; None when every need is met."""
    for need in ordered(needs):
        why = need.missing(ctx)
        if why is not None:
            return (reasons or {}).get(need) or why
    return None


def needs_text(needs: Iterable[Need]) -> str:
    """``gpu, trace, shapes``: the catalogue's column."""
    return ", ".join(n.value for n in ordered(needs))
