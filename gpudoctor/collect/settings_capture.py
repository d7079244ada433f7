"""The configuration the script actually used, with the ``file:line`` that set each part.

:mod:`gpudoctor.collect.patches` calls the ``note_*`` methods from inside torch's own
constructors and setters; :meth:`SettingsCapture.build` turns what was noted, plus the
global flags read back from torch, into a :class:`~gpudoctor.model.Settings`.
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import weakref
from typing import Any

from gpudoctor.collect.callsite import FrameClassifier
from gpudoctor.model import (
    AutocastUse,
    CallSite,
    DataLoaderSetting,
    FlagSetting,
    OptimizerSetting,
    Settings,
    WrapSetting,
)

# Environment variables that change how a training process performs.
ENV_PREFIXES = (
    "OMP_", "MKL_", "KMP_", "GOMP_", "MALLOC_", "PYTORCH_", "CUDA_", "CUBLAS_", "CUDNN_",
    "NCCL_", "TORCH_", "TORCHINDUCTOR_", "NVIDIA_TF32",
)
ENV_NAMES = ("LD_PRELOAD", "TCMALLOC_RELEASE_RATE", "JE_MALLOC_CONF", "MALLOC_CONF", "OPENBLAS_NUM_THREADS")
_ENV_SECRET_HINTS = ("TOKEN", "SECRET", "PASSWORD", "KEY")


def capture_env(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    out = {}
    for k, v in environ.items():
        if k.startswith("GPUDOCTOR_"):
            continue
        if k in ENV_NAMES or k.startswith(ENV_PREFIXES):
            if any(h in k.upper() for h in _ENV_SECRET_HINTS):
                continue
            out[k] = v
    return dict(sorted(out.items()))


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    name = getattr(v, "__qualname__", None) or getattr(v, "__name__", None)
    if callable(v) and name:
        return name
    return str(v)


def _flag_getters(torch: Any) -> list[tuple[str, Any]]:
    b = torch.backends
    return [
        ("torch.backends.cudnn.enabled", lambda: b.cudnn.enabled),
        ("torch.backends.cudnn.benchmark", lambda: b.cudnn.benchmark),
        ("torch.backends.cudnn.deterministic", lambda: b.cudnn.deterministic),
        ("torch.backends.cudnn.allow_tf32", lambda: b.cudnn.allow_tf32),
        ("torch.backends.cuda.matmul.allow_tf32", lambda: b.cuda.matmul.allow_tf32),
        ("torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
         lambda: b.cuda.matmul.allow_fp16_reduced_precision_reduction),
        ("torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
         lambda: b.cuda.matmul.allow_bf16_reduced_precision_reduction),
        ("torch.float32_matmul_precision", torch.get_float32_matmul_precision),
        ("torch.backends.fp32_precision", lambda: b.fp32_precision),
        ("torch.backends.cuda.matmul.fp32_precision", lambda: b.cuda.matmul.fp32_precision),
        ("torch.backends.cudnn.fp32_precision", lambda: b.cudnn.fp32_precision),
        ("torch.backends.cudnn.conv.fp32_precision", lambda: b.cudnn.conv.fp32_precision),
        ("torch.backends.cudnn.rnn.fp32_precision", lambda: b.cudnn.rnn.fp32_precision),
        ("torch.use_deterministic_algorithms", torch.are_deterministic_algorithms_enabled),
        ("torch.set_num_threads", torch.get_num_threads),
        ("torch.set_num_interop_threads", torch.get_num_interop_threads),
    ]


class _DataLoaderEntry:
    __slots__ = ("call_site", "loader_ref", "fields", "iterations")

    def __init__(self, call_site: CallSite | None, loader: Any, fields: dict[str, Any]) -> None:
        self.call_site = call_site
        self.loader_ref = weakref.ref(loader)
        self.fields = fields
        self.iterations = 0


class SettingsCapture:
    def __init__(self, torch: Any, frames: FrameClassifier) -> None:
        self.torch = torch
        self.frames = frames
        self.active = True
        self.dirty = True
        self.errors: list[str] = []
        self._dataloaders: dict[int, _DataLoaderEntry] = {}
        self._dl_order: list[_DataLoaderEntry] = []
        self._optimizers: list[OptimizerSetting] = []
        self._optimizer_ids: set[int] = set()
        self._flag_sites: dict[str, CallSite | None] = {}
        self._autocast: dict[tuple, AutocastUse] = {}
        self._scalers: dict[tuple, CallSite] = {}
        self._wrappers: list[WrapSetting] = []
        self._ddp: dict[int, tuple[Any, dict[str, Any]]] = {}  # index in _wrappers -> (weakref to DDP, what it reported)
        self._empty_cache_sites: dict[tuple, CallSite] = {}
        self.empty_cache_count = 0
        self._fused_support: dict[type, bool] = {}
        self._flags_snapshot: tuple[FlagSetting, ...] | None = None
        self._device_type = "cpu"
        self._declared: dict[str, FlagSetting] = {}  # a trainer's own arguments (note_declared), by name
        self.injector: Any = None  # a --verify trial's collect.inject.Injector: its account goes into `injected`
        self.compile_watch: Any = None  # a collect.compile_watch.CompileWatch once the script called torch.compile

    def mark_dirty(self) -> None:
        """Something changed that settings.json keeps: written again at the next step boundary."""
        self.dirty = True

    def error(self, what: str, err: BaseException) -> None:
        msg = f"{what}: {type(err).__name__}: {err}"
        if msg not in self.errors and len(self.errors) < 20:
            self.errors.append(msg)

    # ------------------------------------------------------------------ DataLoader

    def note_dataloader(self, loader: Any, site: CallSite | None, passed: tuple[str, ...] | None = None) -> None:
        """A DataLoader was built at ``site``; ``passed``: the arguments the call gave (None: unknown)."""
        if id(loader) in self._dataloaders and self._dataloaders[id(loader)].loader_ref() is loader:
            return  # a subclass calling DataLoader.__init__ through super()
        dataset = getattr(loader, "dataset", None)
        try:
            dataset_len = len(dataset)  # type: ignore[arg-type]
        except Exception:
            dataset_len = None
        num_workers = int(getattr(loader, "num_workers", 0) or 0)
        batch_size = getattr(loader, "batch_size", None)
        if batch_size is None:
            batch_size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        ctx = getattr(loader, "multiprocessing_context", None)
        if ctx is not None:
            ctx_name = ctx.get_start_method() if hasattr(ctx, "get_start_method") else str(ctx)
        elif num_workers > 0:
            ctx_name = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
        else:
            ctx_name = None
        fields = {
            "dataset": type(dataset).__qualname__ if dataset is not None else "",
            "batch_size": int(batch_size) if isinstance(batch_size, int) else None,
            "num_workers": num_workers,
            "pin_memory": bool(getattr(loader, "pin_memory", False)),
            "prefetch_factor": getattr(loader, "prefetch_factor", None) if num_workers > 0 else None,
            "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
            "drop_last": bool(getattr(loader, "drop_last", False)),
            "multiprocessing_context": ctx_name,
            "has_worker_init_fn": getattr(loader, "worker_init_fn", None) is not None,
            "dataset_len": dataset_len,
            "passed_args": tuple(passed) if passed is not None else None,
        }
        entry = _DataLoaderEntry(site, loader, fields)
        self._dataloaders[id(loader)] = entry
        self._dl_order.append(entry)
        self.dirty = True

    def note_dataloader_iter(self, loader: Any) -> int | None:
        """An epoch starts on ``loader``; returns its epoch number (0-based)."""
        entry = self._dataloaders.get(id(loader))
        if entry is None or entry.loader_ref() is not loader:
            return None
        entry.iterations += 1
        self.dirty = True
        return entry.iterations - 1

    # ------------------------------------------------------------------ optimizers

    def note_optimizer(self, opt: Any, site: CallSite | None) -> None:
        if id(opt) in self._optimizer_ids:
            return
        self._optimizer_ids.add(id(opt))
        cls = type(opt)
        defaults = getattr(opt, "defaults", {}) or {}
        supports = self._fused_support.get(cls)
        if supports is None:
            try:
                supports = "fused" in inspect.signature(cls.__init__).parameters
            except (TypeError, ValueError):
                supports = False
            self._fused_support[cls] = supports
        n_params = 0
        n_tensors = 0
        for group in getattr(opt, "param_groups", []):
            for p in group.get("params", []):
                n_tensors += 1
                try:
                    n_params += int(p.numel())
                except Exception:
                    pass
        module = cls.__module__
        if module.startswith("torch.optim."):
            module = "torch.optim"
        foreach = defaults.get("foreach")
        fused = defaults.get("fused")
        self._optimizers.append(
            OptimizerSetting(
                call_site=site,
                cls=f"{module}.{cls.__qualname__}",
                foreach=foreach if isinstance(foreach, bool) else None,
                fused=fused if isinstance(fused, bool) else None,
                supports_fused=bool(supports),
                num_params=n_params,
                num_param_tensors=n_tensors,
            )
        )
        self.dirty = True

    # ------------------------------------------------------------------ flags

    def note_flag(self, name: str, site: CallSite | None) -> None:
        if self._flag_sites.get(name) != site:
            self._flag_sites[name] = site
            self.dirty = True

    def snapshot_flags(self) -> tuple[FlagSetting, ...]:
        out = []
        for name, getter in _flag_getters(self.torch):
            try:
                value = getter()
            except Exception:
                continue
            out.append(FlagSetting(name=name, value=_jsonable(value), call_site=self._flag_sites.get(name)))
        return (*out, *self._declared.values())

    def note_declared(self, name: str, value: Any, site: CallSite | None) -> None:
        """A setting a trainer's arguments declare (``lightning.Trainer.precision``), kept among the flags."""
        self._declared[name] = FlagSetting(name=name, value=_jsonable(value), call_site=site)
        self._flags_snapshot = None  # read again at the next build
        self.dirty = True

    def note_device(self, device_type: str) -> None:
        """The device the training runs on, as a trainer declares it (\"cuda\", \"cpu\", \"mps\")."""
        if device_type and device_type != self._device_type:
            self._device_type = device_type
            self.dirty = True

    # ------------------------------------------------------------------ AMP

    def note_autocast(self, ac: Any, site: CallSite | None, deprecated: bool) -> None:
        device = str(getattr(ac, "device", ""))
        dtype = str(getattr(ac, "fast_dtype", ""))
        enabled = bool(getattr(ac, "_enabled", True))
        key = (site.file if site else None, site.line if site else None, device, dtype, enabled, deprecated)
        if key in self._autocast:
            return
        self._autocast[key] = AutocastUse(call_site=site, device_type=device, dtype=dtype, enabled=enabled, deprecated_api=deprecated)
        self.dirty = True

    def note_grad_scaler(self, site: CallSite | None) -> None:
        key = (site.file, site.line) if site else (None, None)
        if key not in self._scalers:
            self._scalers[key] = site or CallSite("<unknown>", 0)
            self.dirty = True

    # ------------------------------------------------------------------ wrappers

    def note_wrapper(self, kind: str, site: CallSite | None, module: str, options: dict[str, Any], obj: Any = None) -> None:
        """``obj``: the DistributedDataParallel instance, whose own logging data ``poll_ddp`` reads."""
        self._wrappers.append(WrapSetting(kind=kind, call_site=site, module=module, options=_jsonable(options)))
        if obj is not None and hasattr(obj, "_get_ddp_logging_data"):
            self._ddp[len(self._wrappers) - 1] = (weakref.ref(obj), {"iterations": set(), "unused": None})
        self.dirty = True

    def poll_ddp(self, step: int) -> None:
        """Read DDP's own account of unused parameters (``unused_parameter_size``: bytes of parameters
        that got no gradient, set on the iterations DDP samples for its logging: the first ten, then
        every hundredth). Called at step boundaries; reads only around those iterations."""
        if not self._ddp or not (step <= 12 or step % 100 in (0, 1, 2)):
            return
        for ref, seen in self._ddp.values():
            model = ref()
            if model is None:
                continue
            try:
                data = model._get_ddp_logging_data()
            except Exception as err:
                self.error("DistributedDataParallel logging data", err)
                continue
            it = data.get("iteration")
            size = data.get("unused_parameter_size")
            if not isinstance(it, int) or not isinstance(size, int) or it <= 0 or it in seen["iterations"]:
                continue
            seen["iterations"].add(it)
            before = seen["unused"]
            seen["unused"] = size if before is None else max(before, size)
            if seen["unused"] != before:  # the count of checks is written with the next settings anyway
                self.dirty = True

    def _wrappers_now(self) -> tuple[WrapSetting, ...]:
        out = list(self._wrappers)
        for i, (_, seen) in self._ddp.items():
            if seen["unused"] is not None and i < len(out):
                w = out[i]
                opts = dict(w.options, unused_parameter_size=seen["unused"], unused_parameter_checks=len(seen["iterations"]))
                out[i] = WrapSetting(kind=w.kind, call_site=w.call_site, module=w.module, options=opts)
        return tuple(out)

    def note_empty_cache(self, site: CallSite | None) -> None:
        self.empty_cache_count += 1
        key = (site.file, site.line) if site else (None, None)
        if key not in self._empty_cache_sites:
            self._empty_cache_sites[key] = site or CallSite("<unknown>", 0)
            self.dirty = True

    # ------------------------------------------------------------------ build

    def device_type(self) -> str:
        try:
            cuda = self.torch.cuda
            if cuda.is_initialized() and cuda.max_memory_allocated() > 0:
                self._device_type = "cuda"
        except Exception:
            pass
        return self._device_type

    def build(self, refresh_flags: bool = True) -> Settings:
        if refresh_flags or self._flags_snapshot is None:
            self._flags_snapshot = self.snapshot_flags()
        try:
            cpu_count = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpu_count = os.cpu_count()
        try:
            num_threads = int(self.torch.get_num_threads())
            interop = int(self.torch.get_num_interop_threads())
        except Exception:
            num_threads = interop = None
        loaders = tuple(
            DataLoaderSetting(call_site=e.call_site, iterations_started=e.iterations, **e.fields) for e in self._dl_order
        )
        return Settings(
            device_type=self.device_type(),
            dataloaders=loaders,
            optimizers=tuple(self._optimizers),
            flags=self._flags_snapshot,
            autocast=tuple(self._autocast.values()),
            grad_scalers=tuple(self._scalers.values()),
            wrappers=self._wrappers_now(),
            empty_cache_calls=tuple(self._empty_cache_sites.values()),
            empty_cache_count=self.empty_cache_count,
            num_threads=num_threads,
            interop_threads=interop,
            cpu_count=cpu_count,
            env=capture_env(os.environ),
            injected=self.injector.applied() if self.injector is not None else (),
            compile=self._compile_state(),
        )

    def _compile_state(self) -> Any:
        if self.compile_watch is None:
            return None
        try:
            return self.compile_watch.state()
        except Exception as err:  # what torch.compile did is a note, never a failed settings.json
            self.error("torch.compile state", err)
            return None
