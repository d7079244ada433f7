"""The hooks of torch's settings: what the script sets, and where, for the settings capture.

:class:`SettingsHooks` is the part of :class:`~gpudoctor.collect.patches.Patcher` (its base class)
that wraps the settings a script makes and notes each with its call site: ``autocast``, the cuDNN /
cuBLAS / TF32 switches and ``set_float32_matmul_precision``, ``use_deterministic_algorithms``,
``set_num_threads``, ``DataParallel`` / ``DistributedDataParallel``, ``torch.compile`` (and from then
on what it compiles: ``compile_watch``) and ``torch.cuda.empty_cache``. It also holds the safety net
every patch of ``Patcher``'s goes through (:meth:`SettingsHooks._safe`: gpudoctor's own error never
reaches the script) and the call site of a patch's caller (:meth:`SettingsHooks._site`).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

from gpudoctor.collect.callsite import FrameClassifier
from gpudoctor.collect.compile_watch import CompileWatch, monotonic_clock
from gpudoctor.collect.markers import RootModuleWatch
from gpudoctor.collect.settings_capture import SettingsCapture
from gpudoctor.collect.steps import StepTracker, StopAfterSteps

# autocast objects made: all looked at up to here, then one in this many (SettingsHooks._autocast)
AUTOCAST_ALL = 256
AUTOCAST_EVERY = 17


def _recording_prop(inner: Any, note: Callable[[], None]) -> Any:
    """A data descriptor of torch's module classes that notes the call site of every set.

    ``torch.backends.cudnn.enabled`` is read by every normalization layer's call (``F.layer_norm``,
    ``F.batch_norm`` …), so a read must cost what it did: where the descriptor is a plain Python
    object (torch's ``ContextProp``), the copy is of a subclass that overrides ``__set__`` only and
    keeps torch's own ``__get__``; else a wrapper (one call more per read)."""
    base = type(inner)
    try:
        def __set__(self: Any, obj: Any, value: Any) -> None:
            base.__set__(self, obj, value)
            note()

        sub = type(base.__name__, (base,), {"__set__": __set__, "__module__": base.__module__,
                                            "__qualname__": base.__qualname__})
        prop = object.__new__(sub)
        prop.__dict__.update(inner.__dict__)
        return prop
    except (TypeError, AttributeError):  # a C descriptor, __slots__: no subclass copy
        return _RecordingProp(inner, note)


class _RecordingProp:
    """Wraps a data descriptor of torch's module classes: set as before, then note the call site."""

    def __init__(self, inner: Any, note: Callable[[], None]) -> None:
        self.inner = inner
        self.note = note

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self.inner.__get__(obj, objtype)

    def __set__(self, obj: Any, value: Any) -> None:
        self.inner.__set__(obj, value)
        self.note()


class SettingsHooks:
    """``Patcher``'s safety net and its hooks of the script's settings (its attributes are set by
    ``Patcher.__init__``)."""

    torch: Any
    capture: SettingsCapture
    tracker: StepTracker
    frames: FrameClassifier
    root_watch: RootModuleWatch | None

    def _safe(self, what: str, fn: Callable[[], Any]) -> None:
        """Run a note; gpudoctor's own error never reaches the script."""
        if not self.capture.active:
            return
        try:
            fn()
        except StopAfterSteps:
            raise
        except Exception as err:
            self.capture.error(what, err)

    def _site(self) -> Any:
        # frame 0: _site, 1: the patch, 2: its caller (torch frames are skipped after that)
        return self.frames.caller_site(2)

    def _autocast(self) -> None:
        torch = self.torch
        AC = torch.amp.autocast_mode.autocast
        deprecated = tuple(
            c for c in (getattr(getattr(torch, "cuda", None), "amp", None), getattr(getattr(torch, "cpu", None), "amp", None))
            if c is not None and isinstance(getattr(c, "autocast", None), type)
        )
        deprecated_classes = tuple(c.autocast for c in deprecated)
        capture = self.capture
        patcher = self
        frames = self.frames
        orig_init = AC.__init__
        get_frame = sys._getframe
        # An AMP loop makes an autocast at every step. The first AUTOCAST_ALL of a run are all looked at,
        # then one in AUTOCAST_EVERY (a prime: sites that take turns are all looked at), so a site that
        # recurs is noted; each look is a short walk up the stack and a set lookup of what was noted
        # already: (the user's frame's code, by id, and instruction, the class, device, dtype, enabled).
        # Measured per step in a training loop whose autocast is in the module's own code: a look 4-5 µs
        # (keyed by the code object itself, 21 µs: its hash is not cached, it hashes the bytecode of every
        # function the module defines; by the frame's f_lineno, 10 µs: worked out from the line table)
        seen: set[tuple[Any, ...]] = set()
        pinned: list[Any] = []  # the code objects in seen's keys: kept alive, their ids are not reused
        calls = [0]

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(self, *args, **kwargs)
            n = calls[0] = calls[0] + 1
            if (n > AUTOCAST_ALL and n % AUTOCAST_EVERY) or not capture.active:
                return
            try:
                f = frames.user_frame(get_frame(1))
                key = (None if f is None else id(f.f_code), None if f is None else f.f_lasti, type(self),
                       getattr(self, "device", ""), getattr(self, "fast_dtype", ""), getattr(self, "_enabled", True))
                if key in seen:
                    return
                seen.add(key)
                if f is not None:
                    pinned.append(f.f_code)
                site = frames.site(f) if f is not None else None
            except Exception:
                site = patcher._site()
            patcher._safe(
                "autocast",
                lambda: capture.note_autocast(self, site, isinstance(self, deprecated_classes)),
            )

        functools.update_wrapper(init, orig_init)
        AC.__init__ = init

    def _flags(self) -> None:
        torch = self.torch
        capture = self.capture
        patcher = self
        frames = self.frames

        def note(name: str) -> Callable[[], None]:
            # descriptor __set__ is called from the user's assignment: frame 2 is that line
            return lambda: patcher._safe(name, lambda: capture.note_flag(name, frames.caller_site(3)))

        cudnn_cls = type(torch.backends.cudnn)
        for attr in ("enabled", "benchmark", "deterministic", "allow_tf32", "fp32_precision", "benchmark_limit"):
            inner = cudnn_cls.__dict__.get(attr)
            if inner is not None and hasattr(inner, "__set__"):
                setattr(cudnn_cls, attr, _recording_prop(inner, note(f"torch.backends.cudnn.{attr}")))
        generic_cls = type(torch.backends)
        inner = generic_cls.__dict__.get("fp32_precision")
        if inner is not None and hasattr(inner, "__set__"):
            generic_cls.fp32_precision = _recording_prop(inner, note("torch.backends.fp32_precision"))

        cublas_cls = type(torch.backends.cuda.matmul)
        orig_setattr = cublas_cls.__setattr__

        def cublas_setattr(self: Any, name: str, value: Any) -> Any:
            out = orig_setattr(self, name, value)
            patcher._safe(name, lambda: capture.note_flag(f"torch.backends.cuda.matmul.{name}", frames.caller_site(2)))
            return out

        cublas_cls.__setattr__ = cublas_setattr

        fp32_cls = type(torch.backends.cudnn.conv)
        orig_fp32_setattr = fp32_cls.__setattr__

        def fp32_setattr(self: Any, name: str, value: Any) -> Any:
            out = orig_fp32_setattr(self, name, value)
            if name == "fp32_precision":
                backend = getattr(self, "backend", "")
                op = getattr(self, "op", "")
                prefix = "torch.backends.cudnn" if backend == "cuda" else f"torch.backends.{backend}"
                patcher._safe(name, lambda: capture.note_flag(f"{prefix}.{op}.fp32_precision", frames.caller_site(2)))
            return out

        fp32_cls.__setattr__ = fp32_setattr

        for fn_name, flag in (
            ("set_float32_matmul_precision", "torch.float32_matmul_precision"),
            ("use_deterministic_algorithms", "torch.use_deterministic_algorithms"),
            ("set_num_threads", "torch.set_num_threads"),
            ("set_num_interop_threads", "torch.set_num_interop_threads"),
        ):
            orig = getattr(torch, fn_name)
            setattr(torch, fn_name, self._after_call(orig, flag))

    def _after_call(self, orig: Callable[..., Any], flag: str) -> Callable[..., Any]:
        capture = self.capture
        patcher = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            site = patcher._site()
            patcher._safe(flag, lambda: capture.note_flag(flag, site))
            return out

        try:
            functools.update_wrapper(wrapper, orig)
        except (AttributeError, TypeError):
            pass
        return wrapper

    def _data_parallel(self) -> None:
        DP = self.torch.nn.DataParallel
        self._wrap_module_init(DP, "DataParallel", ("device_ids", "output_device", "dim"))

    def _ddp(self) -> None:
        torch = self.torch
        if not torch.distributed.is_available():
            raise RuntimeError("torch.distributed is not available in this build")
        DDP = torch.nn.parallel.DistributedDataParallel
        self._wrap_module_init(
            DDP,
            "DistributedDataParallel",
            (
                "device_ids", "output_device", "broadcast_buffers", "bucket_cap_mb",
                "find_unused_parameters", "gradient_as_bucket_view", "static_graph",
            ),
            ddp=True,
        )

    def _wrap_module_init(self, cls: type, kind: str, keys: tuple[str, ...], ddp: bool = False) -> None:
        orig = cls.__init__
        sig = inspect.signature(orig)
        capture = self.capture
        patcher = self
        torch = self.torch

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            site = patcher._site()

            def note() -> None:
                ba = sig.bind(self, *args, **kwargs)
                ba.apply_defaults()
                options = {k: ba.arguments.get(k) for k in keys if k in ba.arguments}
                if ddp:
                    pg = ba.arguments.get("process_group")
                    try:
                        options["backend"] = str(torch.distributed.get_backend(pg))
                        options["world_size"] = int(torch.distributed.get_world_size(pg))
                    except Exception:
                        pass
                inner = getattr(self, "module", None)
                capture.note_wrapper(kind, site, type(inner).__qualname__ if inner is not None else "", options,
                                     obj=self if ddp else None)

            patcher._safe(kind, note)

        functools.update_wrapper(init, orig)
        cls.__init__ = init

    def _compile(self) -> None:
        torch = self.torch
        orig = torch.compile
        sig = inspect.signature(orig)
        capture = self.capture
        patcher = self
        tracker = self.tracker

        def a_model(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            try:
                return sig.bind_partial(*args, **kwargs).arguments.get("model")
            except TypeError:
                return None

        def compile_(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            site = patcher._site()

            def note() -> None:
                ba = sig.bind_partial(*args, **kwargs)
                a = ba.arguments
                model = a.get("model")
                owner = getattr(model, "__self__", None)  # nn.Module.compile passes a bound method
                if isinstance(owner, torch.nn.Module):
                    name = type(owner).__qualname__
                elif isinstance(model, torch.nn.Module):
                    name = type(model).__qualname__
                elif model is not None:
                    name = getattr(model, "__qualname__", type(model).__qualname__)
                else:
                    name = ""
                options = {
                    "mode": a.get("mode"),
                    "backend": a.get("backend") or "inductor",
                    "fullgraph": bool(a.get("fullgraph", False)),
                    "dynamic": a.get("dynamic"),
                    "disable": bool(a.get("disable", False)),
                }
                if a.get("options"):
                    options["options"] = sorted(str(k) for k in a["options"])
                capture.note_wrapper("torch.compile", site, name, options)
                if capture.compile_watch is None:  # compilations, recompilations, graph breaks: from now on
                    watch = CompileWatch(torch, lambda: tracker.index, monotonic_clock(tracker.t0), capture.mark_dirty)
                    capture.compile_watch = watch
                    watch.install()

            patcher._safe("torch.compile", note)
            watch = patcher.root_watch
            if watch is not None and tracker.active:
                patcher._safe("torch.compile", lambda: watch.compiled(a_model(args, kwargs), out))
            return out

        functools.update_wrapper(compile_, orig)
        torch.compile = compile_

    def _empty_cache(self) -> None:
        torch = self.torch
        orig = torch.cuda.memory.empty_cache
        capture = self.capture
        patcher = self

        def empty_cache() -> None:
            site = patcher._site()
            patcher._safe("empty_cache", lambda: capture.note_empty_cache(site))
            return orig()

        functools.update_wrapper(empty_cache, orig)
        torch.cuda.empty_cache = empty_cache
        torch.cuda.memory.empty_cache = empty_cache
