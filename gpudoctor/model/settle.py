"""Where a loop settles: the change-point that splits a run whose step time changed midway.

A loop that warms up (a lazy initialisation, caches that fill, a compilation outside torch.compile's
records, the host's clocks) or changes phase runs its first steps at another speed than the rest. The
steady steps (``model.steady.steady_steps``) are then the ones after it settled, and every figure of the
run (the step time, the account's steps, the rules' models) is the settled part's; the report names the
change ("steps 1–21 ran 2.20 s, steps 22–39 45.0 ms: the figures are the settled part's").

The method (docs/account.md, "Where the loop settles"):

- **The split**: the single split of the step times (in step order, one time per step: the median over
  the ranks) that minimises the within-part sum of squares of their *ranks*. On ranks, a few outliers (a
  garbage collection, a checkpoint) weigh no more than any other step; and the split that minimises it is
  the one whose Mann–Whitney statistic of the two parts is the largest (the between-part sum of squares of
  ranks is ``(S1 - n1 (n+1)/2)² n / (n1 n2)``, ``S1`` the earlier part's rank sum), so the test below is the
  test of the split chosen.
- **Beyond noise**: the two parts' medians differ by at least ``MIN_RATIO`` and a two-sided Mann–Whitney U
  test (normal approximation, tie and continuity corrected: ``scipy.stats.mannwhitneyu(method="asymptotic")``,
  which tests/model checks this against) rejects at ``ALPHA``. ``ALPHA`` is strict because the split is the
  best of every place a run could be split, which a fixed-split test does not know.
- **Instruments only add time**: a step under torch.profiler or cProfile runs slower than a bare one, and a
  run's instruments change over it (a detailed window, then cProfile's, then a timings-only window), which
  a split could mistake for a change of the loop. So the test compares steps that cannot differ by their
  instruments alone: for a speed-up, the earlier part's bare steps against every later step (a later step
  faster than the earlier bare ones, instrumented or not, ran faster by the loop's doing), or the two
  parts' cProfile steps against each other; for a slow-down, mirrored.
- **Settled means sped up**: a speed-up is a loop settling (one-off costs paid early), and the figures are
  the later part's; the later part is searched again for a further speed-up, so a run that settles in
  stages is split at the last. A slow-down (a throttled GPU, a growing allocator, a busier machine, a
  longer phase of the data) is no settling: the earlier steps were the loop too, and what came later is
  not known to last or to stop. The figures stay of every steady step, and the report names the change.

This module is stdlib only (the model layer's rule): the test is the normal approximation written out
here, a few lines, rather than ``scipy.stats``, whose import would cost every command that reads a run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.model.units import duration_text

#: The least ratio of the two parts' medians that splits a run: the account's own tolerance for the
#: profiler's weight (``Thresholds.profiler_weight_max_ratio``, 1.10): a difference the account treats as
#: within noise there splits no run here.
MIN_RATIO = 1.10
#: The Mann–Whitney level a split must reach, strict because the split tested is the best of all. With the
#: ratio and the separation below, measured on log-normal step times with no change (40, 100 and 400 steps,
#: σ 0.05 to 0.5, 300 to 1,000 runs each): no i.i.d. run was split (the test alone, at this level, split up to
#: 4% of them: the best of many splits), and of runs whose noise lasts (AR(1), ρ 0.5) 0.7-2.5% found a change,
#: 0.3-1.5% a speed-up; none of the recorded H200 runs (tests/fixtures) is split.
ALPHA = 0.001
#: The least share of pairs (a step of each part) in which the slower part's step is the slower: how far the
#: parts' step times overlap, whatever the number of steps. A p-value shrinks with the steps, and step times
#: are not independent draws (a busy minute on the machine lasts many steps): on log-normal times whose
#: noise lasts (AR(1), ρ 0.5, σ 0.2) the best split passed ``ALPHA`` in 20-50% of runs with no change; this
#: asks that the change stand out of the noise, not only that it be detectable. Its price, same noise: a
#: 40-step run whose first 20 steps ran 2× is split at its change in 93% of runs, 1.5× in 34%.
MIN_SEPARATION = 0.95
#: Steps each part needs: fewer cannot reach ``ALPHA`` against a part of any length, and a part of the
#: figures needs ``model.steady.MIN_BARE_STEPS``.
MIN_PART = 5


@dataclass(frozen=True, slots=True)
class Point:
    """One step of the series the split is searched on."""

    index: int  # the step's index
    ns: int  # its time at the rate the loop sustains (CUDA events or wall time)
    bare: bool  # no instrument ran in it nor ended right before it (``model.steady.unprofiled_steps``)
    instrument: str = ""  # StepRecord.window: "", "warmup", "active" (torch.profiler) or "cprofile"


@dataclass(frozen=True, slots=True)
class Phase:
    """A part of the run between two changes of its step time."""

    first: int  # index of its first step
    last: int  # index of its last step
    steps: int
    median_ns: int

    def text(self) -> str:
        span = f"step {self.first}" if self.first == self.last else f"steps {self.first}–{self.last}"
        return f"{span} ran {duration_text(self.median_ns)}"


@dataclass(frozen=True, slots=True)
class Settling:
    """The changes of a run's step time that a split found (``settling``)."""

    phases: tuple[Phase, ...]  # in step order, at least two
    settled: bool  # True: the loop sped up, and the figures are of the last phase; False: it slowed down
    p_value: float  # Mann–Whitney, of the last change accepted
    source: str  # what timed the steps: "CUDA events" or "wall"

    @property
    def first_settled(self) -> int | None:
        """The index of the first step of the settled part (None when the loop slowed down)."""
        return self.phases[-1].first if self.settled else None

    def text(self) -> str:
        """``steps 1–21 ran 2.20 s, steps 22–39 45.0 ms (medians): the figures are the settled part's``."""
        parts = ", ".join(p.text() for p in self.phases)
        timed = "medians, CUDA events" if self.source == "CUDA events" else "medians"
        if self.settled:
            return f"{parts} ({timed}): the loop settled at step {self.phases[-1].first}; the figures are the settled part's"
        return (f"{parts} ({timed}): the loop slowed down at step {self.phases[-1].first}; the figures are of "
                "both parts (a slow-down is no warm-up: the earlier steps were the loop too)")


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """The Mann–Whitney U test of ``a`` against ``b``: (its two-sided p-value, the normal approximation with
    tie and continuity corrections as ``scipy.stats.mannwhitneyu(a, b, method="asymptotic")`` computes it;
    the share of pairs in which ``a``'s value is the larger, ties counting half: ``U / (n1 n2)``). (1.0, 0.5)
    when a sample is empty or every value is equal."""
    n1, n2 = len(a), len(b)
    if not n1 or not n2:
        return 1.0, 0.5
    ranks = _midranks([*a, *b])
    u1 = sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    n = n1 + n2
    ties = _tie_sum([*a, *b])
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 1.0, 0.5
    z = (abs(u1 - n1 * n2 / 2) - 0.5) / math.sqrt(var)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2))), u1 / (n1 * n2)


def _midranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties given the mean of their ranks."""
    n = len(values)
    order = sorted(range(n), key=values.__getitem__)
    ranks = [0.0] * n
    i = 0
    while i < n:
        v, j = values[order[i]], i + 1
        while j < n and values[order[j]] == v:
            j += 1
        r = (i + j + 1) / 2  # the mean of ranks i+1 .. j
        for k in order[i:j]:
            ranks[k] = r
        i = j
    return ranks


def _tie_sum(values: Sequence[float]) -> float:
    counts: dict[float, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return float(sum(t**3 - t for t in counts.values() if t > 1))


def best_split(times: Sequence[float], min_part: int = MIN_PART) -> int | None:
    """The split of ``times`` (in step order) into ``times[:k]`` and ``times[k:]``, each of at least
    ``min_part``, that minimises the within-part sum of squares of the ranks (the largest Mann–Whitney
    statistic); None when ``times`` is too short to split."""
    n = len(times)
    if n < 2 * min_part:
        return None
    ranks = _midranks(times)
    mid = (n + 1) / 2
    best, best_k, s1 = -1.0, None, 0.0
    for k in range(1, n - min_part + 1):
        s1 += ranks[k - 1]
        if k < min_part:
            continue
        score = (s1 - k * mid) ** 2 / (k * (n - k))
        if score > best:
            best, best_k = score, k
    return best_k


def _evidence(early: Sequence[Point], late: Sequence[Point], faster: bool) -> float | None:
    """The p-value of the change between ``early`` and ``late`` on steps whose instruments cannot make it
    (a speed-up: the earlier bare steps against every later one, or cProfile's steps on both sides; a
    slow-down mirrored), the smallest of the comparisons that have ``MIN_PART`` steps a side and show the
    change by ``MIN_RATIO``; None when none does."""
    pairs = [([p.ns for p in early if p.bare], [p.ns for p in late]) if faster
             else ([p.ns for p in early], [p.ns for p in late if p.bare]),
             ([p.ns for p in early if p.instrument == "cprofile"], [p.ns for p in late if p.instrument == "cprofile"])]
    best: float | None = None
    for a, b in pairs:
        if len(a) < MIN_PART or len(b) < MIN_PART:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        if min(ma, mb) <= 0 or (ma / mb if faster else mb / ma) < MIN_RATIO:
            continue
        p, above = mann_whitney(a, b)
        if (above if faster else 1.0 - above) < MIN_SEPARATION:
            continue
        best = p if best is None else min(best, p)
    return best


def _change(points: Sequence[Point]) -> tuple[int, bool, float] | None:
    """The accepted change of ``points``: (where the later part starts, whether it sped up, its p-value)."""
    k = best_split([p.ns for p in points])
    if k is None:
        return None
    early, late = points[:k], points[k:]
    me, ml = statistics.median(p.ns for p in early), statistics.median(p.ns for p in late)
    if min(me, ml) <= 0 or max(me, ml) / min(me, ml) < MIN_RATIO:
        return None
    faster = ml < me
    p = _evidence(early, late, faster)
    if p is None or p >= ALPHA:
        return None
    return k, faster, p


def _phase(points: Sequence[Point]) -> Phase:
    return Phase(points[0].index, points[-1].index, len(points), int(statistics.median(p.ns for p in points)))


def settling(points: Sequence[Point], source: str = "wall") -> Settling | None:
    """The changes of the step time of ``points`` (a run's steady candidates, in step order) beyond noise,
    None where it holds steady: the module's docstring says how they are found and which part is settled."""
    points = sorted(points, key=lambda p: p.index)
    found = _change(points)
    if found is None:
        return None
    k, faster, p = found
    if not faster:
        return Settling((_phase(points[:k]), _phase(points[k:])), False, p, source)
    phases = [_phase(points[:k])]
    rest = points[k:]
    while True:  # a loop that settles in stages: the last speed-up
        more = _change(rest)
        if more is None or not more[1]:
            break
        k, _, p = more
        phases.append(_phase(rest[:k]))
        rest = rest[k:]
    return Settling((*phases, _phase(rest)), True, p, source)


__all__ = ["ALPHA", "MIN_PART", "MIN_RATIO", "Phase", "Point", "Settling", "best_split", "mann_whitney", "settling"]
