"""``gpudoctor check``: the static review of scripts, and ``--fix`` / ``--diff`` (issue 29).

A command of ``cli.py``'s group (registered there with ``cli.add_command``), kept in a module
of its own beside the options it shares (``cli_options.py``). It exits through ``sys.exit``
with the codes its docstring lists (ruff's conventions); a user's mistake is a
``UsageError``, which ``cli.main`` turns into one line and exit 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from gpudoctor.cli_options import (
    fail_on_exit_code,
    guard_sources,
    output_file,
    report_options,
    rule_config,
    rule_options,
)
from gpudoctor.console import check_output_writable, emit_report, output_format, print_stdout, say
from gpudoctor.errors import EXIT_FINDINGS, UsageError


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@rule_options
@report_options
@click.option("--fix", is_flag=True,
              help="Make the fixes that are mechanical and safe in the files (see `gpudoctor rules`), then report "
                   "what remains.")
@click.option("--diff", is_flag=True, help="Print the fixes --fix would make as a unified diff; write nothing.")
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="num_workers the fixes set (default: the cores of this machine less one).")
@click.option("--from", "from_run", type=click.Path(file_okay=False), default=None, metavar="RUN",
              help="Set what `gpudoctor verify` measured in RUN (a run directory of `profile`); skip the fixes it "
                   "refuted.")
@click.option("--exit-non-zero-on-fix", is_flag=True, help="With --fix, exit 1 when a file was changed.")
def check(paths, select, ignore, sets, fail_on, fmt, output, quiet, color, fix, diff, workers, from_run,
          exit_non_zero_on_fix):
    """Review training scripts (files or folders) without running them.

    With --fix, the fixes whose rule declares them mechanical and safe (DataLoader
    workers, pinned memory, non_blocking copies, a fused optimizer, cudnn.benchmark,
    torch.no_grad() around evaluation) are written into the files given, keeping the
    rest of each file byte for byte; the report then shows what remains, and stderr says
    per file what changed. In a folder, only files inside it are read and changed (a
    symlink that leads out is left alone). --diff prints the same changes as a unified
    diff and writes nothing. AMP and other changes of the numerics are never made. Files
    over 1 MiB are skipped with one line.

    \b
    Exit codes (ruff's conventions):
      0  no finding at or above --fail-on remains (none is asked without it);
         with --diff, no change to show
      1  a finding at or above --fail-on remains; --diff: a change to show;
         --fix --exit-non-zero-on-fix: a file was changed; --fix: a file's
         fixes could not be made or written (read-only, a full disk, the
         file changed since it was read), as ruff reports an I/O error
         (E902) that remains
      2  usage error (a missing path, bad arguments, an unreadable --from run)
      4  internal error in gpudoctor
    """
    from gpudoctor.static import check_paths

    config = rule_config(select, ignore, sets, Path(paths[0]).resolve().parent)
    targets = [Path(p) for p in paths]
    if fix and diff:
        raise UsageError("--fix and --diff cannot be combined: --diff shows what --fix would write")
    if output:  # -o is judged before anything is written: its format, that it can be written, not a source
        if not fmt:
            output_format(output)
        guard_output(output, targets)
        check_output_writable(output)
    if not (fix or diff):
        if workers is not None or from_run is not None or exit_non_zero_on_fix:
            raise UsageError("--workers, --from and --exit-non-zero-on-fix go with --fix or --diff")
        rep = check_paths(targets, config)
        for line in rep.errors:  # files that could not be checked: the rest were
            say(f"gpudoctor: warning: {line}")
        emit_report(rep, fmt, output, quiet, color)
        sys.exit(fail_on_exit_code(rep, fail_on))
    sys.exit(_check_fix(targets, config, fail_on, fmt, output, quiet, color, diff, workers, from_run,
                        exit_non_zero_on_fix))


def _check_fix(targets, config, fail_on, fmt, output, quiet, color, diff, workers, from_run, exit_on_fix) -> int:  # noqa: ANN001
    """``check --fix`` / ``--diff``: the exit code (see ``check``'s docstring)."""
    from gpudoctor.autofix import fix_paths
    from gpudoctor.static.sizing import sizing

    result = fix_paths(targets, config, sizing=sizing(workers, Path(from_run) if from_run else None), write=not diff)
    for line in result.report.errors:
        say(f"gpudoctor: warning: {line}")
    for line in result.summary():
        say(f"gpudoctor: {line}")
    if diff:
        text = result.diff()
        if text:
            print_stdout(text, what="the diff")
        return EXIT_FINDINGS if text else fail_on_exit_code(result.report, fail_on)
    emit_report(result.report, fmt, output, quiet, color)
    if result.unwritten:  # a fix that could not be written is an error that remains, as ruff's E902
        return EXIT_FINDINGS
    if exit_on_fix and result.changed:
        return EXIT_FINDINGS
    return fail_on_exit_code(result.report, fail_on)


def guard_output(output: str, paths: list[Path]) -> None:
    """``-o`` may never name a script given or found in a folder given, nor a project module they import
    (check reads them: ``--fix`` may rewrite them), nor anything that resolves to one (a symlink, a hard
    link, ``./x/../train.py``): a ``UsageError`` (exit 2) before anything is written.

    The modules a script imports are found by reading the project (what the check then does again): only
    for an ``-o`` that may be one, a Python file by its real name or a file with another link to it, not
    for the common ``-o review.md`` that a run before wrote."""
    from gpudoctor.static import project_files
    from gpudoctor.static.sources import discover

    out = output_file(output)
    if out is None:
        return
    guard_sources(output, [*paths, *(t.path for t in discover(paths)[0])], "a script check reads")
    if os.path.realpath(output).endswith((".py", ".pyw")) or out.st_nlink > 1:
        guard_sources(output, list(map(Path, project_files(paths))), "a module a script check reads imports")
