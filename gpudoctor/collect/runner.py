"""The parent process of ``gpudoctor profile``: launch, sample, survive, write the manifest.

The parent never imports torch. It checks the options, creates the run directory,
writes the manifest (status "running"), starts the training process, samples it
(psutil, NVML) until it ends however it ends, then merges the child's account into
the manifest, prints a summary to stderr and returns the script's exit code.

Signals (SIGINT, SIGTERM, SIGHUP): before the training process exists, one of them stops
start-up (``gpudoctor.signals.Interrupted``), and the run directory, if made, gets a
manifest that says so. A terminal's Ctrl-C (or hang-up) reaches the whole foreground
process group, the script included, so the script gets it directly and the parent only
waits for it to flush. A signal sent to the parent alone (``kill PID``, a scheduler, a
container runtime) is passed on to the script: the training process reports every
signal it receives through a pipe (``signal.set_wakeup_fd``), and a signal the parent
got that the script did not get within ``FORWARD_GRACE_S`` is forwarded, so that
nothing is delivered twice. A third SIGINT kills the script. The training process
starts with the three blocked and holds them back until its instruments are in place
(``child.py``): a signal at any moment of its start-up ends the run as "interrupted
during start-up", exit 128 + signal, not with a traceback. A signal that reaches the
parent once the script has ended stops gpudoctor after the manifest is written.

Writes: the manifest written at the start reserves space for the final one (a disk that
fills up during the run cannot leave it saying "running"); the training process also
sends its final account through a pipe, so a full disk cannot lose it; every file that
could not be written is named in ``manifest.write_errors`` with the system's reason and
in one line on the terminal.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor import __version__
from gpudoctor.collect import progress as progress_line
from gpudoctor.collect import rundir
from gpudoctor.collect.options import ProfileOptions, ProfileResult, Target, validate
from gpudoctor.errors import CollectError
from gpudoctor.safe import terminal_line
from gpudoctor.signals import (
    HANDLED,
    Interrupted,
    deferred,
    pause_point,
    signum_of,
    startup_detail,
    stopped_during_startup,
)
from gpudoctor.signals import note as note_signal

if TYPE_CHECKING:
    from gpudoctor.model import Collected, Manifest

# gpudoctor.model (and psutil, pynvml) are imported once the training process is
# started: their ~0.1 s then overlaps its start instead of delaying it.

CHILD_MODULE = "gpudoctor.collect._child"
CONFIG_ENV = "GPUDOCTOR_CHILD_CONFIG"  # same name as child.CONFIG_ENV (child imports torch-side code)
KINETO_QUIET_LEVEL = "6"  # Kineto otherwise prints "USDT: … profiler_start" lines on the script's stderr
# A signal sent to the parent is forwarded unless the training process reports receiving it within this time.
FORWARD_GRACE_S = 0.5
# A signal the training process received this long before the parent's still counts as the same delivery.
SAME_DELIVERY_S = 2.0

_SIGNAL_NOTES = {
    signal.SIGKILL: "SIGKILL: kill -9, or the out-of-memory killer",
    signal.SIGSEGV: "SIGSEGV: a crash in native code",
    signal.SIGABRT: "SIGABRT: an abort in native code",
    signal.SIGBUS: "SIGBUS: a bad memory access in native code (often shared memory too small for DataLoader workers)",
}


def _say(line: str) -> None:
    """A line on stderr that cannot fail the run (a closed pipe, a closed terminal), its
    control characters escaped (a script's message or a path cannot drive the terminal)."""
    try:
        print(terminal_line(line), file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):
        pass


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _iso(unix_ns: int) -> str:
    return datetime.fromtimestamp(unix_ns / 1e9).astimezone().isoformat(timespec="milliseconds")


def _command(opts: ProfileOptions) -> tuple[str, ...]:
    if opts.command is not None:
        return tuple(opts.command)
    if sys.argv[1:2] == ["profile"] and os.path.basename(sys.argv[0]) in ("gpudoctor", "__main__.py", "cli.py"):
        return tuple(sys.argv[2:])
    head = ("-m", opts.module) if opts.module else (opts.script or "",)
    return (*head, *(("--", *opts.args) if opts.args else ()))


class _Signals:
    """The parent's signal handling while it runs the script (main thread only).

    Before the training process exists, SIGINT, SIGTERM and SIGHUP raise ``Interrupted``
    (start-up stops). Then handlers only record; :meth:`tick`, called by the waiting loop,
    decides what to forward, and :meth:`settle` what never reached the script.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.sigints = 0
        self.received: list[int] = []  # every signal the parent got, in order
        self.delivered: list[int] = []  # those the script got: it reported them, or they were forwarded
        self.forwarded: list[int] = []  # signals passed on to the script because it had not got them
        self.late: list[int] = []  # signals that could not reach the script: it had ended
        self._reader: threading.Thread | None = None
        self._old: dict[int, Any] = {}
        self._pending: list[tuple[int, float]] = []  # (signal, when) received by the parent, not yet judged
        self._child_got: list[tuple[int, float]] = []  # (signal, when) the training process reported
        self._lock = threading.Lock()
        self._pipe_r = -1
        self.detects = False  # the training process reports its signals (one process, not torchrun)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in HANDLED:
            if signal.getsignal(sig) == signal.SIG_IGN:  # nohup: a hang-up is not ours to act on
                continue
            self._old[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
        if self._pipe_r >= 0:
            try:
                os.close(self._pipe_r)
            except OSError:
                pass
            self._pipe_r = -1

    def watch(self, pipe_r: int) -> None:
        """Read the training process's ``set_wakeup_fd`` pipe: one byte per signal it received."""
        self._pipe_r = pipe_r
        self.detects = True

        def run() -> None:
            while True:
                try:
                    data = os.read(pipe_r, 64)
                except OSError:
                    return
                if not data:
                    return
                now = time.monotonic()
                with self._lock:
                    self._child_got.extend((b, now) for b in data)

        self._reader = threading.Thread(target=run, name="gpudoctor-signals", daemon=True)
        self._reader.start()

    def _on_signal(self, signum: int, frame: Any) -> None:
        note_signal(signum)  # a start-up hook waiting for a signal goes on
        self.received.append(signum)
        proc = self.proc
        if proc is None:  # before the training process exists: start-up stops here
            raise Interrupted(signum)
        if proc.poll() is not None:  # the script has ended: gpudoctor stops once the manifest is written
            self.late.append(signum)
            return
        if signum == signal.SIGINT:
            self.sigints += 1
            if self.sigints >= 3:
                _say("gpudoctor: killing the script")
                try:
                    proc.kill()
                except OSError:
                    pass
                return
        self._pending.append((signum, time.monotonic()))

    def tick(self) -> None:
        """Forward the signals the parent received and the script did not (see the module docstring)."""
        if not self._pending:
            return
        proc = self.proc
        now = time.monotonic()
        keep: list[tuple[int, float]] = []
        for sig, when in self._pending:
            if self._reported(sig, when):
                continue
            if self.detects and now - when < FORWARD_GRACE_S:
                keep.append((sig, when))
                continue
            if not self.detects and sig == signal.SIGINT and self.sigints < 2:
                self.delivered.append(sig)  # torchrun: Ctrl-C reached the group; a second one is passed on
                continue
            if proc is not None and proc.poll() is None:
                name = _signal_name(sig)
                _say(f"gpudoctor: passing {name} on to the script (it was sent to gpudoctor alone)")
                try:
                    proc.send_signal(sig)
                    self.forwarded.append(sig)
                    self.delivered.append(sig)
                    continue
                except OSError:  # the child has just ended
                    pass
            self.late.append(sig)  # the script ended before it could be passed on
        self._pending = keep
        with self._lock:  # reports older than any pending signal can match nothing more
            self._child_got = [(s, t) for s, t in self._child_got if now - t < SAME_DELIVERY_S + FORWARD_GRACE_S]

    def _reported(self, sig: int, when: float) -> bool:
        """The training process reported getting ``sig`` (the same delivery): it is counted as delivered."""
        with self._lock:
            match = next((i for i, (s, t) in enumerate(self._child_got) if s == sig and when - SAME_DELIVERY_S <= t), None)
            if match is None:
                return False
            self._child_got.pop(match)
        self.delivered.append(sig)
        return True

    def settle(self, timeout_s: float = 1.0) -> None:
        """The script has ended: the signals still waiting to be forwarded either reached it (its last
        reports, read once its end of the pipe is closed) or never did (:attr:`late`)."""
        if self._pending and self._reader is not None:
            self._reader.join(timeout_s)
        for sig, when in self._pending:
            if not self._reported(sig, when):
                self.late.append(sig)
        self._pending = []


def _child_config(opts: ProfileOptions, target: Target, run_dir: Path, t0_mono_ns: int, cwd: str) -> dict[str, Any]:
    return {
        "run_dir": str(run_dir.resolve()),
        "parent_pid": os.getpid(),
        "t0_mono_ns": t0_mono_ns,
        "cwd": cwd,
        "script_path": target.script_path,
        "module": target.module,
        "argv": list(target.argv),
        "schedule": opts.schedule_fields() if opts.torch_profiler else None,
        "max_steps": opts.max_steps,
        "cprofile": opts.cprofile,
        "cprofile_steps": opts.cprofile_steps,
        "time_window_s": list(opts.time_window_s) if opts.time_window_s else None,
        "launcher": "torchrun" if opts.nproc_per_node is not None else "",
        "injections": [i.to_dict() for i in opts.injections],
    }


def _launcher_preexec() -> None:
    """``preexec_fn`` of torchrun's agent: SIGINT, SIGTERM and SIGHUP unblocked (the agent handles
    them), and SIGTERM when gpudoctor's process dies."""
    from gpudoctor.collect import distributed  # noqa: PLC0415

    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(HANDLED))
    distributed.die_with_parent_preexec()


def _start_manifest(opts: ProfileOptions, target: Target, run_dir: Path, cwd: str, t0_unix_ns: int) -> Manifest:
    import platform

    from gpudoctor.model import SCHEMA_VERSION, Manifest

    return Manifest(
        schema_version=SCHEMA_VERSION,
        gpudoctor_version=__version__,
        run_id=run_dir.name,
        command=_command(opts),
        script=target.script_path,
        module=target.module,
        argv=target.argv,
        cwd=cwd,
        started_at=_iso(t0_unix_ns),
        started_at_unix_ns=t0_unix_ns,
        versions={"python": platform.python_version(), "gpudoctor": __version__, "platform": platform.platform()},
        hostname=socket.gethostname(),
        cpu_count=os.cpu_count(),
        schedule=opts.schedule() if opts.torch_profiler else None,
        max_steps=opts.max_steps,
    )


def profile_run(opts: ProfileOptions) -> ProfileResult:
    """Run the script under the instruments; see the module docstring."""
    cwd = os.path.abspath(opts.cwd) if opts.cwd else os.getcwd()
    target = validate(opts, cwd)
    t0_unix_ns = time.time_ns()
    t0_mono_ns = time.monotonic_ns()
    signals = _Signals()
    signals.install()  # from here on, a signal before the script starts stops gpudoctor cleanly
    run_dir: Path | None = None
    try:
        try:
            if opts.run_dir is not None:  # a --verify trial: the directory its orchestration named
                run_dir = Path(opts.run_dir)
                run_dir.mkdir(parents=True)
            else:
                run_dir = rundir.create_run_dir(Path(opts.out_dir), rundir.run_stem(target.script_path, target.module))
        except OSError as err:
            where = opts.run_dir or opts.out_dir
            raise CollectError(f"cannot create the run directory {where}: {rundir.os_reason(err)}; pass --out DIR") from err
        pause_point("run-dir")
        result = _run(opts, target, run_dir, cwd, t0_unix_ns, t0_mono_ns, signals)
        if signals.late:  # the manifest is final: now gpudoctor stops, as it was asked to
            raise Interrupted(signals.late[0])
        return result
    except KeyboardInterrupt as err:
        if run_dir is not None and signals.proc is None:
            _interrupted_before_start(opts, target, run_dir, cwd, t0_unix_ns, signum_of(err))
        raise
    finally:
        signals.restore()


def _interrupted_before_start(opts: ProfileOptions, target: Target, run_dir: Path, cwd: str, t0_unix_ns: int,
                              signum: int) -> None:
    """The manifest of a run stopped by a signal before the training process existed (written whole:
    a second signal waits for it)."""
    with deferred():
        from gpudoctor.model import RunStatus

        m = _start_manifest(opts, target, run_dir, cwd, t0_unix_ns)
        m = _replace(m, status=RunStatus.INTERRUPTED, status_detail=startup_detail(signum),
                     exit_code=128 + signum, signal=signum, ended_at=_iso(time.time_ns()))
        try:
            rundir.write_json_atomic(run_dir / rundir.MANIFEST, m.to_dict())
        except OSError:
            pass


def _run(opts: ProfileOptions, target: Target, run_dir: Path, cwd: str, t0_unix_ns: int, t0_mono_ns: int,
         signals: _Signals) -> ProfileResult:
    # The manifest's space first (a placeholder as large as the reserve): a run directory that
    # cannot be written is said before anything runs. The manifest itself is built once the
    # training process is started: gpudoctor.model's import then overlaps its start.
    try:
        rundir.write_json_atomic(run_dir / rundir.MANIFEST, {"status": "running"}, reserve_bytes=rundir.MANIFEST_RESERVE_BYTES)
    except OSError as err:
        raise CollectError(f"cannot write {run_dir / rundir.MANIFEST}: {rundir.os_reason(err)}; pass --out DIR on a disk with room") from err
    launcher = opts.nproc_per_node is not None
    if launcher:
        from gpudoctor.collect import distributed  # noqa: PLC0415

    config = _child_config(opts, target, run_dir, t0_mono_ns, cwd)
    fds: list[int] = []
    sig_r = state_r = -1
    if not launcher:  # torchrun does not pass file descriptors on to the ranks
        sig_r, sig_w = (rundir.above_stdio(fd) for fd in os.pipe())
        state_r, state_w = (rundir.above_stdio(fd) for fd in os.pipe())
        os.set_blocking(sig_w, False)  # set_wakeup_fd requires it
        fds = [sig_w, state_w]
        config.update(signal_fd=sig_w, state_fd=state_w)
    env = os.environ.copy()
    if opts.injections:
        from gpudoctor.collect.inject import child_env  # noqa: PLC0415

        child_env(opts.injections, env)
    env[CONFIG_ENV] = json.dumps(config)
    env.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)
    # SIGINT, SIGTERM and SIGHUP stay blocked from here until the parent knows its child: a signal
    # now is handled once the child exists (passed on to it). The training process inherits the
    # block and lifts it once its own handling is in place, so a signal during its start-up waits
    # for that instead of a traceback (or a half-imported torch).
    blocked = threading.current_thread() is threading.main_thread()
    if blocked:
        signal.pthread_sigmask(signal.SIG_BLOCK, set(HANDLED))
    try:
        flags = getattr(subprocess, "_args_from_interpreter_flags", lambda: [])()  # -W, -X, -O … as given to us
        if launcher:
            argv, preexec = distributed.launch_argv(opts, CHILD_MODULE, flags), _launcher_preexec
        else:
            argv, preexec = [sys.executable, *flags, "-m", CHILD_MODULE], None
        log = open(run_dir / rundir.OUTPUT_LOG, "wb") if opts.output_log else None  # noqa: SIM115
        try:
            proc = subprocess.Popen(argv, env=env, cwd=cwd, preexec_fn=preexec, pass_fds=fds, stdout=log, stderr=log)
        finally:
            if log is not None:
                log.close()  # the child holds its own descriptor
        signals.proc = proc
    except OSError as err:
        from gpudoctor.model import RunStatus

        manifest = _start_manifest(opts, target, run_dir, cwd, t0_unix_ns)
        manifest = _replace(manifest, status=RunStatus.FAILED, status_detail=f"could not start Python: {err}")
        _write_manifest(run_dir, manifest)
        raise CollectError(f"could not start {sys.executable}: {err.strerror or err}") from err
    finally:
        for fd in fds:
            os.close(fd)
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, set(HANDLED))
    # written while the training process starts (it imports torch for a second or more)
    manifest = _start_manifest(opts, target, run_dir, cwd, t0_unix_ns)
    if launcher:
        manifest = _replace(manifest, launcher=distributed.LAUNCHER)
    _write_manifest(run_dir, manifest, reserve_bytes=rundir.MANIFEST_RESERVE_BYTES)
    if sig_r >= 0:
        signals.watch(sig_r)
    pause_point("spawned")
    state_pipe = _StatePipe(state_r) if state_r >= 0 else None
    sampler, nvml, nvml_reason = _start_sampler(opts, run_dir, t0_mono_ns, proc.pid, launcher)
    compressor = _TraceCompressor(run_dir)
    compressor.start()
    deadline = time.monotonic() + opts.timeout_s if opts.timeout_s is not None else None
    timed_out = False
    progress = progress_line.for_run(run_dir, t0_mono_ns, opts.max_steps, launcher) if opts.progress else None
    try:
        while True:
            try:
                rc = proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                signals.tick()
                if progress is not None:
                    progress.tick()
                if deadline is not None and not timed_out and time.monotonic() >= deadline:
                    timed_out = True  # --verify's budget: SIGTERM lets the script flush its steps
                    _end(proc)
            except KeyboardInterrupt:  # a handler could not be installed (not the main thread)
                signals.sigints += 1
    finally:
        if progress is not None:  # before the summary, the report, or a traceback
            progress.clear()
    t_end_unix_ns = time.time_ns()
    t_end_mono_ns = time.monotonic_ns()
    signals.settle()
    pause_point("ended")
    sampler.stop()
    compressor.stop()
    state, job = None, {}
    if state_pipe is not None:
        state = state_pipe.final()
    if launcher:
        state, ends, outcome = distributed.combined_state(run_dir, opts.nproc_per_node)
        job = {"rank_ends": tuple(ends), "failed_rank": outcome.get("failed_rank")}
    manifest = _finish_manifest(
        manifest, run_dir, rc, signals, sampler, nvml, nvml_reason, t_end_unix_ns, (t_end_mono_ns - t0_mono_ns) / 1e9,
        state=state, compressor=compressor,
    )
    if job:
        manifest = _replace(manifest, **job)
    if timed_out:
        manifest = _replace(manifest, status_detail=f"stopped by gpudoctor after its time limit of {opts.timeout_s:g} s; "
                            + manifest.status_detail)
    if nvml is not None:
        nvml.close()
    if _write_manifest(run_dir, manifest):
        for p in (run_dir / rundir.CHILD_STATE,):  # its content is in the manifest now
            try:
                p.unlink()
            except OSError:
                pass
    if opts.summary:
        _print_summary(manifest, run_dir, opts)
    return ProfileResult(run_dir=run_dir, exit_code=int(manifest.exit_code or 0), manifest=manifest,
                         signals=tuple(signals.received))


def _write_manifest(run_dir: Path, manifest: Manifest, reserve_bytes: int = 0) -> bool:
    """The manifest; on a full disk, inside the space the first one reserved. False when neither worked."""
    path = run_dir / rundir.MANIFEST
    data = manifest.to_dict()
    try:
        rundir.write_json_atomic(path, data, reserve_bytes=reserve_bytes)
        return True
    except OSError as err:
        first = err
    try:
        rundir.rewrite_json_in_place(path, data)
        return True
    except OSError as err:
        _say(f"gpudoctor: could not finish {path}: {rundir.os_reason(first)} ({rundir.os_reason(err)} in place); "
             f"how the run ended is in {run_dir / rundir.CHILD_STATE}")
        return False


class _StatePipe:
    """The training process's final account, sent through a pipe as well as written to its
    state file: a disk that filled up cannot lose how the run ended."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._run, name="gpudoctor-state", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                data = os.read(self._fd, 1 << 16)
                if not data:
                    return
                self._chunks.append(data)
        except OSError:
            return

    def final(self, timeout_s: float = 2.0) -> dict[str, Any] | None:
        """The last account received (None when none arrived whole): a process that outlived the
        training process and still holds the pipe open costs at most ``timeout_s``."""
        self._thread.join(timeout_s)
        try:
            os.set_blocking(self._fd, False)
            while True:
                data = os.read(self._fd, 1 << 16)
                if not data:
                    break
                self._chunks.append(data)
        except OSError:
            pass
        if not self._thread.is_alive():  # else a process still holds the pipe: the reader keeps the fd
            self.close()
        text = b"".join(self._chunks).decode("utf-8", "replace")
        for line in reversed(text.splitlines()):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return obj
        return None

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            os.close(self._fd)
        except OSError:
            pass
        self._fd = -1


def _end(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM (the child unwinds and writes what it has), SIGKILL when it does not end in ``grace_s``."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
    except OSError:  # it has just ended
        pass


def _replace(m: Manifest, **kw: Any) -> Manifest:
    import dataclasses

    return dataclasses.replace(m, **kw)


class _TraceCompressor:
    """Gzips the traces the training process lists as written, while it runs (see rundir).

    In a thread of its own (not the sampler's: thinning a trace of a Python-heavy window
    takes seconds, and samples must go on meanwhile), polling the child's state file.
    :meth:`stop` waits for a trace in progress, so that the end of the run never
    compresses the same file at the same time. ``outcomes``: what
    ``rundir.compress_trace`` returned for each trace.
    """

    def __init__(self, run_dir: Path, interval_s: float = 0.2) -> None:
        self.run_dir = run_dir
        self.state_path = run_dir / rundir.CHILD_STATE
        self.interval_s = interval_s
        self.outcomes: dict[str, Any] = {}
        self._mtimes: dict[Path, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpudoctor-traces", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self()
            except Exception:  # done again, for good, at the end of the run
                pass

    def __call__(self) -> None:
        # one training process, or every rank of a torchrun job (rank-tagged state files)
        for path in (self.state_path, *self.run_dir.glob(rundir.rank_tagged(rundir.CHILD_STATE, 0).replace("rank0", "rank*"))):
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            if mtime == self._mtimes.get(path):
                continue
            self._mtimes[path] = mtime
            state = rundir.read_json(path) or {}
            rundir.compress_traces(self.run_dir, list(state.get("traces") or []), self.outcomes)
            if self._stop.is_set():
                return


def _start_sampler(opts: ProfileOptions, run_dir: Path, t0_mono_ns: int, pid: int, launcher: bool = False):  # noqa: ANN202
    from gpudoctor.collect.nvml import Nvml
    from gpudoctor.collect.sampler import Sampler

    nvml, reason = Nvml.open()
    sampler = Sampler(
        run_dir / rundir.SAMPLES, t0_mono_ns, opts.sample_interval_ms, nvml,
        rank_module=CHILD_MODULE if launcher else None,
    )
    sampler.write_meta()
    sampler.start(pid)
    return sampler, nvml, reason


def _trace_notes(outcomes: dict[str, Any]) -> list[str]:
    """In words, for the torch.profiler entry: windows cut short by the Python-call budget,
    the Python calls the filter left out, and traces it could not filter."""
    if not outcomes:
        return []
    from gpudoctor.collect.tracefilter import TraceFilterResult  # noqa: PLC0415

    notes: list[str] = []
    results = [o for o in outcomes.values() if isinstance(o, TraceFilterResult)]
    for r in results:
        b = r.stack_bound
        if isinstance(b, dict) and {"first_step", "steps_recorded", "steps_scheduled", "python_calls_per_step", "budget"} <= b.keys():
            text = (
                f"the window from step {b['first_step']} recorded {b['steps_recorded']} of {b['steps_scheduled']} steps "
                f"with stacks: its steps make {b['python_calls_per_step']:,} Python calls each, and a window records "
                f"at most {b['budget']:,} with stacks"
            )
            if b.get("rest_recorded"):
                text += (f"; {b['rest_recorded']} more from step {b['rest_first_step']} without stacks "
                         "(a second trace, after one warm-up step)")
            notes.append(text)
    dropped = [r for r in results if r.dropped_events]
    if dropped:
        n = sum(r.dropped_events for r in dropped)
        total = sum(r.python_events for r in dropped)
        ms = sum(r.dropped_us for r in dropped) / 1000.0
        notes.append(
            f"Python calls under {dropped[0].min_us:g} µs that enclose no op left out of {len(dropped)} trace(s): "
            f"{n:,} of {total:,} ({ms:,.1f} ms of calls, now their callers' self time)"
        )
    for name, o in sorted(outcomes.items()):
        if isinstance(o, str):
            notes.append(f"{name} kept as recorded: the Python-call filter failed ({o})")
    return notes


def _with_trace_notes(collected: list[Collected], notes: list[str]) -> list[Collected]:
    import dataclasses  # noqa: PLC0415

    if not notes:
        return collected
    text = "; ".join(notes)
    for i, c in enumerate(collected):
        if c.name == "torch.profiler" and c.ok:
            collected[i] = dataclasses.replace(c, detail=f"{c.detail}; {text}" if c.detail else text)
            return collected
    from gpudoctor.model import Collected  # noqa: PLC0415

    collected.append(Collected("torch.profiler", True, detail=text))
    return collected


def _finish_manifest(
    m: Manifest,
    run_dir: Path,
    rc: int,
    signals: _Signals,
    sampler: Any,
    nvml: Any,
    nvml_reason: str,
    end_unix_ns: int,
    duration_s: float,
    state: dict[str, Any] | None = None,
    compressor: _TraceCompressor | None = None,
) -> Manifest:
    from gpudoctor.model import Collected, Device, ExceptionInfo, RunStatus

    # ``state``: the child's account, read from its file; a torchrun job passes its ranks' accounts
    # merged by ``distributed.combined_state``.
    state_path = run_dir / rundir.CHILD_STATE
    if state is None:
        state = rundir.read_json(state_path) or {}
    steps_path = run_dir / rundir.STEPS
    if steps_path.exists():
        rundir.repair_jsonl(steps_path)
    outcomes = compressor.outcomes if compressor is not None else {}
    rundir.compress_traces(run_dir, list(state.get("traces") or []), outcomes)
    kept_plain, incomplete, _removed = rundir.settle_leftovers(run_dir, list(state.get("traces") or []))
    steps_lines = rundir.count_lines(steps_path)

    child_status = state.get("status")
    detail = state.get("status_detail", "") or ""
    exception = ExceptionInfo.from_dict(state["exception"]) if isinstance(state.get("exception"), dict) else None
    sig: int | None = state.get("signal")
    if rc < 0:
        sig = -rc
        name = _signal_name(sig)
        if sig == signal.SIGINT:
            status = RunStatus.INTERRUPTED
            detail = detail or "interrupted (SIGINT / Ctrl-C)"
        else:
            status = RunStatus.KILLED
            note = _SIGNAL_NOTES.get(sig)
            detail = f"killed by signal {sig} ({note or name})"
        exit_code = 128 + sig
    elif child_status in (None, RunStatus.RUNNING.value) and rc - 128 in signals.delivered:
        # a training process that could not report (torchrun's ranks): it ended as the signal says
        exit_code, status, sig = rc, RunStatus.INTERRUPTED, rc - 128
        detail = startup_detail(sig)
    elif child_status in (None, RunStatus.RUNNING.value):
        exit_code = rc
        status = RunStatus.COMPLETED if rc == 0 else RunStatus.FAILED
        detail = (
            f"the script ended with exit code {rc} before gpudoctor could record how "
            "(os._exit(), or a crash in gpudoctor's instruments)"
        )
        full = _disk_full(run_dir)
        if full:
            detail += f"; {full}"
    else:
        status = RunStatus(child_status)
        exit_code = rc
    if signals.delivered and status == RunStatus.COMPLETED:
        sig = signals.delivered[0]
        status = RunStatus.INTERRUPTED
        who = "Ctrl-C" if sig == signal.SIGINT else _signal_name(sig)
        detail = f"{who} received; the script handled it and ended with exit code {rc}"
    if signals.late and sig is None:
        late = signals.late[0]
        detail = "; ".join(d for d in (detail, f"{_signal_name(late)} reached gpudoctor after the script had ended "
                                       f"(not passed on): gpudoctor stopped, exit code {128 + late}") if d)

    collected: list[Collected] = []
    for c in state.get("collected", []) or []:
        try:
            collected.append(Collected.from_dict(c))
        except (TypeError, ValueError, KeyError):
            continue
    if not state.get("collected"):
        collected.extend(_collected_from_files(run_dir, steps_lines))
    collected = _with_trace_notes(collected, _trace_notes(outcomes))
    for note in state.get("notes", []) or []:
        collected.append(Collected("instruments", False, str(note)))
    # psutil
    if sampler.psutil_reason and not sampler.process_samples:
        collected.append(Collected("psutil", False, sampler.psutil_reason))
    else:
        detail_ps = f"{sampler.process_samples} process samples every {sampler.interval_ms} ms"
        if sampler.worker_pids:
            detail_ps += f"; {len(sampler.worker_pids)} worker process(es) seen"
        if sampler.psutil_reason:
            detail_ps += f"; {sampler.psutil_reason}"
        collected.append(Collected("psutil", sampler.process_samples > 0, "" if sampler.process_samples else "the script ended before the first sample", detail=detail_ps))
    # NVML
    versions = dict(m.versions)
    versions.update({k: str(v) for k, v in (state.get("versions") or {}).items()})
    devices: tuple[Device, ...] = ()
    if nvml is None:
        collected.append(Collected("nvml", False, nvml_reason))
    else:
        versions.update(nvml.versions())
        devices = nvml.devices()
        if sampler.nvml_error:
            collected.append(Collected("nvml", sampler.gpu_samples > 0, sampler.nvml_error, detail=f"{sampler.gpu_samples} GPU samples"))
        else:
            collected.append(Collected("nvml", True, detail=f"{sampler.gpu_samples} GPU samples from {len(devices)} device(s)"))
    cuda_devices = state.get("cuda_devices") or []
    if cuda_devices:
        by_index = {int(d["index"]): d for d in cuda_devices if isinstance(d, dict) and "index" in d}
        if devices:
            devices = tuple(
                Device(
                    index=d.index,
                    name=d.name,
                    total_memory_bytes=d.total_memory_bytes,
                    compute_capability=d.compute_capability,
                    multiprocessor_count=(by_index.get(d.index) or {}).get("multiprocessor_count")
                    if (by_index.get(d.index) or {}).get("name") == d.name
                    else None,
                )
                for d in devices
            )
        else:
            devices = tuple(Device.from_dict(d) for d in by_index.values())

    traces: list[str] = []
    for t in state.get("traces", []) or []:
        if (run_dir / t).is_file():
            traces.append(t)
        elif (run_dir / rundir.plain_trace(t)).is_file():  # its gzip failed: kept as recorded
            traces.append(rundir.plain_trace(t))
    on_disk = sorted(p.name for p in run_dir.glob("*" + rundir.TRACE_SUFFIX))
    traces += [t for t in [*on_disk, *kept_plain] if t not in traces]

    write_errors = _write_errors(state, outcomes, sampler, incomplete)
    collected = _with_write_errors(collected, write_errors, [t for t in traces if not t.endswith(".gz")])
    return _replace(
        m,
        ended_at=_iso(end_unix_ns),
        duration_s=round(duration_s, 3),
        status=status,
        status_detail=detail,
        exit_code=exit_code,
        signal=sig,
        exception=exception,
        versions=versions,
        devices=devices,
        collected=tuple(collected),
        write_errors=tuple(write_errors),
        profiler_owner=state.get("profiler_owner", m.profiler_owner),
        step_source=str(state.get("step_source") or "none"),  # written by the child at the end of step 0
        step_source_reason=str(state.get("step_source_reason") or ""),
        step_markers=_step_markers(state),
        time_window_s=_time_window(state),
        root_module=_root_module(state),
        steps_seen=max(int(state.get("steps_seen") or 0), steps_lines),
        traces=tuple(traces),
        argv=tuple(state.get("argv") or m.argv),
        rank=state.get("rank"),
        world_size=state.get("world_size"),
    )


def _disk_full(run_dir: Path) -> str:
    """"the run directory's disk is full (N bytes free)" when it nearly is, else ""."""
    try:
        st = os.statvfs(run_dir)
    except (OSError, AttributeError):
        return ""
    free = st.f_bavail * st.f_frsize
    return f"the disk of the run directory is full ({free:,} bytes free)" if free < (1 << 20) else ""


def _write_errors(state: dict[str, Any], outcomes: dict[str, Any], sampler: Any, incomplete: list[str]) -> list[Any]:
    """Every file of the run that could not be written, from the training process's account, the
    parent's gzip and sampler, and the leftovers that had to be kept as ``.incomplete``."""
    from gpudoctor.model import WriteError  # noqa: PLC0415
    from gpudoctor.model._serde import check  # noqa: PLC0415

    out: list[WriteError] = []
    for e in state.get("write_errors") or []:
        try:
            check(WriteError, e)
            out.append(WriteError.from_dict(e))
        except (TypeError, ValueError, KeyError):
            continue
    for _name, o in sorted(outcomes.items()):
        if isinstance(o, rundir.TraceWriteFailure):
            out.append(WriteError(o.path, o.error, what="the gzipped copy of the trace", kept=o.kept))
    err = getattr(sampler, "write_error", "")
    if err:
        out.append(WriteError(rundir.SAMPLES, err, what=sampler.write_lost, kept=rundir.SAMPLES if sampler.lines_written else ""))
    explained = {e.kept for e in out}
    for name in incomplete:
        if name not in explained:
            out.append(WriteError(name[: -len(rundir.INCOMPLETE_SUFFIX)], "its writer stopped before the end of the file",
                                  what="an unfinished file", kept=name))
    return out


def _with_write_errors(collected: list[Collected], errors: list[Any], plain_traces: list[str]) -> list[Collected]:
    """Instruments whose files could not all be written: ``partial`` (some data kept) or failed."""
    import dataclasses  # noqa: PLC0415

    out = list(collected)
    by_name = {"samples.jsonl": ("psutil", "nvml")}
    for e in errors:
        for inst in by_name.get(e.path, ()):
            for i, c in enumerate(out):
                if c.name == inst and c.ok:
                    out[i] = dataclasses.replace(c, partial=True, reason=f"{e.path}: {e.error}; {e.what}".rstrip("; "))
    gz_failed = [e for e in errors if e.path.endswith(rundir.TRACE_SUFFIX) and e.kept in plain_traces]
    if gz_failed:
        note = (f"{len(gz_failed)} trace(s) kept uncompressed (.pt.trace.json): the gzipped copy could not be "
                f"written ({gz_failed[0].error})")
        for i, c in enumerate(out):
            if c.name == "torch.profiler" and c.ok:
                out[i] = dataclasses.replace(c, detail=f"{c.detail}; {note}" if c.detail else note)
                break
    return out


def _step_markers(state: dict[str, Any]) -> tuple[Any, ...]:
    from gpudoctor.model import StepMarker

    out = []
    for d in state.get("step_markers") or []:
        try:
            out.append(StepMarker.from_dict(d))
        except (TypeError, ValueError, KeyError):
            continue
    return tuple(out)


def _root_module(state: dict[str, Any]) -> Any:
    from gpudoctor.model import RootModuleUse

    try:
        return RootModuleUse.from_dict(state["root_module"]) if state.get("root_module") else None
    except (TypeError, ValueError, KeyError):
        return None


def _time_window(state: dict[str, Any]) -> tuple[float, float] | None:
    w = state.get("time_window_s")
    try:
        return (float(w[0]), float(w[1])) if w else None
    except (TypeError, ValueError, IndexError):
        return None


def _collected_from_files(run_dir: Path, steps_lines: int) -> list[Collected]:
    """What a training process that died without reporting left behind, judged from its files."""
    from gpudoctor.model import Collected

    died = "the training process died before it could report"
    out = []
    if steps_lines:
        out.append(Collected("steps", True, detail=f"{steps_lines} steps written before the training process died"))
    else:
        out.append(Collected("steps", False, f"no step was written: {died}"))
    traces = list(run_dir.glob("*" + rundir.TRACE_SUFFIX)) + list(run_dir.glob("*" + rundir.plain_trace(rundir.TRACE_SUFFIX)))
    if traces:
        out.append(Collected("torch.profiler", True, detail=f"{len(traces)} trace(s) exported before the training process died; a window in progress was lost"))
    else:
        out.append(Collected("torch.profiler", False, f"no trace was exported: {died} (a window in progress is lost)"))
    out.append(Collected("cuda", False, died))
    if (run_dir / rundir.PSTATS).is_file():
        out.append(Collected("cprofile", True, detail="the cProfile window ended before the training process died"))
    else:
        out.append(Collected("cprofile", False, f"{died} before the end of the cProfile window (it is written when the window ends)"))
    if (run_dir / rundir.SETTINGS).is_file():
        out.append(Collected("settings", True, detail="as last written during the run (at a step boundary)"))
    else:
        out.append(Collected("settings", False, f"{died} before the first step"))
    return out


def _print_summary(m: Manifest, run_dir: Path, opts: ProfileOptions) -> None:
    from gpudoctor.collect.summary import main_loader, summarize_steps, summary_lines

    steps_path = run_dir / rundir.STEPS
    settings_path = run_dir / rundir.SETTINGS
    if m.launcher and not steps_path.exists():  # a torchrun job: every rank's steps, as the report reads them
        from gpudoctor.collect import distributed  # noqa: PLC0415

        files = distributed.rank_steps_files(run_dir)
        steps = [{**row, "rank": rank if row.get("rank") is None else row["rank"]} for rank in sorted(files) for row in rundir.read_jsonl(files[rank])]
        if files:  # and the lowest rank's settings, as the report reads them
            settings_path = run_dir / f"settings.rank{min(files)}.json"
    else:
        steps = rundir.read_jsonl(steps_path)
    # the steady steps the report's summary is of: without the first batches of the workers the settings name
    raw_settings = rundir.read_json(settings_path)
    s = summarize_steps(steps, m.step_source, main_loader(raw_settings), raw_settings)
    important = ("steps", "torch.profiler")
    missing = [f"{c.name} ({c.reason})" for c in m.collected if not c.ok and c.name in important and c.reason]
    try:
        shown = os.path.relpath(run_dir)
        if shown.startswith(".."):
            shown = str(run_dir)
    except ValueError:
        shown = str(run_dir)
    lines = summary_lines(s, m.step_source, m.status.value, m.status_detail, m.exit_code, shown, missing)
    if stopped_during_startup(m.status_detail):  # the script never ran: how the run ended and where, not its steps
        lines = [ln for ln in lines if ln.startswith("gpudoctor: run ")]
    for line in lines:
        _say(line)
    if m.write_errors:
        _say(write_errors_line(m))


def write_errors_line(m: Manifest) -> str:
    """One line for every file that could not be written (the manifest names each, with what was kept)."""
    reasons = sorted({e.error.split(":")[0] for e in m.write_errors})
    files = ", ".join(e.path + (f" (kept as {e.kept})" if e.kept and e.kept != e.path else "") for e in m.write_errors[:4])
    more = f" and {len(m.write_errors) - 4} more" if len(m.write_errors) > 4 else ""
    return (f"gpudoctor: {len(m.write_errors)} file(s) could not be written completely ({'; '.join(reasons)}): "
            f"{files}{more}; manifest.json lists what was kept")
