"""``Rule.needs``: typed, checked once by the engine before a rule runs; and the shared selectors."""

from __future__ import annotations

import dataclasses

import pytest
from rule_builders import cpu_manifest, cpu_trace, manifest, run, settings, trace, utilization

from gpudoctor import engine
from gpudoctor.config import Config
from gpudoctor.model.selectors import busiest_device, primary_trace
from gpudoctor.rules import registry
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.needs import Need, needs_text, unmet
from gpudoctor.rules.registry import Rule, all_rules, get
from gpudoctor.rules.results import RuleResult, Verdict


def test_needs_are_typed_and_listed_in_one_order() -> None:
    for rule in all_rules():
        assert rule.needs and all(isinstance(n, Need) for n in rule.needs), rule.code
        assert rule.self_checked <= rule.needs, rule.code
    assert get("GD303").needs_text == "gpu, trace, steps"
    assert get("GD202").needs_text == "steps, settings"
    assert needs_text({Need.SAMPLES, Need.GPU}) == "gpu, samples"


def test_a_rule_declares_needs_that_exist() -> None:
    with pytest.raises(ValueError):
        Rule(code="GD999", name="toy", title="", doc="", needs={"gpus"})
    with pytest.raises(ValueError):  # a need it checks itself must be one of its needs
        Rule(code="GD999", name="toy", title="", doc="", needs={Need.GPU}, self_checked={Need.TRACE})


def test_a_missing_need_is_cannot_judge_with_its_reason_and_the_rule_does_not_run() -> None:
    ran = []

    def body(ctx):
        ran.append(ctx.code)
        return RuleResult.fine("looked")

    toy = Rule(code="GD999", name="toy", title="", doc="", check=body, needs={Need.GPU, Need.SETTINGS},
               needs_reasons={Need.SETTINGS: "no settings, in the toy's words"})
    cpu = RuleContext(run(manifest=cpu_manifest(), metrics=(cpu_trace(),)))
    assert toy.check(cpu) == RuleResult.cannot_judge("no GPU in this run")  # Need order: the GPU first
    gpu_only = RuleContext(run(metrics=(trace(),)))
    assert toy.check(gpu_only) == RuleResult.cannot_judge("no settings, in the toy's words")
    assert ran == []
    assert toy.check(RuleContext(run(metrics=(trace(),), settings=settings()))).verdict == Verdict.FINE
    assert toy.body is body


def test_the_engine_checks_needs_centrally(monkeypatch) -> None:
    """A rule's own function never runs when a need is missing: the engine answers for it."""
    calls = []

    def boom(ctx):
        calls.append(ctx.code)
        raise AssertionError("must not run")

    rules = tuple(dataclasses.replace(r, check=boom) if r.code == "GD101" else r for r in registry.all_rules())
    monkeypatch.setattr(engine, "all_rules", lambda: rules)
    rep = engine.diagnose(run(manifest=cpu_manifest(), metrics=(cpu_trace(),)), Config(), "analyze")
    assert calls == [] and not rep.errors
    item = next(i for i in rep.checklist if "GD101" in i.codes)
    assert "no GPU in this run" in item.reason


def test_unmet_takes_needs_in_order() -> None:
    ctx = RuleContext(run())
    assert unmet({Need.SETTINGS, Need.GPU, Need.TRACE}, ctx) == "no GPU in this run"
    assert unmet({Need.TRACE}, ctx) == "no trace in this run"
    assert unmet(set(), ctx) is None


def test_primary_trace_prefers_gpu_activity_then_the_lowest_rank() -> None:
    cpu0, gpu1, gpu2 = cpu_trace(rank=0), trace(rank=1, path="r1"), trace(rank=2, path="r2")
    assert primary_trace((gpu2, cpu0, gpu1)) is gpu1
    assert primary_trace((cpu0,)) is cpu0
    assert primary_trace(()) is None
    assert primary_trace((gpu2, gpu1), rank=2) is gpu2
    no_ledger = dataclasses.replace(gpu1, ledger=None)
    assert primary_trace((no_ledger, gpu2), with_ledger=True) is gpu2


def test_busiest_device_is_the_one_busiest_over_its_span() -> None:
    quiet, busy = utilization(80.0, device=0), utilization(10.0, device=1)
    assert busy.busy_ns_span > quiet.busy_ns_span
    assert busiest_device((quiet, busy)) is busy
    assert busiest_device(trace(utilization=(quiet, busy))) is busy
    assert busiest_device(()) is None and busiest_device(None) is None
    assert RuleContext.util(trace(utilization=(quiet, busy))) is busy  # what the rules judge


def test_manifest_builder_is_a_gpu_run() -> None:  # the builders the tests above rely on
    assert RuleContext(run(manifest=manifest(), metrics=(trace(),))).has_gpu()
