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
2. The script's own profiler wins. gpudoctor watches ``cProfile.Profile.enable`` (:func:`watch_script`;
   gpudoctor's own profilers are :class:`OwnProfile`, which bypass the watch): when the script
   enables one, every instrument of gpudoctor's that holds the slot gives way first (its data so far
   are kept), so that the script's ``enable()`` neither raises (3.12+) nor is cleared later (3.11-).
   The script's torch.profiler with stacks does the same up to 3.11 (from 3.12 it records beside a
   cProfile). A profiler the script sets by other means (``sys.setprofile`` up to 3.11) is seen when
   gpudoctor's cProfile is next paused (:func:`displaced`): that one is then stopped without
   ``disable()``, which would clear the script's.

Not gpudoctor's to fix, measured on 3.12 and 3.13 with or without gpudoctor: a torch.profiler window
that starts or stops inside a frame makes a running cProfile miss that frame's return (one call
uncounted per transition).
"""

from __future__ import annotations

import cProfile
import sys
import threading
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


def enable_own(prof: cProfile.Profile, **kwargs: Any) -> str:
    """Enable one of gpudoctor's profilers where the slot is free: "" when it runs now, else why not
    (nothing raised: the caller gives way)."""
    who = holder()
    if who:
        return held_by(who)
    try:
        _ENABLE(prof, **kwargs)
    except Exception as err:  # taken between the look and the enable (another thread)
        who = holder()
        return held_by(who) if who else f"cProfile could not start: {type(err).__name__}: {err}"
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
    if displaced(prof):
        return True
    prof.disable()
    return False


# instruments of gpudoctor's that give way when the script takes the slot: each is called with the reason
_yielders: list[Callable[[str], None]] = []


def on_script_profiler(give_way: Callable[[str], None]) -> None:
    """``give_way(reason)`` is called when the script starts a profiler of its own (it stops the
    instrument if it holds the slot, and does nothing else)."""
    _yielders.append(give_way)


def script_takes_slot(what: str) -> None:
    """The script is about to start a profiler (``what``): gpudoctor's instruments give way first."""
    for give_way in list(_yielders):
        try:
            give_way(what)
        except Exception:  # gpudoctor's error never reaches the script
            pass


def watch_script() -> None:
    """Watch ``cProfile.Profile.enable`` (``cProfile.run``, ``with cProfile.Profile()`` and
    ``Profile().enable()`` all call it) for the run's process."""
    if getattr(cProfile.Profile.enable, "_gpudoctor_watch", False):
        return

    def enable(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _yielders:
            script_takes_slot("the script started its own cProfile")
        return _ENABLE(self, *args, **kwargs)

    enable._gpudoctor_watch = True  # type: ignore[attr-defined]
    enable.__doc__ = _ENABLE.__doc__
    enable.__name__ = "enable"
    enable.__qualname__ = "Profile.enable"
    cProfile.Profile.enable = enable  # type: ignore[method-assign]


def forget() -> None:
    """No instrument gives way any more (a forked child, the end of the run)."""
    _yielders.clear()
