"""The steady steps of a run and the step-time figures every output prints from them.

One definition of each step population (marked, steady, unprofiled, the figures' window) and of
the step time (the mean of the figures' window, total ÷ count; the median and p90 its spread),
applied once per diagnosis by ``analysis.figures`` (which the rules, the engine's summary, the
account, ``--verify`` and ``compare`` read) and by the line ``gpudoctor profile`` prints on stderr
at the end of a run (``collect.summary``), so that a step time or a data-wait share has one value
wherever it is shown. Pure functions of the model's records: no torch, no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from gpudoctor.model.metrics import WindowWeight
from gpudoctor.model.run import DataLoaderSetting, Settings, StepRecord
from gpudoctor.model.settle import Point, Settling, settling


def median_int(values: Iterable[int]) -> int | None:
    """The median of integer values (truncated to an int), None for none."""
    vals = list(values)
    return int(statistics.median(vals)) if vals else None


def percentile_int(values: Iterable[int], pct: float) -> int | None:
    """Nearest-rank percentile (``pct`` in 0..100), None for no values."""
    vals = sorted(values)
    if not vals:
        return None
    k = max(0, min(len(vals) - 1, int(-(-pct * len(vals) // 100)) - 1))
    return vals[k]


def main_dataloader(settings: Settings | None) -> DataLoaderSetting | None:
    """The DataLoader the training loop iterates: most iterations started, first on ties."""
    if settings is None or not settings.dataloaders:
        return None
    return max(settings.dataloaders, key=lambda d: d.iterations_started)


def marked_steps(steps: Sequence[StepRecord], step_source: str | None) -> tuple[StepRecord, ...]:
    """The steps of the marker that defines the run (``manifest.step_source``): when a more
    specific marker took over mid-run (training after an evaluation pass), the steps before
    it measured another loop."""
    steps = tuple(steps)
    if not step_source or not steps or not steps[-1].marker:
        return steps
    final = tuple(s for s in steps if s.marker == step_source)
    return final if final and len(final) < len(steps) else steps


def worker_firsts(steps: Sequence[StepRecord], loader: DataLoaderSetting | None) -> set[int]:
    """The indices of the steps that receive batch 0..N-1 of an epoch whose N workers start (the
    first epoch; every epoch without ``persistent_workers``): worker k loads batch k, so each of
    these waits for its own worker's start-up, a one-off cost (GD202's) and not a stall. Measured
    on 2 cores: the second of two spawned workers delivered its first batch 0.5 s after the
    first's."""
    n = loader.num_workers if loader is not None else 0
    if loader is None or n < 2 or not steps:
        return set()
    out: set[int] = set()
    received: dict[int | None, int] = {}  # batches of each epoch before the step
    starts = steps[0].epoch
    for s in steps:
        k = received.get(s.epoch, 0)
        if k < n and (s.epoch == starts or not loader.persistent_workers):
            out.add(s.index)
        received[s.epoch] = k + max(1, s.batches if s.batches is not None else (s.micro_batches or 1))
    return out


def compile_steps(settings: Settings | None, steps: Sequence[StepRecord] = ()) -> frozenset[int]:
    """The steps in which ``torch.compile`` compiled (``Settings.compile``): its warm-up and every
    recompilation, one-off costs of their own. A compilation recorded without its step (an older
    torch, a refusal) is placed by its start time among ``steps``."""
    state = settings.compile if settings is not None else None
    if state is None:
        return frozenset()
    out = {e.step for e in state.events if e.step is not None}
    timed = [e.start_ns for e in state.events if e.step is None and e.start_ns is not None]
    for t in timed:
        for s in steps:
            if s.start_ns <= t < s.start_ns + s.wall_ns:
                out.add(s.index)
                break
    return frozenset(out)


def _candidates(
    steps: Sequence[StepRecord], step_source: str | None, loader: DataLoaderSetting | None,
    compiled: Collection[int] = (),
) -> tuple[tuple[StepRecord, ...], bool]:
    """The steps of the run's marker without their one-off costs (:func:`steady_steps`), before any
    split where the loop settles; False with them when none is left and the marked steps stand."""
    marked = marked_steps(steps, step_source)
    if len(marked) < 2:
        return marked, False
    first_of_epoch: set[int] = set()
    seen: set[int | None] = set()
    for s in marked:
        if s.epoch not in seen:
            seen.add(s.epoch)
            first_of_epoch.add(s.index)
    if all(s.epoch is None for s in marked):
        first_of_epoch = {marked[0].index}
    first_of_epoch |= worker_firsts(marked, loader)
    rest = tuple(s for s in marked if s.index not in first_of_epoch)
    if compiled:
        warm = tuple(s for s in rest if s.index not in compiled)
        rest = warm or rest
    return (rest, True) if rest else (marked, False)


def settle_points(candidates: Sequence[StepRecord]) -> tuple[list[Point], str]:
    """The series the split where a loop settles is searched on (``model.settle``): one point per step
    index, its time at the rate the loop sustains (:func:`loop_times`: CUDA events where the steps carry
    them, else wall time), the median over the ranks; bare where no rank's step had an instrument
    (:func:`unprofiled_steps`)."""
    _, source = loop_times(candidates)
    bare = {(s.rank, s.index) for s in unprofiled_steps(candidates)}
    by_index: dict[int, list[StepRecord]] = {}
    for s in candidates:
        by_index.setdefault(s.index, []).append(s)
    events = source == "CUDA events"
    points = []
    for i in sorted(by_index):
        rows = by_index[i]
        if len(rows) == 1:  # one rank
            s = rows[0]
            t = s.gpu_ns if events else s.wall_ns
            if t is not None and t > 0:
                points.append(Point(i, t, (s.rank, i) in bare, s.window))
            continue
        times = [t for t in (s.gpu_ns if events else s.wall_ns for s in rows) if t is not None and t > 0]
        if times:
            points.append(Point(i, int(statistics.median(times)), all((s.rank, i) in bare for s in rows),
                                rows[0].window))
    return points, source


def run_settling(
    steps: Sequence[StepRecord], step_source: str | None, loader: DataLoaderSetting | None,
    compiled: Collection[int] = (),
) -> Settling | None:
    """Where the run's step time changed beyond noise (``model.settle.settling``), None where it held
    steady: :func:`steady_steps` keeps the settled part, and the report names the change."""
    candidates, ok = _candidates(steps, step_source, loader, compiled)
    if not ok:
        return None
    return settling(*settle_points(candidates))


def steady_steps(
    steps: Sequence[StepRecord], step_source: str | None, loader: DataLoaderSetting | None,
    compiled: Collection[int] = (),
) -> tuple[StepRecord, ...]:
    """Steps of the run's marker without the first (and the first of each epoch when epochs
    are known): those carry one-off costs (worker start-up, cuDNN autotuning, allocator
    warm-up; a step that straddles a change of marker). With N DataLoader workers (``loader``:
    :func:`main_dataloader`), also the steps that receive batches 1..N-1 of an epoch whose
    workers start (:func:`worker_firsts`). ``compiled``: the steps in which torch.compile
    compiled (:func:`compile_steps`), left out too (unless that leaves none). Of a loop whose
    step time dropped beyond noise midway (a warm-up, a phase: :func:`run_settling`), only the
    steps after it settled."""
    candidates, ok = _candidates(steps, step_source, loader, compiled)
    if not ok:
        return candidates
    found = settling(*settle_points(candidates))
    first = found.first_settled if found is not None else None
    return candidates if first is None else tuple(s for s in candidates if s.index >= first)


class StepSource(str, Enum):
    """What timed the steps the step time is of (``loop_times``): the CUDA events recorded at the step
    boundaries, the host's wall time, or (a trace without per-step records) the trace's ProfilerStep windows."""

    CUDA_EVENTS = "CUDA events"
    WALL = "wall"
    TRACE = "trace steps"


@dataclass(frozen=True, slots=True)
class StepFigures:
    """The step-time figures of a set of steady steps, as every output prints them: **the step time**
    (``step_ns``: the mean over the steps, total ÷ count, the throughput ``--verify`` measures), and its
    spread (median and p90), never printed as "the step"."""

    steps: int  # steady steps they are of (``figure_steps``)
    step_ns: int | None  # THE step time: the mean (total ÷ count, ``loop_times``), to the whole µs as every output keeps it
    median_ns: int | None  # spread: the median step (``loop_times``), to the whole µs
    p90_ns: int | None  # spread: nearest rank, to the whole µs
    data_wait_pct: float | None  # time blocked in DataLoader.__next__, % of the step time (3 decimals)
    data_wait_ns: int | None = None  # the mean wait per step (a step's wait counted up to its wall time)
    source: StepSource = StepSource.WALL  # what timed the steps
    unprofiled: bool = False  # the steps are the unprofiled ones (instrumented steps were left out)

    @property
    def step_ms(self) -> float | None:
        return None if self.step_ns is None else self.step_ns / 1e6

    @property
    def median_ms(self) -> float | None:
        return None if self.median_ns is None else self.median_ns / 1e6

    @property
    def p90_ms(self) -> float | None:
        return None if self.p90_ns is None else self.p90_ns / 1e6


#: The share of steps that must carry a CUDA-event time for those times to be the step time: fewer
#: (events that lagged too far, a step that never touched CUDA) and the host's wall time stands.
MIN_EVENT_STEPS_SHARE = 0.5


def loop_times(steps: Sequence[StepRecord]) -> tuple[list[int], StepSource]:
    """The time of each step at the rate the loop sustains, and what measured it.

    The CUDA events recorded at the step boundaries (``StepRecord.gpu_ns``) time the device's passage
    from one boundary to the next. Where the device keeps up, it passes each boundary as the host
    records it, and the events measure the host's step; where it runs behind (a GPU-bound loop: the
    host enqueues a step faster than the device runs it, until the launch queue fills), the host's
    wall time per step is the time to *enqueue* it, and only the events measure the step. So the
    events' times, where at least ``MIN_EVENT_STEPS_SHARE`` of the steps carry one, else the wall time."""
    timed = [s.gpu_ns for s in steps if s.gpu_ns is not None and s.gpu_ns > 0]
    if steps and len(timed) >= MIN_EVENT_STEPS_SHARE * len(steps):
        return [int(t) for t in timed], StepSource.CUDA_EVENTS
    return [s.wall_ns for s in steps], StepSource.WALL


def data_wait_share_pct(steps: Sequence[StepRecord]) -> float | None:
    """Time blocked waiting for the next batch, % of the wall time of ``steps`` (a step's wait
    counted up to its wall time); None when they have no wall time."""
    total = sum(s.wall_ns for s in steps)
    if total <= 0:
        return None
    return 100.0 * sum(min(s.data_wait_ns, s.wall_ns) for s in steps) / total


def _us(ns: float) -> int:
    """To the whole µs (3 decimals of a ms), once: a value just under a rounding edge (3.4496 ms) prints
    the same everywhere (3.4 ms, not 3.5)."""
    return int(round(ns / 1000.0)) * 1000


def times_figures(times: Sequence[int], source: StepSource, steps: Sequence[StepRecord] = (),
                  unprofiled: bool = False) -> StepFigures:
    """The step figures of step times ``times`` measured by ``source`` (``steps``: the records they are of,
    for the data wait; none for a trace's windows): the mean is the step time, the median and p90 its spread."""
    if not times:
        return StepFigures(0, None, None, None, None, source=source)
    # the wait's share of the step time: the mean wait ÷ the step time (the mean of ``times``), so that "70.60 ms
    # of a 77.51 ms step" and its share are of one statistic, also where CUDA events timed fewer steps than the
    # records hold (a sum of every step's wait over a sum of fewer steps' times said 31.7% beside 4.52 ms of 16.05 ms)
    waited = sum(min(s.data_wait_ns, s.wall_ns) for s in steps)
    mean_time = sum(times) / len(times)
    wait = 100.0 * (waited / len(steps)) / mean_time if steps and mean_time > 0 else None
    return StepFigures(
        steps=len(times),
        step_ns=_us(mean_time),
        median_ns=_us(median_int(times) or 0),
        p90_ns=_us(percentile_int(times, 90) or 0),
        data_wait_pct=round(wait, 3) if wait is not None else None,
        data_wait_ns=int(round(waited / len(steps))) if steps else None,
        source=source,
        unprofiled=unprofiled,
    )


def step_figures(steady: Sequence[StepRecord]) -> StepFigures:
    """The step time (the mean, :func:`loop_times`), its spread (median, p90) and the data-wait share of the
    steps of ``steady`` (:func:`steady_steps`) the figures are of (:func:`figure_steps`: the unprofiled ones
    where there are enough), rounded once here to the whole µs."""
    if not steady:
        return StepFigures(0, None, None, None, None)
    steps = figure_steps(steady)
    times, source = loop_times(steps)
    return times_figures(times, source, steps, unprofiled=len(steps) < len(steady))


# --------------------------------------------------------------------------- the profiler's weight

#: Unprofiled steady steps enough for figures of their own (a median to weigh a window against, the
#: means of GD201's model): with fewer, the figures that prefer them take every steady step. GD201's
#: choice since issue 24; a 30-step run on the profiler's default schedule keeps 8-10.
MIN_BARE_STEPS = 5


def unprofiled_steps(steady: Sequence[StepRecord]) -> tuple[StepRecord, ...]:
    """The steps of ``steady`` that ran with no instrument (``StepRecord.window`` empty: neither
    torch.profiler's warm-up or active steps nor cProfile's), nor right after one (the step before it
    in ``steady``): the step that follows a window pays for its end (the profiler's export, cProfile's
    stop), 35 ms on a 11 ms step of fp32_convnet on the H200. These are the steps a ``--verify`` trial
    run resembles: it runs no instrument at all."""
    window = {(s.rank, s.index): s.window for s in steady}
    return tuple(s for s in steady if not s.window and not window.get((s.rank, s.index - 1), ""))


def figure_steps(steady: Sequence[StepRecord]) -> tuple[StepRecord, ...]:
    """The steps the run's step figures are of (the report's summary and account, the line ``gpudoctor
    profile`` prints, GD201's and GD204's models): the unprofiled ones (:func:`unprofiled_steps`) where
    there are ``MIN_BARE_STEPS``, since a verdict must hold for the loop as it runs without the profiler
    (docs/account.md, "The accounting window"), else every steady step."""
    bare = unprofiled_steps(steady)
    return bare if len(bare) >= MIN_BARE_STEPS else tuple(steady)


def window_weight(recorded: Sequence[StepRecord], bare: Sequence[StepRecord]) -> WindowWeight | None:
    """How much slower the steps a trace recorded ran than the unprofiled ones (:func:`unprofiled_steps`):
    the median of each, at the rate the loop sustains (:func:`loop_times`: CUDA events where both sets
    carry them, else the host's wall time for both). None with fewer than ``MIN_BARE_STEPS`` unprofiled
    steps or no recorded one."""
    if len(bare) < MIN_BARE_STEPS or not recorded:
        return None
    rec, rec_src = loop_times(recorded)
    base, base_src = loop_times(bare)
    if rec_src != base_src:  # one set timed by events, the other not: compare the host's times
        rec, base, rec_src = [s.wall_ns for s in recorded], [s.wall_ns for s in bare], StepSource.WALL
    num, den = median_int(rec), median_int(base)
    if not num or not den:
        return None
    return WindowWeight(ratio=num / den, window_step_ns=num, bare_step_ns=den,
                        window_steps=len(rec), bare_steps=len(base), source=rec_src.value)
