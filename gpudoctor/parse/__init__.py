"""Everything gpudoctor reads → model.

- ``inputs``: what ``analyze`` / ``report`` take (run directories, trace files, folders of
  traces) → ``RunData`` and timelines (``plan_inputs``, ``load_inputs``, ``load_trace``);
- ``kineto`` (with ``columns``, ``parallel``): Kineto traces in bounded memory, in one process
  or in parts; ``stream``: the streaming fallback; ``rundir``: the run directory's records.

The names of ``inputs`` are importable from here; ``inputs`` (and with it the run
directory's model) is imported on first use of one of them, so that the processes that
read a large trace in parts start before the rest of gpudoctor is imported. This package
imports neither torch nor pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "InputPlan", "LoadedInputs", "TraceJob", "find_traces", "load_inputs", "load_trace", "plan_inputs",
    "read_run_dir", "refuse_special", "trace_order",
]
_INPUTS = frozenset(__all__)


def __getattr__(name: str) -> Any:
    if name not in _INPUTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.inputs"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from gpudoctor.parse.inputs import (
        InputPlan,
        LoadedInputs,
        TraceJob,
        find_traces,
        load_inputs,
        load_trace,
        plan_inputs,
        read_run_dir,
        refuse_special,
        trace_order,
    )
