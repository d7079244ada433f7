"""The DataLoader's load in the run's figures (``analysis.loader``, ``RunFigures.loader``): loading one batch,
its CPU and its kind, measured once per diagnosis from the records, settings, samples and cProfile; what
GD201 sizes its workers from and GD202-GD205 read. Hand-built runs, exact figures."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

_RULES = str(Path(__file__).resolve().parents[1] / "rules")
if _RULES not in sys.path:
    sys.path.insert(0, _RULES)

from rule_builders import (  # noqa: E402
    MS,
    PstatsEntry,
    Samples,
    cpu_manifest,
    dataloader,
    proc_samples,
    run,
    settings,
    steps,
)

from gpudoctor.analysis.figures import run_figures  # noqa: E402
from gpudoctor.analysis.loader import (  # noqa: E402
    COMPUTING,
    UNMEASURED,
    WAITING,
    classify,
    machine_busy,
)
from gpudoctor.config import Thresholds  # noqa: E402
from gpudoctor.model import HostLoad, ProcessSample  # noqa: E402
from gpudoctor.rules.context import RuleContext  # noqa: E402
from gpudoctor.rules.load_model import loader_of  # noqa: E402

FETCH = "/venv/lib/python3.11/site-packages/torch/utils/data/_utils/fetch.py"


def _fetch(sleep_s: float, work_s: float) -> tuple[PstatsEntry, ...]:
    """cProfile entries of a fetch that sleeps ``sleep_s`` and computes ``work_s`` in the user's decode()."""
    fetch_s = sleep_s + work_s
    return (
        PstatsEntry(FETCH, 49, "fetch", 20, 0.001, fetch_s, 0.001, fetch_s),
        PstatsEntry("/work/train.py", 20, "collate", 20, 0.001, fetch_s, 0.001, fetch_s),
        PstatsEntry("~", 0, "<built-in method time.sleep>", 20, sleep_s, sleep_s, sleep_s, sleep_s),
        PstatsEntry("/work/train.py", 30, "decode", 640, work_s, work_s, work_s, work_s),
    )


def _serial(wall_ms: float, wait_ms: float, *, cpu_ms: float | None = None, model_ms: float | None = None,
            pstats: tuple[PstatsEntry, ...] = (), micro: int | None = None):
    """30 steps of a CPU run on 2 cores, num_workers=0: ``wait_ms`` of each ``wall_ms`` in the loader."""
    s = steps(30, wall_ms, wait_ms, user_ms=cpu_ms, sys_ms=0.0 if cpu_ms is not None else None)
    if model_ms is not None:
        third = int(model_ms * MS / 3)
        s = tuple(dataclasses.replace(x, forward_ns=third, backward_ns=third, optimizer_ns=third) for x in s)
    if micro is not None:
        s = tuple(dataclasses.replace(x, micro_batches=micro, marker="optimizer") for x in s)
    return run(manifest=cpu_manifest(cpu_count=2), settings=settings(device_type="cpu", cpu_count=2, num_threads=2),
               steps=s, pstats=pstats)


def _loader(data, t: Thresholds | None = None):
    figs = run_figures(data, t or Thresholds())
    assert figs.loader is not None
    return figs.loader


def test_the_loader_is_measured_only_with_the_thresholds_that_judge_it() -> None:
    data = _serial(32.0, 20.0, cpu_ms=12.0, model_ms=11.0)
    assert run_figures(data).loader is None  # --verify's judging and compare read the steps alone
    lf = _loader(data)
    assert lf.load is not None and lf.load.load_ns == pytest.approx(20 * MS)
    # a diagnosis reads the one copy its RuleContext made with its own thresholds
    ctx = RuleContext(data, Thresholds())
    assert ctx.figures.loader is ctx.figures.loader and ctx.figures.loader == lf


def test_a_sleeping_fetch_is_a_waiting_load_by_its_cprofile() -> None:
    # 0.40 s of sleep and 4 ms of decode() in the fetch: it wants a core 1% of its time
    lf = _loader(_serial(32.0, 20.0, pstats=_fetch(0.40, 0.004)))
    load = lf.load
    assert load.kind == WAITING and load.wanted_frac == pytest.approx(0.004 / 0.404)
    assert load.cpu_ns == pytest.approx(20 * MS * 0.004 / 0.404)
    assert load.profile is not None and [e.function for e in load.profile.own] == ["collate", "decode"]
    assert any(n.startswith("cProfile:") and "time.sleep" in n for n in load.evidence)
    assert "waits rather than computes" in load.kind_text and lf.main_cpu_ns is None  # no getrusage readings


def test_getrusage_alone_tells_a_computing_load_and_the_training_s_own_cpu() -> None:
    # 31 ms of CPU per step, 11 of them in the model's calls, against a 20 ms wait: the loading computed 20
    lf = _loader(_serial(32.0, 20.0, cpu_ms=31.0, model_ms=11.0))
    assert lf.load.kind == COMPUTING and lf.load.wanted_frac == pytest.approx(1.0)
    assert lf.load.cpu_ns == pytest.approx(20 * MS)
    assert lf.main_cpu_ns == pytest.approx(11 * MS)  # the process's 31 ms less the loading's 20
    assert len(lf.readings) == 29 and all(r.wait_ns == 20 * MS for r in lf.readings)  # the account's steps
    assert "the loading computes" in lf.load.kind_text
    # the kind's threshold is the diagnosis's: at 100% every measured load waits
    assert _loader(_serial(32.0, 20.0, cpu_ms=31.0, model_ms=11.0),
                   Thresholds(dataloader_waiting_cpu_max_pct=100.0)).load.kind == WAITING


def test_a_load_without_a_cpu_figure_is_unmeasured() -> None:
    lf = _loader(_serial(32.0, 20.0))
    assert lf.load.kind == UNMEASURED and lf.load.cpu_ns is None and lf.load.wanted_frac is None
    assert any("not measured" in n for n in lf.load.evidence) and lf.load.kind_text == ""


def test_the_load_is_per_batch_under_gradient_accumulation() -> None:
    # 4 micro-batches per optimizer step: the 20 ms wait is 5 ms per batch
    lf = _loader(_serial(32.0, 20.0, pstats=_fetch(0.40, 0.004), micro=4))
    assert lf.load.load_ns == pytest.approx(5 * MS)


def _workers(cpu_pct_each: float, *, runq: float | None = 0.0):
    """2 workers that fall behind: 100 ms steps, 30 ms waiting; each worker at ``cpu_pct_each``."""
    d = dataloader(num_workers=2, prefetch_factor=2, persistent_workers=True)
    procs = proc_samples(60.0, runq_wait_pct=0.0 if runq is not None else None)
    for pid in (201, 202):
        procs += tuple(ProcessSample(int(i * 100 * MS), pid, "worker", cpu_pct_each, 10**9, 1, runq_wait_pct=runq)
                       for i in range(20))
    return run(manifest=cpu_manifest(cpu_count=2), steps=steps(20, 100.0, 30.0),
               settings=settings(device_type="cpu", cpu_count=2, num_threads=1, dataloaders=(d,)),
               samples=Samples(process=procs, system_memory_bytes=8 * 2**30))


def test_workers_load_is_told_from_their_samples() -> None:
    lf = _loader(_workers(5.0))
    assert lf.workers is not None and lf.workers.workers == 2 and lf.workers.cpu_cores == pytest.approx(0.10)
    step = lf.load.load_ns / 2  # 2 workers that cannot keep up each take 2 steps per batch
    assert lf.load.kind == WAITING and lf.load.wanted_frac == pytest.approx(0.05)
    assert lf.load.cpu_ns == pytest.approx(0.10 * step)
    assert any(n.startswith("psutil: the 2 worker(s) used 0.10 cores") for n in lf.load.evidence)
    busy = _loader(_workers(100.0)).load
    assert busy.kind == COMPUTING and busy.wanted_frac == pytest.approx(1.0)


def test_the_demand_is_the_one_every_rule_reads() -> None:
    data = _workers(50.0)
    ctx = RuleContext(data, Thresholds())
    d = loader_of(ctx).demand
    assert d is not None and d is ctx.figures.loader.demand
    assert d.workers_cpu == pytest.approx(1.0) and d.main == pytest.approx(0.6) and d.tree == pytest.approx(1.6)
    assert loader_of(RuleContext(_workers(50.0, runq=None), Thresholds())).demand is None  # no schedstat


def test_the_machine_is_busy_by_gd205_s_thresholds() -> None:
    t = Thresholds()
    busy = HostLoad(samples=10, cores=4, training_cpu_pct=100.0, runq_wait_pct=30.0, others_cpu_pct=170.0)
    text, free = machine_busy(busy, 4, t)
    assert "waited for a core 30.0% of the time while other processes used 1.70 cores" in text
    assert free == pytest.approx(2.3)
    quiet = dataclasses.replace(busy, others_cpu_pct=20.0)
    assert machine_busy(quiet, 4, t) == ("", pytest.approx(3.8))
    assert machine_busy(busy, 4, Thresholds(cpu_contention_wait_pct=31.0))[0] == ""
    assert machine_busy(None, 4, t) == ("", None)


def test_the_settled_wait_is_the_later_half_s() -> None:
    # workers whose first batches came slow: 20 ms waits in the first half, 1 ms in the later half
    s = steps(30, 40.0, 1.0)
    s = tuple(dataclasses.replace(x, data_wait_ns=20 * MS) if x.index < 15 else x for x in s)
    data = run(manifest=cpu_manifest(cpu_count=2), steps=s,
               settings=settings(device_type="cpu", cpu_count=2, dataloaders=(dataloader(num_workers=2),)))
    assert _loader(data).settled_wait_ns == pytest.approx(1 * MS)
    assert _loader(dataclasses.replace(data, steps=s[:8])).settled_wait_ns is None  # under 5 steps in that half


def test_classify_at_its_threshold() -> None:
    assert classify(0.5, 50.0) == WAITING and classify(0.51, 50.0) == COMPUTING and classify(None, 50.0) == UNMEASURED
