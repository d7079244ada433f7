"""A distributed run directory (rank-tagged files) → RunData → report: per-rank table, the straggler named."""

from __future__ import annotations

import json

from dist_builders import synchronized
from rule_builders import manifest, run, settings, steps

from gpudoctor import engine
from gpudoctor.config import Config
from gpudoctor.model import Report
from gpudoctor.parse import load_inputs
from gpudoctor.report import render


def _write_rank_run(d, world: int = 2):
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps(manifest(world_size=world, failed_rank=1).to_dict()))
    for r in range(world):
        lines = [dict(s.to_dict(), rank=None) for s in steps(n=4, wall_ms=50.0 + r)]
        (d / f"steps.rank{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        (d / f"settings.rank{r}.json").write_text(json.dumps(settings(num_threads=r + 1).to_dict()))
    (d / "steps.rankx.jsonl").write_text("not a rank file\n")
    return d


def test_rank_tagged_files_are_read(tmp_path):
    d = _write_rank_run(tmp_path / "run")
    loaded = load_inputs([d])
    r = loaded.run
    assert sorted({(s.rank, s.index) for s in r.steps}) == [(rk, i) for rk in range(2) for i in range(4)]
    assert r.settings is not None and r.settings.num_threads == 1  # the lowest rank's
    assert any("settings of rank 0" in n for n in r.notes)
    assert not any("steps.jsonl is missing" in n for n in r.notes)
    assert r.manifest.failed_rank == 1


def test_engine_fills_ranks_and_renderers_name_the_straggler():
    data = run(manifest=manifest(world_size=3), metrics=synchronized(slow_rank=2))
    rep = engine.diagnose(data, Config(), "analyze")
    assert [r.rank for r in rep.ranks] == [0, 1, 2] and rep.ranks[2].straggler
    assert rep.rank_summary is not None and rep.rank_summary.straggler_rank == 2
    assert any(f.code == "GD603" and f.rank == 2 for f in rep.findings)
    text = render(rep, "terminal")
    ranks = text[text.index("\nRanks\n"):]
    assert "work / step" in ranks and "straggler: rank 2" in ranks and "who wait for it" in ranks
    md = render(rep, "md")
    assert "| rank | steps | step median |" in md and "**straggler: rank 2," in md
    html = render(rep, "html")
    assert '<h2 id="ranks">Ranks</h2>' in html and "<strong>straggler: rank 2," in html
    back = Report.from_dict(json.loads(render(rep, "json")))
    assert back.rank_summary == rep.rank_summary and back.ranks == rep.ranks


def test_equal_ranks_no_straggler_in_the_report():
    rep = engine.diagnose(run(metrics=synchronized(slow_rank=None)), Config(), "analyze")
    assert not any(r.straggler for r in rep.ranks) and rep.rank_summary.straggler_rank is None
    assert not any(f.code == "GD603" for f in rep.findings)
    assert "no straggler: the slowest" in render(rep, "terminal")


def test_summary_counts_steps_per_rank():
    recs = tuple(s.__class__(**{**s.to_dict(), "rank": r}) for r in range(3) for s in steps(n=6))
    rep = engine.diagnose(run(manifest=manifest(world_size=3), steps=recs), Config(), "analyze")
    stat = next(s for s in rep.summary if s.key == "steps")
    assert stat.value == 6 and "3 ranks" in stat.label


def test_two_nodes_merge_into_one_job(tmp_path):
    from gpudoctor.model import ExceptionInfo, RankEnd, RunStatus

    ok = [RankEnd(r, r, 100 + r, RunStatus.KILLED, "terminated by signal 15 (SIGTERM)", 143, 15) for r in (0, 1)]
    bad = [RankEnd(2, 0, 200, RunStatus.FAILED, "ValueError: boom at train.py:9", 1, None,
                   ExceptionInfo("ValueError", "boom")), RankEnd(3, 1, 201, RunStatus.KILLED, "", 143, 15)]
    for name, ends, failed in (("node0", ok, None), ("node1", bad, 2)):
        d = tmp_path / name
        d.mkdir()
        status = RunStatus.FAILED if failed is not None else RunStatus.KILLED
        m = manifest(world_size=4, launcher="torchrun", rank_ends=tuple(ends), failed_rank=failed, status=status,
                     status_detail="rank 2 failed: ValueError: boom" if failed is not None else "rank(s) 0, 1: killed",
                     run_id=name, hostname=name)
        (d / "manifest.json").write_text(json.dumps(m.to_dict()))
        for e in ends:
            lines = [dict(s.to_dict(), rank=e.rank) for s in steps(n=3)]
            (d / f"steps.rank{e.rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = load_inputs([tmp_path / "node1", tmp_path / "node0"]).run
    m = run.manifest
    assert [e.rank for e in m.rank_ends] == [0, 1, 2, 3] and m.failed_rank == 2
    assert m.status.value == "failed" and m.status_detail.startswith("node1: rank 2 failed")
    assert sorted({s.rank for s in run.steps}) == [0, 1, 2, 3]


def test_a_trace_without_distributed_info_gets_its_rank_from_the_manifest(tmp_path):
    import gzip

    from gpudoctor.model import RankEnd, RunStatus

    d = tmp_path / "run"
    d.mkdir()
    ends = tuple(RankEnd(r, r, 10 + r, RunStatus.COMPLETED, traces=(f"host_{10 + r}.00000003.pt.trace.json.gz",))
                 for r in range(2))
    m = manifest(world_size=2, launcher="torchrun", rank_ends=ends, traces=tuple(e.traces[0] for e in ends))
    (d / "manifest.json").write_text(json.dumps(m.to_dict()))
    for e in ends:
        events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": 1000 * n, "dur": 900,
                   "pid": 1, "tid": 1} for n in (3, 4)]
        with gzip.open(d / e.traces[0], "wt") as fh:
            fh.write(json.dumps({"traceEvents": events}))
    loaded = load_inputs([d])
    assert [(t.info.rank, t.info.world_size) for t in loaded.timelines] == [(0, 2), (1, 2)]
