"""check --fix --from RUN: the values --verify measured, at the call sites the run recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.model import layout
from gpudoctor.model.findings import Confidence, Finding, Fix, Report, Severity
from gpudoctor.model.run import CallSite, Injection
from gpudoctor.model.verify import Verification, VerifyStatus
from gpudoctor.static.sizing import sizing


def _run(tmp_path: Path, cwd: Path, status: VerifyStatus) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    site = CallSite("train.py", 31, "main")  # relative to the run's cwd, as profile records it
    finding = Finding(code="GD201", name="dataloader-stall", severity=Severity.WARNING,
                      confidence=Confidence.MEASURED, message="m", fix=Fix(instruction="i"),
                      verification=Verification(status, "r", speedup=2.1 if status == VerifyStatus.CONFIRMED else 1.0,
                                                changes=(Injection("dataloader", "num_workers", 8, site),)))
    rep = Report.from_dict({**_empty_dict(), "findings": [finding.to_dict()]})
    (run / layout.REPORT).write_text(json.dumps(rep.to_dict()), encoding="utf-8")
    (run / layout.MANIFEST).write_text(json.dumps({"cwd": str(cwd)}), encoding="utf-8")
    return run


def _empty_dict() -> dict:
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "report"))
    from report_samples import empty_report

    return empty_report().to_dict()


def test_measured_workers_apply_at_the_call_site_under_the_runs_cwd(tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    proj.mkdir()
    monkeypatch.chdir(tmp_path)  # not the run's cwd: the relative call site must not resolve here
    s = sizing(None, _run(tmp_path, proj, VerifyStatus.CONFIRMED))
    got = s.sized("num_workers", str(proj / "train.py"), 30, 32)
    assert got.value == 8 and "measured by --verify" in got.why
    assert s.sized("num_workers", str(tmp_path / "train.py"), 30, 32).value is None


def test_a_refuted_setting_is_refused_and_workers_flag_fills_the_rest(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    s = sizing(3, _run(tmp_path, proj, VerifyStatus.REFUTED))
    assert "measured no gain" in s.sized("num_workers", str(proj / "train.py"), 31, 31).refused
    assert s.sized("num_workers", str(proj / "other.py"), 1, 99).value == 3


@pytest.mark.parametrize(("field", "value"), [("speedup", "9" * 400), ("trials", "-" + "9" * 400),
                                              ("speedup", '"fast"'), ("changes", "7")])
def test_a_report_with_a_field_out_of_type_or_range_is_a_usage_error(field, value, tmp_path):
    """``--from RUN`` reads the run's report.json: a 400-digit integer gave OverflowError (exit 4)."""
    from gpudoctor.errors import UsageError

    run = _run(tmp_path, tmp_path, VerifyStatus.CONFIRMED)
    data = json.loads((run / layout.REPORT).read_text(encoding="utf-8"))
    data["findings"][0]["verification"][field] = "__VALUE__"
    (run / layout.REPORT).write_text(json.dumps(data).replace('"__VALUE__"', value), encoding="utf-8")
    with pytest.raises(UsageError, match=rf"--from {run}: report.json cannot be read .*'findings\[0\]"
                                         rf"\.verification\.{field}'"):
        sizing(None, run)
