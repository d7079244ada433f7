"""Untrusted strings (kernel names, paths, messages, settings) render as text in every format."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import markdown  # Python-Markdown, a dependency of tensorboard
from report_samples import NASTY_PATH, XSS, hostile_report

from gpudoctor.report import render
from gpudoctor.report.markdown import code, esc, fence


class _Collect(HTMLParser):
    """Elements, attributes and text of an HTML document, as a browser's tokenizer sees them."""

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


def test_html_renders_hostile_strings_as_text() -> None:
    html = render(hostile_report(), "html")
    doc = _parse(html)
    assert "script" not in doc.tags
    assert not any(name.startswith("on") for name, _ in doc.attrs)
    assert not any(v and "javascript:" in v for _, v in doc.attrs)
    text = "".join(doc.text)
    assert XSS in text  # shown, as text
    assert NASTY_PATH in text
    assert "\x1b" not in html  # control characters shown as escapes
    assert "\\x1b[31mred" in text


def test_svg_charts_show_control_characters_and_bidi_overrides_as_escapes() -> None:
    """The kernel chart's labels and tooltips come from trace names (issue: SVG carried raw C0
    characters and U+202E); they go through the same escaping as every HTML text."""
    html = render(hostile_report(), "html")
    svgs = re.findall(r"<svg.*?</svg>", html, flags=re.S)
    assert svgs and any("bell" in svg for svg in svgs)
    for ch in ("\x07", "\x1b", "\u202e"):
        assert ch not in html
    assert any("\\x07bell" in svg and "\\u202e" in svg for svg in svgs)


def test_html_attribute_values_cannot_break_out() -> None:
    html = render(hostile_report(), "html")
    # every attribute value is quoted and contains no raw quote or angle bracket
    for value in re.findall(r'=\s*"([^"]*)"', html):
        assert "<" not in value and ">" not in value


def test_markdown_renders_hostile_strings_as_text() -> None:
    md = render(hostile_report(), "md")
    out = markdown.markdown(md, extensions=["tables", "fenced_code"])
    doc = _parse(out)
    assert "script" not in doc.tags
    assert not any(v and v.startswith("javascript:") for _, v in doc.attrs)
    assert "a" not in doc.tags  # "[link](javascript:…)" stayed text
    assert XSS in "".join(doc.text)
    # the message's "# …" and "- …" stayed inside its paragraph (newlines collapsed)
    assert "h1" not in doc.tags
    assert "\x1b" not in md


def test_markdown_escapes() -> None:
    assert esc("a|b") == "a\\|b"
    assert esc("<b>&amp;") == "\\<b\\>\\&amp;"
    assert esc("num_workers and _x_") == "num_workers and \\_x\\_"
    assert esc("line\nbreak") == "line break"
    assert esc("@team #1 $x$") == "\\@team \\#1 \\$x\\$"
    assert code("a`b") == "``a`b``"
    assert code("`x`") == "`` `x` ``"
    assert code("a|b", table=True) == "`a\\|b`"
    assert fence("x\n```\ny").startswith("````")


def test_markdown_fence_cannot_be_closed_by_the_snippet() -> None:
    md = render(hostile_report(), "md")
    out = markdown.markdown(md, extensions=["fenced_code"])
    # the "breakout" line of the before-snippet stays inside the code block
    pre = re.findall(r"<pre><code[^>]*>(.*?)</code></pre>", out, flags=re.S)
    assert any("breakout" in block for block in pre)


def test_json_and_sarif_stay_valid_and_keep_the_strings() -> None:
    rep = hostile_report()
    data = json.loads(render(rep, "json"))
    assert data["findings"][0]["location"]["file"] == NASTY_PATH
    assert data["run"]["metrics"][0]["kernels"]["top"][0]["name"] == XSS
    sarif = json.loads(render(rep, "sarif"))
    result = sarif["runs"][0]["results"][0]
    assert XSS in result["message"]["text"]
    uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert re.fullmatch(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+", uri), uri
    assert '"' not in uri and " " not in uri and "<" not in uri


def test_terminal_neutralises_control_characters() -> None:
    text = render(hostile_report(), "terminal")
    assert "\x1b" not in text
    assert "\\x1b[31mred" in text
    bidi = render(
        hostile_report().__class__.from_dict({**hostile_report().to_dict(), "source": "a\u202eb"}), "terminal"
    )
    assert "\u202e" not in bidi and "\\u202e" in bidi


# --------------------------------------------------------------------------- every format, one escape

# a title change (OSC … BEL), a clear-screen, an 8-bit CSI, a right-to-left override, a CR, NUL and DEL
HOSTILE = "e\x1b]0;PWN\x07\x1b[2J\x9b31m\u202e\r\x00\x7f"
# what no output may carry raw: every control character but the format's own newline and tab
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _hostile_names_report():
    from dataclasses import replace

    from report_samples import canonical_report

    rep = canonical_report()
    path = f"/tmp/{HOSTILE}/{HOSTILE}.py"
    finding = replace(rep.findings[0], location=replace(rep.findings[0].location, file=path),
                      message=f"DataLoader at {path}:3 {HOSTILE}")
    metrics = rep.run.metrics[0]
    kernels = replace(metrics.kernels, top=(replace(metrics.kernels.top[0], name=HOSTILE),))
    return replace(rep, source=path, findings=(finding, *rep.findings[1:]), warnings=(f"partial {HOSTILE}",),
                   errors=(f"{path}: cannot be read",),
                   run=replace(rep.run, source=path, metrics=(replace(metrics, kernels=kernels),)))


def test_every_format_escapes_the_same_hostile_names() -> None:
    """Issue 41 (2): ``--format github`` wrote ESC and BEL from a file name as they are; every format now
    goes through ``safe.escape_controls``, and JSON and SARIF stay valid and keep the name exactly."""
    from gpudoctor.report import FORMATS

    rep = _hostile_names_report()
    path = rep.findings[0].location.file
    for fmt in FORMATS:
        out = render(rep, fmt)
        assert not RAW_CONTROL.search(out), (fmt, sorted({m.group() for m in RAW_CONTROL.finditer(out)}))
        assert "PWN" in out, fmt  # shown, escaped, not dropped
    assert json.loads(render(rep, "json"))["findings"][0]["location"]["file"] == path
    sarif = json.loads(render(rep, "sarif"))
    assert any(HOSTILE in r["message"]["text"] for r in sarif["runs"][0]["results"])
    github = render(rep, "github")
    assert "file=/tmp/e\\x1b]0;PWN\\x07\\x1b[2J" in github  # shown, not obeyed


def test_check_writes_no_raw_control_character_from_a_file_name_in_any_format(tmp_path) -> None:
    """``gpudoctor check`` on ``e<ESC>]0;PWN<BEL><ESC>[2J.py`` (and an unreadable file with such a name):
    the report in each format and gpudoctor's lines on stderr carry no raw control character."""
    from click.testing import CliRunner

    from gpudoctor.cli import cli
    from gpudoctor.report import FORMATS

    name = "e\x1b]0;PWN\x07\x1b[2J\x9b\u202e"
    (tmp_path / f"{name}.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=32)\n"
        "for x, y in loader:\n    loss = model(x.cuda())\n    loss.backward()\n    optimizer.step()\n",
        encoding="utf-8")
    (tmp_path / f"{name}broken.py").write_text("for\n", encoding="utf-8")
    for fmt in FORMATS:
        result = CliRunner().invoke(cli, ["check", str(tmp_path), "--format", fmt])
        assert result.exit_code == 0, (fmt, result.output)
        for stream in (result.stdout, result.stderr):
            assert not RAW_CONTROL.search(stream), (fmt, stream[:400])
        assert "GD201" in result.stdout and "PWN" in result.stdout, fmt
        assert "broken.py" in result.stderr, fmt
        if fmt in ("json", "sarif"):
            json.loads(result.stdout)
