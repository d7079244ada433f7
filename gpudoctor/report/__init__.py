"""Renderers: one per format, pure formatting of a ``Report`` (see DESIGN.md).

``render(report, fmt)`` returns the whole document as text; ``format_from_path``
guesses the format from an output file's name. Renderers compute nothing: every
number they show is a field of the report (findings, checklist, summary, the run's
``TraceMetrics``, steps and samples, ranks); they convert units for display and lay
things out. This package imports only ``gpudoctor.model`` and ``gpudoctor.errors``.
"""

from __future__ import annotations

from gpudoctor.errors import UsageError
from gpudoctor.model import Report

FORMATS = ("terminal", "md", "json", "html", "sarif", "github")

# Longest suffix first: ".sarif.json" is SARIF, not JSON.
_SUFFIXES = (
    (".sarif.json", "sarif"),
    (".sarif", "sarif"),
    (".json", "json"),
    (".markdown", "md"),
    (".md", "md"),
    (".html", "html"),
    (".htm", "html"),
    (".txt", "terminal"),
    (".log", "terminal"),
)


def format_from_path(path: str) -> str:
    """The format an output file's extension asks for; UsageError when it says none.

    ``.md``/``.markdown`` → md, ``.json`` → json, ``.sarif``/``.sarif.json`` → sarif,
    ``.html``/``.htm`` → html, ``.txt``/``.log`` → terminal (without colour).
    """
    name = str(path).replace("\\", "/").rsplit("/", 1)[-1].lower()
    for suffix, fmt in _SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return fmt
    raise UsageError(
        f"cannot tell the report format from the file name {str(path)!r}: "
        "name it .md, .json, .html, .sarif or .txt, or pass --format"
    )


def render(report: Report, fmt: str, *, color: bool = False, quiet: bool = False) -> str:
    """The report as ``fmt`` (terminal | md | json | html | sarif | github: workflow commands).

    ``color`` (terminal only) adds ANSI colours; the CLI decides (``cli.use_color``: a TTY,
    NO_COLOR, FORCE_COLOR, --color). ``quiet`` (terminal only) keeps the findings alone.
    """
    if fmt == "terminal":
        from gpudoctor.report.terminal import render_terminal

        return render_terminal(report, color=color, quiet=quiet)
    if fmt == "md":
        from gpudoctor.report.markdown import render_markdown

        return render_markdown(report)
    if fmt == "json":
        from gpudoctor.report.jsonfmt import render_json

        return render_json(report)
    if fmt == "html":
        from gpudoctor.report.htmlfmt import render_html

        return render_html(report)
    if fmt == "sarif":
        from gpudoctor.report.sarif import render_sarif

        return render_sarif(report)
    if fmt == "github":
        from gpudoctor.report.github import render_github

        return render_github(report)
    raise UsageError(f"unknown report format {fmt!r}: use one of {', '.join(FORMATS)}")


from gpudoctor.report import notebook as _notebook  # noqa: E402 - a Report shows itself in Jupyter once imported

_notebook.register()

__all__ = ["FORMATS", "format_from_path", "render"]
