"""Every format from real inputs: a public GPU trace and a real run of a sample script.

The whole chain (parse → analysis → engine → report) on data nobody wrote for the
renderers; the outputs are checked against the JSON and SARIF schemas, the GitHub
comment limit and the self-contained HTML rules.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from sarif_schema import sarif_schema_path

from gpudoctor.report import FORMATS, render
from gpudoctor.report.markdown import GITHUB_COMMENT_LIMIT

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def _diagnose(path: Path):
    from gpudoctor.cli import load_and_analyze
    from gpudoctor.config import load_config
    from gpudoctor.engine import diagnose

    run = load_and_analyze([str(path)])
    config = load_config(path.resolve().parent, select=(), ignore=(), overrides=())
    return diagnose(run, config, kind="analyze")


def _check_all_formats(report) -> dict[str, str]:
    out = {fmt: render(report, fmt) for fmt in FORMATS}
    schema = json.loads((ROOT / "docs" / "report-schema.json").read_text(encoding="utf-8"))
    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(json.loads(out["json"]))]
    assert errors == []
    sarif_path, _why = sarif_schema_path()
    if sarif_path is not None:  # validated in test_report_schemas.py too, which says why when it skips
        sarif_schema = json.loads(sarif_path.read_text(encoding="utf-8"))
        errors = [e.message for e in jsonschema.Draft4Validator(sarif_schema).iter_errors(json.loads(out["sarif"]))]
        assert errors == []
    assert len(out["md"].encode("utf-16-le")) // 2 <= GITHUB_COMMENT_LIMIT
    assert "<script" not in out["html"].lower()
    assert not re.search(r"""(?:src|href)\s*=\s*["'](?!#)""", out["html"])
    for fd in report.findings:
        assert f"{fd.code} {fd.name}" in out["terminal"]
        assert fd.code in out["md"] and fd.code in out["html"]
    located = [fd for fd in report.findings if fd.location is not None]
    assert len(json.loads(out["sarif"])["runs"][0]["results"]) == len(located)
    return out


@pytest.mark.shared_traces
def test_every_format_from_a_public_gpu_trace(shared_traces: Path) -> None:
    trace = shared_traces / "param" / "rtx2080ti_resnet.json.gz"
    report = _diagnose(trace)
    out = _check_all_formats(report)
    assert report.run is not None and report.run.metrics and report.run.metrics[0].has_gpu_activity
    # the GPU-side plots are drawn from the trace: breakdown, idle gaps, kernels, busy timeline
    ids = re.findall(r'<svg class="plot" id="([^"]+)"', out["html"])
    assert {"breakdown-0", "gaps-0-0", "kernels-0"} <= set(ids)
    assert any(i.startswith("busy-") for i in ids) == any(u.busy_timeline for u in report.run.metrics[0].utilization)
    # one trace: its ledger is the account every format opens with
    assert out["terminal"].index("Where the step goes") < out["terminal"].index("Findings")
    assert "### Where the step goes" in out["md"] and 'id="account"' in out["html"]
    assert "GD201 dataloader-stall" in out["terminal"].split("Summary")[0]


@pytest.mark.slow
def test_every_format_from_a_real_run_of_a_sample_script(tmp_path: Path) -> None:
    script = ROOT / "sample_scripts" / "starved_dataloader.py"
    if not script.is_file():
        pytest.skip("sample_scripts/starved_dataloader.py is absent")
    runs = tmp_path / "runs"
    cmd = [
        sys.executable, "-m", "gpudoctor", "profile", "--steps", "6", "--skip-first", "1", "--warmup", "1",
        "--active", "3", "--out", str(runs), "--no-report", str(script),
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = list(runs.iterdir())
    # the CLI writes each format, guessing it from the extension
    for name in ("review.md", "report.json", "report.html", "results.sarif", "report.txt"):
        res = subprocess.run(
            [sys.executable, "-m", "gpudoctor", "report", str(run_dir), "-o", str(tmp_path / name)],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        assert (tmp_path / name).stat().st_size > 0
    report = _diagnose(run_dir)
    out = _check_all_formats(report)
    assert json.loads((tmp_path / "report.json").read_text())["schema_version"] == report.schema_version
    # the run's own series: every step and the psutil samples
    ids = re.findall(r'<svg class="plot" id="([^"]+)"', out["html"])
    assert "step-times" in ids
    if report.run.samples is not None and report.run.samples.process:
        assert "cpu" in ids
    assert "gpudoctor profile" in out["terminal"]
