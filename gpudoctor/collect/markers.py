# Why this file is long: a measured hot path, the hooks behind the `backward` and `module` step markers,
# run at every backward() and every call of the root module: 7-7.5 µs per step for a loop of `backward()`
# alone with every hook on (`benchmarks/overhead.py --hooks-only`, median of 5 runs, 2026-11-26), and the
# root module's watch ~4-6 µs per step with its class's `forward` wrapped against 8-13 µs on nn.Module's
# hooks (measured in-process by switching patches off one at a time; docs/performance.md and
# docs/run-directory.md). The two share one watch of the root module (its search, its hot-path hooks, and
# the record of its calls GD701 reads); the root's part would move to its own module
# (collect/rootwatch.py) if it grows again.
"""The hooks behind the ``backward`` and ``module`` step markers (``steps.StepTracker``).

``backward()``: ``torch.autograd.backward`` is wrapped (``Tensor.backward`` calls it).
The outermost call on the loop's thread counts; a backward inside a backward
(reentrant checkpointing) or on another thread (the autograd engine's device
threads) is part of it.

The root module: the outermost ``nn.Module`` with parameters, found without putting a
hook on every module for the whole run. A global module hook pushes *every* module
call off ``nn.Module``'s fast path: measured here, a 300-submodule model paid 0.8 µs
per submodule call, 230 µs per forward. So the global hooks are on only while the root
is searched for: a module with parameters called while no other module with parameters
is running is a top-level call; the first module called twice at top level (a loop
body, not a shape probe in ``__init__``) becomes the root. Then the global hooks are
removed and the root is watched one of two ways; every other module stays on
``nn.Module``'s fast path. Until then, every top-level call reports to the tracker under
its module's identity.

- The root's class is the script's own (``class Net(nn.Module)``, a Hugging Face model:
  not a class of torch): its ``forward`` is wrapped on the class, and the wrapper times
  the call when ``self`` is the root object (other instances, DataParallel replicas
  included, go straight through). The root keeps ``nn.Module``'s fast path: one Python
  call more per forward, against the hooks' slow path (measured on a 20 µs forward in a
  training loop: ~4 µs instead of ~12). ``inspect.signature`` sees the original (the
  wrapper carries ``__wrapped__``); the class gets its own ``forward`` back whenever the
  root is let go, and while ``torch.jit.script`` reads it.
- Otherwise (a torch class: ``nn.Sequential``, DDP, a ``torch.compile`` wrapper, whose
  class other modules share) the root *instance* gets a forward pre-hook and a forward
  hook (no ``always_call``, which costs more: a forward that raised is noticed at the
  root's next call).

What could change the script is kept out:

- pickling / ``copy.deepcopy`` / ``torch.save(model)``: ``nn.Module.__getstate__``
  leaves gpudoctor's hooks out of the state, so a saved model carries no reference to
  gpudoctor;
- ``torch.jit.script``: the hooks are taken off the root while it is scripted;
- ``torch.compile``: every hook returns at once while dynamo traces
  (``torch.compiler.is_compiling()``), and the global hooks are removed before any
  compiled call; a module compiled as ``torch.compile(model)`` is hooked on the
  returned wrapper, which runs eagerly; one compiled in place (``model.compile()``)
  is not watched (its hooks would run inside the graph): the forward phase is then
  not measured and ``module`` cannot mark steps;
- ``nn.DataParallel`` replicas carry the root's hooks: only the root object counts.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from typing import Any

from gpudoctor.collect.steps import (
    BACKWARD,
    BWD_THREAD,
    DUE,
    END,
    FAST_LAST,
    FORWARD,
    IN_BACKWARD,
    IN_FORWARD,
    INDEX,
    N_BWD,
    N_FIGURES,
    PHASE,
    ROOT_CALLS,
    START,
    TRAIN_THREAD,
    StepTracker,
    StopAfterSteps,
)
from gpudoctor.collect.steps.limit import limited_call
from gpudoctor.model import CallSite

_TRAINING = ("optimizer", "backward")  # markers under which the root's calls mark nothing
_UNTIMED = ("untimed",)  # a root hook's token for a call made while step tracking is off
_TIMED, _UNTIMED_TOP = 1, 2  # a top-level call while the root is searched for: step tracking on, off

_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_forward_hooks_always_called",
    "_forward_hooks_with_kwargs",
    "_forward_pre_hooks_with_kwargs",
)


def compiling_probe(torch: Any) -> Callable[[], bool]:
    """A function that is True while dynamo traces the code that calls it, False when it runs:
    ``torch.compiler.is_dynamo_compiling`` (one call; ``is_compiling``, two, where it is missing),
    else a function saying False. Every hook asks it first: dynamo folds it to True and traces
    nothing of gpudoctor's into a graph."""
    compiler = getattr(torch, "compiler", None)
    for name in ("is_dynamo_compiling", "is_compiling"):
        fn = getattr(compiler, name, None)
        if callable(fn):
            return fn
    return lambda: False


def _carries_graph(result: Any) -> bool:
    """Does a module's output (a tensor, or the first tensor of a tuple/list/dict) need grad?"""
    for _ in range(3):  # (output, hidden) tuples, {"logits": …} dicts: look one or two levels in
        if isinstance(result, (tuple, list)):
            result = result[0] if result else None
        elif isinstance(result, dict):
            result = next(iter(result.values()), None)
        else:
            break
    return bool(getattr(result, "requires_grad", False))


def _failed(result: Any) -> bool:
    """In an always-called forward hook: did the forward raise? (torch then passes no result
    and calls the hook from its ``except`` block)."""
    return result is None and sys.exc_info()[0] is not None


class BackwardWatch:
    def __init__(self, torch: Any, tracker: StepTracker, on_error: Callable[[str, BaseException], None]) -> None:
        self.torch = torch
        self.tracker = tracker
        self.on_error = on_error

    def install(self) -> None:
        autograd = self.torch.autograd
        orig = autograd.backward
        tracker = self.tracker
        on_error = self.on_error
        is_compiling = compiling_probe(self.torch)
        get_ident = threading.get_ident
        depth = [0]

        monotonic_ns = time.monotonic_ns
        acc = tracker.acc
        buf_extend = tracker.buf_extend
        zero = (0,) * N_FIGURES

        def report(ok: bool, t: int) -> None:
            try:
                tracker.backward_done(ok, t)
            except StopAfterSteps:
                if ok:
                    raise
            except Exception as err:  # gpudoctor's error never reaches the script
                on_error("backward() hook", err)

        def slow(args: Any, kwargs: Any) -> Any:
            """Every case but the training loop's backward() outside any other phase (below)."""
            if not tracker.active and not is_compiling():  # --steps goes on counting (StepLimit)
                return limited_call(tracker.limit, depth, lambda: orig(*args, **kwargs), "backward")
            if depth[0] or acc[PHASE] == IN_BACKWARD or is_compiling():
                return orig(*args, **kwargs)  # a backward inside a backward (reentrant checkpointing) is part of it
            loop = tracker.loop_thread
            if loop is not None and get_ident() != loop:
                return orig(*args, **kwargs)
            if not tracker.started:
                try:
                    tracker.open_first()
                except Exception as err:
                    on_error("backward() hook", err)
                    return orig(*args, **kwargs)
            token = tracker.phase_start(BACKWARD)
            depth[0] = 1
            try:
                out = orig(*args, **kwargs)
            except BaseException:
                depth[0] = 0
                report(False, tracker.phase_end(token, BACKWARD))
                raise
            depth[0] = 0
            report(True, tracker.phase_end(token, BACKWARD))
            return out

        def end_step(t: int) -> None:
            """backward() marks the steps: the one in progress ends at ``t`` (not the usual way)."""
            try:
                if tracker.active:
                    tracker._end_marked(t)
            except StopAfterSteps:
                raise
            except Exception as err:
                on_error("backward() hook", err)

        def backward(*args: Any, **kwargs: Any) -> Any:
            if acc[PHASE] or is_compiling():
                return slow(args, kwargs)
            ident = get_ident()
            if ident != acc[TRAIN_THREAD]:
                return slow(args, kwargs)
            # the usual training loop, no other phase in progress (inlined: the hot path; see the
            # "Phases" of gpudoctor.collect.steps)
            start = monotonic_ns()
            acc[PHASE] = IN_BACKWARD
            try:
                out = orig(*args, **kwargs)
            finally:
                acc[PHASE] = 0
                end = monotonic_ns()
                acc[BACKWARD] += end - start
            acc[N_BWD] += 1
            if ident == acc[BWD_THREAD]:  # backward() marks the steps: this one ends here
                if acc[INDEX] < acc[FAST_LAST] and end < acc[DUE]:
                    # StepTracker.fast_close, inlined (a step is in progress)
                    acc[END] = end
                    buf_extend(acc)
                    acc[:N_FIGURES] = zero
                    acc[INDEX] += 1
                    acc[START] = monotonic_ns()
                else:
                    end_step(end)
            return out

        functools.update_wrapper(backward, orig)
        autograd.backward = backward


class RootModuleWatch:
    def __init__(
        self,
        torch: Any,
        tracker: StepTracker,
        on_error: Callable[[str, BaseException], None],
        site_of: Callable[[Any], CallSite | None] | None = None,
    ) -> None:
        self.torch = torch
        self.tracker = tracker
        self.on_error = on_error
        # the user's file:line above a frame (``callsite.FrameClassifier``), for where an evaluation calls the model
        self.site_of = site_of
        self.is_compiling = compiling_probe(torch)
        self.searching = False
        self.root_ref: weakref.ref[Any] | None = None
        self._global: list[Any] = []  # global hook handles while searching
        self._hooks: list[Any] = []  # hook handles on the root instance
        self._wrapped: tuple[type, Any] | None = None  # (root's class, what its own forward was: None if inherited)
        self._stack: list[int] = []  # while searching: each module call in progress: _TIMED or _UNTIMED_TOP top-level
        # with parameters (step tracking on or off as it began), else 0
        self._top = 0  # top-level calls with parameters in progress (0 or 1)
        self._seen: dict[int, int] = {}  # while searching: top-level calls by id(module)
        # while searching, by top-level module: [calls made while step tracking was off (the tracker counts the
        # others), those whose output carried a graph, calls in eval mode, those whose output carried a graph,
        # the user's file:line of the first of those]; the root's become the tracker's when it is adopted
        self._counts: dict[int, list[Any]] = {}
        self._pid = os.getpid()  # a forked DataLoader worker is not the training process
        self._root_class = ""  # the class of the root last adopted (its calls carry over to a new root of it)
        self.gave_up = ""  # why the root is not watched

    # ------------------------------------------------------------------ set-up

    def install(self) -> None:
        self._arm()
        self._keep_out_of_pickles()
        self._keep_out_of_jit_script()

    def root(self) -> Any:
        return self.root_ref() if self.root_ref is not None else None

    def _arm(self) -> None:
        """Search for the root: global hooks until a module is called twice at top level."""
        if self.searching or self.gave_up:
            return
        mm = self.torch.nn.modules.module
        self._stack, self._top, self._seen, self._counts = [], 0, {}, {}
        pre = mm.register_module_forward_pre_hook(self._search_pre)
        try:
            post = mm.register_module_forward_hook(self._search_post, always_call=True)
        except TypeError:  # an older torch: no always_call (a forward that raises unbalances the search)
            post = mm.register_module_forward_hook(self._search_post)
        self._global = [pre, post]
        self.searching = True
        self.tracker.forward_watched = True  # the search reports every top-level call

    def _disarm(self) -> None:
        for h in self._global:
            h.remove()
        self._global = []
        self.searching = False
        self._stack, self._top = [], 0
        self.tracker.forward_watched = bool(self._hooks or self._wrapped)

    def _hook_root(self, module: Any) -> None:
        self._unhook()
        ref = weakref.ref(module, self._root_gone)
        if self._wrap_class_forward(module, ref):
            self.root_ref = ref
            self._adopt(module)
            self.tracker.forward_watched = True
            return
        pre, post = self._root_hooks(ref, id(module))
        try:
            # no always_call: it costs every call; a forward that raises is noticed at the next call
            handles = [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
        except Exception as err:  # a ScriptModule, say: no Python hooks
            self.gave_up = f"the root module {type(module).__qualname__} takes no hooks ({type(err).__name__})"
            self.tracker.forward_watched = False
            return
        self._hooks = handles
        self.root_ref = ref
        self._adopt(module)
        self.tracker.forward_watched = True

    def _adopt(self, module: Any) -> None:
        """The tracker's root becomes ``module``, with its calls made while it was searched for. A root of
        the class of the one before (a model rebuilt, or reloaded with ``torch.load`` for a last test)
        carries that one's calls on: the manifest's counts, all calls and those in eval mode, then cover
        the same calls (the calls were the new object's alone, the eval-mode calls every object's: "10
        calls, 19 of them in eval mode")."""
        tr = self.tracker
        name = type(module).__qualname__
        same = bool(self._root_class) and name == self._root_class
        before = (tr.root_calls, tr.root_grad_calls, tr.eval_calls, tr.eval_grad_calls, tr.eval_grad_site)
        tr.adopt_root(id(module), name)  # its calls while step tracking was on
        calls, grads, evals, eval_grads, site = self._counts.pop(id(module), (0, 0, 0, 0, None))
        self._counts = {}
        tr.root_calls += calls
        tr.root_grad_calls += grads
        if same:
            tr.root_calls += before[0]
            tr.root_grad_calls += before[1]
            tr.eval_calls, tr.eval_grad_calls = before[2] + evals, before[3] + eval_grads
            tr.eval_grad_site = before[4] if before[4] is not None else site
        else:
            tr.eval_calls, tr.eval_grad_calls, tr.eval_grad_site = evals, eval_grads, site
        self._root_class = name

    def _root_hooks(self, ref: weakref.ref[Any], key: int) -> tuple[Callable[..., None], Callable[..., None]]:
        """The root instance's pre-hook and forward hook: the hot path of every call of
        the model, so everything they read is bound here."""
        tracker = self.tracker
        is_compiling = self.is_compiling
        get_ident = threading.get_ident
        acc = tracker.acc
        # a call of the root in progress: its phase token (StepTracker.phase_start), None when none is.
        # A torch class's forward does not call itself, so a call in progress at a pre-hook raised (no
        # forward hook ran: there is no always_call, which costs every call) and the script went on:
        # forgotten, and the phase that enclosed it is the one in progress again
        entry: list[Any] = [None]
        watch = self

        def pre(module: Any, args: Any) -> None:
            if is_compiling() or module is not ref():
                return  # DataParallel replicas carry the hooks: only the root counts
            loop = tracker.loop_thread
            if loop is not None and get_ident() != loop:
                return
            if not tracker.active:  # step tracking is off: the call is still counted (see _count_untimed)
                entry[0] = _UNTIMED
                return
            if not tracker.started:
                tracker.open_first()
            stale = entry[0]
            if stale is not None and stale is not _UNTIMED:
                acc[PHASE] = stale[0]
            entry[0] = tracker.phase_start(FORWARD)

        def post(module: Any, args: Any, result: Any) -> None:
            token = entry[0]
            if token is None or is_compiling() or module is not ref():
                if not tracker.active and tracker.limit is not None and token is None and module is ref() and not is_compiling():
                    tracker.limit.mark("module", key)  # step tracking stopped: --steps goes on counting (StepLimit)
                return
            loop = tracker.loop_thread
            if loop is not None and get_ident() != loop:
                return
            entry[0] = None
            if token is _UNTIMED:
                watch._count_untimed(module, result)
                if tracker.limit is not None:  # step tracking stopped: --steps goes on counting (StepLimit)
                    tracker.limit.mark("module", key)
                return
            t = tracker.phase_end(token, FORWARD)
            if not module.training or not tracker.first_grad_site_seen:  # an evaluation's call (see _note_call)
                watch._note_call(module, result)
            if tracker.source in _TRAINING:
                tracker.root_calls += 1  # a training loop: the forward marks nothing, only its time and count are kept
                return
            try:
                tracker.forward_done(True, key, _carries_graph(result), t)
            except StopAfterSteps:
                raise
            except Exception as err:
                watch._fail(err)

        return pre, post

    def _wrap_class_forward(self, module: Any, ref: weakref.ref[Any]) -> bool:
        """Wrap the forward of the root's class when the class is the script's own (see the
        module docstring); False to use hooks instead."""
        cls = type(module)
        if (cls.__module__ or "").split(".")[0] == "torch" or isinstance(module, self.torch.jit.ScriptModule):
            return False
        orig = getattr(cls, "forward", None)
        if not isinstance(orig, types.FunctionType) or getattr(orig, "_gpudoctor_root", False):
            return False
        own = cls.__dict__.get("forward")
        wrapper = self._forward_wrapper(orig, ref, id(module))
        try:
            cls.forward = wrapper
        except (TypeError, AttributeError):
            return False
        self._wrapped = (cls, own)
        return True

    def _forward_wrapper(self, orig: Callable[..., Any], ref: weakref.ref[Any], key: int) -> Callable[..., Any]:
        """The root class's ``forward``, timed when called on the root object: the hot path of
        every call of the model, so everything it reads is bound here."""
        tracker = self.tracker
        is_compiling = self.is_compiling
        get_ident = threading.get_ident
        monotonic_ns = time.monotonic_ns
        depth = [0]  # calls of the root in progress (a root that calls itself counts once)
        acc = tracker.acc
        watch = self

        def slow(self: Any, args: Any, kwargs: Any) -> Any:
            """Every case but the training loop's call of the root outside any other phase (below)."""
            if not tracker.active and self is ref() and not is_compiling() and not depth[0]:
                # step tracking is off: --steps goes on counting (StepLimit), and the call is still counted
                # for the evaluation's figures (_count_untimed)
                loop = tracker.loop_thread
                result = limited_call(tracker.limit, depth, lambda: orig(self, *args, **kwargs), "module", key)
                if loop is None or get_ident() == loop:
                    watch._count_untimed(self, result)
                return result
            if depth[0] or acc[PHASE] == IN_FORWARD or self is not ref() or is_compiling() or not tracker.active:
                return orig(self, *args, **kwargs)  # other instances (DataParallel replicas) go through
            loop = tracker.loop_thread
            if loop is not None and get_ident() != loop:
                return orig(self, *args, **kwargs)
            if not tracker.started:
                tracker.open_first()
            token = tracker.phase_start(FORWARD)
            depth[0] = 1
            try:
                result = orig(self, *args, **kwargs)
            except BaseException:
                depth[0] = 0
                tracker.phase_end(token, FORWARD)  # the call raised: its time counts, it marks nothing
                raise
            depth[0] = 0
            t = tracker.phase_end(token, FORWARD)
            if not self.training or not tracker.first_grad_site_seen:  # an evaluation's call (see _note_call)
                watch._note_call(self, result)
            try:
                tracker.forward_done(True, key, _carries_graph(result), t)
            except StopAfterSteps:
                raise
            except Exception as err:
                watch._fail(err)
            return result

        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            if (acc[PHASE] or is_compiling() or self is not ref() or get_ident() != acc[TRAIN_THREAD]
                    or not self.training):  # in eval mode: an evaluation inside a training run (slow: _note_call)
                return slow(self, args, kwargs)
            # a training loop, no other phase in progress: the forward marks nothing, only its time and
            # count are kept (inlined: the hot path; see the "Phases" of gpudoctor.collect.steps)
            start = monotonic_ns()
            acc[PHASE] = IN_FORWARD
            try:
                result = orig(self, *args, **kwargs)
            finally:
                acc[PHASE] = 0
                acc[FORWARD] += monotonic_ns() - start
            acc[ROOT_CALLS] += 1
            return result

        functools.update_wrapper(forward, orig)
        forward._gpudoctor_root = True  # type: ignore[attr-defined]
        return forward

    def _unhook(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._wrapped is not None:
            cls, own = self._wrapped
            self._wrapped = None
            try:
                if own is None:
                    del cls.forward  # it was inherited: the class gets it from its base again
                else:
                    cls.forward = own
            except (TypeError, AttributeError):
                pass

    def _root_gone(self, ref: Any) -> None:
        """The root was garbage-collected (a model built anew): search again."""
        if ref is self.root_ref:
            self.root_ref = None
            self._hooks = []
            self._unhook()  # its class's own forward back
            self.tracker.forward_watched = False
            if self.tracker.active or os.getpid() == self._pid:  # counted when step tracking is off too
                self._arm()

    # ------------------------------------------------------------------ the search

    def _loop_thread(self) -> bool:
        loop = self.tracker.loop_thread
        return loop is None or threading.get_ident() == loop

    def _search_pre(self, module: Any, args: Any) -> None:
        if not self.searching or self.is_compiling() or not self._loop_thread():
            return
        active = self.tracker.active
        if not active and os.getpid() != self._pid:
            return
        try:
            top = self._top == 0 and next(module.parameters(), None) is not None
            self._stack.append((_TIMED if active else _UNTIMED_TOP) if top else 0)
            if top:
                self._top = 1
                if active:
                    self.tracker.forward_enter()
        except Exception as err:
            self._fail(err)

    def _search_post(self, module: Any, args: Any, result: Any) -> None:
        if not self.searching or self.is_compiling() or not self._stack or not self._loop_thread():
            return
        try:
            how = self._stack.pop()
            if not how:
                return
            self._top = 0
            key = id(module)
            n = self._seen.get(key, 0) + 1
            if n >= 2:  # a loop body: the root
                self._disarm()
                self._hook_root(module)
            elif len(self._seen) < 10_000:
                self._seen[key] = n
        except Exception as err:
            self._fail(err)
            return
        if how == _TIMED:
            self._report(not _failed(result), key, module, result)
        elif not _failed(result):
            self._count_untimed(module, result)

    # ------------------------------------------------------------------ reporting

    def _note_call(self, module: Any, result: Any) -> None:
        """A call of the root (or, while it is searched for, of a top-level module) returned outside the
        training loop's inline path: count it when the module was in eval mode (``module.eval()``: an
        evaluation, inside a run that trains or not), and keep the user's ``file:line`` of the first
        call whose output carried an autograd graph, in eval mode and at all (GD701 points there).

        The root's eval-mode calls are the tracker's (``eval_calls`` beside ``root_calls``: the same
        module's calls); another top-level module's are kept by module until the root is adopted
        (:meth:`_adopt`), so that a module that never becomes the root counts nowhere."""
        tracker = self.tracker
        try:
            grad = _carries_graph(result)
            eval_mode = not getattr(module, "training", True)
            root = module is self.root()
            own = None if root else self._own_counts(module)
            if eval_mode:
                if root:
                    tracker.eval_calls += 1
                    tracker.eval_grad_calls += grad
                elif own is not None:
                    own[2] += 1
                    own[3] += grad
            if not grad or self.site_of is None:
                if grad:
                    tracker.first_grad_site_seen = True
                return
            if not tracker.first_grad_site_seen:
                tracker.first_grad_site_seen = True
                tracker.first_grad_site = self.site_of(sys._getframe(1))
            if eval_mode and root and tracker.eval_grad_site is None:
                tracker.eval_grad_site = self.site_of(sys._getframe(1))
            elif eval_mode and own is not None and own[4] is None:
                own[4] = self.site_of(sys._getframe(1))
        except Exception as err:  # never the script's failure: the record is only incomplete
            tracker.first_grad_site_seen = True
            self.on_error("root module eval record", err)

    def _own_counts(self, module: Any) -> list[Any] | None:
        """The counts kept for a top-level module while the root is searched for (None past 10,000 modules)."""
        own = self._counts.get(id(module))
        if own is None and len(self._counts) < 10_000:
            own = self._counts[id(module)] = [0, 0, 0, 0, None]
        return own

    def _count_untimed(self, module: Any, result: Any) -> None:
        """A call of the root (or, while it is searched for, of a top-level module) while step tracking is
        off (it stopped: ``--steps`` reached, or an error in gpudoctor's bookkeeping): not timed, and it
        marks no step, but counted as every other call is, so that the manifest's calls and eval-mode calls
        still cover the whole run (GD701 reads them)."""
        tracker = self.tracker
        try:
            grad = _carries_graph(result)
            if module is self.root():
                tracker.root_calls += 1
                tracker.root_grad_calls += grad
            else:
                own = self._own_counts(module)
                if own is not None:
                    own[0] += 1
                    own[1] += grad
        except Exception as err:
            self.on_error("root module call count", err)
            return
        if not getattr(module, "training", True) or not tracker.first_grad_site_seen:
            self._note_call(module, result)

    def _report(self, ok: bool, key: int, module: Any, result: Any) -> None:
        try:
            if ok:
                self._note_call(module, result)
            self.tracker.forward_exit(ok, key, ok and _carries_graph(result))
        except StopAfterSteps:
            if ok:
                raise
        except Exception as err:
            self._fail(err)

    def _fail(self, err: BaseException) -> None:
        self.on_error("root module hook", err)
        self.gave_up = f"the root-module hook failed ({type(err).__name__}: {err})"
        self._disarm()
        self._unhook()
        self.tracker.forward_watched = False

    # ------------------------------------------------------------------ torch.compile, pickling, scripting

    def compiled(self, target: Any, result: Any) -> None:
        """The script called ``torch.compile(target)`` (before any compiled call runs)."""
        nn = self.torch.nn
        if self.searching:
            self._disarm()  # global hooks would be traced into every graph
        module = target if isinstance(target, nn.Module) else getattr(target, "__self__", None)
        root = self.root()
        if isinstance(result, nn.Module) and isinstance(target, nn.Module):
            if root is None or root is target:
                self._hook_root(result)  # the wrapper runs eagerly around the graph
        elif isinstance(module, nn.Module) and root is module:
            self._unhook()  # compiled in place: its hooks would run inside the graph
            self.root_ref = None
            self.tracker.forward_watched = False
            self.gave_up = f"the root module {type(module).__qualname__} was compiled in place (module.compile())"
        if self.root_ref is None and not self._hooks and not self.gave_up:
            self.gave_up = "torch.compile ran before the root module was found"

    def _keep_out_of_pickles(self) -> None:
        Module = self.torch.nn.Module
        orig = Module.__getstate__
        watch = self

        def __getstate__(self: Any) -> Any:
            state = orig(self)
            if watch._hooks and self is watch.root() and isinstance(state, dict):
                ids = {h.id for h in watch._hooks}
                for key in _HOOK_DICTS:
                    d = state.get(key)
                    if d and any(i in d for i in ids):
                        state[key] = type(d)((k, v) for k, v in d.items() if k not in ids)
            return state

        functools.update_wrapper(__getstate__, orig)
        Module.__getstate__ = __getstate__

    def _keep_out_of_jit_script(self) -> None:
        jit = self.torch.jit
        orig = jit.script
        watch = self
        Module = self.torch.nn.Module

        def script(obj: Any, *args: Any, **kwargs: Any) -> Any:
            root = watch.root()
            if root is None or not (watch._hooks or watch._wrapped) or not isinstance(obj, Module):
                return orig(obj, *args, **kwargs)
            try:
                inside = any(m is root for m in obj.modules())
            except Exception:
                inside = False
            if not inside:
                return orig(obj, *args, **kwargs)
            watch._unhook()
            try:
                return orig(obj, *args, **kwargs)
            finally:
                if watch.root() is root:
                    watch._hook_root(root)

        functools.update_wrapper(script, orig)
        jit.script = script
