"""`gpudoctor analyze` on a folder of real per-rank GPU traces (../shared/traces, skipped when absent).

The folder is built of symbolic links in a temporary directory: the traces are never copied.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gpudoctor.cli import cli

pytestmark = pytest.mark.shared_traces

TRACES = {
    "mi300x_ddp_resnet18": "tracelens/mi300x_ddp_resnet18.json.gz",
    "a100_rank0_of16": "hta/a100_rank0_of16_negative_queue.json.gz",
    "a100_rank0_of2": "hta/a100_rank0_of2_nccl.json.gz",
    "a100_rank3_of8": "hta/a100_rank3_of8_trace_diff_control.json.gz",
}


@pytest.fixture(scope="module")
def report(shared_traces, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ranks")
    for name, rel in TRACES.items():
        (folder / f"{name}.json.gz").symlink_to(shared_traces / rel)
    out = folder.parent / "report.json"
    res = CliRunner().invoke(cli, ["analyze", str(folder), "--format", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text(encoding="utf-8"))


def test_every_ranked_trace_gets_a_row_with_its_figures(report):
    rows = {(r["rank"], r["world_size"]): r for r in report["ranks"]}
    assert set(rows) == {(0, 16), (0, 2), (3, 8)}
    for row in rows.values():
        assert row["step_source"] == "trace" and row["steps"] == row["profiled_steps"] >= 3
        assert row["step_median_ns"] > 10_000_000 and row["comm_ns"] > 0
        assert 0 < row["comm_exposed_pct"] < 100 and 0 < row["work_median_ns"] < row["step_median_ns"]
        assert not row["straggler"]
    assert rows[(3, 8)]["steps"] == 6 and rows[(0, 16)]["steps"] == 5
    # one NCCL ring all-reduce per step on the control trace: ~15-20% of its 77 ms steps is exposed
    assert rows[(3, 8)]["comm_exposed_pct"] == pytest.approx(18.6, abs=1.0)


def test_the_summary_explains_what_was_not_compared(report):
    s = report["rank_summary"]
    assert s["ranks"] == 1 and s["straggler_rank"] is None and s["world_size"] == 16
    notes = " ".join(s["notes"])
    assert "mi300x_ddp_resnet18.json.gz" in notes and "3 different jobs" in notes
    codes = {f["code"]: f for f in report["findings"]}
    assert codes["GD602"]["rank"] in (0, 3)
    assert "GD603" not in codes  # one rank per job: nothing to compare


def test_terminal_report_shows_the_ranks_table(shared_traces, tmp_path):
    for name in ("a100_rank0_of2", "a100_rank3_of8"):
        (tmp_path / f"{name}.json.gz").symlink_to(shared_traces / TRACES[name])
    res = CliRunner().invoke(cli, ["analyze", str(tmp_path)])
    assert res.exit_code == 0, res.output
    ranks = res.output[res.output.index("\nRanks\n"):]
    assert "0 of 2" in ranks and "3 of 8" in ranks and "work / step" in ranks
