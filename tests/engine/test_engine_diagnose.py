"""engine.diagnose: running rules, crashes, ordering, the checklist, summary and report.json."""

from __future__ import annotations

import dataclasses
import json

import pytest
from rule_builders import (
    GB,
    MS,
    SITE,
    FlagSetting,
    GapCause,
    Samples,
    cpu_manifest,
    cpu_trace,
    dataloader,
    gpu_samples,
    manifest,
    proc_samples,
    run,
    settings,
    steps,
    trace,
    transfer,
    utilization,
)

from gpudoctor import engine
from gpudoctor.config import Config, Thresholds
from gpudoctor.errors import ConfigError, RunDirError
from gpudoctor.model import ChecklistStatus, Collected, Report, Severity
from gpudoctor.rules import registry
from gpudoctor.rules.checklist import TECHNIQUES


def _gpu_run():
    m = trace(
        utilization=(utilization(45.0, causes={GapCause.DATALOADER: 0.6, GapCause.SYNC: 0.4}),),
        transfers=(transfer("HtoD", "pageable", count=10, nbytes=400 * 10**6, dur_ns=4 * MS),),
        breakdown_mean_pct={"data_loading": 27.0, "gpu_compute": 55.0, "other_cpu": 18.0},
    )
    return run(
        manifest=manifest(),
        settings=settings(),
        steps=steps(20, 100.0, 27.0),
        metrics=(m,),
        samples=Samples(process=proc_samples(95.0), gpu=gpu_samples(55.0, 12 * GB), interval_ms=100.0),
    )


def _cpu_run():
    return run(
        manifest=cpu_manifest(),
        settings=settings(device_type="cpu", dataloaders=(dataloader(),)),
        steps=steps(20, 100.0, 60.0),
        metrics=(cpu_trace(),),
        samples=Samples(process=proc_samples(100.0)),
    )


def test_diagnose_ranks_findings_and_fills_the_report():
    rep = engine.diagnose(_gpu_run(), Config(), "profile")
    assert isinstance(rep, Report) and rep.kind == "profile" and rep.source == "gpudoctor-runs/train-1"
    codes = [f.code for f in rep.findings]
    # the cure first, the symptom (GD101, the headline) after every cause
    assert codes[0] == "GD201" and codes[-1] == "GD101" and "GD301" in codes
    keys = [engine.sort_key(f) for f in rep.findings]
    assert keys == sorted(keys)
    assert set(rep.rules_run) == {r.code for r in registry.all_rules()}
    assert {r.code for r in rep.rules} == set(rep.rules_run)
    assert rep.run is not None and rep.errors == ()
    assert rep.environment["torch"] == "2.13.0" and "A100" in rep.environment["devices"]


def test_partial_step_figures_are_the_report_s_warning():
    """Step tracking that stopped (issue 35) is a warning of the report, from the manifest's own words;
    a file of another instrument only partly written is not."""
    why = "step tracking stopped at step 16: ValueError: x; steps 16 and later were not recorded"
    base = _gpu_run()
    collected = (*base.manifest.collected, Collected("steps", True, why, detail="16 steps", partial=True),
                 Collected("psutil", True, "samples.jsonl: No space left on device (ENOSPC)", partial=True))
    rep = engine.diagnose(dataclasses.replace(base, manifest=dataclasses.replace(base.manifest, collected=collected)),
                          Config(), "profile")
    assert rep.warnings == (f"the step figures are partial: {why}",)
    assert engine.diagnose(base, Config(), "profile").warnings == ()


def test_findings_sorted_by_severity_then_gain_then_code():
    rep = engine.diagnose(_gpu_run(), Config(), "analyze")
    causes = [f for f in rep.findings if f.code != "GD101"]
    for a, b in zip(causes, causes[1:], strict=False):
        assert a.severity.rank <= b.severity.rank
        if a.severity == b.severity and a.gain.share_pct is not None and b.gain.share_pct is not None:
            assert a.gain.share_pct >= b.gain.share_pct
    again = engine.diagnose(_gpu_run(), Config(), "analyze")
    assert [f.to_dict() for f in again.findings] == [f.to_dict() for f in rep.findings]


def test_cpu_run_gets_gd201_first_with_call_site():
    rep = engine.diagnose(_cpu_run(), Config(), "profile")
    top = rep.findings[0]
    assert top.code == "GD201" and str(top.location) == "train.py:31"
    idle = next(s for s in rep.summary if s.key == "gpu_idle")
    assert idle.value == "n/a: no GPU in this run" and idle.window == ""


def test_crashing_rule_becomes_an_internal_error_finding(monkeypatch):
    real = registry.all_rules()

    def boom(ctx):
        raise ZeroDivisionError("division by zero")

    broken = tuple(dataclasses.replace(r, check=boom) if r.code == "GD201" else r for r in real)
    monkeypatch.setattr(engine, "all_rules", lambda: broken)
    monkeypatch.delenv("GPUDOCTOR_DEBUG", raising=False)
    rep = engine.diagnose(_cpu_run(), Config(), "profile")
    internal = [f for f in rep.findings if f.code == "GD000"]
    assert len(internal) == 1 and internal[0].name == "internal-error"
    assert "GD201" in internal[0].message and "ZeroDivisionError" in internal[0].message
    assert internal[0].severity == Severity.WARNING
    assert any("GD201" in e for e in rep.errors)
    item = next(i for i in rep.checklist if i.technique == 2)
    assert "crashed" in item.reason
    # every other rule still ran
    assert len(rep.rules_run) == len(real)


def test_crash_propagates_with_debug(monkeypatch):
    def boom(ctx):
        raise RuntimeError("bug")

    broken = tuple(dataclasses.replace(r, check=boom) for r in registry.all_rules())
    monkeypatch.setattr(engine, "all_rules", lambda: broken)
    monkeypatch.setenv("GPUDOCTOR_DEBUG", "1")
    with pytest.raises(RuntimeError):
        engine.diagnose(_cpu_run(), Config(), "profile")


def test_checklist_covers_13_techniques_and_every_rule():
    for data in (_gpu_run(), _cpu_run(), run()):
        rep = engine.diagnose(data, Config(), "analyze")
        techniques = sorted(i.technique for i in rep.checklist if i.technique is not None)
        assert techniques == list(range(1, 14))
        covered = {c for i in rep.checklist for c in i.codes}
        assert {r.code for r in registry.all_rules()} <= covered
        assert all(i.reason for i in rep.checklist)
        assert len({i.key for i in rep.checklist}) == len(rep.checklist)
    assert len(TECHNIQUES) == 13


def test_checklist_statuses_on_a_gpu_run():
    rep = engine.diagnose(_gpu_run(), Config(), "profile")
    by_tech = {i.technique: i for i in rep.checklist if i.technique}
    assert by_tech[1].status == ChecklistStatus.RECOMMENDED and by_tech[1].gain is not None  # pageable copies
    assert by_tech[2].status == ChecklistStatus.RECOMMENDED  # the loop waits for data
    # gpudoctor's own torch.profiler window and NVML sampler are not the script's technique
    assert by_tech[7].status == ChecklistStatus.NOT_APPLICABLE and "gpudoctor profiled this run" in by_tech[7].reason
    assert by_tech[8].status == ChecklistStatus.NOT_APPLICABLE  # num_workers=0: no prefetching yet
    assert by_tech[11].status == ChecklistStatus.NOT_APPLICABLE
    assert by_tech[12].status == ChecklistStatus.NOT_APPLICABLE and "the NVML samples of this run are gpudoctor's own" in by_tech[12].reason


def test_checklist_on_a_cpu_run_says_why():
    rep = engine.diagnose(_cpu_run(), Config(), "profile")
    by_tech = {i.technique: i for i in rep.checklist if i.technique}
    assert by_tech[1].status == ChecklistStatus.NOT_APPLICABLE and "no GPU in this run" in by_tech[1].reason
    assert by_tech[10].status == ChecklistStatus.NOT_APPLICABLE
    rule_items = {i.codes[0]: i for i in rep.checklist if i.technique is None}
    assert rule_items["GD101"].status == ChecklistStatus.NOT_MEASURABLE
    assert rule_items["GD101"].reason == "no GPU in this run"


def test_torch_compile_is_applied_only_on_evidence():
    """A bare trace: GD103 seeing no launch overhead says nothing of torch.compile; Inductor's
    triton_ kernels in the trace do."""
    from rule_builders import kernels

    from gpudoctor.model.metrics import NameStat

    bare = run(metrics=(trace(),))
    item = next(i for i in engine.diagnose(bare, Config(), "analyze").checklist if i.key == "torch-compile")
    assert item.status == ChecklistStatus.NOT_MEASURABLE and "whether it is used is not recorded" in item.reason
    compiled = run(metrics=(trace(kernels=kernels(top=(NameStat("triton_poi_fused_add_relu_0", 100, 5 * MS),))),))
    item = next(i for i in engine.diagnose(compiled, Config(), "analyze").checklist if i.key == "torch-compile")
    assert item.status == ChecklistStatus.APPLIED and "triton_poi_fused_add_relu_0" in item.reason


def test_applied_technique_names_its_setting():
    d = dataloader(num_workers=4, prefetch_factor=4, pin_memory=True, persistent_workers=True)
    data = dataclasses.replace(_gpu_run(), settings=settings(dataloaders=(d,)), steps=steps(20, 100.0, 1.0))
    rep = engine.diagnose(data, Config(), "profile")
    by_tech = {i.technique: i for i in rep.checklist if i.technique}
    assert by_tech[2].status == ChecklistStatus.APPLIED and "num_workers=4 at train.py:31" in by_tech[2].reason
    assert by_tech[8].status == ChecklistStatus.APPLIED and "prefetch_factor=4" in by_tech[8].reason


@pytest.mark.parametrize("passed", [("dataset", "batch_size", "num_workers"), None], ids=["recorded", "not-recorded"])
def test_a_default_prefetch_factor_is_not_applied(passed):
    """prefetch_factor=2 is DataLoader's default with workers: a script that does not pass it did not
    choose prefetching (with the record of the call's arguments, or without it: the default value)."""
    d = dataloader(num_workers=4, prefetch_factor=2, passed_args=passed)
    data = dataclasses.replace(_gpu_run(), settings=settings(dataloaders=(d,)), steps=steps(20, 100.0, 1.0))
    item = next(i for i in engine.diagnose(data, Config(), "profile").checklist if i.key == "prefetch")
    assert item.status == ChecklistStatus.NO_PROBLEM_SEEN, item
    assert "prefetch_factor=2 with 4 workers at train.py:31: DataLoader's default" in item.reason
    chosen = dataloader(num_workers=4, prefetch_factor=2, passed_args=("dataset", "num_workers", "prefetch_factor"))
    data = dataclasses.replace(data, settings=settings(dataloaders=(chosen,)))
    item = next(i for i in engine.diagnose(data, Config(), "profile").checklist if i.key == "prefetch")
    assert item.status == ChecklistStatus.APPLIED and "prefetch_factor=2 with 4 workers" in item.reason


def test_the_script_s_own_profiler_is_applied():
    data = dataclasses.replace(_gpu_run(), manifest=manifest(profiler_owner="user"))
    item = next(i for i in engine.diagnose(data, Config(), "profile").checklist if i.key == "profiler")
    assert item.status == ChecklistStatus.APPLIED and "the script runs torch.profiler itself" in item.reason


def test_a_flag_on_by_default_is_not_applied():
    """cudnn.benchmark reads True but nothing in the script set it (a build's or the environment's
    default): in use, not the script's choice."""
    flag = FlagSetting("torch.backends.cudnn.benchmark", True, None)
    data = dataclasses.replace(_gpu_run(), settings=settings(flags=(flag,)))
    item = next(i for i in engine.diagnose(data, Config(), "profile").checklist if i.key == "cudnn-benchmark")
    assert item.status != ChecklistStatus.APPLIED and "the script does not set it" in item.reason
    flag = FlagSetting("torch.backends.cudnn.benchmark", True, SITE)
    data = dataclasses.replace(_gpu_run(), settings=settings(flags=(flag,)))
    item = next(i for i in engine.diagnose(data, Config(), "profile").checklist if i.key == "cudnn-benchmark")
    assert item.status == ChecklistStatus.APPLIED and "train.py:31" in item.reason


def test_every_item_is_titled_with_a_technique():
    """An item outside the seed techniques is titled with the technique that answers its rule, not
    with the problem the rule detects; the `check` report lists the same titles."""
    from gpudoctor.static.checklist import checklist_rows

    rep = engine.diagnose(_gpu_run(), Config(), "profile")
    titles = {i.codes: i.title for i in rep.checklist}
    assert titles[("GD303",)] == "Keep results on the GPU between steps (fetch them every N steps)"
    covered = {c for t in TECHNIQUES for c in t.codes}
    for rule in registry.all_rules():
        if rule.code in covered:
            continue
        assert rule.technique and rule.technique != rule.title, rule.code
        assert titles[(rule.code,)] == rule.technique
    assert {(key, title) for key, title, _, _ in checklist_rows()} == {(i.key, i.title) for i in rep.checklist}


def test_select_and_ignore():
    rep = engine.diagnose(_gpu_run(), Config(select=("GD2",)), "analyze")
    assert rep.rules_run and all(c.startswith("GD2") for c in rep.rules_run)
    assert all(f.code.startswith("GD2") for f in rep.findings)
    item = next(i for i in rep.checklist if i.codes == ("GD101",))
    assert item.status == ChecklistStatus.NOT_MEASURABLE and "select/ignore" in item.reason
    rep = engine.diagnose(_gpu_run(), Config(ignore=("GD101", "GD3")), "analyze")
    assert "GD101" not in rep.rules_run and not any(f.code.startswith("GD3") for f in rep.findings)


def test_selection_matching_no_rule_is_an_error():
    with pytest.raises(ConfigError, match="GD999"):
        engine.diagnose(run(), Config(select=("GD999",)), "analyze")


def test_thresholds_change_findings():
    data = _cpu_run()
    assert any(f.code == "GD201" for f in engine.diagnose(data, Config(), "profile").findings)
    lax = Config(thresholds=dataclasses.replace(Thresholds(), dataloader_wait_share_pct=80.0))
    assert not any(f.code == "GD201" for f in engine.diagnose(data, lax, "profile").findings)


def test_summary_holds_every_headline_number():
    rep = engine.diagnose(_gpu_run(), Config(), "profile")
    s = {x.key: x for x in rep.summary}
    assert s["steps"].value == 20
    assert s["step_time"].unit == "ms" and s["step_time"].value == 100.0  # the mean: every step 100 ms
    assert s["step_time_median"].unit == "ms" and s["step_time_median"].value == 100.0
    assert s["step_time_p90"].value == 100.0
    assert s["data_wait_share"].value == 27.0 and s["data_wait_share"].unit == "%"
    assert s["gpu_idle"].value == 45.0 and s["gpu_idle"].window == "steps"
    assert s["gpu_idle_span"].window == "span"
    assert s["h2d_bytes"].value == 400 * 10**6
    assert s["peak_gpu_memory"].value == 15.0
    assert s["main_cpu"].value == 95.0
    assert "error" in s["findings"].value


def test_ranks_rows_for_multi_trace_runs():
    ranks = tuple(trace(rank=r, path=f"rank{r}.json") for r in range(2))
    rep = engine.diagnose(run(metrics=ranks), Config(), "analyze")
    assert [r.rank for r in rep.ranks] == [0, 1] and rep.ranks[0].steps == 5


def test_report_json_round_trips(tmp_path):
    rep = engine.diagnose(_gpu_run(), Config(), "profile")
    engine.write_report_json(rep, tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["kind"] == "profile" and data["findings"][0]["code"] == "GD201"
    assert data["account"]["actions"][0]["code"] == "GD201"
    back = Report.from_dict(data)
    assert back.findings == rep.findings and back.checklist == rep.checklist and back.summary == rep.summary
    with pytest.raises(RunDirError):
        engine.write_report_json(rep, tmp_path / "missing")


def test_bad_kind_is_rejected():
    with pytest.raises(ValueError):
        engine.diagnose(run(), Config(), "check")


def test_pyproject_config_drives_the_diagnosis(tmp_path):
    from gpudoctor.config import load_config

    (tmp_path / "pyproject.toml").write_text(
        "[tool.gpudoctor]\nignore = ['GD104']\n[tool.gpudoctor.thresholds]\ngpu_idle_share_pct = 50\n"
    )
    cfg = load_config(tmp_path)
    rep = engine.diagnose(_gpu_run(), cfg, "analyze")
    codes = {f.code for f in rep.findings}
    assert "GD104" not in codes and "GD104" not in rep.rules_run
    assert "GD101" not in codes  # 45% idle is under the raised threshold
    item = next(i for i in rep.checklist if i.codes == ("GD101",))
    assert item.status == ChecklistStatus.NO_PROBLEM_SEEN and "threshold 50%" in item.reason
    batch = next(i for i in rep.checklist if i.technique == 3)
    assert "GD104" in batch.reason and "pyproject.toml" in batch.reason


def test_checklist_not_measurable_beats_not_applicable():
    """Two rules feed one item: one could not judge, one does not apply; the item is not measurable
    (a rule that could not look outweighs one to which the question does not apply)."""
    from gpudoctor.rules.checklist import _from_verdicts
    from gpudoctor.rules.results import RuleResult

    pairs = [("GD401", RuleResult.not_applicable("no Tensor Cores")), ("GD402", RuleResult.cannot_judge("no dtypes"))]
    for order in (pairs, pairs[::-1]):
        status, reason = _from_verdicts(order)
        assert status == ChecklistStatus.NOT_MEASURABLE and reason == "GD402: no dtypes"


def test_profiled_steps_count_every_window_of_the_process():
    """A run writes one trace per profiled window: the summary counts their steps together and
    names no trace file."""
    a, b = trace(path="host_1.00000010.pt.trace.json.gz"), trace(path="host_1.00000310.pt.trace.json.gz")
    rep = engine.diagnose(run(metrics=(a, b)), Config(), "analyze")
    stat = next(s for s in rep.summary if s.key == "profiled_steps")
    assert stat.label == "profiled steps" and stat.value == len(a.steps) + len(b.steps) and stat.window == "2 traces"
