"""Command line: the only module that exits the process.

Each command is thin: it turns options into calls on the layers of DESIGN.md
(collect → parse → analysis → engine → report) and errors into one line and an
exit code. Heavy modules are imported inside the commands so that
``gpudoctor --help`` and ``gpudoctor analyze`` never import torch.

The exit code is the README's under every plumbing condition: a reader that went
away (``| head -1``, ``| true``), a closed stdout (``>&-``) or stderr, an ``-o`` that
cannot be written (exit 2, before ``profile`` runs anything), a read-only run
directory (the report is printed, ``report.json`` skipped). gpudoctor's own lines
are escaped (``gpudoctor.safe.terminal_line``): a file name or a script's message
cannot drive the terminal.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import click

from gpudoctor import __version__, signals
from gpudoctor.cli_options import (  # noqa: F401 - DEFAULT_*: read here by the tests
    DEFAULT_BUDGET_S,
    DEFAULT_STEPS,
    DEFAULT_TRIALS,
    VERIFY_HELP,
    ScriptCommand,
    color_option,
    fail_on_exit_code,
    guard_sources,
    one_line,
    parallel_options,
    report_options,
    rule_config,
    rule_options,
    verify_options,
)
from gpudoctor.console import (  # noqa: F401 - use_color: re-exported
    ask_yes,
    at_terminal,
    check_output_writable,
    emit_report,
    print_stdout,
    say,
    silence_stdout,
    stdout_is_tty,
    use_color,
    write_output,
)
from gpudoctor.errors import (
    EXIT_FINDINGS,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SCRIPT_FAILED,
    EXIT_USAGE,
    GpudoctorError,
    UsageError,
)
from gpudoctor.model import layout

# --------------------------------------------------------------------------- helpers


def _fail(message: str, code: int = EXIT_USAGE) -> None:
    say(f"gpudoctor: error: {message}")
    sys.exit(code)


def write_run_report(report, run_dir: Path) -> None:
    """``report.json`` into the run directory; a read-only one (a shared mount, an artifact store) only skips it."""
    from gpudoctor.engine import write_report_json

    try:
        write_report_json(report, run_dir)
    except GpudoctorError as err:
        say(f"gpudoctor: note: {layout.REPORT} not written: {err}")


def load_and_analyze(paths: list[str], jobs: int | None = None, cluster: str | None = None):
    """parse → analysis for anything ``analyze`` takes; returns a ``RunData`` with metrics.

    ``jobs``: processes (default: the cores available); ``cluster``: a Dask scheduler's address."""
    from gpudoctor.pipeline import analyze_paths

    return analyze_paths(paths, jobs=jobs, cluster=cluster, meanwhile=_import_engine)


def _import_engine() -> None:
    """The rule engine's own imports (~20-35 ms: ``pipeline`` has imported most of what it needs):
    done while a large trace's other part is still being read, where ``load_and_analyze`` would
    otherwise wait."""
    import gpudoctor.engine  # noqa: F401


def _verify(report, config, steps, trials, budget, max_trials=None):
    """Trial runs for ``report``'s findings; returns (report with verifications, the exit code of the
    signal that stopped the trials: 130, 143 or 129; 0 when none did)."""
    from gpudoctor.verify import VerifyOptions, progress_to_stderr, verify_report

    # the run this command just made: profile --verify trusts its own run
    opts = VerifyOptions(steps=steps, trials=trials, budget_s=budget, max_trials=max_trials,
                         progress=progress_to_stderr, yes=True)
    result = verify_report(report, config, opts)
    if not result.interrupted:
        return result.report, 0
    from gpudoctor.signals import exit_code

    return result.report, exit_code(result.signum) if result.signum else EXIT_INTERRUPTED


# --------------------------------------------------------------------------- commands


class _Stopped(BaseException):
    """SIGTERM or SIGHUP stopped a command: carried past click, which would print a blank line for
    any ``KeyboardInterrupt`` (right after a terminal's ``^C``, not after a ``kill``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Group(click.Group):
    def invoke(self, ctx: click.Context):  # noqa: ANN201
        try:
            return super().invoke(ctx)
        except signals.Interrupted as err:
            if err.signum == signal.SIGINT:
                raise
            raise _Stopped(err.signum) from err


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True)
@click.version_option(__version__, prog_name="gpudoctor")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Why is my GPU waiting, and what should I change?

    \b
      gpudoctor profile train.py --epochs 1      run, measure, diagnose
      gpudoctor analyze RUN_OR_TRACE             diagnose a saved run or any Kineto trace
      gpudoctor report RUN -o review.md          render terminal | md | json | html | sarif
      gpudoctor check train.py                   review a script without running it
      gpudoctor compare RUN_A RUN_B              before/after: what changed, by how much
      gpudoctor verify RUN                       apply the fixes in trial runs, measure the speed-up
      gpudoctor view RUN                         open the run in TensorBoard
      gpudoctor rules / explain GD201            the rule catalogue
    """
    if ctx.invoked_subcommand is None:  # bare `gpudoctor`: the help, and success
        print_stdout(ctx.get_help(), what="the help")
    signals.pause_point("command")


@cli.command(cls=ScriptCommand)
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
@click.option("--wait", type=click.IntRange(min=0), default=294, show_default=True, help="Steps between profiled windows (default: a window every 300 steps; with --steps N, fewer, so that a second window fits).")
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
@click.option("--verify", "verify", is_flag=True, help=VERIFY_HELP)
@verify_options
@rule_options
@report_options
def profile(script, script_args, module, out, steps, skip_first, wait, warmup, active, repeat, shapes, stack,
            memory, cprofile, sample_interval_ms, time_window, nproc_per_node, nnodes, node_rank, rdzv_endpoint,
            master_port, no_report, verify, verify_steps, verify_trials, verify_max_trials, verify_budget, select, ignore, sets,
            fail_on, fmt, output, quiet, color):
    """Run SCRIPT under the profilers and diagnose it.

    \b
    Everything after the script goes to it, as with python and torchrun:
      gpudoctor profile --steps 40 train.py --epochs 1
    gpudoctor's options come before the script (a `--` right after it is dropped).

    With --verify, each fix gpudoctor can apply itself is then measured in trial runs
    of the script (see `gpudoctor verify --help`).
    """
    from gpudoctor.collect import ProfileOptions, profile_run
    from gpudoctor.collect.options import parse_time_window, short_run_wait

    if module and script:
        script_args = (script, *script_args)
        script = None
    if not module and not script:
        _fail("give a script to profile: gpudoctor profile [OPTIONS] train.py ARGS (or -m module ARGS)")
    if verify and no_report:
        _fail("--verify needs the diagnosis: drop --no-report")
    if verify:
        from gpudoctor.verify import VerifyOptions

        VerifyOptions(steps=verify_steps, trials=verify_trials, budget_s=verify_budget,
                      max_trials=verify_max_trials).check()
    if click.get_current_context().get_parameter_source("wait") == click.core.ParameterSource.DEFAULT:
        # --steps N: a second, timings-only window fits before the run stops
        wait = short_run_wait(steps, skip_first, warmup, active, repeat, wait)
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
        progress=not quiet,  # and only when stderr is a terminal (collect/progress.py)
    )
    if not no_report:
        if output and not fmt:
            from gpudoctor.report import format_from_path

            format_from_path(output)  # a name that says no format: exit 2 now, not after the run
        if output:  # never the script (or the file `-m` finds)
            from gpudoctor.collect.options import _find_module

            origin = script or (_find_module(module, os.getcwd()) if module else None)
            guard_sources(output, [Path(origin)] if origin else [], "the script profile runs")
        check_output_writable(output)
    signals.pause_point("parsed")
    result = profile_run(opts)
    code = result.exit_code
    if signals.stopped_during_startup(result.manifest.status_detail):
        no_report = True  # the script never ran: nothing to diagnose (the run's summary said so)
    if not no_report:
        try:
            config = rule_config(select, ignore, sets, Path(script).resolve().parent if script else Path.cwd())
            run = load_and_analyze([str(result.run_dir)])
            from gpudoctor.engine import diagnose

            report = diagnose(run, config, kind="profile")
            interrupted = 0
            if verify:
                if result.exit_code != 0:
                    say(f"gpudoctor: --verify skipped: the script ended with exit code {result.exit_code} "
                        f"({result.manifest.status_detail or result.manifest.status.value})")
                else:
                    report, interrupted = _verify(report, config, verify_steps, verify_trials, verify_budget,
                                                  verify_max_trials)
            write_run_report(report, result.run_dir)
        except GpudoctorError as err:
            say(f"gpudoctor: could not diagnose the run: {err}")
        else:
            try:
                emit_report(report, fmt, output, quiet, color)
            except UsageError as err:  # -o could be written before the run, not now (a disk filled up)
                _fail(f"{err}; the report is in {result.run_dir / layout.REPORT}", EXIT_USAGE)
            if fail_on:
                code = EXIT_SCRIPT_FAILED if result.exit_code != 0 else fail_on_exit_code(report, fail_on)
            if interrupted:
                code = interrupted
    sys.exit(code)


@cli.command()
@click.argument("paths", nargs=-1, required=True)
@parallel_options
@rule_options
@report_options
def analyze(paths, jobs, cluster, select, ignore, sets, fail_on, fmt, output, quiet, color):
    """Diagnose a saved run directory, a Kineto trace, or a folder of traces (one per rank).

    Several run directories (one per node) are merged into one job. Traces are read in
    parallel processes (--jobs) or on a Dask cluster (--cluster).
    """
    run = load_and_analyze(list(paths), jobs=jobs, cluster=cluster)
    # imported after: while a large trace's other part was still being read (_import_engine)
    from gpudoctor.engine import diagnose

    config = rule_config(select, ignore, sets, Path(paths[0]).resolve().parent)
    report = diagnose(run, config, kind="analyze")
    first = Path(paths[0])
    if len(paths) == 1 and (first / layout.MANIFEST).is_file():
        from gpudoctor.verify import carry_over, read_previous

        notes: list[str] = []  # verifications a malformed report.json held: said, not dropped silently
        report = carry_over(report, read_previous(first, notes), notes)  # what `verify` measured stays
        write_run_report(report, first)
    emit_report(report, fmt, output, quiet, color)
    sys.exit(fail_on_exit_code(report, fail_on))


@cli.command(name="verify")
@click.argument("run_dir", type=click.Path(file_okay=False))
@verify_options
@rule_options
@report_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Folder for the trial runs (default: RUN_DIR/verify); a read-only run needs one.")
@click.option("--yes", "yes", is_flag=True,
              help="Run the trials of a run this user's gpudoctor did not make, or whose manifest changed since "
                   "(a colleague's run, an attachment, a CI artifact): its script runs as yours. Without it, "
                   "verify shows the command and asks at a terminal, and refuses elsewhere.")
@click.option("--allow-changed", is_flag=True,
              help="Run the script even when it changed since it was profiled (its SHA-256 differs, or the run "
                   "recorded none).")
def verify_cmd(run_dir, verify_steps, verify_trials, verify_max_trials, verify_budget, select, ignore, sets, fail_on,
               fmt, output, quiet, color, out_dir, yes, allow_changed):
    """Prove the fixes: run RUN_DIR's script again with each fix applied and measure the speed-up.

    RUN_DIR is a run directory of `gpudoctor profile`; its script is run again as the
    manifest recorded it (same folder and arguments). For each finding whose fix
    gpudoctor can apply without editing the source (DataLoader arguments at the call
    site, cudnn.benchmark, TF32, thread counts, allocator environment, fused
    optimizers, non-blocking copies of DataLoader batches), trial runs with the fix
    alternate with baseline runs without it; each is stopped after --verify-steps
    steps and times its steps only (no torch.profiler, no cProfile). The run is the
    unit: each run's time per step (its steady steps' total / their count) is one
    figure, and the speed-up (baseline time per step / trial time per step, the median
    step shown beside it) gets a 95% interval from Welch's t-test on those figures. A
    fix still undecided after --verify-trials rounds gets more rounds, up to
    --verify-max-trials, and a second look (the 5% error rate shared by the two
    looks). A fix of num_workers or batch_size that is not confirmed is tried again at
    twice the value, while that does better and the budget allows; the finding's fix
    then names the best value measured. Each finding gets confirmed, refuted,
    inconclusive or not_tried; inconclusive also when other processes loaded the
    machine more during one side's runs, or the untouched script ran far slower than
    in the profiled run (the report says how busy the machine was). Fixes that change
    numerics or need a code change (AMP, torch.compile, no_grad) are not tried. With
    nothing to try, one line on stderr says so. docs/verify.md has the statistics and
    their A/A test.

    Trials are real runs of your script: its side effects (files it writes,
    checkpoints, network) happen again. A run directory is data from anywhere, and
    verify runs what its manifest names: it runs the trials without asking only for
    a run this user's gpudoctor made, unchanged since (a keyed record kept outside the
    run, in ~/.local/state/gpudoctor; docs/verify.md). Otherwise it prints the exact
    command and asks (a yes typed at a terminal; elsewhere, exit 2 unless --yes). It
    refuses a script that changed since it was profiled or whose manifest recorded no
    SHA-256 (--allow-changed). They run under
    RUN_DIR/verify/ (replaced by the next verify; --out DIR elsewhere, e.g. for a
    read-only run; two verifies of one folder do not run at once), their output in each
    run's output.log. Ctrl-C, SIGTERM or SIGHUP stops the trials at once and reports
    what was measured (exit 130, 143, 129). report.json is rewritten with the
    verifications.
    """
    from gpudoctor.verify import VerifyOptions, progress_to_stderr, verify_run

    path = Path(run_dir)
    if not (path / layout.MANIFEST).is_file():
        _fail(f"{run_dir}: not a run directory of `gpudoctor profile` (no {layout.MANIFEST}); verify runs its script again")
    opts = VerifyOptions(steps=verify_steps, trials=verify_trials, budget_s=verify_budget, max_trials=verify_max_trials,
                         progress=progress_to_stderr, out_dir=Path(out_dir) if out_dir else None,
                         allow_changed=allow_changed, yes=yes, confirm=ask_yes if at_terminal() else None)
    opts.check()
    from gpudoctor.collect.options import require_torch

    require_torch()  # the trials run the script: before anything is written
    if output:
        from gpudoctor.verify.trials import trial_sources

        guard_sources(output, trial_sources(path), "the script verify runs again")
    config = rule_config(select, ignore, sets, path.resolve().parent)
    result = verify_run(path, config, opts)
    write_run_report(result.report, path)
    emit_report(result.report, fmt, output, quiet, color)
    if result.interrupted:  # 130 on Ctrl-C, 143 on SIGTERM, 129 on SIGHUP: what was measured is reported
        from gpudoctor.signals import exit_code

        sys.exit(exit_code(result.signum) if result.signum else EXIT_INTERRUPTED)
    sys.exit(fail_on_exit_code(result.report, fail_on))


@cli.command()
@click.argument("paths", nargs=-1, required=True)
@parallel_options
@rule_options
@report_options
def report(paths, jobs, cluster, select, ignore, sets, fail_on, fmt, output, quiet, color):
    """Render the diagnosis of a run or trace as terminal, md, json, html or sarif.

    The format is guessed from -o's extension when --format is not given.
    """
    from gpudoctor.engine import diagnose

    run = load_and_analyze(list(paths), jobs=jobs, cluster=cluster)
    config = rule_config(select, ignore, sets, Path(paths[0]).resolve().parent)
    rep = diagnose(run, config, kind="analyze")
    if len(paths) == 1 and (Path(paths[0]) / layout.MANIFEST).is_file():
        from gpudoctor.verify import carry_over, read_previous

        rep = carry_over(rep, read_previous(Path(paths[0]), notes := []), notes)  # what `verify` measured, shown
    emit_report(rep, fmt, output, quiet, color)
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
    help="Exit 1 when B's median step time is more than PCT% slower than A's, beyond noise (per sample when the batch "
    "size changed); 2 when there are too few steps to tell.",
)
@click.option("--select", multiple=True, metavar="CODE", help="Run only these rules on both runs (codes or prefixes).")
@click.option("--ignore", multiple=True, metavar="CODE", help="Skip these rules on both runs (codes or prefixes).")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE", help="Override a threshold for both runs.")
@click.option("--format", "fmt", type=click.Choice(("terminal", "md", "json", "html")), default=None, help="Output format.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the comparison to FILE.")
@color_option
def compare(run_a, run_b, fail_pct, select, ignore, sets, fmt, output, color):
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
    config = rule_config(select, ignore, sets, Path(run_a).resolve().parent)
    before = load_and_analyze([run_a])
    after = load_and_analyze([run_b])
    comparison = compare_runs(
        before, after, diagnose(before, config, kind="analyze"), diagnose(after, config, kind="analyze")
    )
    text = render_comparison(comparison, fmt, color=fmt == "terminal" and output is None
                             and use_color(color, stdout_is_tty()))
    if output:
        write_output(output, text, what="comparison")
        say(f"gpudoctor: wrote {fmt} comparison to {output}")
    else:
        print_stdout(text, what="the comparison")
    sys.exit(regression_gate(comparison.step_time, fail_pct))


def regression_gate(step, fail_pct: float | None) -> int:
    """``--fail-on-regression PCT``: 1 only for a slowdown beyond noise and beyond PCT.

    When the comparison cannot tell (too few steps, no step times), the gate cannot pass
    judgement either: exit 2 with the reason. A slowdown of more than PCT that the test
    calls noise is not a regression: exit 0, with a warning that says so.
    """
    from gpudoctor.model import StepTimeVerdict

    if fail_pct is None:
        return EXIT_OK
    change = step.change_pct
    if step.verdict in (StepTimeVerdict.TOO_FEW_STEPS, StepTimeVerdict.NOT_MEASURED) or change is None:
        say(f"gpudoctor: error: --fail-on-regression {fail_pct:g}: cannot judge: {step.verdict_text} "
            "Record more steps on both sides (gpudoctor profile --steps N)")
        return EXIT_USAGE
    if change <= fail_pct:
        return EXIT_OK
    if step.verdict != StepTimeVerdict.SLOWER:
        say(f"gpudoctor: warning: B's median step is {change:.1f}% slower than A's (more than --fail-on-regression "
            f"{fail_pct:g}%), but within noise: not failing the gate. {step.verdict_text}")
        return EXIT_OK
    say(f"gpudoctor: regression: B's median step time is {change:.1f}% slower than A's "
        f"(more than --fail-on-regression {fail_pct:g}%)")
    return EXIT_FINDINGS


@cli.command()
@click.argument("run_dir", type=click.Path())
@click.option("--port", type=int, default=0, help="Port on 127.0.0.1 (default: a free one).")
@click.option("--no-browser", is_flag=True, default=True, hidden=True)
def view(run_dir, port, no_browser):
    """Open a run in TensorBoard with the PyTorch profiler plugin (Ctrl-C stops it)."""
    from gpudoctor.view import serve

    sys.exit(serve(Path(run_dir), port=port, echo=say))


@cli.command(name="rules")
def rules_cmd():
    """List the rule catalogue."""
    from gpudoctor.rules import catalogue_table

    print_stdout(catalogue_table(), what="the catalogue")


@cli.command()
@click.argument("code")
def explain(code):
    """Print a rule's documentation (e.g. gpudoctor explain GD201)."""
    from gpudoctor.rules import explain as explain_rule

    print_stdout(explain_rule(code), what="the rule's documentation")


def _register() -> None:
    """The commands kept in modules of their own (a long cli.py is hard to read)."""
    from gpudoctor.cli_check import check

    cli.add_command(check)


_register()


def _interrupted(err: BaseException) -> None:
    """SIGINT, SIGTERM or SIGHUP stopped gpudoctor: one line, exit 128 + the signal (130, 143, 129)."""
    signum = err.signum if isinstance(err, _Stopped) else signals.signum_of(err)
    signals.ignore()  # a second signal cannot interrupt the way out
    say(signals.stop_line(signum))
    sys.exit(signals.exit_code(signum))


def main() -> None:
    # the entry point (gpudoctor/__main__.py) installed the handlers before click was imported;
    # called on its own (in-process, an older console script), main installs them for the call
    with signals.handling():
        _main()


def _main() -> None:
    try:
        cli.main(standalone_mode=False, prog_name="gpudoctor")
    except click.exceptions.Abort as err:  # click's form of a KeyboardInterrupt (an Interrupted)
        _interrupted(err)
    except _Stopped as err:
        _interrupted(err)
    except click.UsageError as err:
        # the group's own context is named after its function (`cli`): only a subcommand's path is a command
        sub = err.ctx is not None and err.ctx.parent is not None
        hint = f" (see {err.ctx.command_path} --help)" if sub else " (see gpudoctor --help)"
        _fail(err.format_message() + hint, EXIT_USAGE)
    except click.ClickException as err:
        _fail(err.format_message(), EXIT_USAGE)
    except GpudoctorError as err:
        _fail(str(err), err.exit_code)
    except KeyboardInterrupt as err:
        _interrupted(err)
    except MemoryError:  # a trace larger than the memory this process may use (ulimit -v, a container's limit)
        _fail("out of memory: the input needs more memory than this process may use; free memory or raise the "
              "limit (ulimit -v, the container's memory), or analyze one trace at a time with --jobs 1", EXIT_USAGE)
    except RecursionError:  # a file nested deeper than any decoder recurses (a trace's is caught where it is read)
        _fail("an input file nests deeper than gpudoctor reads (RecursionError): it is malformed; re-record it or "
              "pass another file (GPUDOCTOR_DEBUG=1 shows where)", EXIT_USAGE)
    except BrokenPipeError:  # --help or --version into a reader that went away
        silence_stdout()
        sys.exit(EXIT_OK)
    except SystemExit:
        raise
    except Exception as err:  # a bug in gpudoctor: one line, and the traceback on request
        if os.environ.get("GPUDOCTOR_DEBUG"):
            raise
        _fail(
            f"internal error: {type(err).__name__}: {one_line(err)} "
            "(set GPUDOCTOR_DEBUG=1 for the traceback and please report it)",
            EXIT_INTERNAL,
        )


if __name__ == "__main__":
    main()
