"""SIGINT, SIGTERM and SIGHUP from gpudoctor's first instruction to its exit.

Standard library only and nothing of ours, like ``errors.py`` and ``safe.py``: the entry
point (``gpudoctor/__main__.py``) installs :func:`install`'s handlers before it imports
click or anything else, and every layer may import this module.

Until a command says otherwise, each of the three signals raises :class:`Interrupted`, a
``KeyboardInterrupt`` that knows which signal it was: whatever stops on Ctrl-C stops on
SIGTERM and SIGHUP too (the ``finally`` blocks and ``except KeyboardInterrupt`` clauses
that clean up run), and ``cli.main`` or the entry point turn it into one line and exit
``128 + signal`` (130, 143, 129). ``profile`` replaces the handlers while it runs the
script (``collect/runner.py``: before the script starts, a signal stops start-up and the
run directory says so; once it runs, the signal is passed on to the script).

A process forked from gpudoctor (a ``--jobs`` worker) gets Python's own handling back, as
it had before these handlers existed: its parent decides.

Start-up hook (tests only): ``GPUDOCTOR_STARTUP_HOOK=POINT[,POINT…]:FOLDER`` makes gpudoctor,
when it reaches a named point of its start-up (:data:`POINTS`), write its pid to the file
``FOLDER/POINT`` and wait there (at most :data:`HOOK_WAIT_S`) until one of the three signals
arrives: a test then sends its signal at exactly that moment, without sleeps.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

# the signals gpudoctor handles (SIGHUP is POSIX only)
HANDLED: tuple[int, ...] = tuple(
    s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")) if s is not None
)

STARTUP_HOOK_ENV = "GPUDOCTOR_STARTUP_HOOK"
HOOK_WAIT_S = 60.0
# The named points of start-up, in order (gpudoctor's process, then the training process's).
POINTS = (
    "entry",  # gpudoctor/__main__.py, handlers installed, before click and the rest are imported
    "command",  # every command: click imported, the command chosen, before it runs
    "parsed",  # `profile`: its options parsed and checked, nothing created yet
    "run-dir",  # the run directory created, the training process not started
    "spawned",  # the training process started (its own start-up is under way), the manifest written
    "child-start",  # the training process: Python started, gpudoctor's signal handling not yet in place
    "child-setup",  # the training process: signals handled, before torch is imported and instruments installed
    "child-script",  # the training process: instruments installed, the script about to run
    "ended",  # after start-up: the script has ended, the manifest not yet finished
)

_received = 0  # signals seen by gpudoctor's handlers (the start-up hook waits for one)
_at_fork_registered = False


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived: stop as on Ctrl-C; ``signum`` says which."""

    def __init__(self, signum: int = int(signal.SIGINT)) -> None:
        super().__init__(signum)
        self.signum = int(signum)

    def __reduce__(self) -> tuple[object, ...]:  # picklable: it may cross a process pool
        return (type(self), (self.signum,))


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signum_of(exc: BaseException | None) -> int:
    """The signal behind an interruption: an :class:`Interrupted`'s, found through the causes
    (click turns a ``KeyboardInterrupt`` into ``Abort``), SIGINT for a plain Ctrl-C."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, Interrupted):
            return exc.signum
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return int(signal.SIGINT)


def exit_code(signum: int) -> int:
    """What a shell reports for a process a signal stopped: 128 + the signal (130, 143, 129)."""
    return 128 + int(signum)


def stop_line(signum: int) -> str:
    """gpudoctor's one line when a signal stops it."""
    if signum == signal.SIGINT:
        return "gpudoctor: interrupted"
    return f"gpudoctor: stopped by {signal_name(signum)}"


STARTUP_TAIL = "during start-up, before the script ran"


def startup_detail(signum: int) -> str:
    """The manifest's ``status_detail`` of a run a signal stopped before the script ran."""
    if signum == signal.SIGINT:
        return f"interrupted (Ctrl-C) {STARTUP_TAIL}"
    return f"interrupted by {signal_name(signum)} {STARTUP_TAIL}"


def stopped_during_startup(status_detail: str) -> bool:
    """A run that a signal stopped before its script ran (its manifest's ``status_detail``)."""
    return status_detail.endswith(STARTUP_TAIL)


def note(signum: int) -> None:
    """Called by each of gpudoctor's handlers: a start-up hook waiting for a signal goes on."""
    global _received
    _received += 1


def _raise(signum: int, frame: object) -> None:
    note(signum)
    raise Interrupted(signum)


def _python_defaults_after_fork() -> None:
    # a forked worker: Python's own handling, as before gpudoctor's handlers (its parent decides)
    for s in HANDLED:
        try:
            if signal.getsignal(s) is _raise:
                signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
        except (ValueError, OSError):
            pass


def install() -> None:
    """SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` from now on (main thread only;
    a signal that a parent told this process to ignore stays ignored, as Python does for SIGINT)."""
    global _at_fork_registered
    for s in HANDLED:
        try:
            if signal.getsignal(s) == signal.SIG_IGN:  # nohup, or `cmd &` in a non-interactive shell
                continue
            signal.signal(s, _raise)
        except ValueError:  # not the main thread: its handlers are not this thread's to set
            return
        except OSError:
            pass
    if not _at_fork_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_python_defaults_after_fork)
        _at_fork_registered = True


@contextmanager
def handling() -> Iterator[None]:
    """:func:`install`'s handlers for the block, the previous ones back after it (``cli.main``
    called in-process, by a test or an old console script that did not go through the entry)."""
    previous = {s: signal.getsignal(s) for s in HANDLED}
    install()
    try:
        yield
    finally:
        for s, h in previous.items():
            try:
                if h is not None:
                    signal.signal(s, h)
            except (ValueError, OSError):
                pass


def ignore() -> None:
    """The three signals ignored from now on: gpudoctor is on its way out, its line said once."""
    for s in HANDLED:
        try:
            signal.signal(s, signal.SIG_IGN)
        except (ValueError, OSError):  # not the main thread
            pass


def exit_interrupted(exc: BaseException) -> None:
    """One line on stderr and exit ``128 + signal``; later signals no longer interrupt the exit."""
    signum = signum_of(exc)
    ignore()
    stream = sys.stderr
    if stream is not None:
        try:
            stream.write(stop_line(signum) + "\n")
            stream.flush()
        except (OSError, ValueError):
            pass
    sys.exit(exit_code(signum))


@contextmanager
def deferred() -> Iterator[None]:
    """The three signals held back (blocked) for the block: a file that must be written whole
    (the manifest that says how the run ended) is; a signal that arrived meanwhile is delivered
    after it (in this thread: the main thread, where Python runs its handlers)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(HANDLED))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _pending() -> bool:
    """One of the three is pending (blocked): the training process before its handling is in place."""
    try:
        return bool(signal.sigpending() & set(HANDLED))
    except (AttributeError, OSError):
        return False


def pause_point(name: str) -> None:
    """The start-up hook (see the module docstring): no-op unless ``GPUDOCTOR_STARTUP_HOOK`` names
    ``name``. Waits until a handler of gpudoctor's saw a signal (or raised), one is pending, or
    :data:`HOOK_WAIT_S` passed."""
    spec = os.environ.get(STARTUP_HOOK_ENV)
    if not spec:
        return
    points, _, folder = spec.partition(":")
    if name not in points.split(",") or not folder:
        return
    marker = os.path.join(folder, name)
    seen = _received
    try:  # whole or not at all: the test never reads half a marker
        tmp = f"{marker}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(tmp, marker)
    except OSError:
        return
    deadline = time.monotonic() + HOOK_WAIT_S
    while _received == seen and not _pending() and time.monotonic() < deadline:
        time.sleep(0.005)
