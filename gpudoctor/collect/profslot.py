"""Python's one profiler slot: who holds it, and gpudoctor's instruments taking it without taking it from anyone.

Python runs one profiler at a time:

- up to 3.11, the profile function of each thread (``sys.setprofile``). A second profiler that
  enables itself replaces the first without a word (``cProfile.Profile.enable`` too), and a
  ``disable()`` clears whichever function is set: the first, disabled later, takes the second down;
- from 3.12, ``sys.monitoring``'s tool id 2 (``PROFILER_ID``), for the whole process. cProfile asks
  for it at every ``enable()``; a second ``enable()`` (of the same profiler too) raises
  ``ValueError: Another profiling tool is already active``. ``sys.setprofile`` has a slot of its own
  and no longer conflicts.

Who takes it during a run (measured with torch 2.13.0 on 3.10-3.13; ``tests/collect/test_collect_profslot.py``):

- gpudoctor's cProfile window (the steps between the torch.profiler windows: ``schedule``), the
  probe that counts one warm-up step's Python calls (``torchprof``), the time window's cProfile
  (``timewindow``);
- torch.profiler with ``with_stack=True``, while a window *records* (not while it warms up): on 3.12
  it names tool 2 "PyTorch Profiler" when the slot is free (when it is not, it records its stacks
  anyway, through ``sys.setprofile``, and warns); on 3.13 it does not take tool 2; up to 3.11 it sets
  every thread's profile function, displacing a cProfile, and clears it when it stops;
- the script: its own cProfile (or ``profile``, ``sys.setprofile``) or its own torch.profiler.

The rules, so that no instrument takes another down and step tracking never stops for them:

1. gpudoctor enables each of its profilers once (:func:`enable_own`), only where the slot is free,
   and guarded: where it is held, gpudoctor's instrument gives way for that window (the cProfile
   window does not start or stops, the probe is skipped, the window records no stacks) and the
   manifest's ``collected`` entry says which and why (:func:`held_by`).
2. The script's own profiler wins, from any thread, at any point of the run. gpudoctor watches
   ``cProfile.Profile.enable`` (:func:`watch_script`; gpudoctor's own profilers are :class:`OwnProfile`,
   which bypass the watch), and, only while one of its instruments holds the slot (:func:`hold`, from
   :func:`enable_own` to :func:`disable_own`, and torch.profiler's tracer while a window records stacks),
   the functions by which anything takes it: from 3.12 ``sys.monitoring.use_tool_id`` and
   ``register_callback`` for tool 2 (``cProfile`` and ``_lsprof.Profiler().enable()`` call them through
   the module, as line profilers and coverage-like tools do), up to 3.11 ``sys.setprofile`` on the thread
   that holds it. When the script takes the slot, every instrument of gpudoctor's that holds it gives
   way first (its data so far are kept: the cProfile window, the DataLoader's own cProfile, the probe,
   the window's stacks, the time window), so that the script's call neither raises (3.12+) nor is
   cleared later (3.11-); :data:`events` says when, how and who gave way (the manifest's ``profiler
   slot`` entry). gpudoctor's own calls pass the watch (:func:`own_calls_add`), and the module's functions
   are its own again as soon as gpudoctor lets go. The script's torch.profiler with stacks does the same
   up to 3.11 (from 3.12 it records beside a cProfile). A profiler set from C up to 3.11
   (``_lsprof.Profiler().enable()``, which no Python function carries) is seen when gpudoctor's cProfile
   is next paused (:func:`displaced`): that one is then stopped without ``disable()``, which would
   clear the script's. ``threading.setprofile`` sets the profile function of threads started later,
   which hold nothing of gpudoctor's.

Not gpudoctor's to fix, measured on 3.12 and 3.13 with or without gpudoctor: a torch.profiler window
that starts or stops inside a frame makes a running cProfile miss that frame's return (one call
uncounted per transition).
"""

from __future__ import annotations

import cProfile
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

NEW_SLOT = sys.version_info >= (3, 12)  # sys.monitoring's tool id for the whole process, not sys.setprofile per thread
PROFILER_ID = 2  # sys.monitoring.PROFILER_ID
SLOT = "sys.monitoring's profiler slot (tool 2)" if NEW_SLOT else "the thread's profile function (sys.setprofile)"

_ENABLE = cProfile.Profile.enable  # the C method, before the script's profilers are watched


class OwnProfile(cProfile.Profile):
    """A profiler of gpudoctor's: its ``enable`` is the C method, never the watch of :func:`watch_script`."""

    enable = _ENABLE


def _name(obj: Any) -> str:
    if isinstance(obj, cProfile.Profile):
        return "cProfile"
    t = type(obj)
    if t.__module__.startswith("torch") or t.__name__ == "TraceContext":  # torch.profiler's Python tracer
        return "PyTorch Profiler"
    name = getattr(obj, "__qualname__", None) or t.__qualname__
    module = getattr(obj, "__module__", None) or t.__module__
    return f"{module}.{name}" if module and module != "builtins" else str(name)


def holder() -> str:
    """Who holds the slot now ("" when it is free): on 3.12+ the name tool 2 was given, up to 3.11
    the profile function of this thread (its object's kind)."""
    if NEW_SLOT:
        return sys.monitoring.get_tool(PROFILER_ID) or ""
    fn = sys.getprofile()
    return "" if fn is None else _name(fn)


def held_by(who: str) -> str:
    """The reason an instrument of gpudoctor's gave way, in words."""
    return f"{SLOT} is held by {who!r}: Python runs one profiler at a time"


def enable_own(prof: cProfile.Profile, name: str = "gpudoctor's cProfile", **kwargs: Any) -> str:
    """Enable one of gpudoctor's profilers where the slot is free: "" when it runs now, else why not
    (nothing raised: the caller gives way). While it runs (``name``: which instrument, in words), the
    script's ways of taking the slot are watched (:func:`hold`)."""
    with _lock:
        who = holder()
        if who:
            return held_by(who)
        try:
            _ENABLE(prof, **kwargs)  # (before the watch: its calls to sys.monitoring are gpudoctor's)
        except Exception as err:  # taken between the look and the enable (another thread)
            who = holder()
            return held_by(who) if who else f"cProfile could not start: {type(err).__name__}: {err}"
        hold(prof, name)
    return ""


def displaced(prof: cProfile.Profile) -> bool:
    """Up to 3.11: another profiler replaced ``prof`` (enabled, on this thread) since it was enabled;
    its ``disable()`` would clear that one. From 3.12 no one can take the slot from an enabled cProfile."""
    return not NEW_SLOT and sys.getprofile() is not prof


def shares_slot_with(owner_thread: int | None) -> bool:
    """Does a profiler started on this thread take the slot of one of gpudoctor's, enabled on
    ``owner_thread``? From 3.12 always (one slot for the process); up to 3.11 only on that thread (each
    thread has its own profile function: a profiler on another thread takes nothing from it, and a
    ``disable()`` from here could not reach it)."""
    return NEW_SLOT or owner_thread is None or threading.get_ident() == owner_thread


def disable_own(prof: cProfile.Profile) -> bool:
    """Disable one of gpudoctor's enabled profilers, unless another replaced it (then it is left
    alone, see :func:`displaced`); True when it was displaced."""
    with _lock:  # (not inside another thread's give-way)
        release(prof)  # (before the disable: its calls to sys.monitoring are gpudoctor's)
        if displaced(prof):
            return True
        prof.disable()
        return False


# instruments of gpudoctor's that give way when the script takes the slot: each is called with the reason
_yielders: list[Callable[[str], None]] = []
# gpudoctor's instruments holding the slot now: id -> (the instrument, the thread it holds it on, its name in
# words, whether it still holds it: None, always). While it is not empty, the ways a script takes the slot are watched
_holds: dict[int, tuple[Any, int, str, Callable[[], bool] | None]] = {}
_lock = threading.RLock()  # one give-way at a time, and no enable of gpudoctor's inside one
_local = threading.local()  # .own: gpudoctor's own calls in progress on this thread (they pass the watch)
_saved: dict[str, Any] = {}  # the functions watched now, as they were: restored when gpudoctor lets go
_watchers: dict[tuple[str, int], Any] = {}  # their watches, made once (the window takes the slot at every step)
# what the watch saw: the script took the slot while gpudoctor held it (seconds into the run, what, who gave way)
events: list[dict[str, Any]] = []
_t0 = [time.monotonic()]  # (the script's start)
_step_of: list[Callable[[], int | None]] = []


def own_calls_add(n: int) -> None:
    """``n`` more (or fewer) of gpudoctor's own calls in progress on this thread: calls that reach
    ``sys.monitoring`` while the watch is on (torch.profiler's Python tracer as gpudoctor starts and stops a
    window) pass it. (gpudoctor's cProfiles are enabled before the watch goes on and disabled after it is off.)"""
    _local.own = getattr(_local, "own", 0) + n


def hold(what: Any, name: str = "gpudoctor's cProfile", still: Callable[[], bool] | None = None) -> None:
    """One of gpudoctor's instruments (``what``, ``name`` in words) holds the slot (``still``: whether it holds
    it now, asked when the script takes it; torch.profiler's tracer holds tool 2 only while a window records). While any
    does, the script's ways of taking the slot are watched: on 3.12+ ``sys.monitoring.use_tool_id`` and
    ``register_callback`` for tool 2 (``cProfile`` and ``_lsprof`` call them too), up to 3.11
    ``sys.setprofile`` on the thread that holds it. Each is the module's own function again once gpudoctor
    lets go (:func:`release`)."""
    with _lock:
        _holds[id(what)] = (what, threading.get_ident(), name, still)
        if not _saved:
            _watch()


def release(what: Any) -> None:
    """``what`` no longer holds the slot (see :func:`hold`)."""
    with _lock:
        if _holds.pop(id(what), None) is not None and not _holds:
            _unwatch()


def _holding(thread: int) -> bool:
    """Does one of gpudoctor's instruments hold the slot a profiler started on ``thread`` would take?"""
    for _, owner, _, still in list(_holds.values()):
        if (NEW_SLOT or owner == thread) and (still is None or still()):
            return True
    return False


def _watch() -> None:
    target: Any = sys.monitoring if NEW_SLOT else sys
    for name in ("use_tool_id", "register_callback") if NEW_SLOT else ("setprofile",):
        _saved[name] = orig = getattr(target, name)
        watcher = _watchers.get((name, id(orig)))
        if watcher is None or watcher.__wrapped__ is not orig:
            watcher = _watchers[(name, id(orig))] = _watcher(name, orig)
        setattr(target, name, watcher)


def _unwatch() -> None:
    target: Any = sys.monitoring if NEW_SLOT else sys
    for name, orig in _saved.items():
        if getattr(getattr(target, name, None), "_gpudoctor_watch", False):  # (the script may have replaced it since)
            setattr(target, name, orig)
    _saved.clear()


def _what(name: str, args: tuple[Any, ...]) -> str:
    if name == "setprofile":
        what = "the script called sys.setprofile"
    elif name == "use_tool_id":
        what = f"the script took sys.monitoring's tool 2 for {args[1] if len(args) > 1 else '?'!r} (use_tool_id)"
    else:
        what = "the script registered a callback for sys.monitoring's tool 2 (register_callback)"
    t = threading.current_thread()
    return what if t is threading.main_thread() else f"{what} on thread {t.name!r}"


def _watcher(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``orig`` (a function of ``sys.monitoring``, or ``sys.setprofile``), after gpudoctor's instruments gave
    way when the script's call takes the slot one of them holds."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if ((not NEW_SLOT or (args and args[0] == PROFILER_ID)) and _holds and not getattr(_local, "own", 0)
                and _holding(threading.get_ident())):
            with _lock:
                if _holding(threading.get_ident()):
                    script_takes_slot(_what(name, args))
                return orig(*args, **kwargs)
        return orig(*args, **kwargs)

    call._gpudoctor_watch = True  # type: ignore[attr-defined]
    call.__wrapped__ = orig  # type: ignore[attr-defined]
    call.__doc__ = orig.__doc__
    call.__name__ = call.__qualname__ = name
    return call


def on_script_profiler(give_way: Callable[[str], None]) -> None:
    """``give_way(reason)`` is called when the script starts a profiler of its own (it stops the
    instrument if it holds the slot, and does nothing else)."""
    _yielders.append(give_way)


def script_takes_slot(what: str) -> None:
    """The script is about to start a profiler (``what``): gpudoctor's instruments give way first, and
    :data:`events` says when, and which of them held the slot then."""
    with _lock:
        held = [name for _, _, name, still in _holds.values() if still is None or still()]
        for give_way in list(_yielders):
            try:
                give_way(what)
            except Exception:  # gpudoctor's error never reaches the script
                pass
        if held and len(events) < 100:
            try:
                step = _step_of[0]() if _step_of else None
            except Exception:
                step = None
            events.append({"at_s": round(time.monotonic() - _t0[0], 3), "step": step, "what": what,
                           "gave_way": sorted(set(held))})


def told() -> str:
    """:data:`events` in words (the manifest's ``profiler slot`` entry)."""
    parts = []
    for e in events[:10]:
        at = f"step {e['step']} ({e['at_s']:g} s)" if e.get("step") is not None else f"{e['at_s']:g} s"
        parts.append(f"at {at}: {e['what']}; {' and '.join(e['gave_way'])} gave way")
    n = len(events)
    more = f"; {n - len(parts)} more" if n > len(parts) else ""
    return (f"the script took {SLOT} {n} time{'s' if n != 1 else ''} while gpudoctor held it (Python runs one "
            f"profiler at a time; the script's wins): {'; '.join(parts)}{more}")


def watch_script(step_of: Callable[[], int | None] | None = None) -> None:
    """Watch ``cProfile.Profile.enable`` (``cProfile.run``, ``with cProfile.Profile()`` and
    ``Profile().enable()`` all call it) for the run's process; ``step_of``: the step in progress (None
    between steps), for :data:`events`."""
    _t0[0] = time.monotonic()
    _step_of[:] = [step_of] if step_of is not None else []
    if getattr(cProfile.Profile.enable, "_gpudoctor_watch", False):
        return

    def enable(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _yielders:
            with _lock:  # (from 3.12 its use_tool_id finds the slot free: the watch of hold() lets it be)
                script_takes_slot("the script started its own cProfile")
                return _ENABLE(self, *args, **kwargs)
        return _ENABLE(self, *args, **kwargs)

    enable._gpudoctor_watch = True  # type: ignore[attr-defined]
    enable.__doc__ = _ENABLE.__doc__
    enable.__name__ = "enable"
    enable.__qualname__ = "Profile.enable"
    cProfile.Profile.enable = enable  # type: ignore[method-assign]


def forget() -> None:
    """No instrument gives way any more (a forked child, the end of the run), nothing is watched, and no
    event is kept (a forked child's are its parent's)."""
    with _lock:
        events.clear()
        _yielders.clear()
        _holds.clear()
        _unwatch()
