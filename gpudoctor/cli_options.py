"""The options several commands share (``cli.py``, ``cli_check.py``): rules, parallel reading, --verify,
the report (its ``-o`` never replaces a source: ``guard_sources``); and what the commands do with the
rule options: the configuration they build (``rule_config``) and the exit code of ``--fail-on``
(``fail_on_exit_code``).

Imported by the command line's modules only; standard library and click at import (importing
``gpudoctor.verify`` for its defaults would load scipy for every command), the configuration
and the model inside the two functions that need them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import click

from gpudoctor.errors import EXIT_FINDINGS, EXIT_OK, UsageError

FORMATS = ("terminal", "md", "json", "html", "sarif", "github")


LEVELS = ("info", "warning", "error")


def rule_options(f):
    f = click.option(
        "--select", multiple=True, metavar="CODE", help="Run only these rules (codes or prefixes, e.g. GD2)."
    )(f)
    f = click.option("--ignore", multiple=True, metavar="CODE", help="Skip these rules (codes or prefixes).")(f)
    f = click.option(
        "--set",
        "sets",
        multiple=True,
        metavar="FIELD=VALUE",
        help="Override a threshold, e.g. --set dataloader_wait_share_pct=10.",
    )(f)
    f = click.option(
        "--fail-on",
        type=click.Choice(LEVELS),
        default=None,
        help="Exit 1 when a finding is at or above this severity (for CI gates).",
    )(f)
    return f


def parallel_options(f):
    f = click.option(
        "-j", "--jobs", type=click.IntRange(min=1), default=None, metavar="N",
        help="Processes that read and analyze traces: one per rank trace, or one large trace in N parts "
        "(default: the cores available). The report is the same for every N.",
    )(f)
    f = click.option(
        "--cluster", default=None, metavar="ADDRESS",
        help="Analyze the traces on a Dask cluster (the scheduler's address, tcp://HOST:8786): one task per "
        "trace, read by the workers by path (a file system they share with this machine), reduced here. "
        "Needs pip install 'gpudoctor[cluster]' here and on the workers.",
    )(f)
    return f


VERIFY_HELP = (
    "After the diagnosis, apply each finding's fix that gpudoctor can apply without editing the "
    "script in trial runs (with and without the fix, interleaved) and report the measured speed-up "
    "with its interval. Trials are real runs of your script: its side effects (files, checkpoints, "
    "network) happen again. They run under RUN/verify/."
)


# gpudoctor.verify's DEFAULT_STEPS, DEFAULT_TRIALS and DEFAULT_BUDGET_S (a test keeps them in step):
# importing it here would load scipy for every command
DEFAULT_STEPS, DEFAULT_TRIALS, DEFAULT_BUDGET_S = 30, 3, 300.0


def verify_options(f):
    f = click.option("--verify-steps", type=click.IntRange(min=1), default=DEFAULT_STEPS, show_default=True,
                     help="Steps per trial run (the first 5 of each are left out as warm-up).")(f)
    f = click.option("--verify-max-trials", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Rounds at most for a fix still undecided after --verify-trials rounds "
                          "(default: twice --verify-trials; equal to it: no more rounds).")(f)
    f = click.option("--verify-trials", type=click.IntRange(min=1), default=DEFAULT_TRIALS, show_default=True,
                     help="Rounds before the verdict is first looked at: runs with each fix, each paired "
                          "with a baseline run without it.")(f)
    f = click.option("--verify-budget", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_BUDGET_S,
                     show_default=True, metavar="SECONDS", help="Time for all trial runs together; Ctrl-C stops early.")(f)
    return f


def report_options(f):
    f = click.option("--format", "fmt", type=click.Choice(FORMATS), default=None, help="Report format.")(f)
    f = click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the report to FILE.")(f)
    f = click.option("--quiet", is_flag=True, help="Findings only (terminal format).")(f)
    f = color_option(f)
    return f


def color_option(f):
    return click.option(
        "--color/--no-color", "color", default=None,
        help="Colour the terminal report (default: on a terminal, unless NO_COLOR is set; FORCE_COLOR forces it).",
    )(f)


def rule_config(select: tuple[str, ...], ignore: tuple[str, ...], sets: tuple[str, ...], where: Path):  # noqa: ANN201
    """The configuration of ``--select`` / ``--ignore`` / ``--set`` over ``[tool.gpudoctor]`` found from ``where``."""
    from gpudoctor.config import load_config

    return load_config(where, select=select, ignore=ignore, overrides=sets)


def fail_on_exit_code(report, level: str | None) -> int:  # noqa: ANN001
    """0 when no finding is at or above ``level`` (or no level), else 1."""
    if not level:
        return EXIT_OK
    from gpudoctor.model import Severity

    limit = Severity(level).rank
    return EXIT_FINDINGS if any(f.severity.rank <= limit for f in report.findings) else EXIT_OK


class ScriptCommand(click.Command):
    """A command that runs a script, as ``python`` and ``torchrun`` do: ``gpudoctor profile [OPTIONS]
    SCRIPT [ARGS]...`` (or ``-m MODULE [ARGS]...``). gpudoctor's options come before the script;
    everything after it is the script's, options included (``train.py --epochs 1``). A ``--`` right
    after the script (or the module) is gpudoctor's older separator, accepted and dropped
    (``train.py -- --epochs 1``); one before the script ends gpudoctor's options as usual.

    click alone would read ``--epochs`` after the script as one of gpudoctor's options (options
    and arguments may interleave), so the command line is split here, before click parses
    gpudoctor's part: at the first argument that is not an option or an option's value."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        head, tail = self._split(list(args))
        return super().parse_args(ctx, head if tail is None else [*head, "--", *tail])

    def _takes_value(self, name: str) -> bool:
        """Whether gpudoctor's option ``name`` takes a value (False for a flag or no such option)."""
        for param in self.params:
            if isinstance(param, click.Option) and name in (*param.opts, *param.secondary_opts):
                return not (param.is_flag or param.count)
        return False

    def _split(self, args: list[str]) -> tuple[list[str], list[str] | None]:
        """(gpudoctor's options, the script or module and what follows it; None when there is none)."""
        i = 0
        while i < len(args):
            a = args[i]
            if a == "--":  # the options end here; the script comes next
                return args[:i], args[i + 1:]
            if a == "-m" or (a.startswith("-m") and not a.startswith("--")):
                end = i + 2 if a == "-m" else i + 1  # -m MODULE or -mMODULE: its arguments follow
                return args[:end], _drop_separator(args[end:])
            if not a.startswith("-") or a == "-":
                return args[:i], [a, *_drop_separator(args[i + 1:])]
            # --name=value and -oVALUE hold their value; an unknown option is click's to refuse
            attached = "=" in a or (not a.startswith("--") and len(a) > 2)
            i += 2 if not attached and self._takes_value(a) else 1
        return args, None


def _drop_separator(rest: list[str]) -> list[str]:
    """What follows the script, less a first ``--`` (``gpudoctor profile train.py -- --epochs 1``)."""
    return rest[1:] if rest[:1] == ["--"] else rest


# --------------------------------------------------------------------------- -o never replaces a source


def output_file(output: str) -> os.stat_result | None:
    """``-o``'s file when it is a regular one that exists (else nothing it names can be a source)."""
    try:
        out = os.stat(output)
    except (OSError, ValueError):
        return None  # a new file (or one -o's own check refuses with its reason)
    if not stat.S_ISREG(out.st_mode):
        return None  # /dev/stdout, a FIFO, a terminal: written through, never a source replaced
    return out


def guard_sources(output: str | None, files: list[Path], what: str) -> None:
    """``-o`` may never be one of ``files`` (the sources a command reads or runs: ``what`` says which),
    by any spelling: files are compared by device and inode. A ``UsageError`` (exit 2), before anything
    is written; a path that does not exist yet cannot be a source."""
    out = output_file(output) if output else None
    if out is None:
        return
    for candidate in files:
        try:
            st = os.stat(candidate)
        except (OSError, ValueError):
            continue
        if (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino):
            raise UsageError(f"-o {output}: that is {candidate}, {what}; the report would replace it. "
                             "Name another file for the report (e.g. -o review.md)")


#: The most of an unexpected exception's text an internal-error line shows.
MAX_ERROR_CHARS = 200


def one_line(err: BaseException) -> str:
    """An exception's text on one line, at most ``MAX_ERROR_CHARS`` (a KeyError's key may be a whole CST node)."""
    said = " ".join(str(err).split())
    return said[:MAX_ERROR_CHARS] + " …" if len(said) > MAX_ERROR_CHARS else said
