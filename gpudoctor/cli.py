"""Command line: the only module that exits the process.

Each command is thin: it turns options into calls on the layers of DESIGN.md
(collect → parse → analysis → engine → report) and errors into one line and an
exit code. Heavy modules are imported inside the commands so that
``gpudoctor --help`` and ``gpudoctor analyze`` never import torch.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import click

from gpudoctor import __version__
from gpudoctor.errors import (
    EXIT_FINDINGS,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_SCRIPT_FAILED,
    EXIT_USAGE,
    GpudoctorError,
)

FORMATS = ("terminal", "md", "json", "html", "sarif")
LEVELS = ("info", "warning", "error")


# --------------------------------------------------------------------------- helpers


def _fail(message: str, code: int = EXIT_USAGE) -> None:
    click.echo(f"gpudoctor: error: {message}", err=True)
    sys.exit(code)


def load_and_analyze(paths: list[str]):
    """parse → analysis for anything ``analyze`` takes; returns a ``RunData`` with metrics."""
    from gpudoctor.analysis import analyze_trace
    from gpudoctor.parse import load_inputs

    loaded = load_inputs([Path(p) for p in paths])
    metrics = tuple(analyze_trace(t, loaded.run) for t in loaded.timelines)
    return dataclasses.replace(loaded.run, metrics=metrics)


def _config(select: tuple[str, ...], ignore: tuple[str, ...], sets: tuple[str, ...], where: Path):
    from gpudoctor.config import load_config

    return load_config(where, select=select, ignore=ignore, overrides=sets)


def fail_on_exit_code(report, level: str | None) -> int:
    """0 when no finding is at or above ``level`` (or no level), else 1."""
    if not level:
        return EXIT_OK
    from gpudoctor.model import Severity

    limit = Severity(level).rank
    return EXIT_FINDINGS if any(f.severity.rank <= limit for f in report.findings) else EXIT_OK


def _emit(report, fmt: str, output: str | None, quiet: bool) -> None:
    from gpudoctor.report import format_from_path, render

    if output and not fmt:
        fmt = format_from_path(output)
    fmt = fmt or "terminal"
    color = (
        fmt == "terminal"
        and output is None
        and sys.stdout.isatty()
        and "NO_COLOR" not in os.environ
    )
    text = render(report, fmt, color=color, quiet=quiet)
    if output:
        Path(output).write_text(text, encoding="utf-8")
        click.echo(f"gpudoctor: wrote {fmt} report to {output}", err=True)
    else:
        click.echo(text, nl=not text.endswith("\n"))


def _rule_options(f):
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


def _report_options(f):
    f = click.option("--format", "fmt", type=click.Choice(FORMATS), default=None, help="Report format.")(f)
    f = click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the report to FILE.")(f)
    f = click.option("--quiet", is_flag=True, help="Findings only (terminal format).")(f)
    return f


# --------------------------------------------------------------------------- commands


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpudoctor")
def cli() -> None:
    """Why is my GPU waiting, and what should I change?

    \b
      gpudoctor profile train.py -- --epochs 1   run, measure, diagnose
      gpudoctor analyze RUN_OR_TRACE             diagnose a saved run or any Kineto trace
      gpudoctor report RUN -o review.md          render terminal | md | json | html | sarif
      gpudoctor check train.py                   review a script without running it
      gpudoctor compare RUN_A RUN_B              before/after: what changed, by how much
      gpudoctor view RUN                         open the run in TensorBoard
      gpudoctor rules / explain GD201            the rule catalogue
    """


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("-m", "module", default=None, metavar="MODULE", help="Run a module, like python -m.")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="gpudoctor-runs",
    show_default=True,
    help="Folder the run directory is created in.",
)
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Stop the script cleanly after N steps.")
@click.option("--skip-first", type=click.IntRange(min=0), default=10, show_default=True, help="Steps run before the first profiled window (it starts right after).")
@click.option("--wait", type=click.IntRange(min=0), default=294, show_default=True, help="Steps between profiled windows (default: a window every 300 steps).")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True, help="Warm-up steps of each window (profiled, not recorded).")
@click.option("--active", type=click.IntRange(min=1), default=5, show_default=True, help="Recorded steps of each window.")
@click.option("--repeat", type=click.IntRange(min=0), default=3, show_default=True, help="Windows at most (0: until the end).")
@click.option("--shapes/--no-shapes", default=True, show_default=True, help="Record input shapes (dtypes for the AMP rule) in the first window.")
@click.option("--stack/--no-stack", default=True, show_default=True, help="Record Python stacks (file:line of syncs) in the first window.")
@click.option("--memory/--no-memory", default=False, show_default=True, help="Record allocator events in the first window.")
@click.option("--cprofile/--no-cprofile", default=True, show_default=True, help="cProfile around the training loop.")
@click.option("--sample-interval-ms", type=click.IntRange(min=10), default=200, show_default=True, help="NVML/psutil sampling interval.")
@click.option("--time-window", "time_window", default="5:10", show_default=True, metavar="START:END",
              help="Seconds of the script to profile when nothing marks training steps ('off': never).")
@click.option("--nproc-per-node", type=click.IntRange(min=1), default=None, help="Launch through torchrun with N ranks.")
@click.option("--nnodes", default=None, help="torchrun --nnodes.")
@click.option("--node-rank", type=int, default=None, help="torchrun --node-rank.")
@click.option("--rdzv-endpoint", default=None, help="torchrun --rdzv-endpoint HOST:PORT.")
@click.option("--master-port", type=int, default=None, help="torchrun --master-port.")
@click.option("--no-report", is_flag=True, help="Collect only; do not diagnose.")
@_rule_options
@_report_options
def profile(script, script_args, module, out, steps, skip_first, wait, warmup, active, repeat, shapes, stack,
            memory, cprofile, sample_interval_ms, time_window, nproc_per_node, nnodes, node_rank, rdzv_endpoint,
            master_port, no_report, select, ignore, sets, fail_on, fmt, output, quiet):
    """Run SCRIPT under the profilers and diagnose it.

    Arguments after `--` go to the script: gpudoctor profile train.py -- --epochs 1
    """
    from gpudoctor.collect import ProfileOptions, profile_run
    from gpudoctor.collect.options import parse_time_window

    if module and script:
        script_args = (script, *script_args)
        script = None
    if not module and not script:
        _fail("give a script to profile: gpudoctor profile train.py -- ARGS (or -m module)")
    opts = ProfileOptions(
        script=script,
        module=module,
        args=tuple(script_args),
        out_dir=Path(out),
        max_steps=steps,
        skip_first=skip_first,
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        record_shapes=shapes,
        with_stack=stack,
        profile_memory=memory,
        cprofile=cprofile,
        sample_interval_ms=sample_interval_ms,
        time_window_s=parse_time_window(time_window),
        nproc_per_node=nproc_per_node,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        master_port=master_port,
    )
    result = profile_run(opts)
    code = result.exit_code
    if not no_report:
        try:
            config = _config(select, ignore, sets, Path(script).resolve().parent if script else Path.cwd())
            run = load_and_analyze([str(result.run_dir)])
            from gpudoctor.engine import diagnose, write_report_json

            report = diagnose(run, config, kind="profile")
            write_report_json(report, result.run_dir)
            _emit(report, fmt, output, quiet)
            if fail_on:
                code = EXIT_SCRIPT_FAILED if result.exit_code != 0 else fail_on_exit_code(report, fail_on)
        except GpudoctorError as err:
            click.echo(f"gpudoctor: could not diagnose the run: {err}", err=True)
    sys.exit(code)


@cli.command()
@click.argument("paths", nargs=-1, required=True)
@_rule_options
@_report_options
def analyze(paths, select, ignore, sets, fail_on, fmt, output, quiet):
    """Diagnose a saved run directory, a Kineto trace, or a folder of traces (one per rank).

    Several run directories (one per node) are merged into one job.
    """
    from gpudoctor.engine import diagnose, write_report_json

    run = load_and_analyze(list(paths))
    config = _config(select, ignore, sets, Path(paths[0]).resolve().parent)
    report = diagnose(run, config, kind="analyze")
    first = Path(paths[0])
    if len(paths) == 1 and (first / "manifest.json").is_file():
        write_report_json(report, first)
    _emit(report, fmt, output, quiet)
    sys.exit(fail_on_exit_code(report, fail_on))


@cli.command()
@click.argument("paths", nargs=-1, required=True)
@_rule_options
@_report_options
def report(paths, select, ignore, sets, fail_on, fmt, output, quiet):
    """Render the diagnosis of a run or trace as terminal, md, json, html or sarif.

    The format is guessed from -o's extension when --format is not given.
    """
    from gpudoctor.engine import diagnose

    run = load_and_analyze(list(paths))
    config = _config(select, ignore, sets, Path(paths[0]).resolve().parent)
    rep = diagnose(run, config, kind="analyze")
    _emit(rep, fmt, output, quiet)
    sys.exit(fail_on_exit_code(rep, fail_on))


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@_rule_options
@_report_options
def check(paths, select, ignore, sets, fail_on, fmt, output, quiet):
    """Review training scripts (files or folders) without running them."""
    from gpudoctor.static import check_paths

    config = _config(select, ignore, sets, Path(paths[0]).resolve().parent)
    rep = check_paths([Path(p) for p in paths], config)
    for line in rep.errors:  # files that could not be checked: the rest were
        click.echo(f"gpudoctor: warning: {line}", err=True)
    _emit(rep, fmt, output, quiet)
    sys.exit(fail_on_exit_code(rep, fail_on))


@cli.command()
@click.argument("run_a")
@click.argument("run_b")
@click.option(
    "--fail-on-regression",
    "fail_pct",
    type=click.FloatRange(min=0),
    default=None,
    metavar="PCT",
    help="Exit 1 when B's median step time is more than PCT% slower than A's (per sample when the batch size changed).",
)
@click.option("--select", multiple=True, metavar="CODE", help="Run only these rules on both runs (codes or prefixes).")
@click.option("--ignore", multiple=True, metavar="CODE", help="Skip these rules on both runs (codes or prefixes).")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE", help="Override a threshold for both runs.")
@click.option("--format", "fmt", type=click.Choice(("terminal", "md", "json", "html")), default=None, help="Output format.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the comparison to FILE.")
def compare(run_a, run_b, fail_pct, select, ignore, sets, fmt, output):
    """Before and after: compare RUN_A (before a fix) with RUN_B (after).

    Each is anything `analyze` takes: a run directory, a Kineto trace or a folder of
    traces. Both are diagnosed again with the same rules and thresholds. Shows step
    time (median, p90, speed-up, and whether the change is beyond step-to-step noise),
    time waiting for data, GPU idle, the step breakdown side by side, the findings fixed,
    remaining and new, and the settings that changed, with their file:line.
    """
    from gpudoctor.analysis.compare import compare_runs
    from gpudoctor.engine import diagnose
    from gpudoctor.report import format_from_path
    from gpudoctor.report.compare import COMPARE_FORMATS, render_comparison

    if output and not fmt:
        fmt = format_from_path(output)
        if fmt not in COMPARE_FORMATS:
            _fail(f"-o {output}: `compare` writes {', '.join(COMPARE_FORMATS)}; name the file .txt, .md, .json or .html")
    fmt = fmt or "terminal"
    config = _config(select, ignore, sets, Path(run_a).resolve().parent)
    before = load_and_analyze([run_a])
    after = load_and_analyze([run_b])
    comparison = compare_runs(
        before, after, diagnose(before, config, kind="analyze"), diagnose(after, config, kind="analyze")
    )
    color = fmt == "terminal" and output is None and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    text = render_comparison(comparison, fmt, color=color)
    if output:
        Path(output).write_text(text, encoding="utf-8")
        click.echo(f"gpudoctor: wrote {fmt} comparison to {output}", err=True)
    else:
        click.echo(text, nl=not text.endswith("\n"))
    if fail_pct is not None:
        change = comparison.step_time.change_pct
        if change is None:
            _fail(f"--fail-on-regression: cannot judge, {comparison.step_time.verdict_text}", EXIT_USAGE)
        if change > fail_pct:
            click.echo(
                f"gpudoctor: regression: B's median step time is {change:.1f}% slower than A's "
                f"(more than --fail-on-regression {fail_pct:g}%)",
                err=True,
            )
            sys.exit(EXIT_FINDINGS)
    sys.exit(EXIT_OK)


@cli.command()
@click.argument("run_dir", type=click.Path())
@click.option("--port", type=int, default=0, help="Port on 127.0.0.1 (default: a free one).")
@click.option("--no-browser", is_flag=True, default=True, hidden=True)
def view(run_dir, port, no_browser):
    """Open a run in TensorBoard with the PyTorch profiler plugin (Ctrl-C stops it)."""
    from gpudoctor.view import serve

    sys.exit(serve(Path(run_dir), port=port, echo=lambda s: click.echo(s, err=True)))


@cli.command(name="rules")
def rules_cmd():
    """List the rule catalogue."""
    from gpudoctor.rules import catalogue_table

    click.echo(catalogue_table())


@cli.command()
@click.argument("code")
def explain(code):
    """Print a rule's documentation (e.g. gpudoctor explain GD201)."""
    from gpudoctor.rules import explain as explain_rule

    click.echo(explain_rule(code))


def main() -> None:
    try:
        cli.main(standalone_mode=False, prog_name="gpudoctor")
    except click.exceptions.Abort:
        click.echo("gpudoctor: interrupted", err=True)
        sys.exit(130)
    except click.UsageError as err:
        hint = " (see gpudoctor --help)" if err.ctx is None else f" (see gpudoctor {err.ctx.command.name} --help)"
        _fail(err.format_message() + hint, EXIT_USAGE)
    except click.ClickException as err:
        _fail(err.format_message(), EXIT_USAGE)
    except GpudoctorError as err:
        _fail(str(err), err.exit_code)
    except KeyboardInterrupt:
        click.echo("gpudoctor: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(EXIT_OK)
    except SystemExit:
        raise
    except Exception as err:  # a bug in gpudoctor: one line, and the traceback on request
        if os.environ.get("GPUDOCTOR_DEBUG"):
            raise
        _fail(
            f"internal error: {type(err).__name__}: {err} "
            "(set GPUDOCTOR_DEBUG=1 for the traceback and please report it)",
            EXIT_INTERNAL,
        )


if __name__ == "__main__":
    main()
