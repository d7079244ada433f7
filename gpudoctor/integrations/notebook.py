"""``%load_ext gpudoctor``: the ``%%gpudoctor`` cell magic and the ``%gpudoctor_report`` line magic.

    %load_ext gpudoctor

    %%gpudoctor --steps 40 --out runs
    for x, y in loader: ...            # the cell runs inside gpudoctor.session(); its report is shown after it

    %gpudoctor_report runs/session-20261129-101500   # show a saved run's report

The cell runs in the notebook's namespace, as it would without the magic; the session is the cell's value's
neighbour: ``_gpudoctor`` in the namespace holds it (``_gpudoctor.report``, ``_gpudoctor.run_dir``). IPython is
imported only here, when the extension is loaded.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from gpudoctor.errors import UsageError

SESSION_NAME = "_gpudoctor"  # the last %%gpudoctor cell's session, in the notebook's namespace


def _cell_args(line: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="%%gpudoctor", add_help=False, exit_on_error=False)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--out", default="gpudoctor-runs")
    parser.add_argument("--name", default="cell")
    parser.add_argument("--select", default="")
    parser.add_argument("--ignore", default="")
    try:
        args, rest = parser.parse_known_args(shlex.split(line))
    except (argparse.ArgumentError, ValueError) as err:
        raise UsageError(f"%%gpudoctor {line}: {err}; options: --steps N --out DIR --name NAME --select/--ignore CODES") from err
    if rest:
        raise UsageError(f"%%gpudoctor: unknown option(s) {' '.join(rest)}; options: --steps N --out DIR --name NAME "
                         "--select/--ignore CODES")
    return args


def _codes(text: str) -> tuple[str, ...]:
    return tuple(c.strip().upper() for c in text.split(",") if c.strip())


def gpudoctor_cell(shell: Any, line: str, cell: str) -> Any:
    """Run ``cell`` inside ``gpudoctor.session()`` and return its report (Jupyter displays it)."""
    from gpudoctor.api import session  # noqa: PLC0415

    args = _cell_args(line)
    s = session(out=args.out, steps=args.steps, name=args.name, select=_codes(args.select), ignore=_codes(args.ignore))
    shell.user_ns[SESSION_NAME] = s
    with s:
        shell.ex(cell)  # the notebook's namespace; an exception ends the run as failed and is shown as usual
    return s.report


def gpudoctor_report(line: str) -> Any:
    """The report of the saved run directory ``line`` (Jupyter displays it)."""
    from gpudoctor.api import load  # noqa: PLC0415

    path = line.strip()
    if not path:
        raise UsageError("%gpudoctor_report RUN_DIR: give a run directory (a session's s.run_dir, or profile's)")
    return load(path)


def load_ipython_extension(shell: Any) -> None:
    """``%load_ext gpudoctor``: register the two magics."""

    def cell_magic(line: str, cell: str) -> Any:
        return gpudoctor_cell(shell, line, cell)

    def line_magic(line: str) -> Any:
        return gpudoctor_report(line)

    cell_magic.__doc__ = gpudoctor_cell.__doc__
    line_magic.__doc__ = gpudoctor_report.__doc__
    shell.register_magic_function(cell_magic, magic_kind="cell", magic_name="gpudoctor")
    shell.register_magic_function(line_magic, magic_kind="line", magic_name="gpudoctor_report")
