"""``--format github``: GitHub Actions workflow commands, one per finding, that the runner turns into
annotations on the pull request's lines (the convention ruff and others use).

    ::warning file=train.py,line=31,col=14,title=GD201 dataloader-stall::DataLoader at train.py:31 …

Severity: error → ``::error``, warning → ``::warning``, info → ``::notice``. A finding without
a location is annotated on the run (no ``file``). The message carries the fix's instruction;
files that could not be checked and rules that crashed are ``::warning`` lines too, and so is each of
the report's warnings (the step figures are partial …), first.

Escaping follows GitHub's toolkit (``@actions/core``, ``command.ts``): in the message ``%``,
``\\r`` and ``\\n`` become ``%25``, ``%0D`` and ``%0A``; in a property, ``:`` and ``,`` become
``%3A`` and ``%2C`` besides. A file name or a message cannot therefore end the command early
or add a property. Every other control character (ESC, BEL, C1, the bidirectional overrides)
is shown as a visible escape (``\\x1b``) by ``safe.escape_controls``, as in every other format: a
file name cannot retitle or clear the terminal that shows the job's log. Absolute paths under
the working directory are made relative to it: start gpudoctor in the repository's root, as
GitHub resolves ``file`` there.
"""

from __future__ import annotations

import os

from gpudoctor.model import Finding, Report, Severity
from gpudoctor.report import _fmt as f

_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def escape_data(text: str) -> str:
    return f.clean(text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A"))


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _path(file: str) -> str:
    if os.path.isabs(file):
        rel = os.path.relpath(file)
        if not rel.startswith(".."):
            return rel
    return file


def _command(fd: Finding) -> str:
    props = []
    loc = fd.location
    if loc is not None:
        props.append(f"file={escape_property(_path(loc.file))}")
        props.append(f"line={loc.line}")
        if loc.col:
            props.append(f"col={loc.col}")
    props.append(f"title={escape_property(f'{fd.code} {fd.name}')}")
    message = fd.message + (f" Fix: {fd.fix.instruction}" if fd.fix.instruction else "")
    if fd.rank is not None:
        message = f"[rank {fd.rank}] {message}"
    return f"::{_COMMAND[fd.severity]} {','.join(props)}::{escape_data(message)}"


def render_github(report: Report) -> str:
    lines = [f"::warning title=gpudoctor::{escape_data(w)}" for w in report.warnings]
    lines += [_command(fd) for fd in report.findings]
    lines += [f"::warning title=gpudoctor::{escape_data(e)}" for e in report.errors]
    return "\n".join(lines) + ("\n" if lines else "")
