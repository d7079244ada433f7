"""``read_previous`` / ``carry_over``: the ``report.json`` that ``verify`` writes is read back by
``analyze`` and ``report`` with its verifications; one whose verifications are rejected says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_verify_measure import OPTS, _data, _fake, _workers

from gpudoctor import verify
from gpudoctor.config import Config
from gpudoctor.engine import write_report_json
from gpudoctor.model import Confidence, Finding, Fix, Location, Report, Severity, VerifyStatus
from gpudoctor.rules.edits import dataloader_args
from gpudoctor.verify import _Arm, _attach, carry_over, measure, read_previous


def _verified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Report, Path]:
    """A GD201 finding whose fix edits the DataLoader's call (its keywords' positions: ``tuple[str, int]``
    pairs), its verification measured by ``measure`` and attached as ``verify_report`` does, and the
    run directory's ``report.json`` written as ``verify`` writes it."""
    trial, _ = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    data = _data(tmp_path)
    judged, _ = measure(data, [_Arm("GD201", (_workers(1),))], Config(), OPTS)
    fix = Fix("Set num_workers=1 on the DataLoader at train.py:31",
              edits=(dataloader_args("train.py", 31, {"num_workers": 1}),))
    fd = Finding("GD201", "dataloader-stall", Severity.WARNING, Confidence.MEASURED, "m", fix,
                 location=Location("train.py", 31))
    rep = Report(schema_version=1, gpudoctor_version="0", kind="profile", source=data.source, created_at="",
                 run=data, findings=(fd,))
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    write_report_json(_attach(rep, {0: judged["GD201"]}), run_dir)
    return rep, run_dir


def test_the_report_verify_writes_is_read_back_with_its_verification(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rep, run_dir = _verified(tmp_path, monkeypatch)
    assert rep.findings[0].fix.edits[0].positions[0] == ("batch_size", 1)  # a (str, int) pair, as GD201's fix has
    notes: list[str] = []
    previous = read_previous(run_dir, notes)
    assert previous is not None and notes == []
    again = carry_over(rep, previous, notes)  # `analyze` / `report`: the same finding, diagnosed again
    (fd,) = again.findings
    assert fd.verification is not None and fd.verification.status == VerifyStatus.CONFIRMED
    assert fd.verification == previous.findings[0].verification and fd.verification.per_run
    assert [s.value for s in again.summary if s.key == "verified"] == ["1 confirmed, 0 refuted, 0 inconclusive, "
                                                                       "0 not tried"]


@pytest.mark.parametrize(("field", "value", "why"), [
    ("speedup", float("nan"), "field 'findings[0].verification.speedup' must be a number or null, not float nan"),
    ("trials", "three", "field 'findings[0].verification.trials' must be an integer, not the string 'three'"),
])
def test_rejected_verifications_leave_a_note_not_silence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, value: object, why: str
) -> None:
    rep, run_dir = _verified(tmp_path, monkeypatch)
    path = run_dir / "report.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["findings"][0]["verification"][field] = value
    path.write_text(json.dumps(data), encoding="utf-8")
    notes: list[str] = []
    assert read_previous(run_dir, notes) is None
    assert len(notes) == 1 and why in notes[0] and "the verifications it holds are not shown" in notes[0]
    again = carry_over(rep, None, notes)
    assert again.findings[0].verification is None and again.run is not None and again.run.notes[-1] == notes[0]


def test_a_report_without_verifications_or_unreadable_needs_no_note(tmp_path: Path) -> None:
    notes: list[str] = []
    assert read_previous(tmp_path, notes) is None  # no report.json
    (tmp_path / "report.json").write_text('{"findings": [{"verification": null}], "schema_version": "x"}')
    assert read_previous(tmp_path, notes) is None
    (tmp_path / "report.json").write_text("{not json")
    assert read_previous(tmp_path, notes) is None and notes == []
