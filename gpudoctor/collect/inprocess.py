"""``profile``'s instruments in the current process: the collection behind ``gpudoctor.session()``.

One code path with ``gpudoctor profile``: the training process's :class:`~gpudoctor.collect.child.Child`
installs the same instruments (the window schedule, the cProfile window, settings capture, the step
tracker and its CUDA-event step times, the profiler slot's rules) and writes the same files; what the
parent process does for ``profile`` (the NVML/psutil sampler, the trace compressor, the manifest) runs
here as threads of this process and at the end of the session. The run directory is ``profile``'s.

What differs, because the process goes on after the session:

- nothing is left behind: every attribute of torch (and of ``cProfile``) that the instruments replaced is
  put back when the session ends (:class:`AttributeSnapshot`), the signal handlers the ending of a run
  changes are restored, and no crash log takes ``faulthandler``;
- ``steps=N`` ends the block after N steps (``StopAfterSteps`` reaches the ``with``, which swallows it);
- an exception of the code in the block ends the run as ``failed`` and is raised on.

Under ``torchrun`` (or ``accelerate launch``: ``WORLD_SIZE`` > 1 and ``LOCAL_RANK`` set), the sessions of one
node's ranks share one run directory, ``profile --nproc-per-node``'s layout (``collect.jobdir``): the first rank
to start creates it and publishes its name and the job's start time in a hidden file beside it; every rank's
child writes its rank-tagged files there (``steps.rank1.jsonl`` …, on the job's clock); the first rank (the
*leader*) samples the launcher and every rank under it, compresses the traces, and at its end waits for the
other ranks' accounts and writes the job's manifest (``launcher`` ``torchrun``, ``rank_ends``).
"""

from __future__ import annotations

import os
import signal
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.collect import rundir
from gpudoctor.collect.jobdir import JobDir, job_sampler, launched_rank
from gpudoctor.collect.options import ProfileOptions, Target
from gpudoctor.collect.runner import KINETO_QUIET_LEVEL
from gpudoctor.model import Manifest, RunStatus, layout
from gpudoctor.signals import HANDLED

_MISSING = object()


class AttributeSnapshot:
    """The attributes of torch's modules and classes (and ``cProfile.Profile``) as they are now, to put
    back later: whatever the instruments replace (a class's ``step``, ``torch.compile``, a descriptor) is
    restored, whatever they add is removed. Classes of torch and of modules imported before the snapshot
    only; a class defined during the session keeps a wrapper that does nothing once its tracker stopped."""

    def __init__(self, torch: Any) -> None:
        import cProfile  # noqa: PLC0415
        import warnings  # noqa: PLC0415

        with warnings.catch_warnings():  # reading a deprecated class of torch's warns (torch.distributed.reduce_op)
            warnings.simplefilter("ignore")
            self._take(torch, cProfile)

    def _take(self, torch: Any, cProfile: Any) -> None:  # noqa: N803
        self._saved: list[tuple[Any, dict[str, Any]]] = []
        seen: set[int] = set()
        targets: list[Any] = [cProfile.Profile]
        for name, mod in list(sys.modules.items()):
            if not isinstance(mod, types.ModuleType) or not (name == "torch" or name.startswith("torch.")):
                continue
            targets.append(mod)
            if type(mod) is not types.ModuleType:  # torch.backends.cudnn's own module class
                targets.append(type(mod))
            for value in list(vars(mod).values()):
                if isinstance(value, type) and getattr(value, "__module__", "") == name:
                    targets.append(value)
        targets.extend(_subclasses(torch.optim.Optimizer))  # a framework's optimizer classes too
        for obj in targets:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            try:
                self._saved.append((obj, dict(vars(obj))))
            except TypeError:
                continue

    def restore(self) -> list[str]:
        """Put every attribute back; what could not be put back, in words."""
        errors: list[str] = []
        for obj, before in self._saved:
            try:
                now = dict(vars(obj))
            except TypeError:
                continue
            for key, value in now.items():
                old = before.get(key, _MISSING)
                if old is value:
                    continue
                try:
                    if old is _MISSING:
                        delattr(obj, key)
                    else:
                        setattr(obj, key, old)
                except (AttributeError, TypeError) as err:
                    errors.append(f"{getattr(obj, '__name__', obj)}.{key}: {err}")
            for key, old in before.items():
                if key not in now:
                    try:
                        setattr(obj, key, old)
                    except (AttributeError, TypeError) as err:
                        errors.append(f"{getattr(obj, '__name__', obj)}.{key}: {err}")
        return errors


def _subclasses(cls: type) -> list[type]:
    out, todo = [], [cls]
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(c.__subclasses__())
    return out


def _main_file() -> str | None:
    """The script this process runs (``__main__``'s file), None in a notebook or an interactive shell."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py") or not os.path.isfile(path):
        return None
    path = os.path.abspath(path)
    # a kernel's launcher (ipykernel_launcher.py), an installed tool's entry point: not the user's script
    return None if any(part in path for part in ("site-packages", "dist-packages")) else path


@dataclass(frozen=True, slots=True)
class TrainerSettings:
    """What a trainer's arguments say about the run, read by its callback when training starts: recorded
    into the run's settings in the fields ``profile`` fills from the torch calls it sees (the trainer made
    those calls before the session began, or makes them inside its own code)."""

    trainer: str  # the arguments' owner, the flags' prefix: "transformers.TrainingArguments", "lightning.Trainer"
    arguments: dict[str, Any] = field(default_factory=dict)  # as the trainer holds them: {"precision": "bf16-mixed"}
    device_type: str | None = None  # "cuda", "cpu", "mps": where the trainer puts the model
    autocast_dtype: str | None = None  # "torch.bfloat16" / "torch.float16": mixed precision (autocast) asked for
    grad_scaler: bool = False  # fp16 mixed precision scales the loss (a GradScaler)
    compile_options: dict[str, Any] | None = None  # the trainer compiles the model: torch.compile's options
    module: str = ""  # the model's class


class InProcessRun:
    """One session's collection: :meth:`start` before the training code, :meth:`finish` after it."""

    def __init__(self, opts: ProfileOptions, name: str | None = None) -> None:
        self.opts = opts
        self.name = name
        self.run_dir: Path | None = None
        self.manifest: Manifest | None = None
        self.errors: list[str] = []
        self._child: Any = None
        self._snapshot: AttributeSnapshot | None = None
        self._sampler: Any = None
        self._nvml: Any = None
        self._nvml_reason = ""
        self._compressor: Any = None
        self._target: Target | None = None
        self.job: JobDir | None = None  # a torchrun rank's share of the job's run directory
        self.ranks = 0  # ranks on this node (a torchrun job), else 0

    @property
    def writes_manifest(self) -> bool:
        """This process writes the run directory's manifest (a torchrun job's leader, or the only process)."""
        return self.job is None or self.job.leader

    def start(self) -> Path:
        from gpudoctor.collect.child import Child  # noqa: PLC0415
        from gpudoctor.collect.runner import _start_sampler, _write_manifest  # noqa: PLC0415
        from gpudoctor.errors import CollectError  # noqa: PLC0415

        opts = self.opts
        cwd = os.getcwd()
        script = _main_file()
        self._target = Target(script_arg=sys.argv[0] if sys.argv else None, script_path=script, module=None,
                              module_origin=None, argv=tuple(sys.argv))
        self.t0_unix_ns, self.t0_mono_ns = time.time_ns(), time.monotonic_ns()
        stem = rundir.run_stem(self.name or script or "session", None)
        launched = launched_rank()
        try:
            if launched is not None:
                self.ranks = launched[1]
                self.job = JobDir(Path(opts.out_dir), stem, self.t0_unix_ns, self.t0_mono_ns)
                self.run_dir, self.t0_unix_ns, self.t0_mono_ns = self.job.run_dir, self.job.t0_unix_ns, self.job.t0_mono_ns
            else:
                self.run_dir = rundir.create_run_dir(Path(opts.out_dir), stem)
            if self.writes_manifest:
                rundir.write_json_atomic(self.run_dir / layout.MANIFEST, {"status": "running"},
                                         reserve_bytes=rundir.MANIFEST_RESERVE_BYTES)
        except OSError as err:
            raise CollectError(f"cannot create a run directory under {opts.out_dir}: {rundir.os_reason(err)}; "
                               "pass out= a folder you can write") from err
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)  # as profile's training process has it
        import torch  # noqa: PLC0415 - the session's process trains with it

        self._snapshot = AttributeSnapshot(torch)
        self.manifest = self._start_manifest(cwd)
        if self.writes_manifest:
            _write_manifest(self.run_dir, self.manifest, reserve_bytes=rundir.MANIFEST_RESERVE_BYTES)
        cfg = {
            "run_dir": str(self.run_dir.resolve()), "parent_pid": 0, "t0_mono_ns": self.t0_mono_ns, "cwd": cwd,
            "script_path": script, "module": None, "argv": list(sys.argv),
            "schedule": opts.schedule_fields() if opts.torch_profiler else None, "max_steps": opts.max_steps,
            "cprofile": opts.cprofile, "cprofile_steps": opts.cprofile_steps,
            "time_window_s": list(opts.time_window_s) if opts.time_window_s else None, "launcher": "",
            "injections": [], "in_process": True,
        }
        child = self._child = Child(cfg)
        child.setup()
        if self.job is not None:
            if self.job.leader:  # the launcher and every rank under it, one samples.jsonl (as profile's)
                self._sampler, self._nvml, self._nvml_reason = job_sampler(opts, self.run_dir, self.t0_mono_ns)
        else:
            self._sampler, self._nvml, self._nvml_reason = _start_sampler(opts, self.run_dir, self.t0_mono_ns,
                                                                          os.getpid())
        if self.writes_manifest:
            from gpudoctor.collect.finish import TraceCompressor  # noqa: PLC0415

            self._compressor = TraceCompressor(self.run_dir)  # every rank's traces (rank-tagged state files)
            self._compressor.start()
        child.script_started_ns = time.monotonic_ns()
        if child.timewindow is not None:
            child.timewindow.arm(child.script_started_ns)
        return self.run_dir

    @property
    def tracker(self) -> Any:
        return self._child.tracker if self._child is not None else None

    def note_dataloader(self, loader: Any, site: Any) -> None:
        """A DataLoader made before the session started (a trainer's), read as if its making had been seen:
        ``site`` (a ``CallSite``: where the user's code defines what it loads) is where findings point."""
        capture = self._child.capture if self._child is not None else None
        if capture is not None:
            try:
                capture.note_dataloader(loader, site)
            except Exception as err:  # gpudoctor's error never reaches the training
                capture.error("DataLoader (noted by a callback)", err)

    def note_trainer(self, declared: TrainerSettings) -> None:
        """Record a trainer's declared settings (``TrainerSettings``), at the user's call into the trainer
        (``trainer.fit(...)``, ``Trainer.train()``): its arguments among the flags, mixed precision as an
        ``autocast`` use (and a GradScaler for fp16), the compiled model as a ``torch.compile`` wrapper (and
        from then on what Dynamo compiles), the device."""
        child = self._child
        capture = child.capture if child is not None else None
        if capture is None:
            return
        try:
            frame = capture.frames.user_frame(sys._getframe(1))
            site = capture.frames.site(frame) if frame is not None else None
            for key, value in declared.arguments.items():
                capture.note_declared(f"{declared.trainer}.{key}", value, site)
            if declared.device_type:
                capture.note_device(declared.device_type)
            if declared.autocast_dtype:
                use = types.SimpleNamespace(device=declared.device_type or "cpu", fast_dtype=declared.autocast_dtype,
                                            _enabled=True)
                capture.note_autocast(use, site, False)
            if declared.grad_scaler:
                capture.note_grad_scaler(site)
            if declared.compile_options is not None:
                capture.note_wrapper("torch.compile", site, declared.module, dict(declared.compile_options))
                self._watch_compilations(capture)
        except Exception as err:  # gpudoctor's error never reaches the training
            capture.error(f"the settings of {declared.trainer}", err)

    def _watch_compilations(self, capture: Any) -> None:
        """What Dynamo compiles from now on (as ``profile`` does from the script's ``torch.compile``)."""
        if capture.compile_watch is not None or self.tracker is None:
            return
        import torch  # noqa: PLC0415

        from gpudoctor.collect.compile_watch import CompileWatch, monotonic_clock  # noqa: PLC0415

        tracker = self.tracker
        watch = CompileWatch(torch, lambda: tracker.index, monotonic_clock(tracker.t0), capture.mark_dirty)
        capture.compile_watch = watch
        watch.install()

    def _start_manifest(self, cwd: str) -> Manifest:
        from gpudoctor.collect.runner import _start_manifest  # noqa: PLC0415

        assert self._target is not None and self.run_dir is not None
        opts = self.opts
        m = _start_manifest(opts, self._target, self.run_dir, cwd, self.t0_unix_ns)
        from gpudoctor.collect.finish import replace_manifest  # noqa: PLC0415

        m = replace_manifest(m, command=("session", *self._target.argv))
        if self.job is not None:
            from gpudoctor.collect.distributed import LAUNCHER  # noqa: PLC0415

            m = replace_manifest(m, launcher=LAUNCHER)
        return m

    def finish(self, status: RunStatus, detail: str = "", code: int = 0) -> Manifest:
        """End the run: the child's account (``profile``'s training process's ending), the sampler, the
        manifest; then torch is put back as it was."""
        from gpudoctor.collect.finish import finish_manifest, replace_manifest  # noqa: PLC0415
        from gpudoctor.collect.relay import Signals  # noqa: PLC0415
        from gpudoctor.collect.runner import _write_manifest  # noqa: PLC0415

        child = self._child
        assert child is not None and self.run_dir is not None and self.manifest is not None
        handlers = {}
        for sig in HANDLED:
            try:
                handlers[sig] = signal.getsignal(sig)
            except ValueError:
                pass
        try:
            child.finish(status, detail, code, None)
        finally:
            for sig, handler in handlers.items():
                try:
                    signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
                except (ValueError, TypeError, OSError):
                    pass
            child.release()
            from gpudoctor.collect import profslot  # noqa: PLC0415

            profslot.forget()
            if self._snapshot is not None:
                self.errors.extend(self._snapshot.restore())
        if not self.writes_manifest:  # a torchrun rank: its account is its state file, the leader merges it
            self.manifest = replace_manifest(self.manifest, status=status, status_detail=detail, exit_code=code,
                                             rank=child.rank, world_size=child.world_size)
            return self.manifest
        job: dict[str, Any] = {}
        state = dict(child.state)
        if self.job is not None:
            from gpudoctor.collect import distributed  # noqa: PLC0415

            self.ranks = self.job.wait_for_ranks()
        t_end_unix_ns, t_end_mono_ns = time.time_ns(), time.monotonic_ns()
        self._sampler.stop()
        self._compressor.stop()
        if self.job is not None:
            state, ends, outcome = distributed.combined_state(self.run_dir, self.ranks)
            job = {"rank_ends": tuple(ends), "failed_rank": outcome.get("failed_rank")}
            self.job.close()
        manifest = finish_manifest(
            self.manifest, self.run_dir, code, Signals(), self._sampler, self._nvml, self._nvml_reason, t_end_unix_ns,
            (t_end_mono_ns - self.t0_mono_ns) / 1e9, state=state, compressor=self._compressor,
        )
        if job:
            manifest = replace_manifest(manifest, **job)
        if self._nvml is not None:
            self._nvml.close()
        if _write_manifest(self.run_dir, manifest):
            try:
                (self.run_dir / layout.CHILD_STATE).unlink()
            except OSError:
                pass
        self.manifest = manifest
        return manifest
