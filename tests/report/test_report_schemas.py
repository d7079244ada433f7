"""The JSON report against docs/report-schema.json, and SARIF against the SARIF 2.1.0 schema.

The SARIF schema is fetched from a package registry and cached outside the
repository (see sarif_schema.py); the SARIF tests skip when it cannot be had.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from report_samples import CWD, canonical_report, empty_report, hostile_report
from sarif_schema import sarif_schema_path

from gpudoctor.model import Finding, Location, Report, RuleInfo
from gpudoctor.report import render
from gpudoctor.report.schema import schema_text

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
REPORT_SCHEMA = ROOT / "docs" / "report-schema.json"
UPDATE = os.environ.get("GPUDOCTOR_UPDATE_SNAPSHOTS") == "1"

REPORTS = {"canonical": canonical_report, "empty": empty_report, "hostile": hostile_report}


@pytest.fixture(scope="module")
def report_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(REPORT_SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def sarif_validator() -> jsonschema.Draft4Validator:
    path, why = sarif_schema_path()
    if path is None:
        pytest.skip(why)
    schema = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker())


def _errors(validator, data) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(data)]


# --------------------------------------------------------------------------- JSON report


def test_report_schema_file_is_generated_from_the_model() -> None:
    if UPDATE:
        REPORT_SCHEMA.write_text(schema_text(), encoding="utf-8")
    assert REPORT_SCHEMA.read_text(encoding="utf-8") == schema_text(), (
        "docs/report-schema.json is out of step with gpudoctor/model: regenerate it with "
        "python -m gpudoctor.report.schema > docs/report-schema.json, and raise REPORT_SCHEMA_VERSION "
        "if the change breaks readers"
    )


@pytest.mark.parametrize("name", REPORTS)
def test_json_reports_validate(name: str, report_validator) -> None:
    data = json.loads(render(REPORTS[name](), "json"))
    assert _errors(report_validator, data) == []


def test_report_schema_rejects_wrong_reports(report_validator) -> None:
    good = json.loads(render(canonical_report(), "json"))
    wrong_severity = json.loads(json.dumps(good))
    wrong_severity["findings"][0]["severity"] = "fatal"
    missing = json.loads(json.dumps(good))
    del missing["findings"][0]["fix"]
    extra = json.loads(json.dumps(good))
    extra["findings"][0]["surprise"] = 1
    wrong_type = json.loads(json.dumps(good))
    wrong_type["run"]["steps"][0]["wall_ns"] = "83 ms"
    wrong_version = json.loads(json.dumps(good))
    wrong_version["schema_version"] = 999
    for bad in (wrong_severity, missing, extra, wrong_type, wrong_version):
        assert _errors(report_validator, bad), bad


# --------------------------------------------------------------------------- SARIF


@pytest.mark.parametrize("name", REPORTS)
def test_sarif_validates_against_sarif_2_1_0(name: str, sarif_validator) -> None:
    data = json.loads(render(REPORTS[name](), "sarif"))
    assert data["version"] == "2.1.0"
    assert _errors(sarif_validator, data) == []


def test_sarif_schema_copy_rejects_a_wrong_log(sarif_validator) -> None:
    data = json.loads(render(canonical_report(), "sarif"))
    data["runs"][0]["results"][0]["level"] = "fatal"
    data["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["startLine"] = 0
    assert len(_errors(sarif_validator, data)) == 2


def test_sarif_results_are_the_located_findings() -> None:
    rep = canonical_report()
    run = json.loads(render(rep, "sarif"))["runs"][0]
    located = [fd for fd in rep.findings if fd.location is not None]
    assert [r["ruleId"] for r in run["results"]] == [fd.code for fd in located]
    first = run["results"][0]
    assert first["level"] == "error"
    assert first["message"]["text"].startswith(located[0].message)
    assert "Fix: Set num_workers=4" in first["message"]["text"]
    phys = first["locations"][0]["physicalLocation"]
    assert phys["artifactLocation"] == {"uri": "train.py", "uriBaseId": "SRCROOT"}
    assert phys["region"] == {"startLine": 31}
    assert run["originalUriBaseIds"]["SRCROOT"]["uri"] == f"file://{CWD}/"
    second = run["results"][1]["locations"][0]["physicalLocation"]["region"]
    assert second == {"startLine": 44, "startColumn": 9}
    # the setting it cites is a related location
    assert first["relatedLocations"][0]["message"]["text"] == "DataLoader.num_workers = 0"
    # the finding without a location is kept in the run's properties
    unlocated = run["properties"]["findingsWithoutLocation"]
    assert [u["ruleId"] for u in unlocated] == ["GD302", "GD101"]
    assert run["results"][2]["level"] == "note"


def test_sarif_rules_are_the_catalogue_with_help() -> None:
    rep = canonical_report()
    run = json.loads(render(rep, "sarif"))["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [r.code for r in rep.rules]
    gd201 = rules[[r["id"] for r in rules].index("GD201")]
    assert gd201["name"] == "dataloader-stall"
    assert gd201["shortDescription"]["text"] == "The training loop waits for the next batch."
    assert gd201["fullDescription"]["text"] == "Steps in which the main process is blocked in ``DataLoader.__next__``."
    assert "How to fix" in gd201["help"]["text"]
    assert "input-pipeline" in gd201["properties"]["tags"]
    for res in run["results"]:
        assert rules[res["ruleIndex"]]["id"] == res["ruleId"]


def test_sarif_adds_a_rule_for_a_code_missing_from_the_catalogue(sarif_validator) -> None:
    rep = canonical_report()
    extra = Finding(
        code="GD999", name="made-up", severity=rep.findings[0].severity, confidence=rep.findings[0].confidence,
        message="m", fix=rep.findings[0].fix, location=Location("rel/dir/x.py", 3),
    )
    rep = replace(rep, findings=(*rep.findings, extra), rules=(RuleInfo("GD201", "dataloader-stall", "t"),))
    run = json.loads(render(rep, "sarif"))["runs"][0]
    ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert "GD999" in ids
    res = run["results"][-1]
    assert ids[res["ruleIndex"]] == "GD999"
    assert res["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": "rel/dir/x.py", "uriBaseId": "SRCROOT"}
    assert _errors(sarif_validator, json.loads(render(rep, "sarif"))) == []


def test_sarif_uris_outside_the_working_directory_are_file_uris() -> None:
    rep = canonical_report()
    moved = replace(rep.findings[0], location=Location("/opt/lib/site packages/x#y.py", 5, 2))
    run = json.loads(render(replace(rep, findings=(moved,)), "sarif"))["runs"][0]
    art = run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert art == {"uri": "file:///opt/lib/site%20packages/x%23y.py"}


def test_sarif_without_run_has_no_base_uri(sarif_validator) -> None:
    rep = Report.from_dict({**canonical_report().to_dict(), "run": None, "kind": "check"})
    data = json.loads(render(rep, "sarif"))
    assert "originalUriBaseIds" not in data["runs"][0]
    assert _errors(sarif_validator, data) == []
    uri = data["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert re.match(r"^file:///home/ada/proj/train\.py$", uri)
