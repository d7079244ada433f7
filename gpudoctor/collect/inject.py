"""``--verify`` trials: the changes gpudoctor makes to a run of the unmodified script.

The parent puts environment changes into the training process's environment
(:func:`child_env`) before it starts; in the training process, :class:`Injector`
applies the rest through hooks laid over the ones :mod:`gpudoctor.collect.patches`
installs (it is installed after them, so the settings capture still sees every
call with the user's ``file:line``, and records the values as changed):

- ``dataloader``: a ``DataLoader`` argument (``num_workers``, ``pin_memory``,
  ``persistent_workers``, ``prefetch_factor``), for the DataLoaders built at the named
  call site only;
- ``worker_threads``: ``torch.set_num_threads(n)`` in each worker of the DataLoader
  at the call site, after the script's own ``worker_init_fn`` (which runs first);
- ``flag``: ``torch.backends.cudnn.benchmark`` or TF32 for float32 matmuls
  (``torch.float32_matmul_precision = "high"``), set before the script starts and set
  again whenever the script writes the flag (in the API family the script used:
  the legacy ``allow_tf32`` / ``set_float32_matmul_precision`` or the newer
  ``fp32_precision``);
- ``threads``: ``torch.set_num_threads(n)`` in the training process, before the script
  and after each of its own calls (never in DataLoader workers);
- ``optimizer``: ``fused=True`` / ``foreach=True`` passed to the named ``torch.optim``
  class when it is built at the call site (its constructor checks them as usual);
- ``non_blocking``: ``non_blocking=True`` on host→device ``.to()`` / ``.cuda()`` copies
  of the tensors the DataLoader at the call site has just returned. Those batches are
  fresh memory that nothing else writes, which is what makes an asynchronous copy
  safe; copies of other tensors are left alone;
- ``skip_call``: ``torch.cuda.empty_cache()`` at the call site does nothing;
- ``env``: set by the parent (:func:`child_env`); the child only checks it arrived.

Each injection counts how often it took effect; the count goes into
``settings.json`` (``injected``), the evidence a trial really ran with the change.
Nothing here can fail the script: an error inside gpudoctor is noted and that
injection goes quiet.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any

from gpudoctor.collect.callsite import FrameClassifier
from gpudoctor.model import AppliedInjection, CallSite, Injection

KINDS = ("dataloader", "worker_threads", "flag", "threads", "optimizer", "non_blocking", "skip_call", "env")
DATALOADER_KEYS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
CUDNN_BENCHMARK = "torch.backends.cudnn.benchmark"
MATMUL_PRECISION = "torch.float32_matmul_precision"
SET_NUM_THREADS = "torch.set_num_threads"
EMPTY_CACHE = "torch.cuda.empty_cache"
FRESH_ATTR = "_gpudoctor_fresh_batch"  # on the tensors a DataLoader under ``non_blocking`` returned: its record's index


def child_env(injections: Iterable[Injection], env: MutableMapping[str, str]) -> None:
    """The parent's part: the ``env`` injections, into the training process's environment."""
    for inj in injections:
        if inj.kind == "env":
            env[inj.key] = str(inj.value)


def worker_threads_init(threads: int, user_fn: Callable[[int], Any] | None, worker_id: int) -> None:
    """A DataLoader worker's ``worker_init_fn`` under ``worker_threads``: the script's own first,
    then ``torch.set_num_threads``. Module level, so that ``spawn`` workers can unpickle it."""
    if user_fn is not None:
        user_fn(worker_id)
    import torch  # noqa: PLC0415 - in the worker

    torch.set_num_threads(threads)


def _same_site(a: CallSite | None, b: CallSite | None) -> bool:
    return a is not None and b is not None and a.file == b.file and a.line == b.line


class _Record:
    __slots__ = ("injection", "applied", "note")

    def __init__(self, injection: Injection) -> None:
        self.injection = injection
        self.applied = 0
        self.note = ""

    def add_note(self, text: str) -> None:
        if text and text not in self.note:
            self.note = f"{self.note}; {text}" if self.note else text


class _OverrideProp:
    """A data descriptor (a torch.backends flag) written as the script asks, then set back to the
    injected value."""

    def __init__(self, inner: Any, after_set: Callable[[Any, Any], None]) -> None:
        self.inner = inner
        self.after_set = after_set

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self.inner.__get__(obj, objtype)

    def __set__(self, obj: Any, value: Any) -> None:
        self.inner.__set__(obj, value)
        self.after_set(obj, value)


class Injector:
    """Applies a trial's injections in the training process (see the module docstring)."""

    def __init__(self, torch: Any, frames: FrameClassifier, injections: Iterable[Injection],
                 on_change: Callable[[], None] | None = None) -> None:
        self.torch = torch
        self.frames = frames
        self.records = [_Record(i) for i in injections]
        self.errors: list[str] = []
        self.pid = os.getpid()
        self.on_change = on_change or (lambda: None)
        self._busy = False  # re-applying a flag: our own write must not trigger the override again

    # ------------------------------------------------------------------ results

    def applied(self) -> tuple[AppliedInjection, ...]:
        out = []
        for r in self.records:
            note = r.note
            if r.applied == 0 and not note:
                note = self._never_note(r.injection)
            out.append(AppliedInjection(injection=r.injection, applied=r.applied, note=note))
        return tuple(out)

    @staticmethod
    def _never_note(inj: Injection) -> str:
        where = f" at {inj.call_site}" if inj.call_site is not None else ""
        return {
            "dataloader": f"no DataLoader was built{where}",
            "worker_threads": f"no DataLoader was built{where}",
            "optimizer": f"no {inj.target or 'optimizer'} was built{where}",
            "non_blocking": f"no host→device copy of a batch from the DataLoader{where}",
            "skip_call": f"{inj.key}() was not called{where}",
        }.get(inj.kind, "")

    def _of(self, *kinds: str) -> list[_Record]:
        return [r for r in self.records if r.injection.kind in kinds]

    def _guard(self, what: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as err:  # gpudoctor's error must not reach the script
            msg = f"{what}: {type(err).__name__}: {err}"
            if msg not in self.errors:
                self.errors.append(msg)

    # ------------------------------------------------------------------ install

    def install(self) -> list[str]:
        """Apply what applies at start and lay the hooks; returns the errors (also noted per record)."""
        for r in self.records:
            if r.injection.kind not in KINDS:
                r.add_note(f"unknown kind {r.injection.kind!r}: not applied")
        for kinds, fn in (
            (("env",), self._env),
            (("dataloader", "worker_threads", "non_blocking"), self._dataloader),
            (("flag",), self._flags),
            (("threads",), self._threads),
            (("optimizer",), self._optimizer),
            (("non_blocking",), self._non_blocking),
            (("skip_call",), self._skip_call),
        ):
            try:
                fn()
            except Exception as err:
                msg = f"{'/'.join(kinds)}: not injected ({type(err).__name__}: {err})"
                self.errors.append(msg)
                for r in self._of(*kinds):
                    r.add_note(msg)
        return self.errors

    # ------------------------------------------------------------------ env

    def _env(self) -> None:
        for r in self._of("env"):
            if os.environ.get(r.injection.key) == str(r.injection.value):
                r.applied = 1
            else:
                r.add_note(f"{r.injection.key} did not reach the training process")

    # ------------------------------------------------------------------ DataLoader

    def _dataloader(self) -> None:
        recs = self._of("dataloader", "worker_threads", "non_blocking")
        if not recs:
            return
        DataLoader = self.torch.utils.data.DataLoader
        inner = DataLoader.__init__
        sig = inspect.signature(getattr(inner, "__wrapped__", inner))
        inj = self

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            site = inj.frames.caller_site(2)
            mine = [r for r in recs if _same_site(r.injection.call_site, site)]
            if mine and not getattr(self, "_gpudoctor_injected", False):
                try:
                    args, kwargs = inj._loader_args(sig, self, args, kwargs, mine)
                    self._gpudoctor_injected = True  # a subclass calling DataLoader.__init__ again through super()
                except Exception as err:
                    for r in mine:
                        r.add_note(f"not applied: {type(err).__name__}: {err}")
            inner(self, *args, **kwargs)

        functools.update_wrapper(init, inner)
        DataLoader.__init__ = init

    def _loader_args(
        self, sig: inspect.Signature, loader: Any, args: tuple[Any, ...], kwargs: dict[str, Any], recs: list[_Record]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The DataLoader's arguments with the injections applied (counted only once all applied)."""
        ba = sig.bind(loader, *args, **kwargs)
        a = ba.arguments  # BoundArguments.args / kwargs are built from it: changes here reach the call
        for r in recs:
            inj = r.injection
            if inj.kind == "dataloader" and inj.key in DATALOADER_KEYS:
                a[inj.key] = inj.value
        workers = int(a.get("num_workers", 0) or 0)
        took: list[_Record] = []
        fresh: int | None = None
        for r in recs:
            inj = r.injection
            if inj.kind == "dataloader":
                if inj.key not in DATALOADER_KEYS:
                    r.add_note(f"{inj.key} is not a DataLoader argument gpudoctor changes")
                elif workers == 0 and inj.key in ("prefetch_factor", "persistent_workers"):
                    a.pop(inj.key, None)  # the DataLoader refuses them without workers
                    r.add_note(f"{inj.key} needs num_workers > 0: left out")
                else:
                    took.append(r)
            elif inj.kind == "worker_threads":
                if workers == 0:
                    r.add_note("no worker processes at this DataLoader")
                else:
                    a["worker_init_fn"] = functools.partial(worker_threads_init, int(inj.value), a.get("worker_init_fn"))
                    took.append(r)
            elif inj.kind == "non_blocking":
                fresh = self.records.index(r)
        new_args, new_kwargs = ba.args[1:], dict(ba.kwargs)
        for r in took:
            r.applied += 1
        if fresh is not None:
            loader._gpudoctor_fresh_batches = fresh  # its batches are tagged with this index (_non_blocking)
        self.on_change()
        return new_args, new_kwargs

    # ------------------------------------------------------------------ flags

    def _flags(self) -> None:
        for r in self._of("flag"):
            if r.injection.key == CUDNN_BENCHMARK:
                self._cudnn_benchmark(r)
            elif r.injection.key == MATMUL_PRECISION:
                self._tf32(r)
            else:
                r.add_note(f"{r.injection.key} is not a flag gpudoctor sets")

    def _reapply(self, r: _Record, what: str, fn: Callable[[], None]) -> None:
        if self._busy or os.getpid() != self.pid:
            return
        self._busy = True
        try:
            self._guard(what, fn)
            r.applied += 1
            self.on_change()
        finally:
            self._busy = False

    def _cudnn_benchmark(self, r: _Record) -> None:
        torch = self.torch
        value = bool(r.injection.value)
        cls = type(torch.backends.cudnn)
        inner = cls.__dict__["benchmark"]
        # set before the script through torch's own descriptor (under the patches' recording one), so
        # that no call site is recorded for a write the script did not make
        getattr(inner, "inner", inner).__set__(torch.backends.cudnn, value)
        r.applied += 1

        def after(obj: Any, written: Any) -> None:
            if written != value:
                r.add_note(f"the script set it to {written!r}; set back to {value!r}")
                self._reapply(r, "cudnn.benchmark", lambda: inner.__set__(obj, value))

        cls.benchmark = _OverrideProp(inner, after)

    def _tf32(self, r: _Record) -> None:
        """TF32 for float32 matmuls: ``set_float32_matmul_precision("high")`` (the fix the finding
        gives), and back to TF32 in the script's own API family whenever it turns it off."""
        torch = self.torch
        value = str(r.injection.value)
        set_prec = torch.set_float32_matmul_precision
        raw_set_prec = getattr(set_prec, "__wrapped__", set_prec)
        raw_set_prec(value)
        r.applied += 1

        def set_precision(*args: Any, **kwargs: Any) -> Any:
            out = set_prec(*args, **kwargs)
            asked = args[0] if args else kwargs.get("precision")
            if asked != value:
                r.add_note(f"the script asked for {asked!r}; set back to {value!r}")
                self._reapply(r, "set_float32_matmul_precision", lambda: raw_set_prec(value))
            return out

        functools.update_wrapper(set_precision, set_prec)
        torch.set_float32_matmul_precision = set_precision

        matmul = torch.backends.cuda.matmul
        cublas_cls = type(matmul)
        orig_setattr = cublas_cls.__setattr__

        def cublas_setattr(obj: Any, name: str, v: Any) -> Any:
            out = orig_setattr(obj, name, v)
            if name == "allow_tf32" and v is not True:
                r.add_note(f"the script set cuda.matmul.allow_tf32={v!r}; set back to True")
                self._reapply(r, "cuda.matmul.allow_tf32", lambda: orig_setattr(obj, "allow_tf32", True))
            elif name == "fp32_precision" and v != "tf32":
                r.add_note(f"the script set cuda.matmul.fp32_precision={v!r}; set back to 'tf32'")
                self._reapply(r, "cuda.matmul.fp32_precision", lambda: orig_setattr(obj, "fp32_precision", "tf32"))
            return out

        cublas_cls.__setattr__ = cublas_setattr
        generic_cls = type(torch.backends)
        inner = generic_cls.__dict__.get("fp32_precision")
        if inner is not None and hasattr(inner, "__set__"):

            def after(obj: Any, written: Any) -> None:
                if written != "tf32":
                    r.add_note(f"the script set torch.backends.fp32_precision={written!r}; matmuls set back to 'tf32'")
                    self._reapply(r, "fp32_precision", lambda: orig_setattr(matmul, "fp32_precision", "tf32"))

            generic_cls.fp32_precision = _OverrideProp(inner, after)

    # ------------------------------------------------------------------ threads

    def _threads(self) -> None:
        recs = self._of("threads")
        if not recs:
            return
        r = recs[-1]
        n = int(r.injection.value)
        torch = self.torch
        wrapped = torch.set_num_threads
        raw = getattr(wrapped, "__wrapped__", wrapped)
        raw(n)
        r.applied += 1

        def set_num_threads(*args: Any, **kwargs: Any) -> Any:
            out = wrapped(*args, **kwargs)
            asked = args[0] if args else kwargs.get("int", kwargs.get("num"))
            if os.getpid() == self.pid and asked != n:  # a DataLoader worker keeps its own (torch sets 1)
                r.add_note(f"the script asked for {asked!r} threads; set back to {n}")
                self._reapply(r, "set_num_threads", lambda: raw(n))
            return out

        functools.update_wrapper(set_num_threads, wrapped)
        torch.set_num_threads = set_num_threads

    # ------------------------------------------------------------------ optimizer

    def _optimizer(self) -> None:
        by_class: dict[str, list[_Record]] = {}
        for r in self._of("optimizer"):
            by_class.setdefault(r.injection.target, []).append(r)
        for target, recs in by_class.items():
            self._guard(f"optimizer {target}", lambda t=target, rs=recs: self._optimizer_class(t, rs))

    def _optimizer_class(self, target: str, recs: list[_Record]) -> None:
        module, _, name = target.rpartition(".")
        cls = getattr(self.torch.optim, name, None) if module == "torch.optim" else None
        if not isinstance(cls, type):
            for r in recs:
                r.add_note(f"{target} is not a torch.optim class: not applied")
            return
        inner = cls.__init__
        params = inspect.signature(getattr(inner, "__wrapped__", inner)).parameters
        for r in recs:
            if r.injection.key not in params:
                r.add_note(f"{target} takes no {r.injection.key} argument: not applied")
        usable = [r for r in recs if r.injection.key in params]
        if not usable:
            return
        inj = self

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            if type(self) is cls:
                site = inj.frames.caller_site(2)
                for r in usable:
                    if _same_site(r.injection.call_site, site):
                        key = r.injection.key
                        kwargs[key] = r.injection.value
                        other = "foreach" if key == "fused" else "fused"
                        if r.injection.value is True and kwargs.get(other) is True and other in params:
                            kwargs[other] = None  # torch refuses fused and foreach together
                        r.applied += 1
                        inj.on_change()
            inner(self, *args, **kwargs)

        functools.update_wrapper(init, inner)
        cls.__init__ = init

    # ------------------------------------------------------------------ non-blocking copies

    def _non_blocking(self) -> None:
        if not self._of("non_blocking"):
            return
        torch = self.torch
        data = torch.utils.data
        DataLoader = data.DataLoader
        BaseIter = data.dataloader._BaseDataLoaderIter
        inner_iter = DataLoader.__iter__
        inner_next = BaseIter.__next__

        def iter_(self: Any) -> Any:
            it = inner_iter(self)
            rec = getattr(self, "_gpudoctor_fresh_batches", None)
            if rec is not None:
                it._gpudoctor_fresh_batches = rec
            return it

        def tag(obj: Any, rec: int, depth: int = 0) -> None:
            if isinstance(obj, torch.Tensor):
                setattr(obj, FRESH_ATTR, rec)
            elif depth < 3 and isinstance(obj, (list, tuple)):
                for x in obj:
                    tag(x, rec, depth + 1)
            elif depth < 3 and isinstance(obj, Mapping):
                for x in obj.values():
                    tag(x, rec, depth + 1)

        def next_(self: Any) -> Any:
            out = inner_next(self)
            rec = getattr(self, "_gpudoctor_fresh_batches", None)
            if rec is not None:
                try:
                    tag(out, rec)
                except Exception:  # a batch type that takes no attributes: its copies stay as written
                    pass
            return out

        functools.update_wrapper(iter_, inner_iter)
        functools.update_wrapper(next_, inner_next)
        DataLoader.__iter__ = iter_
        BaseIter.__next__ = next_

        records = self.records
        Tensor = torch.Tensor
        device_cls = torch.device
        orig_to = Tensor.to
        orig_cuda = Tensor.cuda

        def to_device(t: Any, target: Any) -> bool:
            """A copy from host memory to a device (never device→host: the host would read too early)."""
            if isinstance(target, Tensor):
                target = target.device
            if isinstance(target, (str, int, device_cls)):
                try:
                    return device_cls(target).type != "cpu" and t.device.type == "cpu"
                except (RuntimeError, TypeError, ValueError):
                    return False
            return False

        def to(self: Any, *args: Any, **kwargs: Any) -> Any:
            rec = getattr(self, FRESH_ATTR, None)
            if (
                rec is not None
                and "non_blocking" not in kwargs
                and not any(isinstance(a, bool) for a in args)
                and to_device(self, kwargs.get("device", args[0] if args else None))
            ):
                kwargs["non_blocking"] = True
                records[rec].applied += 1
            return orig_to(self, *args, **kwargs)

        def cuda(self: Any, *args: Any, **kwargs: Any) -> Any:
            rec = getattr(self, FRESH_ATTR, None)
            if rec is not None and "non_blocking" not in kwargs and len(args) <= 1 and self.device.type == "cpu":
                kwargs["non_blocking"] = True
                records[rec].applied += 1
            return orig_cuda(self, *args, **kwargs)

        functools.update_wrapper(to, orig_to)
        functools.update_wrapper(cuda, orig_cuda)
        Tensor.to = to
        Tensor.cuda = cuda

    # ------------------------------------------------------------------ skipped calls

    def _skip_call(self) -> None:
        recs = self._of("skip_call")
        if not recs:
            return
        for r in recs:
            if r.injection.key != EMPTY_CACHE:
                r.add_note(f"{r.injection.key} is not a call gpudoctor skips")
        recs = [r for r in recs if r.injection.key == EMPTY_CACHE]
        if not recs:
            return
        torch = self.torch
        inner = torch.cuda.empty_cache
        inj = self

        def empty_cache() -> None:
            site = inj.frames.caller_site(2)
            for r in recs:
                if r.injection.call_site is None or _same_site(r.injection.call_site, site):
                    r.applied += 1
                    return None
            return inner()

        functools.update_wrapper(empty_cache, inner)
        torch.cuda.empty_cache = empty_cache
        torch.cuda.memory.empty_cache = empty_cache
