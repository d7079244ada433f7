"""The HTML report in a real headless Chromium: no console error, no request, plots drawn.

Needs Debian's ``chromium`` (``apt-get install -y chromium``) or GPUDOCTOR_CHROMIUM
pointing at a Chromium/Chrome binary; skipped otherwise. The screenshot is decoded
with Pillow (a test dependency).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from chromium_cdp import Browser, file_url, find_chromium
from report_samples import XSS, canonical_report, empty_report, hostile_report

from gpudoctor.report import render
from gpudoctor.report._fmt import COMPONENT_COLORS

CHROMIUM = find_chromium()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed (apt-get install -y chromium, or set GPUDOCTOR_CHROMIUM): "
    "the HTML report is not checked in a browser",
)]

PLOTS_JS = """
JSON.stringify([...document.querySelectorAll('svg.plot')].map(s => {
  const r = s.getBoundingClientRect();
  return {id: s.id, x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height,
          marks: s.querySelectorAll('rect, polyline, circle').length,
          visible: s.checkVisibility ? s.checkVisibility() : r.width > 0};
}))
"""


@pytest.fixture(scope="module")
def browser():
    b = Browser(CHROMIUM, width=1200, height=900)
    yield b
    b.close()


def _open(browser: Browser, tmp_path: Path, name: str, html: str) -> str:
    path = tmp_path / name
    path.write_text(html, encoding="utf-8")
    url = file_url(path)
    browser.open(url)
    return url


def test_harness_sees_console_errors_and_requests(browser, tmp_path) -> None:
    """The checks below can fail: a page with an error and a fetch is caught."""
    url = _open(
        browser,
        tmp_path,
        "bad.html",
        '<!doctype html><title>x</title><img src="http://example.invalid/x.png">'
        "<script>console.error('boom')</script>",
    )
    assert "http://example.invalid/x.png" in browser.requests()
    assert any("boom" in p for p in browser.console_problems())
    assert browser.requests()[0] == url


def test_canonical_report_renders_offline_with_its_plots(browser, tmp_path) -> None:
    Image = pytest.importorskip("PIL.Image", reason="Pillow decodes the screenshot (pip install pillow)")
    url = _open(browser, tmp_path, "report.html", render(canonical_report(), "html"))
    assert browser.requests() == [url], "the report fetched something"
    assert browser.console_problems() == []
    plots = {p["id"]: p for p in json.loads(browser.evaluate(PLOTS_JS))}
    visible = ["step-times", "gpu-util", "gpu-mem", "cpu", "breakdown-0", "gaps-0-0", "kernels-0", "ops-0"]
    for pid in visible:
        p = plots[pid]
        assert p["visible"] and p["w"] > 400 and p["h"] > 80 and p["marks"] > 0, p

    shot = browser.screenshot(tmp_path / "report.png")
    img = Image.open(shot).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot is (nearly) blank"
    white = sum(n for n, c in colours if c == (255, 255, 255))
    assert white < 0.95 * img.width * img.height
    # each plot's area is drawn: several colours, including its data colours
    for pid in visible:
        p = plots[pid]
        crop = img.crop((int(p["x"]), int(p["y"]), int(p["x"] + p["w"]), int(p["y"] + p["h"])))
        cols = crop.getcolors(maxcolors=1 << 20)
        assert cols is not None and len(cols) >= 4, pid
    breakdown = plots["breakdown-0"]
    crop = img.crop((int(breakdown["x"]), int(breakdown["y"]), int(breakdown["x"] + breakdown["w"]), int(breakdown["y"] + breakdown["h"])))
    present = {c for _, c in crop.getcolors(maxcolors=1 << 20)}
    for key in ("data_loading", "gpu_compute", "sync_wait"):
        rgb = tuple(int(COMPONENT_COLORS[key][i : i + 2], 16) for i in (1, 3, 5))
        assert rgb in present, f"{key} not drawn in the step breakdown"


def test_hostile_report_shows_the_strings_as_text(browser, tmp_path) -> None:
    url = _open(browser, tmp_path, "hostile.html", render(hostile_report(), "html"))
    assert browser.requests() == [url]
    assert browser.console_problems() == []
    assert browser.evaluate("document.querySelectorAll('script').length") == 0
    assert XSS in browser.evaluate("document.body.innerText")
    assert browser.evaluate("document.title").startswith("gpudoctor report: /tmp/we\"ird & <dir>")


def test_empty_and_nvml_less_reports_render(browser, tmp_path) -> None:
    url = _open(browser, tmp_path, "empty.html", render(empty_report(), "html"))
    assert browser.requests() == [url]
    assert browser.console_problems() == []
    rep = canonical_report()
    no_nvml = replace(rep, run=replace(rep.run, samples=None))
    url = _open(browser, tmp_path, "no-nvml.html", render(no_nvml, "html"))
    assert browser.requests() == [url]
    assert browser.console_problems() == []
    plots = {p["id"]: p for p in json.loads(browser.evaluate(PLOTS_JS))}
    assert plots["busy-0-0"]["visible"] and plots["busy-0-0"]["marks"] > 0


LAYOUT_JS = """
JSON.stringify({
  actions: document.getElementById('actions').getBoundingClientRect().top + scrollY,
  findings: document.getElementById('findings').getBoundingClientRect().top + scrollY,
  firstPlot: Math.min(...[...document.querySelectorAll('svg.plot')].map(s => s.getBoundingClientRect().top + scrollY)),
  // a box wider than its card (a <pre> scrolls its own content: its box must stay inside)
  overflow: [...document.querySelectorAll('article.finding pre, article.finding .snippets > div, table code.name')]
    .filter(el => {
      const box = el.parentElement.closest('article, details, table').getBoundingClientRect();
      return el.getBoundingClientRect().right > box.right + 1;
    }).map(el => el.textContent.slice(0, 40)),
  pageWider: document.documentElement.scrollWidth > innerWidth + 1,
})
"""


def test_html_leads_with_the_diagnosis_and_nothing_overflows(browser, tmp_path) -> None:
    """The top actions and the findings come before any chart; a long "after" line scrolls inside
    its box and a long kernel name wraps, so nothing runs out of its card or widens the page."""
    rep = canonical_report()
    long_line = "x = model(" + ", ".join(f"argument_{i}=value_{i}" for i in range(30)) + ")"
    first = rep.findings[0]
    rep = replace(rep, findings=(replace(first, fix=replace(first.fix, after=long_line)), *rep.findings[1:]))
    _open(browser, tmp_path, "layout.html", render(rep, "html"))
    layout = json.loads(browser.evaluate(LAYOUT_JS))
    assert layout["actions"] < layout["findings"] < layout["firstPlot"], layout
    assert layout["overflow"] == [] and not layout["pageWider"], layout
    browser.screenshot(tmp_path / "layout.png")  # kept for a look when it fails
