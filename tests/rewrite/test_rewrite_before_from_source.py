"""A finding's "before" is the user's own source: every sample script finding with a call site quotes the
file at its line; one without says its before/after is an illustration, and why."""

from __future__ import annotations

from pathlib import Path

from gpudoctor.config import Config
from gpudoctor.static import check_paths

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_scripts"


def _matches(before: str, file: str, line: int) -> bool:
    """Whether ``before`` is the file from ``line`` on: its lines in order, consecutive except where a line
    ``...`` (a comment may follow it) says that lines are left out; indentation relative, as quoted."""
    path = Path(file) if Path(file).is_absolute() else ROOT / file
    source = [x.strip() for x in path.read_text(encoding="utf-8").splitlines()]
    at, gap = line - 1, False
    for i, shown in enumerate(x.strip() for x in before.splitlines()):
        if shown.startswith("..."):
            gap = True
            continue
        if gap:
            found = next((j for j in range(at, len(source)) if source[j] == shown), None)
            if found is None:
                return False
            at, gap = found, False
        elif at >= len(source) or source[at] != shown or (i == 0 and at != line - 1):
            return False
        at += 1
    return True


def test_every_before_of_check_sample_scripts_is_the_source_at_its_line(monkeypatch):
    monkeypatch.chdir(ROOT)
    report = check_paths([Path("sample_scripts")], Config())
    quoted = illustrated = 0
    for f in report.findings:
        fix = f.fix
        if not (fix.before or fix.after):
            continue
        if fix.source is None:
            assert fix.illustration, f"{f.code} at {f.location}: neither quoted nor said to be an illustration"
            illustrated += 1
            continue
        quoted += 1
        assert _matches(fix.before, fix.source.file, fix.source.line), (
            f"{f.code} at {f.location}: before is not the source at {fix.source}:\n{fix.before}")
        assert fix.after != fix.before
    assert quoted >= 20, (quoted, illustrated)


def test_a_runs_before_is_quoted_from_the_call_site_or_said_to_be_an_illustration(tmp_path, monkeypatch):
    """engine.from_source (profile / analyze): the file at hand gives the quote; without it, an illustration."""
    from dataclasses import replace

    from gpudoctor.engine import from_source
    from gpudoctor.model import RunData
    from gpudoctor.rules import edits

    script = tmp_path / "train.py"
    script.write_bytes((Path(__file__).parent / "scripts" / "optimizers.py").read_bytes())
    monkeypatch.chdir(tmp_path)
    finding = next(f for f in check_paths([script], Config(select=("GD404",))).findings)
    template = replace(finding.fix, before="opt = Adam(params)", after="opt = Adam(params, fused=True)", source=None,
                       edits=(edits.optimizer_args("train.py", 12, "optim.Adam", {"fused": True}),))
    run = RunData(source=str(tmp_path))
    (quoted,) = from_source([replace(finding, fix=template)], run)
    assert quoted.fix.before == "optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999))"
    assert quoted.fix.after == "optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999), fused=True)"
    assert quoted.fix.source is not None and quoted.fix.source.line == 12 and quoted.fix.illustration == ""
    script.unlink()
    (shown,) = from_source([replace(finding, fix=template)], run)
    assert shown.fix.source is None and shown.fix.before == "opt = Adam(params)"
    assert "train.py is not at hand" in shown.fix.illustration
    no_site = replace(template, edits=())
    (plain,) = from_source([replace(finding, location=None, fix=no_site)], run)
    assert plain.fix.illustration == "no call site was recorded"
