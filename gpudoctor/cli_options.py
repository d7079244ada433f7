"""The options several commands share (``cli.py``): rules, parallel reading, --verify, the report.

Imported by ``cli.py`` only; standard library and click, nothing of ours (importing
``gpudoctor.verify`` for its defaults would load scipy for every command).
"""

from __future__ import annotations

import click

FORMATS = ("terminal", "md", "json", "html", "sarif")


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
