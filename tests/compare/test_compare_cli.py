"""`gpudoctor compare` on run directories written by hand: formats, -o, exit codes, the CI gate."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from compare_builders import loader, run

from gpudoctor.cli import main
from gpudoctor.model import RunData


def write_run(run_data: RunData, where: Path) -> Path:
    where.mkdir(parents=True)
    assert run_data.manifest is not None and run_data.settings is not None
    (where / "manifest.json").write_text(json.dumps(run_data.manifest.to_dict()))
    (where / "settings.json").write_text(json.dumps(run_data.settings.to_dict()))
    (where / "steps.jsonl").write_text("".join(json.dumps(s.to_dict()) + "\n" for s in run_data.steps))
    return where


def gpudoctor(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["gpudoctor", *map(str, args)])
    with pytest.raises(SystemExit) as exc:
        main()
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.fixture
def pair(tmp_path):
    def make(wall_b: float, **kw_b) -> tuple[Path, Path]:
        a = write_run(run(wall_ms=100, wait_ms=40), tmp_path / "a")
        b = write_run(run(wall_ms=wall_b, seed=4, **kw_b), tmp_path / "b")
        return a, b

    return make


def test_compare_prints_the_comparison_and_exits_0(pair, monkeypatch, capsys) -> None:
    a, b = pair(50)
    code, out, err = gpudoctor(monkeypatch, capsys, "compare", a, b)
    assert code == 0, err
    assert "faster than A" in out and "verdict: faster" in out
    assert "Findings:" in out
    assert "GD201" in out  # waiting 40% of the step in A: fired there and fixed in B
    assert not (a / "report.json").exists()  # compare leaves the runs as they were


def test_json_format_has_the_findings_of_both_diagnoses(pair, monkeypatch, capsys) -> None:
    a, b = pair(50)
    code, out, _ = gpudoctor(monkeypatch, capsys, "compare", a, b, "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["findings_compared"] is True
    fixed = [f["code"] for f in data["findings"] if f["status"] == "fixed"]
    assert "GD201" in fixed
    assert data["step_time"]["verdict"] == "faster"


def test_fail_on_regression_exits_1_when_b_is_slower_by_more(pair, monkeypatch, capsys) -> None:
    a, b = pair(130)
    code, _, err = gpudoctor(monkeypatch, capsys, "compare", a, b, "--fail-on-regression", "10")
    assert code == 1
    assert "regression" in err and "slower" in err
    code, _, _ = gpudoctor(monkeypatch, capsys, "compare", a, b, "--fail-on-regression", "50")
    assert code == 0


def test_fail_on_regression_passes_a_faster_run(pair, monkeypatch, capsys) -> None:
    a, b = pair(50)
    code, _, _ = gpudoctor(monkeypatch, capsys, "compare", a, b, "--fail-on-regression", "0")
    assert code == 0


def test_fail_on_regression_without_step_times_is_a_usage_error(tmp_path, monkeypatch, capsys) -> None:
    a = write_run(run(steps=()), tmp_path / "a")
    b = write_run(run(steps=()), tmp_path / "b")
    code, out, err = gpudoctor(monkeypatch, capsys, "compare", a, b, "--fail-on-regression", "5")
    assert code == 2
    assert "cannot judge" in err and "no step times" in err
    assert "Step times not compared" in out  # the comparison is still printed


def test_output_file_format_from_its_extension(pair, tmp_path, monkeypatch, capsys) -> None:
    a, b = pair(50)
    target = tmp_path / "cmp.md"
    code, out, err = gpudoctor(monkeypatch, capsys, "compare", a, b, "-o", target)
    assert code == 0
    assert out == ""
    assert "wrote md comparison" in err
    assert target.read_text().startswith("## gpudoctor compare: faster")
    html = tmp_path / "cmp.html"
    assert gpudoctor(monkeypatch, capsys, "compare", a, b, "-o", html)[0] == 0
    assert html.read_text().startswith("<!doctype html>")


def test_sarif_output_is_refused(pair, tmp_path, monkeypatch, capsys) -> None:
    a, b = pair(50)
    code, _, err = gpudoctor(monkeypatch, capsys, "compare", a, b, "-o", tmp_path / "x.sarif")
    assert code == 2
    assert "compare" in err and ".md" in err


def test_missing_run_is_a_usage_error(pair, tmp_path, monkeypatch, capsys) -> None:
    a, _ = pair(50)
    code, _, err = gpudoctor(monkeypatch, capsys, "compare", a, tmp_path / "nope")
    assert code == 2
    assert err.startswith("gpudoctor: error:")


def test_thresholds_apply_to_both_runs(pair, monkeypatch, capsys) -> None:
    # with the data-wait threshold above A's 40%, GD201 fires on neither side
    a, b = pair(50)
    code, out, _ = gpudoctor(monkeypatch, capsys, "compare", a, b, "--format", "json",
                             "--set", "dataloader_wait_share_pct=60")
    assert code == 0
    assert "GD201" not in [f["code"] for f in json.loads(out)["findings"]]


def test_settings_change_is_shown(pair, monkeypatch, capsys) -> None:
    a, b = pair(50, settings_kw={"dataloaders": (loader(num_workers=4),)})
    code, out, _ = gpudoctor(monkeypatch, capsys, "compare", a, b)
    assert code == 0
    assert "DataLoader(Images).num_workers" in out
