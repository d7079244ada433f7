"""The training process: instruments torch, runs the user's script as ``__main__``, records how it ended.

Started by the parent as ``python -m gpudoctor.collect._child`` with its configuration
in the ``GPUDOCTOR_CHILD_CONFIG`` environment variable (removed as soon as it is read).
The script runs as ``python train.py`` would run it: ``__name__ == "__main__"``,
``sys.argv`` as typed, the script's folder first on ``sys.path`` (the current folder
with ``-m``), its own traceback on stderr when it raises, its exit code.

A DataLoader worker started with ``spawn`` or ``forkserver`` runs the script as
``__mp_main__`` through multiprocessing, never this module, so the instruments are
not installed there; a ``fork`` worker inherits them switched off (``register_at_fork``).

In a distributed job (``WORLD_SIZE`` > 1 in the environment, as torchrun sets it), each
rank writes rank-tagged files (``steps.rank1.jsonl`` …) into the same run directory.

``Child`` is the process's one sequence, from the configuration to the exit code; its signals
(held back during start-up, then the script's) are ``child_signals``, its account of what was
collected and what was not is ``child_account``, the instruments live in their own modules
(``patches``, ``steps``, ``torchprof``, ``settings_capture``, ``inject``).
"""

from __future__ import annotations

import builtins
import importlib.machinery
import json
import os
import runpy
import signal
import sys
import time
import types
from pathlib import Path
from typing import Any

from gpudoctor.collect import child_account, rundir
from gpudoctor.collect import schedule as sched
from gpudoctor.collect.callsite import FrameClassifier
from gpudoctor.collect.child_signals import (
    Terminated,
    die_with_parent,
    script_signals,
    signals_in_place,
    signum_of,
    worker_signals,
)
from gpudoctor.model import ExceptionInfo, ProfilerSchedule, RunStatus, layout
from gpudoctor.signals import HANDLED, pause_point, signal_name, startup_detail

CONFIG_ENV = "GPUDOCTOR_CHILD_CONFIG"
EXIT_INTERRUPTED = 130


def exit_code_of(code: Any) -> int:
    """The process exit status ``sys.exit(code)`` gives, printing a message as Python does."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF  # what the operating system keeps of it (sys.exit(-1) gives 255)
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


def _exc_type_name(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


class Child:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg["run_dir"])
        self.t0 = int(cfg["t0_mono_ns"])
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        self.world_size = world if world > 1 else None
        self.rank = int(os.environ.get("RANK", "0") or 0) if world > 1 else None
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0) if world > 1 else None
        self.state_path = self.run_dir / layout.rank_tagged(layout.CHILD_STATE, self.rank)
        self.forked = False
        self.torch: Any = None
        self.tracker: Any = None
        self.timewindow: Any = None
        self.driver: Any = None
        self.cprof: Any = None
        self.loader_prof: Any = None  # collect.loaderprof.LoaderProfile: the DataLoader's calls, apart
        self.capture: Any = None
        self.patcher: Any = None
        self.writer: Any = None
        self.notes: list[str] = []
        self.swallowed = ""  # --steps was caught by the script, which stepped on: how many steps it ran, and why
        self.versions: dict[str, str] = {}
        self.cupti: Any = None  # collect.cupti.Decision: TEARDOWN_CUPTI as gpudoctor left it, and why
        self.cupti_guard: Any = None  # collect.cupti.GraphGuard (CUDA before 12.6)
        self.state: dict[str, Any] = {
            "pid": os.getpid(),
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "status": RunStatus.RUNNING.value,
        }
        sch = cfg.get("schedule")
        self.schedule = ProfilerSchedule(**sch) if sch else None
        self.script_started_ns: int | None = None
        self.in_process = bool(cfg.get("in_process"))  # gpudoctor.session(): the process goes on after the run
        self.settings_write_error = ""  # the last write of settings.json failed: why
        self._crash_file: Any = None  # faulthandler's file (kept open: it writes there at a fatal signal)

    # ------------------------------------------------------------------ state file

    def write_state(self, final: bool = False) -> None:
        if self.forked:
            return
        st = self.state
        st["versions"] = self.versions
        st["argv"] = list(self.cfg["argv"])
        if self.driver is not None:
            st["profiler_owner"] = self.driver.owner
            st["traces"] = list(self.driver.traces)
            st["user_traces"] = list(self.driver.user_traces)
        if self.tracker is not None:
            source, why, markers = self.tracker.describe()
            tw = self.timewindow
            if not self.tracker.steps_seen and tw is not None and tw.recorded_s is not None:
                source = "time"
                why += f": the script was recorded from second {tw.recorded_s[0]:g} to {tw.recorded_s[1]:g} instead"
                st["time_window_s"] = list(tw.recorded_s)
            st["step_source"] = source
            st["step_source_reason"] = why
            st["step_markers"] = markers
            st["steps_seen"] = self.tracker.steps_seen
            if self.tracker.root_name:
                tr = self.tracker
                trains = tr.source in ("optimizer", "backward")  # the hooks' fast path skips the check
                st["root_module"] = {
                    "name": tr.root_name, "calls": tr.root_calls,
                    "calls_with_grad": None if trains else tr.root_grad_calls,
                    "eval_calls": tr.eval_calls, "eval_calls_with_grad": tr.eval_grad_calls,
                    "first_grad_call_site": tr.first_grad_site.to_dict() if tr.first_grad_site is not None else None,
                    "eval_grad_call_site": tr.eval_grad_site.to_dict() if tr.eval_grad_site is not None else None,
                }
        st["notes"] = list(self.notes)
        if final:
            st["collected"] = [c.to_dict() for c in child_account.collected(self)]
            st["write_errors"] = child_account.write_errors(self)
        try:
            rundir.write_json_atomic(self.state_path, st)
        except OSError:
            pass  # the final account also goes through the parent's pipe (a full disk cannot lose it)
        if final:
            self._send_state(st)

    def _send_state(self, st: dict[str, Any]) -> None:
        fd = self.cfg.get("state_fd")
        if not isinstance(fd, int) or fd < 0 or self.forked:
            return
        data = (json.dumps(st) + "\n").encode("utf-8")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.close(fd)
        except OSError:
            pass
        self.cfg["state_fd"] = -1

    # ------------------------------------------------------------------ set-up

    def _arm_crash_log(self) -> None:
        """``faulthandler`` into the run directory (``crash.txt``): a crash in native code (a SIGSEGV
        in a compiler, a driver, an extension) leaves the Python stack of every thread where the
        parent can read it. Nothing runs until a fatal signal comes. Left alone when the user's
        environment already enabled it (``PYTHONFAULTHANDLER``, ``-X faulthandler``: it writes to
        their stderr, which passes through)."""
        import faulthandler  # noqa: PLC0415

        if faulthandler.is_enabled():
            return
        try:
            fd = os.open(self.run_dir / layout.rank_tagged(layout.CRASH, self.rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         0o644)
            # above 0-2: with stdout closed (>&-) it would take fd 1, and what the script writes there would land in it
            self._crash_file = os.fdopen(rundir.above_stdio(fd), "w")
            faulthandler.enable(file=self._crash_file, all_threads=True)
        except (OSError, ValueError, RuntimeError):
            self._crash_file = None

    def setup(self) -> None:
        pause_point("child-setup")
        if not self.in_process:  # faulthandler stays the user's in their own process
            self._arm_crash_log()
        # under torchrun the parent is torchrun's agent (which gpudoctor started), not gpudoctor
        launched = self.cfg.get("launcher") == "torchrun"
        die_with_parent(os.getppid() if launched else int(self.cfg.get("parent_pid") or 0))
        try:
            import torch  # noqa: PLC0415 - the heavy import, once, before the script's
        except Exception as err:
            self.notes.append(f"torch could not be imported ({type(err).__name__}: {err}); the script runs without instruments")
            self.write_state()
            return
        self.torch = torch
        self.versions["torch"] = str(torch.__version__)
        if torch.version.cuda:
            self.versions["cuda"] = str(torch.version.cuda)
        try:
            self._cupti_teardown(torch)
        except Exception as err:  # a bug in gpudoctor: CUPTI stays as torch leaves it
            self.notes.append(f"TEARDOWN_CUPTI could not be decided ({type(err).__name__}: {err})")
        try:
            self._install(torch)
        except Exception as err:  # a bug in gpudoctor: run the script anyway
            self.notes.append(f"instruments could not be installed ({type(err).__name__}: {err})")
        os.register_at_fork(after_in_child=self._after_fork_in_child)
        self.write_state()

    def _cupti_teardown(self, torch: Any) -> None:
        """``TEARDOWN_CUPTI=1`` where :mod:`gpudoctor.collect.cupti`'s rule allows it (read by Kineto
        at the end of each profiler window), before the script runs."""
        from gpudoctor.collect import cupti  # noqa: PLC0415

        source = self.cfg.get("source_path") or self.cfg.get("script_path")
        decision = cupti.decide(os.environ, torch.version.cuda, self.schedule is not None,
                                lambda: cupti.read_graph_site(source))
        cupti.apply(decision, os.environ)
        self.cupti = decision
        if decision.guard:
            guard = cupti.GraphGuard(torch.cuda.CUDAGraph, os.environ,
                                     lambda: self.tracker.index if self.tracker is not None else 0)
            why = guard.install()
            if why:
                self.notes.append(f"CUDA graph captures not watched for {cupti.ENV} ({why})")
            else:
                self.cupti_guard = guard

    def _install(self, torch: Any) -> None:
        from gpudoctor.collect.loaderprof import LoaderProfile  # noqa: PLC0415
        from gpudoctor.collect.patches import Patcher  # noqa: PLC0415
        from gpudoctor.collect.settings_capture import SettingsCapture  # noqa: PLC0415
        from gpudoctor.collect.steps import CprofileWindow, StepTracker  # noqa: PLC0415
        from gpudoctor.collect.timewindow import TimeWindow  # noqa: PLC0415
        from gpudoctor.collect.torchprof import ProfilerDriver  # noqa: PLC0415

        cfg = self.cfg
        frames = FrameClassifier(cfg.get("cwd") or os.getcwd(), os.path.dirname(torch.__file__))
        self.frames = frames
        # the tracker writes its lines once a second: a step costs no system call
        # (SIGKILL loses at most the last second of steps)
        self.writer = rundir.JsonlWriter(self.run_dir / layout.rank_tagged(layout.STEPS, self.rank))
        s = self.schedule
        if s is not None:
            self.driver = ProfilerDriver(
                torch,
                s,
                self.run_dir,
                layout.worker_name(os.getpid()),
                on_change=self.write_state,
                current_step=lambda: self.tracker.index if self.tracker is not None else 0,
            )
        start = sched.cprofile_start(s)
        steps = int(cfg.get("cprofile_steps") or 0)
        self.cprof = CprofileWindow(
            enabled=bool(cfg.get("cprofile")) and steps > 0,
            start_step=start,
            stop_before=sched.cprofile_stop_before(s, start, steps),
            budget=sched.CprofileBudget(),
            path=self.run_dir / layout.rank_tagged(layout.PSTATS, self.rank),
        )
        self.tracker = StepTracker(
            torch,
            self.writer,
            self.t0,
            s,
            cfg.get("max_steps"),
            self.driver,
            self.cprof,
            on_boundary=self._on_boundary,
            rank=self.rank,
        )
        self.tracker.every_boundary = self.world_size is not None  # DDP is polled at given steps
        window = cfg.get("time_window_s")
        self.timewindow = TimeWindow(
            self.tracker,
            self.driver,
            self.run_dir / layout.rank_tagged(layout.PSTATS, self.rank),
            float(window[0]) if window else None,
            float(window[1]) if window else None,
            cprofile=bool(cfg.get("cprofile")),
        )
        self.tracker.on_first_step = self.timewindow.give_way
        self.capture = SettingsCapture(torch, frames)
        self.loader_prof = LoaderProfile(self.cprof, self.run_dir / layout.rank_tagged(layout.LOADER_PSTATS, self.rank))
        patcher = self.patcher = Patcher(torch, self.capture, self.tracker, frames, self.loader_prof)
        for err in patcher.install():
            self.notes.append(err)
        if cfg.get("injections"):  # a --verify trial: over the patches, so they still see every call
            self._inject(torch, frames, cfg["injections"])
        if self.driver is not None:
            self.driver.install()
        # Python's one profiler slot: the script's own profiler wins, gpudoctor's instruments give way (profslot)
        from gpudoctor.collect import profslot  # noqa: PLC0415

        for part in (self.cprof, self.loader_prof, self.driver, self.timewindow):
            if part is not None:
                profslot.on_script_profiler(part.yield_to_script)
        tracker = self.tracker
        profslot.watch_script(lambda: tracker.index if tracker.in_step else None)

    def _inject(self, torch: Any, frames: FrameClassifier, raw: list[dict[str, Any]]) -> None:
        from gpudoctor.collect.inject import Injector  # noqa: PLC0415
        from gpudoctor.model import Injection  # noqa: PLC0415

        capture = self.capture

        def changed() -> None:
            capture.dirty = True

        injector = Injector(torch, frames, [Injection.from_dict(d) for d in raw], on_change=changed)
        for err in injector.install():
            self.notes.append(f"--verify injection {err}")
        capture.injector = injector

    def settings_path(self) -> Path:
        return self.run_dir / layout.rank_tagged(layout.SETTINGS, self.rank)

    def write_settings(self, refresh_flags: bool = True) -> None:
        if self.capture is None or self.forked:
            return
        try:
            settings = self.capture.build(refresh_flags=refresh_flags)
            rundir.write_json_atomic(self.settings_path(), settings.to_dict())
            self.capture.dirty = False
            self.settings_write_error = ""
        except OSError as err:
            self.settings_write_error = rundir.os_reason(err)
        except Exception as err:
            self.capture.error(layout.SETTINGS, err)

    def _on_boundary(self, index: int) -> None:
        if self.capture is not None and self.world_size is not None:
            self.capture.poll_ddp(index)
        if self.capture is not None and self.capture.dirty:
            self.write_settings()
        if index == 0:
            self.write_state()

    def _after_fork_in_child(self) -> None:
        self.forked = True
        worker_signals()  # a worker's signals are not the training process's: Python's own handling
        for key in ("signal_fd", "state_fd", "signal_read_fd"):  # the parent reads until every writer has closed
            fd = self.cfg.get(key)
            if isinstance(fd, int) and fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        for part in (self.tracker, self.driver, self.cprof, self.loader_prof, self.writer, self.timewindow):
            if part is not None:
                part.in_child_after_fork()
        from gpudoctor.collect import profslot  # noqa: PLC0415

        profslot.forget()
        if self.capture is not None:
            self.capture.active = False

    # ------------------------------------------------------------------ running the script

    def _prepare_sys(self) -> None:
        cfg = self.cfg
        sys.argv = list(cfg["argv"])
        if cfg.get("script_path") and not getattr(sys.flags, "safe_path", False):
            folder = os.path.dirname(cfg["script_path"])
            if sys.path and sys.path[0] in ("", os.getcwd(), cfg.get("cwd")):
                sys.path[0] = folder
            else:
                sys.path.insert(0, folder)

    def _exec_script(self) -> None:
        path = self.cfg["script_path"]
        with open(path, "rb") as f:
            source = f.read()
        code = compile(source, path, "exec", dont_inherit=True)
        main = types.ModuleType("__main__")
        main.__dict__.update(
            {
                "__file__": path,
                "__builtins__": builtins,
                "__loader__": importlib.machinery.SourceFileLoader("__main__", path),
                "__spec__": None,
                "__package__": None,
                "__cached__": None,
            }
        )
        self._bootstrap_main = sys.modules.get("__main__")
        sys.modules["__main__"] = main
        exec(code, main.__dict__)

    def _trim(self, tb: types.TracebackType | None) -> types.TracebackType | None:
        """Drop gpudoctor's and runpy's frames, so the traceback reads as Python's own would."""
        frames = getattr(self, "frames", None) or FrameClassifier(self.cfg.get("cwd"))
        kept = []
        while tb is not None:
            name = tb.tb_frame.f_code.co_filename
            if not (frames.kind(name) == "ours" or name.endswith(("runpy.py", "<frozen runpy>"))):
                kept.append(tb)
            tb = tb.tb_next
        for a, b in zip(kept, kept[1:], strict=False):
            a.tb_next = b
        if kept:
            kept[-1].tb_next = None
        return kept[0] if kept else None

    def _print_exception(self, exc: BaseException) -> None:
        # the default excepthook prints exc.__traceback__, whatever tb it is given
        exc.__traceback__ = self._trim(exc.__traceback__)
        try:
            sys.excepthook(type(exc), exc, exc.__traceback__)
        except Exception:
            import traceback  # noqa: PLC0415

            traceback.print_exception(type(exc), exc, exc.__traceback__)

    def _exception_info(self, exc: BaseException) -> ExceptionInfo:
        frames = getattr(self, "frames", None) or FrameClassifier(self.cfg.get("cwd"))
        site = frames.traceback_site(exc.__traceback__)
        if site is None and isinstance(exc, SyntaxError) and exc.filename:
            from gpudoctor.model import CallSite  # noqa: PLC0415

            site = CallSite(frames.display_path(exc.filename), int(exc.lineno or 0), "<module>")
        message = str(exc)
        if len(message) > 2000:
            message = message[:2000] + " …"
        return ExceptionInfo(type=_exc_type_name(exc), message=message, call_site=site)

    def run(self) -> int:
        # Start-up: the signals are held back (child_signals) while torch is imported and the instruments
        # are installed; one that came meanwhile ends the run here, before the script runs.
        try:
            self.setup()
            from gpudoctor.collect.steps import StopAfterSteps  # noqa: PLC0415

            self._prepare_sys()
            held = script_signals()
            if held is None:
                pause_point("child-script")
        except (KeyboardInterrupt, Terminated) as ex:  # not held back (torchrun's ranks), or just after
            held = signum_of(ex)
        if held is not None:
            self.finish(RunStatus.INTERRUPTED, startup_detail(held), 128 + held, held)
            return 128 + held
        status = RunStatus.COMPLETED
        detail = ""
        code = 0
        sig = None
        self.script_started_ns = time.monotonic_ns()
        if self.timewindow is not None:
            self.timewindow.arm(self.script_started_ns)
        if self.tracker is not None and self.tracker.max_steps is not None:
            from gpudoctor.collect.mainsignal import free_signal  # noqa: PLC0415
            from gpudoctor.collect.steps.limit import stopper  # noqa: PLC0415

            stopper.arm(free_signal())  # --steps reached on another thread stops the main one
        stop_steps: int | None = None
        try:
            if self.cfg.get("module"):
                runpy.run_module(self.cfg["module"], run_name="__main__", alter_sys=True)
            else:
                self._exec_script()
        except StopAfterSteps as stop:
            status, detail, stop_steps = RunStatus.STOPPED, f"stopped after {stop.steps} steps", stop.steps
        except SystemExit as ex:
            code = exit_code_of(ex.code)
            detail = f"the script called sys.exit({ex.code!r})" if ex.code not in (None, 0) else ""
        except KeyboardInterrupt as ex:
            self._print_exception(ex)
            status, code, sig = RunStatus.INTERRUPTED, EXIT_INTERRUPTED, signal.SIGINT
            detail = "interrupted (SIGINT / Ctrl-C)"
        except Terminated as ex:
            sig = ex.signum
            status, code = RunStatus.KILLED, 128 + sig
            detail = f"terminated by signal {sig} ({signal_name(sig)})"
        except BaseException as ex:  # the script raised: Python would print it and exit 1
            self._print_exception(ex)
            status, code = RunStatus.FAILED, 1
            info = self._exception_info(ex)
            self.state["exception"] = info.to_dict()
            where = f" at {info.call_site}" if info.call_site else ""
            detail = f"{info.type}: {info.message.splitlines()[0] if info.message else ''}{where}".strip()
        status, detail = self._stop_account(status, detail, stop_steps)
        self.finish(status, detail, code, sig)
        return code

    def _stop_account(self, status: RunStatus, detail: str, stop_steps: int | None) -> tuple[RunStatus, str]:
        """``--steps N``: "stopped after N steps" only where the script stopped there. The stop is a SystemExit
        raised at the boundary (``steps.limit``): a script that catches it and steps on meets it again at each
        later boundary; when it still runs, the run says how many steps it ran and that ``--steps`` could
        not stop it (:attr:`swallowed`)."""
        from gpudoctor.collect.steps.limit import stopper  # noqa: PLC0415

        stopper.disarm()
        tr = self.tracker
        if tr is None or tr.max_steps is None or not (stopper.raised or tr.stop_requested):
            return status, detail
        ran = max(tr.limit.done if tr.limit is not None else tr.steps_seen, tr.max_steps if stop_steps is not None else 0)
        told, self.swallowed = stopper.account(tr.max_steps, ran, stop_steps)
        if not self.swallowed:  # it stopped there: the stop ended the loop (caught or not, by the script's last lines)
            return (RunStatus.STOPPED, told) if status == RunStatus.COMPLETED else (status, detail)
        return status, told if stop_steps is not None else "; ".join(d for d in (detail, told) if d)

    # ------------------------------------------------------------------ the end

    def finish(self, status: RunStatus, detail: str, code: int, sig: int | None) -> None:
        # when the script ended, before the flush: orders the ranks' failures (the first is the cause)
        self.state["ended_ns"] = time.monotonic_ns() - self.t0
        try:
            for s in HANDLED:  # let the flush finish; the parent escalates
                signal.signal(s, signal.SIG_IGN)
        except ValueError:
            pass
        if self.cprof is not None:
            self.cprof.stop()
        if self.loader_prof is not None:
            self.loader_prof.write()
        if self.tracker is not None:
            try:
                self.tracker.finish()
            except Exception as err:
                self.notes.append(f"steps: {type(err).__name__}: {err}")
        if self.driver is not None:
            self.driver.finish()
            try:
                self.driver.export_unexported()
            except Exception as err:
                self.notes.append(f"torch.profiler: {type(err).__name__}: {err}")
        if self.timewindow is not None:
            try:
                self.timewindow.finish(self.tracker.steps_seen if self.tracker is not None else 0)
            except Exception as err:
                self.notes.append(f"time window: {type(err).__name__}: {err}")
        if self.capture is not None:
            steps = self.tracker.steps_seen if self.tracker is not None else 0
            self.write_settings(refresh_flags=steps == 0)
        child_account.cuda_facts(self)
        if self.writer is not None:
            self.writer.close()
        self.state.update(
            {
                "status": status.value,
                "status_detail": detail,
                "exit_code": code,
                "signal": int(sig) if sig is not None else None,
            }
        )
        self.write_state(final=True)
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        except ValueError:
            pass

    def release(self) -> None:
        """In-process (``gpudoctor.session()``), once the run is finished: the root module's hooks off
        (the global search hooks, the root's own; the process's modules go back to their fast path).
        The patched attributes of torch are put back by ``inprocess.AttributeSnapshot``."""
        watch = getattr(getattr(self, "patcher", None), "root_watch", None)
        if watch is not None:
            watch.gave_up = "the session ended"
            watch._disarm()
            watch._unhook()


def main() -> None:
    raw = os.environ.pop(CONFIG_ENV, None)
    if not raw:
        print(
            "gpudoctor: this module is started by `gpudoctor profile`; run gpudoctor profile train.py instead",
            file=sys.stderr,
        )
        sys.exit(2)
    cfg = json.loads(raw)
    try:
        pause_point("child-start")  # the three signals still blocked (not under torchrun)
        signals_in_place(cfg)
        child = Child(cfg)
    except KeyboardInterrupt:  # torchrun's ranks start unblocked: before anything was set up, nothing to write
        sys.exit(EXIT_INTERRUPTED)
    try:
        code = child.run()
    except (KeyboardInterrupt, Terminated) as ex:  # during the last flush
        code = 128 + signum_of(ex)
    sys.exit(code)
