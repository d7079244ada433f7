"""One quantity, one value: every format prints the figure the report computed once.

A real trace (the kineto RTX 2080 Ti ResNet-50, when ../shared/traces is there) and the
canonical report are rendered as terminal, Markdown, HTML and JSON; each finding's share of
step time, each summary percentage and each size in a message appear identically in all of
them, and GD102 and GD302 give the same share for the same blocking.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re

import pytest
from report_samples import canonical_report

from gpudoctor.report import render


def _report_of(path):
    from gpudoctor.analysis import analyze_trace
    from gpudoctor.config import Config
    from gpudoctor.engine import diagnose
    from gpudoctor.parse import load_inputs

    loaded = load_inputs([path])
    metrics = tuple(analyze_trace(t, loaded.run) for t in loaded.timelines)
    return diagnose(dataclasses.replace(loaded.run, metrics=metrics), Config(), kind="analyze")


def _texts(report) -> dict[str, str]:
    out = {fmt: render(report, fmt) for fmt in ("terminal", "md", "html")}
    out["html"] = html.unescape(re.sub(r"<[^>]+>", " ", out["html"]))
    out["md"] = out["md"].replace("\\", "")
    return out


def _assert_one_value_each(report) -> None:
    texts = _texts(report)
    data = json.loads(render(report, "json"))
    figures = []
    for f in data["findings"]:
        share = (f.get("gain") or {}).get("share_pct")
        if share is not None:
            figures.append((f["code"], f"{share:.1f}%"))
        figures += [(f["code"], size) for size in re.findall(r"\d+(?:\.\d+)? [KMG]iB", f["message"])]
    for s in data["summary"]:
        if s["unit"] == "%" and isinstance(s["value"], (int, float)):
            figures.append((s["key"], f"{s['value']:.1f}%"))
    assert figures
    for what, text in figures:
        missing = [fmt for fmt, body in texts.items() if text not in body]
        assert not missing, f"{what}: {text} is not in {missing}"
    for fmt, body in texts.items():
        assert not re.search(r"\d (?:GB|MB|KB)\b(?!/s)", body), f"{fmt}: a size in decimal units"


def test_the_canonical_report_prints_each_figure_once_everywhere():
    _assert_one_value_each(canonical_report())


@pytest.mark.shared_traces
def test_a_real_trace_prints_each_figure_once_everywhere(shared_traces):
    report = _report_of(shared_traces / "param" / "rtx2080ti_resnet.json.gz")
    _assert_one_value_each(report)
    by_code = {f.code: f for f in report.findings}
    # the same 2.01 s of blocking: one share of step time, in both rules and in the summary
    shares = {re.search(r"2\.01 s[^%]*?(\d+\.\d)% of step time", by_code[c].message).group(1) for c in ("GD102", "GD302")}
    summary = next(s for s in report.summary if s.key == "host_sync_share")
    assert shares == {f"{summary.value:.1f}"}
