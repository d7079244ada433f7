"""The script's own profilers, as :class:`~gpudoctor.collect.torchprof.ProfilerDriver` meets them.

Kineto allows one profiler per process. When the script creates its own
``torch.profiler.profile`` (or the legacy ``torch.autograd.profiler.profile``),
gpudoctor stops its window at once (exporting what it recorded), hands the profiler
to the script for the rest of the run (``manifest.profiler_owner = "user"``), and
copies every trace the script exports into the run directory (the script's own files
stay where it wrote them). A profiler of the script's that stops without exporting
anything (it only printed ``key_averages()``, say) is exported by gpudoctor into the
run directory at the end of the run (not as it stops: torch saves a trace once, and the
script may export it after ``stop()``), so the diagnosis still has a trace.

Python runs one profiler at a time (``profslot``): when the script starts a profiler of its own
while gpudoctor's holds Python's profiler slot, the Python-call probe is dropped and a window
recording stacks stops there (:meth:`ScriptProfilers.yield_to_script`).

:class:`ScriptProfilers` is a part of ``ProfilerDriver`` (its base class), not an object of its
own: the patches and the hand-over read and change the one driver's state (its owner, its window
in progress, its count of its own calls into torch.profiler), which ``ProfilerDriver.__init__`` sets.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudoctor.collect import profslot
from gpudoctor.collect.rundir import os_reason
from gpudoctor.model import ProfilerSchedule
from gpudoctor.model.layout import TMP_SUFFIX, plain_trace

# Profilers of the script's that stopped without exporting, kept (alive) to be exported at the end of
# the run; past this many the oldest is exported at once (a script that exports after stop() does so
# before it starts several more)
MAX_UNEXPORTED = 8


def _mark_exported(prof: Any) -> None:
    """Note on a profiler object of the script's that it exported a trace itself."""
    try:
        prof._gpudoctor_exported = True
    except Exception:
        pass


def _made_by_torch_profiler() -> bool:
    """In a legacy profiler's ``__init__``: was it created by ``torch.profiler.profile``
    (which drives one internally), rather than by the script?"""
    frame = sys._getframe(2)
    name = frame.f_code.co_filename.replace("\\", "/") if frame is not None else ""
    return name.endswith("torch/profiler/profiler.py")


class ScriptProfilers:
    """``ProfilerDriver``'s part that meets the script's own profilers: the patches of torch.profiler's
    classes (:meth:`install`), the hand-over, the copies and exports of the script's traces, and giving
    way in Python's profiler slot."""

    # set by ProfilerDriver.__init__
    torch: Any
    schedule: ProfilerSchedule
    run_dir: Path
    on_change: Callable[[], None]
    current_step: Callable[[], int]
    owner: str
    active: bool
    error: str
    traces: list[str]
    user_traces: list[str]
    user_trace_errors: list[str]
    write_errors: list[dict[str, str]]
    user_profilers: int
    user_exports_by_gpudoctor: int
    user_copies: int
    slot_notes: list[str]
    _in_user_export: bool
    _unexported: list[tuple[Any, Callable[[str], Any], int]]

    def install(self) -> None:
        torch = self.torch
        kineto_cls = torch.profiler.profiler._KinetoProfile
        profile_cls = torch.profiler.profiler.profile
        legacy_cls = torch.autograd.profiler.profile
        driver = self

        orig_profile_init = profile_cls.__init__
        orig_legacy_init = legacy_cls.__init__
        orig_kineto_export = kineto_cls.export_chrome_trace
        orig_legacy_export = legacy_cls.export_chrome_trace
        orig_profile_stop = profile_cls.stop
        orig_legacy_exit = legacy_cls.__exit__

        def profile_init(self: Any, *args: Any, **kwargs: Any) -> None:
            if driver._own_depth == 0:
                driver.user_profiler_seen(bool(kwargs.get("with_stack")))
            orig_profile_init(self, *args, **kwargs)

        def legacy_init(self: Any, *args: Any, **kwargs: Any) -> None:
            internal = _made_by_torch_profiler()
            if driver._own_depth == 0 and not internal:
                driver.user_profiler_seen(bool(kwargs.get("with_stack")))
            orig_legacy_init(self, *args, **kwargs)
            if internal:
                try:
                    self._gpudoctor_internal = True
                except Exception:
                    pass

        def kineto_export(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
            if driver._own_depth:
                return orig_kineto_export(self, path, *args, **kwargs)
            driver._in_user_export = True
            try:
                result = orig_kineto_export(self, path, *args, **kwargs)
            finally:
                driver._in_user_export = False
            _mark_exported(self)
            driver.user_trace_exported(path)
            return result

        def legacy_export(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
            result = orig_legacy_export(self, path, *args, **kwargs)
            if not driver._own_depth and not driver._in_user_export:
                _mark_exported(self)
                driver.user_trace_exported(path)
            return result

        def profile_stop(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = orig_profile_stop(self, *args, **kwargs)
            if not driver._own_depth:
                driver.user_profiler_stopped(self, lambda p: orig_kineto_export(self, p))
            return result

        def legacy_exit(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = orig_legacy_exit(self, *args, **kwargs)
            if not driver._own_depth and not getattr(self, "_gpudoctor_internal", False):
                driver.user_profiler_stopped(self, lambda p: orig_legacy_export(self, p))
            return result

        for cls, name, fn, orig in (
            (profile_cls, "__init__", profile_init, orig_profile_init),
            (legacy_cls, "__init__", legacy_init, orig_legacy_init),
            (kineto_cls, "export_chrome_trace", kineto_export, orig_kineto_export),
            (legacy_cls, "export_chrome_trace", legacy_export, orig_legacy_export),
            (profile_cls, "stop", profile_stop, orig_profile_stop),
            (legacy_cls, "__exit__", legacy_exit, orig_legacy_exit),
        ):
            fn.__wrapped__ = orig  # type: ignore[attr-defined]
            fn.__name__ = name
            fn.__qualname__ = f"{cls.__qualname__}.{name}"
            fn.__doc__ = orig.__doc__
            setattr(cls, name, fn)

    def user_profiler_seen(self, with_stack: bool = False) -> None:
        """The script creates a profiler of its own (``with_stack``: it records Python stacks)."""
        if not self.active:
            return
        self.user_profilers += 1
        if with_stack and not profslot.NEW_SLOT:  # its Python tracer would displace a cProfile (see profslot)
            profslot.script_takes_slot("the script started torch.profiler with Python stacks")
        if self.owner == "user":
            return
        self.owner = "user"
        self.finish()  # ours gives way: export a window in progress (and stop a time window)
        self.on_change()

    def yield_to_script(self, what: str) -> None:
        """The script starts a profiler of its own (``what``) while gpudoctor's may hold Python's
        profiler slot: the probe is dropped, and a window recording stacks stops here (what it
        recorded is exported; its other steps run unprofiled); see :mod:`gpudoctor.collect.profslot`."""
        if not self.active or self.owner != "gpudoctor":
            return
        if self._probe is not None:
            self._drop_probe()
            self.slot_notes.append(f"the Python-call budget was not applied to the window from step "
                                   f"{self._probe_step + 1}: {what}")
        if self._prof is None or not self._stacks_on:
            return
        if profslot.NEW_SLOT and not profslot.holder():
            return  # the tracer did not take tool 2 (3.13): the script's cProfile starts beside it
        first = self._window_first_active
        step = self.current_step()
        ann, self._annotation = self._annotation, None
        prof, self._prof = self._prof, None
        self._own_depth += 1
        try:
            if ann is not None:
                ann.__exit__(None, None, None)
            prof.stop()  # a recording window exports what it has (torch calls on_trace_ready)
        except Exception as err:
            self.error = f"torch.profiler failed as it gave way: {type(err).__name__}: {err}"
        finally:
            self._own_depth -= 1
        self._cut_at = self._rest_warm = None
        self._quiet_until = first + self.schedule.active  # the rest of the window runs unprofiled
        self.slot_notes.append(f"the window from step {first} stopped at step {step}: {what}; Python runs one "
                               "profiler at a time, so gpudoctor's (recording stacks) gave way")
        self.on_change()

    def user_trace_exported(self, path: str) -> None:
        if not self.active:
            return
        src = os.path.abspath(path)
        self.user_traces.append(src)
        base = self._free_name(self.current_step())
        dst = self.run_dir / (base if src.endswith(".gz") else plain_trace(base))  # the parent gzips a plain one
        try:
            tmp = dst.with_name(dst.name + TMP_SUFFIX)
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
        except OSError as err:
            self.user_trace_errors.append(f"{src}: {err.strerror or err}")
            self.write_errors.append({"path": dst.name, "error": os_reason(err),
                                      "what": f"the copy of the script's own trace {src}", "kept": ""})
            try:
                tmp.unlink()
            except OSError:
                pass
            return
        self.traces.append(base)
        self.user_copies += 1
        self.on_change()

    def user_profiler_stopped(self, prof: Any, export: Callable[[str], Any]) -> None:
        """A profiler of the script's stopped: if it exports nothing by the end of the run, what it
        recorded is exported into the run directory then (:meth:`export_unexported`; the script's own
        files are not touched). Not at once: torch saves a profiler's trace once ("Trace is already
        saved"), and a script that exports after ``stop()`` (``with profile() as prof: …`` then
        ``prof.export_chrome_trace(…)``, as PyTorch's recipe does) would fail."""
        if not self.active or getattr(prof, "_gpudoctor_exported", False):
            return
        if any(p is prof for p, _, _ in self._unexported):
            return  # a second stop() exports nothing new
        self._unexported.append((prof, export, self.current_step()))
        if len(self._unexported) > MAX_UNEXPORTED:  # profilers kept alive for it: the oldest is exported now
            self._export_user(*self._unexported.pop(0))

    def export_unexported(self) -> None:
        """The script is over: export what each of its profilers recorded and never exported."""
        pending, self._unexported = self._unexported, []
        for prof, export, step in pending:
            self._export_user(prof, export, step)

    def _export_user(self, prof: Any, export: Callable[[str], Any], step: int) -> None:
        if getattr(prof, "_gpudoctor_exported", False):  # the script exported it after it stopped
            return
        try:
            prof._gpudoctor_exported = True
        except Exception:
            return
        base = self._free_name(step)
        dst = self.run_dir / plain_trace(base)
        self._own_depth += 1  # the export is gpudoctor's, not the script's
        try:
            export(str(dst))
        except Exception as err:  # nothing recorded (stopped before its first active step), …
            self.user_trace_errors.append(f"the script's profiler recorded nothing gpudoctor could export ({type(err).__name__})")
            try:
                dst.unlink()
            except OSError:
                pass
            return
        finally:
            self._own_depth -= 1
        if not dst.is_file() or dst.stat().st_size == 0:
            return
        self.traces.append(base)
        self.user_exports_by_gpudoctor += 1
        self.on_change()
