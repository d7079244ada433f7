"""Where the command line's text goes: gpudoctor's own lines on stderr, the report on stdout or -o FILE, colour.

Imported by ``cli.py`` (the commands) only. A closed or broken stream loses a line, never the
run; neither changes the exit code, which ``cli.py`` decides from what the command found.
"""

from __future__ import annotations

import os
import sys

from gpudoctor.safe import terminal_line


def say(line: str) -> None:
    """One line of gpudoctor's own on stderr, escaped; a closed or broken stderr loses the line, not the run."""
    stream = sys.stderr
    if stream is None:
        return
    try:
        stream.write(terminal_line(line) + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass


def at_terminal() -> bool:
    """A person can answer: stdin is a terminal (CI, a pipe, /dev/null are not)."""
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (OSError, ValueError):
        return False


def ask_yes(question: str) -> bool:
    """``question`` (escaped by its maker) on stderr, and the answer from stdin: a typed ``yes`` (or ``y``)
    is True; anything else, or none, False."""
    try:
        sys.stderr.write(question)
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        return False
    return sys.stdin.readline().strip().lower() in ("yes", "y")


def silence_stdout() -> None:
    """The reader went away: later writes (and the flush at exit) go to /dev/null, not to a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, AttributeError, ValueError):
        pass


def print_stdout(text: str, what: str = "the report") -> None:
    """The report on stdout: skipped with one line when stdout is closed, dropped when its reader is gone.

    Neither changes the exit code: it is decided by what the command found, not by the pipe.
    """
    stream = sys.stdout
    if stream is None:
        say(f"gpudoctor: stdout is closed: {what} was not printed (pass -o FILE to write it to a file)")
        return
    text = text if not text or text.endswith("\n") else text + "\n"  # nothing (--format github, no finding): no line
    try:
        try:
            stream.write(text)
        except UnicodeEncodeError:  # a terminal that cannot show every character: replaced, not lost
            stream.write(text.encode(stream.encoding or "utf-8", "replace").decode(stream.encoding or "utf-8"))
        stream.flush()
    except BrokenPipeError:
        silence_stdout()
    except OSError as err:  # EBADF, EIO: a stdout that cannot be written to
        silence_stdout()
        say(f"gpudoctor: stdout cannot be written ({err.strerror or err}): {what} was not printed")


def stdout_is_tty() -> bool:
    try:
        return sys.stdout is not None and sys.stdout.isatty()
    except (OSError, ValueError):
        return False


def use_color(flag: bool | None, is_tty: bool, env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Colour or not: ``--color``/``--no-color`` when given, else ``NO_COLOR`` set to anything but the
    empty string turns it off (https://no-color.org), else ``FORCE_COLOR`` set to anything but the empty
    string turns it on where stdout is not a terminal (CI logs), else colour on a terminal only.

    NO_COLOR before FORCE_COLOR when both are set: the order CPython's own colouring uses (3.13)."""
    if flag is not None:
        return flag
    if env.get("NO_COLOR"):
        return False
    if env.get("FORCE_COLOR"):
        return True
    return is_tty


def write_output(path: str, text: str, what: str = "report") -> None:
    """``-o FILE`` for every command: ``gpudoctor.output`` says what each kind of path gets (a regular
    file is replaced atomically, a FIFO, a device or ``/dev/stdout`` written through, a symlink followed
    and kept, a folder refused); every failure is a one-line ``UsageError`` (exit 2)."""
    from gpudoctor.output import write_output as write

    write(path, text, what, say=say)


def output_format(path: str) -> str:
    """The report format ``-o PATH``'s extension asks for; a ``UsageError`` when it names none."""
    from gpudoctor.report import format_from_path

    return format_from_path(path)


def check_output_writable(path: str | None) -> None:
    """Before a long run: can ``-o FILE`` be written at all? (exit 2 now, rather than after the run)."""
    from gpudoctor.output import check_output_writable as check

    check(path)


def emit_report(report, fmt: str, output: str | None, quiet: bool, color_flag: bool | None = None) -> None:  # noqa: ANN001
    """``report`` rendered in ``fmt`` (from ``-o``'s suffix when not given; terminal by default), written to
    ``output`` or printed on stdout."""
    from gpudoctor.report import format_from_path, render

    if output and not fmt:
        fmt = format_from_path(output)
    fmt = fmt or "terminal"
    color = fmt == "terminal" and output is None and use_color(color_flag, stdout_is_tty())
    text = render(report, fmt, color=color, quiet=quiet)
    if output:
        write_output(output, text)
        say(f"gpudoctor: wrote {fmt} report to {output}")
    else:
        print_stdout(text)
