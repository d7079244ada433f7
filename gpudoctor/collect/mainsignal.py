"""A real-time signal that carries a request from any thread to the script's main thread.

Two instruments must act on the main thread, where the script's loop runs, from another thread:
the time-based window (``timewindow``: cProfile follows only the thread that enables it) and
``--steps``'s stop reached on another thread (``steps.limit.MainStop``: the script's loop, not one
of its threads, must stop). Each takes a real-time signal no one handles (:func:`free_signal`),
installs its handler on the main thread with ``SA_RESTART`` (a system call it interrupts resumes),
and sends it with ``pthread_kill``; Python runs the handler between two bytecodes of the main thread.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any


def free_signal() -> int | None:
    """A real-time signal with no handler (gpudoctor's own), None where there is none."""
    lo, hi = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if lo is None or hi is None or not hasattr(signal, "pthread_kill"):
        return None
    for sig in range(hi - 1, lo + 1, -1):
        try:
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                return sig
        except (OSError, ValueError):
            continue
    return None


class MainSignal:
    """One real-time signal's handler on the main thread: :meth:`install` it (on the main thread),
    :meth:`send` it from any thread, :meth:`restore` the handler that was there."""

    __slots__ = ("sig", "main", "_handler", "_old")

    def __init__(self) -> None:
        self.sig: int | None = None  # the signal, once installed
        self.main = threading.main_thread().ident or 0  # the thread it is sent to
        self._handler: Callable[[int, Any], None] | None = None
        self._old: Any = None

    def install(self, sig: int | None, handler: Callable[[int, Any], None], purpose: str) -> str:
        """Install ``handler`` for ``sig`` (from :func:`free_signal`), to be sent to this thread;
        why it could not be ("" when installed). ``purpose``: what the signal is for, in words."""
        self.main = threading.get_ident()
        if sig is None:
            return f"no real-time signal on this platform to {purpose}"
        try:
            self._old = signal.signal(sig, handler)
            signal.siginterrupt(sig, False)  # SA_RESTART: a system call it interrupts resumes
        except (OSError, ValueError, RuntimeError) as err:
            return f"its signal could not be installed ({err})"
        self.sig, self._handler = sig, handler
        return ""

    def send(self) -> str:
        """Signal the main thread; why it could not be ("" when sent). Not sent when the script has
        since installed a handler of its own for the signal (it would run the script's handler)."""
        if self.sig is None:
            return "the main thread could not be signalled"
        try:
            if signal.getsignal(self.sig) != self._handler:
                return "the script installed its own handler for gpudoctor's signal"
            signal.pthread_kill(self.main, self.sig)
        except (OSError, ValueError, RuntimeError) as err:
            return f"the main thread could not be signalled ({err})"
        return ""

    def restore(self) -> None:
        """Put back the handler that was in place (the default when there was none)."""
        sig, self.sig = self.sig, None
        if sig is not None:
            try:
                signal.signal(sig, self._old if self._old is not None else signal.SIG_DFL)
            except (OSError, ValueError, TypeError):
                pass
