"""gpudoctor's Python API: diagnose training code in the current process, and read runs as ``Report`` s.

    import gpudoctor

    with gpudoctor.session(steps=40) as s:   # around any training code (a notebook cell, a trainer's fit)
        train()
    print(s.report.headline)                 # the Report `gpudoctor profile` renders; s.run_dir is the run

    @gpudoctor.session(out="runs")           # the decorator form: a run per call
    def train(): ...

    gpudoctor.analyze("trace.pt.trace.json.gz")   # a run directory, a Kineto trace, a folder of traces
    gpudoctor.load("gpudoctor-runs/train-…")      # a saved run directory

``session()`` runs ``gpudoctor profile``'s instruments in this process (``collect.inprocess``: the same
training-process code, the sampler as a thread) and writes the same run directory; its report is the one
``gpudoctor analyze RUN_DIR`` gives. Steps are found as ``profile`` finds them; a loop the tool cannot see
(no optimizer, no ``backward()``) marks them with ``s.step()``. torch is imported only when a session starts.
The names in ``__all__`` are the stable API (docs/in-process.md).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from gpudoctor.errors import GpudoctorError, UsageError
from gpudoctor.model import Manifest, Report, RunStatus, layout

__all__ = ["Session", "analyze", "load", "session"]

F = TypeVar("F", bound=Callable[..., Any])


class _StepMarker:
    """What ``Session.step()`` reports to the step tracker as the optimizer that marks the steps."""

    __slots__ = ("__weakref__",)


_StepMarker.__qualname__ = "Session"  # the manifest says "Session.step() ends each step"


class Session:
    """One diagnosed run in this process: a context manager (``with``), a decorator, or ``start``/``stop``."""

    def __init__(self, out: str | Path = "gpudoctor-runs", steps: int | None = None, *, name: str | None = None,
                 select: tuple[str, ...] = (), ignore: tuple[str, ...] = (), cprofile: bool = True,
                 sample_interval_ms: int | None = None, quiet: bool = False, diagnose: bool = True) -> None:
        if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
            raise UsageError(f"steps={steps!r}: give a whole number of steps, 1 or more (or None: every step)")
        self.out = Path(out)
        self.steps = steps
        self.name = name
        self.select, self.ignore = tuple(select), tuple(ignore)
        self.cprofile = cprofile
        self.sample_interval_ms = sample_interval_ms
        self.quiet = quiet
        self.diagnose = diagnose
        self.run_dir: Path | None = None
        self.manifest: Manifest | None = None
        self._report: Report | None = None
        self._run: Any = None
        self._marker: _StepMarker | None = None
        self.rank_only = False  # a rank of a torchrun job other than the one that wrote the job's manifest

    # ------------------------------------------------------------------ the run

    def start(self) -> Session:
        if self._run is not None:
            raise UsageError("this session is running already: one `with` block (or start()) at a time")
        from gpudoctor.collect.inprocess import InProcessRun  # noqa: PLC0415
        from gpudoctor.collect.options import ProfileOptions, short_run_wait  # noqa: PLC0415

        base = ProfileOptions()
        extra: dict[str, Any] = {}
        if self.sample_interval_ms is not None:
            extra["sample_interval_ms"] = int(self.sample_interval_ms)
        opts = ProfileOptions(
            out_dir=self.out, max_steps=self.steps, cprofile=self.cprofile, summary=False,
            wait=short_run_wait(self.steps, base.skip_first, base.warmup, base.active, base.repeat, base.wait),
            **extra,
        )
        self._report = None
        self._marker = None
        self.rank_only = False
        run = InProcessRun(opts, self.name)
        self.run_dir = run.start()
        self._run = run
        return self

    def stop(self, exc: BaseException | None = None) -> Report | None:
        """End the run (``exc``: what ended the block, if it raised); the report unless it could not be made."""
        run, self._run = self._run, None
        if run is None:
            raise UsageError("this session is not running: start it with `with gpudoctor.session(...)` first")
        from gpudoctor.collect.steps import StopAfterSteps  # noqa: PLC0415

        tracker = run.tracker
        if isinstance(exc, StopAfterSteps):
            status, detail, code = RunStatus.STOPPED, f"stopped after {exc.steps} steps", 0
        elif isinstance(exc, KeyboardInterrupt):
            status, detail, code = RunStatus.INTERRUPTED, "interrupted (KeyboardInterrupt)", 130
        elif exc is not None:
            status, detail, code = RunStatus.FAILED, f"{type(exc).__name__}: {exc}".strip(), 1
        elif tracker is not None and tracker.stop_requested:
            status, detail, code = RunStatus.STOPPED, f"stopped after {tracker.steps_seen} steps", 0
        else:
            status, detail, code = RunStatus.COMPLETED, "", 0
        self.manifest = run.finish(status, detail, code)
        self.rank_only = not run.writes_manifest
        if not self.diagnose or self.rank_only:  # a torchrun job's other ranks: the first rank's report is the job's
            return None
        try:
            self._report = _diagnose(run.run_dir, self.select, self.ignore, kind="profile", write=True)
        except GpudoctorError as err:
            if not self.quiet:
                print(f"gpudoctor: could not diagnose the run: {err}", file=sys.stderr)
            self._report = None
        return self._report

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        from gpudoctor.collect.steps import StopAfterSteps  # noqa: PLC0415

        self.stop(exc)
        return isinstance(exc, StopAfterSteps)  # steps=N reached: the block ends there, as `--steps N` ends a script

    def __call__(self, fn: F) -> F:
        """The decorator form: each call of ``fn`` is one run (the last one's report is ``self.report``)."""

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return run  # type: ignore[return-value]

    def step(self) -> None:
        """One training step ends here: for a loop whose steps gpudoctor cannot see (no optimizer step). Once
        called, ``step()`` marks the steps (an optimizer's steps no longer do)."""
        run = self._run
        if run is None:
            raise UsageError("session.step() outside the session: call it inside the `with` block")
        tracker = run.tracker
        if tracker is None:
            return
        marker = self._marker
        if marker is None:
            import weakref  # noqa: PLC0415

            marker = self._marker = _StepMarker()
            if tracker.marker_ref is not None and tracker.marker_ref() is not None:
                tracker.marker_ref = weakref.ref(marker)  # the session's calls mark the steps from here on
        tracker.on_optimizer_step(marker)
        tracker.flush(from_step_return=True)

    def note_dataloader(self, loader: Any, where: Callable[..., Any] | type | None = None) -> None:
        """Read the settings of a DataLoader made before the session started (a trainer's own): ``where`` (the
        collator, the dataset's class) is the user's code its findings point at."""
        run = self._run
        if run is None:
            raise UsageError("session.note_dataloader() outside the session: call it inside the `with` block")
        run.note_dataloader(loader, _site_of(where) if where is not None else None)

    def note_trainer(self, declared: Any) -> None:
        """Record what a trainer's arguments declare (a ``collect.inprocess.TrainerSettings``: precision,
        accumulation, compile, device) into the run's settings, as ``profile`` records them from torch's calls."""
        run = self._run
        if run is None:
            raise UsageError("session.note_trainer() outside the session: call it inside the `with` block")
        run.note_trainer(declared)

    # ------------------------------------------------------------------ results

    @property
    def report(self) -> Report:
        """The diagnosis of the finished run: the ``Report`` `gpudoctor profile` renders."""
        if self._report is None:
            if self._run is not None:
                raise UsageError("the session is still running: its report is ready when the `with` block ends")
            if self.rank_only:
                raise UsageError("no report on this rank: the job's run directory (every rank's) is diagnosed by the "
                                 "rank that created it; gpudoctor.load(s.run_dir) once the job ended")
            raise UsageError("no report: the session has not run, ran with diagnose=False, or its run could not be "
                             "diagnosed (gpudoctor.load(s.run_dir) diagnoses a finished run)")
        return self._report

    def __repr__(self) -> str:
        state = "running" if self._run is not None else "finished" if self.manifest is not None else "not started"
        return f"<gpudoctor.Session {state}{f' {self.run_dir}' if self.run_dir else ''}>"


def _site_of(obj: Any) -> Any:
    """The ``CallSite`` where ``obj`` (a function, a class, a callable object) is defined; None when unknown."""
    import inspect  # noqa: PLC0415

    from gpudoctor.model import CallSite  # noqa: PLC0415

    target = obj if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj) else type(obj)
    try:
        file = inspect.getsourcefile(target)
        _, line = inspect.getsourcelines(target)
    except (OSError, TypeError):
        return None
    return CallSite(file, int(line), getattr(target, "__qualname__", "")) if file else None


def session(out: str | Path = "gpudoctor-runs", steps: int | None = None, *, name: str | None = None,
            select: tuple[str, ...] = (), ignore: tuple[str, ...] = (), cprofile: bool = True,
            sample_interval_ms: int | None = None, quiet: bool = False, diagnose: bool = True) -> Session:
    """A diagnosed run of the training code in this process: ``with gpudoctor.session() as s:`` (or as a
    decorator). ``out``: the folder of run directories; ``steps``: stop after this many training steps (the
    block ends there); ``name``: the run directory's name (default: the script's, else "session");
    ``select`` / ``ignore``: rule codes, as ``--select`` / ``--ignore``; ``diagnose=False``: the run directory
    only, no report (as ``profile --no-report``)."""
    return Session(out, steps, name=name, select=select, ignore=ignore, cprofile=cprofile,
                   sample_interval_ms=sample_interval_ms, quiet=quiet, diagnose=diagnose)


def _diagnose(path: str | Path, select: tuple[str, ...], ignore: tuple[str, ...], kind: str,
              write: bool = False) -> Report:
    from gpudoctor.config import load_config  # noqa: PLC0415
    from gpudoctor.engine import diagnose, write_report_json  # noqa: PLC0415
    from gpudoctor.pipeline import analyze_paths  # noqa: PLC0415
    from gpudoctor.report import FORMATS  # noqa: F401, PLC0415 - importing it lets a Report show itself in Jupyter

    path = Path(path)
    where = path if path.is_dir() else path.parent
    config = load_config(where.resolve() if where.exists() else Path.cwd(), select=select, ignore=ignore)
    run = analyze_paths([path])
    report = diagnose(run, config, kind=kind)
    if write:
        try:
            write_report_json(report, path)
        except GpudoctorError:
            pass  # a read-only run directory: the report is still returned
    return report


def analyze(path: str | Path, *, select: tuple[str, ...] = (), ignore: tuple[str, ...] = ()) -> Report:
    """The diagnosis of a run directory, a Kineto trace or a folder of traces: ``gpudoctor analyze PATH``."""
    if not Path(path).exists():
        raise UsageError(f"{path}: no such file or directory; pass a run directory or a Kineto trace")
    return _diagnose(path, select, ignore, kind="analyze")


def load(run_dir: str | Path, *, select: tuple[str, ...] = (), ignore: tuple[str, ...] = ()) -> Report:
    """The diagnosis of a saved run directory (``profile``'s or a session's), as ``gpudoctor report RUN`` shows it."""
    run_dir = Path(run_dir)
    if not (run_dir / layout.MANIFEST).is_file():
        raise UsageError(f"{run_dir}: not a gpudoctor run directory (no {layout.MANIFEST}); "
                         "for a trace or a folder of traces use gpudoctor.analyze()")
    return _diagnose(run_dir, select, ignore, kind="analyze")
