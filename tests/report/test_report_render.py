"""Every renderer over the canonical report (snapshots) and over an empty one.

Snapshots live in tests/report/snapshots/. After a deliberate change of a format,
regenerate them and review the diff:

    GPUDOCTOR_UPDATE_SNAPSHOTS=1 python -m pytest tests/report -q
"""

from __future__ import annotations

import html as html_lib
import json
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest
from report_samples import canonical_report, empty_report

from gpudoctor.errors import UsageError
from gpudoctor.model import ChecklistStatus, Report
from gpudoctor.report import FORMATS, format_from_path, render
from gpudoctor.report.terminal import BAR_WIDTH

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("GPUDOCTOR_UPDATE_SNAPSHOTS") == "1"
EXT = {"terminal": "txt", "md": "md", "json": "json", "html": "html", "sarif": "sarif", "github": "github.txt"}


def _check_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if UPDATE:
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.is_file(), f"missing snapshot {path}; create it with GPUDOCTOR_UPDATE_SNAPSHOTS=1"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, (
        f"{name} differs from its snapshot; if the change is deliberate, regenerate with "
        "GPUDOCTOR_UPDATE_SNAPSHOTS=1 python -m pytest tests/report and review the diff"
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_canonical_report_matches_snapshot(fmt: str) -> None:
    _check_snapshot(f"canonical.{EXT[fmt]}", render(canonical_report(), fmt))


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_report_matches_snapshot(fmt: str) -> None:
    _check_snapshot(f"empty.{EXT[fmt]}", render(empty_report(), fmt))


def test_colour_terminal_matches_snapshot() -> None:
    _check_snapshot("canonical.color.txt", render(canonical_report(), "terminal", color=True))


def test_quiet_terminal_matches_snapshot() -> None:
    _check_snapshot("canonical.quiet.txt", render(canonical_report(), "terminal", quiet=True))


@pytest.mark.parametrize("fmt", FORMATS)
def test_rendering_is_deterministic(fmt: str) -> None:
    assert render(canonical_report(), fmt) == render(canonical_report(), fmt)


# --------------------------------------------------------------------------- format_from_path


@pytest.mark.parametrize(
    ("path", "fmt"),
    [
        ("review.md", "md"),
        ("notes/REVIEW.MARKDOWN", "md"),
        ("report.json", "json"),
        ("out/report.html", "html"),
        ("report.htm", "html"),
        ("gpudoctor.sarif", "sarif"),
        ("results.sarif.json", "sarif"),
        ("log.txt", "terminal"),
        ("C:\\runs\\a.b\\report.md", "md"),
    ],
)
def test_format_from_path(path: str, fmt: str) -> None:
    assert format_from_path(path) == fmt


@pytest.mark.parametrize("path", ["report.pdf", "report", "dir.md/report", ".md", "x.jsonl"])
def test_format_from_path_rejects_unknown_extensions(path: str) -> None:
    with pytest.raises(UsageError, match="--format"):
        format_from_path(path)


def test_render_rejects_unknown_format() -> None:
    with pytest.raises(UsageError, match="terminal, md, json, html, sarif"):
        render(empty_report(), "pdf")


# --------------------------------------------------------------------------- terminal


def test_terminal_shows_findings_in_report_order_with_fix_and_location() -> None:
    rep = canonical_report()
    text = render(rep, "terminal")
    findings = text[text.index("Findings:"):]
    positions = [findings.index(f"{fd.code} {fd.name}") for fd in rep.findings]
    assert positions == sorted(positions)
    first = rep.findings[0]
    assert first.fix.instruction in text
    assert str(first.location) in text
    assert "38.6% of step time at stake, up to 1.63× faster" in text
    # a finding whose time another finding wins first says so, not "0.0% at stake"
    assert "none of its own: its time is included in GD102" in text


def test_terminal_opens_with_where_the_step_goes_and_the_top_actions() -> None:
    rep = canonical_report()
    text = render(rep, "terminal")
    assert text.index("Where the step goes") < text.index("Summary") < text.index("Findings:")
    assert rep.account.headline in text
    assert "Top actions  (now 83.0 ms per step (mean of 23 steady steps))" in text
    assert "  1. GD201 dataloader-stall: −36.6% expected (up to −38.6%) of step time → about 52.6 ms (≥ 51.0 ms) per step" in text
    assert "  2. GD301 pageable-h2d: up to −7.2% of step time → ≥ 45.0 ms per step" in text
    # rank 0's ledger is the account; the other trace keeps its own bar
    assert "Step breakdown of the other traces" in text and "rank 1 (rank1.pt.trace.json.gz)" in text


def test_terminal_bar_follows_the_mean_breakdown() -> None:
    rep = canonical_report()
    text = render(rep, "terminal")
    bars = re.findall(r"^  \|(.+)\|$", text, flags=re.M)
    assert len(bars) == 2 and all(len(b) == BAR_WIDTH for b in bars)  # the account's, then rank 1's
    # 50 cells by largest remainder: FP32 matmul 14.46% → 7.23 → 7, other kernels 20.48% → 10.24 → 10,
    # h2d 7.23% → 3.61 → 4, data 38.55% → 19.28 → 19, sync 8.43% → 4.22 → 4, launch 2.41% → 1.2 → 1,
    # optimizer 4.82% → 2.41 → 3, other CPU 3.61% → 1.81 → 2 (the 3 cells left by the largest remainders)
    assert bars[0] == "M" * 7 + "G" * 10 + "H" * 4 + "D" * 19 + "S" * 4 + "L" + "O" * 3 + "C" * 2


def test_terminal_colour_only_when_asked() -> None:
    plain = render(canonical_report(), "terminal")
    colour = render(canonical_report(), "terminal", color=True)
    assert "\x1b[" not in plain
    assert "\x1b[1;31mERROR" in colour
    assert re.sub(r"\x1b\[[0-9;]*m", "", colour).replace("█", "") != ""


def test_terminal_quiet_is_findings_only() -> None:
    text = render(canonical_report(), "terminal", quiet=True)
    assert text.startswith("Findings: 5 findings")
    for absent in ("Checklist", "Summary", "Step breakdown", "Where the step goes", "Ranks", "Notes"):
        assert absent not in text
    assert render(empty_report(), "terminal", quiet=True) == "Findings: none\n"


def test_terminal_checklist_groups_by_status() -> None:
    text = render(canonical_report(), "terminal")
    checklist = text[text.index("Checklist") :]
    order = [checklist.index(s) for s in ("[x]", "[ ]", " ok ", " - ", " ? ")]
    assert order == sorted(order)


# --------------------------------------------------------------------------- markdown


def test_markdown_checklist_is_task_list_in_status_order() -> None:
    rep = canonical_report()
    md = render(rep, "md")
    lines = [ln for ln in md.splitlines() if ln.startswith("- ")]
    applied = [ln for ln in lines if ln.startswith("- [x] ")]
    recommended = [ln for ln in lines if ln.startswith("- [ ] ")]
    assert len(applied) == sum(1 for c in rep.checklist if c.status == ChecklistStatus.APPLIED)
    assert len(recommended) == sum(1 for c in rep.checklist if c.status == ChecklistStatus.RECOMMENDED)
    assert all("**gain:**" in ln for ln in recommended)
    kinds = [ln[:6] for ln in lines if ln.startswith(("- [x]", "- [ ]", "- *no "))]
    assert kinds == sorted(kinds, key=["- [x] ", "- [ ] ", "- *no "].index)
    # "no problem seen" is not "applied": it reads differently from a ticked box
    assert "- *no problem seen:* **A batch size that fills the GPU**: GD103" in md
    assert "- *not applicable:* **torch.no_grad() in evaluation**: the script has no evaluation loop" in md
    assert "- *not measurable here:* **torch.compile**" in md


def test_markdown_leads_with_the_actions_then_findings_and_folds_the_rest() -> None:
    """A pull request's reader: what to change (where, as a link relative to the run's folder, and
    the gain) before the evidence; the items that ask nothing folded, one line per reason."""
    md = render(canonical_report(), "md")
    assert md.index("### Top actions") < md.index("### Findings") < md.index("### Where the step goes")
    assert md.index("### Checklist") < md.index("<details><summary>4 more:") < md.index("### Environment")
    above = md[: md.index("### Where the step goes")]
    assert above.count("\n") < 100  # the diagnosis fits above the fold
    assert "/home/ada/proj/" not in md  # the run ran in /home/ada/proj: paths relative to it
    folded = md[md.index("<details><summary>4 more:"): md.index("</details>", md.index("<details><summary>4 more:"))]
    assert "- [x]" not in folded and "- [ ]" not in folded


def test_markdown_has_breakdown_table_and_environment() -> None:
    md = render(canonical_report(), "md")
    assert md.index("### Where the step goes") < md.index("| summary |") < md.index("### Checklist")
    assert "| waiting for the DataLoader | 38.6% | 32.0 ms | host side |" in md
    assert "| FP32 matmuls | 14.5% | 12.0 ms | GPU busy |" in md
    assert "1. **GD201 dataloader-stall: −36.6% expected (up to −38.6%) of step time → about 52.6 ms (≥ 51.0 ms) per step** at [`train.py:31`](train.py#L31)" in md
    assert "### Step breakdown of the other traces" in md
    assert "| waiting for the DataLoader | 38.6% |" in md  # rank 1's, in its own table
    assert "### Environment" in md
    assert "| torch | `2.5.1+cu124` |" in md


def test_markdown_tables_have_consistent_columns() -> None:
    md = render(canonical_report(), "md")
    for block in re.findall(r"(?:^\|.*\|\n)+", md, flags=re.M):
        rows = block.strip().splitlines()
        counts = {len(re.findall(r"(?<!\\)\|", r)) for r in rows}
        assert len(counts) == 1, block


# --------------------------------------------------------------------------- json


def test_json_round_trips_to_the_report() -> None:
    rep = canonical_report()
    data = json.loads(render(rep, "json"))
    assert data["schema_version"] == rep.schema_version
    assert Report.from_dict(data) == rep


def test_json_writes_non_finite_numbers_as_null() -> None:
    rep = canonical_report()
    bad = replace(rep.findings[0], gain=replace(rep.findings[0].gain, share_pct=float("nan"), speedup_bound=float("inf")))
    data = json.loads(render(replace(rep, findings=(bad,)), "json"))
    assert data["findings"][0]["gain"]["share_pct"] is None
    assert data["findings"][0]["gain"]["speedup_bound"] is None


# --------------------------------------------------------------------------- html


def test_html_is_self_contained() -> None:
    html = render(canonical_report(), "html")
    assert html.startswith("<!doctype html>")
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert "<script" not in html.lower()
    # no reference to anything outside the file
    assert not re.search(r"""(?:src|href)\s*=\s*["'](?!#)""", html)
    assert "@import" not in html and "url(" not in html


def test_html_has_every_plot_of_the_canonical_report() -> None:
    html = render(canonical_report(), "html")
    ids = re.findall(r'<svg class="plot" id="([^"]+)"', html)
    for expected in ("step-times", "gpu-util", "gpu-mem", "cpu", "breakdown-0", "gaps-0-0", "kernels-0", "ops-0"):
        assert expected in ids
    # one stacked bar per profiled step, one segment per component
    seg = re.search(r'<svg class="plot" id="breakdown-0".*?</svg>', html, flags=re.S).group(0)
    assert seg.count('<g class="bar">') == 5
    assert seg.count("<rect") == 5 * 8 + 8  # segments + legend swatches


def test_html_opens_with_where_the_step_goes() -> None:
    rep = canonical_report()
    html = render(rep, "html")
    assert html.index('id="account"') < html.index('id="findings"')
    bar = re.search(r'<div class="ledger">(.*?)</div>', html, flags=re.S).group(1)
    assert bar.count("<span ") == len(rep.account.ledger.slices)
    assert "width:38.554%" in bar
    assert "GD201 dataloader-stall: −36.6% expected (up to −38.6%) of step time → about 52.6 ms (≥ 51.0 ms) per step" in html
    assert 'class="badge no_problem_seen"' in html


def test_html_falls_back_to_the_trace_busy_timeline_without_nvml() -> None:
    rep = canonical_report()
    no_nvml = replace(rep, run=replace(rep.run, samples=replace(rep.run.samples, gpu=())))
    html = render(no_nvml, "html")
    assert 'id="gpu-util"' not in html
    assert 'id="busy-0-0"' in html
    assert "no NVML samples" in html


def test_empty_report_renders_everywhere() -> None:
    rep = empty_report()
    for fmt in FORMATS:
        text = render(rep, fmt)
        if fmt == "github":  # workflow commands: no finding, no command, and no blank line (ruff prints none either)
            assert text == ""
            continue
        assert text.endswith("\n")
    assert "no findings" in render(rep, "md")
    assert json.loads(render(rep, "sarif"))["runs"][0]["results"] == []


def test_html_draws_a_bounded_number_of_samples() -> None:
    from gpudoctor.model import GpuSample, ProcessSample, Samples
    from gpudoctor.report.htmlfmt import MAX_POINTS

    n = 5 * MAX_POINTS + 3
    samples = Samples(
        gpu=tuple(GpuSample(i * 200_000_000, 0, util_pct=float(i % 100), mem_used_bytes=i) for i in range(n)),
        process=tuple(ProcessSample(i * 200_000_000, 1, "main", 50.0, 1, 1) for i in range(n)),
        interval_ms=200.0,
    )
    rep = canonical_report()
    html = render(replace(rep, run=replace(rep.run, samples=samples)), "html")
    util = re.search(r'<svg class="plot" id="gpu-util".*?</svg>', html, flags=re.S).group(0)
    points = re.search(r'points="([^"]+)"', util).group(1).split()
    assert MAX_POINTS // 2 < len(points) <= MAX_POINTS
    assert "every 6th sample drawn" in util


def test_html_idle_gap_chart_is_by_idle_time() -> None:
    """The tallest bar is the gap length that holds the most idle time, not the most gaps."""
    rep = canonical_report()
    u = rep.run.metrics[0].utilization[0]
    html = render(rep, "html")
    chart = html[html.index('id="gaps-0-0"'): html.index("</svg>", html.index('id="gaps-0-0"'))]
    bars = {html_lib.unescape(label): float(h) for h, label in
            re.findall(r'height="([\d.]+)" fill="[^"]+"><title>([^:<]+):', chart)}
    bins = u.gap_histogram
    by_time = max(bins, key=lambda b: b.total_ns)
    by_count = max(bins, key=lambda b: b.count)
    assert by_time is not by_count  # the sample has many short gaps and a few long ones
    tallest = max(bars, key=bars.get)
    assert f"{by_time.total_ns / 1e6:,.1f} ms" in chart and tallest.startswith("10 ms"), bars
    assert bars[tallest] > 100 * bars[min(bars, key=bars.get)]


# --------------------------------------------------------------------------- warnings


PARTIAL = ("the step figures are partial: step tracking stopped at step 16: ValueError: Another profiling tool is "
           "already active; steps 16 and later were not recorded; --steps 40 still stopped the script after 40 steps")


def test_every_format_says_a_warning_at_warning_level_before_the_figures() -> None:
    """A run whose step figures are partial says so, as a warning, in every format (issue 35)."""
    rep = replace(canonical_report(), warnings=(PARTIAL,))
    term = render(rep, "terminal")
    assert f"warning: {PARTIAL}" in term and term.index("warning:") < term.index("Where the step goes")
    assert "\x1b[1;33mwarning: the step figures are partial" in render(rep, "terminal", color=True)
    assert render(rep, "terminal", quiet=True).startswith(f"warning: {PARTIAL}\n")
    md = render(rep, "md")
    assert f"> 🟠 **warning:** {PARTIAL}" in md and md.index("**warning:**") < md.index("### Findings")
    html = render(rep, "html")
    assert re.search(r'<span class="badge warning">warning</span> the step figures are partial: step tracking', html)
    assert html.index("badge warning") < html.index('class="cards"')
    assert json.loads(render(rep, "json"))["warnings"] == [PARTIAL]
    sarif = json.loads(render(rep, "sarif"))
    notes = sarif["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert {"level": "warning", "message": {"text": PARTIAL}} in notes
    first = render(rep, "github").splitlines()[0]
    assert first.startswith("::warning title=gpudoctor::the step figures are partial")
    # and none where there is none
    plain = canonical_report()
    assert not plain.warnings and "warning:" not in render(plain, "terminal")
    notes = json.loads(render(plain, "sarif"))["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert [n["level"] for n in notes] == ["error"]  # the canonical report's crashed rule, no warning


@pytest.mark.parametrize(("status", "detail", "header"), [
    ("interrupted", "interrupted (SIGINT / Ctrl-C)", "· interrupted (SIGINT / Ctrl-C) ·"),
    ("interrupted", "interrupted (Ctrl-C) during start-up, before the script ran",
     "· interrupted (Ctrl-C) during start-up, before the script ran ·"),
    ("killed", "killed by signal 9 (SIGKILL: the out-of-memory killer?)", "· killed by signal 9 (SIGKILL"),
    ("killed", "terminated by signal 15 (SIGTERM)", "· killed (terminated by signal 15 (SIGTERM)) ·"),
    ("completed", "stopped after 40 steps", "· completed (stopped after 40 steps) ·"),
])
def test_the_run_header_says_how_it_ended_once(status: str, detail: str, header: str) -> None:
    """The header said "interrupted (interrupted (SIGINT / Ctrl-C))": a detail that begins with the status's
    word stands alone."""
    from gpudoctor.model import RunStatus

    report = canonical_report()
    assert report.run is not None and report.run.manifest is not None
    mf = replace(report.run.manifest, status=RunStatus(status), status_detail=detail)
    report = replace(report, run=replace(report.run, manifest=mf))
    for fmt in ("terminal", "md"):
        text = render(report, fmt)
        assert header in text, text[:600]
        assert f"{status} ({status}" not in text
