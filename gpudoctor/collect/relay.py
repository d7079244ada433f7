"""Signals that reach ``gpudoctor profile`` while the script runs: passed on to it, once (``collect.runner``).

A terminal's Ctrl-C reaches the whole foreground process group, the script included; a signal
sent to gpudoctor alone (``kill PID``, a scheduler) is forwarded to the script unless the
training process reports, through its pipe, that it got the signal itself within
``FORWARD_GRACE_S``. A third SIGINT kills the script. The runner's docstring says the rest.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from gpudoctor.safe import terminal_line
from gpudoctor.signals import HANDLED, Interrupted
from gpudoctor.signals import note as note_signal

# A signal sent to the parent is forwarded unless the training process reports receiving it within this time.
FORWARD_GRACE_S = 0.5
# A signal the training process received this long before the parent's still counts as the same delivery.
SAME_DELIVERY_S = 2.0


def say(line: str) -> None:
    """A line on stderr that cannot fail the run (a closed pipe, a closed terminal), its
    control characters escaped (a script's message or a path cannot drive the terminal)."""
    try:
        print(terminal_line(line), file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):
        pass


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class Signals:
    """The parent's signal handling while it runs the script (main thread only).

    Before the training process exists, SIGINT, SIGTERM and SIGHUP raise ``Interrupted``
    (start-up stops). Then handlers only record; :meth:`tick`, called by the waiting loop,
    decides what to forward, and :meth:`settle` what never reached the script.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.sigints = 0
        self.received: list[int] = []  # every signal the parent got, in order
        self.delivered: list[int] = []  # those the script got: it reported them, or they were forwarded
        self.forwarded: list[int] = []  # signals passed on to the script because it had not got them
        self.late: list[int] = []  # signals that could not reach the script: it had ended
        self._reader: threading.Thread | None = None
        self._old: dict[int, Any] = {}
        self._pending: list[tuple[int, float]] = []  # (signal, when) received by the parent, not yet judged
        self._child_got: list[tuple[int, float]] = []  # (signal, when) the training process reported
        self._lock = threading.Lock()
        self._pipe_r = -1
        self.detects = False  # the training process reports its signals (one process, not torchrun)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in HANDLED:
            if signal.getsignal(sig) == signal.SIG_IGN:  # nohup: a hang-up is not ours to act on
                continue
            self._old[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
        if self._pipe_r >= 0:
            try:
                os.close(self._pipe_r)
            except OSError:
                pass
            self._pipe_r = -1

    def watch(self, pipe_r: int) -> None:
        """Read the training process's ``set_wakeup_fd`` pipe: one byte per signal it received."""
        self._pipe_r = pipe_r
        self.detects = True

        def run() -> None:
            while True:
                try:
                    data = os.read(pipe_r, 64)
                except OSError:
                    return
                if not data:
                    return
                now = time.monotonic()
                with self._lock:
                    self._child_got.extend((b, now) for b in data)

        self._reader = threading.Thread(target=run, name="gpudoctor-signals", daemon=True)
        self._reader.start()

    def _on_signal(self, signum: int, frame: Any) -> None:
        note_signal(signum)  # a start-up hook waiting for a signal goes on
        self.received.append(signum)
        proc = self.proc
        if proc is None:  # before the training process exists: start-up stops here
            raise Interrupted(signum)
        if proc.poll() is not None:  # the script has ended: gpudoctor stops once the manifest is written
            self.late.append(signum)
            return
        if signum == signal.SIGINT:
            self.sigints += 1
            if self.sigints >= 3:
                say("gpudoctor: killing the script")
                try:
                    proc.kill()
                except OSError:
                    pass
                return
        self._pending.append((signum, time.monotonic()))

    def tick(self) -> None:
        """Forward the signals the parent received and the script did not (see the module docstring)."""
        if not self._pending:
            return
        proc = self.proc
        now = time.monotonic()
        keep: list[tuple[int, float]] = []
        for sig, when in self._pending:
            if self._reported(sig, when):
                continue
            if self.detects and now - when < FORWARD_GRACE_S:
                keep.append((sig, when))
                continue
            if not self.detects and sig == signal.SIGINT and self.sigints < 2:
                self.delivered.append(sig)  # torchrun: Ctrl-C reached the group; a second one is passed on
                continue
            if proc is not None and proc.poll() is None:
                name = signal_name(sig)
                say(f"gpudoctor: passing {name} on to the script (it was sent to gpudoctor alone)")
                try:
                    proc.send_signal(sig)
                    self.forwarded.append(sig)
                    self.delivered.append(sig)
                    continue
                except OSError:  # the child has just ended
                    pass
            self.late.append(sig)  # the script ended before it could be passed on
        self._pending = keep
        with self._lock:  # reports older than any pending signal can match nothing more
            self._child_got = [(s, t) for s, t in self._child_got if now - t < SAME_DELIVERY_S + FORWARD_GRACE_S]

    def _reported(self, sig: int, when: float) -> bool:
        """The training process reported getting ``sig`` (the same delivery): it is counted as delivered."""
        with self._lock:
            match = next((i for i, (s, t) in enumerate(self._child_got) if s == sig and when - SAME_DELIVERY_S <= t), None)
            if match is None:
                return False
            self._child_got.pop(match)
        self.delivered.append(sig)
        return True

    def settle(self, timeout_s: float = 1.0) -> None:
        """The script has ended: the signals still waiting to be forwarded either reached it (its last
        reports, read once its end of the pipe is closed) or never did (:attr:`late`)."""
        if self._pending and self._reader is not None:
            self._reader.join(timeout_s)
        for sig, when in self._pending:
            if not self._reported(sig, when):
                self.late.append(sig)
        self._pending = []
