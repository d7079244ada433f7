"""The hooks gpudoctor puts into torch before the script runs.

Each patch calls the original first (or last), then notes what it saw; nothing a
patch does can fail the script: an error inside gpudoctor is recorded and the patch
goes quiet. The only exception raised on purpose is ``StopAfterSteps`` (``--steps``).

Hooked: ``Optimizer.__init__`` and the class's ``step`` (steps, optimizer settings,
time in the optimizer), ``torch.autograd.backward``
and the root module (``markers``: the ``backward`` and ``module`` step markers),
``GradScaler`` (a skipped step is still a step),
``DataLoader.__init__`` / ``__iter__`` and the iterators' ``__next__`` (settings,
epochs, time blocked waiting for a batch), ``autocast``, the cuDNN / cuBLAS / TF32
switches and ``set_float32_matmul_precision``, ``use_deterministic_algorithms``,
``set_num_threads``, ``DataParallel`` / ``DistributedDataParallel``,
``torch.compile`` (and from then on what it compiles: ``compile_watch``), ``torch.cuda.empty_cache``.

The hooks of the script's settings (``autocast`` and everything after it above) and the safety net
every patch goes through (``_safe``: gpudoctor's own error never reaches the script) are
``settings_hooks``, the base class of :class:`Patcher`; this module holds the hooks of the loop
(optimizers, ``backward()``, the root module, ``GradScaler``, the DataLoader) and installs them all.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

from gpudoctor.collect.callsite import FrameClassifier
from gpudoctor.collect.loaderprof import LoaderProfile
from gpudoctor.collect.markers import BackwardWatch, RootModuleWatch, compiling_probe
from gpudoctor.collect.settings_capture import SettingsCapture
from gpudoctor.collect.settings_hooks import SettingsHooks
from gpudoctor.collect.steps import (
    BATCH_THREAD,
    DUE,
    END,
    EPOCH,
    FAST_LAST,
    IN_OPTIMIZER,
    IN_WAIT,
    INDEX,
    MARKER,
    N_BATCHES,
    N_FIGURES,
    OPT_THREAD,
    OPTIMIZER,
    PHASE,
    START,
    WAIT,
    StepTracker,
)
from gpudoctor.collect.steps.limit import limited_call
from gpudoctor.model.trace import CLOSURE_RANGE


def passed_args(sig: inspect.Signature | None, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, ...] | None:
    """The names of the arguments a call passed (by position or by name), in the signature's order:
    what the script chose, as against what it left at the default; None when the call cannot be
    bound to the signature."""
    if sig is None:
        return None
    try:
        bound = sig.bind_partial(obj, *args, **kwargs)
    except TypeError:
        return None
    names: list[str] = []
    for name, value in list(bound.arguments.items())[1:]:  # the first is the object itself
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            names.extend(value)
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            names.append(name)
    return tuple(names)


def closure_marker(torch: Any, tracker: StepTracker) -> Callable[[tuple[Any, ...], dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]]:
    """``mark(args, kwargs)``: the arguments of an ``Optimizer.step`` call with its closure (the first
    positional argument, or ``closure=``: Lightning's automatic optimization, LBFGS) wrapped so that the
    closure's work is the model's, not the optimizer's:

    - its time is taken off the optimizer's phase (the step's "other" time), and inside it no phase is in
      progress, so the forward, ``backward()`` and batches it runs are timed as in a loop that calls them
      outside ``step()``;
    - while the profiler records, it runs inside a ``CLOSURE_RANGE`` range, which the account reads
      (``TraceView.closure_intervals``).

    Unchanged for a step without a closure. The closure runs as it was given, once per call (LBFGS calls
    it several times)."""
    enabled = torch._C._autograd._profiler_enabled
    record_function = torch.profiler.record_function
    acc = tracker.acc
    get_ident = threading.get_ident
    monotonic_ns = time.monotonic_ns

    def wrap(closure: Callable[[], Any]) -> Callable[[], Any]:
        def in_closure(*args: Any, **kwargs: Any) -> Any:  # as the closure is called (an optimizer may pass some)
            outer = acc[PHASE] if get_ident() == tracker.loop_thread else 0
            acc[PHASE] = 0 if outer == IN_OPTIMIZER else outer
            start = monotonic_ns()
            try:
                if enabled():
                    with record_function(CLOSURE_RANGE):
                        return closure(*args, **kwargs)
                return closure(*args, **kwargs)
            finally:
                if outer == IN_OPTIMIZER:
                    acc[OPTIMIZER] -= monotonic_ns() - start
                    acc[PHASE] = outer

        return in_closure

    def mark(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if args and callable(args[0]):
            return (wrap(args[0]), *args[1:]), kwargs
        closure = kwargs.get("closure")
        if callable(closure):
            return args, {**kwargs, "closure": wrap(closure)}
        return args, kwargs

    return mark



class Patcher(SettingsHooks):
    """Every hook gpudoctor puts into torch (:meth:`install`), feeding one settings capture, step tracker
    and call-site classifier."""

    def __init__(self, torch: Any, capture: SettingsCapture, tracker: StepTracker, frames: FrameClassifier,
                 loader_profile: LoaderProfile | None = None) -> None:
        self.torch = torch
        self.capture = capture
        self.tracker = tracker
        self.frames = frames
        self.loader_profile = loader_profile  # cProfile of the DataLoader's own work (collect.loaderprof)
        self.errors: list[str] = []
        self.root_watch: RootModuleWatch | None = None

    def install(self) -> list[str]:
        for name, fn in (
            ("optimizer", self._optimizers),
            ("backward", self._backward),
            ("root module", self._root_module),
            ("GradScaler", self._grad_scaler),
            ("DataLoader", self._dataloader),
            ("autocast", self._autocast),
            ("flags", self._flags),
            ("DataParallel", self._data_parallel),
            ("DistributedDataParallel", self._ddp),
            ("torch.compile", self._compile),
            ("empty_cache", self._empty_cache),
        ):
            try:
                fn()
            except Exception as err:  # an older / newer torch without this API
                self.errors.append(f"{name}: not hooked ({type(err).__name__}: {err})")
        return self.errors

    # ------------------------------------------------------------------ steps and optimizers

    def _backward(self) -> None:
        BackwardWatch(self.torch, self.tracker, self.capture.error).install()

    def _root_module(self) -> None:
        frames = self.frames

        def site_of(frame: Any) -> Any:
            f = frames.user_frame(frame)
            return frames.site(f) if f is not None else None

        watch = RootModuleWatch(self.torch, self.tracker, self.capture.error, site_of)
        watch.install()
        self.root_watch = watch

    def _optimizers(self) -> None:
        torch = self.torch
        Optimizer = torch.optim.Optimizer
        tracker = self.tracker
        capture = self.capture
        orig_init = Optimizer.__init__
        is_compiling = compiling_probe(torch)
        get_ident = threading.get_ident
        monotonic_ns = time.monotonic_ns
        acc = tracker.acc
        buf_extend = tracker.buf_extend
        zero = (0,) * N_FIGURES
        depth = [0]  # optimizer steps in progress: one inside another (a wrapper's inner optimizer) marks nothing
        mark_closure = closure_marker(torch, tracker)

        def wrap_step(cls: type) -> None:
            step = cls.step
            if getattr(step, "_gpudoctor_outer", False):
                return

            def marked(self: Any, out: Any) -> Any:
                """The step returned, and it is not the usual case of ``outer``."""
                try:
                    tracker.on_optimizer_step(self)
                except Exception as err:
                    capture.error("optimizer step hook", err)
                if tracker.pending_boundary_ns is not None and tracker.active:  # flush(), inlined
                    tracker.pending_boundary_ns = None
                    tracker._boundary_then_reopen(monotonic_ns(), True)
                return out

            def slow(self: Any, args: Any, kwargs: Any) -> Any:
                """Every case but the usual one (below): before the optimizer marks the steps, off the
                loop's thread (no phase), inside another phase, inside another step (which marks
                nothing), while nothing is tracked."""
                if not tracker.active and not is_compiling():  # --steps goes on counting (StepLimit)
                    return limited_call(tracker.limit, depth, lambda: step(self, *args, **kwargs), "optimizer", id(self))
                if depth[0] or acc[PHASE] == IN_OPTIMIZER or is_compiling():
                    return step(self, *args, **kwargs)
                token = tracker.phase_start(OPTIMIZER) if get_ident() == tracker.loop_thread else None
                depth[0] = 1
                if args or kwargs:
                    args, kwargs = mark_closure(args, kwargs)
                try:
                    out = step(self, *args, **kwargs)
                finally:
                    depth[0] = 0
                    if token is not None:
                        tracker.phase_end(token, OPTIMIZER)
                return marked(self, out)

            def outer(self: Any, *args: Any, **kwargs: Any) -> Any:
                if acc[PHASE] or is_compiling() or get_ident() != acc[OPT_THREAD]:
                    return slow(self, args, kwargs)
                if args or kwargs:  # step(closure): the closure's forward and backward are the model's
                    args, kwargs = mark_closure(args, kwargs)
                start = monotonic_ns()  # no phase in progress: the step's time is all the optimizer's
                acc[PHASE] = IN_OPTIMIZER
                try:
                    out = step(self, *args, **kwargs)
                finally:
                    acc[PHASE] = 0
                    # one clock read ends the optimizer's time and the step
                    end = monotonic_ns()
                    acc[OPTIMIZER] += end - start
                # the step returned: the bookkeeping runs here, outside the Optimizer.step#… range of the trace
                if id(self) == acc[MARKER]:  # the usual case: the marking optimizer stepped
                    if acc[INDEX] < acc[FAST_LAST] and end < acc[DUE]:
                        # StepTracker.fast_close, inlined (a step is in progress, no boundary pending)
                        acc[END] = end
                        buf_extend(acc)
                        acc[:N_FIGURES] = zero
                        acc[INDEX] += 1
                        acc[START] = monotonic_ns()
                        return out
                    if tracker.in_step and tracker.pending_boundary_ns is None:
                        tracker.marks += 1
                        tracker._boundary_then_reopen(end, True)
                        return out
                return marked(self, out)

            functools.update_wrapper(outer, step)
            outer.hooked = True  # type: ignore[attr-defined]  # torch must not wrap it again
            outer._gpudoctor_outer = True  # type: ignore[attr-defined]
            cls.step = outer

        patcher = self

        def opt_init(self: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(self, *args, **kwargs)
            site = patcher._site()

            def note() -> None:
                wrap_step(type(self))
                capture.note_optimizer(self, site)
                tracker.optimizer_created()

            patcher._safe("optimizer", note)

        functools.update_wrapper(opt_init, orig_init)
        Optimizer.__init__ = opt_init

    def _grad_scaler(self) -> None:
        GradScaler = self.torch.amp.GradScaler
        tracker = self.tracker
        capture = self.capture
        patcher = self
        orig_init = GradScaler.__init__
        orig_step = GradScaler.step
        acc = tracker.acc

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(self, *args, **kwargs)
            site = patcher._site()
            patcher._safe("GradScaler", lambda: capture.note_grad_scaler(site))

        def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            # did the optimizer's step run? Its hook closed a step (fast: the index moved) or counted a mark;
            # both only grow
            before = tracker.marks + acc[INDEX]
            lim = tracker.limit
            counted = lim.done if lim is not None else 0
            out = orig_step(self, optimizer, *args, **kwargs)
            if tracker.active and tracker.marks + acc[INDEX] == before:
                patcher._safe("GradScaler.step", lambda: tracker.scaler_skipped(optimizer))
            elif lim is not None and lim.done == counted:  # step tracking stopped: a skipped step still counts
                lim.mark("optimizer", id(optimizer))
            return out

        functools.update_wrapper(init, orig_init)
        functools.update_wrapper(step, orig_step)
        GradScaler.__init__ = init
        GradScaler.step = step

    def _dataloader(self) -> None:
        data = self.torch.utils.data
        DataLoader = data.DataLoader
        BaseIter = data.dataloader._BaseDataLoaderIter
        tracker = self.tracker
        capture = self.capture
        patcher = self
        orig_init = DataLoader.__init__
        orig_iter = DataLoader.__iter__
        orig_next = BaseIter.__next__

        try:
            init_sig: inspect.Signature | None = inspect.signature(orig_init)
        except (TypeError, ValueError):
            init_sig = None

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(self, *args, **kwargs)
            site = patcher._site()
            patcher._safe("DataLoader", lambda: capture.note_dataloader(self, site, passed_args(init_sig, self, args, kwargs)))

        def iter_(self: Any) -> Any:
            it = orig_iter(self)
            if capture.active:
                try:
                    epoch = capture.note_dataloader_iter(self)
                    it._gpudoctor_epoch = -1 if epoch is None else epoch  # as acc[EPOCH] keeps it (-1: unknown)
                except Exception as err:
                    capture.error("DataLoader.__iter__", err)
            return it

        map_kind = getattr(getattr(data.dataloader, "_DatasetKind", None), "Map", 0)

        def epoch_ends(it: Any) -> bool:
            """True when a map-style iterator has yielded all its batches (the call will stop)."""
            try:
                n = it._gpudoctor_len  # an epoch's length, read once per iterator
            except AttributeError:
                try:
                    n = len(it) if getattr(it, "_dataset_kind", None) == map_kind else -1
                except Exception:
                    n = -1
                try:
                    it._gpudoctor_len = n
                except Exception:
                    return False
            try:
                return n >= 0 and it._num_yielded >= n
            except Exception:
                return False

        get_ident = threading.get_ident
        monotonic_ns = time.monotonic_ns
        acc = tracker.acc
        window = tracker.cprofile
        lp = self.loader_profile
        profiled = lp.call if lp is not None else None  # (written at the first batch after the window)

        def next_(self: Any) -> Any:
            if get_ident() == acc[BATCH_THREAD] and not acc[PHASE]:
                # the usual case: another marker ends the steps (a step is in progress, no boundary is
                # pending: that marker's hook closes the step and opens the next), the batch only adds its wait
                start = monotonic_ns()
                acc[PHASE] = IN_WAIT
                try:
                    out = (profiled(orig_next, self) if profiled is not None and (window.running or lp.dirty)
                           else orig_next(self))
                except StopIteration:
                    acc[PHASE] = 0
                    tracker.dataloader_next_exit((0, start), True, getattr(self, "_gpudoctor_epoch", None))
                    raise
                except BaseException:
                    acc[PHASE] = 0
                    raise
                acc[PHASE] = 0
                try:
                    acc[EPOCH] = self._gpudoctor_epoch  # tracker.epoch
                except AttributeError:  # an iterator made before gpudoctor's patch
                    pass
                acc[WAIT] += monotonic_ns() - start
                acc[N_BATCHES] += 1
                return out
            if not tracker.active:
                lim = tracker.limit
                if lim is None:
                    return orig_next(self)
                lim.batch_asked()  # step tracking stopped: --steps goes on counting (StepLimit)
                out = orig_next(self)
                lim.batch_returned()
                return out
            entered = tracker.dataloader_next_enter(epoch_ends(self))
            try:
                out = profiled(orig_next, self) if profiled is not None else orig_next(self)
            except StopIteration:
                tracker.dataloader_next_exit(entered, True, getattr(self, "_gpudoctor_epoch", None))
                raise
            except BaseException:
                if get_ident() == tracker.loop_thread:
                    acc[PHASE] = entered[0]  # the wait is over
                raise
            tracker.dataloader_next_exit(entered, False, getattr(self, "_gpudoctor_epoch", None))
            return out

        functools.update_wrapper(init, orig_init)
        functools.update_wrapper(iter_, orig_iter)
        functools.update_wrapper(next_, orig_next)
        DataLoader.__init__ = init
        DataLoader.__iter__ = iter_
        BaseIter.__next__ = next_
