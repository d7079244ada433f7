"""`--format github`: GitHub Actions workflow commands, escaped as @actions/core escapes them."""

from __future__ import annotations

import os
from dataclasses import replace

from report_samples import canonical_report

from gpudoctor.model import Location, Severity
from gpudoctor.report import render
from gpudoctor.report.github import escape_data, escape_property


def test_one_command_per_finding_with_file_line_and_title():
    rep = canonical_report()
    lines = render(rep, "github").splitlines()
    assert len(lines) == len(rep.findings) + len(rep.errors)
    first = rep.findings[0]
    assert lines[0].startswith(f"::{'error' if first.severity is Severity.ERROR else 'warning'} file=")
    assert f",line={first.location.line}," in lines[0] and f"title={first.code} {first.name}::" in lines[0]
    assert any(x.startswith("::notice title=") for x in lines)  # an info finding without a location


def test_escaping_follows_the_toolkit():
    assert escape_data("50% done\r\nnext") == "50%25 done%0D%0Anext"
    assert escape_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"


def test_a_hostile_file_name_or_message_cannot_end_the_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rep = canonical_report()
    evil = replace(rep.findings[0], location=Location(str(tmp_path / "a,line=9::x\n::error::y.py"), 3),
                   message="100% bad\n::error::injected")
    line = render(replace(rep, findings=(evil,), errors=()), "github")
    assert line.count("\n") == 1  # one command; a "::" in its message is text, not a command
    assert line[: line.index("::", 2)] == ("::error file=a%2Cline=9%3A%3Ax%0A%3A%3Aerror%3A%3Ay.py,line=3,"
                                           f"title={evil.code} {evil.name}")
    assert "file=a%2Cline=9%3A%3Ax%0A%3A%3Aerror%3A%3Ay.py,line=3," in line  # relative to the working directory
    assert line.rstrip("\n").endswith("100%25 bad%0A::error::injected Fix: " + escape_data(evil.fix.instruction))
    assert os.sep not in line.split("file=")[1].split(",")[0]
