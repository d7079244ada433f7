"""Renderers of a comparison: what each format shows, and untrusted strings shown as text."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import markdown  # Python-Markdown, a dependency of tensorboard
import pytest
from compare_builders import MS, finding, gpu_trace, loader, replace, report, run

from gpudoctor.analysis.compare import compare_runs
from gpudoctor.errors import UsageError
from gpudoctor.model import CallSite, Comparison, Device, Location, RunStatus
from gpudoctor.report.compare import render_comparison

XSS = "<script>alert(1)</script>"
NASTY = "we|ird `x` *y* [z](javascript:alert(1)) \x1b[31mred\x1b[0m"


def sample() -> Comparison:
    ra = report((finding("GD201", "dataloader-stall", 38.0), finding("GD403", "cudnn-benchmark-off", 6.0)))
    rb = report((finding("GD403", "cudnn-benchmark-off", 4.0), finding("GD102", "host-sync", 7.5)))
    a = run(wall_ms=100, wait_ms=38, metrics=(gpu_trace(idle_steps_pct=40),))
    b = run(source="runs/b", wall_ms=60, wait_ms=1, seed=5,
            metrics=(gpu_trace(idle_steps_pct=8, parts_ms={"gpu_compute": 55, "data_loading": 1, "idle": 4}),),
            settings_kw={"dataloaders": (loader(num_workers=4, pin_memory=True),)},
            manifest_kw={"argv": ("/work/train.py", "--epochs", "1", "--workers", "4")})
    return compare_runs(a, b, ra, rb, created_at="2026-01-02T00:00:00+00:00")


def hostile() -> Comparison:
    site = CallSite(f"/tmp/{XSS}/train.py", 7, XSS)
    ra = report((replace(finding("GD201", "dataloader-stall", 38.0, message=f"waits {XSS} {NASTY}"),
                         location=Location(f"/tmp/{XSS}/t.py", 3)),))
    rb = report((finding("GD102", f"host-sync{XSS}", 7.5, message=f"new {XSS}\n# heading\n- list | cell"),))
    a = run(
        source=f"runs/{XSS}",
        settings_kw={"dataloaders": (loader(dataset=f"DS{XSS}", call_site=site),), "env": {"X": NASTY}},
        manifest_kw={"script": f"/tmp/{XSS}/train.py", "argv": (f"/tmp/{XSS}/train.py", NASTY),
                     "devices": (Device(0, f"GPU {XSS}"),), "status": RunStatus.FAILED, "status_detail": NASTY},
    )
    b = run(
        source=f"runs/b|{NASTY}", wall_ms=50,
        settings_kw={"dataloaders": (loader(dataset=f"DS{XSS}", call_site=site, num_workers=2),), "env": {"X": XSS}},
        manifest_kw={"script": f"/tmp/{XSS}/train.py", "argv": (f"/tmp/{XSS}/train.py",), "devices": (Device(0, "GPU b"),)},
    )
    return compare_runs(a, b, ra, rb, created_at="2026-01-02T00:00:00+00:00")


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs

    def handle_data(self, data):
        self.text.append(data)


def _parse(html: str) -> _Collect:
    p = _Collect()
    p.feed(html)
    p.close()
    return p


# --------------------------------------------------------------------------- content


def test_terminal_shows_the_verdict_numbers_findings_and_settings() -> None:
    c = sample()
    text = render_comparison(c, "terminal")
    assert c.headline in text
    assert "verdict: faster" in text
    assert f"{c.step_time.speedup:.2f}×" in text
    assert "waiting for data" in text and "−" in text and " pp" in text
    assert "GPU idle (ProfilerStep windows)" in text and "40.0%" in text and "8.0%" in text
    assert "waiting for the DataLoader" in text  # the breakdown
    for word in ("fixed", "remaining", "new"):
        assert re.search(rf"^\s+{word}\s+GD", text, re.M), word
    assert "DataLoader(Images).num_workers" in text and "/work/train.py:31" in text
    assert "different script arguments" in text
    assert "\x1b" not in text  # no colour unless asked


def test_terminal_colour_only_when_asked() -> None:
    assert "\x1b[" in render_comparison(sample(), "terminal", color=True)


def test_markdown_tables_and_content() -> None:
    c = sample()
    md = render_comparison(c, "md")
    assert md.startswith("## gpudoctor compare: faster")
    assert "| median |" in md
    assert "**fixed**" in md and "**remaining**" in md and "**new**" in md
    assert "`DataLoader(Images).num_workers`" in md
    assert "> [!WARNING]" in md
    html = markdown.markdown(md, extensions=["tables"])
    assert html.count("<table>") >= 5


def test_json_is_the_comparison_as_it_is() -> None:
    c = sample()
    data = json.loads(render_comparison(c, "json"))
    assert data["kind"] == "compare"
    assert data["step_time"]["speedup"] == c.step_time.speedup
    assert data["step_time"]["a"]["median_ns"] == c.step_time.a.median_ns
    assert [f["status"] for f in data["findings"]] == ["fixed", "remaining", "new"]
    assert Comparison.from_dict(data) == c


def test_json_writes_non_finite_numbers_as_null() -> None:
    c = sample()
    c = replace(c, step_time=replace(c.step_time, speedup=float("nan"), ci_high=float("inf")))
    data = json.loads(render_comparison(c, "json"))
    assert data["step_time"]["speedup"] is None and data["step_time"]["ci_high"] is None


def test_html_is_self_contained() -> None:
    html = render_comparison(sample(), "html")
    doc = _parse(html)
    assert "script" not in doc.tags
    assert not any(t in doc.tags for t in ("img", "link", "iframe"))
    assert "Content-Security-Policy" in html
    assert "faster" in "".join(doc.text)


def test_renderers_are_deterministic() -> None:
    for fmt in ("terminal", "md", "json", "html"):
        assert render_comparison(sample(), fmt) == render_comparison(sample(), fmt)


def test_unknown_format_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="cannot write 'sarif'"):
        render_comparison(sample(), "sarif")


def test_not_measured_and_empty_sections_render() -> None:
    t = replace(gpu_trace(), steps=())
    c = compare_runs(run(no_manifest=True, metrics=(t,)), run(source="b", no_manifest=True, metrics=(t,)))
    for fmt in ("terminal", "md", "json", "html"):
        out = render_comparison(c, fmt)
        assert "not compared" in out or "not_measured" in out


# --------------------------------------------------------------------------- untrusted strings


def test_terminal_escapes_control_characters() -> None:
    text = render_comparison(hostile(), "terminal")
    assert "\x1b" not in text
    assert "\\x1b[31mred" in text
    assert XSS in text  # shown as it is: a terminal does not interpret it


def test_html_renders_hostile_strings_as_text() -> None:
    html = render_comparison(hostile(), "html")
    doc = _parse(html)
    assert "script" not in doc.tags
    assert not any(name.startswith("on") for name, _ in doc.attrs)
    assert not any(v and "javascript:" in v for _, v in doc.attrs)
    text = "".join(doc.text)
    assert XSS in text
    assert "\x1b" not in html and "\\x1b[31mred" in text
    for value in re.findall(r'=\s*"([^"]*)"', html):
        assert "<" not in value and ">" not in value


def test_markdown_renders_hostile_strings_as_text() -> None:
    md = render_comparison(hostile(), "md")
    assert "\x1b" not in md
    html = markdown.markdown(md, extensions=["tables"])
    doc = _parse(html)
    assert "script" not in doc.tags
    assert not any(v and "javascript:" in v for _, v in doc.attrs)
    assert "h1" not in doc.tags  # "# heading" in a message stays text
    # every table row has as many cells as its header: no pipe in a value opened a column
    for tbl in re.findall(r"<table>.*?</table>", html, re.S):
        widths = {len(re.findall(r"<t[hd][ >]", row)) for row in re.findall(r"<tr>.*?</tr>", tbl, re.S)}
        assert len(widths) == 1, tbl[:400]
    assert XSS in "".join(doc.text)


def test_hostile_comparison_still_compares() -> None:
    c = hostile()
    assert c.step_time.speedup == pytest.approx(2.0, rel=0.05)
    assert any("did not finish" in w for w in c.warnings)
    assert c.step_time.a.median_ns == pytest.approx(100 * MS, rel=0.03)


def test_html_draws_both_step_time_distributions_on_one_axis():
    cmp = sample()
    html = render_comparison(cmp, "html")
    assert html.count('id="step-times-ab"') == 1
    chart = html[html.index('id="step-times-ab"'): html.index("</svg>", html.index('id="step-times-ab"'))]
    groups = re.findall(r'<g class="range"><title>([^<]+)</title>.*?<line x1="([\d.]+)" x2="[\d.]+" y1="[\d.]+" '
                        r'y2="[\d.]+" stroke="#[0-9A-F]+" stroke-width="3"/>', chart)
    assert [g[0].split(":")[0] for g in groups] == ["A (before)", "B (after)"]
    a, b = cmp.step_time.a, cmp.step_time.b
    median_x = {g[0].split(":")[0]: float(g[1]) for g in groups}
    # the tick of the faster run's median lies left of the other's
    assert (median_x["B (after)"] < median_x["A (before)"]) == (b.median_ns < a.median_ns)
    assert f"median {a.median_ns / 1e6:,.1f}" in chart and f"median {b.median_ns / 1e6:,.1f}" in chart


def test_every_comparison_format_escapes_control_characters_from_the_runs() -> None:
    """Issue 41 (2): one escape for every format (``safe.escape_controls``): a run named with a title change,
    a bell, an 8-bit CSI and a right-to-left override shows them escaped; JSON stays valid and exact."""
    from gpudoctor.report.compare import COMPARE_FORMATS

    evil = "e\x1b]0;PWN\x07\x9b31m\u202e"
    c = hostile()
    c = replace(c, a=replace(c.a, source=f"runs/{evil}"))
    raw = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
    for fmt in COMPARE_FORMATS:
        out = render_comparison(c, fmt)
        assert not raw.search(out), (fmt, sorted({m.group() for m in raw.finditer(out)}))
        assert "PWN" in out, fmt
    assert json.loads(render_comparison(c, "json"))["a"]["source"] == f"runs/{evil}"
