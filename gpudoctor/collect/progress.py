"""The progress line of ``gpudoctor profile`` on stderr while the script runs.

``gpudoctor: running: 120 steps, 1 profiled window recorded, 14 s`` (``120/400 steps``
under ``--steps 400``), rewritten in place with ``\\r`` about twice a second and
cleared before the closing summary and the report. Shown only when stderr is a
terminal (never in a log, a pipe or CI) and not under ``--quiet``.

The parent renders it from what the training process already writes: the lines of
``steps.jsonl`` (written once a second by the step tracker; only the bytes appended
since the last look are read) and the traces listed in its state file (rewritten each
time a window is exported). Nothing is added to the training process.

Plain ``\\r`` writes, not ``click.progressbar`` (it needs a known length: the number of
steps of a script is unknown unless ``--steps`` says it) nor ``rich`` (a dependency
as large as the rest of gpudoctor's for one line). A stderr that closes or breaks
turns the line off for the rest of the run; the run goes on.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path
from typing import TextIO

INTERVAL_S = 0.5  # between two renderings


def stream_is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError, AttributeError):
        return False


def _plural(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


class Progress:
    """One line on ``stream``; :meth:`tick` from the parent's waiting loop, :meth:`clear` at the end."""

    def __init__(self, steps_path: Path | None, state_path: Path | None, t0_mono_ns: int, max_steps: int | None = None,
                 stream: TextIO | None = None, interval_s: float = INTERVAL_S, run_dir: Path | None = None) -> None:
        # None: a torchrun job; the lowest rank's files are looked for in run_dir until one appears
        self.steps_path = steps_path
        self.state_path = state_path
        self.run_dir = run_dir
        self.t0_mono_ns = t0_mono_ns
        self.max_steps = max_steps
        self.stream = stream
        self.interval_s = interval_s
        self.steps = 0
        self.windows = 0
        self._offset = 0
        self._state_mtime: float | None = None
        self._last = 0.0
        self._width = 0  # characters of the line on the terminal now

    @property
    def enabled(self) -> bool:
        return self.stream is not None

    def _find_rank_files(self) -> None:
        """A torchrun job: each rank writes ``steps.rankN.jsonl`` (``steps.jsonl`` for a job of one);
        the lowest rank on this machine stands for the job, as in the closing summary."""
        from gpudoctor.model import layout  # noqa: PLC0415

        if self.run_dir is None:
            return
        found = []
        for path in self.run_dir.glob(layout.rank_glob(layout.STEPS)):
            rank = layout.rank_of(path.name, layout.STEPS)
            if rank is not None:
                found.append((rank, path))
        if found:
            rank, self.steps_path = min(found)
            self.state_path = self.run_dir / layout.rank_tagged(layout.CHILD_STATE, rank)
        elif (self.run_dir / layout.STEPS).exists():
            self.steps_path, self.state_path = self.run_dir / layout.STEPS, self.run_dir / layout.CHILD_STATE

    def _count_steps(self) -> None:
        if self.steps_path is None:
            return
        try:
            with open(self.steps_path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError:
            return
        self.steps += data.count(b"\n")
        self._offset += data.rfind(b"\n") + 1  # a line being written is counted once it is whole

    def _count_windows(self) -> None:
        if self.state_path is None:
            return
        try:
            mtime = self.state_path.stat().st_mtime
            if mtime == self._state_mtime:
                return
            state = json.loads(self.state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        self._state_mtime = mtime
        traces = state.get("traces") if isinstance(state, dict) else None
        if isinstance(traces, list):
            self.windows = len(traces)

    def line(self, now_mono_ns: int) -> str:
        steps = f"{self.steps:,}/{self.max_steps:,} steps" if self.max_steps else _plural(self.steps, "step", "steps")
        windows = _plural(self.windows, "profiled window", "profiled windows") + " recorded"
        elapsed_s = max(0, (now_mono_ns - self.t0_mono_ns) // 1_000_000_000)
        return f"gpudoctor: running: {steps}, {windows}, {elapsed_s} s"

    def tick(self) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return
        self._last = now
        if self.steps_path is None:
            self._find_rank_files()
        self._count_steps()
        self._count_windows()
        text = self.line(time.monotonic_ns())[: self._columns()]  # a wrapped line could not be rewritten in place
        pad = " " * max(0, self._width - len(text))  # a shorter line hides what is left of the longer one
        if self._write(f"\r{text}{pad}"):
            self._width = len(text)

    def _columns(self) -> int:
        """The terminal's width less one (the cursor stays on the line); 200 when it is not known
        (a pseudo-terminal nobody sized says 0 columns)."""
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns  # type: ignore[union-attr]
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            return 200
        return max(20, columns - 1) if columns > 0 else 200

    def clear(self) -> None:
        """Blank the line and put the cursor back at its start (nothing when nothing was shown)."""
        if self.stream is not None and self._width:
            self._write("\r" + " " * self._width + "\r")
        self._width = 0

    def _write(self, text: str) -> bool:
        stream = self.stream
        if stream is None:
            return False
        try:
            stream.write(text)
            stream.flush()
            return True
        except (OSError, ValueError):  # stderr closed or its reader gone: no more progress, the run goes on
            self.stream = None
            return False


def for_run(run_dir: Path, t0_mono_ns: int, max_steps: int | None, launcher: bool,
            stream: TextIO | None = None) -> Progress:
    """The progress of the run in ``run_dir``, shown on ``stream`` (default stderr) only when it is a
    terminal and ``TERM`` is not ``dumb``; ``launcher``: a torchrun job (rank-tagged files)."""
    from gpudoctor.model import layout  # noqa: PLC0415

    stream = sys.stderr if stream is None else stream
    shown = stream_is_terminal(stream) and os.environ.get("TERM") != "dumb"
    if launcher:
        return Progress(None, None, t0_mono_ns, max_steps, stream if shown else None, run_dir=run_dir)
    return Progress(run_dir / layout.STEPS, run_dir / layout.CHILD_STATE, t0_mono_ns, max_steps,
                    stream if shown else None)
