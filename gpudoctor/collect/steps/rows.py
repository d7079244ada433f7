"""The rows of ``steps.jsonl``: what a boundary keeps of a step, and its encoding a second's rows at a time.

A boundary keeps as little as it can: a slow one (:meth:`StepTracker._close`) a list of the step's
figures, a fast one (:meth:`StepTracker.fast_close`) ``acc`` itself copied onto a block of ints
(:class:`_Block`), one that reads ``getrusage`` a tuple (:meth:`StepTracker._fast_due`). They are
made into lines (:class:`_Line`, in ``StepRecord``'s field order) and encoded by msgspec once a
second (:func:`encode_rows`), off the hot path.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gpudoctor.collect import schedule as sched
from gpudoctor.collect.steps.fields import ROW


class _Block:
    """Consecutive steps closed by fast boundaries: ``ROW`` ints each (``acc`` as it stood at the
    step's end, its index included), under one marker and one ``forward_watched`` (whatever changes
    them seals the block first: :meth:`StepTracker._seal`)."""

    __slots__ = ("data", "marker", "watched")

    def __init__(self, marker: str, watched: bool, data: list[int]) -> None:
        self.marker = marker
        self.watched = watched
        self.data = data


class _Line(msgspec.Struct, gc=False):
    """One line of steps.jsonl (``StepRecord``), in its field order; encoded by msgspec a second's
    rows at a time (:meth:`StepTracker._drain_rows`)."""

    index: int
    start_ns: int
    wall_ns: int
    data_wait_ns: int
    user_cpu_ns: int | None
    sys_cpu_ns: int | None
    minor_faults: int | None
    major_faults: int | None
    cpu_steps: int | None
    gpu_ns: int | None
    profiled: bool
    window: str
    epoch: int | None
    rank: int | None
    marker: str
    forward_ns: int | None
    backward_ns: int
    optimizer_ns: int
    micro_batches: int
    batches: int


_LINES = msgspec.json.Encoder()


def _line(row: list[Any], rank: int | None) -> _Line:
    """A slow boundary's row as a line (see :meth:`StepTracker._close`)."""
    (index, start, wall, wait, ut, st, minflt, majflt, gpu, window, epoch,
     marker, fwd, bwd, opt, micro, batches, cpu_steps) = row
    return _Line(
        index, start, wall, wait, None if ut is None else round(ut * 1e9), None if st is None else round(st * 1e9),
        minflt, majflt, cpu_steps, gpu, window == sched.ACTIVE, window, epoch, rank, marker, fwd,
        bwd, opt, micro, batches,
    )


def _expand(raw: tuple[Any, ...], t0: int) -> list[Any]:
    """A fast boundary's raw figures as a row (see :meth:`StepTracker._fast_due`)."""
    (wait, fwd, bwd, opt, n_bwd, n_batches, index, start, end, epoch, marker, watched,
     ut, st, minflt, majflt, cpu) = raw
    return [index, start - t0, end - start, wait, ut, st, minflt, majflt, None, "", epoch,
            marker, fwd if watched else None, bwd, opt, n_bwd or n_batches, n_batches, cpu]


def _block_lines(block: _Block, t0: int, rank: int | None, counts: dict[int, int], others: dict[int, int],
                 out: list[_Line]) -> int:
    """The lines of a fast block's steps (see :meth:`StepTracker.fast_close`), appended to ``out``;
    returns how many of them another optimizer also stepped in."""
    marker, watched = block.marker, block.watched
    optimizer = marker == "optimizer"
    with_others = 0
    it = iter(block.data)
    for wait, fwd, bwd, opt, n_bwd, n_batches, start, end, epoch, _, index, *_ in zip(
            *(it,) * ROW, strict=True):
        micro = n_bwd or n_batches
        if optimizer:
            if others and others.pop(index, 0):  # several optimizers stepped: one iteration, not accumulation
                micro = n_batches or 1
                with_others += 1
            counts[micro] = counts.get(micro, 0) + 1  # micro-batches of each optimizer step, for describe()
        out.append(_Line(index, start - t0, end - start, wait, None, None, None, None, None, None, False, "",
                         None if epoch < 0 else epoch, rank, marker, fwd if watched else None, bwd, opt,
                         micro, n_batches))
    return with_others


def encode_rows(rows: list[Any], t0: int, rank: int | None, counts: dict[int, int],
                others: dict[int, int]) -> tuple[str, int]:
    """The lines of finished rows (lists, raw tuples, blocks) as JSON Lines, and how many of their
    steps another optimizer also stepped in (``others``: step index -> those optimizer steps, taken
    out as they are used; ``counts``: steps by micro-batches, counted here)."""
    lines: list[_Line] = []
    with_others = 0
    for r in rows:
        if type(r) is _Block:
            with_others += _block_lines(r, t0, rank, counts, others, lines)
            continue
        if type(r) is tuple:
            r = _expand(r, t0)
        if r[11] == "optimizer":  # micro-batches of each optimizer step, for describe()
            if others and others.pop(r[0], 0):
                r[15] = r[16] or 1  # several optimizers stepped: one iteration (see StepTracker.other_steps)
                with_others += 1
            counts[r[15]] = counts.get(r[15], 0) + 1
        lines.append(_line(r, rank))
    return _LINES.encode_lines(lines).decode(), with_others
