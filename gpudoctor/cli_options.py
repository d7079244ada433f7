"""The options several commands share (``cli.py``, ``cli_check.py``): rules, parallel reading, --verify,
the report; and what the commands do with the rule options: the configuration they build
(``rule_config``) and the exit code of ``--fail-on`` (``fail_on_exit_code``).

Imported by the command line's modules only; standard library and click at import (importing
``gpudoctor.verify`` for its defaults would load scipy for every command), the configuration
and the model inside the two functions that need them.
"""

from __future__ import annotations

from pathlib import Path

import click

from gpudoctor.errors import EXIT_FINDINGS, EXIT_OK

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
