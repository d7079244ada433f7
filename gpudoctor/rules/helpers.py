"""Small helpers several rules share: Python frames, DataLoader snippets, memory peaks, pstats."""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.analysis import figures
from gpudoctor.model.findings import Finding, Fix, Location, Metric, SettingRef
from gpudoctor.model.metrics import Component, DispatchStats, TraceMetrics, WindowKind
from gpudoctor.model.run import (
    DataLoaderSetting,
    FlagSetting,
    GpuSample,
    Injection,
    PstatsEntry,
    StepRecord,
)
from gpudoctor.model.units import duration_text
from gpudoctor.rules.context import RuleContext, fmt_pct, location_of
from gpudoctor.rules.edits import dataloader_args, edit_fix

_FRAME_RE = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\):\s*(?P<func>.*)$")


def parse_frame(frame: str) -> Location | None:
    """``"train.py(42): train_step"`` (Kineto's python_function name) as a ``Location``."""
    m = _FRAME_RE.match(frame.strip())
    if not m:
        return None
    return Location(file=m.group("file"), line=int(m.group("line")), function=m.group("func"))


def dataloader_settings(dl: DataLoaderSetting) -> tuple[SettingRef, ...]:
    """The DataLoader's settings as evidence, each with the DataLoader's call site."""
    loc = location_of(dl.call_site)
    return (
        SettingRef("DataLoader.batch_size", dl.batch_size, loc),
        SettingRef("DataLoader.num_workers", dl.num_workers, loc),
        SettingRef("DataLoader.prefetch_factor", dl.prefetch_factor, loc),
        SettingRef("DataLoader.persistent_workers", dl.persistent_workers, loc),
        SettingRef("DataLoader.pin_memory", dl.pin_memory, loc),
    )


def dataloader_call(dl: DataLoaderSetting | None, **changes: object) -> str:
    """A ``DataLoader(...)`` call with the run's settings, and ``changes`` applied."""
    if dl is None:
        args: dict[str, object] = {"batch_size": 64}
    else:
        args = {"batch_size": dl.batch_size if dl.batch_size is not None else 64}
        if dl.num_workers:
            args["num_workers"] = dl.num_workers
            if dl.prefetch_factor not in (None, 2):
                args["prefetch_factor"] = dl.prefetch_factor
            if dl.persistent_workers:
                args["persistent_workers"] = True
        if dl.pin_memory:
            args["pin_memory"] = True
        if dl.drop_last:
            args["drop_last"] = True
    for k, v in changes.items():
        if v is None:
            args.pop(k, None)
        else:
            args[k] = v
    dataset = "dataset"
    inner = ", ".join([dataset, *(f"{k}={v!r}" for k, v in args.items())])
    return f"loader = DataLoader({inner})"


def dataloader_fix(instruction: str, dl: DataLoaderSetting | None, changes: dict[str, object], before: str = "",
                   after: str = "") -> Fix:
    """A DataLoader fix: the arguments ``changes`` set at the DataLoader's call site (an edit the report
    makes from the script's own line where the source is at hand), with an illustration until then."""
    before = before or dataloader_call(dl)
    after = after or dataloader_call(dl, **changes)
    if dl is None or dl.call_site is None:
        why = "no DataLoader was recorded" if dl is None else "the DataLoader's call site was not recorded"
        return Fix(instruction, before, after, illustration=why)
    edit = dataloader_args(dl.call_site.file, dl.call_site.line, changes)
    return edit_fix(instruction, before, after, edit, illustration="the script's source is not at hand")


def dataloader_of(ctx: RuleContext, finding: Finding) -> DataLoaderSetting | None:
    """The DataLoader a finding names (its location is the DataLoader's call site), else the main one."""
    s = ctx.settings
    if s is None or not s.dataloaders:
        return None
    loc = finding.location
    if loc is not None:
        for d in s.dataloaders:
            if d.call_site is not None and d.call_site.file == loc.file and d.call_site.line == loc.line:
                return d
    return ctx.main_dataloader()


def dataloader_injections(dl: DataLoaderSetting, changes: dict[str, object]) -> tuple[Injection, ...]:
    """--verify: DataLoader arguments set at the DataLoader's call site."""
    return tuple(
        Injection("dataloader", k, v, dl.call_site, text=f"DataLoader {k}={v!r} at {dl.call_site}")
        for k, v in changes.items()
    )


def no_dataloader_reason(ctx: RuleContext, dl: DataLoaderSetting | None) -> str | None:
    """Why DataLoader arguments cannot be injected, or None when they can."""
    if dl is None:
        if ctx.settings is None:
            return "the DataLoader's settings were not recorded (a bare trace): verify a run of `gpudoctor profile`"
        return "no DataLoader in this run"
    if dl.call_site is None:
        return "the DataLoader's call site is unknown: gpudoctor cannot tell which DataLoader to change"
    return None


def pinned_copy_injections(ctx: RuleContext, finding: Finding) -> tuple[Injection, ...] | str:
    """--verify for host→device copies: pin_memory=True at the DataLoader the finding names (when it
    does not pin yet) and non_blocking=True on the host→device copies of the batches it returns."""
    dl = dataloader_of(ctx, finding)
    if dl is None and ctx.settings is not None:
        return "no DataLoader: the copied tensors are made in the script; pinning them is a code change"
    why = no_dataloader_reason(ctx, dl)
    if why:
        return why
    out = [] if dl.pin_memory else list(dataloader_injections(dl, {"pin_memory": True}))
    out.append(Injection("non_blocking", "non_blocking", True, dl.call_site,
                         text=f"non_blocking=True on host→device copies of the batches of the DataLoader at {dl.call_site}"))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class MemoryPeak:
    peak_bytes: int
    total_bytes: int
    source: str  # "reserved (trace)", "allocated (trace)", "NVML used"

    @property
    def pct(self) -> float:
        return 100.0 * self.peak_bytes / self.total_bytes

    def metrics(self) -> tuple[Metric, ...]:
        return (
            Metric("peak_memory_bytes", self.peak_bytes, "bytes"),
            Metric("peak_memory_source", self.source),
            Metric("device_memory_bytes", self.total_bytes, "bytes"),
            Metric("peak_memory_pct", round(self.pct, 1), "%", "the device"),
        )


def memory_peak(ctx: RuleContext, m: TraceMetrics | None) -> MemoryPeak | None:
    """The highest memory figure known for the run's GPU: the allocator peak (reserved, else allocated)
    of ``m`` or another trace of its process (``--memory`` records it in the detailed window only), else
    NVML's used memory."""
    total_default = ctx.device_total_bytes()
    if m is not None:
        best: MemoryPeak | None = None
        mine = [m, *(x for x in ctx.metrics if x.rank == m.rank and x is not m)]
        for mem in (mem for x in mine for mem in x.memory):
            total = mem.total_bytes or total_default
            for value, src in (
                (mem.peak_reserved_bytes, "reserved (trace)"),
                (mem.peak_allocated_bytes, "allocated (trace)"),
            ):
                if value and total:
                    cand = MemoryPeak(value, total, src)
                    if best is None or cand.pct > best.pct:
                        best = cand
                    break
        if best is not None:
            return best
    samples = [g for g in ctx.samples_gpu() if g.mem_used_bytes is not None]
    if samples:
        top = max(samples, key=lambda g: g.mem_used_bytes or 0)
        total = top.mem_total_bytes or total_default
        if total and top.mem_used_bytes is not None:
            return MemoryPeak(top.mem_used_bytes, total, "NVML used")
    return None


def device_limited(m: TraceMetrics) -> str | None:
    """Why the host's launches and batch size do not set the step time, when the device limits every
    profiled step of ``m`` (``TraceMetrics.timelines``: the device ran behind the host, waiting for it,
    and on its dependencies, under the cut): the reason in words; None when some step waits for the host (or no timelines)."""
    t = m.timelines
    if t is None or not t.steps or t.device_bound_steps < len(t.steps):
        return None
    return (f"the GPU limits all {len(t.steps)} profiled steps (it waited for the host, and on other streams, "
            f"events or collectives, under {t.device_bound_wait_pct:g}% of each, busy {fmt_pct(t.device_busy_pct)}"
            + (f"; the host runs {duration_text(t.lead_ns)} ahead)" if t.lead_ns else ")"))


def steps_span(ctx: RuleContext, steps: Sequence[StepRecord] | None = None) -> tuple[int, int] | None:
    """When ``steps`` (default: the steady steps) ran, from the run's start (ns), at the rate the loop
    sustains (``analysis.figures.steps_span``); None without steps."""
    return figures.steps_span(ctx.steady_steps() if steps is None else steps)


def gpu_samples_in_steps(ctx: RuleContext, device: int | None = None) -> tuple[tuple[GpuSample, ...], str]:
    """NVML samples of ``device`` (every device when None) taken while the steady steps ran
    (``steps_span``), and which they are ("while the steady steps ran"); every sample ("over the run")
    when none was taken then or the run has no steps."""
    samples = tuple(g for g in ctx.samples_gpu() if device is None or g.index == device)
    span = steps_span(ctx)
    if span is not None:
        inside = tuple(g for g in samples if span[0] <= g.t_ns <= span[1])
        if inside:
            return inside, "while the steady steps ran"
    return samples, "over the run"


_LIBRARY_MARKERS = ("site-packages", "dist-packages", "/lib/python", "\\lib\\python", "<frozen", "gpudoctor")


def user_functions(entries: tuple[PstatsEntry, ...]) -> list[PstatsEntry]:
    """The user's own functions of a cProfile, by self time (no library, built-in or gpudoctor code)."""
    out = [
        e
        for e in entries
        if e.file
        and not e.file.startswith("~")
        and not e.file.startswith("<")
        and not any(marker in e.file for marker in _LIBRARY_MARKERS)
    ]
    out.sort(key=lambda e: (-e.tottime_s, e.file, e.line))
    return out


def pstats_total_s(entries: tuple[PstatsEntry, ...]) -> float:
    """The profiled time: the largest cumulative time of any entry (the outermost call)."""
    return max((e.cumtime_s for e in entries), default=0.0)


def find_flag(ctx: RuleContext, *suffixes: str) -> FlagSetting | None:
    """The first recorded flag whose name ends with one of ``suffixes`` (collect's names are
    fully qualified: "torch.backends.cudnn.benchmark", "torch.backends.cuda.matmul.allow_tf32",
    "torch.float32_matmul_precision")."""
    s = ctx.settings
    if s is None:
        return None
    for suffix in suffixes:
        for f in s.flags:
            if f.name == suffix or f.name.endswith("." + suffix) or f.name.endswith(suffix):
                return f
    return None


def flag_ref(f: FlagSetting) -> SettingRef:
    return SettingRef(f.name, f.value, location_of(f.call_site))


def flag_text(f: FlagSetting) -> str:
    where = f"set at {f.call_site}" if f.call_site is not None else "left at the default"
    return f"{f.name}={f.value!r} ({where})"


@dataclass(frozen=True, slots=True)
class Demand:
    """Threads that wanted a core (on it or waiting for it), medians over sample instants."""

    tree: float
    main: float
    workers: float  # all workers together
    workers_cpu: float  # the cores the workers got (psutil CPU %, without the waiting)
    per_worker: float  # the median worker
    main_wait: float  # the training process's threads waiting for a core
    ticks: int


def runnable_demand(ctx: RuleContext) -> Demand | None:
    """CPU + run-queue wait of the training process and its workers, in threads, over the
    steps' span (every sample without steps); None without run-queue figures."""
    per_t: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    per_worker: dict[int, list[float]] = defaultdict(list)
    steps = ctx.steps()
    lo, hi = (steps[0].start_ns, max(s.start_ns + s.wall_ns for s in steps)) if steps else (None, None)
    for p in ctx.samples_process():
        if p.role not in ("main", "worker") or p.runq_wait_pct is None:
            continue
        if lo is not None and not lo <= p.t_ns <= hi:
            continue
        threads = (p.cpu_pct + p.runq_wait_pct) / 100.0
        tick = per_t[p.t_ns]
        tick[p.role] += threads
        if p.role == "main":
            tick["main_wait"] += p.runq_wait_pct / 100.0
            tick["has_main"] = 1.0
        else:
            tick["worker_cpu"] += p.cpu_pct / 100.0
            per_worker[p.pid].append(threads)
    ticks = [v for v in per_t.values() if v.get("has_main")]
    if not ticks:
        return None
    return Demand(
        tree=statistics.median(v["main"] + v["worker"] for v in ticks),
        main=statistics.median(v["main"] for v in ticks),
        workers=statistics.median(v["worker"] for v in ticks),
        workers_cpu=statistics.median(v["worker_cpu"] for v in ticks),
        per_worker=statistics.median(statistics.median(v) for v in per_worker.values()) if per_worker else 0.0,
        main_wait=statistics.median(v["main_wait"] for v in ticks),
        ticks=len(ticks),
    )


MIN_MEASURED_STEPS = 2  # a typical step from fewer is one step's accident, not the run's habit


def too_few_steps(d: DispatchStats) -> str | None:
    """Why a trace's steps are too few to clear the loop of a problem (None when enough): a run
    stopped inside its only window, or a window cut short, leaves one profiled step."""
    if d.window == WindowKind.STEPS and d.steps < MIN_MEASURED_STEPS:
        return (f"not measurable: the trace holds {d.steps} profiled step (at least {MIN_MEASURED_STEPS} make a "
                "typical one); profile more steps (`gpudoctor profile --steps N`, N of 30 or more)")
    return None



# --------------------------------------------------------------------------- the DataLoader's load (GD201, GD204)

# cProfile's names of calls in which a thread waits rather than computes: sleeping, polling, socket and
# file I/O, waiting for a lock, a thread or a child process. A read served from the page cache is CPU
# work under the same name; the rules bound it by the process's CPU time (getrusage).
_WAITING_CALL_RE = re.compile(
    r"^<built-in method (?:time\.sleep|select\.\w+|_socket\.\w+|posix\.(?:read|readv|pread|preadv|waitpid|wait\w*"
    r"|open|stat|lstat|fstat|sendfile|scandir|listdir)|io\.open|_io\.open|nt\.\w+)>$"
    r"|^<method '(?:recv\w*|send\w*|accept|connect\w*|read\w*|peek|poll|select|control|acquire|wait\w*|join"
    r"|do_handshake|get)' of '(?:_socket\.socket|_ssl\._SSLSocket|_io\.\w+|select\.\w+|_thread\.\w+"
    r"|_multiprocessing\.SemLock|_queue\.SimpleQueue|mmap\.mmap)' objects>$"
)


def is_waiting_call(e: PstatsEntry) -> bool:
    """A call whose self time is a thread blocked (sleep, I/O, a socket, a lock), not computing."""
    return bool(_WAITING_CALL_RE.match(e.function))


def entry_name(e: PstatsEntry) -> str:
    """How a finding names a cProfile entry: ``file:line(function)``, or the built-in's name."""
    if e.file.startswith("~") or not e.line:
        return e.function.strip("<>").replace("built-in method ", "")
    return f"{e.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{e.line}({e.function})"


@dataclass(frozen=True, slots=True)
class LoaderProfile:
    """The cProfile of the DataLoader's fetch in the training process (``num_workers=0``)."""

    fetch_s: float  # time inside the fetch (the dataset's __getitem__ and the collate_fn)
    waiting_s: float  # of it, in calls that wait (sleep, I/O, sockets, locks)
    waits: tuple[PstatsEntry, ...]  # those calls, most time first
    hot: tuple[PstatsEntry, ...]  # the computing functions with the most self time inside it
    own: tuple[PstatsEntry, ...]  # the user's own functions inside it, most time inside first

    @property
    def cpu_frac(self) -> float:
        """The share of the fetch's time that is not waiting: an estimate of its CPU ÷ wall time."""
        return max(0.0, min(1.0, 1.0 - self.waiting_s / self.fetch_s)) if self.fetch_s > 0 else 1.0


def loader_profile(entries: tuple[PstatsEntry, ...], top: int = 3) -> LoaderProfile | None:
    """The loading code's time in the cProfile (``PstatsEntry.loader_*``, parsed along caller edges);
    None when the training process ran no fetch (workers load, or no cProfile)."""
    inside = [e for e in entries if e.loader_cumtime_s > 0.0]
    if not inside:
        return None
    fetch_s = max(e.loader_cumtime_s for e in inside)
    waits = sorted((e for e in inside if is_waiting_call(e) and e.loader_tottime_s > 0.0),
                   key=lambda e: -e.loader_tottime_s)
    hot = sorted((e for e in inside if not is_waiting_call(e) and e.loader_tottime_s > 0.0),
                 key=lambda e: -e.loader_tottime_s)
    own_set = {id(e) for e in user_functions(tuple(inside))}
    own = sorted((e for e in inside if id(e) in own_set), key=lambda e: -e.loader_cumtime_s)
    waiting_s = min(fetch_s, sum(e.loader_tottime_s for e in waits))
    return LoaderProfile(fetch_s, waiting_s, tuple(waits[:top]), tuple(hot[:top]), tuple(own[:top]))


@dataclass(frozen=True, slots=True)
class CpuReading:
    """One getrusage reading of the training process (every thread) and the steps it covers."""

    steps: int
    wall_ns: int
    cpu_ns: int  # user + system
    wait_ns: int  # of the wall time, blocked in DataLoader.__next__
    model_ns: int | None  # in the model's calls (forward, backward, optimizer.step); None: not timed
    instrumented: bool  # a covered step ran under torch.profiler or cProfile (their own CPU is in it)


_MIN_PLAIN_READINGS = 5  # uninstrumented readings enough to judge from them alone


def cpu_readings(steps: tuple[StepRecord, ...]) -> tuple[CpuReading, ...]:
    """The readings among ``steps`` (in order): a row with CPU figures covers ``cpu_steps`` steps
    ending at it (itself and the rows just before it without figures); a reading whose steps are not
    all among ``steps`` is left out. Those of steps without an instrument when there are enough of
    them: torch.profiler's and cProfile's own work (a trace export: seconds of CPU in one step) is
    in the others' figures."""
    out: list[CpuReading] = []
    group: list[StepRecord] = []
    prev = None
    for s in steps:
        if prev is not None and s.index != prev + 1:
            group = []
        prev = s.index
        group.append(s)
        if s.user_cpu_ns is None or s.sys_cpu_ns is None:
            continue
        k = max(1, s.cpu_steps or 1)
        if len(group) >= k:
            covered = group[-k:]
            timed = all(x.backward_ns is not None and x.optimizer_ns is not None for x in covered)
            out.append(CpuReading(
                steps=k,
                wall_ns=sum(x.wall_ns for x in covered),
                cpu_ns=s.user_cpu_ns + s.sys_cpu_ns,
                wait_ns=sum(min(x.data_wait_ns, x.wall_ns) for x in covered),
                model_ns=sum((x.forward_ns or 0) + (x.backward_ns or 0) + (x.optimizer_ns or 0) for x in covered)
                if timed else None,
                instrumented=any(x.window for x in covered),
            ))
        group = []
    plain = [r for r in out if not r.instrumented]
    return tuple(plain if len(plain) >= _MIN_PLAIN_READINGS else out)


@dataclass(frozen=True, slots=True)
class WorkerUse:
    """The DataLoader workers in the psutil samples taken while the steps ran (medians over instants)."""

    workers: int  # worker processes seen at an instant (median)
    cpu_cores: float  # the cores they used together (psutil CPU %, ÷ 100)
    wanted_cores: float | None  # the cores they wanted: used + waiting in the run queue (None: no schedstat)
    worker_rss_bytes: int | None  # the median worker's resident memory
    main_rss_bytes: int | None  # the training process's resident memory
    ticks: int


def worker_use(ctx: RuleContext) -> WorkerUse | None:
    """The workers' and the training process's figures over the steps' span (every sample without
    steps); None without a sample of the training process."""
    steps = ctx.steps()
    lo, hi = (steps[0].start_ns, max(s.start_ns + s.wall_ns for s in steps)) if steps else (None, None)
    ticks: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    worker_rss: list[int] = []
    main_rss: list[int] = []
    runq_known = True
    for p in ctx.samples_process():
        if p.role not in ("main", "worker") or (lo is not None and not lo <= p.t_ns <= hi):
            continue
        tick = ticks[p.t_ns]
        if p.role == "main":
            tick["main"] = 1.0
            main_rss.append(p.rss_bytes)
            continue
        tick["n"] += 1
        tick["cpu"] += p.cpu_pct / 100.0
        if p.runq_wait_pct is None:
            runq_known = False
        else:
            tick["runq"] += p.runq_wait_pct / 100.0
        worker_rss.append(p.rss_bytes)
    rows = [v for v in ticks.values() if v.get("main")]
    if not rows:
        return None
    return WorkerUse(
        workers=int(statistics.median(v["n"] for v in rows)),
        cpu_cores=statistics.median(v["cpu"] for v in rows),
        wanted_cores=statistics.median(v["cpu"] + v["runq"] for v in rows) if runq_known and worker_rss else None,
        worker_rss_bytes=int(statistics.median(worker_rss)) if worker_rss else None,
        main_rss_bytes=int(statistics.median(main_rss)) if main_rss else None,
        ticks=len(rows),
    )


#: The training process's own time on a run without a GPU, outside its data wait: every host part of a
#: ledger but communication. GD201 and GD204 claim a share of them where their fix shortens the compute.
HOST_PARTS = (Component.CPU_COMPUTE, Component.FORWARD, Component.BACKWARD, Component.OPTIMIZER,
              Component.LAUNCH_OVERHEAD, Component.OTHER_CPU, Component.UNEXPLAINED)


def loader_step_ns(
    *,
    compute_ns: float,
    load_ns: float,
    load_cpu_ns: float | None,
    workers: int,
    usable_cores: float | None,
    cores: float | None,
    main_cpu_ns: float | None,
    handover_ns: float,
) -> float:
    """The step per batch with ``workers`` DataLoader workers (GD201's model, also GD204's)::

        step = max(compute + handover, load ÷ workers, load_cpu ÷ usable_cores,
                   (main_cpu + handover + load_cpu) ÷ cores)

    A pipeline runs at the rate of its slowest stage. The loop takes a batch every ``compute`` (the
    step less its data wait) plus the hand-over of the batch from a worker (unpickling it, mapping its
    shared memory: the training process's own work, so it adds to the loop's stage and its CPU, not to
    the workers'); ``workers`` deliver ``workers`` batches per ``load`` (the wall time of one batch in
    one worker), in parallel with the loop; the workers' CPU per batch cannot run faster than the cores
    left to them allow, nor can the training process's and the workers' CPU together exceed all the
    cores. Terms whose figures are unknown (None) are left out. (Until issue 37 the hand-over was added
    after the max: where the workers set the pace, it was counted twice, and a held-out loader that
    waits 30 ms per batch, 14 workers, measured 2.27 ms per step against the 3.17 ms expected.)"""
    terms = [compute_ns + handover_ns, load_ns / max(1, workers)]
    if load_cpu_ns is not None and usable_cores:
        terms.append(load_cpu_ns / usable_cores)
    if load_cpu_ns is not None and main_cpu_ns is not None and cores:
        terms.append((main_cpu_ns + handover_ns + load_cpu_ns) / cores)
    return max(terms)


def dataset_changed(src, fn, lf) -> tuple[str, bool] | None:  # noqa: ANN001 - StaticContext, Function, LoaderFact
    """Where a loop that iterates the DataLoader ``lf`` (of ``fn``) changes its dataset in place
    (``ds.epoch = epoch``, ``ds.set_epoch(epoch)``, ``loader.dataset.…``), and whether it does so at every
    step (in a step loop); None when no loop of its program does. Workers hold a copy of the dataset: one
    kept across epochs (``persistent_workers=True``) never sees a change made after it started, and no
    worker sees a change made while it runs (at every step)."""
    names = src.loader_names(fn, lf)
    if not names:
        return None
    receivers = {f"{n}.dataset" for n in names} | ({lf.dataset} if lf.dataset else set())
    # the loops of the program that change anything in place, by the first name of what they change (made
    # once per program: looking through every loop for every DataLoader was quadratic in a file's size)
    index = _change_index(src, fn)
    candidates = {pos: (other, loop) for r in receivers for pos, other, loop in index.get(r.split(".", 1)[0], ())}
    found: tuple[str, bool] | None = None
    for _pos, (other, loop) in sorted(candidates.items()):  # in the program's order
        if not loop.mentions & names:
            continue
        steps = set(src.step_loop_ids(other))
        hit = sorted(r for r in loop.changes if r in receivers or any(r.startswith(x + ".") for x in receivers))
        if not hit:
            continue
        per_step = loop.id in steps
        where = (f"`{hit[0]}` is changed in place in the {'step' if per_step else ''} loop at "
                 f"{other.file}:{loop.site.line}").replace("the  loop", "the loop")
        if per_step:
            return where, True
        found = found or (where, False)
    return found


def _change_index(src, fn) -> dict[str, list]:  # noqa: ANN001 - StaticContext, Function
    """``fn``'s program's loops that change something in place, by the first name of each thing changed
    (with each loop's place in the program's order), made once per program."""

    def make() -> dict[str, list]:
        index: dict[str, list] = {}
        pos = 0
        for other in src.program_functions(fn):
            for loop in other.loops:
                pos += 1
                for root in {c.split(".", 1)[0] for c in loop.changes}:
                    index.setdefault(root, []).append((pos, other, loop))
        return index

    return src.memo(f"dataset_changed.index.{src.program(fn)}", make)
