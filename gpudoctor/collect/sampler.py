"""The parent's sampler: psutil for the training process and its workers, NVML for the GPUs,
and the whole machine's load (every process's CPU, steal, runnable threads).

Runs in a thread of the parent (so it costs the training process nothing but the
CPU it takes on another core) and appends to ``samples.jsonl`` as it goes, so a run
whose child is killed keeps every sample taken until then.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from gpudoctor.collect.nvml import Nvml
from gpudoctor.collect.rundir import JsonlWriter
from gpudoctor.model import HostSample, ProcessSample

ROLE_MAIN = "main"
ROLE_WORKER = "worker"  # a DataLoader / multiprocessing worker of the training process
ROLE_CHILD = "child"  # any other process the script started (compile workers, shells, …)
ROLE_LAUNCHER = "launcher"  # torchrun's agent in a distributed run (its ranks are "main", rank set)


def _role(proc: Any, main_cmdline: list[str] | None) -> str:
    try:
        cmd = proc.cmdline()
    except Exception:
        return ROLE_CHILD
    if main_cmdline is not None and cmd == main_cmdline:
        return ROLE_WORKER  # forked from the training process
    if any("resource_tracker" in part or "semaphore_tracker" in part for part in cmd):
        return ROLE_CHILD  # multiprocessing's bookkeeping process (spawn / forkserver), not a worker
    if any("multiprocessing" in part for part in cmd):
        return ROLE_WORKER  # spawn / forkserver
    return ROLE_CHILD


class RunQueueWait:
    """Time a process's threads spent runnable but waiting for a core, from Linux's
    ``/proc/<pid>/task/<tid>/schedstat`` (its second field: run-queue wait, ns, since the
    thread started).

    ``sample(pid, t_ns)`` returns the wait of all the process's threads since the previous
    call for that pid, as a % of the elapsed time (100 = one thread waiting all the time),
    or None on the first call, or where schedstat cannot be read (not Linux, a kernel
    without it, a process gone). Threads born since the previous call count their whole
    wait; threads that ended lose their last interval.
    """

    def __init__(self, proc_root: str = "/proc") -> None:
        self.root = proc_root
        self._last: dict[int, tuple[int, dict[int, int]]] = {}  # pid -> (t_ns, tid -> wait_ns)
        self.available = os.path.isdir(os.path.join(proc_root, "self", "task"))

    def read(self, pid: int) -> dict[int, int] | None:
        base = os.path.join(self.root, str(pid), "task")
        try:
            tids = os.listdir(base)
        except OSError:
            return None
        out: dict[int, int] = {}
        for tid in tids:
            try:
                with open(os.path.join(base, tid, "schedstat"), "rb") as f:
                    fields = f.read().split()
                out[int(tid)] = int(fields[1])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended meanwhile, or no schedstat
        return out or None

    def sample(self, pid: int, t_ns: int) -> float | None:
        if not self.available:
            return None
        now = self.read(pid)
        if now is None:
            self._last.pop(pid, None)
            return None
        prev = self._last.get(pid)
        self._last[pid] = (t_ns, now)
        if prev is None or t_ns <= prev[0]:
            return None
        t_prev, before = prev
        waited = sum(max(0, w - before.get(tid, 0)) for tid, w in now.items())
        return round(100.0 * waited / (t_ns - t_prev), 1)

    def forget(self, alive: set[int]) -> None:
        for pid in list(self._last):
            if pid not in alive:
                del self._last[pid]


class HostCpu:
    """The machine's CPU use by every process, from psutil's system-wide CPU times (``/proc/stat``
    on Linux): what the training's own processes leave to the rest tells a timing on a busy
    machine from one on an idle machine.

    ``sample(t_ns)`` returns a ``HostSample`` for the interval since the previous call (None on
    the first call, which primes the counters). CPU figures are in cores × 100 (100 = one core,
    as for a process): busy = everything but idle and I/O wait (psutil's own definition; guest
    time is already inside user time); steal where the OS reports it (Linux in a VM), else None.
    ``procs_running`` is read from ``/proc/stat`` (Linux), the load average from
    ``os.getloadavg`` where there is one.
    """

    def __init__(self, proc_root: str = "/proc") -> None:
        self.stat_path = os.path.join(proc_root, "stat")
        self._last: tuple[int, float, float, float | None] | None = None  # t_ns, total_s, busy_s, steal_s

    @staticmethod
    def _times() -> tuple[float, float, float | None]:
        import psutil  # noqa: PLC0415

        t = psutil.cpu_times()
        fields = t._asdict()
        total = sum(fields.values()) - fields.get("guest", 0.0) - fields.get("guest_nice", 0.0)
        idle = fields.get("idle", 0.0) + fields.get("iowait", 0.0)
        steal = fields.get("steal")
        return total, total - idle, steal

    def procs_running(self) -> int | None:
        try:
            with open(self.stat_path, "rb") as f:
                for line in f:
                    if line.startswith(b"procs_running "):
                        return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            return None
        return None

    def sample(self, t_ns: int) -> HostSample | None:
        total, busy, steal = self._times()
        prev, self._last = self._last, (t_ns, total, busy, steal)
        if prev is None:
            return None
        _, total0, busy0, steal0 = prev
        span = total - total0  # CPU-seconds of every core over the interval
        cores = os.cpu_count() or 1
        if span <= 0:
            return None
        scale = 100.0 * cores / span  # seconds of all cores -> cores × 100
        try:
            load1: float | None = round(os.getloadavg()[0], 2)
        except (AttributeError, OSError):
            load1 = None
        return HostSample(
            t_ns=t_ns,
            cpu_pct=round(max(0.0, busy - busy0) * scale, 1),
            steal_pct=round(max(0.0, steal - steal0) * scale, 1) if steal is not None and steal0 is not None else None,
            procs_running=self.procs_running(),
            load1=load1,
        )


class Sampler:
    """Samples ``pid`` and its descendants every ``interval_ms`` until :meth:`stop`."""

    def __init__(
        self,
        path: Path,
        t0_mono_ns: int,
        interval_ms: int,
        nvml: Nvml | None,
        rank: int | None = None,
        rank_module: str | None = None,
    ) -> None:
        """``rank_module``: the sampled process is a launcher (torchrun) whose children running
        ``python -m rank_module`` are the ranks: each is a "main" process with its ``RANK``, and
        their descendants are its workers and children."""
        self.path = path
        self.t0 = t0_mono_ns
        self.interval_s = interval_ms / 1000.0
        self.interval_ms = interval_ms
        self.nvml = nvml
        self.rank = rank
        self.psutil_reason = ""
        self.nvml_error = ""
        self.process_samples = 0
        self.gpu_samples = 0
        self.worker_pids: set[int] = set()
        self.max_workers = 0
        self._pid: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._writer = JsonlWriter(path)
        self._runq = RunQueueWait()
        self._host = HostCpu()
        self.host_samples = 0
        self._procs: dict[int, Any] = {}
        self._roles: dict[int, str] = {}
        self._main_cmdline: list[str] | None = None
        self.rank_module = rank_module
        self._ranks: dict[int, int | None] = {}  # pid -> rank (launcher mode)
        self._rank_cmdlines: dict[int, list[str]] = {}  # rank main pid -> its command line
        self._rank_tries: dict[int, int] = {}
        try:
            import psutil  # noqa: F401, PLC0415

            self._psutil_ok = True
        except ImportError:
            self._psutil_ok = False
            self.psutil_reason = "psutil is not installed"

    def write_meta(self) -> None:
        meta: dict[str, Any] = {
            "kind": "meta",
            "interval_ms": float(self.interval_ms),
            "system_cpu_count": os.cpu_count(),
        }
        if self._psutil_ok:
            import psutil  # noqa: PLC0415

            try:
                meta["system_memory_bytes"] = int(psutil.virtual_memory().total)  # GD201 bounds workers by it
            except Exception:  # noqa: BLE001 - a figure the rules can do without
                pass
        self._writer.write(meta)

    def start(self, pid: int) -> None:
        self._pid = pid
        self._thread = threading.Thread(target=self._run, name="gpudoctor-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._writer.close()

    @property
    def write_error(self) -> str:
        """Why ``samples.jsonl`` could not be written completely ("" when it was)."""
        return self._writer.error

    @property
    def write_lost(self) -> str:
        w = self._writer
        return f"{w.lines_lost:,} sample line(s) not written after the first {w.lines_written:,}" if w.error else ""

    @property
    def lines_written(self) -> int:
        return self._writer.lines_written

    # ------------------------------------------------------------------ internals

    def _run(self) -> None:
        next_t = time.monotonic()
        ticks = 0
        while not self._stop.is_set():
            try:
                self._tick(ticks)
            except Exception as err:  # never let sampling take the run down
                if not self.psutil_reason:
                    self.psutil_reason = f"sampling stopped: {type(err).__name__}: {err}"
                return
            ticks += 1
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (a slow NVML call): skip, do not burst
                next_t = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)

    def _processes(self) -> list[tuple[Any, str]]:
        import psutil  # noqa: PLC0415

        assert self._pid is not None
        main = self._procs.get(self._pid)
        if main is None:
            try:
                main = psutil.Process(self._pid)
                self._main_cmdline = main.cmdline()
            except psutil.Error:
                return []
            self._procs[self._pid] = main
            self._roles[self._pid] = ROLE_LAUNCHER if self.rank_module else ROLE_MAIN
            main.cpu_percent(None)  # prime: the next call returns the share since now
        try:
            children = main.children(recursive=True)
        except psutil.Error:
            children = []
        out = [(main, self._roles[self._pid])]
        alive = {self._pid}
        for c in children:
            pid = c.pid
            alive.add(pid)
            known = self._procs.get(pid)
            if known is None:
                if self.rank_module:
                    found = self._rank_role(c)
                    if found is None:  # forked by the launcher, not yet running the rank: look again next tick
                        continue
                    self._roles[pid], self._ranks[pid] = found
                else:
                    self._roles[pid] = _role(c, self._main_cmdline)
                self._procs[pid] = c
                try:
                    c.cpu_percent(None)
                except psutil.Error:
                    pass
                continue  # primed now; sampled from the next tick on
            out.append((known, self._roles[pid]))
        for pid in list(self._procs):
            if pid not in alive:
                del self._procs[pid]
        return out

    def _rank_role(self, proc: Any) -> tuple[str, int | None] | None:
        """Launcher mode: (role, rank) of a process under the launcher; None while it is still a
        copy of the launcher (forked, not yet running the rank's command)."""
        try:
            cmd = proc.cmdline()
        except Exception:
            return ROLE_CHILD, None
        launcher_cmd = self._main_cmdline
        if launcher_cmd is not None and cmd == launcher_cmd:
            return None
        if self.rank_module in cmd:
            try:
                rank: int | None = int(proc.environ()["RANK"])
            except Exception:
                tries = self._rank_tries[proc.pid] = self._rank_tries.get(proc.pid, 0) + 1
                if tries < 5:
                    return None
                rank = None  # its environment cannot be read: sampled without a rank
            self._rank_cmdlines[proc.pid] = cmd
            return ROLE_MAIN, rank
        try:
            parents = proc.parents()
        except Exception:
            parents = []
        for a in parents:
            if a.pid in self._rank_cmdlines:
                main_cmd = self._rank_cmdlines[a.pid]
                role = ROLE_WORKER if cmd == main_cmd or any("multiprocessing" in part for part in cmd) else ROLE_CHILD
                return role, self._ranks.get(a.pid)
        return ROLE_CHILD, None

    def _tick(self, tick: int) -> None:
        t_ns = time.monotonic_ns() - self.t0
        lines: list[dict[str, Any]] = []
        pids: set[int] = set()
        if self._psutil_ok and self._pid is not None:
            import psutil  # noqa: PLC0415

            procs = self._processes()
            workers = 0
            for proc, role in procs:
                try:
                    with proc.oneshot():
                        cpu = proc.cpu_percent(None)
                        rss = proc.memory_info().rss
                        threads = proc.num_threads()
                        gone = rss == 0 or proc.status() == psutil.STATUS_ZOMBIE
                except psutil.Error:
                    continue
                if gone:  # exited, not yet reaped: nothing left to measure
                    continue
                runq = self._runq.sample(proc.pid, t_ns)
                pids.add(proc.pid)
                if tick == 0 and role in (ROLE_MAIN, ROLE_LAUNCHER):
                    continue  # the first reading only primes cpu_percent
                if role == ROLE_WORKER:
                    workers += 1
                    self.worker_pids.add(proc.pid)
                s = ProcessSample(t_ns=t_ns, pid=proc.pid, role=role, cpu_pct=round(cpu, 1), rss_bytes=int(rss), threads=int(threads), rank=self._ranks.get(proc.pid, self.rank), runq_wait_pct=runq)
                d = s.to_dict()
                d["kind"] = "process"
                lines.append(d)
            self._runq.forget(pids)
            self.max_workers = max(self.max_workers, workers)
            self.process_samples += sum(1 for x in lines if x["kind"] == "process")
            host = self._host.sample(t_ns)
            if host is not None:
                d = host.to_dict()
                d["kind"] = "host"
                lines.append(d)
                self.host_samples += 1
        if self.nvml is not None:
            try:
                if pids and tick % 10 == 0:
                    self.nvml.mark_used(pids)
                for g in self.nvml.sample(t_ns):
                    d = g.to_dict()
                    d["kind"] = "gpu"
                    lines.append(d)
                    self.gpu_samples += 1
            except Exception as err:
                self.nvml_error = f"NVML sampling stopped: {type(err).__name__}: {err}"
                self.nvml = None
        self._writer.write_many(lines)
