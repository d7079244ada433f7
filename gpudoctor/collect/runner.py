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

The signals while the script runs are ``collect.relay``'s; the end of the run (the child's
account merged into the manifest, what was and was not collected, the summary on stderr) is
``collect.finish``'s.
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor import __version__
from gpudoctor.collect import progress as progress_line
from gpudoctor.collect import rundir
from gpudoctor.collect.finish import (
    TraceCompressor,
    finish_manifest,
    iso_time,
    print_summary,
    replace_manifest,
)
from gpudoctor.collect.finish import trace_notes as _trace_notes  # noqa: F401 - tests read them here
from gpudoctor.collect.finish import with_trace_notes as _with_trace_notes  # noqa: F401
from gpudoctor.collect.options import ProfileOptions, ProfileResult, Target, validate
from gpudoctor.collect.relay import Signals, say
from gpudoctor.errors import CollectError
from gpudoctor.model import layout
from gpudoctor.signals import (
    HANDLED,
    Interrupted,
    deferred,
    pause_point,
    signum_of,
    startup_detail,
)

if TYPE_CHECKING:
    from gpudoctor.model import Manifest

# gpudoctor.model (and psutil, pynvml) are imported once the training process is
# started: their ~0.1 s then overlaps its start instead of delaying it.

_Signals = Signals  # the name the tests know it by

CHILD_MODULE = "gpudoctor.collect._child"
CONFIG_ENV = "GPUDOCTOR_CHILD_CONFIG"  # same name as child.CONFIG_ENV (child imports torch-side code)
KINETO_QUIET_LEVEL = "6"  # Kineto otherwise prints "USDT: … profiler_start" lines on the script's stderr


def _command(opts: ProfileOptions) -> tuple[str, ...]:
    if opts.command is not None:
        return tuple(opts.command)
    if sys.argv[1:2] == ["profile"] and os.path.basename(sys.argv[0]) in ("gpudoctor", "__main__.py", "cli.py"):
        return tuple(sys.argv[2:])
    head = ("-m", opts.module) if opts.module else (opts.script or "",)
    return (*head, *(("--", *opts.args) if opts.args else ()))


def _child_config(opts: ProfileOptions, target: Target, run_dir: Path, t0_mono_ns: int, cwd: str) -> dict[str, Any]:
    return {
        "run_dir": str(run_dir.resolve()),
        "parent_pid": os.getpid(),
        "t0_mono_ns": t0_mono_ns,
        "cwd": cwd,
        "script_path": target.script_path,
        "source_path": target.script_path or target.module_origin,  # read for CUDA graphs (collect.cupti)
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
        started_at=iso_time(t0_unix_ns),
        started_at_unix_ns=t0_unix_ns,
        versions={"python": platform.python_version(), "gpudoctor": __version__, "platform": platform.platform()},
        hostname=socket.gethostname(),
        cpu_count=os.cpu_count(),
        schedule=opts.schedule() if opts.torch_profiler else None,
        max_steps=opts.max_steps,
        script_sha256=file_sha256(target.script_path or target.module_origin),  # -m: the module's file
    )


def file_sha256(path: str | None) -> str | None:
    """The SHA-256 of a script (or of the file ``-m`` runs), recorded so that `gpudoctor verify` runs again
    only the script that was profiled (None without a readable file)."""
    if not path:
        return None
    import hashlib

    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest() if hasattr(hashlib, "file_digest") \
                else hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


def profile_run(opts: ProfileOptions) -> ProfileResult:
    """Run the script under the instruments; see the module docstring."""
    cwd = os.path.abspath(opts.cwd) if opts.cwd else os.getcwd()
    target = validate(opts, cwd)
    t0_unix_ns = time.time_ns()
    t0_mono_ns = time.monotonic_ns()
    signals = Signals()
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
        m = replace_manifest(m, status=RunStatus.INTERRUPTED, status_detail=startup_detail(signum),
                     exit_code=128 + signum, signal=signum, ended_at=iso_time(time.time_ns()))
        try:
            rundir.write_json_atomic(run_dir / layout.MANIFEST, m.to_dict())
        except OSError:
            pass


def _unwritable(opts: ProfileOptions, target: Target, run_dir: Path, cwd: str, t0_unix_ns: int, err: OSError) -> str:
    """What to say when the run directory cannot hold its manifest (a full disk), nothing run: the
    directory is left readable (a short manifest that says how the run ended, where that still fits)
    or, when not even that fits, removed if it is empty; never an empty run directory left behind."""
    from gpudoctor.model import RunStatus  # noqa: PLC0415

    path = run_dir / layout.MANIFEST
    reason = rundir.os_reason(err)
    try:
        m = replace_manifest(_start_manifest(opts, target, run_dir, cwd, t0_unix_ns), status=RunStatus.FAILED,
                             status_detail=f"the run directory could not be written ({reason}): the script was "
                                           "not run", ended_at=iso_time(time.time_ns()))
        rundir.write_json_atomic(path, m.to_dict())  # without the reserve: a few kB may still fit
        return (f"cannot write {path} with room for the run: {reason}; the script was not run and the run "
                f"directory says so; pass --out DIR on a disk with room")
    except OSError:
        pass
    try:
        run_dir.rmdir()  # only an empty one: nothing of anybody's is removed
        gone = f"; the empty run directory {run_dir} was removed"
    except OSError:
        gone = ""
    return f"cannot write {path}: {reason}{gone}; pass --out DIR on a disk with room"


def _run(opts: ProfileOptions, target: Target, run_dir: Path, cwd: str, t0_unix_ns: int, t0_mono_ns: int,
         signals: Signals) -> ProfileResult:
    # The manifest's space first (a placeholder as large as the reserve): a run directory that
    # cannot be written is said before anything runs. The manifest itself is built once the
    # training process is started: gpudoctor.model's import then overlaps its start.
    try:
        rundir.write_json_atomic(run_dir / layout.MANIFEST, {"status": "running"}, reserve_bytes=rundir.MANIFEST_RESERVE_BYTES)
    except OSError as err:
        raise CollectError(_unwritable(opts, target, run_dir, cwd, t0_unix_ns, err)) from err
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
        # the training process also holds the signal pipe's read end, never reading it: were gpudoctor's
        # process killed, a signal's byte would meet a pipe without a reader, and Python would print a
        # BrokenPipeError traceback into the script's output ("Exception ignored when trying to write to
        # the signal wakeup fd") for every signal after; a full pipe is silent (warn_on_full_buffer=False)
        config.update(signal_fd=sig_w, state_fd=state_w, signal_read_fd=sig_r)
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
        log = open(run_dir / layout.OUTPUT_LOG, "wb") if opts.output_log else None  # noqa: SIM115
        try:
            proc = subprocess.Popen(argv, env=env, cwd=cwd, preexec_fn=preexec,
                                    pass_fds=[*fds, sig_r] if sig_r >= 0 else fds, stdout=log, stderr=log)
        finally:
            if log is not None:
                log.close()  # the child holds its own descriptor
        signals.proc = proc
    except OSError as err:
        from gpudoctor.model import RunStatus

        manifest = _start_manifest(opts, target, run_dir, cwd, t0_unix_ns)
        manifest = replace_manifest(manifest, status=RunStatus.FAILED, status_detail=f"could not start Python: {err}")
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
        manifest = replace_manifest(manifest, launcher=distributed.LAUNCHER)
    _write_manifest(run_dir, manifest, reserve_bytes=rundir.MANIFEST_RESERVE_BYTES)
    if sig_r >= 0:
        signals.watch(sig_r)
    pause_point("spawned")
    state_pipe = _StatePipe(state_r) if state_r >= 0 else None
    sampler, nvml, nvml_reason = _start_sampler(opts, run_dir, t0_mono_ns, proc.pid, launcher)
    compressor = TraceCompressor(run_dir)
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
    manifest = finish_manifest(
        manifest, run_dir, rc, signals, sampler, nvml, nvml_reason, t_end_unix_ns, (t_end_mono_ns - t0_mono_ns) / 1e9,
        state=state, compressor=compressor,
    )
    if job:
        manifest = replace_manifest(manifest, **job)
    if timed_out:
        manifest = replace_manifest(manifest, status_detail=f"stopped by gpudoctor after its time limit of {opts.timeout_s:g} s; "
                            + manifest.status_detail)
    if nvml is not None:
        nvml.close()
    if _write_manifest(run_dir, manifest):
        for p in (run_dir / layout.CHILD_STATE,):  # its content is in the manifest now
            try:
                p.unlink()
            except OSError:
                pass
        if opts.record_trust:
            _record_trust(run_dir)
    if opts.summary:
        print_summary(manifest, run_dir, opts)
    return ProfileResult(run_dir=run_dir, exit_code=int(manifest.exit_code or 0), manifest=manifest,
                         signals=tuple(signals.received))


def _record_trust(run_dir: Path) -> None:
    """This user's gpudoctor made the run: ``verify`` may run its script again without asking
    (gpudoctor.trust). A state folder that cannot be written costs one line, never the run."""
    from gpudoctor import trust  # noqa: PLC0415

    try:
        trust.record(run_dir)
    except OSError as err:
        where = f"{err.filename}: " if err.filename else ""
        say(f"gpudoctor: could not record this run as yours ({where}{rundir.os_reason(err)}); `gpudoctor verify` will "
            f"show what it runs and ask first (set {trust.STATE_ENV} to a writable folder)")


def _write_manifest(run_dir: Path, manifest: Manifest, reserve_bytes: int = 0) -> bool:
    """The manifest; on a full disk, inside the space the first one reserved. False when neither worked."""
    path = run_dir / layout.MANIFEST
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
        say(f"gpudoctor: could not finish {path}: {rundir.os_reason(first)} ({rundir.os_reason(err)} in place); "
             f"how the run ended is in {run_dir / layout.CHILD_STATE}")
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


def _start_sampler(opts: ProfileOptions, run_dir: Path, t0_mono_ns: int, pid: int, launcher: bool = False):  # noqa: ANN202
    from gpudoctor.collect.nvml import Nvml
    from gpudoctor.collect.sampler import Sampler

    nvml, reason = Nvml.open()
    sampler = Sampler(
        run_dir / layout.SAMPLES, t0_mono_ns, opts.sample_interval_ms, nvml,
        rank_module=CHILD_MODULE if launcher else None,
    )
    sampler.write_meta()
    sampler.start(pid)
    return sampler, nvml, reason


