"""A ``Report`` in a notebook: Jupyter's HTML display and IPython's text display (``model.findings.DISPLAY``).

The HTML is a fragment of the HTML report (``htmlfmt``): its headline, the account (the step's exclusive bar,
the Top actions) and the findings, with a style sheet scoped to the fragment (a notebook page is not ours to
restyle). Offline like the report: inline CSS, no script, no fetch. The text is the terminal report without
colour. Registered when ``gpudoctor.report`` is imported.
"""

from __future__ import annotations

from gpudoctor.model import Report
from gpudoctor.model.findings import DISPLAY
from gpudoctor.report import _fmt as f
from gpudoctor.report._html import e, e1
from gpudoctor.report.htmlfmt import _account, _findings

SCOPE = "gpudoctor-report"

# the report's rules that the fragment uses, each under the fragment's class
CSS = f"""
.{SCOPE} {{ font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif; color:#1d1f23; max-width:1080px; }}
.{SCOPE} h2 {{ font-size:17px; margin:18px 0 8px; border-bottom:1px solid #dde1e6; }}
.{SCOPE} h3 {{ font-size:15px; margin:12px 0 6px; }}
.{SCOPE} .meta, .{SCOPE} .muted, .{SCOPE} .note {{ color:#5b6270; }}
.{SCOPE} code, .{SCOPE} pre {{ font-family:ui-monospace,Menlo,Consolas,monospace; font-size:12.5px; }}
.{SCOPE} pre {{ background:#f6f7f9; border:1px solid #dde1e6; border-radius:6px; padding:8px 10px; overflow-x:auto; }}
.{SCOPE} .finding {{ border:1px solid #dde1e6; border-left:5px solid #5b6270; border-radius:8px; padding:10px 14px; margin:10px 0; }}
.{SCOPE} .finding.error {{ border-left-color:#c62828; }} .{SCOPE} .finding.warning {{ border-left-color:#b26a00; }}
.{SCOPE} .finding.info {{ border-left-color:#1565c0; }}
.{SCOPE} .badge {{ display:inline-block; font-size:11.5px; font-weight:600; text-transform:uppercase; border-radius:4px;
  padding:1px 6px; color:#fff; background:#5b6270; }}
.{SCOPE} .badge.error {{ background:#c62828; }} .{SCOPE} .badge.warning {{ background:#b26a00; }}
.{SCOPE} .badge.info {{ background:#1565c0; }}
.{SCOPE} .ledger {{ display:flex; height:24px; border-radius:4px; overflow:hidden; margin:8px 0 4px; border:1px solid #dde1e6; }}
.{SCOPE} .ledger span {{ display:block; height:100%; }}
.{SCOPE} table {{ border-collapse:collapse; margin:6px 0; font-size:13px; }}
.{SCOPE} th, .{SCOPE} td {{ text-align:left; padding:4px 8px; border-bottom:1px solid #dde1e6; vertical-align:top; }}
.{SCOPE} .snippets {{ display:grid; grid-template-columns:minmax(0,1fr) minmax(0,1fr); gap:10px; }}
.{SCOPE} dl.kv {{ display:grid; grid-template-columns:max-content 1fr; gap:3px 14px; }} .{SCOPE} dl.kv dd {{ margin:0; }}
"""


def notebook_html(report: Report) -> str:
    """The fragment Jupyter shows for a ``Report``."""
    meta = f"{e(report.kind)} · <code>{e1(report.source)}</code> · gpudoctor {e(report.gpudoctor_version)}"
    parts = [
        f'<div class="{SCOPE}">',
        f"<style>{CSS}</style>",
        f"<h2>gpudoctor: {e(f.findings_headline(report))}</h2>",
        f'<div class="meta">{meta}</div>',
        *(f'<p class="finding warning"><span class="badge warning">warning</span> {e1(w)}</p>' for w in report.warnings),
        _account(report),
        _findings(report),
        "</div>",
    ]
    return "\n".join(p for p in parts if p)


def notebook_text(report: Report) -> str:
    from gpudoctor.report.terminal import render_terminal  # noqa: PLC0415

    return render_terminal(report, color=False)


def register() -> None:
    DISPLAY["html"] = notebook_html
    DISPLAY["text"] = notebook_text
