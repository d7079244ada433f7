"""The kinds a ledger branches on (``model.metrics.Ledger.basis``, ``LedgerSlice.source``): enums, not prose.

A ``str`` enum compares equal to its value, so a record read from an older report (or a test's plain "gpu")
is the same kind; ``from_dict`` turns a report's strings into these and refuses any other value.
"""

from __future__ import annotations

from enum import Enum


class LedgerBasis(str, Enum):
    """What a ledger's windows are and whose timeline splits them (docs/account.md)."""

    GPU = "gpu"  # a trace, from the GPU's point of view
    CPU = "cpu"  # a CPU-only trace
    STEPS = "steps"  # the run's per-step records (their trace, where there is one, splits the rest)


class SliceSource(str, Enum):
    """What measured a ledger's part."""

    TRACE = "trace"
    STEPS = "steps"  # the per-step records
    TRACE_SCALED = "trace, scaled"  # a trace's proportions of the steps' time
    UNSTATED = ""
