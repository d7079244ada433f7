"""The Markdown report fits a GitHub comment (65,536 characters) without cutting a table."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from report_samples import canonical_report

from gpudoctor.model import RankRow
from gpudoctor.report import render
from gpudoctor.report.markdown import GITHUB_COMMENT_LIMIT, render_markdown

MS = 1_000_000


def _tables(md: str) -> list[str]:
    return re.findall(r"(?:^\|.*\|\n)+", md, flags=re.M)


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _huge_report():
    rep = canonical_report()
    long_note = "evidence " * 120 + "🚀"  # astral character: 2 UTF-16 units
    findings = tuple(
        replace(
            rep.findings[i % len(rep.findings)],
            message=f"finding {i}: " + rep.findings[i % len(rep.findings)].message,
            evidence=replace(rep.findings[i % len(rep.findings)].evidence, notes=(long_note,)),
        )
        for i in range(300)
    )
    ranks = tuple(RankRow(r, 100, 80 * MS + r, 90 * MS, None, None, r == 7) for r in range(200))
    return replace(rep, findings=findings, ranks=ranks)


def test_small_report_is_not_truncated() -> None:
    md = render(canonical_report(), "md")
    assert "Truncated" not in md
    assert _utf16_len(md) < GITHUB_COMMENT_LIMIT


def test_huge_report_fits_a_github_comment() -> None:
    rep = _huge_report()
    md = render(rep, "md")
    assert _utf16_len(md) <= GITHUB_COMMENT_LIMIT
    assert "**Truncated** to fit GitHub's 65,536-character comment limit" in md
    kept = len(re.findall(r"^\*\*\d+\. ", md, flags=re.M))
    assert 0 < kept < len(rep.findings)
    assert f"{len(rep.findings) - kept} findings" in md
    # the checklist survives (it is what a reviewer ticks), whole
    assert md.count("- [ ] ") == 3 and md.count("- [x] ") == 1
    # kept findings are the first ones, in order
    numbers = [int(n) for n in re.findall(r"^\*\*(\d+)\. ", md, flags=re.M)]
    assert numbers == list(range(1, kept + 1))


@pytest.mark.parametrize("limit", [1_500, 2_500, 4_000, 6_000, 9_000, 20_000])
def test_truncation_never_cuts_a_table(limit: int) -> None:
    rep = canonical_report()
    full_tables = _tables(render_markdown(rep))
    md = render_markdown(rep, limit=limit)
    assert _utf16_len(md) <= limit
    for table in _tables(md):
        assert table in full_tables  # whole, as in the full document
    # no dangling fence or details block
    assert md.count("<details>") == md.count("</details>")
    assert len(re.findall(r"^```", md, flags=re.M)) % 2 == 0


def test_ranks_table_is_bounded_with_a_note() -> None:
    rep = replace(canonical_report(), ranks=tuple(RankRow(r, 10, MS, MS) for r in range(100)))
    md = render_markdown(rep, limit=10**7)
    ranks = next(t for t in _tables(md) if t.startswith("| rank |"))
    assert len(ranks.strip().splitlines()) == 2 + 64
    assert "36 more ranks are in the JSON and HTML reports." in md
