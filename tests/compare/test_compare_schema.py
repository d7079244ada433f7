"""`gpudoctor compare --format json` against docs/compare-schema.json, as the report against
docs/report-schema.json: the file is generated from gpudoctor/model and kept in step, and real
comparisons (rendered, and written by the CLI from run directories) validate."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest
from compare_builders import gpu_trace, replace, run
from test_compare_cli import gpudoctor, write_run
from test_compare_render import hostile, sample

from gpudoctor.analysis.compare import compare_runs
from gpudoctor.model import COMPARISON_SCHEMA_VERSION
from gpudoctor.report.compare import render_comparison
from gpudoctor.report.schema import comparison_schema_text

ROOT = Path(__file__).resolve().parents[2]
COMPARE_SCHEMA = ROOT / "docs" / "compare-schema.json"
UPDATE = os.environ.get("GPUDOCTOR_UPDATE_SNAPSHOTS") == "1"


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(COMPARE_SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors(validator, data) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(data)]


def test_compare_schema_file_is_generated_from_the_model() -> None:
    if UPDATE:
        COMPARE_SCHEMA.write_text(comparison_schema_text(), encoding="utf-8")
    assert COMPARE_SCHEMA.read_text(encoding="utf-8") == comparison_schema_text(), (
        "docs/compare-schema.json is out of step with gpudoctor/model: regenerate it with "
        "python -m gpudoctor.report.schema compare > docs/compare-schema.json, and raise "
        "COMPARISON_SCHEMA_VERSION if the change breaks readers"
    )


def not_measured():
    t = replace(gpu_trace(), steps=())
    return compare_runs(run(no_manifest=True, metrics=(t,)), run(source="b", no_manifest=True, metrics=(t,)))


@pytest.mark.parametrize("make", [sample, hostile, not_measured])
def test_rendered_comparisons_validate(make, validator) -> None:
    data = json.loads(render_comparison(make(), "json"))
    assert data["schema_version"] == COMPARISON_SCHEMA_VERSION
    assert errors(validator, data) == []


def test_the_cli_json_of_two_run_directories_validates(tmp_path, monkeypatch, capsys, validator) -> None:
    a = write_run(run(wall_ms=100, wait_ms=40), tmp_path / "a")
    b = write_run(run(wall_ms=50, seed=4), tmp_path / "b")
    code, out, err = gpudoctor(monkeypatch, capsys, "compare", a, b, "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["findings"] and data["step_time"]["verdict"] == "faster"  # a comparison with content
    assert errors(validator, data) == []


def test_compare_schema_rejects_wrong_comparisons(validator) -> None:
    good = json.loads(render_comparison(sample(), "json"))
    assert good["findings"] and good["settings"]

    def changed(edit) -> dict:
        data = json.loads(json.dumps(good))
        edit(data)
        return data

    wrong = [
        changed(lambda d: d["step_time"].__setitem__("verdict", "much_faster")),
        changed(lambda d: d["findings"][0].pop("status")),
        changed(lambda d: d["settings"][0].__setitem__("surprise", 1)),
        changed(lambda d: d["a"].__setitem__("steps_recorded", "40")),
        changed(lambda d: d.__setitem__("schema_version", COMPARISON_SCHEMA_VERSION + 1)),
    ]
    for data in wrong:
        assert errors(validator, data), data
