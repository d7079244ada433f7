"""Errors a user can cause. ``cli.py`` turns each into a one-line message and an exit code.

Every message says what to do, not only what went wrong. No module below ``cli.py``
exits the process; they raise one of these.
"""

from __future__ import annotations

# Exit codes shared by every command (documented in the README).
EXIT_OK = 0
EXIT_FINDINGS = 1  # --fail-on: findings at or above the level
EXIT_USAGE = 2  # bad arguments, missing files, unreadable input
EXIT_SCRIPT_FAILED = 3  # reserved for --fail-on gates when the profiled script failed
EXIT_INTERNAL = 4  # a bug in gpudoctor
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as the shell reports it
EXIT_HANGUP = 129  # SIGHUP (128 + 1); gpudoctor.signals.exit_code gives 128 + any signal
EXIT_TERMINATED = 143  # SIGTERM (128 + 15)


class GpudoctorError(Exception):
    """Base class: a problem the user can act on. ``str(err)`` is the one-line message."""

    exit_code: int = EXIT_USAGE


class UsageError(GpudoctorError):
    """Wrong arguments, a missing script, a directory where a file was expected, …"""


class TraceFormatError(GpudoctorError):
    """A trace that is truncated, corrupt or not a Kineto trace. Names the file and where it broke."""

    def __init__(self, path: str, where: str, hint: str = "") -> None:
        self.path = path
        self.where = where
        self.hint = hint
        msg = f"{path}: not a readable Kineto trace ({where})"
        msg += f"; {hint}" if hint else "; re-record it or pass another trace file"
        super().__init__(msg)

    def __reduce__(self) -> tuple:  # picklable: it crosses process boundaries (analyze --jobs)
        return (type(self), (self.path, self.where, self.hint))


class RunDirError(GpudoctorError):
    """A run directory that is missing files or has an unsupported schema."""


class ConfigError(GpudoctorError):
    """A bad ``[tool.gpudoctor]`` table or rule selection (unknown code, bad threshold)."""


class CollectError(GpudoctorError):
    """The instruments could not be set up (the script itself is not at fault)."""
