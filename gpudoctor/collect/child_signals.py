"""The training process's signals: held back during start-up, then the script's, then a worker's.

Three stages, one module, so that the handlers each stage installs and the next one recognises are
the same objects (module-level state: the signals held back, when the last :class:`Terminated` was
raised, the ``sys.unraisablehook`` that was in place):

- start-up (:func:`signals_in_place`): SIGINT, SIGTERM and SIGHUP are held back (:func:`_defer`)
  while torch is imported and the instruments are installed; torch's import swallows a
  KeyboardInterrupt raised at some moments of it, and turns one raised at others into
  "ImportError: cannot load module more than once" (numpy), so nothing is raised until the script
  is about to run;
- the script (:func:`script_signals`): SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP raise
  :class:`Terminated`, which unwinds the script so the instruments can write what they have;
- a forked DataLoader worker (:func:`worker_signals`): Python's own handling back.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from gpudoctor.signals import HANDLED
from gpudoctor.signals import note as note_signal


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind the script so the instruments can write what they have."""

    def __init__(self, signum: int = int(signal.SIGTERM)) -> None:
        super().__init__(signum)
        self.signum = int(signum)


def _raise_terminated(signum: int, frame: Any) -> None:
    now = time.monotonic()
    if now - _raised_at[0] < _SAME_SIGNAL_S:
        # one is on its way already: the parent's death is signalled once per thread of it that dies
        # (PR_SET_PDEATHSIG follows the thread), and a second exception would land in the first one's
        # unwinding (an except or finally block, or _unraisable below) and be printed there
        return
    _raised_at[0] = now
    raise Terminated(signum)


_raised_at = [-1e9]  # when _raise_terminated last raised (time.monotonic)
_SAME_SIGNAL_S = 0.5  # a signal within this long of the last raise is the same event (the script is ending)
_prior_unraisablehook = sys.unraisablehook


def _unraisable(unraisable: Any) -> None:
    """``sys.unraisablehook`` while the script runs: a :class:`Terminated` raised where Python can only
    swallow it (a ``__del__``, such as a DataLoader iterator's joining its workers; an at-fork handler,
    such as logging's while a worker is forked; a weakref callback) would print an "Exception ignored
    in" traceback into the script's output and be lost: the signal is delivered again a moment later,
    silently. Anything else goes to the hook that was in place."""
    exc = unraisable.exc_value
    if isinstance(exc, Terminated):
        threading.Thread(target=_redeliver, args=(exc.signum,), name="gpudoctor-signal", daemon=True).start()
        return
    _prior_unraisablehook(unraisable)


def _redeliver(signum: int) -> None:
    time.sleep(0.02)  # by then, the call that swallowed it has most likely returned
    _raised_at[0] = -1e9  # this one raises again
    try:
        os.kill(os.getpid(), signum)
    except OSError:
        pass


# Signals held back during gpudoctor's start-up in this process (see signals_in_place)
_deferred: list[int] = []


def _defer(signum: int, frame: Any) -> None:
    note_signal(signum)
    _deferred.append(signum)


def signum_of(ex: BaseException) -> int:
    """The signal behind a KeyboardInterrupt (SIGINT) or a :class:`Terminated`."""
    return ex.signum if isinstance(ex, Terminated) else int(signal.SIGINT)


def signals_in_place(cfg: dict[str, Any]) -> None:
    """Hold SIGINT, SIGTERM and SIGHUP back (:func:`_defer`) until the script is about to run,
    report every signal to the parent (``set_wakeup_fd``: the parent then knows it arrived), and
    let them in: the parent started this process with them blocked, so one sent during Python's
    start-up arrives now, and ends the run cleanly once the instruments are in place."""
    for sig in HANDLED:
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, _defer)
    keep = cfg.get("signal_read_fd")  # held open, never read: see collect.runner (no EPIPE once the parent is gone)
    if isinstance(keep, int) and keep >= 0:
        try:
            os.set_inheritable(keep, False)  # not passed on to the script's own subprocesses
        except OSError:
            pass
    fd = cfg.get("signal_fd")
    if isinstance(fd, int) and fd >= 0:
        try:
            signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
        except (ValueError, OSError):
            pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(HANDLED))


def script_signals() -> int | None:
    """The script's own signal handling from now on (SIGINT raises KeyboardInterrupt, SIGTERM and
    SIGHUP unwind it); the first signal held back during start-up, if any."""
    for sig in HANDLED:
        if signal.getsignal(sig) is not _defer:  # ignored by who started gpudoctor (nohup): stays so
            continue
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else _raise_terminated)
    sys.unraisablehook = _unraisable
    return _deferred[0] if _deferred else None


def worker_signals() -> None:
    """In a forked worker: its signals are not the training process's, Python's own handling back
    (a handler the script installed stays), and no wake-up fd to the parent."""
    try:
        for sig in HANDLED:
            if sig == signal.SIGINT:
                if signal.getsignal(sig) is _defer:
                    signal.signal(sig, signal.default_int_handler)
            elif signal.getsignal(sig) in (_raise_terminated, _defer):
                signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass


def die_with_parent(parent_pid: int) -> None:
    """Linux: SIGTERM (flush, then exit) when gpudoctor's parent process dies, not an orphan run."""
    if not sys.platform.startswith("linux") or not parent_pid:
        return
    try:
        import ctypes  # noqa: PLC0415

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
