"""What ``torch.compile`` does during the run: every compilation, the step it happened in, why it
recompiled, graph breaks, and frames that hit the recompile limit.

Installed when the script first calls ``torch.compile`` (``patches``): a script that never
compiles pays nothing, not even the import of ``torch._dynamo``. Nothing runs on the hot
path: Dynamo calls the two callbacks only around a compilation (which takes tens of
milliseconds at the least), and the compilation metrics Dynamo keeps anyway
(``torch._dynamo.utils.get_compilation_metrics``: the guard that failed, the code object,
graph breaks, a refusal) and its graph-break counters are read when the settings are
written, at a step boundary after a compilation.

Sources, from the newest torch back (each optional, read with ``getattr``):

- ``torch._dynamo.callback.callback_handler`` (``on_compile_start`` / ``on_compile_end``):
  when each compilation starts and ends, its compile id (``"0/3"``) and what triggered it
  (a frame traced, the backward graph at its first use, CUDA graph recording); older
  callbacks take no argument and give the time only;
- ``get_compilation_metrics()``: per compilation ``recompile_reason`` (torch 2.6+),
  ``co_name`` / ``co_filename`` / ``co_firstlineno``, ``num_graph_breaks``, ``fail_reason``;
- ``torch._dynamo.utils.counters["graph_break"]``: each graph-break reason and how often;
- ``torch._dynamo.config.recompile_limit`` (``cache_size_limit`` before 2.6).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gpudoctor.model import CallSite, CompileEvent, CompileState

MAX_EVENTS = 400  # compilations kept: the first half, then the latest (a run that compiles without end)
MAX_GRAPH_BREAKS = 10  # graph-break reasons kept, the most frequent first
MAX_TEXT = 300  # characters kept of a reason
_LIMIT_WORDS = ("recompile limit", "recompile_limit", "cache_size_limit", "cache size limit")


def first_line(text: Any, limit: int = MAX_TEXT) -> str:
    """The first non-empty line of a reason, at most ``limit`` characters."""
    if not text:
        return ""
    for line in str(text).splitlines():
        line = line.strip()
        if line:
            return line[:limit]
    return ""


def _in_torch(path: Any) -> bool:
    """A code object of torch itself (Dynamo's wrapper of a compiled module's call)."""
    p = str(path or "").replace("\\", "/")
    return "/torch/" in p or p.startswith("torch/")


def _trigger(args: tuple[Any, ...]) -> tuple[str, str]:
    """(compile id, trigger) from a callback's argument (none before torch 2.6)."""
    a = args[0] if args else None
    cid = str(getattr(a, "compile_id", "") or "")
    trig = getattr(a, "callback_trigger", None)
    name = getattr(trig, "name", "") if trig is not None else ""
    return cid, (name.lower() if name else "dynamo")


class CompileWatch:
    """Records compilations; ``state()`` is what ``settings.json`` keeps of them."""

    def __init__(self, torch: Any, step: Callable[[], int], clock_ns: Callable[[], int],
                 on_change: Callable[[], None]) -> None:
        self.torch = torch
        self.step = step  # the step in progress (StepRecord.index)
        self.clock_ns = clock_ns  # ns from the run's start, the steps' clock
        self.on_change = on_change
        self.installed = False
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._dropped = 0
        self._open: dict[tuple[str, str], dict[str, Any]] = {}
        self._info: dict[tuple[str, bool], dict[str, Any]] = {}  # (compile id, forward) -> what the metrics say
        self._seen_metrics = 0

    # ------------------------------------------------------------------ installing

    def install(self) -> None:
        """Register the callbacks (once). A torch without them leaves a note in ``errors``."""
        if self.installed:
            return
        self.installed = True
        try:
            from torch._dynamo import callback  # noqa: PLC0415 - torch.compile imported it already
        except Exception as err:
            self.errors.append(f"torch._dynamo.callback: {type(err).__name__}: {err}")
            return
        handler = getattr(callback, "callback_handler", None)
        start_reg = getattr(handler, "register_start_callback", None) or getattr(callback, "on_compile_start", None)
        end_reg = getattr(handler, "register_end_callback", None) or getattr(callback, "on_compile_end", None)
        if start_reg is None or end_reg is None:
            self.errors.append("this torch has no compile callbacks: compilations are read from Dynamo's metrics only, "
                               "without the step each happened in")
            return
        start_reg(self._start)
        end_reg(self._end)

    # ------------------------------------------------------------------ callbacks (compile time only)

    def _start(self, *args: Any) -> None:
        try:
            cid, trigger = _trigger(args)
            event = {"compile_id": cid, "trigger": trigger, "step": int(self.step()), "start_ns": int(self.clock_ns()),
                     "dur_ns": None}
            with self._lock:
                self._open[(cid, trigger)] = event
                if len(self._events) >= MAX_EVENTS:
                    # keep the first half and the latest: drop the oldest of the second half
                    del self._events[MAX_EVENTS // 2]
                    self._dropped += 1
                self._events.append(event)
        except Exception as err:  # never fail the compilation
            self._error("compile start", err)

    def _end(self, *args: Any) -> None:
        try:
            cid, trigger = _trigger(args)
            with self._lock:
                event = self._open.pop((cid, trigger), None)
                if event is not None:
                    event["dur_ns"] = max(0, int(self.clock_ns()) - int(event["start_ns"]))
            self.on_change()
        except Exception as err:
            self._error("compile end", err)

    def _error(self, what: str, err: BaseException) -> None:
        msg = f"{what}: {type(err).__name__}: {err}"
        if msg not in self.errors and len(self.errors) < 5:
            self.errors.append(msg)

    # ------------------------------------------------------------------ reading Dynamo's own records

    def _dynamo_utils(self) -> Any:
        try:
            from torch._dynamo import utils  # noqa: PLC0415
        except Exception:
            return None
        return utils

    def _absorb_metrics(self, utils: Any) -> None:
        """What Dynamo's compilation metrics say of each compile id (it keeps the latest 64 or so)."""
        get = getattr(utils, "get_compilation_metrics", None)
        if get is None:
            return
        try:
            metrics = list(get())
        except Exception as err:
            self._error("get_compilation_metrics", err)
            return
        for m in metrics:
            cid = str(getattr(m, "compile_id", "") or "")
            forward = getattr(m, "is_forward", True) is not False
            info = self._info.setdefault((cid, forward), {})
            reason = first_line(getattr(m, "recompile_reason", None))
            if reason:
                info["reason"] = reason
            name = getattr(m, "co_name", None)
            f, line = getattr(m, "co_filename", None), getattr(m, "co_firstlineno", None)
            if name and not _in_torch(f):  # torch.compile(module) traces torch's own wrapper first: not a place to show
                info["frame"] = str(name)
                if f:
                    info["site"] = CallSite(str(f), int(line or 0), str(name))
            start_us = getattr(m, "start_time_us", None)
            if not isinstance(start_us, int):
                start_s = getattr(m, "start_time", None)
                start_us = int(start_s * 1e6) if isinstance(start_s, (int, float)) and start_s > 0 else None
            if start_us:
                info["start_wall_us"] = start_us
            breaks = getattr(m, "num_graph_breaks", None)
            if isinstance(breaks, int):
                info["graph_breaks"] = breaks
            failed = first_line(getattr(m, "fail_reason", None))
            if failed:
                info["failed"] = failed
            dur_us = getattr(m, "duration_us", None)
            if isinstance(dur_us, int) and dur_us > 0:
                info["dur_ns"] = dur_us * 1000
            elif isinstance(getattr(m, "entire_frame_compile_time_s", None), (int, float)):
                info["dur_ns"] = int(float(m.entire_frame_compile_time_s) * 1e9)

    def compile_steps(self) -> set[int]:
        """The steps in which something compiled."""
        with self._lock:
            return {int(e["step"]) for e in self._events if e.get("step") is not None}

    def state(self) -> CompileState:
        utils = self._dynamo_utils()
        if utils is not None:
            self._absorb_metrics(utils)
        with self._lock:
            raw = [dict(e) for e in self._events]
            dropped = self._dropped
        events = []
        seen: set[tuple[str, bool]] = set()
        for e in raw:
            forward = e["trigger"] != "lazy_backward"
            key = (e["compile_id"], forward)
            seen.add(key)
            events.append(self._event(e, self._info.get(key, {})))
        # compilations the callbacks did not see (an older torch, or refused before they ran): their start
        # on the steps' clock from the wall-clock start Dynamo recorded (the step is the rule's to find)
        wall_minus_clock_us = (time.time_ns() - int(self.clock_ns())) // 1000
        for (cid, forward), info in self._info.items():
            if (cid, forward) not in seen and (info.get("failed") or not raw):
                start_wall = info.get("start_wall_us")
                start = (start_wall - wall_minus_clock_us) * 1000 if start_wall else None
                events.append(self._event({"compile_id": cid, "trigger": "dynamo" if forward else "lazy_backward",
                                           "step": None, "start_ns": start, "dur_ns": None}, info))
        breaks: dict[str, int] = {}
        limit = None
        if utils is not None:
            try:
                counter = dict(getattr(utils, "counters", {}).get("graph_break", {}) or {})
                for reason, n in sorted(counter.items(), key=lambda kv: -int(kv[1]))[:MAX_GRAPH_BREAKS]:
                    key = first_line(reason) or "(no reason given)"
                    breaks[key] = breaks.get(key, 0) + int(n)
            except Exception as err:
                self._error("graph-break counters", err)
        try:
            from torch._dynamo import config  # noqa: PLC0415

            value = getattr(config, "recompile_limit", None)
            if value is None:
                value = getattr(config, "cache_size_limit", None)
            limit = int(value) if isinstance(value, int) else None
        except Exception:
            pass
        hits = len({e.compile_id.split("/", 1)[0] for e in events
                    if any(w in e.failed.lower() for w in _LIMIT_WORDS)})
        return CompileState(
            events=tuple(events),
            events_dropped=dropped,
            graph_breaks=breaks,
            recompile_limit=limit,
            limit_hits=hits,
            errors=tuple(self.errors),
        )

    @staticmethod
    def _event(e: dict[str, Any], info: dict[str, Any]) -> CompileEvent:
        return CompileEvent(
            compile_id=e["compile_id"],
            step=e.get("step"),
            start_ns=e.get("start_ns"),
            dur_ns=e.get("dur_ns") if e.get("dur_ns") is not None else info.get("dur_ns"),
            trigger=e["trigger"],
            frame=info.get("frame", ""),
            call_site=info.get("site"),
            reason=info.get("reason", ""),
            graph_breaks=info.get("graph_breaks"),
            failed=info.get("failed", ""),
        )


def monotonic_clock(t0_ns: int) -> Callable[[], int]:
    """ns from ``t0_ns`` on the monotonic clock (the steps' clock)."""
    return lambda: time.monotonic_ns() - t0_ns
